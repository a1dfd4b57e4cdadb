package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/engine/gguf"
	"shoal/placement"
	"shoal/shard"
	"shoal/transport"
)

func badRequest(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

func notFoundErr(format string, args ...any) error {
	return &coordinator.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf(format, args...)}
}

// LoadModel implements api.Backend: the file sits on req.Node (this agent
// when empty). That node profiles the GGUF, registers the model and hashes
// the file in the background; the leader plans it once the digest is in.
func (a *Agent) LoadModel(ctx context.Context, req api.LoadModelRequest) (*api.ModelInfo, error) {
	if req.Node != "" {
		n, err := a.resolveNode(ctx, req.Node)
		if err != nil {
			return nil, err
		}
		if n.ID != a.id {
			if n.Status != coordinator.StatusAlive {
				return nil, &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("node %s is %s", n.Name, n.Status)}
			}
			req.Node = ""
			var out api.ModelInfo
			if err := transport.Call(ctx, a.ep, n.RPCAddr, transport.KindRPC, "Models.Load", req, &out); err != nil {
				return nil, err
			}
			return &out, nil
		}
	}
	m, err := a.registerModel(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	info := a.modelInfo(nil, m)
	return &info, nil
}

// registerModel registers the file req.Path of this node; pin, when set,
// is the exact set of nodes the model's plan may use.
func (a *Agent) registerModel(ctx context.Context, req api.LoadModelRequest, pin []string) (*coordinator.Model, error) {
	path := req.Path
	if !filepath.IsAbs(path) {
		return nil, badRequest("model path %q is not absolute: give the full path on node %s", path, a.cfg.Name)
	}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFoundErr("file not found on node %s: %s", a.cfg.Name, path)
	}
	if err != nil {
		return nil, badRequest("%s on node %s: %v", path, a.cfg.Name, err)
	}
	if st.IsDir() {
		return nil, badRequest("%s on node %s is a directory, not a GGUF file", path, a.cfg.Name)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, badRequest("%s on node %s is not a GGUF model file: %v", path, a.cfg.Name, err)
	}
	prof, err := placement.ProfileFromGGUF(f)
	f.Close()
	if err != nil {
		return nil, badRequest("%s: %v", path, err)
	}
	name := req.Name
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(path), ".gguf")
	}
	if name == "" || strings.ContainsAny(name, "/ \t\n") {
		return nil, badRequest("model name %q: want a name without spaces or slashes (--name)", name)
	}
	cs, err := a.state(ctx)
	if err != nil {
		return nil, err
	}
	if old := cs.Models[name]; old != nil && (old.SourceNode != a.id || old.Source != path) {
		src := old.SourceNode
		if n := cs.Nodes[src]; n != nil {
			src = n.Name
		}
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("a model named %q is already loaded from %s on %s: unload it first or pick another --name", name, old.Source, src)}
	}
	m := coordinator.Model{
		Name: name, Source: path, Layers: prof.NLayer, Bytes: uint64(st.Size()), CreatedAt: time.Now().UTC(),
		SourceNode: a.id, Ctx: req.Ctx, Overhead: req.Overhead, Strategy: req.Strategy, Profile: &prof, Status: coordinator.ModelHashing,
		Pin: pin,
	}
	if sha, ok := a.files.lookupPath(path, st); ok {
		m.Digest, m.Status = sha, ""
	}
	if err := a.apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m}); err != nil {
		return nil, err
	}
	a.log.Info("model registered", zap.String("model", name), zap.String("path", path), zap.Int("layers", prof.NLayer),
		zap.String("weights", placement.GiB(prof.WeightBytes())), zap.Bool("hashed", m.Digest != ""))
	if m.Digest == "" {
		a.bg.Add(1)
		go a.hashModel(m, st)
	}
	return &m, nil
}

// hashModel computes the file's sha256, makes the file servable to peers
// and records the digest, which lets the leader plan the model.
func (a *Agent) hashModel(m coordinator.Model, st os.FileInfo) {
	defer a.bg.Done()
	t0 := time.Now()
	sha, err := shard.FileSHA256(m.Source)
	if err == nil {
		err = a.files.add(sha, m.Source, st)
	}
	if err != nil {
		m.Status, m.Reason = coordinator.ModelFailed, fmt.Sprintf("hashing %s on %s: %v", m.Source, a.cfg.Name, err)
		a.log.Warn("model file unreadable", zap.String("model", m.Name), zap.Error(err))
	} else {
		m.Digest, m.Status = sha, ""
		a.log.Info("model hashed", zap.String("model", m.Name), zap.String("sha256", sha), zap.Duration("took", time.Since(t0)))
	}
	for try := 0; try < 20; try++ {
		select {
		case <-a.done:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := a.apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m})
		cancel()
		if err == nil {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	a.log.Warn("could not record the model's digest", zap.String("model", m.Name))
}

// Models implements api.Backend.
func (a *Agent) Models(ctx context.Context) ([]api.ModelInfo, error) {
	st, err := a.state(ctx)
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
		out = append(out, a.modelInfo(st, st.Models[n]))
	}
	return out, nil
}

func (a *Agent) modelInfo(st *coordinator.State, m *coordinator.Model) api.ModelInfo {
	if st == nil {
		st = coordinator.NewState()
	}
	info := api.ModelInfo{
		Name: m.Name, Path: m.Source, SourceNode: m.SourceNode, SourceName: m.SourceNode, Digest: m.Digest,
		Bytes: m.Bytes, Layers: m.Layers, Ctx: m.Ctx, Status: m.Status, Reason: m.Reason,
	}
	if n := st.Nodes[m.SourceNode]; n != nil {
		info.SourceName = n.Name
	} else if m.SourceNode == a.id {
		info.SourceName = a.cfg.Name
	}
	if info.Status == coordinator.ModelHashing || info.Status == coordinator.ModelFailed || info.Status == coordinator.ModelUnservable {
		return info
	}
	p := st.Plans[m.Name]
	if p == nil || p.Placement == nil || len(p.Placement.Pools) == 0 {
		info.Status = "planning"
		return info
	}
	info.PlanVersion, info.PredictedMsPerToken = p.Version, p.PredictedMsPerToken
	var total, done uint64
	ready, failed := 0, 0
	for _, id := range p.Nodes() {
		si := api.ShardInfo{Node: id, NodeName: id, State: "pending"}
		if n := st.Nodes[id]; n != nil {
			si.NodeName = n.Name
		}
		for _, spec := range shard.SpecsFor(*p.Placement, id, m.Digest) {
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
			ready++
		case coordinator.ShardFailed:
			failed++
		}
		total += si.Bytes
		done += si.Done
		info.Shards = append(info.Shards, si)
	}
	if total > 0 {
		info.Progress = float64(done) / float64(total)
	}
	switch {
	case failed > 0:
		info.Status = "degraded"
		for _, s := range info.Shards {
			if s.State == coordinator.ShardFailed {
				info.Reason = fmt.Sprintf("shard on %s: %s", s.NodeName, s.Error)
				break
			}
		}
	case ready == len(info.Shards):
		info.Status, info.Progress = "ready", 1
	default:
		info.Status = "loading"
	}
	return info
}

// UnloadModel implements api.Backend.
func (a *Agent) UnloadModel(ctx context.Context, name string) error {
	err := a.apply(ctx, coordinator.ModelDeleteType, coordinator.ModelDeleteRequest{Name: name})
	if transport.StatusOf(err) == http.StatusNotFound {
		return notFoundErr("model %q is not loaded (see 'shoal model ls')", name)
	}
	return err
}

// Placement implements api.Backend.
func (a *Agent) Placement(ctx context.Context, name string) (*api.PlacementInfo, error) {
	st, err := a.state(ctx)
	if err != nil {
		return nil, err
	}
	m := st.Models[name]
	if m == nil {
		return nil, notFoundErr("model %q is not loaded (see 'shoal model ls')", name)
	}
	mi := a.modelInfo(st, m)
	out := &api.PlacementInfo{Model: name, Status: mi.Status, Reason: mi.Reason}
	p := st.Plans[name]
	if p == nil || p.Placement == nil {
		return out, nil
	}
	pp := p.Placement
	out.Version, out.Strategy, out.Context, out.Batch = p.Version, pp.Strategy, pp.Context, pp.Batch
	out.Cost, out.Explain, out.Moved, out.MovedBytes = pp.Cost, pp.Explain, p.Moved, p.MovedBytes
	mem := map[string]uint64{}
	var order []string
	for _, pool := range pp.Pools {
		for k, s := range pool.Stages {
			ps := api.PlacementStage{Pool: pool.Role, Index: k, Lo: s.Lo, Hi: s.Hi, Ms: s.Ms}
			for _, mb := range s.Members {
				name := mb.Node
				if n := st.Nodes[mb.Node]; n != nil {
					name = n.Name
				}
				ps.Members = append(ps.Members, api.PlacementMember{Member: mb, NodeName: name})
				if _, ok := mem[mb.Node]; !ok {
					order = append(order, mb.Node)
				}
				mem[mb.Node] += mb.MemBytes
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
	for _, k := range keys {
		if l := st.Links[k]; in[l.From] && in[l.To] {
			out.Links = append(out.Links, api.Link{From: nameOf(l.From), To: nameOf(l.To), Gbit: l.Gbit, LatencyMs: l.LatencyMs})
		}
	}
	for _, id := range order {
		nm := api.NodeMemory{Node: id, Name: id, MemBytes: mem[id]}
		if n := st.Nodes[id]; n != nil {
			nm.Name, nm.Status, nm.MemFree = n.Name, string(n.Status), n.Caps.MemFree
		}
		out.Nodes = append(out.Nodes, nm)
	}
	return out, nil
}

// registerModelRPC adds the peer methods of model loading and weights.
func (a *Agent) registerModelRPC() {
	a.rpc.Register("Models.Load", func(ctx context.Context, p transport.Peer, body json.RawMessage) (any, error) {
		var req api.LoadModelRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, badRequest("malformed load request")
		}
		req.Node = ""
		return a.LoadModel(ctx, req)
	})
	a.rpc.Register("Weights.Layout", a.serveLayout)
}
