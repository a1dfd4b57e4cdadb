package vk

import "unsafe"

// Handles. Dispatchable handles are pointers; the others are 64-bit
// values on every platform this package supports.
type (
	Instance       uintptr
	PhysicalDevice uintptr
	Device         uintptr
	Queue          uintptr
	CommandBuffer  uintptr

	Buffer              uint64
	DeviceMemory        uint64
	ShaderModule        uint64
	DescriptorSetLayout uint64
	PipelineLayout      uint64
	Pipeline            uint64
	DescriptorPool      uint64
	DescriptorSet       uint64
	CommandPool         uint64
	Fence               uint64
)

// Result is a VkResult.
type Result int32

// Structure types (VkStructureType) used here.
const (
	stApplicationInfo           = 0
	stInstanceCreateInfo        = 1
	stDeviceQueueCreateInfo     = 2
	stDeviceCreateInfo          = 3
	stSubmitInfo                = 4
	stMemoryAllocateInfo        = 5
	stFenceCreateInfo           = 8
	stBufferCreateInfo          = 12
	stShaderModuleCreateInfo    = 16
	stPipelineShaderStage       = 18
	stComputePipelineCreateInfo = 29
	stPipelineLayoutCreateInfo  = 30
	stDescriptorSetLayoutCreate = 32
	stDescriptorPoolCreateInfo  = 33
	stDescriptorSetAllocateInfo = 34
	stWriteDescriptorSet        = 35
	stCommandPoolCreateInfo     = 39
	stCommandBufferAllocateInfo = 40
	stCommandBufferBeginInfo    = 42
	stMemoryBarrier             = 46
	stPhysicalDeviceProperties2 = 1000059001
	stSubgroupProperties        = 1000094000
	stPhysicalDevice16BitStore  = 1000083000
	stPhysicalDeviceFeatures2   = 1000059000
)

// Flags and enums used here.
const (
	QueueCompute = 0x2

	BufferUsageTransferSrc = 0x1
	BufferUsageTransferDst = 0x2
	BufferUsageStorage     = 0x20

	MemoryDeviceLocal  = 0x1
	MemoryHostVisible  = 0x2
	MemoryHostCoherent = 0x4
	MemoryHostCached   = 0x8

	descriptorStorageBuffer = 7
	shaderStageCompute      = 0x20
	pipelineBindCompute     = 1
	commandBufferPrimary    = 0
	oneTimeSubmit           = 0x1
	commandPoolReset        = 0x2

	accessShaderRead    = 0x20
	accessShaderWrite   = 0x40
	accessTransferRead  = 0x800
	accessTransferWrite = 0x1000
	accessHostRead      = 0x2000
	accessHostWrite     = 0x4000
	stageCompute        = 0x800
	stageTransfer       = 0x1000
	stageHost           = 0x4000

	// Device types (VkPhysicalDeviceType).
	DeviceOther      = 0
	DeviceIntegrated = 1
	DeviceDiscrete   = 2
	DeviceVirtual    = 3
	DeviceCPU        = 4

	subgroupFeatureArithmetic = 0x4
)

type applicationInfo struct {
	sType              int32
	pNext              unsafe.Pointer
	pApplicationName   *byte
	applicationVersion uint32
	pEngineName        *byte
	engineVersion      uint32
	apiVersion         uint32
}

type instanceCreateInfo struct {
	sType                   int32
	pNext                   unsafe.Pointer
	flags                   uint32
	pApplicationInfo        *applicationInfo
	enabledLayerCount       uint32
	ppEnabledLayerNames     **byte
	enabledExtensionCount   uint32
	ppEnabledExtensionNames **byte
}

type extensionProperties struct {
	name        [256]byte
	specVersion uint32
}

type deviceQueueCreateInfo struct {
	sType            int32
	pNext            unsafe.Pointer
	flags            uint32
	queueFamilyIndex uint32
	queueCount       uint32
	pQueuePriorities *float32
}

type deviceCreateInfo struct {
	sType                   int32
	pNext                   unsafe.Pointer
	flags                   uint32
	queueCreateInfoCount    uint32
	pQueueCreateInfos       *deviceQueueCreateInfo
	enabledLayerCount       uint32
	ppEnabledLayerNames     **byte
	enabledExtensionCount   uint32
	ppEnabledExtensionNames **byte
	pEnabledFeatures        unsafe.Pointer
}

// physicalDeviceProperties is VkPhysicalDeviceProperties as bytes: the
// fields read are at the offsets of the C structure.
type physicalDeviceProperties [824]byte

type physicalDeviceProperties2 struct {
	sType      int32
	pNext      unsafe.Pointer
	properties physicalDeviceProperties
}

type subgroupProperties struct {
	sType                     int32
	pNext                     unsafe.Pointer
	subgroupSize              uint32
	supportedStages           uint32
	supportedOperations       uint32
	quadOperationsInAllStages uint32
}

type memoryType struct{ propertyFlags, heapIndex uint32 }

type memoryHeap struct {
	size  uint64
	flags uint32
}

type physicalDeviceMemoryProperties struct {
	memoryTypeCount uint32
	memoryTypes     [32]memoryType
	memoryHeapCount uint32
	memoryHeaps     [16]memoryHeap
}

type queueFamilyProperties struct {
	queueFlags, queueCount, timestampValidBits uint32
	granularity                                [3]uint32
}

type physicalDevice16BitStorageFeatures struct {
	sType                              int32
	pNext                              unsafe.Pointer
	storageBuffer16BitAccess           uint32
	uniformAndStorageBuffer16BitAccess uint32
	storagePushConstant16              uint32
	storageInputOutput16               uint32
}

type physicalDeviceFeatures2 struct {
	sType    int32
	pNext    unsafe.Pointer
	features [55]uint32
}

type bufferCreateInfo struct {
	sType                 int32
	pNext                 unsafe.Pointer
	flags                 uint32
	size                  uint64
	usage                 uint32
	sharingMode           uint32
	queueFamilyIndexCount uint32
	pQueueFamilyIndices   *uint32
}

type memoryRequirements struct {
	size, alignment uint64
	memoryTypeBits  uint32
}

type memoryAllocateInfo struct {
	sType           int32
	pNext           unsafe.Pointer
	allocationSize  uint64
	memoryTypeIndex uint32
}

type shaderModuleCreateInfo struct {
	sType    int32
	pNext    unsafe.Pointer
	flags    uint32
	codeSize uintptr
	pCode    *uint32
}

type descriptorSetLayoutBinding struct {
	binding            uint32
	descriptorType     uint32
	descriptorCount    uint32
	stageFlags         uint32
	pImmutableSamplers unsafe.Pointer
}

type descriptorSetLayoutCreateInfo struct {
	sType        int32
	pNext        unsafe.Pointer
	flags        uint32
	bindingCount uint32
	pBindings    *descriptorSetLayoutBinding
}

type pushConstantRange struct{ stageFlags, offset, size uint32 }

type pipelineLayoutCreateInfo struct {
	sType                  int32
	pNext                  unsafe.Pointer
	flags                  uint32
	setLayoutCount         uint32
	pSetLayouts            *DescriptorSetLayout
	pushConstantRangeCount uint32
	pPushConstantRanges    *pushConstantRange
}

type specializationMapEntry struct {
	constantID, offset uint32
	size               uintptr
}

type specializationInfo struct {
	mapEntryCount uint32
	pMapEntries   *specializationMapEntry
	dataSize      uintptr
	pData         unsafe.Pointer
}

type pipelineShaderStageCreateInfo struct {
	sType               int32
	pNext               unsafe.Pointer
	flags               uint32
	stage               uint32
	module              ShaderModule
	pName               *byte
	pSpecializationInfo *specializationInfo
}

type computePipelineCreateInfo struct {
	sType              int32
	pNext              unsafe.Pointer
	flags              uint32
	stage              pipelineShaderStageCreateInfo
	layout             PipelineLayout
	basePipelineHandle Pipeline
	basePipelineIndex  int32
}

type descriptorPoolSize struct{ typ, count uint32 }

type descriptorPoolCreateInfo struct {
	sType         int32
	pNext         unsafe.Pointer
	flags         uint32
	maxSets       uint32
	poolSizeCount uint32
	pPoolSizes    *descriptorPoolSize
}

type descriptorSetAllocateInfo struct {
	sType              int32
	pNext              unsafe.Pointer
	descriptorPool     DescriptorPool
	descriptorSetCount uint32
	pSetLayouts        *DescriptorSetLayout
}

type descriptorBufferInfo struct {
	buffer       Buffer
	offset, rnge uint64
}

type writeDescriptorSet struct {
	sType            int32
	pNext            unsafe.Pointer
	dstSet           DescriptorSet
	dstBinding       uint32
	dstArrayElement  uint32
	descriptorCount  uint32
	descriptorType   uint32
	pImageInfo       unsafe.Pointer
	pBufferInfo      *descriptorBufferInfo
	pTexelBufferView unsafe.Pointer
}

type commandPoolCreateInfo struct {
	sType            int32
	pNext            unsafe.Pointer
	flags            uint32
	queueFamilyIndex uint32
}

type commandBufferAllocateInfo struct {
	sType              int32
	pNext              unsafe.Pointer
	commandPool        CommandPool
	level              uint32
	commandBufferCount uint32
}

type commandBufferBeginInfo struct {
	sType            int32
	pNext            unsafe.Pointer
	flags            uint32
	pInheritanceInfo unsafe.Pointer
}

type memoryBarrier struct {
	sType         int32
	pNext         unsafe.Pointer
	srcAccessMask uint32
	dstAccessMask uint32
}

type submitInfo struct {
	sType                int32
	pNext                unsafe.Pointer
	waitSemaphoreCount   uint32
	pWaitSemaphores      unsafe.Pointer
	pWaitDstStageMask    unsafe.Pointer
	commandBufferCount   uint32
	pCommandBuffers      *CommandBuffer
	signalSemaphoreCount uint32
	pSignalSemaphores    unsafe.Pointer
}

type fenceCreateInfo struct {
	sType int32
	pNext unsafe.Pointer
	flags uint32
}

type bufferCopy struct{ src, dst, size uint64 }
