package parallel

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/serve"
	"shoal/shard"
)

// DefaultDraftWait bounds how long a driver whose plan is loaded waits for its
// draft model's shard before it serves without it: a draft never holds a
// model back for long. A driver started without its draft takes it up
// when it starts again (a new plan elsewhere, a restart).
const DefaultDraftWait = 30 * time.Second

// draftModel is a driver's draft model (PlannedModel.DraftKey): a runner
// over the whole draft shard held on this node, drafting for the
// driver's scheduler. Close, from the scheduler when it closes or from
// DropMember before the shard's mapping goes, ends its use at once: later
// drafts are empty and the step runs without them.
type draftModel struct {
	key string
	mu  sync.Mutex
	d   *serve.ModelDrafter
	r   *model.Runner
}

func (g *draftModel) Draft(seq kv.SeqID, toks []int32, k int, dst []int32) []int32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.d == nil {
		return dst
	}
	return g.d.Draft(seq, toks, k, dst)
}

func (g *draftModel) Forget(seq kv.SeqID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.d != nil {
		g.d.Forget(seq)
	}
}

// Close releases the draft's runner; it may be called more than once.
func (g *draftModel) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.d != nil {
		g.r.Close()
		g.d, g.r = nil, nil
	}
	return nil
}

// closed reports whether g was closed.
func (g *draftModel) closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.d == nil
}

// draftShard finds the ready shard of pm's draft on this node.
func (r *Reconciler) draftShard(pm *PlannedModel) (shard.Ready, bool) {
	for _, s := range r.cfg.Shards.Ready() {
		if s.Key == pm.DraftKey {
			return s, true
		}
	}
	return shard.Ready{}, false
}

// awaitDraft says whether the driver of pm should wait for its draft
// shard before it starts: it is not ready yet and the wait
// (ReconcilerConfig.DraftWait) has not passed since the plan was ready.
func (r *Reconciler) awaitDraft(pm *PlannedModel) bool {
	if pm.DraftKey == "" {
		return false
	}
	if _, ok := r.draftShard(pm); ok {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	since, ok := r.draftSince[pm.Name]
	if !ok {
		r.draftSince[pm.Name] = time.Now()
		return true
	}
	wait := r.cfg.DraftWait
	if wait <= 0 {
		wait = DefaultDraftWait
	}
	if time.Since(since) < wait {
		return true
	}
	if r.logged[pm.Name+"#draft"] == "" {
		r.logged[pm.Name+"#draft"] = "waited"
		r.log.Warn("serving without the draft model: its shard is not ready on this node", zap.String("model", pm.Name), zap.Duration("waited", wait))
	}
	return false
}

// openDraft opens a drafter over pm's draft shard for a driver whose
// cache holds ctx positions, or returns nil (the draft is not ready; an
// error is logged).
func (r *Reconciler) openDraft(pm *PlannedModel, ctx int, nVocab int) *draftModel {
	s, ok := r.draftShard(pm)
	if !ok {
		return nil
	}
	g, err := func() (*draftModel, error) {
		mdl, err := s.Shard.Model()
		if err != nil {
			return nil, err
		}
		rn, err := model.NewRunner(mdl, model.Options{Threads: r.threads(pm), CacheTokens: ctx, Device: r.cfg.Device})
		if err != nil {
			return nil, err
		}
		d, err := serve.NewModelDrafter(rn, nVocab)
		if err != nil {
			rn.Close()
			return nil, err
		}
		return &draftModel{key: s.Key, d: d, r: rn}, nil
	}()
	if err != nil {
		r.log.Warn("serving without the draft model", zap.String("model", pm.Name), zap.Error(fmt.Errorf("draft: %w", err)))
		return nil
	}
	r.mu.Lock()
	// drafters their schedulers closed go; the open ones stay for DropMember
	r.drafts[g.key] = append(slices.DeleteFunc(r.drafts[g.key], (*draftModel).closed), g)
	delete(r.draftSince, pm.Name)
	r.mu.Unlock()
	return g
}

// dropDrafts closes the drafters over the shard key.
func (r *Reconciler) dropDrafts(key string) {
	r.mu.Lock()
	gs := r.drafts[key]
	delete(r.drafts, key)
	r.mu.Unlock()
	for _, g := range gs {
		g.Close()
	}
}
