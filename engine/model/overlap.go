package model

import (
	"fmt"
	"sync"

	"shoal/engine/device"
)

// A tensor-parallel member's step of many tokens spends a long time in its
// all-reduces: two a layer, of the whole step's hidden states (a 2,048-
// token prefill of TinyLlama's shapes sends 8 MB each in f16). Run as one
// batch, the member's core waits idle for each. Cut into parts, one part's
// all-reduce travels while the member computes the other part's half of
// the layer (issue #39): the attention of part 2 while part 1's attention
// output is summed, the FFN of part 1 while part 2's is, and so on. The
// parts go through the layers in order, so part 2's attention reads the
// keys and values part 1 wrote to the cache a moment before.

// MinOverlapTokens is the fewest tokens a part of an overlapped step
// holds: a step of fewer than twice as many runs as one batch (a decode
// step's all-reduces are too short to hide anything behind).
const MinOverlapTokens = 32

// overlapParts is how many parts a tensor-parallel step of n tokens is cut
// into: 2 (the smallest number that keeps one part's all-reduce in flight
// while the other computes), 0 when it runs as one batch.
func (r *Runner) overlapParts(n int) int {
	if r.tp == nil || !r.overlap || n < 2*MinOverlapTokens {
		return 0
	}
	return 2
}

// overlapper is a collective that knows whether every member of its group
// overlaps (a build from before overlapped steps makes one all-reduce of a
// whole step per half: a member must not cut its steps unless every other
// does). A collective without the method is taken to overlap.
type overlapper interface{ Overlaps() bool }

// orderedColl is the group's collective with calls that may run in the
// background (Start). Calls reach the group in the order they are made,
// which is the same on every member: a background call waits for the one
// started before it, and a call made directly waits for every background
// call first. With nothing in the background a direct call costs nothing
// more than the group's own.
type orderedColl struct {
	Collective
	mu   sync.Mutex
	last chan struct{} // closed when the latest background call is done; nil when none runs
}

// Start begins an all-reduce of x in the background; wait blocks until it
// is done and returns its error. x must not be touched before wait returns.
func (c *orderedColl) Start(x []float32) (wait func() error) {
	c.mu.Lock()
	prev := c.last
	done := make(chan struct{})
	c.last = done
	c.mu.Unlock()
	var err error
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		err = c.Collective.AllReduceSum(x)
	}()
	return func() error {
		<-done
		return err
	}
}

// drain waits for every background call.
func (c *orderedColl) drain() {
	c.mu.Lock()
	last := c.last
	c.last = nil
	c.mu.Unlock()
	if last != nil {
		<-last
	}
}

// AllReduceSum implements device.Collective, after the background calls.
func (c *orderedColl) AllReduceSum(x []float32) error {
	c.drain()
	return c.Collective.AllReduceSum(x)
}

// AllGather implements device.Collective, after the background calls.
func (c *orderedColl) AllGather(part, out []float32) error {
	c.drain()
	return c.Collective.AllGather(part, out)
}

// splitBatch cuts the device batch db into parts of about equal tokens (a
// chunk that straddles a cut is split in two at that position), appending
// to out's parts.
func splitBatch(db *device.Batch, parts int, out []device.Batch) []device.Batch {
	n := 0
	for _, c := range db.Chunks {
		n += c.N
	}
	out = out[:0]
	at := 0
	ci, done := 0, 0 // the chunk being cut and its tokens already given out
	for p := range parts {
		end := n * (p + 1) / parts
		var b device.Batch
		for at < end {
			c := db.Chunks[ci]
			take := min(c.N-done, end-at)
			b.Chunks = append(b.Chunks, device.Chunk{Pos: c.Pos + done, N: take, Blocks: c.Blocks})
			at += take
			done += take
			if done == c.N {
				ci, done = ci+1, 0
			}
		}
		out = append(out, b)
	}
	return out
}

// forwardOverlapped is Forward's tensor-parallel path for a batch cut into
// parts (overlapParts): every layer's halves run part after part, each
// part's all-reduce in the background while the next part computes.
func (r *Runner) forwardOverlapped(lo, hi, parts int, x []float32) error {
	E := r.m.NEmbd
	r.parts = splitBatch(&r.db, parts, r.parts)
	type part struct {
		db   *device.Batch
		x, o []float32
		wait func() error
		half device.Half // the half whose all-reduce is in flight
		l    int         // its layer
	}
	ps := make([]part, parts)
	if len(r.partO) < parts {
		r.partO = make([][]float32, parts)
	}
	off := 0
	for i := range ps {
		n := 0
		for _, c := range r.parts[i].Chunks {
			n += c.N
		}
		r.partO[i] = grow(r.partO[i], n*E)
		ps[i] = part{db: &r.parts[i], x: x[off*E : (off+n)*E], o: r.partO[i][:n*E], l: -1}
		off += n
	}
	var first error
	// begin hands the device part p's batch, unless it holds it already.
	var cur *device.Batch
	begin := func(p *part) error {
		if cur == p.db {
			return nil
		}
		cur = p.db
		return r.dev.Begin(p.db)
	}
	// finish waits for part p's all-reduce in flight and adds its residual.
	finish := func(p *part) error {
		if p.l < 0 {
			return nil
		}
		var err error
		if p.wait != nil {
			err = p.wait()
			p.wait = nil
		}
		if err == nil {
			if err = begin(p); err == nil {
				r.dev.Residual(p.l, p.half, p.x, p.o)
			}
		}
		p.l = -1
		return err
	}
	// half runs one half of layer l on part p and starts its all-reduce.
	half := func(p *part, l int, h device.Half) error {
		if err := finish(p); err != nil {
			return err
		}
		if err := begin(p); err != nil {
			return err
		}
		run := r.dev.Attention
		if h == device.FFNHalf {
			run = r.dev.FFN
		}
		partial, err := run(l, p.x, p.o)
		if err != nil {
			return err
		}
		if partial {
			p.wait = r.tp.ordered.Start(p.o)
		}
		p.half, p.l = h, l
		return nil
	}
	for l := lo; l < hi && first == nil; l++ {
		for _, h := range []device.Half{device.AttnHalf, device.FFNHalf} {
			for i := range ps {
				if err := half(&ps[i], l, h); err != nil {
					first = fmt.Errorf("layer %d: %w", l, err)
					break
				}
			}
			if first != nil {
				break
			}
		}
	}
	// Every part's last all-reduce lands before x is handed back, also
	// after a failure (the buffers are reused by the next step).
	for i := range ps {
		if err := finish(&ps[i]); err != nil && first == nil {
			first = fmt.Errorf("layer %d: %w", hi-1, err)
		}
	}
	r.tp.ordered.drain()
	return first
}
