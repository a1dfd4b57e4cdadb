package node

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sort"
	"time"

	"shoal/api"
	"shoal/coordinator"
	"shoal/placement"
)

func badRequest(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

func notFoundErr(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf(format, args...)}
}

// LoadModel registers a model file or hub reference (the catalog's).
func (b *admin) LoadModel(ctx context.Context, req api.LoadModelRequest) (*api.ModelInfo, error) {
	return b.cat.LoadModel(ctx, req)
}

// Models lists the cluster's models with their shards (the catalog's).
func (b *admin) Models(ctx context.Context) ([]api.ModelInfo, error) { return b.cat.Models(ctx) }

// UnloadModel removes a model, its plan and its shards (the catalog's).
func (b *admin) UnloadModel(ctx context.Context, name string) error {
	return b.cat.UnloadModel(ctx, name)
}

// PredictPrefill is the model's plan's predicted prefill of a prompt of
// tokens tokens (coordinator.PrefillPrediction).
func (b *admin) PredictPrefill(ctx context.Context, name string, tokens int) (*api.PrefillPrediction, error) {
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	if st.Models[name] == nil {
		return nil, notFoundErr("model %q is not loaded (see 'shoal model ls')", name)
	}
	version, pf, ok := coordinator.PrefillPrediction(st, name, tokens)
	if !ok {
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("model %q has no plan whose prefill can be predicted (not placed yet, or disaggregated pools)", name)}
	}
	return &api.PrefillPrediction{Model: name, PlanVersion: version, Tokens: pf.Tokens, Piece: pf.Piece, Pieces: pf.Pieces,
		Ms: pf.Ms, OneStepMs: pf.OneStepMs, StageMs: pf.StageMs}, nil
}

// Placement is a model's committed plan, by node name.
func (b *admin) Placement(ctx context.Context, name string) (*api.PlacementInfo, error) {
	st, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	m := st.Models[name]
	if m == nil {
		return nil, notFoundErr("model %q is not loaded (see 'shoal model ls')", name)
	}
	mi := b.cat.ModelInfo(st, m)
	out := &api.PlacementInfo{Model: name, Status: mi.Status, Reason: mi.Reason, Replicas: mi.Replicas, Holders: mi.Holders}
	pp := st.Plans[name]
	if pp == nil {
		return out, nil
	}
	out.Version, out.Strategy, out.Context, out.Batch = pp.Version, pp.Strategy, pp.Context, pp.Batch
	out.Queue = queueBound(m.Queue, pp.Batch)
	out.PlanPrompt = m.PlanPrompt
	out.KVType = pp.KVType
	if out.KVType == "" {
		out.KVType = "f16"
	}
	if m.Profile != nil {
		out.KVBytesPerToken = placement.KVBytes(m.Profile.KVBytesPerToken, pp.KVType) * uint64(m.Profile.NLayer)
	}
	out.Cost, out.Explain, out.Moved, out.MovedBytes = apiCost(pp.Cost), pp.Explain, pp.Moved, pp.MovedBytes
	if pp.Fallback != nil {
		out.Fallback = pp.Fallback.Msg
	}
	mem, kvb := map[string]uint64{}, map[string]uint64{}
	var order []string
	for _, pool := range pp.Pools {
		for k, s := range pool.Stages {
			ps := api.PlacementStage{Pool: pool.Role, Index: k, Lo: s.Lo, Hi: s.Hi, Ms: s.Ms}
			for _, mb := range s.Members {
				name := mb.Node
				if n := st.Nodes[mb.Node]; n != nil {
					name = n.Name
				}
				ps.Members = append(ps.Members, apiPlacementMember(mb, name))
				if _, ok := mem[mb.Node]; !ok {
					order = append(order, mb.Node)
				}
				mem[mb.Node] += mb.MemBytes
				kvb[mb.Node] += mb.KVBytes
				out.KVBytes += mb.KVBytes
			}
			out.Stages = append(out.Stages, ps)
		}
	}
	in := map[string]bool{}
	for _, id := range order {
		in[id] = true
	}
	keys := make([]string, 0, len(st.Links))
	for k := range st.Links {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	nameOf := func(id string) string {
		if n := st.Nodes[id]; n != nil {
			return n.Name
		}
		return id
	}
	// The links between the plan's nodes, and from them to the other
	// live nodes: what a re-plan weighs (a node left out for a slow link
	// shows why).
	live := func(id string) bool { n := st.Nodes[id]; return n != nil && n.Status == coordinator.StatusAlive }
	for _, k := range keys {
		if l := st.Links[k]; (in[l.From] && (in[l.To] || live(l.To))) || (in[l.To] && live(l.From)) {
			out.Links = append(out.Links, api.Link{From: nameOf(l.From), To: nameOf(l.To), Gbit: l.Gbit, LatencyMs: l.LatencyMs,
				ProbeGbit: l.ProbeGbit, LiveGbit: l.LiveGbit, DirectGbit: l.DirectGbit, RTTMs: l.RTTMs, Source: l.Source, Iface: l.Iface, Telemetry: l.Telemetry,
				TxBytes: l.TxBytes, RxBytes: l.RxBytes, AgeSec: math.Round(time.Since(l.MeasuredAt).Seconds()*10) / 10})
		}
	}
	for _, id := range order {
		nm := api.NodeMemory{Node: id, Name: id, MemBytes: mem[id], KVBytes: kvb[id]}
		if n := st.Nodes[id]; n != nil {
			nm.Name, nm.Status, nm.MemFree = n.Name, string(n.Status), n.Caps.MemFree
		}
		out.Nodes = append(out.Nodes, nm)
	}
	return out, nil
}

// queueBound is how many requests wait for one of a planned model's
// seqs running places before the driver answers 429: the model's
// --queue, else 4 per place.
func queueBound(queue, seqs int) int {
	if queue > 0 {
		return queue
	}
	return 4 * max(seqs, 1)
}
