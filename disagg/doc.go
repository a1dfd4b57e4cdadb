// Package disagg owns disaggregated prefill and decode: the roles (a
// prefill pool computes a prompt's KV cache, a decode pool imports it and
// generates), the routing policy that decides per request whether to
// prefill remotely and on which prefill worker, and the layer-wise KV
// transfer protocol with the sender's leases. It must not own placement:
// which nodes form the pools, and how each pool splits layers and heads,
// come from the plan (package placement); this package takes them as given.
//
// # Routing (policy.go)
//
// Decide compares, for the request's uncached prompt tokens, a local
// prefill with a remote one whose KV streams back layer by layer while
// later layers are still being computed, and goes remote in auto mode only
// when that is faster by a margin and the uncached tokens reach Threshold
// (the cost model's break-even, never below a floor of about a thousand
// tokens, as Dynamo and TensorRT-LLM do). Pick then chooses a prefill
// worker by cached prefix blocks and queued work, with a little randomness
// so that simultaneous requests do not all land on one worker.
//
// # KV transfer (frame.go)
//
// A transfer moves one prompt's KV cache from the prefill members that
// computed it to the decode members that will hold it, under a transfer ID
// the router chooses (unique per attempt). The pools may split layers and
// KV heads differently: frames carry global layer numbers and global head
// ranges, a sender sends each decode member the layers it holds and the
// overlap of its heads with the member's (Frame.SliceHeads, or
// Frame.Overlap and Frame.DecodeHeads on the receiving side), and the
// receiver imports with kv.Cache.ImportRange into positions it reserved
// before the first frame. One transfer is a sequence of frames on a kv
// stream:
//
//   - data frames, one per (layer, chunk of positions), sent as soon as the
//     prefill produced that layer, so transfer overlaps compute;
//   - then one end frame with the totals (data frames, payload bytes,
//     layers, positions), which the receiver compares with what it took in;
//   - or, at any point, an abort frame with a reason, from either side;
//   - the receiver answers a complete import with an ack frame.
//
// Frames are versioned, bounded by MaxFrame (checked from the header
// before anything is allocated) and checksummed (CRC-32C over header and
// payload); the layout is documented beside the codec.
//
// # The link (link.go)
//
// Link implements parallel.KVLink on the node's QUIC endpoint: one kv
// stream per (transfer, destination), opened on the first Send; pieces
// larger than the frame limit go as several frames of whole positions.
// The sender's Close writes each stream's end frame and waits for the
// ack, which the receiver sends once the totals match and Next has taken
// every piece of that stream. An inbox holds at most MaxBuffered bytes;
// beyond that its streams stop being read and QUIC flow control slows the
// senders. A stream for a transfer nobody registered, a corrupt frame or
// wrong totals abort the stream with a reason (an abort frame back, an
// error from Next); an inbox that sees nothing for IdleTimeout fails.
// Stats counts payload and framing bytes each way.
//
// # Leases (lease.go)
//
// The sender holds the blocks of a transfer under a lease from the first
// frame until the receiver's ack, an abort, or the lease's deadline, and
// releases them exactly once on whichever comes first. A receiver that
// sees no end frame before its own deadline aborts the transfer and fails
// the request or prefills locally; a transfer never hangs.
package disagg
