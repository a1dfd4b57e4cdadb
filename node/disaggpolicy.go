package node

import (
	"shoal/coordinator"
	"shoal/disagg"
	"shoal/parallel"
	"shoal/placement"
)

// prefillRule is the routing rule of a disaggregated plan (nil for one
// that is not): disagg.Decide over the cost model the state gives: the
// model's KV per token, each pool's measured compute, the link the state
// measured between the two pools' drivers, then per prompt what the
// engine sees: the streams a local prefill would stall (CostModel.Streams)
// and the prefill pool's speed on its latest handoffs, which replaces the
// probed one (the probes of two identical 1-core devices differed enough
// to keep every long prompt on a decode device running 8 streams). With
// --disagg on every prompt goes to the prefill pool.
//
// chunk is the prompt tokens of one handoff step: what the prefill pool
// computes in about 2 s at its measured speed (32 to 512), so that a step
// stays well inside the step timeout on a slow prefill node.
func prefillRule(st *coordinator.State, m *coordinator.Model, p *placement.Plan) (rule func(n int, now parallel.Load) bool, chunk int) {
	pre, dec := p.Pool(placement.RolePrefill), p.Pool(placement.RoleDecode)
	if pre == nil || dec == nil || m.Profile == nil {
		return nil, 0
	}
	mode, err := disagg.ParseMode(m.Disagg)
	if err != nil {
		mode = disagg.ModeAuto
	}
	cm := costModel(st, m.Profile, m.KVType, pre, dec)
	chunk = 512
	if r := cm.RemotePrefillTokPerSec; r > 0 {
		chunk = min(512, max(32, int(2*r)))
	}
	return func(n int, now parallel.Load) bool {
		c := cm
		c.Streams = now.Streams
		if now.RemoteTokPerSec > 0 {
			c.RemotePrefillTokPerSec = now.RemoteTokPerSec
		}
		return disagg.Decide(n, c, mode).Remote
	}, chunk
}

// costModel builds the routing cost model of a plan's pools.
func costModel(st *coordinator.State, prof *placement.ModelProfile, kvType string, pre, dec *placement.Pool) disagg.CostModel {
	var flops float64 // per token, every layer and the output
	for _, l := range prof.Layers {
		flops += l.AttnFLOPs + l.FFNFLOPs + float64(prof.NExpertUsed)*l.ExpertFLOPs + l.FixedFLOPs
	}
	flops += 2 * float64(prof.NEmbd) * float64(prof.NVocab)
	rate := func(pool *placement.Pool) float64 {
		// Prefill runs the stages one after the other: the pool's rate
		// is bounded by its slowest stage's share of the work.
		worst := 0.0
		for _, stg := range pool.Stages {
			g := 0.0
			for _, mb := range stg.Members {
				if n := st.Nodes[mb.Node]; n != nil {
					g += n.Caps.GFLOPS
				}
			}
			share := float64(stg.Hi-stg.Lo) / float64(max(prof.NLayer, 1))
			if g <= 0 || share <= 0 {
				continue
			}
			t := share * flops / (g * 1e9) // seconds per token in this stage
			worst = max(worst, t)
		}
		if worst == 0 {
			return 0
		}
		return 1 / worst
	}
	lm := coordinator.LinkMatrix(st)
	from, to := pre.Stages[0].Members[0].Node, dec.Stages[0].Members[0].Node
	link := lm.Get(from, to)
	return disagg.CostModel{
		KVBytesPerToken:        int(placement.KVBytes(prof.KVBytesPerToken, kvType)) * prof.NLayer,
		Layers:                 prof.NLayer,
		LocalPrefillTokPerSec:  rate(dec),
		RemotePrefillTokPerSec: rate(pre),
		LinkGbit:               link.Gbit,
		LinkLatencyMs:          2 * link.LatencyMs,
		// The point of a prefill pool is that the decode pool's streams
		// keep their pace: a long prompt goes there when moving its KV
		// is cheaper than computing it here, even if its own first token
		// comes up to a quarter later.
		Isolation: 0.25,
	}
}
