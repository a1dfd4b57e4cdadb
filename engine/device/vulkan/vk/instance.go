package vk

import (
	"encoding/binary"
	"fmt"
	"sync"
	"unsafe"
)

// GPU describes one physical device as the driver reports it.
type GPU struct {
	Index        int
	Name         string
	Type         int    // DeviceDiscrete, DeviceIntegrated, DeviceCPU, ...
	Memory       uint64 // bytes in the largest device-local heap
	SubgroupSize uint32
	// SubgroupArithmetic reports subgroupAdd and friends in compute shaders.
	SubgroupArithmetic bool
	// MaxStorageBuffer is the most bytes one storage-buffer binding reaches.
	MaxStorageBuffer uint64
	MaxSharedMemory  uint32
	MaxGroups        [3]uint32
	MaxInvocations   uint32
	MaxPushConstants uint32
	// MinStorageOffset is the alignment of a storage-buffer binding's offset.
	MinStorageOffset uint64

	pd PhysicalDevice
}

// TypeName names a device type.
func (g GPU) TypeName() string {
	switch g.Type {
	case DeviceDiscrete:
		return "discrete"
	case DeviceIntegrated:
		return "integrated"
	case DeviceVirtual:
		return "virtual"
	case DeviceCPU:
		return "cpu"
	}
	return "other"
}

// instance is the process's one Vulkan instance.
type instance struct {
	f    *fns
	inst Instance
	gpus []GPU
}

var (
	instOnce sync.Once
	inst     *instance
	instErr  error
)

// GPUs opens the loader (once per process) and lists the physical devices.
// The error says why Vulkan is not usable here: no loader, no driver, or
// no device.
func GPUs() ([]GPU, error) {
	instOnce.Do(func() { inst, instErr = newInstance() })
	if instErr != nil {
		return nil, instErr
	}
	return inst.gpus, nil
}

func newInstance() (*instance, error) {
	f, err := openLoader()
	if err != nil {
		return nil, err
	}
	// The portability enumeration extension (MoltenVK on macOS) is asked
	// for when the loader has it: without it such drivers are hidden.
	var n uint32
	if err := check(f.enumerateInstanceExtensionProps(nil, &n, nil), "vkEnumerateInstanceExtensionProperties"); err != nil {
		return nil, err
	}
	exts := make([]extensionProperties, max(n, 1))
	f.enumerateInstanceExtensionProps(nil, &n, &exts[0])
	var enable []*byte
	var flags uint32
	for _, e := range exts[:n] {
		if goStr(e.name[:]) == "VK_KHR_portability_enumeration" {
			enable = append(enable, cstr("VK_KHR_portability_enumeration"))
			flags |= 1 // VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR
		}
	}
	app := &applicationInfo{sType: stApplicationInfo, pApplicationName: cstr("shoal"), pEngineName: cstr("shoal"), apiVersion: 1<<22 | 1<<12}
	ci := &instanceCreateInfo{sType: stInstanceCreateInfo, flags: flags, pApplicationInfo: app, enabledExtensionCount: uint32(len(enable))}
	if len(enable) > 0 {
		ci.ppEnabledExtensionNames = &enable[0]
	}
	in := &instance{f: f}
	if err := check(f.createInstance(ci, nil, &in.inst), "vkCreateInstance"); err != nil {
		return nil, fmt.Errorf("%w (is a Vulkan driver installed? on Linux: mesa-vulkan-drivers or the GPU vendor's)", err)
	}
	if err := check(f.enumeratePhysicalDevices(in.inst, &n, nil), "vkEnumeratePhysicalDevices"); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("the Vulkan loader found no device")
	}
	pds := make([]PhysicalDevice, n)
	f.enumeratePhysicalDevices(in.inst, &n, &pds[0])
	for i, pd := range pds[:n] {
		in.gpus = append(in.gpus, describe(f, i, pd))
	}
	return in, nil
}

func describe(f *fns, i int, pd PhysicalDevice) GPU {
	sg := &subgroupProperties{sType: stSubgroupProperties}
	p2 := &physicalDeviceProperties2{sType: stPhysicalDeviceProperties2, pNext: unsafe.Pointer(sg)}
	f.getPhysicalDeviceProperties2(pd, p2)
	p := p2.properties[:]
	le := binary.LittleEndian
	const limits = 296
	g := GPU{Index: i, pd: pd,
		Type:               int(le.Uint32(p[16:])),
		Name:               goStr(p[20:276]),
		MaxStorageBuffer:   uint64(le.Uint32(p[limits+28:])),
		MaxPushConstants:   le.Uint32(p[limits+32:]),
		MaxSharedMemory:    le.Uint32(p[limits+216:]),
		MaxInvocations:     le.Uint32(p[limits+232:]),
		MinStorageOffset:   le.Uint64(p[limits+328:]),
		SubgroupSize:       sg.subgroupSize,
		SubgroupArithmetic: sg.supportedOperations&subgroupFeatureArithmetic != 0 && sg.supportedStages&shaderStageCompute != 0,
	}
	for k := range g.MaxGroups {
		g.MaxGroups[k] = le.Uint32(p[limits+220+4*k:])
	}
	mp := &physicalDeviceMemoryProperties{}
	f.getPhysicalDeviceMemoryProperties(pd, mp)
	for h := range mp.memoryHeapCount {
		if hp := mp.memoryHeaps[h]; hp.flags&1 != 0 && hp.size > g.Memory { // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
			g.Memory = hp.size
		}
	}
	return g
}
