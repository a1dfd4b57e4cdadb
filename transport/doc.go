// Package transport owns a node's single QUIC endpoint: one UDP port, mutual
// TLS against the cluster CA, and typed streams. Every stream starts with a
// one-byte Kind so that raft, rpc, activations, collectives, kv, weights,
// probe and forwarded-request traffic share one connection per peer.
// Messages on a stream are length-prefixed frames with a hard maximum size.
// A forwarded request (KindForward, forward.go) carries an HTTP request an
// agent passes to the agent serving its model, and streams the answer back
// frame by frame; a gateway stream (KindGateway) carries a generation as
// tokens instead, its format owned by the gateway package.
//
// The package also holds the cluster PKI (CA, node certificates, CA pinning
// for join tokens) and a raft.StreamLayer over streams of kind KindRaft.
//
// A tensor-parallel group's collectives may leave QUIC: between endpoints
// of protocol 4 each member opens a TLS-over-TCP link to every other one on
// the number of its QUIC port and writes tensor frames on it, which the
// peer reads on its calling goroutine (direct.go).
//
// # Tensor frames
//
// Activations and collectives move float32 tensors as tensor frames: a
// 32-byte header (big-endian fields), the tag, then the payload.
//
//	off size field
//	0   1    magic 0xA7
//	1   1    version, 1
//	2   1    message type: 1 activation, 2 collective
//	3   1    dtype: 1 f32, 2 f16, 3 q8_0
//	4   8    id (request/step id, or a collective's sequence number)
//	12  4    rows
//	16  4    cols
//	20  2    tag length (at most MaxTagLen)
//	22  2    reserved, zero
//	24  4    payload length, = dtype.EncodedLen(rows*cols)
//	28  4    CRC32C of tag and payload
//
// Payloads are little-endian: f32 exact, f16 rounded to nearest even, q8_0
// as ggml's block_q8_0 (per 32 values an f16 scale and 32 int8; a short last
// block is zero-padded). A payload above the reader's limit is refused from
// the header, before anything is allocated; a cut stream, a bad checksum or
// an inconsistent header are errors (ErrTruncatedFrame, ErrChecksum,
// ErrBadTensorFrame) and reset the stream.
//
// A sender keeps one long-lived stream per peer and kind, opened by a dial
// that waits for the handler's ready byte (a peer that does not serve the
// kind yet is retried until the caller's deadline). Receivers hold frames
// for their readers, matched by (id, tag), up to a byte budget; beyond it
// they stop reading and QUIC flow control stalls the sender. Every send and
// receive is bounded by a context.
//
// # Collectives
//
// A Group is one member of a tensor-parallel group: ordered member
// addresses, its rank, a wire dtype and a timeout per call. Frames carry
// the call's sequence number and a tag of group id, phase and sender rank,
// so consecutive calls never mix; early frames of the next call wait in
// the receive buffer.
//
//   - AllReduceSum with two members, or vectors up to DirectMaxBytes on the
//     wire: every member sends its vector to every other one and sums all
//     of them (one round, latency-bound decode sizes).
//   - Larger vectors and more members: reduce-scatter then all-gather, both
//     direct. Member j receives chunk j (32-value aligned) of every vector
//     and sums it, then sends the reduced chunk to all; each member moves
//     2(p-1)/p of the vector in two rounds.
//   - AllGather: every member sends its part to every other one; parts are
//     placed in rank order and may differ in length.
//
// Sums are taken in rank order (x0 + x1 + ...), and with a lossy dtype each
// member uses the decoded value of its own contribution, so every member
// ends with the same bits. A member that dies ends the others' call at once
// when its stream resets, else at the timeout, with an error naming its
// rank and address; the group is then unusable (a new group takes a new
// ID). Close aborts a pending call. One message carries at most
// DefaultMaxTensorFrame bytes: a larger vector (part, or chunk) is refused
// with ErrFrameTooLarge before anything is sent.
//
// Link probes (KindProbe, Endpoint.Probe) report the median round trip of
// small pings and the time to push a bounded number of bytes.
package transport
