package parallel

import "context"

// KVPiece is one layer's K and V of a run of positions and global KV heads
// of one sequence: K and V hold N x (HeadHi-HeadLo) x HeadDim F16 values
// each, laid out [position][head][dim].
type KVPiece struct {
	Layer          int
	Pos, N         int
	HeadLo, HeadHi int
	HeadDim        int
	// K and V as kv.Cache.ExportRange gives them; V is nil when the
	// caches' V is a view of K (multi-head latent attention: the latent
	// crosses the wire once).
	K, V []uint16
}

// KVLink moves the pieces of a prompt's KV cache from the prefill pool's
// members to the decode pool's, under a transfer ID the driver picks
// (package disagg implements it on kv streams: versioned, bounded and
// checksummed frames). A host without one cannot take part in
// disaggregated prefill.
type KVLink interface {
	// Sender starts sending transfer id from this host.
	Sender(id uint64) KVSender
	// Receive registers transfer id on this host: pieces any sender sends
	// for it from now on arrive in the inbox. Pieces of a transfer nobody
	// registered are refused.
	Receive(id uint64) KVInbox
}

// KVSender sends one transfer's pieces to the members that import them.
type KVSender interface {
	// Send queues p for the host at addr; it may return before p is on
	// the wire (and may keep p's slices until then), or block while the
	// link is congested, until ctx ends.
	Send(ctx context.Context, addr string, p *KVPiece) error
	// Close flushes what was sent, tells every receiver the sender is
	// done, and returns the first error of any send.
	Close(ctx context.Context) error
}

// KVInbox yields the pieces of one transfer as they arrive.
type KVInbox interface {
	// Next returns the next piece; an error when a sender aborted the
	// transfer, a frame was corrupt, or ctx ended.
	Next(ctx context.Context) (*KVPiece, error)
	// Close unregisters the transfer; pieces still arriving are dropped.
	Close()
}
