package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"shoal/engine/quant"
)

func randVec(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

// maxQ8Err is the largest error q8_0 may make on the block holding x[i]:
// half a quantization step plus the f16 rounding of the scale.
func maxQ8Err(x []float32, i int) float64 {
	lo := i / 32 * 32
	var amax float64
	for _, v := range x[lo:min(lo+32, len(x))] {
		amax = max(amax, math.Abs(float64(v)))
	}
	d := amax / 127
	return d/2 + 128*d*(1.0/1024) + 1e-7
}

func TestTensorEncodingRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 31, 32, 33, 100, 4096} {
		x := randVec(r, n, 3)
		if n > 2 {
			x[1] = -0.0
			x[2] = 1e-3
		}
		for _, dt := range []DType{F32, F16, Q8_0} {
			enc := AppendTensor(nil, dt, x)
			if len(enc) != dt.EncodedLen(n) {
				t.Fatalf("%v n=%d: %d bytes, want %d", dt, n, len(enc), dt.EncodedLen(n))
			}
			got := make([]float32, n)
			if err := DecodeTensor(dt, enc, got); err != nil {
				t.Fatal(err)
			}
			for i := range x {
				d := math.Abs(float64(got[i] - x[i]))
				var tol float64
				switch dt {
				case F32:
					if math.Float32bits(got[i]) != math.Float32bits(x[i]) {
						t.Fatalf("f32 n=%d [%d]: %v != %v", n, i, got[i], x[i])
					}
				case F16:
					tol = math.Abs(float64(x[i]))/2048 + 6e-8 // half an ulp, or a subnormal step
				case Q8_0:
					tol = maxQ8Err(x, i)
				}
				if d > tol && dt != F32 {
					t.Fatalf("%v n=%d [%d]: %v -> %v, error %g above %g", dt, n, i, x[i], got[i], d, tol)
				}
			}
		}
	}
	if err := DecodeTensor(Q8_0, make([]byte, 33), make([]float32, 10)); err == nil {
		t.Fatal("q8_0 payload of the wrong size decoded")
	}
}

// TestTensorF16Bits: F16 encodes each value as quant.FP32ToFP16 does and
// decodes it as quant.FP16ToFP32 does, through the vector converters at
// an even offset and the scalar ones at an odd offset, specials and
// subnormals included.
func TestTensorF16Bits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	x := randVec(r, 1003, 100)
	copy(x, []float32{0, float32(math.Copysign(0, -1)), 1e-7, -3e-6, 65504, 65520, 1e9, float32(math.Inf(-1)), float32(math.NaN()), 6.1e-5, 5.96e-8})
	for _, off := range []int{0, 1, 2} {
		enc := AppendTensor(make([]byte, off), F16, x)[off:]
		for i, v := range x {
			got := binary.LittleEndian.Uint16(enc[2*i:])
			want := quant.FP32ToFP16(v)
			if math.IsNaN(float64(v)) && got&0x7c00 == 0x7c00 && got&0x3ff != 0 {
				continue // any NaN
			}
			if got != want {
				t.Fatalf("offset %d, [%d] %g: %#04x, want %#04x", off, i, v, got, want)
			}
		}
		// And back, at this offset: each value as quant.FP16ToFP32 reads it.
		back := make([]float32, len(x))
		if err := DecodeTensor(F16, enc, back); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			h := binary.LittleEndian.Uint16(enc[2*i:])
			if want := quant.FP16ToFP32(h); math.Float32bits(back[i]) != math.Float32bits(want) && !(back[i] != back[i] && want != want) {
				t.Fatalf("offset %d, [%d] %#04x decoded as %v, want %v", off, i, h, back[i], want)
			}
		}
	}
}

func TestTensorFrameRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var buf bytes.Buffer
	type sent struct {
		h TensorHeader
		x []float32
	}
	var all []sent
	for i, dt := range []DType{F32, F16, Q8_0, F32} {
		h := TensorHeader{Type: MsgActivation, DType: dt, ID: uint64(i) << 40, Tag: "layer-7/hidden", Rows: 3, Cols: 37}
		if i == 3 {
			h.Tag, h.Rows, h.Cols = "", 0, 5
		}
		x := randVec(r, h.Rows*h.Cols, 1)
		b, err := AppendTensorMessage(nil, h, x)
		if err != nil {
			t.Fatal(err)
		}
		// The two encoders agree.
		b2, err := appendTensorFrame(nil, h, AppendTensor(nil, dt, x))
		if err != nil || !bytes.Equal(b, b2) {
			t.Fatalf("appendTensorFrame differs from AppendTensorMessage: %v", err)
		}
		buf.Write(b)
		all = append(all, sent{h, x})
	}
	for _, s := range all {
		f, err := readFrame(&buf, 1<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.TensorHeader != s.h {
			t.Fatalf("header %+v, want %+v", f.TensorHeader, s.h)
		}
		got := make([]float32, len(s.x))
		if err := f.Decode(got); err != nil {
			t.Fatal(err)
		}
		if s.h.DType == F32 && !slicesEqualBits(got, s.x) {
			t.Fatal("f32 payload changed")
		}
	}
	if _, err := readFrame(&buf, 1<<20, nil); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func slicesEqualBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// endlessReader supplies a header, then as many bytes as anyone asks for,
// counting them.
type endlessReader struct {
	hdr  []byte
	read int
}

func (e *endlessReader) Read(p []byte) (int, error) {
	n := 0
	if e.read < len(e.hdr) {
		n = copy(p, e.hdr[e.read:])
	} else {
		clear(p)
		n = len(p)
	}
	e.read += n
	return n, nil
}

func TestTensorFrameOversizedRefusedWithoutAllocation(t *testing.T) {
	h := TensorHeader{Type: MsgActivation, DType: F32, ID: 1, Rows: 1 << 14, Cols: 1 << 14} // 1 GiB
	hdr := make([]byte, tensorHeaderLen)
	putTensorHeader(hdr, &h, 0)
	binary.BigEndian.PutUint32(hdr[24:], uint32(4*h.Rows*h.Cols-1))
	var r *endlessReader
	allocs := testing.AllocsPerRun(20, func() {
		r = &endlessReader{hdr: hdr}
		_, err := readFrame(r, 1<<20, nil)
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Fatalf("got %v, want ErrFrameTooLarge", err)
		}
	})
	if r.read != tensorHeaderLen {
		t.Fatalf("read %d bytes of an oversized frame, want only the %d-byte header", r.read, tensorHeaderLen)
	}
	if allocs > 8 {
		t.Fatalf("%v allocations refusing an oversized frame", allocs)
	}
}

func TestTensorFrameTruncatedAndCorrupt(t *testing.T) {
	x := randVec(rand.New(rand.NewPCG(5, 6)), 64, 1)
	b, err := AppendTensorMessage(nil, TensorHeader{Type: MsgCollective, DType: F16, ID: 9, Tag: "g", Rows: 8, Cols: 8}, x)
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{1, tensorHeaderLen - 1, tensorHeaderLen, tensorHeaderLen + 1, len(b) - 1} {
		_, err := readFrame(bytes.NewReader(b[:cut]), 1<<20, nil)
		if !errors.Is(err, ErrTruncatedFrame) {
			t.Fatalf("cut at %d of %d: %v, want ErrTruncatedFrame", cut, len(b), err)
		}
	}
	bad := bytes.Clone(b)
	bad[len(bad)-3] ^= 0x40
	if _, err := readFrame(bytes.NewReader(bad), 1<<20, nil); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped payload bit: %v, want ErrChecksum", err)
	}
	bad = bytes.Clone(b)
	bad[tensorHeaderLen] ^= 1 // the tag is covered too
	if _, err := readFrame(bytes.NewReader(bad), 1<<20, nil); !errors.Is(err, ErrChecksum) {
		t.Fatalf("flipped tag bit: %v, want ErrChecksum", err)
	}
	for name, mut := range map[string]func(b []byte){
		"magic":    func(b []byte) { b[0] = 0 },
		"version":  func(b []byte) { b[1] = 2 },
		"type":     func(b []byte) { b[2] = 0 },
		"dtype":    func(b []byte) { b[3] = 99 },
		"shape":    func(b []byte) { b[15]++ },
		"reserved": func(b []byte) { b[23] = 1 },
		"taglen":   func(b []byte) { binary.BigEndian.PutUint16(b[20:], MaxTagLen+1) },
	} {
		bad := bytes.Clone(b)
		mut(bad)
		if _, err := readFrame(bytes.NewReader(bad), 1<<20, nil); !errors.Is(err, ErrBadTensorFrame) {
			t.Fatalf("bad %s: %v, want ErrBadTensorFrame", name, err)
		}
	}
}

func FuzzTensorFrame(f *testing.F) {
	for i, dt := range []DType{F32, F16, Q8_0} {
		x := randVec(rand.New(rand.NewPCG(uint64(i), 7)), 40, 2)
		b, _ := AppendTensorMessage(nil, TensorHeader{Type: MsgActivation, DType: dt, ID: 5, Tag: "t", Rows: 2, Cols: 20}, x)
		f.Add(b)
	}
	f.Add(make([]byte, tensorHeaderLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		const limit = 4096
		r := bytes.NewReader(b)
		fr, err := readFrame(r, limit, nil)
		if err != nil {
			return
		}
		if len(fr.Payload) > limit {
			t.Fatalf("payload of %d bytes above the limit", len(fr.Payload))
		}
		dst := make([]float32, fr.Rows*fr.Cols)
		if err := fr.Decode(dst); err != nil {
			t.Fatalf("accepted frame does not decode: %v", err)
		}
		// Re-encoding an accepted frame gives back the bytes read.
		used := len(b) - r.Len()
		again, err := appendTensorFrame(nil, fr.TensorHeader, fr.Payload)
		if err != nil || !bytes.Equal(again, b[:used]) {
			t.Fatalf("re-encoded frame differs (%v)", err)
		}
	})
}

// appendTensorFrame appends a complete frame (header, tag, payload) to dst,
// a second encoder the tests check AppendTensorMessage and the reader
// against; payload must already be encoded in h.DType and hold
// h.Rows*h.Cols values.
func appendTensorFrame(dst []byte, h TensorHeader, payload []byte) ([]byte, error) {
	if err := h.check(); err != nil {
		return dst, err
	}
	if want := h.DType.EncodedLen(h.Rows * h.Cols); len(payload) != want {
		return dst, fmt.Errorf("transport: %dx%d %v tensor takes %d bytes, payload has %d", h.Rows, h.Cols, h.DType, want, len(payload))
	}
	if len(payload) > math.MaxUint32 {
		return dst, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(payload))
	}
	off := len(dst)
	dst = grow(dst, tensorHeaderLen+len(h.Tag)+len(payload))
	copy(dst[off+tensorHeaderLen+len(h.Tag):], payload)
	putTensorHeader(dst[off:], &h, len(payload))
	return dst, nil
}

// readFrame reads one frame as the streams do.
func readFrame(r io.Reader, maxPayload int, buf []byte) (TensorFrame, error) {
	f, _, err := readTensorFrame(r, maxPayload, buf)
	return f, err
}

// BenchmarkTensorF16: encoding 4,096 values (one token's hidden state of
// a 4,096-wide model) as F16 and decoding them, beside the scalar
// encoding the vector one replaced.
func BenchmarkTensorF16(b *testing.B) {
	x := randVec(rand.New(rand.NewPCG(5, 6)), 4096, 10)
	buf := make([]byte, 0, 2*len(x))
	b.Run("append", func(b *testing.B) {
		for b.Loop() {
			buf = AppendTensor(buf[:0], F16, x)
		}
		b.ReportMetric(float64(len(x)*b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
	})
	b.Run("decode", func(b *testing.B) {
		buf = AppendTensor(buf[:0], F16, x)
		y := make([]float32, len(x))
		for b.Loop() {
			if err := DecodeTensor(F16, buf, y); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(x)*b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
	})
	b.Run("scalar", func(b *testing.B) {
		out := make([]byte, 2*len(x))
		for b.Loop() {
			for i, v := range x {
				binary.LittleEndian.PutUint16(out[2*i:], quant.FP32ToFP16(v))
			}
		}
		b.ReportMetric(float64(len(x)*b.N)/b.Elapsed().Seconds()/1e9, "Gvalues/s")
	})
}
