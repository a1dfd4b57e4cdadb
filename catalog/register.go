package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/engine/gguf"
	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/internal/nodeaddr"
	"shoal/internal/version"
	"shoal/placement"
	"shoal/shard"
)

// LoadModel registers a model file: the file sits on req.Node (this agent
// when empty). That node profiles the GGUF, registers the model and hashes
// the file in the background; the leader plans it once the digest is in.
func (c *Catalog) LoadModel(ctx context.Context, req api.LoadModelRequest) (*api.ModelInfo, error) {
	if req.Node != "" {
		n, err := c.resolve(ctx, req.Node)
		if err != nil {
			return nil, err
		}
		if n.ID != c.id {
			if n.Status != api.StatusAlive {
				return nil, &coordinator.Error{Code: http.StatusServiceUnavailable, Msg: fmt.Sprintf("node %s is %s", n.Name, n.Status)}
			}
			// Only servers ask other nodes to load files: a client agent
			// passes the request and the operator's key to a server.
			addr, fwd := nodeaddr.Tag(n.ID, n.RPCAddr), LoadRequest{LoadModelRequest: req}
			fwd.Node = ""
			call := c.callNode
			if !c.server {
				if addr, err = c.cluster.ServerAddr(); err != nil {
					return nil, err
				}
				fwd.Node, fwd.Key = n.ID, api.KeyFrom(ctx)
				call = c.call
			}
			var out api.ModelInfo
			if err := call.Call(ctx, addr, MethodLoadModel, fwd, &out); err != nil {
				return nil, err
			}
			return &out, nil
		}
	}
	register := func() (*coordinator.Model, error) { return c.RegisterFile(ctx, req, nil) }
	if req.Hub != "" {
		register = func() (*coordinator.Model, error) { return c.registerHubModel(ctx, req) }
	}
	m, err := register()
	if err != nil {
		return nil, err
	}
	info := c.ModelInfo(nil, m)
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

// RegisterFile registers the file req.Path of this node; pin, when set,
// is the exact set of nodes the model's plan may use.
func (c *Catalog) RegisterFile(ctx context.Context, req api.LoadModelRequest, pin []string) (*coordinator.Model, error) {
	path := req.Path
	if req.Ctx < 0 || req.MaxSeqs < 0 || req.Queue < 0 || req.Replicas < 0 {
		return nil, badRequest("ctx %d, max-seqs %d, queue %d, replicas %d: want positive numbers (or 0 for the defaults)", req.Ctx, req.MaxSeqs, req.Queue, req.Replicas)
	}
	if req.Lookup < 0 || req.Lookup > coordinator.MaxLookup {
		return nil, badRequest("lookup %d: draft 0 (off) to %d tokens a step", req.Lookup, coordinator.MaxLookup)
	}
	if !filepath.IsAbs(path) {
		return nil, badRequest("model path %q is not absolute: give the full path on node %s", path, c.name)
	}
	fh, st, err := openModelFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFoundErr("file not found on node %s: %s", c.name, path)
	}
	var nr *notRegularError
	if errors.As(err, &nr) {
		return nil, badRequest("%s on node %s is %s, not a GGUF file: give the path of a model file", path, c.name, nr.what)
	}
	if err != nil {
		return nil, badRequest("%s on node %s: %v", path, c.name, err)
	}
	// The header is read from the file just checked, not from the path
	// again (which might name something else by now).
	_, f, err := readHeader(ctx, io.NewSectionReader(fh, 0, st.Size()), st.Size())
	fh.Close()
	if err != nil {
		return nil, badRequest("%s on node %s is not a GGUF model file: %v", path, c.name, err)
	}
	prof, err := placement.ProfileFromGGUF(f)
	if err != nil {
		return nil, badRequest("%s: %v", path, err)
	}
	if err := checkKVType(req.KVType, prof.HeadDim); err != nil {
		return nil, badRequest("%s: %v", path, err)
	}
	draft, dst, err := c.draftFile(ctx, req, f)
	if err != nil {
		return nil, err
	}
	name := req.Name
	if name == "" {
		name = strings.TrimSuffix(filepath.Base(path), ".gguf")
	}
	if err := coordinator.CheckModelName(name); err != nil {
		return nil, badRequest("%v: give the model a name with --name", err)
	}
	cs, err := c.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	if pin == nil && len(req.Nodes) > 0 {
		if pin, err = nodeIDs(cs, req.Nodes); err != nil {
			return nil, err
		}
	}
	if draft != nil && cs.Protocol < version.DraftProtocol {
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("the cluster speaks protocol %d and a draft model needs %d on every node: finish upgrading every node (shoal upgrade-check), or load without --draft", cs.Protocol, version.DraftProtocol)}
	}
	if old := cs.Models[name]; old != nil && (old.SourceNode != c.id || old.Source != path) {
		src := old.SourceNode
		if n := cs.Nodes[src]; n != nil {
			src = n.Name
		}
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("a model named %q is already loaded from %s on %s: unload it first or pick another --name", name, old.Source, src)}
	}
	m := coordinator.Model{
		Name: name, Source: path, Layers: prof.NLayer, Bytes: uint64(st.Size()), CreatedAt: time.Now().UTC(),
		SourceNode: c.id, Replicas: req.Replicas, Ctx: req.Ctx, MaxSeqs: req.MaxSeqs, Queue: req.Queue, Lookup: req.Lookup, PlanPrompt: req.PlanPrompt, PlanGen: req.PlanGen, Overhead: req.Overhead, Strategy: req.Strategy, Disagg: req.Disagg, DisaggFailure: req.DisaggFailure, Wire: req.Wire, KVType: req.KVType, Profile: &prof, Status: coordinator.ModelHashing,
		Pin: pin, Draft: draft,
	}
	if sha, ok := c.files.lookupPath(path, st); ok {
		if raw, ok := c.files.manifest(sha); ok { // else hashed again, for the manifest
			m.Digest, m.Manifest, m.Status = sha, shard.ManifestID(raw), ""
		}
	}
	var known [2]string // the model file's digest and manifest, when hashed before
	if draft != nil {
		if sha, ok := c.files.lookupPath(draft.Source, dst); ok {
			if raw, ok := c.files.manifest(sha); ok {
				draft.Digest, draft.Manifest = sha, shard.ManifestID(raw)
			}
		}
		if !draft.Hashed() { // the model waits for its draft's digest too
			known = [2]string{m.Digest, m.Manifest}
			m.Digest, m.Manifest, m.Status = "", "", coordinator.ModelHashing
		}
	}
	if err := c.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m}); err != nil {
		return nil, err
	}
	c.log.Info("model registered", zap.String("model", name), zap.String("path", path), zap.Int("layers", prof.NLayer),
		zap.String("weights", placement.GiB(prof.WeightBytes())), zap.Bool("hashed", m.Digest != ""))
	if m.Digest == "" {
		c.bg.Add(1)
		go c.hashModel(m, st, dst, known)
	}
	return &m, nil
}

// draftFile checks req's draft model (req.Draft, a file of this node) for
// the model whose header is f: a GGUF model of the same vocabulary. It
// returns nil when req has none, and the draft file's stat.
func (c *Catalog) draftFile(ctx context.Context, req api.LoadModelRequest, f *gguf.File) (*coordinator.DraftFile, os.FileInfo, error) {
	if req.Draft == "" {
		if req.DraftMax != 0 {
			return nil, nil, badRequest("draft-max %d without a draft model: give --draft FILE", req.DraftMax)
		}
		return nil, nil, nil
	}
	switch {
	case req.Lookup > 0:
		return nil, nil, badRequest("a draft model and lookup both draft: give --draft or --lookup, not both")
	case req.DraftMax < 0 || req.DraftMax > coordinator.MaxLookup:
		return nil, nil, badRequest("draft-max %d: draft 1 to %d tokens a step (0: %d)", req.DraftMax, coordinator.MaxLookup, coordinator.DefaultDraftMax)
	case !filepath.IsAbs(req.Draft):
		return nil, nil, badRequest("draft path %q is not absolute: give the full path on node %s", req.Draft, c.name)
	}
	fh, st, err := openModelFile(req.Draft)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, notFoundErr("draft file not found on node %s: %s (the draft must be on the node that has the model file)", c.name, req.Draft)
	}
	if err != nil {
		return nil, nil, badRequest("draft %s on node %s: %v", req.Draft, c.name, err)
	}
	_, df, err := readHeader(ctx, io.NewSectionReader(fh, 0, st.Size()), st.Size())
	fh.Close()
	if err != nil {
		return nil, nil, badRequest("draft %s on node %s is not a GGUF model file: %v", req.Draft, c.name, err)
	}
	prof, err := placement.ProfileFromGGUF(df)
	if err != nil {
		return nil, nil, badRequest("draft %s: %v", req.Draft, err)
	}
	if err := model.SameVocabulary(df, req.Draft, f, req.Path); err != nil {
		return nil, nil, badRequest("%v", err)
	}
	return &coordinator.DraftFile{Source: req.Draft, Bytes: uint64(st.Size()), Layers: prof.NLayer,
		KVBytesPerToken: uint64(prof.NLayer) * prof.KVBytesPerToken, Max: req.DraftMax}, st, nil
}

// hashModel computes the file's sha256 (unless known holds it), and its
// draft's, makes the files servable to peers and records the digests,
// which lets the leader plan the model.
func (c *Catalog) hashModel(m coordinator.Model, st, dst os.FileInfo, known [2]string) {
	defer c.bg.Done()
	t0 := time.Now()
	sha, id, err := known[0], known[1], error(nil)
	if sha == "" {
		sha, id, err = c.hashFile(m.Source, st)
	}
	if err == nil && m.Draft != nil && !m.Draft.Hashed() {
		d := *m.Draft
		if d.Digest, d.Manifest, err = c.hashFile(d.Source, dst); err != nil {
			err = fmt.Errorf("draft: %w", err)
		}
		m.Draft = &d
	}
	if err != nil {
		m.Status, m.Reason = coordinator.ModelFailed, fmt.Sprintf("hashing %s on %s: %v", m.Source, c.name, err)
		c.log.Warn("model file unreadable", zap.String("model", m.Name), zap.Error(err))
	} else {
		m.Digest, m.Manifest, m.Status = sha, id, ""
		c.log.Info("model hashed", zap.String("model", m.Name), zap.String("sha256", sha), zap.Bool("draft", m.Draft != nil), zap.Duration("took", time.Since(t0)))
	}
	c.recordModel(m)
}

// hashFile computes the sha256 and manifest of the model file at path
// (stat st when registered) and makes it servable to peers.
func (c *Catalog) hashFile(path string, st os.FileInfo) (sha, manifest string, err error) {
	var raw []byte
	err = CheckModelFile(path) // it may have changed since it was registered
	if err == nil {
		sha, raw, err = shard.BuildManifest(path, 0)
	}
	if err == nil {
		err = c.files.saveManifest(sha, raw)
	}
	if err == nil {
		err = c.files.add(sha, path, st)
	}
	if err != nil {
		return "", "", err
	}
	return sha, shard.ManifestID(raw), nil
}

// recordModel writes m to the state, retrying for a while.
func (c *Catalog) recordModel(m coordinator.Model) {
	if !c.retryWrite(func(ctx context.Context) error {
		return c.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m})
	}) {
		c.log.Warn("could not record the model's digest", zap.String("model", m.Name))
	}
}

// retryWrite runs write (a state change) until it succeeds, 20 tries
// 250 ms apart, each bounded by 5 s; false when it never did or the agent
// stops.
func (c *Catalog) retryWrite(write func(ctx context.Context) error) bool {
	for try := 0; try < 20; try++ {
		select {
		case <-c.done:
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

// checkKVType reports why a model with heads of headDim values cannot keep
// its KV cache as kvType ("" and "f16" always can).
func checkKVType(kvType string, headDim int) error {
	t, err := kv.ParseType(kvType)
	if err != nil {
		return err
	}
	if err := kv.CheckType(t, headDim); err != nil {
		return fmt.Errorf("%v: load it with --kv-type f16", err)
	}
	return nil
}
