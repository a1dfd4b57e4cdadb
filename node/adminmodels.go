package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/internal/nodeaddr"
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

// LoadModel registers a model file: the file sits on req.Node (this agent
// when empty). That node profiles the GGUF, registers the model and hashes
// the file in the background; the leader plans it once the digest is in.
func (b *admin) LoadModel(ctx context.Context, req api.LoadModelRequest) (*api.ModelInfo, error) {
	if req.Node != "" {
		n, err := b.resolveNode(ctx, req.Node)
		if err != nil {
			return nil, err
		}
		if n.ID != b.id {
			if n.Status != api.StatusAlive {
				return nil, &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("node %s is %s", n.Name, n.Status)}
			}
			// Only servers ask other nodes to load files: a client agent
			// passes the request and the operator's key to a server.
			addr, fwd := nodeaddr.Tag(n.ID, n.RPCAddr), loadModelRequest{LoadModelRequest: req}
			fwd.Node = ""
			call := b.callNode
			if b.srv == nil {
				if addr, err = b.cluster.ServerAddr(); err != nil {
					return nil, err
				}
				fwd.Node, fwd.Key = n.ID, api.KeyFrom(ctx)
				call = b.call
			}
			var out api.ModelInfo
			if err := call.Call(ctx, addr, methodLoadModel, fwd, &out); err != nil {
				return nil, err
			}
			return &out, nil
		}
	}
	register := func() (*coordinator.Model, error) { return b.registerModel(ctx, req, nil) }
	if req.Hub != "" {
		register = func() (*coordinator.Model, error) { return b.registerHubModel(ctx, req) }
	}
	m, err := register()
	if err != nil {
		return nil, err
	}
	info := b.modelInfo(nil, m)
	return &info, nil
}

// nodeIDs resolves node names or IDs to IDs, each once.
func nodeIDs(cs *coordinator.State, names []string) ([]string, error) {
	var ids []string
	for _, want := range names {
		id := ""
		for _, n := range cs.SortedNodes() {
			if n.ID == want || n.Name == want {
				id = n.ID
				break
			}
		}
		if id == "" {
			return nil, badRequest("node %q is not in the cluster (shoal node ls lists them)", want)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// registerModel registers the file req.Path of this node; pin, when set,
// is the exact set of nodes the model's plan may use.
func (b *admin) registerModel(ctx context.Context, req api.LoadModelRequest, pin []string) (*coordinator.Model, error) {
	path := req.Path
	if req.Ctx < 0 || req.MaxSeqs < 0 || req.Queue < 0 || req.Replicas < 0 {
		return nil, badRequest("ctx %d, max-seqs %d, queue %d, replicas %d: want positive numbers (or 0 for the defaults)", req.Ctx, req.MaxSeqs, req.Queue, req.Replicas)
	}
	if !filepath.IsAbs(path) {
		return nil, badRequest("model path %q is not absolute: give the full path on node %s", path, b.name)
	}
	fh, st, err := openModelFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFoundErr("file not found on node %s: %s", b.name, path)
	}
	var nr *notRegularError
	if errors.As(err, &nr) {
		return nil, badRequest("%s on node %s is %s, not a GGUF file: give the path of a model file", path, b.name, nr.what)
	}
	if err != nil {
		return nil, badRequest("%s on node %s: %v", path, b.name, err)
	}
	// The header is read from the file just checked, not from the path
	// again (which might name something else by now).
	_, f, err := readHeader(ctx, io.NewSectionReader(fh, 0, st.Size()), st.Size())
	fh.Close()
	if err != nil {
		return nil, badRequest("%s on node %s is not a GGUF model file: %v", path, b.name, err)
	}
	prof, err := placement.ProfileFromGGUF(f)
	if err != nil {
		return nil, badRequest("%s: %v", path, err)
	}
	name := req.Name
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(path), ".gguf")
	}
	if err := coordinator.CheckModelName(name); err != nil {
		return nil, badRequest("%v: give the model a name with --name", err)
	}
	cs, err := b.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	if pin == nil && len(req.Nodes) > 0 {
		if pin, err = nodeIDs(cs, req.Nodes); err != nil {
			return nil, err
		}
	}
	if old := cs.Models[name]; old != nil && (old.SourceNode != b.id || old.Source != path) {
		src := old.SourceNode
		if n := cs.Nodes[src]; n != nil {
			src = n.Name
		}
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("a model named %q is already loaded from %s on %s: unload it first or pick another --name", name, old.Source, src)}
	}
	m := coordinator.Model{
		Name: name, Source: path, Layers: prof.NLayer, Bytes: uint64(st.Size()), CreatedAt: time.Now().UTC(),
		SourceNode: b.id, Replicas: req.Replicas, Ctx: req.Ctx, MaxSeqs: req.MaxSeqs, Queue: req.Queue, Overhead: req.Overhead, Strategy: req.Strategy, Disagg: req.Disagg, DisaggFailure: req.DisaggFailure, Wire: req.Wire, Profile: &prof, Status: coordinator.ModelHashing,
		Pin: pin,
	}
	if sha, ok := b.files.lookupPath(path, st); ok {
		if raw, ok := b.files.manifest(sha); ok { // else hashed again, for the manifest
			m.Digest, m.Manifest, m.Status = sha, shard.ManifestID(raw), ""
		}
	}
	if err := b.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m}); err != nil {
		return nil, err
	}
	b.log.Info("model registered", zap.String("model", name), zap.String("path", path), zap.Int("layers", prof.NLayer),
		zap.String("weights", placement.GiB(prof.WeightBytes())), zap.Bool("hashed", m.Digest != ""))
	if m.Digest == "" {
		b.bg.Add(1)
		go b.hashModel(m, st)
	}
	return &m, nil
}

// notRegularError is the error of a model path that names something
// other than a regular file.
type notRegularError struct{ what string }

func (e *notRegularError) Error() string { return "it is " + e.what + ", not a regular file" }

// kindOf names a file mode that is not a regular file's.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// openModelFile opens the model file at path for reading, refusing
// anything but a regular file: opening a FIFO for reading waits for a
// writer, and a device or socket never ends. It stats the path first, then
// opens it without blocking and checks what it opened, so a path swapped
// for a FIFO in between cannot hang the caller either.
func openModelFile(path string) (*os.File, os.FileInfo, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, nil, &notRegularError{kindOf(st.Mode())}
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	if st, err = f.Stat(); err == nil && !st.Mode().IsRegular() {
		err = &notRegularError{kindOf(st.Mode())}
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// checkModelFile is openModelFile for code that opens path itself.
func checkModelFile(path string) error {
	f, _, err := openModelFile(path)
	if err == nil {
		f.Close()
	}
	return err
}

// hashModel computes the file's sha256, makes the file servable to peers
// and records the digest, which lets the leader plan the model.
func (b *admin) hashModel(m coordinator.Model, st os.FileInfo) {
	defer b.bg.Done()
	t0 := time.Now()
	var sha string
	var raw []byte
	err := checkModelFile(m.Source) // it may have changed since it was registered
	if err == nil {
		sha, raw, err = shard.BuildManifest(m.Source, 0)
	}
	if err == nil {
		err = b.files.saveManifest(sha, raw)
	}
	if err == nil {
		err = b.files.add(sha, m.Source, st)
	}
	if err != nil {
		m.Status, m.Reason = coordinator.ModelFailed, fmt.Sprintf("hashing %s on %s: %v", m.Source, b.name, err)
		b.log.Warn("model file unreadable", zap.String("model", m.Name), zap.Error(err))
	} else {
		m.Digest, m.Manifest, m.Status = sha, shard.ManifestID(raw), ""
		b.log.Info("model hashed", zap.String("model", m.Name), zap.String("sha256", sha), zap.Duration("took", time.Since(t0)))
	}
	b.recordModel(m)
}

// recordModel writes m to the state, retrying for a while.
func (b *admin) recordModel(m coordinator.Model) {
	if !b.retryWrite(func(ctx context.Context) error {
		return b.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m})
	}) {
		b.log.Warn("could not record the model's digest", zap.String("model", m.Name))
	}
}

// retryWrite runs write (a state change) until it succeeds, 20 tries
// 250 ms apart, each bounded by 5 s; false when it never did or the agent
// stops.
func (b *admin) retryWrite(write func(ctx context.Context) error) bool {
	for try := 0; try < 20; try++ {
		select {
		case <-b.done:
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := write(ctx)
		cancel()
		if err == nil {
			return true
		}
		time.Sleep(250 * time.Millisecond)
	}
	return false
}

// Models lists the cluster's models with their shards.
func (b *admin) Models(ctx context.Context) ([]api.ModelInfo, error) {
	st, err := b.cluster.State(ctx)
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
		out = append(out, b.modelInfo(st, st.Models[n]))
	}
	return out, nil
}

func (b *admin) modelInfo(st *coordinator.State, m *coordinator.Model) api.ModelInfo {
	if st == nil {
		st = coordinator.NewState()
	}
	info := api.ModelInfo{
		Name: m.Name, Path: m.Source, SourceNode: m.SourceNode, SourceName: m.SourceNode, Digest: m.Digest,
		Bytes: m.Bytes, Layers: m.Layers, Ctx: m.Ctx, MaxSeqs: m.MaxSeqs, Queue: m.Queue, Status: m.Status, Reason: m.Reason,
	}
	if n := st.Nodes[m.SourceNode]; n != nil {
		info.SourceName = n.Name
	} else if m.SourceNode == b.id {
		info.SourceName = b.name
	}
	info.Replicas = m.WantReplicas()
	info.Holders, info.Copies = fileHolders(st, m, info.SourceName)
	if info.Status == coordinator.ModelHashing || info.Status == coordinator.ModelFailed || info.Status == coordinator.ModelUnservable {
		return info
	}
	p := st.Plans[m.Name]
	if p == nil || len(p.Pools) == 0 {
		info.Status = coordinator.ModelPlanning
		return info
	}
	info.PlanVersion, info.PredictedMsPerToken = p.Version, p.Cost.MsPerToken
	var total, done uint64
	var tally coordinator.ShardTally
	for _, id := range p.Nodes() {
		si := api.ShardInfo{Node: id, NodeName: id, State: "pending"}
		if n := st.Nodes[id]; n != nil {
			si.NodeName = n.Name
		}
		if p.Disaggregated() {
			for _, pool := range p.Pools {
				for _, stg := range pool.Stages {
					for _, mb := range stg.Members {
						if mb.Node == id {
							si.Pool = pool.Role
						}
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
func (b *admin) UnloadModel(ctx context.Context, name string) error {
	err := b.cluster.Apply(ctx, coordinator.ModelDeleteType, coordinator.ModelDeleteRequest{Name: name})
	if transport.StatusOf(err) == http.StatusNotFound {
		return notFoundErr("model %q is not loaded (see 'shoal model ls')", name)
	}
	return err
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
	mi := b.modelInfo(st, m)
	out := &api.PlacementInfo{Model: name, Status: mi.Status, Reason: mi.Reason, Replicas: mi.Replicas, Holders: mi.Holders}
	pp := st.Plans[name]
	if pp == nil {
		return out, nil
	}
	out.Version, out.Strategy, out.Context, out.Batch = pp.Version, pp.Strategy, pp.Context, pp.Batch
	out.Queue = queueBound(m.Queue, pp.Batch)
	out.Cost, out.Explain, out.Moved, out.MovedBytes = apiCost(pp.Cost), pp.Explain, pp.Moved, pp.MovedBytes
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
				ProbeGbit: l.ProbeGbit, LiveGbit: l.LiveGbit, RTTMs: l.RTTMs, Source: l.Source, Iface: l.Iface, Telemetry: l.Telemetry,
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
