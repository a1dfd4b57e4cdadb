package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"shoal/api"
	"shoal/coordinator"
	"shoal/hub"
	"shoal/placement"
	"shoal/shard"
)

// Loading a model by hub reference (api.LoadModelRequest.Hub): no node
// downloads the whole file, and the hub serves each byte about once. The
// agent that loads it resolves the reference (one GGUF file, its size and
// LFS sha256) and reads the GGUF header with Range requests: the profile
// the planner needs and the tensor table. It records the model with the
// LFS sha256 as its Digest and an unverified manifest (the table, no
// sums; Model.Unverified), so the model is planned at once. Each planned
// node reads its shards' ranges from the hub (hubFetcher, HTTP Range
// requests, preferring nodes that already hold a range) and holds them
// without running them. Once every node holds its ranges, the loading
// agent reads the file back from them in order over the cluster's links
// (checkHubFile), checks its sha256 against the hub's and records the
// full manifest (the sha256 of every unit); each node then assembles its
// shards again from its own copy, every unit checked, and only then runs
// them. When the bytes read back do not match, the loading agent reads
// the whole file from the hub once more to tell a node's bad copy (which
// the unit checks then mend from the hub) from a hub file that does not
// match its sha256 (the model fails and its plan is released).

// hubError maps a hub failure to an API error. The hub and its token are
// the agent's (HF_ENDPOINT, HF_TOKEN of the agent process), not those of
// the shell that asked: a hub the agent cannot reach, or a token it lacks,
// is said so, with the hub it asked.
func (c *Catalog) hubError(client *hub.Client, ref string, err error) error {
	env := fmt.Sprintf("agent %s asked the hub at %s: HF_ENDPOINT and HF_TOKEN come from the agent process's own environment, not the shell that runs shoal model load; set them where the agent runs and restart it", c.name, client.BaseURL())
	switch {
	case errors.Is(err, hub.ErrNotFound):
		return notFoundErr("%v (%s)", err, env)
	case errors.Is(err, hub.ErrGated):
		return &coordinator.Error{Code: http.StatusForbidden, Msg: fmt.Sprintf("%v (%s)", err, env)}
	}
	return &coordinator.Error{Code: http.StatusBadGateway, Msg: fmt.Sprintf("hub reference %s: %v (%s)", ref, err, env)}
}

// registerHubModel registers the hub file req.Hub names, read in place:
// it resolves the reference, reads the GGUF header, registers the model
// with an unverified manifest (it is planned and fetched at once) and
// checks the file in the background (checkHubFile).
func (c *Catalog) registerHubModel(ctx context.Context, req api.LoadModelRequest) (*coordinator.Model, error) {
	if req.Path != "" {
		return nil, badRequest("give a path or a hub reference, not both")
	}
	if req.Ctx < 0 || req.MaxSeqs < 0 || req.Queue < 0 || req.Replicas < 0 {
		return nil, badRequest("ctx %d, max-seqs %d, queue %d, replicas %d: want positive numbers (or 0 for the defaults)", req.Ctx, req.MaxSeqs, req.Queue, req.Replicas)
	}
	if req.Draft != "" || req.DraftMax != 0 {
		return nil, badRequest("a draft model is not read from the hub: download the model and its draft to a node and load them with --draft")
	}
	if req.Lookup < 0 || req.Lookup > coordinator.MaxLookup {
		return nil, badRequest("lookup %d: draft 0 (off) to %d tokens a step", req.Lookup, coordinator.MaxLookup)
	}
	if req.Replicas > 1 {
		return nil, badRequest("--replicas %d: a model read from the hub has no whole copies on the nodes (each reads its own ranges); pull it (shoal pull) and load the file to keep copies", req.Replicas)
	}
	if c.hub == nil {
		return nil, badRequest("this agent cannot reach a hub")
	}
	client := c.hub()
	if _, err := hub.ParseRef(req.Hub); err != nil {
		return nil, badRequest("%v", err)
	}
	ref, fi, err := client.Resolve(ctx, req.Hub, req.Revision)
	if err != nil {
		var ce *coordinator.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		if errors.Is(err, hub.ErrNotFound) || errors.Is(err, hub.ErrGated) {
			return nil, c.hubError(client, req.Hub, err)
		}
		if strings.Contains(err.Error(), "split model") || strings.Contains(err.Error(), "ambiguous") || strings.Contains(err.Error(), "several") {
			return nil, badRequest("%v", err)
		}
		return nil, c.hubError(client, req.Hub, err)
	}
	hf := &coordinator.HubFile{Endpoint: client.Endpoint, Repo: ref.Repo, Revision: req.Revision, File: fi.Path, SHA256: fi.SHA256, Size: fi.Size}
	where := fmt.Sprintf("%s/%s", ref.Repo, fi.Path)

	hc := *client
	hc.UserAgent += " header" // its bytes are told apart from the shards'
	prefix, gf, err := readHeader(ctx, &rangeReader{ctx: ctx, c: &hc, repo: ref.Repo, rev: req.Revision, file: fi.Path, size: fi.Size}, fi.Size)
	if err != nil {
		var ce *coordinator.Error
		if errors.As(err, &ce) || errors.Is(err, hub.ErrNotFound) || errors.Is(err, hub.ErrGated) {
			return nil, c.hubError(client, req.Hub, err)
		}
		return nil, badRequest("%s is not a GGUF model file shoal can read: %v", where, err)
	}
	prof, err := placement.ProfileFromGGUF(gf)
	if err != nil {
		return nil, badRequest("%s: %v", where, err)
	}
	if err := checkKVType(req.KVType, prof.HeadDim); err != nil {
		return nil, badRequest("%s: %v", where, err)
	}
	table, err := shard.TableOf(gf)
	if err != nil {
		return nil, badRequest("%s: %v", where, err)
	}
	table.FileSize = fi.Size

	name := req.Name
	if name == "" {
		name = strings.TrimSuffix(strings.TrimSuffix(path.Base(fi.Path), ".gguf"), ".GGUF")
	}
	if err := coordinator.CheckModelName(name); err != nil {
		return nil, badRequest("%v: give the model a name with --name", err)
	}
	cs, err := c.cluster.State(ctx)
	if err != nil {
		return nil, err
	}
	var pin []string
	if len(req.Nodes) > 0 {
		if pin, err = nodeIDs(cs, req.Nodes); err != nil {
			return nil, err
		}
	}
	if old := cs.Models[name]; old != nil && (old.SourceNode != c.id || old.Hub == nil || *old.Hub != *hf) {
		return nil, &coordinator.Error{Code: http.StatusConflict, Msg: fmt.Sprintf("a model named %q is already loaded from %s: unload it first or pick another --name", name, old.Source)}
	}
	m := coordinator.Model{
		Name: name, Source: HubOrigin(hf), Layers: prof.NLayer, Bytes: uint64(fi.Size), CreatedAt: time.Now().UTC(),
		SourceNode: c.id, Replicas: 1, Ctx: req.Ctx, MaxSeqs: req.MaxSeqs, Queue: req.Queue, Lookup: req.Lookup, PlanPrompt: req.PlanPrompt, PlanGen: req.PlanGen, Overhead: req.Overhead, Strategy: req.Strategy,
		Disagg: req.Disagg, DisaggFailure: req.DisaggFailure, Wire: req.Wire, KVType: req.KVType, Profile: &prof, Pin: pin, Hub: hf, Digest: fi.SHA256,
	}
	verified := false
	if raw, ok := c.checkedManifest(ctx, cs, fi.SHA256); ok {
		m.Manifest, verified = shard.ManifestID(raw), true
	}
	var pending []byte
	if !verified {
		if pending, err = shard.UnverifiedManifest(fi.SHA256, table, 0); err != nil {
			return nil, err
		}
		if ss := c.shardStore(); ss != nil {
			ss.KeepManifest(fi.SHA256, pending) // the nodes fetch it from here
		}
		m.Manifest, m.Unverified = shard.ManifestID(pending), true
	}
	var check *hubCheck
	if !verified {
		if check = c.claimHubCheck(m.Name, m.Manifest); check == nil {
			if old := cs.Models[name]; old != nil && old.Manifest == m.Manifest {
				return old, nil // loaded already, being checked: the same load again
			}
			// The check running here is of a model unloaded since (by
			// another agent, or before its check saw the unload): it
			// checks nothing any more, and this load's check replaces it.
			check = c.takeOverHubCheck(m.Name, m.Manifest)
		}
	}
	if err := c.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: m}); err != nil {
		if check != nil {
			c.releaseHubCheck(m.Name, check)
		}
		return nil, err
	}
	c.log.Info("model registered from the hub", zap.String("model", name), zap.String("hub", m.Source), zap.Int64("bytes", fi.Size),
		zap.String("lfs_sha256", fi.SHA256), zap.Int("layers", prof.NLayer), zap.Int("header_bytes", len(prefix)), zap.Bool("verified", verified))
	if !verified {
		c.bg.Add(1)
		go c.checkHubFile(check, m, pending, prefix)
	}
	return &m, nil
}

// checkedManifest returns a checked manifest of the file with sha256 sha,
// the hub's LFS sha256 of a file being loaded, that this agent can serve
// to the nodes: one it keeps (the file was checked here, or this agent has
// the same bytes as a file it hashed), else one a node with a model of
// the same sha256 serves (kept here then). The file is then not checked
// again, and the nodes can read its ranges from those of that model.
// Without it the new model's nodes asked this agent for a manifest it did
// not keep, or got the file's where they wanted the unverified one.
func (c *Catalog) checkedManifest(ctx context.Context, cs *coordinator.State, sha string) ([]byte, bool) {
	checked := func(raw []byte, id string) bool {
		if id == "" {
			id = shard.ManifestID(raw)
		}
		man, err := shard.ParseManifest(raw, id, sha)
		return err == nil && !man.Unverified
	}
	if raw, ok := c.files.manifest(sha); ok && checked(raw, "") {
		return raw, true
	}
	ss := c.shardStore()
	if ss == nil {
		return nil, false
	}
	if raw, ok := ss.Manifest(sha); ok && checked(raw, "") {
		return raw, true
	}
	for _, name := range slices.Sorted(maps.Keys(cs.Models)) {
		o := cs.Models[name]
		if o.Digest != sha || o.Unverified || o.Manifest == "" || o.Status == coordinator.ModelFailed {
			continue
		}
		for _, id := range fileHolderIDs(cs, o) {
			n := cs.Nodes[id]
			if n == nil || n.Status != coordinator.StatusAlive || n.RPCAddr == "" || id == c.id {
				continue
			}
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			raw, _, err := c.peers.Holdings(hctx, n.RPCAddr, sha)
			cancel()
			if err == nil && raw != nil && checked(raw, o.Manifest) {
				ss.KeepManifest(sha, raw)
				return raw, true
			}
		}
	}
	return nil, false
}

// fileHolderIDs lists the nodes that may hold m's file or ranges of it:
// its source, its copies' nodes, then the nodes of its shards.
func fileHolderIDs(st *coordinator.State, m *coordinator.Model) []string {
	out := []string{m.SourceNode}
	for _, id := range slices.Sorted(maps.Keys(m.Holders)) {
		out = append(out, id)
	}
	for _, k := range slices.Sorted(maps.Keys(st.Shards)) {
		if s := st.Shards[k]; s.Model == m.Name && !slices.Contains(out, s.Node) {
			out = append(out, s.Node)
		}
	}
	return out
}
