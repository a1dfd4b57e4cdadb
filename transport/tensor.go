package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sync"
	"unsafe"

	"shoal/engine/kernels"
	"shoal/engine/quant"
)

// DType is the element encoding of a tensor on the wire. Values are part of
// the wire format: append, never renumber.
type DType uint8

// Wire dtypes. Tensors are float32 in memory; F16 and Q8_0 are lossy
// encodings that halve or roughly quarter the bytes on the wire.
const (
	F32  DType = 1 // little-endian IEEE float32, exact
	F16  DType = 2 // little-endian IEEE binary16, round to nearest even
	Q8_0 DType = 3 // blocks of 32 values: f16 scale + 32 int8 (ggml block_q8_0); a short last block is zero-padded
)

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case Q8_0:
		return "q8_0"
	}
	return fmt.Sprintf("dtype(%d)", byte(d))
}

// Valid reports whether d is a known dtype.
// ParseDType parses a wire dtype's name as String gives it (f32, f16,
// q8_0).
func ParseDType(s string) (DType, error) {
	for _, d := range []DType{F32, F16, Q8_0} {
		if s == d.String() {
			return d, nil
		}
	}
	return 0, fmt.Errorf("wire dtype %q: want f32, f16 or q8_0", s)
}

func (d DType) Valid() bool { return d == F32 || d == F16 || d == Q8_0 }

// EncodedLen is the number of payload bytes n values take in dtype d, or -1
// for an unknown dtype.
func (d DType) EncodedLen(n int) int {
	switch d {
	case F32:
		return 4 * n
	case F16:
		return 2 * n
	case Q8_0:
		return (n + quant.QK - 1) / quant.QK * quant.BlockQ8_0
	}
	return -1
}

// halfChunk is the values an F16 payload at an odd address is converted
// in at a time, through an aligned buffer (pooled: the converters are
// assembly, so a buffer handed to them does not stay on the stack).
const halfChunk = 512

var halfPool = sync.Pool{New: func() any { return new([halfChunk]uint16) }}

// AppendTensor appends the encoding of src in dtype d to dst.
func AppendTensor(dst []byte, d DType, src []float32) []byte {
	n := d.EncodedLen(len(src))
	if n < 0 {
		panic("transport: AppendTensor with unknown dtype " + d.String())
	}
	off := len(dst)
	dst = grow(dst, n)
	out := dst[off:]
	switch d {
	case F32:
		if nativeLittleEndian && len(src) > 0 {
			copy(out, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src)))
		} else {
			for i, v := range src {
				binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
			}
		}
	case F16:
		if !nativeLittleEndian {
			for i, v := range src {
				binary.LittleEndian.PutUint16(out[2*i:], quant.FP32ToFP16(v))
			}
			break
		}
		// The engine's converter (F16C on amd64), rounding as
		// quant.FP32ToFP16 does; through an aligned buffer where the
		// payload starts at an odd offset (after a frame's header).
		if len(src) > 0 && uintptr(unsafe.Pointer(&out[0]))%2 == 0 {
			kernels.F32ToF16(unsafe.Slice((*uint16)(unsafe.Pointer(&out[0])), len(src)), src)
			break
		}
		h := halfPool.Get().(*[halfChunk]uint16)
		defer halfPool.Put(h)
		for len(src) > 0 {
			n := min(len(src), halfChunk)
			kernels.F32ToF16(h[:n], src[:n])
			out = out[copy(out, unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 2*n)):]
			src = src[n:]
		}
	case Q8_0:
		full := len(src) / quant.QK * quant.QK
		nb := full / quant.QK
		quant.QuantizeRow(quant.Q8_0, src[:full], out[:nb*quant.BlockQ8_0])
		if rest := src[full:]; len(rest) > 0 {
			var pad [quant.QK]float32
			copy(pad[:], rest)
			quant.QuantizeRow(quant.Q8_0, pad[:], out[nb*quant.BlockQ8_0:])
		}
	}
	return dst
}

// DecodeTensor decodes len(dst) values of dtype d from src, which must hold
// exactly d.EncodedLen(len(dst)) bytes.
func DecodeTensor(d DType, src []byte, dst []float32) error {
	if !d.Valid() {
		return fmt.Errorf("transport: unknown tensor dtype %d", byte(d))
	}
	if want := d.EncodedLen(len(dst)); len(src) != want {
		return fmt.Errorf("transport: %d %v values take %d bytes, got %d", len(dst), d, want, len(src))
	}
	switch d {
	case F32:
		if nativeLittleEndian && len(dst) > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
		} else {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
			}
		}
	case F16:
		if !nativeLittleEndian {
			for i := range dst {
				dst[i] = quant.FP16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
			}
			break
		}
		if len(dst) > 0 && uintptr(unsafe.Pointer(&src[0]))%2 == 0 {
			kernels.F16ToF32(dst, unsafe.Slice((*uint16)(unsafe.Pointer(&src[0])), len(dst)))
			break
		}
		h := halfPool.Get().(*[halfChunk]uint16)
		defer halfPool.Put(h)
		for len(dst) > 0 {
			n := min(len(dst), halfChunk)
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&h[0])), 2*n), src)
			kernels.F16ToF32(dst[:n], h[:n])
			dst, src = dst[n:], src[2*n:]
		}
	case Q8_0:
		full := len(dst) / quant.QK * quant.QK
		nb := full / quant.QK
		quant.DequantizeRow(quant.Q8_0, src[:nb*quant.BlockQ8_0], dst[:full])
		if rest := dst[full:]; len(rest) > 0 {
			var pad [quant.QK]float32
			quant.DequantizeRow(quant.Q8_0, src[nb*quant.BlockQ8_0:], pad[:])
			copy(rest, pad[:])
		}
	}
	return nil
}

// RoundTrip replaces every value of x by what a peer decodes after x was sent
// in dtype d (a no-op for F32). tmp is scratch space, returned grown.
func RoundTrip(d DType, x []float32, tmp []byte) []byte {
	if d == F32 {
		return tmp
	}
	tmp = AppendTensor(tmp[:0], d, x)
	_ = DecodeTensor(d, tmp, x)
	return tmp
}

var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// Tensor frame layout, version 1 (multi-byte header fields big-endian):
//
//	off size field
//	0   1    magic 0xA7
//	1   1    version (1)
//	2   1    message type (MsgActivation, MsgCollective)
//	3   1    dtype
//	4   8    id: request / step / collective sequence number
//	12  4    rows
//	16  4    cols
//	20  2    tag length in bytes (at most MaxTagLen)
//	22  2    reserved, zero
//	24  4    payload length in bytes (= dtype.EncodedLen(rows*cols))
//	28  4    CRC32C (Castagnoli) of the tag bytes followed by the payload
//	32  -    tag, then payload
const (
	tensorMagic     = 0xA7
	tensorVersion   = 1
	tensorHeaderLen = 32
	// MaxTagLen bounds the tag of a tensor frame.
	MaxTagLen = 1024
	// DefaultMaxTensorFrame bounds the payload of one tensor frame unless a
	// receiver configures another limit.
	DefaultMaxTensorFrame = 64 << 20
)

// MsgType is the message type of a tensor frame; each stream kind accepts
// only its own.
type MsgType uint8

// Message types. Part of the wire format.
const (
	MsgActivation MsgType = 1
	MsgCollective MsgType = 2
)

// Errors of the tensor frame decoder, matched with errors.Is.
// ErrFrameTooLarge (frame.go) is returned for a frame above the limit.
var (
	ErrBadTensorFrame = errors.New("malformed tensor frame")
	ErrChecksum       = errors.New("tensor frame checksum mismatch")
	ErrTruncatedFrame = errors.New("truncated tensor frame")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TensorHeader describes one tensor frame.
type TensorHeader struct {
	Type  MsgType
	DType DType
	ID    uint64
	Tag   string
	Rows  int
	Cols  int
}

// TensorFrame is a decoded frame; Payload is the still encoded tensor.
type TensorFrame struct {
	TensorHeader
	Payload []byte
}

// Decode decodes the payload into dst[:Rows*Cols].
func (f *TensorFrame) Decode(dst []float32) error {
	n := f.Rows * f.Cols
	if len(dst) < n {
		return fmt.Errorf("transport: tensor %q is %dx%d, destination holds %d values", f.Tag, f.Rows, f.Cols, len(dst))
	}
	return DecodeTensor(f.DType, f.Payload, dst[:n])
}

// putTensorHeader fills in the header and tag of the frame b, whose payload
// of plen bytes is already in place after them, and its checksum.
func putTensorHeader(b []byte, h *TensorHeader, plen int) {
	b[0], b[1], b[2], b[3] = tensorMagic, tensorVersion, byte(h.Type), byte(h.DType)
	binary.BigEndian.PutUint64(b[4:], h.ID)
	binary.BigEndian.PutUint32(b[12:], uint32(h.Rows))
	binary.BigEndian.PutUint32(b[16:], uint32(h.Cols))
	binary.BigEndian.PutUint16(b[20:], uint16(len(h.Tag)))
	binary.BigEndian.PutUint16(b[22:], 0)
	binary.BigEndian.PutUint32(b[24:], uint32(plen))
	copy(b[tensorHeaderLen:], h.Tag)
	binary.BigEndian.PutUint32(b[28:], crc32.Checksum(b[tensorHeaderLen:tensorHeaderLen+len(h.Tag)+plen], castagnoli))
}

// AppendTensorMessage encodes data in h.DType and appends the frame to dst.
func AppendTensorMessage(dst []byte, h TensorHeader, data []float32) ([]byte, error) {
	if err := h.check(); err != nil {
		return dst, err
	}
	if len(data) != h.Rows*h.Cols {
		return dst, fmt.Errorf("transport: %dx%d tensor given %d values", h.Rows, h.Cols, len(data))
	}
	n := h.DType.EncodedLen(len(data))
	if n > math.MaxUint32 {
		return dst, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	off := len(dst)
	dst = grow(dst, tensorHeaderLen+len(h.Tag))
	dst = AppendTensor(dst, h.DType, data)
	putTensorHeader(dst[off:], &h, n)
	return dst, nil
}

func (h *TensorHeader) check() error {
	if h.Type == 0 {
		return fmt.Errorf("transport: tensor frame without a message type")
	}
	if !h.DType.Valid() {
		return fmt.Errorf("transport: unknown tensor dtype %d", byte(h.DType))
	}
	if len(h.Tag) > MaxTagLen {
		return fmt.Errorf("transport: tensor tag of %d bytes, limit %d", len(h.Tag), MaxTagLen)
	}
	if h.Rows < 0 || h.Cols < 0 || uint64(h.Rows) > math.MaxUint32 || uint64(h.Cols) > math.MaxUint32 {
		return fmt.Errorf("transport: bad tensor shape %dx%d", h.Rows, h.Cols)
	}
	if h.Cols > 0 && h.Rows > math.MaxInt/8/h.Cols {
		return fmt.Errorf("transport: tensor shape %dx%d overflows", h.Rows, h.Cols)
	}
	return nil
}

// readTensorFrame reads one frame and returns it with the buffer holding
// its tag and payload, for reuse. A frame whose payload announces more than
// maxPayload bytes is refused with ErrFrameTooLarge before anything is
// allocated for it. The payload is read into buf when it has the capacity.
// A stream that ends inside a frame gives ErrTruncatedFrame, a payload that
// does not match its checksum ErrChecksum, any other inconsistency
// ErrBadTensorFrame. A stream that ends cleanly between frames gives io.EOF.
func readTensorFrame(r io.Reader, maxPayload int, buf []byte) (TensorFrame, []byte, error) {
	var hdr [tensorHeaderLen]byte
	var f TensorFrame
	if n, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return f, nil, io.EOF
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return f, nil, fmt.Errorf("%w: header cut after %d of %d bytes", ErrTruncatedFrame, n, tensorHeaderLen)
		}
		return f, nil, err
	}
	h, plen, sum, err := parseTensorHeader(hdr[:], maxPayload)
	if err != nil {
		return f, nil, err
	}
	taglen := int(binary.BigEndian.Uint16(hdr[20:]))
	need := taglen + plen
	if cap(buf) >= need {
		buf = buf[:need]
	} else {
		buf = make([]byte, need)
	}
	if n, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			return f, nil, fmt.Errorf("%w: body cut after %d of %d bytes", ErrTruncatedFrame, n, need)
		}
		return f, nil, err
	}
	if got := crc32.Checksum(buf, castagnoli); got != sum {
		return f, nil, fmt.Errorf("%w: %q id %d: crc32c %08x, header says %08x", ErrChecksum, buf[:taglen], h.ID, got, sum)
	}
	h.Tag = string(buf[:taglen])
	f.TensorHeader = h
	f.Payload = buf[taglen:]
	return f, buf, nil
}

func parseTensorHeader(b []byte, maxPayload int) (h TensorHeader, plen int, sum uint32, err error) {
	if b[0] != tensorMagic {
		return h, 0, 0, fmt.Errorf("%w: bad magic %#02x", ErrBadTensorFrame, b[0])
	}
	if b[1] != tensorVersion {
		return h, 0, 0, fmt.Errorf("%w: unsupported version %d", ErrBadTensorFrame, b[1])
	}
	p := uint64(binary.BigEndian.Uint32(b[24:]))
	if p > uint64(max(maxPayload, 0)) {
		return h, 0, 0, fmt.Errorf("%w: tensor payload of %d bytes, limit %d", ErrFrameTooLarge, p, maxPayload)
	}
	h = TensorHeader{
		Type:  MsgType(b[2]),
		DType: DType(b[3]),
		ID:    binary.BigEndian.Uint64(b[4:]),
		Rows:  int(binary.BigEndian.Uint32(b[12:])),
		Cols:  int(binary.BigEndian.Uint32(b[16:])),
	}
	taglen := int(binary.BigEndian.Uint16(b[20:]))
	switch {
	case h.Type == 0:
		return h, 0, 0, fmt.Errorf("%w: message type 0", ErrBadTensorFrame)
	case !h.DType.Valid():
		return h, 0, 0, fmt.Errorf("%w: unknown dtype %d", ErrBadTensorFrame, b[3])
	case taglen > MaxTagLen:
		return h, 0, 0, fmt.Errorf("%w: tag of %d bytes, limit %d", ErrBadTensorFrame, taglen, MaxTagLen)
	case binary.BigEndian.Uint16(b[22:]) != 0:
		return h, 0, 0, fmt.Errorf("%w: reserved bits set", ErrBadTensorFrame)
	}
	// rows*cols cannot overflow a uint64 (both are below 2^32).
	if vals := uint64(h.Rows) * uint64(h.Cols); vals > p || uint64(h.DType.EncodedLen(int(vals))) != p {
		return h, 0, 0, fmt.Errorf("%w: %dx%d %v tensor in a payload of %d bytes", ErrBadTensorFrame, h.Rows, h.Cols, h.DType, p)
	}
	return h, int(p), binary.BigEndian.Uint32(b[28:]), nil
}
