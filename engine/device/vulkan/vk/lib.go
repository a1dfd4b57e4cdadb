package vk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"
)

// fns is the Vulkan functions this package calls, resolved from the loader.
type fns struct {
	createInstance                    func(info *instanceCreateInfo, alloc unsafe.Pointer, out *Instance) Result
	destroyInstance                   func(i Instance, alloc unsafe.Pointer)
	enumerateInstanceExtensionProps   func(layer *byte, n *uint32, out *extensionProperties) Result
	enumeratePhysicalDevices          func(i Instance, n *uint32, out *PhysicalDevice) Result
	getPhysicalDeviceProperties2      func(p PhysicalDevice, out *physicalDeviceProperties2)
	getPhysicalDeviceMemoryProperties func(p PhysicalDevice, out *physicalDeviceMemoryProperties)
	getQueueFamilyProperties          func(p PhysicalDevice, n *uint32, out *queueFamilyProperties)
	getPhysicalDeviceFeatures2        func(p PhysicalDevice, out *physicalDeviceFeatures2)
	enumerateDeviceExtensionProps     func(p PhysicalDevice, layer *byte, n *uint32, out *extensionProperties) Result
	createDevice                      func(p PhysicalDevice, info *deviceCreateInfo, alloc unsafe.Pointer, out *Device) Result
	destroyDevice                     func(d Device, alloc unsafe.Pointer)
	getDeviceQueue                    func(d Device, family, index uint32, out *Queue)
	deviceWaitIdle                    func(d Device) Result

	createBuffer          func(d Device, info *bufferCreateInfo, alloc unsafe.Pointer, out *Buffer) Result
	destroyBuffer         func(d Device, b Buffer, alloc unsafe.Pointer)
	getBufferMemoryReqs   func(d Device, b Buffer, out *memoryRequirements)
	allocateMemory        func(d Device, info *memoryAllocateInfo, alloc unsafe.Pointer, out *DeviceMemory) Result
	freeMemory            func(d Device, m DeviceMemory, alloc unsafe.Pointer)
	bindBufferMemory      func(d Device, b Buffer, m DeviceMemory, off uint64) Result
	mapMemory             func(d Device, m DeviceMemory, off, size uint64, flags uint32, out *unsafe.Pointer) Result
	unmapMemory           func(d Device, m DeviceMemory)
	createShaderModule    func(d Device, info *shaderModuleCreateInfo, alloc unsafe.Pointer, out *ShaderModule) Result
	destroyShaderModule   func(d Device, m ShaderModule, alloc unsafe.Pointer)
	createDescSetLayout   func(d Device, info *descriptorSetLayoutCreateInfo, alloc unsafe.Pointer, out *DescriptorSetLayout) Result
	destroyDescSetLayout  func(d Device, l DescriptorSetLayout, alloc unsafe.Pointer)
	createPipelineLayout  func(d Device, info *pipelineLayoutCreateInfo, alloc unsafe.Pointer, out *PipelineLayout) Result
	destroyPipelineLayout func(d Device, l PipelineLayout, alloc unsafe.Pointer)
	createComputePipes    func(d Device, cache uint64, n uint32, info *computePipelineCreateInfo, alloc unsafe.Pointer, out *Pipeline) Result
	destroyPipeline       func(d Device, p Pipeline, alloc unsafe.Pointer)
	createDescPool        func(d Device, info *descriptorPoolCreateInfo, alloc unsafe.Pointer, out *DescriptorPool) Result
	destroyDescPool       func(d Device, p DescriptorPool, alloc unsafe.Pointer)
	resetDescPool         func(d Device, p DescriptorPool, flags uint32) Result
	allocateDescSets      func(d Device, info *descriptorSetAllocateInfo, out *DescriptorSet) Result
	updateDescSets        func(d Device, nw uint32, w *writeDescriptorSet, nc uint32, c unsafe.Pointer)
	createCommandPool     func(d Device, info *commandPoolCreateInfo, alloc unsafe.Pointer, out *CommandPool) Result
	destroyCommandPool    func(d Device, p CommandPool, alloc unsafe.Pointer)
	allocateCommandBufs   func(d Device, info *commandBufferAllocateInfo, out *CommandBuffer) Result
	beginCommandBuffer    func(c CommandBuffer, info *commandBufferBeginInfo) Result
	endCommandBuffer      func(c CommandBuffer) Result
	resetCommandBuffer    func(c CommandBuffer, flags uint32) Result
	cmdBindPipeline       func(c CommandBuffer, bind uint32, p Pipeline)
	cmdBindDescSets       func(c CommandBuffer, bind uint32, l PipelineLayout, first, n uint32, sets *DescriptorSet, nd uint32, dyn unsafe.Pointer)
	cmdPushConstants      func(c CommandBuffer, l PipelineLayout, stages, off, size uint32, data unsafe.Pointer)
	cmdDispatch           func(c CommandBuffer, x, y, z uint32)
	cmdPipelineBarrier    func(c CommandBuffer, src, dst, dep uint32, nm uint32, m *memoryBarrier, nb uint32, b unsafe.Pointer, ni uint32, i unsafe.Pointer)
	cmdCopyBuffer         func(c CommandBuffer, src, dst Buffer, n uint32, r *bufferCopy)
	cmdFillBuffer         func(c CommandBuffer, b Buffer, off, size uint64, data uint32)
	queueSubmit           func(q Queue, n uint32, s *submitInfo, f Fence) Result
	createFence           func(d Device, info *fenceCreateInfo, alloc unsafe.Pointer, out *Fence) Result
	destroyFence          func(d Device, f Fence, alloc unsafe.Pointer)
	waitForFences         func(d Device, n uint32, f *Fence, all uint32, timeout uint64) Result
	resetFences           func(d Device, n uint32, f *Fence) Result
}

// ErrNoLoader is returned when no Vulkan loader library can be opened.
var ErrNoLoader = errors.New("no Vulkan loader (libvulkan) found")

// loaderNames are the libraries tried, in order. SHOAL_VULKAN_LIB, when
// set, is tried alone (a list, separated as PATH is, tries each).
func loaderNames() []string {
	if p := os.Getenv("SHOAL_VULKAN_LIB"); p != "" {
		return filepath.SplitList(p)
	}
	switch runtime.GOOS {
	case "darwin":
		return []string{"libvulkan.1.dylib", "libvulkan.dylib", "libMoltenVK.dylib", "/usr/local/lib/libvulkan.1.dylib", "/opt/homebrew/lib/libvulkan.1.dylib"}
	case "windows":
		return []string{"vulkan-1.dll"}
	}
	return []string{"libvulkan.so.1", "libvulkan.so"}
}

// check turns a VkResult into an error naming the call.
func check(r Result, what string) error {
	if r >= 0 {
		return nil
	}
	return fmt.Errorf("%s: %s", what, r)
}

func (r Result) String() string {
	switch r {
	case 0:
		return "VK_SUCCESS"
	case -1:
		return "VK_ERROR_OUT_OF_HOST_MEMORY"
	case -2:
		return "VK_ERROR_OUT_OF_DEVICE_MEMORY"
	case -3:
		return "VK_ERROR_INITIALIZATION_FAILED"
	case -4:
		return "VK_ERROR_DEVICE_LOST"
	case -5:
		return "VK_ERROR_MEMORY_MAP_FAILED"
	case -6:
		return "VK_ERROR_LAYER_NOT_PRESENT"
	case -7:
		return "VK_ERROR_EXTENSION_NOT_PRESENT"
	case -8:
		return "VK_ERROR_FEATURE_NOT_PRESENT"
	case -9:
		return "VK_ERROR_INCOMPATIBLE_DRIVER"
	case -10:
		return "VK_ERROR_TOO_MANY_OBJECTS"
	case 2:
		return "VK_TIMEOUT"
	}
	return fmt.Sprintf("VkResult(%d)", int32(r))
}

// cstr returns s as a NUL-terminated C string kept by the caller.
func cstr(s string) *byte {
	b := append([]byte(s), 0)
	return &b[0]
}

// goStr reads a NUL-terminated string from a fixed array.
func goStr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
