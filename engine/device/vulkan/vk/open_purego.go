//go:build !novulkan

package vk

import (
	"fmt"
	"strings"

	"github.com/ebitengine/purego"
)

func openLoader() (*fns, error) {
	var h uintptr
	var errs []string
	for _, n := range loaderNames() {
		var err error
		if h, err = purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
			break
		}
		errs = append(errs, strings.ReplaceAll(err.Error(), "\n", " "))
	}
	if h == 0 {
		// one line: the agent prints it as the reason it runs on the CPU
		return nil, fmt.Errorf("%w: %s", ErrNoLoader, strings.Join(errs, "; "))
	}
	f := &fns{}
	for _, s := range []struct {
		fp   any
		name string
	}{
		{&f.createInstance, "vkCreateInstance"},
		{&f.destroyInstance, "vkDestroyInstance"},
		{&f.enumerateInstanceExtensionProps, "vkEnumerateInstanceExtensionProperties"},
		{&f.enumeratePhysicalDevices, "vkEnumeratePhysicalDevices"},
		{&f.getPhysicalDeviceProperties2, "vkGetPhysicalDeviceProperties2"},
		{&f.getPhysicalDeviceMemoryProperties, "vkGetPhysicalDeviceMemoryProperties"},
		{&f.getQueueFamilyProperties, "vkGetPhysicalDeviceQueueFamilyProperties"},
		{&f.getPhysicalDeviceFeatures2, "vkGetPhysicalDeviceFeatures2"},
		{&f.enumerateDeviceExtensionProps, "vkEnumerateDeviceExtensionProperties"},
		{&f.createDevice, "vkCreateDevice"},
		{&f.destroyDevice, "vkDestroyDevice"},
		{&f.getDeviceQueue, "vkGetDeviceQueue"},
		{&f.deviceWaitIdle, "vkDeviceWaitIdle"},
		{&f.createBuffer, "vkCreateBuffer"},
		{&f.destroyBuffer, "vkDestroyBuffer"},
		{&f.getBufferMemoryReqs, "vkGetBufferMemoryRequirements"},
		{&f.allocateMemory, "vkAllocateMemory"},
		{&f.freeMemory, "vkFreeMemory"},
		{&f.bindBufferMemory, "vkBindBufferMemory"},
		{&f.mapMemory, "vkMapMemory"},
		{&f.unmapMemory, "vkUnmapMemory"},
		{&f.createShaderModule, "vkCreateShaderModule"},
		{&f.destroyShaderModule, "vkDestroyShaderModule"},
		{&f.createDescSetLayout, "vkCreateDescriptorSetLayout"},
		{&f.destroyDescSetLayout, "vkDestroyDescriptorSetLayout"},
		{&f.createPipelineLayout, "vkCreatePipelineLayout"},
		{&f.destroyPipelineLayout, "vkDestroyPipelineLayout"},
		{&f.createComputePipes, "vkCreateComputePipelines"},
		{&f.destroyPipeline, "vkDestroyPipeline"},
		{&f.createDescPool, "vkCreateDescriptorPool"},
		{&f.destroyDescPool, "vkDestroyDescriptorPool"},
		{&f.resetDescPool, "vkResetDescriptorPool"},
		{&f.allocateDescSets, "vkAllocateDescriptorSets"},
		{&f.updateDescSets, "vkUpdateDescriptorSets"},
		{&f.createCommandPool, "vkCreateCommandPool"},
		{&f.destroyCommandPool, "vkDestroyCommandPool"},
		{&f.allocateCommandBufs, "vkAllocateCommandBuffers"},
		{&f.beginCommandBuffer, "vkBeginCommandBuffer"},
		{&f.endCommandBuffer, "vkEndCommandBuffer"},
		{&f.resetCommandBuffer, "vkResetCommandBuffer"},
		{&f.cmdBindPipeline, "vkCmdBindPipeline"},
		{&f.cmdBindDescSets, "vkCmdBindDescriptorSets"},
		{&f.cmdPushConstants, "vkCmdPushConstants"},
		{&f.cmdDispatch, "vkCmdDispatch"},
		{&f.cmdPipelineBarrier, "vkCmdPipelineBarrier"},
		{&f.cmdCopyBuffer, "vkCmdCopyBuffer"},
		{&f.cmdFillBuffer, "vkCmdFillBuffer"},
		{&f.queueSubmit, "vkQueueSubmit"},
		{&f.createFence, "vkCreateFence"},
		{&f.destroyFence, "vkDestroyFence"},
		{&f.waitForFences, "vkWaitForFences"},
		{&f.resetFences, "vkResetFences"},
	} {
		if _, err := purego.Dlsym(h, s.name); err != nil {
			return nil, fmt.Errorf("the Vulkan loader lacks %s (Vulkan 1.1 is needed): %w", s.name, err)
		}
		purego.RegisterLibFunc(s.fp, h, s.name)
	}
	return f, nil
}
