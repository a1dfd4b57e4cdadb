package disagg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// stamp is a distinct F16 bit pattern per element.
func stamp(isV bool, pos, head, d int) uint16 {
	x := uint16(pos*97 + head*11 + d)
	if isV {
		x ^= 0x8000
	}
	return x
}

// dataFrame builds a data frame for global heads [lo,hi) of dim dim and
// positions [pos,pos+count) with stamped K and V.
func dataFrame(t testing.TB, transfer uint64, layer, pos, count, lo, hi, dim int) *Frame {
	t.Helper()
	f := &Frame{Kind: KindData, Transfer: transfer, Layer: layer, Pos: pos, Count: count, HeadLo: lo, HeadHi: hi, HeadDim: dim, DType: F16}
	var k, v []uint16
	for p := pos; p < pos+count; p++ {
		for h := lo; h < hi; h++ {
			for d := 0; d < dim; d++ {
				k = append(k, stamp(false, p, h, d))
				v = append(v, stamp(true, p, h, d))
			}
		}
	}
	if err := f.SetKV(k, v); err != nil {
		t.Fatal(err)
	}
	return f
}

func encode(t testing.TB, f *Frame) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteFrame(&b, f); err != nil {
		t.Fatalf("write %v: %v", f, err)
	}
	return b.Bytes()
}

// TestFrameGolden pins the layout byte by byte.
func TestFrameGolden(t *testing.T) {
	f := &Frame{Kind: KindData, Transfer: 0x0102030405060708, Layer: 7, Pos: 300, Count: 1, HeadLo: 2, HeadHi: 3, HeadDim: 2, DType: F16}
	if err := f.SetKV([]uint16{0x3c00, 0x4000}, []uint16{0xbc00, 0x0001}); err != nil {
		t.Fatal(err)
	}
	want := []byte{
		'K', 'V', 1, 1, // magic, version, kind data
		1, 2, 3, 4, 5, 6, 7, 8, // transfer
		0, 0, 0, 7, // layer
		0, 0, 1, 44, // first position 300
		0, 0, 0, 1, // count
		0, 2, 0, 3, // heads [2,3)
		0, 2, // head dim
		2, 0, // dtype f16, flags
		0, 0, 0, 8, // payload length
		0x00, 0x3c, 0x00, 0x40, // K, little-endian f16
		0x00, 0xbc, 0x01, 0x00, // V
	}
	want = binary.BigEndian.AppendUint32(want, crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)))
	if got := encode(t, f); !bytes.Equal(got, want) {
		t.Fatalf("encoding\n got % x\nwant % x", got, want)
	}
}

func TestFrameRoundTrip(t *testing.T) {
	frames := []*Frame{
		dataFrame(t, 1, 0, 0, 5, 0, 4, 3),
		dataFrame(t, 1, 21, 4096, 17, 6, 8, 64),
		EndFrame(1, Totals{Frames: 44, Bytes: 1 << 33, Layers: 22, Positions: 4113}),
		AbortFrame(2, "prefill member node-3 lost"),
		AbortFrame(3, ""),
		AckFrame(1),
	}
	var stream bytes.Buffer
	for _, f := range frames {
		stream.Write(encode(t, f))
	}
	fr := NewFrameReader(bytes.NewReader(stream.Bytes()), 0)
	for i, want := range frames {
		got, err := fr.Read()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		w := *want
		if len(w.Payload) == 0 {
			w.Payload = nil
		}
		if !reflect.DeepEqual(got, &w) {
			t.Fatalf("frame %d:\n got %+v\nwant %+v", i, got, &w)
		}
	}
	if _, err := fr.Read(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}

	end, err := ReadFrame(bytes.NewReader(encode(t, frames[2])), 0)
	if err != nil {
		t.Fatal(err)
	}
	if tot, err := end.Totals(); err != nil || tot != (Totals{Frames: 44, Bytes: 1 << 33, Layers: 22, Positions: 4113}) {
		t.Fatalf("totals %+v %v", tot, err)
	}
	if _, err := frames[0].Totals(); err == nil {
		t.Fatal("a data frame has totals")
	}
	if r := frames[3].Reason(); r != "prefill member node-3 lost" {
		t.Fatalf("reason %q", r)
	}
	if r := AbortFrame(1, strings.Repeat("x", 5000)).Reason(); len(r) != MaxReason {
		t.Fatalf("a long reason is kept at %d bytes, want %d", len(r), MaxReason)
	}
	if s := frames[1].String(); s != "kv data transfer 1 layer 21 positions [4096,4113) heads [6,8)×64 f16, 8704 B" {
		t.Fatalf("String: %s", s)
	}
}

// header rewrites an encoded frame's header field and fixes its checksum,
// so that the reader gets past the checksum to the check under test (or,
// with fix false, leaves the checksum stale).
func patch(b []byte, fix bool, edit func(h []byte)) []byte {
	b = append([]byte(nil), b...)
	edit(b)
	if fix {
		n := len(b) - trailerLen
		binary.BigEndian.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	}
	return b
}

func TestReadFrameRejects(t *testing.T) {
	data := encode(t, dataFrame(t, 9, 3, 0, 4, 0, 2, 8))
	end := encode(t, EndFrame(9, Totals{Frames: 1}))
	ack := encode(t, AckFrame(9))
	abort := encode(t, AbortFrame(9, "x"))
	put16 := func(off int, v uint16) func([]byte) { return func(h []byte) { binary.BigEndian.PutUint16(h[off:], v) } }
	put32 := func(off int, v uint32) func([]byte) { return func(h []byte) { binary.BigEndian.PutUint32(h[off:], v) } }
	cases := []struct {
		name  string
		in    []byte
		max   int
		err   error
		text  string
		reads int // bytes the reader may take, 0 for any
	}{
		{"bad magic", patch(data, true, func(h []byte) { h[0] = 'Q' }), 0, ErrBadFrame, `bad magic 0x5156 (want "KV"): not a kv frame`, headerLen},
		{"version", patch(data, true, func(h []byte) { h[2] = 3 }), 0, ErrBadFrame, "kv frame: version 3, this node speaks 1", headerLen},
		{"over the default limit", patch(data[:headerLen], false, put32(32, 40<<20)), 0, ErrFrameTooLarge, "kv frame: 40 MiB payload over the 16 MiB limit", headerLen},
		{"over a given limit", data, 64, ErrFrameTooLarge, "kv frame: 256 B payload over the 64 B limit", headerLen},
		{"largest announced", patch(data[:headerLen], false, put32(32, 0xFFFFFFFF)), 0, ErrFrameTooLarge, "4294967295 B payload over the 16 MiB limit", headerLen},
		{"dtype f32", patch(data, true, func(h []byte) { h[30] = 1 }), 0, ErrBadFrame, "dtype 1 (f32) in transfer 9, only f16 (2) is supported", headerLen},
		{"dtype unknown", patch(data, true, func(h []byte) { h[30] = 77 }), 0, ErrBadFrame, "dtype 77 (dtype(77))", headerLen},
		{"unknown kind", patch(data, true, func(h []byte) { h[3] = 9 }), 0, ErrBadFrame, "unknown frame kind 9 in transfer 9", headerLen},
		{"kind zero", patch(data, true, func(h []byte) { h[3] = 0 }), 0, ErrBadFrame, "unknown frame kind 0", headerLen},
		{"unknown flag", patch(data, true, func(h []byte) { h[31] = 2 }), 0, ErrBadFrame, "flags 0x02 in a data frame", headerLen},
		{"K-only, K and V long", patch(data, true, func(h []byte) { h[31] = 1 }), 0, ErrBadFrame, "of f16 k take", headerLen},
		{"payload not the shape", patch(data, true, put32(20, 3)), 0, ErrBadFrame, "payload of 256 bytes, 3 positions × 2 heads × dim 8 of f16 k and v take 192", headerLen},
		{"no positions", patch(data, true, put32(20, 0)), 0, ErrBadFrame, "positions [0,0)", headerLen},
		{"positions past 2^32", patch(data, true, put32(16, 0xFFFFFFFE)), 0, ErrBadFrame, "must fit 32 bits", headerLen},
		{"heads inverted", patch(data, true, put16(24, 2)), 0, ErrBadFrame, "heads [2,2) of dim 8", headerLen},
		{"head dim zero", patch(data, true, put16(28, 0)), 0, ErrBadFrame, "of dim 0", headerLen},
		{"end with data fields", patch(end, true, put32(12, 1)), 0, ErrBadFrame, "end frame of transfer 9 with data fields set", headerLen},
		{"end of the wrong length", patch(data, true, func(h []byte) { h[3] = byte(KindEnd); clear(h[12:32]) }), 0, ErrBadFrame, "end frame of transfer 9 with 256 payload bytes, want 24", headerLen},
		{"ack with payload", patch(end, true, func(h []byte) { h[3] = byte(KindAck) }), 0, ErrBadFrame, "ack frame of transfer 9 with 24 payload bytes, want none", headerLen},
		{"abort reason too long", patch(abort[:headerLen], false, put32(32, MaxReason+1)), 0, ErrBadFrame, "abort frame of transfer 9 with a 1025-byte reason, limit 1024", headerLen},
		{"payload flipped", patch(data, false, func(h []byte) { h[headerLen+5] ^= 0x10 }), 0, ErrChecksum, "kv frame: checksum mismatch in a data frame of transfer 9", 0},
		{"layer flipped", patch(data, false, func(h []byte) { h[15] ^= 1 }), 0, ErrChecksum, "checksum mismatch", 0},
		{"checksum flipped", patch(ack, false, func(h []byte) { h[len(h)-1] ^= 1 }), 0, ErrChecksum, "checksum mismatch in a ack frame", 0},
		{"cut in the header", data[:20], 0, ErrTruncated, "stream ended 20 bytes into a 36-byte header", 0},
		{"cut in the payload", data[:headerLen+10], 0, ErrTruncated, "stream ended 10 bytes into the 260-byte body of a data frame of transfer 9", 0},
		{"cut in the checksum", data[:len(data)-1], 0, ErrTruncated, "stream ended 259 bytes into the 260-byte body", 0},
	}
	for _, tc := range cases {
		cr := &countingReader{r: bytes.NewReader(tc.in)}
		f, err := ReadFrame(cr, tc.max)
		if f != nil || !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: frame %v, error %v; want %v containing %q", tc.name, f, err, tc.err, tc.text)
			continue
		}
		if tc.reads > 0 && cr.n != tc.reads {
			t.Errorf("%s: reader took %d bytes, want %d (the header only)", tc.name, cr.n, tc.reads)
		}
	}
	if _, err := ReadFrame(bytes.NewReader(nil), 0); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestOversizeNotAllocated: a header announcing the largest payload costs
// the reader no payload allocation.
func TestOversizeNotAllocated(t *testing.T) {
	hdr := patch(encode(t, dataFrame(t, 1, 0, 0, 1, 0, 1, 1))[:headerLen], false, func(h []byte) {
		binary.BigEndian.PutUint32(h[32:], 0xFFFFFFFF)
	})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < 100; i++ {
		if _, err := ReadFrame(bytes.NewReader(hdr), 0); !errors.Is(err, ErrFrameTooLarge) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Fatalf("100 refused oversized frames allocated %d bytes", d)
	}
}

func TestWriteFrameRefuses(t *testing.T) {
	big := &Frame{Kind: KindData, Transfer: 4, Count: MaxFrame/8 + 1, HeadLo: 0, HeadHi: 1, HeadDim: 2, DType: F16}
	big.Payload = make([]byte, DataLen(big.Count, 1, 2))
	good := dataFrame(t, 4, 0, 0, 2, 0, 2, 2)
	cases := []struct {
		name string
		f    *Frame
		err  error
		text string
	}{
		{"over MaxFrame", big, ErrFrameTooLarge, "kv frame: 16777224 B payload over the 16 MiB limit"},
		{"f32", &Frame{Kind: KindData, Count: 1, HeadHi: 1, HeadDim: 1, DType: 1, Payload: make([]byte, 8)}, ErrBadFrame, "only f16 (2) is supported"},
		{"short payload", &Frame{Kind: KindData, Count: 2, HeadHi: 2, HeadDim: 2, DType: F16, Payload: good.Payload[:10]}, ErrBadFrame, "payload of 10 bytes"},
		{"negative layer", &Frame{Kind: KindData, Layer: -1, Count: 1, HeadHi: 1, HeadDim: 1, DType: F16, Payload: make([]byte, 4)}, ErrBadFrame, "layer -1"},
		{"layer over 32 bits", &Frame{Kind: KindData, Layer: 1 << 32, Count: 1, HeadHi: 1, HeadDim: 1, DType: F16, Payload: make([]byte, 4)}, ErrBadFrame, "must fit 32 bits"},
		{"huge position and count", &Frame{Kind: KindData, Pos: 1 << 62, Count: 1 << 62, HeadHi: 1, HeadDim: 1, DType: F16, Payload: make([]byte, 4)}, ErrBadFrame, "must fit 32 bits"},
		{"heads over 16 bits", &Frame{Kind: KindData, Count: 1, HeadHi: 1 << 16, HeadDim: 1, DType: F16, Payload: make([]byte, 4)}, ErrBadFrame, "hi <= 65535"},
		{"abort with a long reason", &Frame{Kind: KindAbort, Payload: make([]byte, MaxReason+1)}, ErrBadFrame, "1025-byte reason"},
		{"end with a layer", &Frame{Kind: KindEnd, Layer: 2, Payload: make([]byte, endLen)}, ErrBadFrame, "with data fields set"},
		{"kind zero", &Frame{}, ErrBadFrame, "unknown frame kind 0"},
	}
	for _, tc := range cases {
		var b bytes.Buffer
		err := WriteFrame(&b, tc.f)
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.err, tc.text)
		}
		if b.Len() != 0 {
			t.Errorf("%s: %d bytes written before the refusal", tc.name, b.Len())
		}
	}
	// The largest frame MaxFrame allows is written and read back.
	big.Count = MaxFrame / 8
	big.Payload = big.Payload[:MaxFrame]
	if f, err := ReadFrame(bytes.NewReader(encode(t, big)), 0); err != nil || len(f.Payload) != MaxFrame {
		t.Fatalf("a frame of exactly MaxFrame: %v", err)
	}
}

func TestHeadSlicing(t *testing.T) {
	const count, dim = 5, 3
	f := dataFrame(t, 1, 4, 10, count, 2, 6, dim) // global heads [2,6)
	for _, sub := range [][2]int{{2, 6}, {3, 5}, {2, 3}, {5, 6}, {4, 6}} {
		lo, hi := sub[0], sub[1]
		k, v := make([]uint16, count*(hi-lo)*dim), make([]uint16, count*(hi-lo)*dim)
		if err := f.DecodeHeads(lo, hi, k, v); err != nil {
			t.Fatalf("decode [%d,%d): %v", lo, hi, err)
		}
		g, err := f.SliceHeads(lo, hi)
		if err != nil {
			t.Fatalf("slice [%d,%d): %v", lo, hi, err)
		}
		if g.HeadLo != lo || g.HeadHi != hi || g.Layer != 4 || g.Pos != 10 || g.Count != count || len(g.Payload) != DataLen(count, hi-lo, dim) {
			t.Fatalf("slice [%d,%d): header %+v", lo, hi, g)
		}
		gk, gv := make([]uint16, len(k)), make([]uint16, len(v))
		if err := g.DecodeHeads(lo, hi, gk, gv); err != nil {
			t.Fatal(err)
		}
		i := 0
		for p := 10; p < 10+count; p++ {
			for h := lo; h < hi; h++ {
				for d := 0; d < dim; d++ {
					if k[i] != stamp(false, p, h, d) || v[i] != stamp(true, p, h, d) {
						t.Fatalf("decode [%d,%d) pos %d head %d dim %d: k %#x v %#x", lo, hi, p, h, d, k[i], v[i])
					}
					if gk[i] != k[i] || gv[i] != v[i] {
						t.Fatalf("slice [%d,%d) pos %d head %d dim %d differs from decode", lo, hi, p, h, d)
					}
					i++
				}
			}
		}
		// A sliced frame is a frame like any other.
		if _, err := ReadFrame(bytes.NewReader(encode(t, g)), 0); err != nil {
			t.Fatalf("slice [%d,%d) does not read back: %v", lo, hi, err)
		}
	}
	for _, sub := range [][2]int{{1, 3}, {5, 7}, {3, 3}, {4, 3}, {0, 9}} {
		if _, err := f.SliceHeads(sub[0], sub[1]); err == nil || !strings.Contains(err.Error(), "not a part of the frame's heads [2,6)") {
			t.Errorf("slice %v: %v", sub, err)
		}
		if err := f.DecodeHeads(sub[0], sub[1], nil, nil); err == nil {
			t.Errorf("decode %v accepted", sub)
		}
	}
	if err := f.DecodeHeads(2, 4, make([]uint16, 29), make([]uint16, 30)); err == nil || !strings.Contains(err.Error(), "take 30 values each for k and v, got 29 and 30") {
		t.Errorf("short k: %v", err)
	}
	if _, err := AckFrame(1).SliceHeads(0, 1); !errors.Is(err, ErrBadFrame) {
		t.Errorf("slicing an ack frame: %v", err)
	}
	if err := f.SetKV(make([]uint16, 3), make([]uint16, 3)); err == nil {
		t.Error("SetKV with the wrong lengths accepted")
	}

	for _, tc := range []struct {
		a, b, lo, hi int
		ok           bool
	}{
		{0, 4, 2, 4, true}, {3, 5, 3, 5, true}, {4, 8, 4, 6, true}, {0, 2, 2, 2, false}, {6, 8, 6, 6, false}, {0, 10, 2, 6, true},
	} {
		lo, hi, ok := f.Overlap(tc.a, tc.b)
		if lo != tc.lo || hi != tc.hi || ok != tc.ok {
			t.Errorf("Overlap(%d,%d) = %d,%d,%v want %d,%d,%v", tc.a, tc.b, lo, hi, ok, tc.lo, tc.hi, tc.ok)
		}
	}
}

func TestMaxPositions(t *testing.T) {
	for _, tc := range []struct{ heads, dim, limit, want int }{
		{8, 128, 0, 4096},      // Llama-3-8B shaped
		{4, 64, 0, 16384},      // TinyLlama shaped
		{8, 128, 1 << 20, 256}, // a smaller limit
		{3, 5, 100, 1},         // 60 bytes a position
		{3, 5, 59, 0},          // not even one
		{0, 128, 0, 0},         // no heads
	} {
		got := MaxPositions(tc.heads, tc.dim, tc.limit)
		if got != tc.want {
			t.Errorf("MaxPositions(%d, %d, %d) = %d, want %d", tc.heads, tc.dim, tc.limit, got, tc.want)
		}
		if limit := tc.limit; got > 0 && (limit <= 0 && DataLen(got, tc.heads, tc.dim) > MaxFrame || limit > 0 && DataLen(got, tc.heads, tc.dim) > limit) {
			t.Errorf("MaxPositions(%d, %d, %d) = %d does not fit", tc.heads, tc.dim, tc.limit, got)
		}
	}
}

// FuzzReadFrame: the reader never panics, and every frame it accepts is
// written back to the very bytes it read, then read again to the same frame.
func FuzzReadFrame(f *testing.F) {
	seeds := [][]byte{
		encode(f, dataFrame(f, 1, 0, 0, 3, 0, 2, 4)),
		encode(f, dataFrame(f, 7, 31, 100, 1, 5, 8, 2)),
		encode(f, EndFrame(1, Totals{Frames: 3, Bytes: 99, Layers: 2, Positions: 7})),
		encode(f, AbortFrame(2, "out of blocks")),
		encode(f, AckFrame(3)),
		append(encode(f, AckFrame(3)), encode(f, AbortFrame(3, "again"))...),
		[]byte("KV"),
		{},
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkStream(t, data)
		// The same bytes with the first frame's checksum made right, so that
		// mutated headers and payloads get past it and are round-tripped.
		if len(data) >= headerLen {
			if end := headerLen + int(binary.BigEndian.Uint32(data[32:])); end+trailerLen <= len(data) {
				fixed := append([]byte(nil), data...)
				binary.BigEndian.PutUint32(fixed[end:], crc32.Checksum(fixed[:end], castagnoli))
				checkStream(t, fixed)
			}
		}
	})
}

// checkStream reads frames from data until an error and checks each frame
// accepted: written back to the bytes read, read again to the same frame,
// its payload decodable.
func checkStream(t *testing.T, data []byte) {
	const limit = 1 << 16
	r := bytes.NewReader(data)
	fr := NewFrameReader(r, limit)
	for {
		before := r.Len()
		got, err := fr.Read()
		if err != nil {
			if got != nil {
				t.Fatalf("frame %v returned with error %v", got, err)
			}
			if err != io.EOF && !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("error of no known kind: %v", err)
			}
			return
		}
		read := data[len(data)-before : len(data)-r.Len()]
		if len(got.Payload) > limit {
			t.Fatalf("accepted %d payload bytes over the limit %d", len(got.Payload), limit)
		}
		var b bytes.Buffer
		if err := WriteFrame(&b, got); err != nil {
			t.Fatalf("accepted %v but cannot write it: %v", got, err)
		}
		if !bytes.Equal(b.Bytes(), read) {
			t.Fatalf("round trip of %v\n read % x\nwrote % x", got, read, b.Bytes())
		}
		again, err := ReadFrame(bytes.NewReader(b.Bytes()), limit)
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("re-read %v: %v %v", got, again, err)
		}
		switch got.Kind {
		case KindData:
			n := got.Count * got.Heads() * got.HeadDim
			k, v := make([]uint16, n), make([]uint16, n)
			if err := got.DecodeHeads(got.HeadLo, got.HeadHi, k, v); err != nil {
				t.Fatalf("decode %v: %v", got, err)
			}
			g := *got
			g.Payload = nil
			if err := g.SetKV(k, v); err != nil || !bytes.Equal(g.Payload, got.Payload) {
				t.Fatalf("decode and encode of %v differ (%v)", got, err)
			}
			mid := (got.HeadLo + got.HeadHi + 1) / 2
			if mid < got.HeadHi {
				if _, err := got.SliceHeads(mid, got.HeadHi); err != nil {
					t.Fatalf("slice %v to [%d,%d): %v", got, mid, got.HeadHi, err)
				}
			}
		case KindEnd:
			if _, err := got.Totals(); err != nil {
				t.Fatalf("end frame without totals: %v", err)
			}
		}
	}
}

// A K-only data frame (multi-head latent attention: V is a view of K)
// carries K alone, half a K-and-V frame's payload; it round-trips, slices
// by heads and decodes into k with no v; the flag on any other kind, or an
// unknown flag bit, is refused.
func TestKOnlyFrame(t *testing.T) {
	full := dataFrame(t, 7, 3, 10, 5, 0, 2, 8)
	f := &Frame{Kind: KindData, Transfer: 7, Layer: 3, Pos: 10, Count: 5, HeadLo: 0, HeadHi: 2, HeadDim: 8, DType: F16, KOnly: true}
	n := 5 * 2 * 8
	k := make([]uint16, n)
	for i := range k {
		k[i] = uint16(1000 + i)
	}
	if err := f.SetKV(k, nil); err != nil {
		t.Fatal(err)
	}
	if len(f.Payload) != len(full.Payload)/2 {
		t.Fatalf("K-only payload %d bytes, want %d", len(f.Payload), len(full.Payload)/2)
	}
	b := encode(t, f)
	if b[31] != flagKOnly {
		t.Fatalf("flags byte %#x", b[31])
	}
	got, err := NewFrameReader(bytes.NewReader(b), 0).Read()
	if err != nil {
		t.Fatal(err)
	}
	if !got.KOnly || !bytes.Equal(got.Payload, f.Payload) {
		t.Fatalf("read back %+v", got)
	}
	g, err := got.SliceHeads(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	k1 := make([]uint16, 5*8)
	if err := g.DecodeHeads(1, 2, k1, nil); err != nil {
		t.Fatal(err)
	}
	for p := 0; p < 5; p++ {
		for d := 0; d < 8; d++ {
			if want := k[p*16+8+d]; k1[p*8+d] != want {
				t.Fatalf("position %d dim %d: %d, want %d", p, d, k1[p*8+d], want)
			}
		}
	}
	if k, kv := f.maxPositions(1<<20), MaxPositions(2, 8, 1<<20); k != 2*kv {
		t.Errorf("a K-only frame of 1 MiB holds %d positions, a K-and-V one %d: want twice as many", k, kv)
	}
	bad := append([]byte(nil), b...)
	bad[31] = 2
	if _, err := NewFrameReader(bytes.NewReader(bad), 0).Read(); err == nil {
		t.Fatal("an unknown flag bit accepted")
	}
	end := encode(t, AckFrame(7))
	end[31] = flagKOnly
	if _, err := NewFrameReader(bytes.NewReader(end), 0).Read(); err == nil {
		t.Fatal("the K-only flag on an ack frame accepted")
	}
}
