package device

import (
	"shoal/engine/kernels"
	"shoal/engine/kv"
)

// Device is a place layers run: the CPU, or a GPU backend.
type Device interface {
	// Name says which device this is ("cpu", "vulkan:0", ...).
	Name() string
	// Load places the layer range of l on the device (uploading or
	// repacking its weights as the device needs) and allocates its KV
	// store. The host weights must stay valid while the Range is used.
	Load(l Load) (Range, error)
}

// Load is what a device loads: a layer range of a model, as a member of a
// tensor-parallel group holding Part of each layer.
type Load struct {
	Spec Spec
	// Layers holds layers [Lo,Hi): Layers[i] is layer Lo+i.
	Layers []Layer
	Lo, Hi int
	// OutputNorm and Output are the output head; nil when not held.
	OutputNorm []float32
	Output     *kernels.Matrix
	Part       Part
	// Coll connects the members of a tensor-parallel group (nil for a
	// single member). A Range calls it only within a half whose column
	// split is gathered (see Group); the all-reduce that ends a half is
	// the caller's.
	Coll Collective
	// KV sizes the store of the range's K and V rows (FirstLayer = Lo,
	// KVDim = the held KV heads × HeadDim, BlockSize set).
	KV kv.Config
	// Threads is the number of CPU threads a device may use (all if 0).
	Threads int
}

// Range is a layer range loaded on a device. It runs one batch at a time:
// Begin, then the per-layer ops (or Forward) on that batch, in layer order.
// Hidden states cross the seam as host float32 rows ([n][NEmbd]): that is
// where a member hands them to the collective or the next stage. Not safe
// for concurrent use.
type Range interface {
	// KV is the store holding the range's K and V rows; the host wraps it
	// in a kv.Cache for the block tables.
	KV() kv.Store
	// SetGroup gives the per-member widths of a tensor-parallel group,
	// known after the members' handshake, before the first batch.
	SetGroup(g Group)
	// Begin prepares the positions and block tables of a batch.
	Begin(b *Batch) error
	// Attention runs the attention half of layer l on x ([n][NEmbd], not
	// changed): norm, q/k/v, RoPE, storing K and V, attention and the
	// attn_output product, written to out. partial reports that out is
	// this member's share, for the caller to all-reduce before Residual.
	Attention(l int, x, out []float32) (partial bool, err error)
	// FFN runs the FFN half (dense, or the routed and shared experts) of
	// layer l on x into out, partial as for Attention.
	FFN(l int, x, out []float32) (partial bool, err error)
	// Residual adds the complete output of a half of layer l (attention:
	// with its bias) to x. out is scratch afterwards.
	Residual(l int, h Half, x, out []float32)
	// Forward runs layers [lo,hi) whole on x in place: for a member with
	// no tensor-parallel group, the halves and residuals composed.
	Forward(lo, hi int, x []float32) error
	// Logits applies the output norm and head to the rows of x listed in
	// rows, writing len(rows)×vocabulary values to out.
	Logits(x []float32, rows []int, out []float32) error
	// Hold keeps the device ready for a burst of short ops (the CPU's
	// workers spinning) until Release.
	Hold()
	Release()
	// Close frees what the device holds for the range.
	Close()
}

// Half names a half of a layer.
type Half int

// The two halves of a transformer layer.
const (
	AttnHalf Half = iota
	FFNHalf
)

// Batch is what a device needs of a batch: per chunk of consecutive tokens
// of one sequence, its first position, its length and the sequence's block
// table (which covers the chunk's positions).
type Batch struct {
	Chunks []Chunk
}

// Chunk is N tokens at positions [Pos,Pos+N) of a sequence whose KV rows
// are in Blocks (host block table, not modified).
type Chunk struct {
	Pos, N int
	Blocks []int32
}
