package catalog

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/shard"
)

// hubCheck is a hub check running on this agent: the model's unverified
// manifest and the cancel of its context.
type hubCheck struct {
	id     string
	ctx    context.Context
	cancel context.CancelFunc
}

// claimHubCheck notes that the check of model under manifest id runs
// here, or reports nil when one already does. The claim's context ends
// when the check is stopped (stopHubCheck) or the agent stops.
func (c *Catalog) claimHubCheck(model, id string) *hubCheck {
	c.hubMu.Lock()
	defer c.hubMu.Unlock()
	if c.hubChecks == nil {
		c.hubChecks = map[string]*hubCheck{}
	}
	if cur := c.hubChecks[model]; cur != nil && cur.id == id {
		return nil
	}
	return c.newHubCheckLocked(model, id)
}

func (c *Catalog) newHubCheckLocked(model, id string) *hubCheck {
	if old := c.hubChecks[model]; old != nil {
		old.cancel()
	}
	ctx, cancel := context.WithCancel(context.Background())
	hc := &hubCheck{id: id, ctx: ctx, cancel: cancel}
	c.hubChecks[model] = hc
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return hc
}

// takeOverHubCheck claims the check of model under manifest id, stopping
// the one running here, if any: the state no longer has model under that
// manifest (it was unloaded, and is loaded again now), so that check
// checks nothing any more.
func (c *Catalog) takeOverHubCheck(model, id string) *hubCheck {
	c.hubMu.Lock()
	defer c.hubMu.Unlock()
	if c.hubChecks == nil {
		c.hubChecks = map[string]*hubCheck{}
	}
	return c.newHubCheckLocked(model, id)
}

// releaseHubCheck ends the claim hc, unless another claim replaced it.
func (c *Catalog) releaseHubCheck(model string, hc *hubCheck) {
	c.hubMu.Lock()
	if c.hubChecks[model] == hc {
		delete(c.hubChecks, model)
	}
	c.hubMu.Unlock()
	hc.cancel()
}

// stopHubCheck stops the check of model running here, if any: the model
// was unloaded.
func (c *Catalog) stopHubCheck(model string) {
	c.hubMu.Lock()
	hc := c.hubChecks[model]
	delete(c.hubChecks, model)
	c.hubMu.Unlock()
	if hc != nil {
		hc.cancel()
	}
}

// hubTakeOverAfter is how long the agent checking a hub model must have
// been failed or gone before the leader takes the check over: an agent
// restarted at once resumes its own check (from the manifest it kept)
// instead of the leader reading the header from the hub again and a second
// check running beside the resumed one.
const hubTakeOverAfter = 10 * time.Second

// resumeHubChecks starts the check of every hub model this agent loaded
// that is still unverified with no check running here (the agent stopped
// during one) and, on the leader, of those whose loading agent failed or
// left hubTakeOverAfter ago (the leader becomes their source). The
// unverified manifest is the one it kept, or is built again from the
// header read anew; a file whose header changed fails.
func (c *Catalog) resumeHubChecks(st *coordinator.State) {
	if c.hub == nil {
		return
	}
	for _, m := range st.Models {
		if !m.Unverified || m.Hub == nil || m.Status == coordinator.ModelFailed {
			continue
		}
		takeOver := false
		if m.SourceNode != c.id {
			// The loading agent is gone: the leader takes its check over.
			src := st.Nodes[m.SourceNode]
			gone := src == nil || (src.Status == coordinator.StatusFailed || src.Status == coordinator.StatusLeft) && time.Since(src.StatusSince) >= hubTakeOverAfter
			if !gone || !c.leader() {
				continue
			}
			takeOver = true
		}
		hc := c.claimHubCheck(m.Name, m.Manifest)
		if hc == nil {
			continue
		}
		c.bg.Add(1)
		go func(m coordinator.Model) {
			// st may predate the record of a check that just ended here (a
			// check's claim is released once it is recorded): started
			// again, it read the header from the hub and kept the
			// unverified manifest over the checked one, which the nodes
			// then asked this agent for in vain.
			if raw, ok := c.checkedHere(m); ok {
				defer c.bg.Done()
				defer c.releaseHubCheck(m.Name, hc)
				id := shard.ManifestID(raw)
				c.updateModel(m.Name, m.Manifest, func(cur *coordinator.Model) { cur.Manifest, cur.Unverified, cur.SourceNode = id, false, c.id })
				return
			}
			if !c.stillUnverified(m) {
				c.releaseHubCheck(m.Name, hc)
				c.bg.Done()
				return
			}
			c.log.Info("resuming the check of a model from the hub", zap.String("model", m.Name), zap.String("hub", m.Source),
				zap.Bool("taken_over", takeOver), zap.String("loaded_by", m.SourceNode))
			if takeOver {
				c.updateModel(m.Name, m.Manifest, func(cur *coordinator.Model) { cur.SourceNode = c.id })
				m.SourceNode = c.id
			}
			var pending []byte
			if ss := c.shardStore(); ss != nil {
				if raw, ok := ss.Manifest(m.Digest); ok && shard.ManifestID(raw) == m.Manifest {
					pending = raw
				}
			}
			if pending == nil {
				ctx, cancel := context.WithTimeout(hc.ctx, 2*time.Minute)
				client := c.hub()
				_, gf, err := readHeader(ctx, &rangeReader{ctx: ctx, c: client, repo: m.Hub.Repo, rev: m.Hub.Revision, file: m.Hub.File, size: m.Hub.Size}, m.Hub.Size)
				cancel()
				var t *shard.Table
				if err == nil {
					if t, err = shard.TableOf(gf); err == nil {
						t.FileSize = m.Hub.Size
						pending, err = shard.UnverifiedManifest(m.Digest, t, 0)
					}
				}
				switch {
				case err != nil:
					c.releaseHubCheck(m.Name, hc) // tried again on a later pass
					c.bg.Done()
					c.log.Warn("cannot read the hub model's header to resume its check", zap.String("model", m.Name), zap.Error(err))
					return
				case shard.ManifestID(pending) != m.Manifest:
					c.failHub(m, fmt.Sprintf("%s/%s changed on the hub while it was being loaded (its header differs): load it again", m.Hub.Repo, m.Hub.File))
					c.releaseHubCheck(m.Name, hc)
					c.bg.Done()
					return
				}
				if ss := c.shardStore(); ss != nil {
					ss.KeepManifest(m.Digest, pending)
				}
			}
			c.checkHubFile(hc, m, pending, nil)
		}(*m)
	}
}

// checkedHere returns the checked manifest of m's file this agent keeps,
// if it has one: the file was checked here (by a check whose record the
// state did not show yet).
func (c *Catalog) checkedHere(m coordinator.Model) ([]byte, bool) {
	ss := c.shardStore()
	if ss == nil {
		return nil, false
	}
	raw, ok := ss.Manifest(m.Digest)
	if !ok {
		return nil, false
	}
	man, err := shard.ParseManifest(raw, shard.ManifestID(raw), m.Digest)
	return raw, err == nil && !man.Unverified
}

// stillUnverified reads the state again: whether model m is still
// unverified under the same manifest (true when the state cannot be read:
// the check then finds out).
func (c *Catalog) stillUnverified(m coordinator.Model) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.cluster.State(ctx)
	if err != nil {
		return true
	}
	cur := st.Models[m.Name]
	return cur != nil && cur.Unverified && cur.Manifest == m.Manifest
}

// hubCheckWait bounds how long checkHubFile waits for the plan's nodes to
// hold their ranges.
const hubCheckWait = 6 * time.Hour

// checkHubFile checks a hub model registered with an unverified manifest:
// once every node of its plan holds its ranges, it reads the file back
// from them in order (the header from prefix, padding as zeros, a range
// no node holds from the hub), checks its sha256 against the hub's LFS
// sha256 and records the full manifest. When that does not match, it
// reads the whole file from the hub: a match means a node holds bad bytes
// (its unit checks will mend them); no match fails the model with both
// hashes.
func (c *Catalog) checkHubFile(hc *hubCheck, m coordinator.Model, pending, prefix []byte) {
	defer c.bg.Done()
	defer c.releaseHubCheck(m.Name, hc)
	ctx := hc.ctx
	t0 := time.Now()
	where := m.Hub.Repo + "/" + m.Hub.File
	pendingID := shard.ManifestID(pending)
	man, err := shard.ParseManifest(pending, pendingID, m.Digest)
	if err != nil {
		c.failHub(m, fmt.Sprintf("%s: %v", where, err))
		return
	}
	holders, ok := c.awaitHubHolders(ctx, m.Name, pendingID, m.Digest)
	if !ok {
		return // unloaded, loaded again, or the agent stops
	}
	if len(prefix) > 0 {
		var lf shard.LocalFetcher
		lf.Add(m.Digest, bytes.NewReader(prefix))
		holders = append([]shard.Holder{{ID: "header", Name: "the header read at load", Held: []shard.Range{{Off: 0, N: int64(len(prefix))}}, F: &lf}}, holders...)
	}
	table := man.Table
	vc := *c.hub()
	vc.UserAgent += " verify" // its bytes are told apart from the shards'
	origin := HubOrigin(m.Hub)
	holders = append(holders, shard.Holder{ID: origin, Name: "the hub", Held: []shard.Range{{Off: 0, N: m.Hub.Size}}, F: newHubFetcher(&vc, origin), Last: true})
	r, hf := shard.FileReader(ctx, man, holders)
	sha, raw, err := shard.BuildManifestFrom(table, r, man.UnitSize)
	served, _ := hf.Served()
	how := "read back from the nodes"
	if err == nil && sha != m.Hub.SHA256 {
		c.log.Warn("the hub model's ranges read back from the nodes do not match the hub's sha256; reading the file from the hub",
			zap.String("model", m.Name), zap.String("sha256", sha), zap.String("lfs_sha256", m.Hub.SHA256))
		stream := vc.ReadRange(ctx, m.Hub.Repo, m.Hub.Revision, m.Hub.File, 0, m.Hub.Size)
		sha, raw, err = shard.BuildManifestFrom(table, stream, man.UnitSize)
		stream.Close()
		how = "read whole from the hub"
	}
	if ctx.Err() != nil {
		return
	}
	switch {
	case err != nil:
		c.failHub(m, fmt.Sprintf("checking %s on %s: %v", where, c.name, err))
		return
	case sha != m.Hub.SHA256:
		c.failHub(m, fmt.Sprintf("%s from the hub: sha256 mismatch: the %d bytes read have sha256 %s, the hub lists %s (LFS); the hub served corrupt bytes or the file changed: load it again", where, m.Hub.Size, sha, m.Hub.SHA256))
		return
	}
	if ss := c.shardStore(); ss != nil {
		ss.KeepManifest(sha, raw)
	}
	id := shard.ManifestID(raw)
	// This agent keeps the checked manifest, so it becomes the model's
	// source, the node the others ask for it first: the leader may have
	// taken the check over while this agent, restarted, resumed it from a
	// state that did not show that yet, and only the check that ends
	// first records its manifest.
	c.updateModel(m.Name, pendingID, func(cur *coordinator.Model) { cur.Manifest, cur.Unverified, cur.SourceNode = id, false, c.id })
	c.log.Info("model from the hub verified", zap.String("model", m.Name), zap.String("sha256", sha), zap.String("how", how),
		zap.Any("bytes_by_holder", served), zap.Duration("took", time.Since(t0)))
}

// awaitHubHolders waits until every node of model's plan holds its ranges
// (its shards verifying) and returns them as holders, or false when the
// model no longer has the manifest pendingID or the wait ends.
func (c *Catalog) awaitHubHolders(ctx context.Context, model, pendingID, sha string) ([]shard.Holder, bool) {
	deadline := time.Now().Add(hubCheckWait)
	for ; time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if ctx.Err() != nil {
			return nil, false
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := c.cluster.State(sctx)
		cancel()
		if err != nil {
			continue
		}
		cur := st.Models[model]
		if cur == nil || cur.Manifest != pendingID {
			return nil, false
		}
		p := st.Plans[model]
		if p == nil || len(p.Pools) == 0 {
			continue
		}
		var holders []shard.Holder
		all := true
		for _, id := range p.Nodes() {
			n, s := st.Nodes[id], st.Shards[coordinator.ShardKey(id, model)]
			if n == nil || s == nil || s.PlanVersion != p.Version || s.State != coordinator.ShardVerifying && s.State != coordinator.ShardReady {
				all = false
				break
			}
			hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, held, err := c.peers.Holdings(hctx, n.RPCAddr, sha)
			cancel()
			if err != nil || len(held) == 0 {
				all = false
				break
			}
			holders = append(holders, shard.Holder{ID: id, Name: n.Name, Held: held, F: c.peers.Ranges(n.RPCAddr)})
		}
		if all {
			return holders, true
		}
	}
	c.log.Warn("the hub model's nodes did not all hold their ranges in time; it stays unverified", zap.String("model", model), zap.Duration("waited", hubCheckWait))
	return nil, false
}

// failHub records hub model m failed for reason (its plan is released).
func (c *Catalog) failHub(m coordinator.Model, reason string) {
	c.log.Warn("model from the hub failed verification", zap.String("model", m.Name), zap.String("reason", reason))
	c.updateModel(m.Name, m.Manifest, func(cur *coordinator.Model) { cur.Status, cur.Reason = coordinator.ModelFailed, reason })
}

// updateModel changes the model named name, while it still has manifest
// id, as set does, writing it back (retried: the planner may write the
// model meanwhile).
func (c *Catalog) updateModel(name, id string, set func(*coordinator.Model)) {
	ok := c.retryWrite(func(ctx context.Context) error {
		st, err := c.cluster.State(ctx)
		if err != nil {
			return err
		}
		cur := st.Models[name]
		if cur == nil || cur.Manifest != id {
			return nil // unloaded or loaded again
		}
		mm := *cur
		set(&mm)
		return c.cluster.Apply(ctx, coordinator.ModelUpsertType, coordinator.ModelUpsertRequest{Model: mm})
	})
	if !ok {
		c.log.Warn("could not record the model's check", zap.String("model", name))
	}
}
