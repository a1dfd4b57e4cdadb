// Package vulkan is the GPU device: the engine's layer arithmetic as
// Vulkan compute shaders (shaders/, compiled to the SPIR-V in spv/ by
// `make generate` and embedded), run through package vk without cgo. The
// weights are uploaded once in their GGUF block formats; each kernel has a
// test against the engine's Go reference on any Vulkan device, lavapipe
// included. Without a loader or a device it reports why and the caller
// stays on the CPU. It must not know GGUF names, sequences or the network.
package vulkan
