package node

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"shoal/catalog"
	"shoal/coordinator"
	"shoal/disagg"
	"shoal/node/fingerprint"
	"shoal/parallel"
	"shoal/placement"
	"shoal/serve"
	"shoal/shard"
	"shoal/transport"
)

// ShardsDir is where assembled shard files live, below the data dir.
const ShardsDir = "shards"

// startServing makes the shard manager and the parallel reconciler and
// wires them: the manager reports shard status to the leader and drops a
// shard's member before unmapping it; the reconciler runs members on the
// manager's ready shards and publishes the models it drives.
func (a *Agent) startServing() {
	a.pub = &publisher{models: a.models, owner: a.cfg.Name, options: a.serveOptions, scheds: map[string]*serve.Scheduler{}}
	a.shards = shard.NewManager(shard.ManagerConfig{
		Dir: filepath.Join(a.cfg.DataDir, ShardsDir), Files: a.catalog.Files(), Peers: a.catalog.Peers(),
		Report: a.reportShards, Log: a.log,
		BeforeRelease: func(key string) { a.par.DropMember(key) },
		Origin:        a.catalog.HubRanges,
		Fetching:      a.modelFetching,
		DiskFree:      a.diskFree,
	})
	host := parallel.NewHost(a.ep, a.rpc, transport.NewMailbox(a.ep, transport.MailboxOptions{}))
	// Disaggregated plans stream prompts' KV caches between the pools'
	// members on the endpoint's kv streams.
	a.kvLink = disagg.NewLink(a.ep, disagg.LinkOptions{Logger: a.log.Named("kv")})
	host.SetKVLink(a.kvLink)
	a.par = parallel.NewReconciler(parallel.ReconcilerConfig{
		Host: host, Node: a.id, Shards: a.shards, Publisher: a.pub,
		Threads: a.cfg.Threads, StepTimeout: a.cfg.Tuning.DistStep.Or(parallel.DefaultStepTimeout), Log: a.log, Device: a.dev,
	})
	a.admin.runner = clusterRuns{par: a.par, driver: a.cfg.Name, pub: a.pub, plan: a.planPrediction, prefill: a.prefillPrediction}
}

// servingLoop reconciles the shards and the parallel runtime with the
// committed plans: on every state change (servers), when a driver failed,
// or every reconcile interval.
func (a *Agent) servingLoop() {
	defer a.bg.Done()
	interval := a.cfg.Tuning.ReconcileInterval.Or(2 * time.Second)
	for {
		var changed <-chan struct{}
		if a.srv != nil {
			changed = a.srv.FSM().Changed()
		}
		if st := a.servingState(); st != nil {
			if a.srv == nil {
				a.lastState.Store(st)
			}
			a.noteRevoked(st)
			a.noteState(st)
			// Plans just replaced run on while their successors load.
			old := a.lingers.Update(time.Now(), st.Plans, func(name string) bool {
				m, p := st.Models[name], st.Plans[name]
				return m != nil && coordinator.PlanLoaded(st, m, p)
			})
			a.shards.Reconcile(wantedShards(st, a.id, old))
			a.par.Reconcile(planView(st, a.catalog.ModelInfo, a.localModel, old))
			a.catalog.Reconcile(st)
			a.life.synced.Store(true)
		}
		select {
		case <-a.done:
			a.catalog.StopCopies()
			a.par.Close() // before the shards unmap
			a.shards.Close()
			return
		case <-changed:
		case <-a.par.Wake():
		case <-time.After(interval):
		}
	}
}

// servingState is the state to serve from: a server's own copy once it
// has caught up (coordinator.Server.CaughtUp), a client's read from a
// server (nil when none answers). A server restarted a moment ago holds
// its last snapshot until a leader tells it what is committed; serving
// that (or, with a data dir whose history the cluster did not keep, a
// plan that shares its version with the cluster's) would map shards and
// start runners the next state takes away under them.
func (a *Agent) servingState() *coordinator.State {
	if a.srv != nil {
		if !a.srv.CaughtUp() {
			if a.catchingUp.CompareAndSwap(false, true) {
				a.log.Info("waiting to catch up with the cluster's state before serving from it")
			}
			return nil
		}
		return a.srv.FSM().State()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := a.cluster.State(ctx)
	if err != nil {
		return nil
	}
	return st
}

// diskFree reads a folder's free disk (Config.DiskFree, else the file
// system's count).
func (a *Agent) diskFree(dir string) (uint64, bool) {
	if a.cfg.DiskFree != nil {
		return a.cfg.DiskFree(dir)
	}
	return fingerprint.DiskFree(dir)
}

// modelFetching says whether a node may still read model's ranges from
// the shard files this node holds: a plan of it is not loaded everywhere
// (true too when this agent has read no state yet).
func (a *Agent) modelFetching(model string) bool {
	// a draft's shard is held while its model loads
	model, _ = strings.CutSuffix(model, coordinator.DraftShardModel(""))
	fetching, seen := false, false
	a.viewState(func(st *coordinator.State) {
		seen = true
		m, p := st.Models[model], st.Plans[model]
		fetching = m != nil && p != nil && len(p.Pools) > 0 && !coordinator.PlanLoaded(st, m, p)
	})
	return fetching || !seen
}

// wantedShards lists the shards the committed plans give node, and those
// of the plans they replaced that run on meanwhile (old, by model).
func wantedShards(st *coordinator.State, node string, old map[string]*placement.Plan) []shard.Want {
	var out []shard.Want
	for name, m := range st.Models {
		p := st.Plans[name]
		if p == nil || m.Digest == "" {
			continue
		}
		if o := old[name]; o != nil {
			// The replaced plan's shards stay while p loads; none loads.
			for _, spec := range shard.SpecsFor(*o, node, m.Digest) {
				out = append(out, shard.Want{Model: name, Spec: spec, Version: o.Version, Linger: true})
			}
		}
		var src shard.Peer
		origin := ""
		if m.Hub != nil {
			origin = catalog.HubOrigin(m.Hub) // the source node has no file
		} else if n := st.Nodes[m.SourceNode]; n != nil {
			src = shard.Peer{ID: n.ID, Name: n.Name, Addr: n.RPCAddr}
			if n.Status != coordinator.StatusAlive {
				src.Down = string(n.Status)
			}
		}
		holders := modelHolders(st, m, node)
		for _, spec := range shard.SpecsFor(*p, node, m.Digest) {
			out = append(out, shard.Want{Model: name, Spec: spec, Version: p.Version, Source: src, Manifest: m.Manifest, Holders: holders, Origin: origin})
		}
		if spec, ok := draftSpec(m, p, node); ok {
			out = append(out, shard.Want{Model: spec.Model, Spec: spec, Version: p.Version, Source: src, Manifest: m.Draft.Manifest, Holders: draftHolders(st, m, node)})
		}
	}
	return out
}

// draftSpec is the shard of m's draft model that node holds, whole: the
// node that drives plan p does.
func draftSpec(m *coordinator.Model, p *placement.Plan, node string) (shard.ShardSpec, bool) {
	if !m.Draft.Hashed() || parallel.DriverOf(p) != node {
		return shard.ShardSpec{}, false
	}
	return shard.ShardSpec{Model: coordinator.DraftShardModel(m.Name), FileSHA: m.Draft.Digest, Lo: 0, Hi: m.Draft.Layers, TPSize: 1, Embedding: true, Output: true}, true
}

// draftHolders lists the live nodes other than self that may hold m's
// draft file: the source, then the nodes that reported its shard (a
// former driver).
func draftHolders(st *coordinator.State, m *coordinator.Model, self string) []shard.Peer {
	var out []shard.Peer
	ids := []string{m.SourceNode}
	for _, s := range st.Shards {
		if s.Model == coordinator.DraftShardModel(m.Name) && s.Node != m.SourceNode {
			ids = append(ids, s.Node)
		}
	}
	sort.Strings(ids[1:])
	for _, id := range ids {
		if n := st.Nodes[id]; n != nil && id != self && n.RPCAddr != "" && n.Status == coordinator.StatusAlive {
			out = append(out, shard.Peer{ID: n.ID, Name: n.Name, Addr: n.RPCAddr})
		}
	}
	return out
}

// reportShards records this node's shard status of a model in the state.
func (a *Agent) reportShards(s shard.Status) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return a.cluster.Apply(ctx, coordinator.ShardStatusType, coordinator.ShardStatusRequest{Shard: coordinator.ShardStatus{
		Node: a.id, Model: s.Model, Lo: s.Lo, Hi: s.Hi, PlanVersion: s.PlanVersion, State: s.State, Error: s.Error,
		Bytes: s.Bytes, Done: s.Done, Fetched: s.Fetched, Refetched: s.Refetched, Source: s.Source, NoRoom: s.NoRoom, UpdatedAt: time.Now().UTC(),
	}})
}

// modelHolders lists the live nodes other than self that may hold ranges of
// m's file: the source, the nodes with a verified copy of the whole file
// (by name), then the nodes that reported shards of the model (ready
// first; a released shard's file is kept a while for peers), those of
// other models of the same file (same sha256) with them. Suspect nodes
// come after the alive ones, in the same order: on a loaded host gossip
// suspects nodes that still answer, and a shard whose only holders are
// suspect would otherwise find none.
func modelHolders(st *coordinator.State, m *coordinator.Model, self string) []shard.Peer {
	var out, suspect []shard.Peer
	seen := map[string]bool{self: true}
	add := func(id string) {
		n := st.Nodes[id]
		if n == nil || seen[id] || n.RPCAddr == "" {
			return
		}
		switch n.Status {
		case coordinator.StatusAlive:
			out = append(out, shard.Peer{ID: n.ID, Name: n.Name, Addr: n.RPCAddr})
		case coordinator.StatusSuspect:
			suspect = append(suspect, shard.Peer{ID: n.ID, Name: n.Name, Addr: n.RPCAddr})
		default:
			return
		}
		seen[id] = true
	}
	add(m.SourceNode)
	for _, n := range coordinator.WholeHolders(st, m) {
		add(n.ID)
	}
	// Another model of the same file (loaded under another name): its
	// nodes serve the ranges they hold too.
	same := func(name string) bool {
		o := st.Models[name]
		return name == m.Name || o != nil && m.Digest != "" && o.Digest == m.Digest
	}
	for _, name := range slices.Sorted(maps.Keys(st.Models)) {
		if name != m.Name && same(name) {
			for _, n := range coordinator.WholeHolders(st, st.Models[name]) {
				add(n.ID)
			}
		}
	}
	var ready, other []string
	for _, s := range st.Shards {
		if !same(s.Model) {
			continue
		}
		if s.State == coordinator.ShardReady {
			ready = append(ready, s.Node)
		} else {
			other = append(other, s.Node)
		}
	}
	sort.Strings(ready)
	sort.Strings(other)
	for _, id := range append(ready, other...) {
		add(id)
	}
	return append(out, suspect...)
}
