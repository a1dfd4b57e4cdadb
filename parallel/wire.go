package parallel

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"shoal/engine/quant"
	"shoal/engine/sample"
	"shoal/internal/version"
	"shoal/transport"
)

// RPC methods a Host serves (on the endpoint's KindRPC server).
const (
	methodOpen  = "dist.open"
	methodStep  = "dist.step"
	methodFree  = "dist.free"
	methodAbort = "dist.abort"
	methodClose = "dist.close"
)

// maxFramePayload bounds the payload of one tensor frame the package sends;
// larger tensors go as several frames of whole rows (same id and tag, in
// order).
const maxFramePayload = 8 << 20

// memberAddr names a member of a session on its host.
type memberAddr struct {
	Session string `json:"session"`
	Key     string `json:"key"` // model/version/pool/stage/rank
}

// openReq opens a session on a member.
type openReq struct {
	memberAddr
	Version     uint64          `json:"version"`
	Pool        string          `json:"pool"`
	Stage       int             `json:"stage"`
	Rank        int             `json:"rank"`
	TimeoutMs   int64           `json:"timeout_ms"`
	Activations transport.DType `json:"activations"`
	Collectives transport.DType `json:"collectives"`
	Driver      string          `json:"driver"` // address the logits go to
}

type wireChunk struct {
	Seq int32 `json:"seq"`
	Pos int   `json:"pos"`
	N   int   `json:"n"`
	// Cut: the sequence was cut back to Pos since its last step (drafts
	// the model did not accept); the member drops its KV from Pos on
	// before the chunk. Without it, a chunk must start where the
	// member's sequence ends.
	Cut bool `json:"cut,omitempty"`
}

// stepReq is one step as a member sees it: every member gets the chunks;
// members that embed get the tokens; the output member gets the rows.
type stepReq struct {
	memberAddr
	Step   uint64      `json:"step"`
	Chunks []wireChunk `json:"chunks"`
	Tokens []int32     `json:"tokens,omitempty"`
	Rows   []int       `json:"rows,omitempty"`
	// Sample, for the output member, asks it to sample each row (one
	// request per row) and reply with the tokens instead of sending the
	// logits.
	Sample []sample.Request `json:"sample,omitempty"`
	// Handoff, in a step of a prefill pool, sends the chunk's KV to a
	// decode session (see Session.Handoff).
	Handoff *handoffReq `json:"handoff,omitempty"`
}

// traffic is the payload bytes a member sent during a step.
type traffic struct {
	Activations int64 `json:"act"`
	Collectives int64 `json:"coll"`
	Logits      int64 `json:"logits"`
	// ComputeUs is the time the member's layers (and logits) took this
	// step, its waits for the input and inside the collectives excluded.
	ComputeUs int64 `json:"compute_us,omitempty"`
	// Sampled are the output member's tokens when the step asked it to
	// sample (stepReq.Sample), in row order.
	Sampled []sample.Result `json:"sampled,omitempty"`
	// KVError, in a handoff step, is why the member could not send all of
	// its KV (it still ran its layers, so the session stays usable).
	KVError string `json:"kv_error,omitempty"`
}

type freeReq struct {
	memberAddr
	Seqs []int32 `json:"seqs"`
}

type abortReq struct {
	memberAddr
	Reason string `json:"reason"`
}

// Tags of the package's activation frames, by session.
func tagEmbed(session string) string             { return session + "/embd" }
func tagHidden(session string, stage int) string { return fmt.Sprintf("%s/h%d", session, stage) }
func tagLogits(session string) string            { return session + "/logits" }

// sendRows sends rows x cols values of data to addr as frames of whole
// rows of at most maxFramePayload bytes, returning the payload bytes sent
// over the network (none to this node itself: Mailbox.Local).
func sendRows(ctx context.Context, mb *transport.Mailbox, addr string, id uint64, tag string, dt transport.DType, rows, cols int, data []float32) (int64, error) {
	per := rowsPerFrame(dt, cols)
	var sent int64
	local := mb.Local(ctx, addr)
	for r := 0; r < rows; r += per {
		n := min(per, rows-r)
		if err := mb.Send(ctx, addr, id, tag, dt, n, cols, data[r*cols:(r+n)*cols]); err != nil {
			return sent, err
		}
		if !local {
			sent += int64(dt.EncodedLen(n * cols))
		}
	}
	return sent, nil
}

// roundRows replaces data by what a receiver of sendRows decodes; tmp is
// scratch space, returned grown.
func roundRows(dt transport.DType, rows, cols int, data []float32, tmp []byte) []byte {
	per := rowsPerFrame(dt, cols)
	for r := 0; r < rows; r += per {
		n := min(per, rows-r)
		tmp = transport.RoundTrip(dt, data[r*cols:(r+n)*cols], tmp)
	}
	return tmp
}

func rowsPerFrame(dt transport.DType, cols int) int {
	return max(1, maxFramePayload/max(1, dt.EncodedLen(cols)))
}

// recvRows receives what sendRows sent: rows x cols values into dst.
func recvRows(ctx context.Context, mb *transport.Mailbox, id uint64, tag string, rows, cols int, dst []float32) error {
	got := 0
	for got < rows {
		n, c, err := mb.Recv(ctx, "", id, tag, dst[got*cols:rows*cols])
		if err != nil {
			return err
		}
		if c != cols || n <= 0 || got+n > rows {
			return fmt.Errorf("dist: %q #%d: received %d x %d values, want %d rows of %d", tag, id, n, c, rows-got, cols)
		}
		got += n
	}
	return nil
}

// countingGroup is a model.Collective over two transport groups of the
// same members: all-reduces in the session's wire dtype, all-gathers
// exact (F32), since the runner's handshake all-gathers its layer range
// and slice as floats, which Q8_0 would not carry exactly. It counts the
// payload bytes this member sends, following the group's choice of
// algorithm.
type countingGroup struct {
	sum, gather *transport.Group
	dt          transport.DType
	bytes       atomic.Int64
	waited      atomic.Int64 // nanoseconds inside the collectives
}

func (c *countingGroup) Rank() int { return c.sum.Rank() }
func (c *countingGroup) Size() int { return c.sum.Size() }

// Overlaps reports whether every member runs a tensor-parallel step of
// many tokens in overlapped parts (model.Runner): builds of protocol 3
// and later do, older ones make one all-reduce of the whole step per half.
func (c *countingGroup) Overlaps() bool { return c.sum.Protocol() >= version.OverlapProtocol }

func (c *countingGroup) close() {
	c.sum.Close()
	c.gather.Close()
}

func (c *countingGroup) AllReduceSum(x []float32) error {
	n, p, rank := len(x), c.sum.Size(), c.sum.Rank()
	switch {
	case n == 0 || p == 1:
	case p == 2 || c.dt.EncodedLen(n) <= transport.DefaultDirectMaxBytes:
		c.bytes.Add(int64((p - 1) * c.dt.EncodedLen(n)))
	default: // reduce-scatter: the others' chunks; all-gather: ours to each
		per := n / p
		if per >= quant.QK {
			per -= per % quant.QK
		}
		chunk := func(i int) int {
			if i == p-1 {
				return n - i*per
			}
			return per
		}
		for j := range p {
			if j != rank {
				c.bytes.Add(int64(c.dt.EncodedLen(chunk(j)) + c.dt.EncodedLen(chunk(rank))))
			}
		}
	}
	defer c.timed(time.Now())
	return c.sum.AllReduceSum(x)
}

func (c *countingGroup) timed(t0 time.Time) { c.waited.Add(int64(time.Since(t0))) }

func (c *countingGroup) AllGather(part, out []float32) error {
	c.bytes.Add(int64((c.gather.Size() - 1) * transport.F32.EncodedLen(len(part))))
	defer c.timed(time.Now())
	return c.gather.AllGather(part, out)
}
