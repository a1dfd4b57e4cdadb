package vk

import (
	"testing"
	"unsafe"
)

// TestLayout checks the structures against the sizes the C headers give
// on 64-bit platforms (vulkan_core.h, compiled with gcc for amd64).
func TestLayout(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"VkApplicationInfo", unsafe.Sizeof(applicationInfo{}), 48},
		{"VkInstanceCreateInfo", unsafe.Sizeof(instanceCreateInfo{}), 64},
		{"VkDeviceQueueCreateInfo", unsafe.Sizeof(deviceQueueCreateInfo{}), 40},
		{"VkDeviceCreateInfo", unsafe.Sizeof(deviceCreateInfo{}), 72},
		{"VkPhysicalDeviceProperties2", unsafe.Sizeof(physicalDeviceProperties2{}), 840},
		{"VkPhysicalDeviceSubgroupProperties", unsafe.Sizeof(subgroupProperties{}), 32},
		{"VkPhysicalDeviceMemoryProperties", unsafe.Sizeof(physicalDeviceMemoryProperties{}), 520},
		{"VkQueueFamilyProperties", unsafe.Sizeof(queueFamilyProperties{}), 24},
		{"VkPhysicalDevice16BitStorageFeatures", unsafe.Sizeof(physicalDevice16BitStorageFeatures{}), 32},
		{"VkPhysicalDeviceFeatures2", unsafe.Sizeof(physicalDeviceFeatures2{}), 240},
		{"VkBufferCreateInfo", unsafe.Sizeof(bufferCreateInfo{}), 56},
		{"VkMemoryRequirements", unsafe.Sizeof(memoryRequirements{}), 24},
		{"VkMemoryAllocateInfo", unsafe.Sizeof(memoryAllocateInfo{}), 32},
		{"VkShaderModuleCreateInfo", unsafe.Sizeof(shaderModuleCreateInfo{}), 40},
		{"VkDescriptorSetLayoutBinding", unsafe.Sizeof(descriptorSetLayoutBinding{}), 24},
		{"VkDescriptorSetLayoutCreateInfo", unsafe.Sizeof(descriptorSetLayoutCreateInfo{}), 32},
		{"VkPushConstantRange", unsafe.Sizeof(pushConstantRange{}), 12},
		{"VkPipelineLayoutCreateInfo", unsafe.Sizeof(pipelineLayoutCreateInfo{}), 48},
		{"VkSpecializationMapEntry", unsafe.Sizeof(specializationMapEntry{}), 16},
		{"VkSpecializationInfo", unsafe.Sizeof(specializationInfo{}), 32},
		{"VkPipelineShaderStageCreateInfo", unsafe.Sizeof(pipelineShaderStageCreateInfo{}), 48},
		{"VkComputePipelineCreateInfo", unsafe.Sizeof(computePipelineCreateInfo{}), 96},
		{"VkComputePipelineCreateInfo.layout", unsafe.Offsetof(computePipelineCreateInfo{}.layout), 72},
		{"VkDescriptorPoolSize", unsafe.Sizeof(descriptorPoolSize{}), 8},
		{"VkDescriptorPoolCreateInfo", unsafe.Sizeof(descriptorPoolCreateInfo{}), 40},
		{"VkDescriptorSetAllocateInfo", unsafe.Sizeof(descriptorSetAllocateInfo{}), 40},
		{"VkDescriptorBufferInfo", unsafe.Sizeof(descriptorBufferInfo{}), 24},
		{"VkWriteDescriptorSet", unsafe.Sizeof(writeDescriptorSet{}), 64},
		{"VkWriteDescriptorSet.pBufferInfo", unsafe.Offsetof(writeDescriptorSet{}.pBufferInfo), 48},
		{"VkCommandPoolCreateInfo", unsafe.Sizeof(commandPoolCreateInfo{}), 24},
		{"VkCommandBufferAllocateInfo", unsafe.Sizeof(commandBufferAllocateInfo{}), 32},
		{"VkCommandBufferBeginInfo", unsafe.Sizeof(commandBufferBeginInfo{}), 32},
		{"VkMemoryBarrier", unsafe.Sizeof(memoryBarrier{}), 24},
		{"VkSubmitInfo", unsafe.Sizeof(submitInfo{}), 72},
		{"VkFenceCreateInfo", unsafe.Sizeof(fenceCreateInfo{}), 24},
		{"VkBufferCopy", unsafe.Sizeof(bufferCopy{}), 24},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes here, %d in C", c.name, c.got, c.want)
		}
	}
}
