package vk

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Context is a logical device with one compute queue. Its methods are safe
// for concurrent use; a Cmd is not.
type Context struct {
	GPU    GPU
	f      *fns
	dev    Device
	queue  Queue
	family uint32
	mem    physicalDeviceMemoryProperties
	mu     sync.Mutex // the queue and the command pool
	pool   CommandPool
	fence  Fence
	// pools of descriptor sets, reset after each submit
	dpools []DescriptorPool
	dnext  int
	cmd    CommandBuffer
	// allocated is the bytes of device memory the context's buffers hold.
	allocated atomic.Int64
}

// Allocated is the device memory the context's buffers hold, in bytes.
func (c *Context) Allocated() uint64 { return uint64(c.allocated.Load()) }

// Open creates a context on device index of GPUs().
func Open(index int) (*Context, error) {
	gs, err := GPUs()
	if err != nil {
		return nil, err
	}
	if index < 0 || index >= len(gs) {
		return nil, fmt.Errorf("vulkan:%d: there are %d Vulkan devices here", index, len(gs))
	}
	c := &Context{GPU: gs[index], f: inst.f}
	f, pd := c.f, c.GPU.pd
	var n uint32
	f.getQueueFamilyProperties(pd, &n, nil)
	qs := make([]queueFamilyProperties, max(n, 1))
	f.getQueueFamilyProperties(pd, &n, &qs[0])
	c.family = ^uint32(0)
	for i, q := range qs[:n] {
		if q.queueFlags&QueueCompute != 0 {
			c.family = uint32(i)
			break
		}
	}
	if c.family == ^uint32(0) {
		return nil, fmt.Errorf("%s has no compute queue", c.GPU.Name)
	}
	// VK_KHR_portability_subset must be enabled where the driver has it.
	var enable []*byte
	if err := check(f.enumerateDeviceExtensionProps(pd, nil, &n, nil), "vkEnumerateDeviceExtensionProperties"); err != nil {
		return nil, err
	}
	exts := make([]extensionProperties, max(n, 1))
	f.enumerateDeviceExtensionProps(pd, nil, &n, &exts[0])
	for _, e := range exts[:n] {
		if goStr(e.name[:]) == "VK_KHR_portability_subset" {
			enable = append(enable, cstr("VK_KHR_portability_subset"))
		}
	}
	prio := float32(1)
	qi := &deviceQueueCreateInfo{sType: stDeviceQueueCreateInfo, queueFamilyIndex: c.family, queueCount: 1, pQueuePriorities: &prio}
	s16 := &physicalDevice16BitStorageFeatures{sType: stPhysicalDevice16BitStore}
	feat := &physicalDeviceFeatures2{sType: stPhysicalDeviceFeatures2, pNext: unsafe.Pointer(s16)}
	f.getPhysicalDeviceFeatures2(pd, feat)
	// Only 16-bit storage is switched on (when present); every other feature off.
	*s16 = physicalDevice16BitStorageFeatures{sType: stPhysicalDevice16BitStore, storageBuffer16BitAccess: s16.storageBuffer16BitAccess}
	feat = &physicalDeviceFeatures2{sType: stPhysicalDeviceFeatures2, pNext: unsafe.Pointer(s16)}
	di := &deviceCreateInfo{sType: stDeviceCreateInfo, pNext: unsafe.Pointer(feat), queueCreateInfoCount: 1, pQueueCreateInfos: qi, enabledExtensionCount: uint32(len(enable))}
	if len(enable) > 0 {
		di.ppEnabledExtensionNames = &enable[0]
	}
	if err := check(f.createDevice(pd, di, nil, &c.dev), "vkCreateDevice"); err != nil {
		return nil, err
	}
	f.getDeviceQueue(c.dev, c.family, 0, &c.queue)
	f.getPhysicalDeviceMemoryProperties(pd, &c.mem)
	if err := check(f.createCommandPool(c.dev, &commandPoolCreateInfo{sType: stCommandPoolCreateInfo, flags: commandPoolReset, queueFamilyIndex: c.family}, nil, &c.pool), "vkCreateCommandPool"); err != nil {
		c.Close()
		return nil, err
	}
	if err := check(f.allocateCommandBufs(c.dev, &commandBufferAllocateInfo{sType: stCommandBufferAllocateInfo, commandPool: c.pool, level: commandBufferPrimary, commandBufferCount: 1}, &c.cmd), "vkAllocateCommandBuffers"); err != nil {
		c.Close()
		return nil, err
	}
	if err := check(f.createFence(c.dev, &fenceCreateInfo{sType: stFenceCreateInfo}, nil, &c.fence), "vkCreateFence"); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Close waits for the device and frees the context.
func (c *Context) Close() {
	if c.dev == 0 {
		return
	}
	f := c.f
	f.deviceWaitIdle(c.dev)
	for _, p := range c.dpools {
		f.destroyDescPool(c.dev, p, nil)
	}
	if c.fence != 0 {
		f.destroyFence(c.dev, c.fence, nil)
	}
	if c.pool != 0 {
		f.destroyCommandPool(c.dev, c.pool, nil)
	}
	f.destroyDevice(c.dev, nil)
	c.dev = 0
}

// memoryType picks a memory type allowed by bits with all of want, and
// prefers one that also has prefer.
func (c *Context) memoryType(bits, want, prefer uint32) (uint32, error) {
	best := -1
	for i := range c.mem.memoryTypeCount {
		fl := c.mem.memoryTypes[i].propertyFlags
		if bits&(1<<i) == 0 || fl&want != want {
			continue
		}
		if fl&prefer == prefer {
			return i, nil
		}
		if best < 0 {
			best = int(i)
		}
	}
	if best < 0 {
		return 0, fmt.Errorf("%s has no memory type with flags %#x", c.GPU.Name, want)
	}
	return uint32(best), nil
}

// Buf is a storage buffer in device memory. Mapped buffers (host-visible
// memory) are read and written in place; the others through a staging copy.
type Buf struct {
	c      *Context
	buf    Buffer
	mem    DeviceMemory
	Size   uint64
	alloc  uint64
	mapped unsafe.Pointer
}

// ErrNoMemory is returned (wrapped) when the device is out of memory.
var ErrNoMemory = errors.New("out of device memory")

// NewBuffer allocates size bytes of device-local memory, mapped when the
// device offers memory that is both device-local and host-visible (a
// unified-memory or CPU device), or host-visible memory when host is set
// (for staging).
func (c *Context) NewBuffer(size uint64, host bool) (*Buf, error) {
	f := c.f
	b := &Buf{c: c, Size: size}
	ci := &bufferCreateInfo{sType: stBufferCreateInfo, size: max(size, 4), usage: BufferUsageStorage | BufferUsageTransferSrc | BufferUsageTransferDst}
	if err := check(f.createBuffer(c.dev, ci, nil, &b.buf), "vkCreateBuffer"); err != nil {
		return nil, err
	}
	var req memoryRequirements
	f.getBufferMemoryReqs(c.dev, b.buf, &req)
	want, prefer := uint32(MemoryDeviceLocal), uint32(MemoryDeviceLocal|MemoryHostVisible|MemoryHostCoherent)
	if host {
		want, prefer = MemoryHostVisible|MemoryHostCoherent, MemoryHostVisible|MemoryHostCoherent|MemoryHostCached
	}
	mt, err := c.memoryType(req.memoryTypeBits, want, prefer)
	if err != nil {
		f.destroyBuffer(c.dev, b.buf, nil)
		return nil, err
	}
	if r := f.allocateMemory(c.dev, &memoryAllocateInfo{sType: stMemoryAllocateInfo, allocationSize: req.size, memoryTypeIndex: mt}, nil, &b.mem); r < 0 {
		f.destroyBuffer(c.dev, b.buf, nil)
		if r == -2 || r == -1 {
			return nil, fmt.Errorf("%s: %d bytes: %w", c.GPU.Name, size, ErrNoMemory)
		}
		return nil, check(r, "vkAllocateMemory")
	}
	b.alloc = req.size
	c.allocated.Add(int64(b.alloc))
	if err := check(f.bindBufferMemory(c.dev, b.buf, b.mem, 0), "vkBindBufferMemory"); err != nil {
		b.Free()
		return nil, err
	}
	if fl := c.mem.memoryTypes[mt].propertyFlags; fl&(MemoryHostVisible|MemoryHostCoherent) == MemoryHostVisible|MemoryHostCoherent {
		if err := check(f.mapMemory(c.dev, b.mem, 0, ^uint64(0), 0, &b.mapped), "vkMapMemory"); err != nil {
			b.Free()
			return nil, err
		}
	}
	return b, nil
}

// Free releases the buffer (after the work using it has finished).
func (b *Buf) Free() {
	if b == nil || b.buf == 0 {
		return
	}
	f, d := b.c.f, b.c.dev
	if b.mapped != nil {
		f.unmapMemory(d, b.mem)
		b.mapped = nil
	}
	f.destroyBuffer(d, b.buf, nil)
	f.freeMemory(d, b.mem, nil)
	b.c.allocated.Add(-int64(b.alloc))
	b.buf, b.alloc = 0, 0
}

// Mapped is the buffer's memory as bytes, or nil when it is not mapped.
func (b *Buf) Mapped() []byte {
	if b.mapped == nil {
		return nil
	}
	return unsafe.Slice((*byte)(b.mapped), b.Size)
}

// Write copies data into the buffer at off (waiting for the copy).
func (b *Buf) Write(off uint64, data []byte) error {
	if off+uint64(len(data)) > b.Size {
		return fmt.Errorf("write of %d bytes at %d past a buffer of %d", len(data), off, b.Size)
	}
	if m := b.Mapped(); m != nil {
		copy(m[off:], data)
		return nil
	}
	return b.c.staged(b, off, data, true)
}

// Read copies the buffer's bytes at off into out (after the work writing
// them has finished).
func (b *Buf) Read(off uint64, out []byte) error {
	if off+uint64(len(out)) > b.Size {
		return fmt.Errorf("read of %d bytes at %d past a buffer of %d", len(out), off, b.Size)
	}
	if m := b.Mapped(); m != nil {
		copy(out, m[off:])
		return nil
	}
	return b.c.staged(b, off, out, false)
}

// staging chunk size
const stageChunk = 16 << 20

// staged moves data to (up) or from b through a host-visible buffer.
func (c *Context) staged(b *Buf, off uint64, data []byte, up bool) error {
	st, err := c.NewBuffer(min(uint64(len(data)), stageChunk), true)
	if err != nil {
		return err
	}
	defer st.Free()
	m := st.Mapped()
	for done := 0; done < len(data); {
		n := min(len(data)-done, len(m))
		cmd := c.Begin()
		if up {
			copy(m, data[done:done+n])
			cmd.Copy(st, 0, b, off+uint64(done), uint64(n))
		} else {
			cmd.Copy(b, off+uint64(done), st, 0, uint64(n))
		}
		if err := cmd.Submit(); err != nil {
			return err
		}
		if !up {
			copy(data[done:done+n], m)
		}
		done += n
	}
	return nil
}
