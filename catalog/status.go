package catalog

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"shoal/api"
	"shoal/coordinator"
	"shoal/shard"
	"shoal/transport"
)

// Models lists the cluster's models with their shards.
func (c *Catalog) Models(ctx context.Context) ([]api.ModelInfo, error) {
	st, err := c.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(st.Models))
	for n := range st.Models {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]api.ModelInfo, 0, len(names))
	for _, n := range names {
		out = append(out, c.ModelInfo(st, st.Models[n]))
	}
	return out, nil
}

// ModelInfo is model m as the admin API shows it: its file's holders,
// and, once planned, its shards and its status computed from them
// (coordinator.ModelStatus). st may be nil (a model just registered).
func (c *Catalog) ModelInfo(st *coordinator.State, m *coordinator.Model) api.ModelInfo {
	if st == nil {
		st = coordinator.NewState()
	}
	info := api.ModelInfo{
		Name: m.Name, Path: m.Source, SourceNode: m.SourceNode, SourceName: m.SourceNode, Digest: m.Digest,
		Bytes: m.Bytes, Layers: m.Layers, Ctx: m.Ctx, MaxSeqs: m.MaxSeqs, Queue: m.Queue, Status: m.Status, Reason: m.Reason,
		CreatedAt: m.CreatedAt,
	}
	if n := st.Nodes[m.SourceNode]; n != nil {
		info.SourceName = n.Name
	} else if m.SourceNode == c.id {
		info.SourceName = c.name
	}
	info.Replicas = m.WantReplicas()
	info.Holders, info.Copies = fileHolders(st, m, info.SourceName)
	info.Draft = draftInfo(st, m)
	if info.Status == coordinator.ModelHashing || info.Status == coordinator.ModelFailed || info.Status == coordinator.ModelUnservable {
		return info
	}
	p := st.Plans[m.Name]
	if p == nil || len(p.Pools) == 0 {
		info.Status = coordinator.ModelPlanning
		return info
	}
	info.PlanVersion, info.PredictedMsPerToken = p.Version, p.Cost.MsPerToken
	if p.Fallback != nil {
		info.Fallback = p.Fallback.Msg
	}
	var total, done uint64
	var tally coordinator.ShardTally
	for _, id := range p.Nodes() {
		si := api.ShardInfo{Node: id, NodeName: id, State: "pending"}
		if n := st.Nodes[id]; n != nil {
			si.NodeName = n.Name
		}
		for _, pool := range p.Pools {
			for _, stg := range pool.Stages {
				for _, mb := range stg.Members {
					if mb.Node == id {
						if p.Disaggregated() {
							si.Pool = pool.Role
						}
						si.GPULayers += mb.GPULayers
					}
				}
			}
		}
		for _, spec := range shard.SpecsFor(*p, id, m.Digest) {
			if si.Hi == 0 {
				si.Lo = spec.Lo
			}
			si.Hi = max(si.Hi, spec.Hi)
		}
		if r := st.Shards[coordinator.ShardKey(id, m.Name)]; r != nil && r.PlanVersion == p.Version {
			si.State, si.Bytes, si.Done, si.Error = r.State, r.Bytes, r.Done, r.Error
			si.Source, si.Fetched, si.Refetched = r.Source, r.Fetched, r.Refetched
			if n := st.Nodes[r.Source]; n != nil {
				si.Source = n.Name
			}
		}
		if n := st.Nodes[id]; n != nil && n.Status != coordinator.StatusAlive && si.State != "pending" {
			si.State, si.Error = coordinator.ShardFailed, "node is "+string(n.Status)
		}
		if si.Bytes > 0 {
			si.Progress = float64(si.Done) / float64(si.Bytes)
		}
		switch si.State {
		case coordinator.ShardReady:
			tally.Ready++
		case coordinator.ShardVerifying:
			tally.Verifying++
		case coordinator.ShardFailed:
			tally.Failed++
		}
		total += si.Bytes
		done += si.Done
		info.Shards = append(info.Shards, si)
	}
	if total > 0 {
		info.Progress = float64(done) / float64(total)
	}
	tally.Shards = len(info.Shards)
	info.Status = coordinator.ModelStatus(m, tally)
	switch info.Status {
	case coordinator.ModelDegraded:
		for _, s := range info.Shards {
			if s.State == coordinator.ShardFailed {
				info.Reason = fmt.Sprintf("shard on %s: %s", s.NodeName, s.Error)
				break
			}
		}
	case coordinator.ModelVerifying:
		info.Reason = fmt.Sprintf("every node holds its ranges; %s reads the file back from them to check its sha256 against the hub's", info.SourceName)
	case coordinator.ModelReady:
		info.Progress = 1
	}
	if info.Status != coordinator.ModelReady && info.Status != coordinator.ModelVerifying && info.Copies == 0 {
		// Without a live node with the file, the shards come only from
		// the ranges the live nodes' shards hold.
		if lo, hi, ok := coordinator.LayersHeldByNone(st, m); ok {
			info.Status = coordinator.ModelDegraded
			info.Reason = fmt.Sprintf("no live node has the model file (%s) and layers [%d,%d) are in no live node's shard: bring %s back, or load the model again from a node with the file",
				holdersSummary(info.Holders), lo, hi, info.SourceName)
		}
	}
	return info
}

// fileHolders lists the nodes with m's whole file, the source first, and
// counts those alive with the file ready.
func fileHolders(st *coordinator.State, m *coordinator.Model, sourceName string) ([]api.FileHolder, int) {
	status := func(id string) string {
		if n := st.Nodes[id]; n != nil {
			return string(n.Status)
		}
		return "unknown"
	}
	src := api.FileHolder{Node: m.SourceNode, NodeName: sourceName, NodeStatus: status(m.SourceNode), Source: true, State: coordinator.HolderReady}
	if m.Hub != nil { // the hub has the file; the source node verified it
		src.NodeName, src.NodeStatus = "hub "+strings.TrimPrefix(m.Source, "hub:")+" (verified by "+sourceName+")", string(coordinator.StatusAlive)
	}
	switch m.Status {
	case coordinator.ModelHashing:
		src.State = coordinator.ModelHashing
	case coordinator.ModelFailed:
		src.State, src.Error = coordinator.HolderFailed, m.Reason
	}
	out := []api.FileHolder{src}
	ids := make([]string, 0, len(m.Holders))
	for id := range m.Holders {
		ids = append(ids, id)
	}
	name := func(id string) string {
		if n := st.Nodes[id]; n != nil {
			return n.Name
		}
		return id
	}
	sort.Slice(ids, func(i, j int) bool {
		return name(ids[i]) < name(ids[j]) || name(ids[i]) == name(ids[j]) && ids[i] < ids[j]
	})
	for _, id := range ids {
		h := m.Holders[id]
		out = append(out, api.FileHolder{Node: id, NodeName: name(id), NodeStatus: status(id), State: h.State, Error: h.Error})
	}
	copies := 0
	for _, h := range out {
		if h.State == coordinator.HolderReady && h.NodeStatus == string(coordinator.StatusAlive) {
			copies++
		}
	}
	return out, copies
}

// holdersSummary says where the file is, for a reason: "source a is
// failed; b (copy) is failed".
func holdersSummary(hs []api.FileHolder) string {
	var parts []string
	for _, h := range hs {
		switch {
		case h.Source:
			parts = append(parts, fmt.Sprintf("source %s is %s", h.NodeName, h.NodeStatus))
		case h.State == coordinator.HolderReady:
			parts = append(parts, fmt.Sprintf("the copy on %s is %s", h.NodeName, h.NodeStatus))
		}
	}
	if len(parts) == 1 {
		parts = append(parts, "no copy")
	}
	return strings.Join(parts, "; ")
}

// UnloadModel removes a model, its plan and its shards.
func (c *Catalog) UnloadModel(ctx context.Context, name string) error {
	err := c.cluster.Apply(ctx, coordinator.ModelDeleteType, coordinator.ModelDeleteRequest{Name: name})
	if transport.StatusOf(err) == http.StatusNotFound {
		return notFoundErr("model %q is not loaded (see 'shoal model ls')", name)
	}
	if err == nil {
		c.stopHubCheck(name) // it checks nothing any more
	}
	return err
}

// draftInfo describes m's draft model and its shard on the node that
// drives m's plan.
func draftInfo(st *coordinator.State, m *coordinator.Model) *api.DraftInfo {
	d := m.Draft
	if d == nil {
		return nil
	}
	out := &api.DraftInfo{Path: d.Source, Digest: d.Digest, Bytes: d.Bytes, Layers: d.Layers, Max: d.Max}
	if out.Max == 0 {
		out.Max = coordinator.DefaultDraftMax
	}
	p := st.Plans[m.Name]
	if p == nil || len(p.Pools) == 0 || len(p.Pools[0].Stages) == 0 || len(p.Pools[0].Stages[0].Members) == 0 {
		return out
	}
	id := p.Pools[0].Stages[0].Members[0].Node
	out.NodeName, out.State = id, "pending"
	if n := st.Nodes[id]; n != nil {
		out.NodeName = n.Name
	}
	if sh := st.Shards[coordinator.ShardKey(id, coordinator.DraftShardModel(m.Name))]; sh != nil {
		out.State, out.Error = sh.State, sh.Error
	}
	return out
}
