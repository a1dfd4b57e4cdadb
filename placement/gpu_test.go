package placement

import (
	"strings"
	"testing"

	"shoal/engine/quant"
)

// TestGPUNode: of three nodes with the same CPU, the one whose GPU reads
// memory 10x faster gets the model's layers, the members there say how many
// layers its GPU holds, and the predicted step is what the GPU's rate
// gives; a GPU too small for the node's share splits it, the rest read at
// the CPU's rate; a discrete GPU's memory adds to what the node can hold.
func TestGPUNode(t *testing.T) {
	prof, err := shape{name: "m", layers: 16, embd: 2048, heads: 16, kv: 4, ff: 5632, vocab: 32000, typ: quant.Q4_K, out: quant.Q6_K}.profile()
	if err != nil {
		t.Fatal(err)
	}
	cpuNode := func(id string) Node {
		return Node{ID: id, Status: StatusAlive, MemFree: 4 << 30, GFLOPS: 100, MemGBps: 20}
	}
	opts := Options{Context: 512, Batch: 1, Overhead: 64 << 20}
	gpu := cpuNode("g")
	gpu.GPUMem, gpu.GPUGBps, gpu.GPUShared = 8<<30, 200, true
	p, err := Place(prof, []Node{cpuNode("a"), gpu, cpuNode("b")}, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	st := p.Pools[0].Stages
	if len(st) != 1 || st[0].Members[0].Node != "g" || st[0].Members[0].GPULayers != prof.NLayer {
		t.Fatalf("plan %+v: want every layer on g's GPU", st)
	}
	onCPU, err := Place(prof, []Node{cpuNode("a")}, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	cpuMs, gpuMs := onCPU.Cost.MemoryMs, p.Cost.MemoryMs
	if r := cpuMs / gpuMs; r < 9.5 || r > 10.5 {
		t.Errorf("memory time %.3f ms on the GPU, %.3f ms on a CPU: ratio %.2f, want 10", gpuMs, cpuMs, r)
	}
	if onCPU.Pools[0].Stages[0].Members[0].GPULayers != 0 {
		t.Error("a CPU node's member claims GPU layers")
	}

	// A GPU that holds a quarter of the node's share.
	small := gpu
	small.GPUMem = st[0].Members[0].MemBytes / 4
	p, err = Place(prof, []Node{small}, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	m := p.Pools[0].Stages[0].Members[0]
	if m.GPULayers < prof.NLayer/4-1 || m.GPULayers > prof.NLayer/4+1 {
		t.Errorf("a GPU holding a quarter of %d MiB runs %d of %d layers", m.MemBytes>>20, m.GPULayers, prof.NLayer)
	}
	if p.Cost.MemoryMs <= gpuMs || p.Cost.MemoryMs >= cpuMs {
		t.Errorf("memory time %.3f ms with a quarter on the GPU, want between %.3f and %.3f", p.Cost.MemoryMs, gpuMs, cpuMs)
	}

	// Too little host memory for the model, but a discrete GPU with room.
	tight := cpuNode("d")
	tight.MemFree = 256 << 20
	if _, err := Place(prof, []Node{tight}, LinkMatrix{}, opts); err == nil {
		t.Fatal("a node with 256 MiB free took the model")
	}
	tight.GPUMem, tight.GPUGBps = 8<<30, 200
	if _, err := Place(prof, []Node{tight}, LinkMatrix{}, opts); err != nil {
		t.Errorf("a discrete GPU's memory does not count: %v", err)
	}
}

// TestTensorGroupGPUFirst: in a tensor group of a GPU node and a CPU node
// with more free memory, the GPU member is rank 0 and holds the output
// (which outweighs this small model's layers), and both members hold
// heads. Ranked by memory alone the CPU kept the output and the GPU took
// every head: a tensor group in name only, and a slower step.
func TestTensorGroupGPUFirst(t *testing.T) {
	prof, err := shape{name: "m", layers: 4, embd: 256, heads: 8, kv: 4, ff: 704, vocab: 32000, typ: quant.Q8_0, out: quant.Q8_0}.profile()
	if err != nil {
		t.Fatal(err)
	}
	cpu := Node{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1}
	gpu := Node{ID: "g", Status: StatusAlive, MemFree: 7 << 30, GFLOPS: 10, MemGBps: 1, GPUMem: 4 << 30, GPUGBps: 16, GPUShared: true}
	opts := Options{Context: 128, Batch: 1, Overhead: 64 << 20, Strategy: Tensor}
	for _, nodes := range [][]Node{{cpu, gpu}, {gpu, cpu}} {
		p, err := Place(prof, nodes, LinkMatrix{}, opts)
		if err != nil {
			t.Fatal(err)
		}
		st := p.Pools[0].Stages
		if len(st) != 1 || len(st[0].Members) != 2 {
			t.Fatalf("plan %+v: want one stage of two members", st)
		}
		ms := st[0].Members
		if ms[0].Node != "g" || !ms[0].Output {
			t.Errorf("rank 0 is %s (output %v), want the GPU node g holding the output", ms[0].Node, ms[0].Output)
		}
		for _, m := range ms {
			if m.HeadHi <= m.HeadLo {
				t.Errorf("%s holds heads [%d,%d): want some on each member", m.Node, m.HeadLo, m.HeadHi)
			}
		}
		// The memory order (the CPU first) costs more.
		e := newEnv(&prof, []Node{cpu, gpu}, LinkMatrix{}, opts.normalized())
		memFirst := e.evaluate([][]int{{0, 1}})
		if !memFirst.ok || memFirst.cost.MsPerToken <= p.Cost.MsPerToken {
			t.Errorf("the CPU at rank 0 predicts %.3f ms/token, the GPU %.3f: want the GPU's faster", memFirst.cost.MsPerToken, p.Cost.MsPerToken)
		}
	}
}

// TestExpertGroupBeyondHeads: a MoE model whose heads cut into fewer slices
// than the group has members still gets a tensor-parallel group of all of
// them, a member holding experts (or the output) without heads; a dense
// model with the same heads gets a smaller group, and the plan says why.
func TestExpertGroupBeyondHeads(t *testing.T) {
	nodes := []Node{
		{ID: "a", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1},
		{ID: "b", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1},
		{ID: "c", Status: StatusAlive, MemFree: 8 << 30, GFLOPS: 10, MemGBps: 1},
	}
	opts := Options{Context: 128, Batch: 1, Overhead: 64 << 20, Strategy: Tensor, Pin: []string{"a", "b", "c"}}
	moe, err := shape{name: "moe", layers: 4, embd: 256, heads: 8, kv: 2, ff: 256, vocab: 4096, experts: 8, used: 2, typ: quant.Q8_0, out: quant.Q8_0}.profile()
	if err != nil {
		t.Fatal(err)
	}
	if moe.HeadUnits() >= len(nodes) {
		t.Fatalf("%d head slices: the test wants fewer than %d", moe.HeadUnits(), len(nodes))
	}
	p, err := Place(moe, nodes, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	st := p.Pools[0].Stages
	if len(st) != 1 || len(st[0].Members) != len(nodes) {
		t.Fatalf("plan %+v: want one stage of %d members", st, len(nodes))
	}
	held := 0
	for _, m := range st[0].Members {
		held += len(m.Experts)
		if m.HeadHi <= m.HeadLo && len(m.Experts) == 0 && !m.Output {
			t.Errorf("%s holds no heads, experts or output", m.Node)
		}
	}
	if held != moe.NExpert {
		t.Errorf("the members hold %d experts, want each of the %d once", held, moe.NExpert)
	}
	dense, err := shape{name: "dense", layers: 4, embd: 256, heads: 8, kv: 2, ff: 704, vocab: 4096, typ: quant.Q8_0, out: quant.Q8_0}.profile()
	if err != nil {
		t.Fatal(err)
	}
	// Its 2 head slices cannot make a group of 3: the planner falls back
	// to a smaller group and says why.
	p, err = Place(dense, nodes, LinkMatrix{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if m := len(p.Pools[0].Stages[0].Members); m > dense.HeadUnits() || p.Fallback == nil || !strings.Contains(p.Fallback.Msg, "heads") {
		t.Errorf("a dense model with %d head slices got a tensor group of %d (fallback %+v): %+v", dense.HeadUnits(), m, p.Fallback, p.Pools[0].Stages)
	}
}
