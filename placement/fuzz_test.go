package placement

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fuzzBudget bounds one fuzz input's time and the bytes it allocates: a
// profile that passes Validate, however large, plans within them.
const (
	fuzzTime  = 20 * time.Second
	fuzzAlloc = 1 << 30
)

// withBudget runs fn, failing t when it panics, runs past fuzzTime or
// allocates more than fuzzAlloc bytes.
func withBudget(t *testing.T, what string, fn func() error) {
	t.Helper()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("panic: %v", p)
			}
		}()
		done <- fn()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(fuzzTime):
		t.Fatalf("%s: still running after %v", what, fuzzTime)
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if a := after.TotalAlloc - before.TotalAlloc; a > fuzzAlloc {
		t.Fatalf("%s: allocated %d MiB, budget %d MiB", what, a>>20, fuzzAlloc>>20)
	}
}

// FuzzPlanner plans profiles of any numbers over nodes of any capacities:
// a profile that fails Validate is refused by Place and Replan (the model
// unservable) without a panic or an allocation in proportion to its
// numbers; one that passes gets a plan that places it completely, or an
// error, within the time and memory budget, and so does its re-plan with
// a node gone.
func FuzzPlanner(f *testing.F) {
	for _, s := range realShapes {
		p, err := s.profile()
		if err != nil {
			f.Fatal(err)
		}
		l := p.Layers[0]
		f.Add(int64(p.NLayer), int64(p.NEmbd), int64(p.NHead), int64(p.NHeadKV), int64(p.HeadDim), int64(p.NVocab), int64(p.FFNDim), int64(p.FFNUnit),
			int64(p.NExpert), int64(p.NExpertUsed), int64(p.HeadUnit), p.KVBytesPerToken, l.AttnBytes, l.FFNBytes, l.ExpertBytes, p.EmbedBytes, l.AttnFLOPs,
			uint8(7), uint64(512<<30), 5000.0, 800.0, int64(4096), int64(1), uint8(0))
	}
	p := boundsProfile()
	l := p.Layers[0]
	f.Add(int64(p.NLayer), int64(p.NEmbd), int64(p.NHead), int64(p.NHeadKV), int64(p.HeadDim), int64(p.NVocab), int64(p.FFNDim), int64(p.FFNUnit),
		int64(p.NExpert), int64(p.NExpertUsed), int64(p.HeadUnit), p.KVBytesPerToken, l.AttnBytes, l.FFNBytes, l.ExpertBytes, p.EmbedBytes, l.AttnFLOPs,
		uint8(3), uint64(1<<30), 100.0, 50.0, int64(256), int64(2), uint8(0))
	// Issue #33: n_expert = 2^40.
	f.Add(int64(61), int64(7168), int64(128), int64(128), int64(128), int64(129280), int64(2048), int64(256),
		int64(1)<<40, int64(8), int64(1), uint64(65536), uint64(1<<26), uint64(1<<25), uint64(1<<24), uint64(1<<30), 1e9,
		uint8(4), uint64(1<<40), 1000.0, 400.0, int64(4096), int64(1), uint8(0))
	// Everything at its bound.
	f.Add(int64(MaxLayers), int64(MaxEmbd), int64(MaxHeads), int64(MaxHeads), int64(MaxHeadDim), int64(MaxVocab), int64(MaxFFN), int64(16),
		int64(MaxExperts), int64(MaxExperts), int64(1), MaxKVBytesPerToken, uint64(1<<30), uint64(1<<30), uint64(1<<20), uint64(1<<40), 1e15,
		uint8(7), uint64(1<<50), 1e9, 1e9, int64(MaxContext), int64(MaxBatch), uint8(3))
	f.Add(int64(MaxLayers), int64(MaxEmbd), int64(MaxHeads), int64(MaxHeads), int64(MaxHeadDim), int64(MaxVocab), int64(MaxFFN), int64(16),
		int64(MaxExperts), int64(8), int64(1), uint64(1<<10), uint64(1<<20), uint64(1<<20), uint64(1<<12), uint64(1<<30), 1e9,
		uint8(5), uint64(1<<44), 1e4, 1e3, int64(0), int64(0), uint8(4))
	// Negative and odd numbers, nodes that measured nothing or nonsense.
	f.Add(int64(-1), int64(-7168), int64(0), int64(-3), int64(0), int64(-1), int64(-5), int64(-1),
		int64(-256), int64(-8), int64(-1), uint64(math.MaxUint64), uint64(math.MaxUint64), uint64(0), uint64(0), uint64(math.MaxUint64), math.NaN(),
		uint8(255), uint64(0), math.Inf(-1), math.NaN(), int64(-1), int64(-1), uint8(9))
	f.Add(int64(3), int64(64), int64(6), int64(3), int64(1), int64(0), int64(96), int64(1),
		int64(3), int64(3), int64(2), uint64(1), uint64(7), uint64(5), uint64(3), uint64(1), 1e-300,
		uint8(5), uint64(1<<20), 1e-300, 1e300, int64(1), int64(1), uint8(1))
	// Planned for prompts (strategy bit 16: Options.Prompt = ctx).
	f.Add(int64(8), int64(512), int64(8), int64(4), int64(64), int64(32000), int64(1408), int64(32),
		int64(0), int64(0), int64(1), uint64(4096), uint64(1<<20), uint64(3<<20), uint64(0), uint64(1<<24), 5e8,
		uint8(3), uint64(8<<30), 200.0, 20.0, int64(2048), int64(1), uint8(16))
	f.Fuzz(func(t *testing.T, nLayer, nEmbd, nHead, nHeadKV, headDim, nVocab, ffnDim, ffnUnit, nExpert, nExpertUsed, headUnit int64,
		kv, attnB, ffnB, expB, embB uint64, flops float64,
		nNodes uint8, mem uint64, gflops, gbps float64, ctx, batch int64, strategy uint8) {
		prof := ModelProfile{Name: "fuzz", Arch: "llama", NLayer: int(nLayer), NEmbd: int(nEmbd), NHead: int(nHead), NHeadKV: int(nHeadKV),
			HeadDim: int(headDim), NVocab: int(nVocab), FFNDim: int(ffnDim), FFNUnit: int(ffnUnit), NExpert: int(nExpert),
			NExpertUsed: int(nExpertUsed), HeadUnit: int(headUnit), KVBytesPerToken: kv, EmbedBytes: embB, OutputBytes: embB / 2, Tied: embB%2 == 0}
		// The harness allocates no more layer profiles than the bound
		// (and one more, so that the count can be wrong).
		layers := 0
		if nLayer > 0 {
			layers = int(min(nLayer, MaxLayers+1))
		}
		if strategy&8 != 0 && layers > 0 {
			layers-- // one short
		}
		prof.Layers = make([]LayerProfile, layers)
		for i := range prof.Layers {
			k := uint64(i%3 + 1) // layers that differ a little
			prof.Layers[i] = LayerProfile{AttnBytes: attnB / k, FFNBytes: ffnB / k, ExpertBytes: expB, FixedBytes: attnB % 4096,
				AttnFLOPs: flops / float64(k), FFNFLOPs: flops, ExpertFLOPs: flops / 8, FixedFLOPs: flops / 1024}
		}
		n := int(nNodes%8) + 1 // 1 to 8 nodes
		nodes := make([]Node, n)
		for i := range nodes {
			nodes[i] = Node{ID: fmt.Sprintf("n%d", i), Status: StatusAlive, MemFree: mem >> (i % 4), GFLOPS: gflops * float64(i+1), MemGBps: gbps}
		}
		var links LinkMatrix
		if n > 2 {
			links.Set("n0", "n1", Link{Gbit: 100, LatencyMs: 0.01})
		}
		o := Options{Context: int(ctx), Batch: int(batch), Strategy: []Strategy{Auto, Pipeline, Tensor, ""}[strategy%4]}
		if strategy&4 != 0 && n > 1 {
			nodes[n-1].Serves = ServesPrefill
		}
		if strategy&16 != 0 {
			o.Prompt = int(ctx) // planned for prompts that fill the context
		}
		valid := prof.Validate()
		withBudget(t, "plan", func() error {
			plan, err := Place(prof, nodes, links, o)
			if valid != nil {
				if err == nil || !strings.Contains(err.Error(), "profile") {
					return fmt.Errorf("an invalid profile (%v) was placed: %v", valid, err)
				}
				d := Replan(prof, nodes, links, o, nil, "n0")
				if d.Unservable == "" || len(d.Plan.Pools) != 0 {
					return fmt.Errorf("an invalid profile (%v) was re-planned: %+v", valid, d)
				}
				return nil
			}
			if err != nil {
				return nil // does not fit, or options out of bounds
			}
			if err := plan.Validate(prof); err != nil {
				return fmt.Errorf("the plan does not place the model: %v\n%s", err, plan)
			}
			if err := plan.CheckBounds(&prof, 0); err != nil {
				return fmt.Errorf("the plan is out of bounds: %v\n%s", err, plan)
			}
			// A node of the plan gone: the re-plan keeps to the bounds too.
			gone := plan.Nodes()[0]
			var rest []Node
			for _, nd := range nodes {
				if nd.ID == gone {
					nd.Status = StatusFailed
				}
				rest = append(rest, nd)
			}
			d := Replan(prof, rest, links, o, &plan, "n0")
			if d.Unservable == "" && !d.Keep {
				if err := d.Plan.Validate(prof); err != nil {
					return fmt.Errorf("the re-plan does not place the model: %v\n%s", err, &d.Plan)
				}
			}
			return nil
		})
	})
}
