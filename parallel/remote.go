package parallel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"shoal/engine/kv"
	"shoal/engine/model"
	"shoal/serve"
)

// RemotePrefill is an engine's disaggregated prefill: a session over its
// plan's prefill pool, and the rule that says which prompts go there.
type RemotePrefill struct {
	Session *Session
	// Remote reports whether a prompt of n tokens is prefilled on the
	// prefill pool, given the engine's load now (nil: every prompt is).
	Remote func(n int, now Load) bool
	// Chunk bounds the tokens of one handoff step (DefaultHandoffChunk
	// if 0): a step must finish within the prefill session's timeout.
	Chunk int
	// Observe, when set, learns of every remote prefill that ended: its
	// prompt tokens, the time it took and its error.
	Observe func(tokens int, took time.Duration, err error)
	// Fail ends a request whose remote prefill failed with that error;
	// by default the decode pool prefills it instead.
	Fail bool
}

// Load is what an engine sees when it routes a prompt (RemotePrefill.Remote).
type Load struct {
	// Streams is the sequences the engine runs, the prompt's own not
	// counted: those a local prefill would stall.
	Streams int
	// RemoteTokPerSec is the prompt tokens a second the prefill pool
	// showed on the latest handoffs (0: none yet).
	RemoteTokPerSec float64
}

// DefaultHandoffChunk is the prompt tokens of one handoff step.
const DefaultHandoffChunk = 512

// Handoff chunks after the first are sized by the speed the prefill pool
// showed on the chunks before (the rate carries over to the next prompts):
// handoffTarget of work, at most handoffShare of the session's step
// timeout, between minHandoffChunk and DefaultHandoffChunk tokens. Every
// chunk costs a round of KV opens and waits and the tail of its last
// layer's transfer; a node's probed compute (RemotePrefill.Chunk's usual
// source) said 46 tokens/s where the pool prefilled 70, and chunks of 92
// tokens made a 1,024-token prompt 1 s slower than local prefill.
const (
	handoffTarget   = 4 * time.Second
	handoffShare    = 0.35
	minHandoffChunk = 32
)

// handoffChunk is the chunk for a prefill pool that computes rate tokens
// per second, in steps bounded by timeout.
func handoffChunk(rate float64, timeout time.Duration) int {
	target := handoffTarget
	if timeout > 0 {
		target = min(target, time.Duration(float64(timeout)*handoffShare))
	}
	n := rate * target.Seconds()
	if !(n > minHandoffChunk) { // NaN too
		return minHandoffChunk
	}
	return int(min(n, DefaultHandoffChunk))
}

// remoteJob is one prompt being prefilled on the prefill pool.
type remoteJob struct {
	fail      bool // RemotePrefill.Fail
	seq       kv.SeqID
	tokens    []int32
	dec       *Session // the decode session it lands on
	logits    []float32
	err       error
	cancelled bool
}

// remoteState is the engine's part of remote prefill.
type remoteState struct {
	mu      sync.Mutex
	rp      *RemotePrefill
	running map[kv.SeqID]*remoteJob
	landed  []*remoteJob
	wg      sync.WaitGroup
	// serial runs one prompt at a time on the prefill pool, which holds
	// KV for one prompt (its steps would serialize on the session anyway).
	serial sync.Mutex
	stats  RemoteStats
	rate   float64 // prompt tokens per second the prefill pool showed (0: none yet)
}

// RemoteStats counts an engine's remote prefills.
type RemoteStats struct {
	Prefills, Failed uint64  // ended well, ended in an error (then prefilled locally)
	Tokens           uint64  // prompt tokens of the prefills that ended well
	Seconds          float64 // their total time, queueing for the prefill pool included
	Running          int     // under way
	// Local counts the prompts the routing rule kept on the decode pool
	// (or that went there because the prefill pool was unusable).
	Local uint64
	// Phases is where the remote prefills' time went, summed over them.
	Phases HandoffPhases
}

// HandoffPhases splits remote prefill time, in seconds: Queue waiting for
// the prefill pool (one prompt at a time), Open reserving the positions on
// the decode pool, Step the prefill pool's steps (its compute and the KV
// sent as it goes), Wait the decode pool's imports finishing after a step.
type HandoffPhases struct {
	Queue, Open, Step, Wait float64
}

// RemoteStats returns the engine's remote prefill counters.
func (e *Engine) RemoteStats() RemoteStats {
	e.remote.mu.Lock()
	defer e.remote.mu.Unlock()
	st := e.remote.stats
	st.Running = len(e.remote.running)
	return st
}

// SetRemotePrefill makes the engine prefill the prompts rp.Remote picks on
// rp.Session, whose plan's decode pool must be the engine's (nil: every
// prompt is prefilled in the engine's own steps). Prefills under way go on
// with the session they started on.
func (e *Engine) SetRemotePrefill(rp *RemotePrefill) {
	e.remote.mu.Lock()
	defer e.remote.mu.Unlock()
	e.remote.rp = rp
}

var _ serve.RemotePrefiller = (*Engine)(nil)

// Prefill implements serve.RemotePrefiller: it reserves the prompt's
// positions in the shadow cache and hands its prefill to the prefill pool
// in the background, one chunk at a time, each chunk's KV streaming to
// the engine's current session.
func (e *Engine) Prefill(seq kv.SeqID, tokens []int32, notify func()) bool {
	e.remote.mu.Lock()
	rp := e.remote.rp
	e.remote.mu.Unlock()
	if rp == nil || rp.Session == nil || len(tokens) == 0 {
		return false
	}
	e.remote.mu.Lock()
	now := Load{Streams: len(e.hist), RemoteTokPerSec: e.remote.rate}
	e.remote.mu.Unlock()
	if (rp.Remote != nil && !rp.Remote(len(tokens), now)) || rp.Session.Err() != nil || e.s.Err() != nil {
		e.remote.mu.Lock()
		e.remote.stats.Local++
		e.remote.mu.Unlock()
		return false
	}
	if e.shadow.Len(seq) != 0 {
		return false
	}
	if _, err := e.shadow.Reserve(seq, len(tokens)); err != nil {
		return false // no room now: prefilled here when there is
	}
	j := &remoteJob{seq: seq, tokens: append([]int32(nil), tokens...), dec: e.s, fail: rp.Fail}
	e.remote.mu.Lock()
	if e.remote.running == nil {
		e.remote.running = map[kv.SeqID]*remoteJob{}
	}
	e.remote.running[seq] = j
	e.remote.wg.Add(1)
	e.remote.mu.Unlock()
	go func() {
		defer e.remote.wg.Done()
		t0 := time.Now()
		j.logits, j.err = e.handoff(rp, j)
		if rp.Observe != nil {
			rp.Observe(len(j.tokens), time.Since(t0), j.err)
		}
		e.remote.mu.Lock()
		delete(e.remote.running, seq)
		e.remote.landed = append(e.remote.landed, j)
		if j.err == nil {
			e.remote.stats.Prefills++
			e.remote.stats.Tokens += uint64(len(j.tokens))
			e.remote.stats.Seconds += time.Since(t0).Seconds()
		} else {
			e.remote.stats.Failed++
		}
		e.remote.mu.Unlock()
		notify()
	}()
	return true
}

// handoff runs j's prompt on the prefill pool in chunks and frees it there.
func (e *Engine) handoff(rp *RemotePrefill, j *remoteJob) ([]float32, error) {
	chunk := rp.Chunk
	if chunk <= 0 {
		chunk = DefaultHandoffChunk
	}
	ctx := context.Background()
	pre := rp.Session
	tq := time.Now()
	e.remote.serial.Lock()
	defer e.remote.serial.Unlock()
	e.remote.mu.Lock()
	e.remote.stats.Phases.Queue += time.Since(tq).Seconds()
	e.remote.mu.Unlock()
	defer func() {
		// The prefill pool keeps nothing of the prompt (best effort: a
		// failed free leaves the session unusable, and it is replaced).
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = pre.Free(fctx, j.seq)
		cancel()
	}()
	e.remote.mu.Lock()
	if r := e.remote.rate; r > 0 {
		chunk = handoffChunk(r, pre.c.opt.Timeout)
	}
	e.remote.mu.Unlock()
	var last []float32
	for off, n := 0, 0; off < len(j.tokens); off += n {
		e.remote.mu.Lock()
		cancelled := j.cancelled
		e.remote.mu.Unlock()
		if cancelled {
			return nil, errors.New("dist: the request was cancelled")
		}
		n = min(chunk, len(j.tokens)-off)
		b := &model.Batch{Tokens: j.tokens[off : off+n], Chunks: []model.Chunk{{Seq: j.seq, N: n}}}
		var rows []int
		if off+n == len(j.tokens) {
			rows = []int{n - 1}
		}
		t0 := time.Now()
		var ph HandoffPhases
		l, err := pre.handoff(ctx, j.dec, b, rows, &ph)
		e.remote.mu.Lock()
		e.remote.stats.Phases.Open += ph.Open
		e.remote.stats.Phases.Step += ph.Step
		e.remote.stats.Phases.Wait += ph.Wait
		e.remote.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("dist: prefilling %d prompt tokens on the prefill pool (from position %d): %w", n, off, err)
		}
		if took := time.Since(t0).Seconds(); n >= minHandoffChunk && took > 0 {
			e.remote.mu.Lock()
			r := float64(n) / took
			if e.remote.rate > 0 {
				r = 0.5*e.remote.rate + 0.5*r
			}
			e.remote.rate = r
			e.remote.mu.Unlock()
			chunk = handoffChunk(r, pre.c.opt.Timeout)
		}
		if rows != nil {
			last = append([]float32(nil), l...)
		}
	}
	return last, nil
}

// Landed implements serve.RemotePrefiller (on the scheduler's goroutine):
// a prompt that landed on the engine's current session joins the replay
// history; one that failed, was cancelled or landed on a session the
// engine has since replaced is freed.
func (e *Engine) Landed() []serve.PrefillResult {
	e.remote.mu.Lock()
	js := e.remote.landed
	e.remote.landed = nil
	e.remote.mu.Unlock()
	var out []serve.PrefillResult
	for _, j := range js {
		if j.err == nil && j.dec != e.s {
			j.err = errors.New("dist: the prompt was prefilled for a session the model no longer runs on")
		}
		if j.cancelled {
			e.freeRemote(j)
			continue
		}
		if j.err != nil {
			e.freeRemote(j)
			out = append(out, serve.PrefillResult{Seq: j.seq, Err: j.err, Fail: j.fail})
			continue
		}
		e.hist[j.seq] = j.tokens
		out = append(out, serve.PrefillResult{Seq: j.seq, Logits: j.logits})
	}
	return out
}

// freeRemote gives back what a remote prefill that did not land holds.
func (e *Engine) freeRemote(j *remoteJob) {
	e.shadow.Free(j.seq)
	if j.dec == e.s {
		_ = e.s.Free(context.Background(), j.seq)
	}
}

// cancelRemote marks seq's remote prefill cancelled; true when there was
// one (Landed frees it when it ends).
func (e *Engine) cancelRemote(seq kv.SeqID) bool {
	e.remote.mu.Lock()
	defer e.remote.mu.Unlock()
	if j := e.remote.running[seq]; j != nil {
		j.cancelled = true
		return true
	}
	for _, j := range e.remote.landed {
		if j.seq == seq {
			j.cancelled = true
			return true
		}
	}
	return false
}

// waitRemote waits for the remote prefills under way (on Close).
func (e *Engine) waitRemote() { e.remote.wg.Wait() }
