package vk

import (
	"fmt"
	"unsafe"
)

// Kernel is a compute pipeline: one SPIR-V module with entry point main,
// its storage buffers at bindings 0..n-1 of set 0, and push constants.
type Kernel struct {
	Name    string
	c       *Context
	layout  DescriptorSetLayout
	playout PipelineLayout
	pipe    Pipeline
	nbind   int
	push    uint32
}

// NewKernel builds a pipeline from SPIR-V with nbind storage buffers, push
// bytes of push constants, and specialization constants spec (constant_id
// i = spec[i]).
func (c *Context) NewKernel(name string, spirv []byte, nbind, push int, spec []uint32) (*Kernel, error) {
	if len(spirv) == 0 || len(spirv)%4 != 0 {
		return nil, fmt.Errorf("kernel %s: %d bytes are not SPIR-V", name, len(spirv))
	}
	if uint32(push) > c.GPU.MaxPushConstants {
		return nil, fmt.Errorf("kernel %s: %d bytes of push constants, the device allows %d", name, push, c.GPU.MaxPushConstants)
	}
	f, d := c.f, c.dev
	k := &Kernel{Name: name, c: c, nbind: nbind, push: uint32(push)}
	code := make([]uint32, len(spirv)/4)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&code[0])), len(spirv)), spirv)
	var mod ShaderModule
	if err := check(f.createShaderModule(d, &shaderModuleCreateInfo{sType: stShaderModuleCreateInfo, codeSize: uintptr(len(spirv)), pCode: &code[0]}, nil, &mod), "vkCreateShaderModule "+name); err != nil {
		return nil, err
	}
	defer f.destroyShaderModule(d, mod, nil)
	binds := make([]descriptorSetLayoutBinding, max(nbind, 1))
	for i := range nbind {
		binds[i] = descriptorSetLayoutBinding{binding: uint32(i), descriptorType: descriptorStorageBuffer, descriptorCount: 1, stageFlags: shaderStageCompute}
	}
	if err := check(f.createDescSetLayout(d, &descriptorSetLayoutCreateInfo{sType: stDescriptorSetLayoutCreate, bindingCount: uint32(nbind), pBindings: &binds[0]}, nil, &k.layout), "vkCreateDescriptorSetLayout"); err != nil {
		return nil, err
	}
	pli := &pipelineLayoutCreateInfo{sType: stPipelineLayoutCreateInfo, setLayoutCount: 1, pSetLayouts: &k.layout}
	if push > 0 {
		pli.pushConstantRangeCount = 1
		pli.pPushConstantRanges = &pushConstantRange{stageFlags: shaderStageCompute, size: uint32(push)}
	}
	if err := check(f.createPipelineLayout(d, pli, nil, &k.playout), "vkCreatePipelineLayout"); err != nil {
		k.Free()
		return nil, err
	}
	stage := pipelineShaderStageCreateInfo{sType: stPipelineShaderStage, stage: shaderStageCompute, module: mod, pName: cstr("main")}
	if len(spec) > 0 {
		ents := make([]specializationMapEntry, len(spec))
		for i := range spec {
			ents[i] = specializationMapEntry{constantID: uint32(i), offset: uint32(4 * i), size: 4}
		}
		data := append([]uint32(nil), spec...)
		stage.pSpecializationInfo = &specializationInfo{mapEntryCount: uint32(len(spec)), pMapEntries: &ents[0], dataSize: uintptr(4 * len(spec)), pData: unsafe.Pointer(&data[0])}
	}
	ci := &computePipelineCreateInfo{sType: stComputePipelineCreateInfo, stage: stage, layout: k.playout, basePipelineIndex: -1}
	if err := check(f.createComputePipes(d, 0, 1, ci, nil, &k.pipe), "vkCreateComputePipelines "+name); err != nil {
		k.Free()
		return nil, err
	}
	return k, nil
}

// Free destroys the pipeline.
func (k *Kernel) Free() {
	f, d := k.c.f, k.c.dev
	if k.pipe != 0 {
		f.destroyPipeline(d, k.pipe, nil)
	}
	if k.playout != 0 {
		f.destroyPipelineLayout(d, k.playout, nil)
	}
	if k.layout != 0 {
		f.destroyDescSetLayout(d, k.layout, nil)
	}
	k.pipe, k.playout, k.layout = 0, 0, 0
}

// Span is a byte range of a buffer bound to a kernel; Size 0 means to the
// end of the buffer.
type Span struct {
	B         *Buf
	Off, Size uint64
}

// Whole spans all of b.
func Whole(b *Buf) Span { return Span{B: b} }

// Cmd records work for the context's queue. Only one Cmd is open per
// context at a time: Begin waits for the previous one's Submit.
type Cmd struct {
	c     *Context
	cb    CommandBuffer
	err   error
	first bool
}

// Begin starts recording.
func (c *Context) Begin() *Cmd {
	c.mu.Lock()
	m := &Cmd{c: c, cb: c.cmd, first: true}
	if err := check(c.f.resetCommandBuffer(c.cmd, 0), "vkResetCommandBuffer"); err != nil {
		m.err = err
		return m
	}
	m.err = check(c.f.beginCommandBuffer(c.cmd, &commandBufferBeginInfo{sType: stCommandBufferBeginInfo, flags: oneTimeSubmit}), "vkBeginCommandBuffer")
	return m
}

// barrier orders every earlier shader or transfer write before every later
// access.
func (m *Cmd) barrier() {
	mb := &memoryBarrier{sType: stMemoryBarrier, srcAccessMask: accessShaderWrite | accessTransferWrite | accessHostWrite,
		dstAccessMask: accessShaderRead | accessShaderWrite | accessTransferRead | accessTransferWrite}
	m.c.f.cmdPipelineBarrier(m.cb, stageCompute|stageTransfer|stageHost, stageCompute|stageTransfer, 0, 1, mb, 0, nil, 0, nil)
}

// descriptorSet allocates a set for k from the context's pools.
func (m *Cmd) descriptorSet(k *Kernel) (DescriptorSet, error) {
	c, f := m.c, m.c.f
	for {
		if c.dnext == len(c.dpools) {
			sizes := &descriptorPoolSize{typ: descriptorStorageBuffer, count: 8192}
			var p DescriptorPool
			if err := check(f.createDescPool(c.dev, &descriptorPoolCreateInfo{sType: stDescriptorPoolCreateInfo, maxSets: 2048, poolSizeCount: 1, pPoolSizes: sizes}, nil, &p), "vkCreateDescriptorPool"); err != nil {
				return 0, err
			}
			c.dpools = append(c.dpools, p)
		}
		var s DescriptorSet
		r := f.allocateDescSets(c.dev, &descriptorSetAllocateInfo{sType: stDescriptorSetAllocateInfo, descriptorPool: c.dpools[c.dnext], descriptorSetCount: 1, pSetLayouts: &k.layout}, &s)
		if r == 0 {
			return s, nil
		}
		if r != -1000069000 && r != -12 { // out of pool memory, fragmented: take the next pool
			return 0, check(r, "vkAllocateDescriptorSets")
		}
		c.dnext++
	}
}

// Dispatch records k over groups (x, y, z) with push constants push and
// buffers bufs at bindings 0.., after a barrier on everything before it.
func (m *Cmd) Dispatch(k *Kernel, x, y, z uint32, push []uint32, bufs ...Span) {
	if m.err != nil {
		return
	}
	if len(bufs) != k.nbind || uint32(4*len(push)) != k.push {
		m.err = fmt.Errorf("kernel %s: %d buffers and %d push bytes, it takes %d and %d", k.Name, len(bufs), 4*len(push), k.nbind, k.push)
		return
	}
	if g := m.c.GPU.MaxGroups; x > g[0] || y > g[1] || z > g[2] {
		m.err = fmt.Errorf("kernel %s: %d×%d×%d groups, the device allows %v", k.Name, x, y, z, g)
		return
	}
	if x == 0 || y == 0 || z == 0 {
		return
	}
	set, err := m.descriptorSet(k)
	if err != nil {
		m.err = err
		return
	}
	f := m.c.f
	infos := make([]descriptorBufferInfo, len(bufs))
	writes := make([]writeDescriptorSet, len(bufs))
	for i, s := range bufs {
		size := s.Size
		if size == 0 {
			size = s.B.Size - s.Off
		}
		if s.Off+size > s.B.Size || size > m.c.GPU.MaxStorageBuffer {
			m.err = fmt.Errorf("kernel %s: binding %d spans [%d,+%d) of a %d-byte buffer (bindings reach %d bytes)", k.Name, i, s.Off, size, s.B.Size, m.c.GPU.MaxStorageBuffer)
			return
		}
		infos[i] = descriptorBufferInfo{buffer: s.B.buf, offset: s.Off, rnge: size}
		writes[i] = writeDescriptorSet{sType: stWriteDescriptorSet, dstSet: set, dstBinding: uint32(i), descriptorCount: 1, descriptorType: descriptorStorageBuffer, pBufferInfo: &infos[i]}
	}
	if len(writes) > 0 {
		f.updateDescSets(m.c.dev, uint32(len(writes)), &writes[0], 0, nil)
	}
	if !m.first {
		m.barrier()
	}
	m.first = false
	f.cmdBindPipeline(m.cb, pipelineBindCompute, k.pipe)
	f.cmdBindDescSets(m.cb, pipelineBindCompute, k.playout, 0, 1, &set, 0, nil)
	if len(push) > 0 {
		f.cmdPushConstants(m.cb, k.playout, shaderStageCompute, 0, uint32(4*len(push)), unsafe.Pointer(&push[0]))
	}
	f.cmdDispatch(m.cb, x, y, z)
}

// Copy records a copy of n bytes between buffers.
func (m *Cmd) Copy(src *Buf, srcOff uint64, dst *Buf, dstOff, n uint64) {
	if m.err != nil || n == 0 {
		return
	}
	if !m.first {
		m.barrier()
	}
	m.first = false
	m.c.f.cmdCopyBuffer(m.cb, src.buf, dst.buf, 1, &bufferCopy{src: srcOff, dst: dstOff, size: n})
}

// Fill records writing the 32-bit value v over [off, off+size) of b (size
// a multiple of 4).
func (m *Cmd) Fill(b *Buf, off, size uint64, v uint32) {
	if m.err != nil || size == 0 {
		return
	}
	if !m.first {
		m.barrier()
	}
	m.first = false
	m.c.f.cmdFillBuffer(m.cb, b.buf, off, size, v)
}

// Submit ends the recording, runs it and waits for it to finish.
func (m *Cmd) Submit() error {
	c, f := m.c, m.c.f
	defer c.mu.Unlock()
	defer func() {
		for _, p := range c.dpools[:min(c.dnext+1, len(c.dpools))] {
			f.resetDescPool(c.dev, p, 0)
		}
		c.dnext = 0
	}()
	if m.err != nil {
		f.endCommandBuffer(m.cb)
		return m.err
	}
	if !m.first { // make the results visible to the host
		mb := &memoryBarrier{sType: stMemoryBarrier, srcAccessMask: accessShaderWrite | accessTransferWrite, dstAccessMask: accessHostRead}
		f.cmdPipelineBarrier(m.cb, stageCompute|stageTransfer, stageHost, 0, 1, mb, 0, nil, 0, nil)
	}
	if err := check(f.endCommandBuffer(m.cb), "vkEndCommandBuffer"); err != nil {
		return err
	}
	cb := m.cb
	if err := check(f.queueSubmit(c.queue, 1, &submitInfo{sType: stSubmitInfo, commandBufferCount: 1, pCommandBuffers: &cb}, c.fence), "vkQueueSubmit"); err != nil {
		return err
	}
	r := f.waitForFences(c.dev, 1, &c.fence, 1, 60e9)
	f.resetFences(c.dev, 1, &c.fence)
	if r == 2 {
		return fmt.Errorf("%s: work did not finish in 60 s", c.GPU.Name)
	}
	return check(r, "vkWaitForFences")
}
