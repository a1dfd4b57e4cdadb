package disagg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
)

// KV frame layout, version 1. Header fields are big-endian (as transport's
// tensor frames); the payload of a data frame is little-endian F16.
//
//	off  size field
//	0    2    magic "KV" (0x4B 0x56)
//	2    1    version (1)
//	3    1    kind: 1 data, 2 end, 3 abort, 4 ack
//	4    8    transfer ID
//	12   4    layer (global layer index)
//	16   4    first position
//	20   4    count of positions
//	24   2    first KV head (global numbering)
//	26   2    end KV head, exclusive
//	28   2    head dim
//	30   1    dtype (2 = f16, numbered as transport's tensor dtypes)
//	31   1    flags: bit 0 set = K only (V is a view of K: multi-head
//	          latent attention's cache); the other bits zero
//	32   4    payload length in bytes
//	36   n    payload
//	36+n 4    CRC-32C (Castagnoli) of bytes [0, 36+n): header and payload
//
// A data frame's payload is K then V of positions [pos, pos+count) and heads
// [lo, hi), each laid out [position][head][dim]: 4·count·(hi-lo)·dim bytes;
// with the K-only flag, K alone: 2·count·(hi-lo)·dim bytes.
// An end frame's payload is 24 bytes (big-endian): data frames sent (u64),
// their payload bytes (u64), layers sent (u32), positions per layer (u32).
// An abort frame's payload is the reason, at most MaxReason bytes of text.
// An ack frame has none. End, abort and ack frames have every header field
// after the transfer ID zero.
const (
	flagKOnly                = 1
	frameMagic0, frameMagic1 = 'K', 'V'
	// Version is the KV frame version this node speaks.
	Version    = 1
	headerLen  = 36
	trailerLen = 4
	endLen     = 24
)

// MaxFrame is the largest payload a frame may carry, and the default limit
// of ReadFrame. 16 MiB holds one layer of 4096 positions of 8 KV heads of
// dim 128 (Llama-3-8B/70B shaped), so a prefill chunk per layer is one
// frame and per-frame costs (header, checksum, a write) are negligible;
// yet a frame is small enough that a receiver buffering a few streams stays
// bounded and that one frame takes about 0.13 s on 1 Gbit/s, so layers
// still stream while prefill runs.
const MaxFrame = 16 << 20

// MaxReason bounds the reason text of an abort frame.
const MaxReason = 1024

// FrameKind is what a frame carries. Values are part of the wire format:
// append, never renumber.
type FrameKind uint8

// Frame kinds.
const (
	KindData  FrameKind = 1 // one layer's K and V for a position range and head range
	KindEnd   FrameKind = 2 // the sender sent everything; the payload has the totals
	KindAbort FrameKind = 3 // the transfer is abandoned; the payload is the reason
	KindAck   FrameKind = 4 // the receiver imported the whole transfer (receiver → sender)
)

// String names the kind ("data", "end", "abort", "ack").
func (k FrameKind) String() string {
	switch k {
	case KindData:
		return "data"
	case KindEnd:
		return "end"
	case KindAbort:
		return "abort"
	case KindAck:
		return "ack"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// DType is the element encoding of a data frame's payload. Values follow
// transport's tensor dtypes (1 f32, 2 f16, 3 q8_0); only F16 is accepted
// in KV frames, as the cache holds F16.
type DType uint8

// F16 is IEEE binary16, little-endian.
const F16 DType = 2

// String names the dtype ("f16"; "f32" and "q8_0" for the dtypes KV
// frames refuse).
func (d DType) String() string {
	switch d {
	case 1:
		return "f32"
	case F16:
		return "f16"
	case 3:
		return "q8_0"
	}
	return fmt.Sprintf("dtype(%d)", byte(d))
}

// Errors of the frame codec, matched with errors.Is; the error text says
// what exactly was wrong.
var (
	ErrFrameTooLarge = errors.New("kv frame too large")
	ErrChecksum      = errors.New("kv frame checksum mismatch")
	ErrTruncated     = errors.New("truncated kv frame")
	ErrBadFrame      = errors.New("malformed kv frame")
)

// frameError carries one of the sentinels above and a precise message.
type frameError struct {
	kind error
	msg  string
}

func (e *frameError) Error() string { return "kv frame: " + e.msg }
func (e *frameError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &frameError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Frame is one KV frame. Layer, Pos, Count, HeadLo, HeadHi, HeadDim and
// DType describe a data frame and are zero in the other kinds.
type Frame struct {
	Kind     FrameKind
	Transfer uint64 // the transfer this frame belongs to
	Layer    int    // global layer index
	Pos      int    // first position
	Count    int    // positions
	HeadLo   int    // first KV head carried, global numbering
	HeadHi   int    // end of the KV heads carried, exclusive
	HeadDim  int    // elements per head
	DType    DType
	// KOnly: the payload is K alone; the receiver's V is a view of K
	// (multi-head latent attention caches one latent row per token).
	KOnly   bool
	Payload []byte
}

// halves is how many of K and V a data frame's payload carries.
func (f *Frame) halves() int {
	if f.KOnly {
		return 1
	}
	return 2
}

// Totals is what an end frame reports, for the receiver to compare with
// what it took in.
type Totals struct {
	Frames    uint64 // data frames sent
	Bytes     uint64 // payload bytes of those frames
	Layers    uint32 // layers sent
	Positions uint32 // positions sent per layer
}

// EndFrame returns the end frame of a transfer.
func EndFrame(transfer uint64, t Totals) *Frame {
	p := make([]byte, endLen)
	binary.BigEndian.PutUint64(p[0:], t.Frames)
	binary.BigEndian.PutUint64(p[8:], t.Bytes)
	binary.BigEndian.PutUint32(p[16:], t.Layers)
	binary.BigEndian.PutUint32(p[20:], t.Positions)
	return &Frame{Kind: KindEnd, Transfer: transfer, Payload: p}
}

// AbortFrame returns the abort frame of a transfer; a reason longer than
// MaxReason bytes is cut.
func AbortFrame(transfer uint64, reason string) *Frame {
	if len(reason) > MaxReason {
		reason = reason[:MaxReason]
	}
	return &Frame{Kind: KindAbort, Transfer: transfer, Payload: []byte(reason)}
}

// AckFrame returns the frame a receiver sends once it imported a transfer.
func AckFrame(transfer uint64) *Frame {
	return &Frame{Kind: KindAck, Transfer: transfer}
}

// Totals decodes an end frame's totals.
func (f *Frame) Totals() (Totals, error) {
	if f.Kind != KindEnd || len(f.Payload) != endLen {
		return Totals{}, errorf(ErrBadFrame, "%v frame of transfer %d with %d payload bytes has no totals", f.Kind, f.Transfer, len(f.Payload))
	}
	p := f.Payload
	return Totals{
		Frames:    binary.BigEndian.Uint64(p[0:]),
		Bytes:     binary.BigEndian.Uint64(p[8:]),
		Layers:    binary.BigEndian.Uint32(p[16:]),
		Positions: binary.BigEndian.Uint32(p[20:]),
	}, nil
}

// Reason is an abort frame's reason ("" for other kinds).
func (f *Frame) Reason() string {
	if f.Kind != KindAbort {
		return ""
	}
	return string(f.Payload)
}

// Heads is the number of KV heads a data frame carries.
func (f *Frame) Heads() int { return f.HeadHi - f.HeadLo }

// DataLen is the payload length of a data frame of count positions and
// heads heads of dim headDim: K and V, F16 each.
func DataLen(count, heads, headDim int) int { return 4 * count * heads * headDim }

// dataLen is DataLen for f's kind of payload (half of it for K only).
func (f *Frame) dataLen(count, heads int) int {
	return DataLen(count, heads, f.HeadDim) / 2 * f.halves()
}

// MaxPositions is the most positions of heads heads of dim headDim one data
// frame may carry within limit payload bytes (MaxFrame if limit <= 0); a
// sender cuts a layer's positions into frames of at most this many.
func MaxPositions(heads, headDim, limit int) int {
	return (&Frame{HeadLo: 0, HeadHi: heads, HeadDim: headDim}).maxPositions(limit)
}

// maxPositions is MaxPositions for frames of f's heads and kind of payload
// (twice as many positions for K only).
func (f *Frame) maxPositions(limit int) int {
	if limit <= 0 {
		limit = MaxFrame
	}
	if f.Heads() <= 0 || f.HeadDim <= 0 {
		return 0
	}
	return limit / f.dataLen(1, f.Heads())
}

// String describes the frame in one line, for logs.
func (f *Frame) String() string {
	switch f.Kind {
	case KindData:
		return fmt.Sprintf("kv data transfer %d layer %d positions [%d,%d) heads [%d,%d)×%d %v, %s",
			f.Transfer, f.Layer, f.Pos, f.Pos+f.Count, f.HeadLo, f.HeadHi, f.HeadDim, f.DType, size(uint64(len(f.Payload))))
	case KindEnd:
		t, err := f.Totals()
		if err != nil {
			return fmt.Sprintf("kv end transfer %d (bad totals)", f.Transfer)
		}
		return fmt.Sprintf("kv end transfer %d: %d frames, %s, %d layers × %d positions", f.Transfer, t.Frames, size(t.Bytes), t.Layers, t.Positions)
	case KindAbort:
		return fmt.Sprintf("kv abort transfer %d: %q", f.Transfer, f.Reason())
	}
	return fmt.Sprintf("kv %v transfer %d", f.Kind, f.Transfer)
}

// SetKV fills a data frame's payload (reusing its capacity) from k and v,
// F16 bits laid out [position][head][dim] for the frame's positions and
// heads, as kv.Cache.ExportRange gives them. A K-only frame takes no v
// (nil).
func (f *Frame) SetKV(k, v []uint16) error {
	if err := f.checkShape(); err != nil {
		return err
	}
	n := f.Count * f.Heads() * f.HeadDim
	if len(k) != n || len(v) != n && !(f.KOnly && len(v) == 0) {
		return fmt.Errorf("kv frame: %d positions × heads [%d,%d) × dim %d take %d values each for k and v, got %d and %d",
			f.Count, f.HeadLo, f.HeadHi, f.HeadDim, n, len(k), len(v))
	}
	size := 2 * n * f.halves()
	if cap(f.Payload) >= size {
		f.Payload = f.Payload[:size]
	} else {
		f.Payload = make([]byte, size)
	}
	for i, x := range k {
		binary.LittleEndian.PutUint16(f.Payload[2*i:], x)
	}
	if f.KOnly {
		return nil
	}
	vp := f.Payload[2*n:]
	for i, x := range v {
		binary.LittleEndian.PutUint16(vp[2*i:], x)
	}
	return nil
}

// Overlap is the part of the global head range [a, b) a data frame carries:
// lo, hi and whether it is not empty.
func (f *Frame) Overlap(a, b int) (lo, hi int, ok bool) {
	lo, hi = max(a, f.HeadLo), min(b, f.HeadHi)
	return lo, hi, lo < hi
}

// DecodeHeads decodes the global heads [lo, hi) of a data frame, which must
// lie within the frame's heads, into k and v laid out [position][head][dim]
// (each of Count*(hi-lo)*HeadDim values), ready for kv.Cache.ImportRange.
// A decode member holding heads [a, b) takes Overlap(a, b) of each frame.
// A K-only frame fills k alone (v may be nil).
func (f *Frame) DecodeHeads(lo, hi int, k, v []uint16) error {
	if err := f.checkSub(lo, hi); err != nil {
		return err
	}
	n := f.Count * (hi - lo) * f.HeadDim
	if len(k) != n || len(v) != n && !(f.KOnly && len(v) == 0) {
		return fmt.Errorf("kv frame: heads [%d,%d) of %d positions × dim %d take %d values each for k and v, got %d and %d",
			lo, hi, f.Count, f.HeadDim, n, len(k), len(v))
	}
	half := len(f.Payload) / 2
	w, stride, skip := (hi-lo)*f.HeadDim, f.Heads()*f.HeadDim, (lo-f.HeadLo)*f.HeadDim
	for t := 0; t < f.Count; t++ {
		src := 2 * (t*stride + skip)
		for i := 0; i < w; i++ {
			k[t*w+i] = binary.LittleEndian.Uint16(f.Payload[src+2*i:])
			if !f.KOnly {
				v[t*w+i] = binary.LittleEndian.Uint16(f.Payload[half+src+2*i:])
			}
		}
	}
	return nil
}

// SliceHeads returns a data frame carrying only the global heads [lo, hi)
// of f (within f's heads), with a payload of its own: what a member that
// holds those heads needs of f.
func (f *Frame) SliceHeads(lo, hi int) (*Frame, error) {
	if err := f.checkSub(lo, hi); err != nil {
		return nil, err
	}
	g := *f
	g.HeadLo, g.HeadHi = lo, hi
	g.Payload = make([]byte, f.dataLen(f.Count, hi-lo))
	w, stride, skip := 2*(hi-lo)*f.HeadDim, 2*f.Heads()*f.HeadDim, 2*(lo-f.HeadLo)*f.HeadDim
	half, ghalf := len(f.Payload)/2, len(g.Payload)/2
	for t := 0; t < f.Count; t++ {
		copy(g.Payload[t*w:(t+1)*w], f.Payload[t*stride+skip:])
		if !f.KOnly {
			copy(g.Payload[ghalf+t*w:ghalf+(t+1)*w], f.Payload[half+t*stride+skip:])
		}
	}
	return &g, nil
}

// checkSub checks that f is a well-formed data frame and [lo, hi) a
// non-empty part of its heads.
func (f *Frame) checkSub(lo, hi int) error {
	if err := f.checkShape(); err != nil {
		return err
	}
	if want := f.dataLen(f.Count, f.Heads()); len(f.Payload) != want {
		return fmt.Errorf("kv frame: payload of %d bytes, %d positions × heads [%d,%d) × dim %d take %d",
			len(f.Payload), f.Count, f.HeadLo, f.HeadHi, f.HeadDim, want)
	}
	if lo < f.HeadLo || hi > f.HeadHi || lo >= hi {
		return fmt.Errorf("kv frame: heads [%d,%d) are not a part of the frame's heads [%d,%d)", lo, hi, f.HeadLo, f.HeadHi)
	}
	return nil
}

// checkShape checks a data frame's header fields (not its payload).
func (f *Frame) checkShape() error {
	if f.Kind != KindData {
		return errorf(ErrBadFrame, "%v frame carries no K and V", f.Kind)
	}
	return f.check(-1)
}

// check validates the header fields of f, and for data frames that the
// payload length matches them when plen >= 0. The same rules apply to
// frames written and read, so whatever WriteFrame writes ReadFrame accepts.
func (f *Frame) check(plen int64) error {
	switch f.Kind {
	case KindData:
		if f.DType != F16 {
			return errorf(ErrBadFrame, "dtype %d (%v) in transfer %d, only f16 (%d) is supported", byte(f.DType), f.DType, f.Transfer, byte(F16))
		}
		if f.Layer < 0 || int64(f.Layer) > math.MaxUint32 || f.Pos < 0 || f.Count <= 0 ||
			int64(f.Pos) > math.MaxUint32 || int64(f.Count) > math.MaxUint32-int64(f.Pos) {
			return errorf(ErrBadFrame, "transfer %d layer %d positions [%d,%d): layer and positions must fit 32 bits and the range must not be empty",
				f.Transfer, f.Layer, f.Pos, f.Pos+f.Count)
		}
		if f.HeadLo < 0 || f.HeadHi > math.MaxUint16 || f.HeadLo >= f.HeadHi || f.HeadDim <= 0 || f.HeadDim > math.MaxUint16 {
			return errorf(ErrBadFrame, "transfer %d layer %d heads [%d,%d) of dim %d: need 0 <= lo < hi <= 65535 and 0 < dim <= 65535",
				f.Transfer, f.Layer, f.HeadLo, f.HeadHi, f.HeadDim)
		}
		if plen >= 0 {
			// Below 2^32 · 2^16 · 2^16 · 4: no overflow in a uint64.
			if want := 2 * uint64(f.halves()) * uint64(f.Count) * uint64(f.Heads()) * uint64(f.HeadDim); uint64(plen) != want {
				what := "k and v"
				if f.KOnly {
					what = "k"
				}
				return errorf(ErrBadFrame, "transfer %d layer %d: payload of %d bytes, %d positions × %d heads × dim %d of f16 %s take %d",
					f.Transfer, f.Layer, plen, f.Count, f.Heads(), f.HeadDim, what, want)
			}
		}
		return nil
	case KindEnd, KindAbort, KindAck:
		if f.Layer != 0 || f.Pos != 0 || f.Count != 0 || f.HeadLo != 0 || f.HeadHi != 0 || f.HeadDim != 0 || f.DType != 0 {
			return errorf(ErrBadFrame, "%v frame of transfer %d with data fields set", f.Kind, f.Transfer)
		}
		switch {
		case f.Kind == KindEnd && plen >= 0 && plen != endLen:
			return errorf(ErrBadFrame, "end frame of transfer %d with %d payload bytes, want %d", f.Transfer, plen, endLen)
		case f.Kind == KindAbort && plen > MaxReason:
			return errorf(ErrBadFrame, "abort frame of transfer %d with a %d-byte reason, limit %d", f.Transfer, plen, MaxReason)
		case f.Kind == KindAck && plen > 0:
			return errorf(ErrBadFrame, "ack frame of transfer %d with %d payload bytes, want none", f.Transfer, plen)
		}
		return nil
	}
	return errorf(ErrBadFrame, "unknown frame kind %d in transfer %d", byte(f.Kind), f.Transfer)
}

// WriteFrame writes f to w: header, payload and checksum, in three writes
// (the payload is not copied). It refuses a frame ReadFrame would refuse,
// including a payload over MaxFrame, before writing anything.
func WriteFrame(w io.Writer, f *Frame) error {
	if err := f.check(int64(len(f.Payload))); err != nil {
		return err
	}
	if len(f.Payload) > MaxFrame {
		return errorf(ErrFrameTooLarge, "%s payload over the %s limit", size(uint64(len(f.Payload))), size(MaxFrame))
	}
	var hdr [headerLen]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = frameMagic0, frameMagic1, Version, byte(f.Kind)
	binary.BigEndian.PutUint64(hdr[4:], f.Transfer)
	binary.BigEndian.PutUint32(hdr[12:], uint32(f.Layer))
	binary.BigEndian.PutUint32(hdr[16:], uint32(f.Pos))
	binary.BigEndian.PutUint32(hdr[20:], uint32(f.Count))
	binary.BigEndian.PutUint16(hdr[24:], uint16(f.HeadLo))
	binary.BigEndian.PutUint16(hdr[26:], uint16(f.HeadHi))
	binary.BigEndian.PutUint16(hdr[28:], uint16(f.HeadDim))
	hdr[30], hdr[31] = byte(f.DType), 0
	if f.KOnly {
		hdr[31] = flagKOnly
	}
	binary.BigEndian.PutUint32(hdr[32:], uint32(len(f.Payload)))
	sum := crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, f.Payload)
	var tr [trailerLen]byte
	binary.BigEndian.PutUint32(tr[:], sum)
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	if len(f.Payload) > 0 {
		if _, err := w.Write(f.Payload); err != nil {
			return err
		}
	}
	_, err := w.Write(tr[:])
	return err
}

// ReadFrame reads one frame from r. A payload announced above max bytes
// (MaxFrame if max <= 0) is refused from the header, before anything is
// allocated for it. A stream that ends cleanly between frames gives io.EOF;
// one that ends inside a frame ErrTruncated; a checksum that does not match
// ErrChecksum; anything else inconsistent ErrBadFrame. After an error other
// than io.EOF the stream is out of step and must be abandoned.
func ReadFrame(r io.Reader, max int) (*Frame, error) {
	f, _, err := readFrame(r, max, nil)
	return f, err
}

// FrameReader reads frames from one stream into a buffer it reuses: a
// frame's payload is valid until the next Read.
type FrameReader struct {
	r   io.Reader
	max int
	buf []byte
}

// NewFrameReader reads frames of payloads up to max bytes (MaxFrame if
// max <= 0) from r.
func NewFrameReader(r io.Reader, max int) *FrameReader {
	return &FrameReader{r: r, max: max}
}

// Read reads the next frame, as ReadFrame does.
func (fr *FrameReader) Read() (*Frame, error) {
	f, buf, err := readFrame(fr.r, fr.max, fr.buf)
	if buf != nil {
		fr.buf = buf
	}
	return f, err
}

// readFrame reads one frame, its payload into buf when buf has the room,
// and returns the buffer it used.
func readFrame(r io.Reader, max int, buf []byte) (*Frame, []byte, error) {
	if max <= 0 {
		max = MaxFrame
	}
	var hdr [headerLen]byte
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return nil, nil, io.EOF
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, nil, errorf(ErrTruncated, "stream ended %d bytes into a %d-byte header", n, headerLen)
		}
		return nil, nil, err
	}
	if hdr[0] != frameMagic0 || hdr[1] != frameMagic1 {
		return nil, nil, errorf(ErrBadFrame, "bad magic %#02x%02x (want %q): not a kv frame", hdr[0], hdr[1], string([]byte{frameMagic0, frameMagic1}))
	}
	if hdr[2] != Version {
		return nil, nil, errorf(ErrBadFrame, "version %d, this node speaks %d", hdr[2], Version)
	}
	plen := uint64(binary.BigEndian.Uint32(hdr[32:]))
	if plen > uint64(max) {
		return nil, nil, errorf(ErrFrameTooLarge, "%s payload over the %s limit", size(plen), size(uint64(max)))
	}
	f := &Frame{
		Kind:     FrameKind(hdr[3]),
		Transfer: binary.BigEndian.Uint64(hdr[4:]),
		Layer:    int(binary.BigEndian.Uint32(hdr[12:])),
		Pos:      int(binary.BigEndian.Uint32(hdr[16:])),
		Count:    int(binary.BigEndian.Uint32(hdr[20:])),
		HeadLo:   int(binary.BigEndian.Uint16(hdr[24:])),
		HeadHi:   int(binary.BigEndian.Uint16(hdr[26:])),
		HeadDim:  int(binary.BigEndian.Uint16(hdr[28:])),
		DType:    DType(hdr[30]),
	}
	f.KOnly = hdr[31]&flagKOnly != 0 && f.Kind == KindData
	if hdr[31] != 0 && !f.KOnly || hdr[31]&^flagKOnly != 0 {
		return nil, nil, errorf(ErrBadFrame, "flags %#02x in a %v frame of transfer %d (only bit 0, K only, on a data frame)", hdr[31], f.Kind, f.Transfer)
	}
	if err := f.check(int64(plen)); err != nil {
		return nil, nil, err
	}
	need := int(plen) + trailerLen
	if cap(buf) >= need {
		buf = buf[:need]
	} else {
		buf = make([]byte, need)
	}
	if n, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, nil, errorf(ErrTruncated, "stream ended %d bytes into the %d-byte body of a %v frame of transfer %d", n, need, f.Kind, f.Transfer)
		}
		return nil, nil, err
	}
	f.Payload = buf[:plen:plen]
	got := crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, f.Payload)
	if want := binary.BigEndian.Uint32(buf[plen:]); got != want {
		return nil, nil, errorf(ErrChecksum, "checksum mismatch in a %v frame of transfer %d: crc32c %08x, frame says %08x", f.Kind, f.Transfer, got, want)
	}
	if plen == 0 {
		f.Payload = nil
	}
	return f, buf, nil
}

// size formats a byte count exactly: "16 MiB", "3 KiB", "1000 B".
func size(n uint64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
