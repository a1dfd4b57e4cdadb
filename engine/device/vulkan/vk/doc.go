// Package vk is the part of the Vulkan API the GPU device uses, called
// without cgo: the loader (libvulkan) is opened at run time with purego,
// and the structures are declared here with the C layout of 64-bit
// platforms (vk_test checks their sizes). It knows nothing of models; it
// must not grow into a general binding: only what a compute queue needs
// (instance and device, buffers and memory, compute pipelines, descriptor
// sets, command buffers, fences).
package vk
