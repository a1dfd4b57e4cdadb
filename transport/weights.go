package transport

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"

	"go.uber.org/zap"
)

// Weights protocol on a KindWeights stream: byte ranges of a file named by
// its sha256, one request per stream. The transport serves bytes; what the
// ranges mean (tensors, shards) is the caller's business.
//
// Request, one frame (WriteFrame) from the client, then FIN:
//
//	off size field
//	0   1    magic 'W'
//	1   1    version, 1
//	2   1    op, 1 = ranges
//	3   1    reserved, zero
//	4   32   sha256 of the whole file
//	36  4    count of ranges (big-endian)
//	40  16×count  ranges: offset u64, length u64 (big-endian)
//
// Response: one status byte. On 0 (ok) a u64 length (the sum of the
// ranges), the bytes of the ranges concatenated in request order, and a
// CRC32C of those bytes (u32). On any other status a u16 length and a
// message; the stream then ends.
const (
	weightsMagic   = 'W'
	weightsVersion = 1
	weightsOpRange = 1
	weightsHdrLen  = 40

	// DefaultMaxWeightsBytes bounds the bytes one request may ask for.
	DefaultMaxWeightsBytes = 64 << 20
	// MaxWeightsRanges bounds the ranges of one request; FetchWeights
	// splits longer lists into several requests.
	MaxWeightsRanges = 1 << 16

	weightsIdle  = 30 * time.Second
	weightsChunk = 256 << 10
)

// Weights response statuses.
const (
	WeightsOK          byte = 0
	WeightsUnknownFile byte = 1 // no file with that sha256 here
	WeightsBadRange    byte = 2 // a range is negative or past the end of the file
	WeightsTooLarge    byte = 3 // more bytes or ranges than the server allows
	WeightsMalformed   byte = 4 // bad magic, version, op or length
	WeightsIOError     byte = 5 // the server could not read its file
	WeightsNotHeld     byte = 6 // the server holds only other ranges of the file
)

// WeightsError is a refusal from the serving peer.
type WeightsError struct {
	Status byte
	Msg    string
}

func (e *WeightsError) Error() string { return "weights: " + e.Msg }

// ErrWeightsChecksum is returned when a response's bytes do not match its
// CRC32C trailer.
var ErrWeightsChecksum = errors.New("weights: response checksum mismatch")

// WeightRange is n bytes at offset off.
type WeightRange struct {
	Off, N int64
}

// WeightSource finds the files a node serves, by hex sha256.
type WeightSource interface {
	// OpenWeights returns a reader of the file and its size, or ok=false.
	// A reader of only some ranges of the file (a node's shards)
	// implements PartialWeights.
	OpenWeights(sha string) (r io.ReaderAt, size int64, ok bool)
}

// PartialWeights is a reader of some ranges of a file: a request for a
// range it does not hold is refused (WeightsNotHeld).
type PartialWeights interface {
	Holds(off, n int64) bool
}

// WeightsOptions bound what a weights server hands out.
type WeightsOptions struct {
	MaxBytes int64 // per request (DefaultMaxWeightsBytes if 0)
	// Served, when set, is called after each answered request with the
	// bytes sent (for metrics and tests).
	Served func(peer Peer, sha string, bytes int64)
}

// ServeWeights answers weights requests on ep from src. The endpoint has
// already refused peers without a cluster certificate.
func ServeWeights(ep *Endpoint, src WeightSource, o WeightsOptions) {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxWeightsBytes
	}
	log := zap.L().Named("weights")
	ep.Handle(KindWeights, func(s *Stream) { serveWeights(s, src, o, log) })
}

func serveWeights(s *Stream, src WeightSource, o WeightsOptions, log *zap.Logger) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(weightsIdle))
	refuse := func(status byte, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		log.Info("refused weights request", zap.String("peer", s.Peer.ID), zap.String("reason", msg))
		b := make([]byte, 3, 3+len(msg))
		b[0] = status
		binary.BigEndian.PutUint16(b[1:], uint16(min(len(msg), 0xFFFF)))
		_, _ = s.Write(append(b, msg[:min(len(msg), 0xFFFF)]...))
	}
	req, err := ReadFrame(s, weightsHdrLen+16*MaxWeightsRanges)
	if err != nil {
		if errors.Is(err, ErrFrameTooLarge) {
			refuse(WeightsTooLarge, "more than %d ranges in one request", MaxWeightsRanges)
		}
		return
	}
	sha, ranges, err := decodeWeightsRequest(req)
	if err != nil {
		refuse(WeightsMalformed, "%v", err)
		return
	}
	r, size, ok := src.OpenWeights(sha)
	if !ok {
		refuse(WeightsUnknownFile, "no file with sha256 %s here", sha)
		return
	}
	var total int64
	for _, rg := range ranges {
		if rg.Off < 0 || rg.N < 0 || rg.Off > size || rg.N > size-rg.Off {
			refuse(WeightsBadRange, "range [%d,+%d) is outside the %d-byte file", rg.Off, rg.N, size)
			return
		}
		if pw, ok := r.(PartialWeights); ok && !pw.Holds(rg.Off, rg.N) {
			refuse(WeightsNotHeld, "range [%d,+%d) is not held here", rg.Off, rg.N)
			return
		}
		total += rg.N
		if total > o.MaxBytes {
			refuse(WeightsTooLarge, "request asks for more than %d bytes", o.MaxBytes)
			return
		}
	}
	var hdr [9]byte
	hdr[0] = WeightsOK
	binary.BigEndian.PutUint64(hdr[1:], uint64(total))
	if _, err := s.Write(hdr[:]); err != nil {
		return
	}
	crc := crc32.New(castagnoli)
	buf := make([]byte, min(total, weightsChunk))
	for _, rg := range ranges {
		for off, left := rg.Off, rg.N; left > 0; {
			k := min(left, int64(len(buf)))
			if _, err := r.ReadAt(buf[:k], off); err != nil {
				// The header promised bytes; reset so the client sees a cut stream.
				log.Warn("reading a served file", zap.String("sha256", sha), zap.Error(err))
				s.CancelWrite(codeForbidden)
				return
			}
			crc.Write(buf[:k])
			_ = s.SetWriteDeadline(time.Now().Add(weightsIdle))
			if _, err := s.Write(buf[:k]); err != nil {
				return
			}
			off, left = off+k, left-k
		}
	}
	var tr [4]byte
	binary.BigEndian.PutUint32(tr[:], crc.Sum32())
	if _, err := s.Write(tr[:]); err != nil {
		return
	}
	if o.Served != nil {
		o.Served(s.Peer, sha, total)
	}
}

func encodeWeightsRequest(sha string, ranges []WeightRange) ([]byte, error) {
	raw, err := hex.DecodeString(sha)
	if err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("weights: %q is not a hex sha256", sha)
	}
	b := make([]byte, weightsHdrLen, weightsHdrLen+16*len(ranges))
	b[0], b[1], b[2] = weightsMagic, weightsVersion, weightsOpRange
	copy(b[4:36], raw)
	binary.BigEndian.PutUint32(b[36:], uint32(len(ranges)))
	for _, r := range ranges {
		b = binary.BigEndian.AppendUint64(b, uint64(r.Off))
		b = binary.BigEndian.AppendUint64(b, uint64(r.N))
	}
	return b, nil
}

func decodeWeightsRequest(b []byte) (string, []WeightRange, error) {
	if len(b) < weightsHdrLen {
		return "", nil, errors.New("short request")
	}
	if b[0] != weightsMagic || b[1] != weightsVersion || b[2] != weightsOpRange || b[3] != 0 {
		return "", nil, fmt.Errorf("unsupported request (magic %#x, version %d, op %d)", b[0], b[1], b[2])
	}
	n := int(binary.BigEndian.Uint32(b[36:]))
	if n > MaxWeightsRanges || len(b) != weightsHdrLen+16*n {
		return "", nil, fmt.Errorf("request of %d bytes does not hold %d ranges", len(b), n)
	}
	rs := make([]WeightRange, n)
	for i := range rs {
		p := b[weightsHdrLen+16*i:]
		rs[i] = WeightRange{Off: int64(binary.BigEndian.Uint64(p)), N: int64(binary.BigEndian.Uint64(p[8:]))}
	}
	return hex.EncodeToString(b[4:36]), rs, nil
}

// FetchWeights asks the peer at addr for ranges of the file with hex sha256
// sha. The returned reader yields the ranges concatenated and fails at the
// end when the checksum does not match; ctx bounds the whole transfer.
// More than MaxWeightsRanges ranges become consecutive requests.
func (e *Endpoint) FetchWeights(ctx context.Context, addr, sha string, ranges []WeightRange) (io.ReadCloser, error) {
	if len(ranges) <= MaxWeightsRanges {
		return e.fetchWeights(ctx, addr, sha, ranges)
	}
	return &chainedWeights{ctx: ctx, next: func(ctx context.Context) (io.ReadCloser, error) {
		if len(ranges) == 0 {
			return nil, io.EOF
		}
		k := min(len(ranges), MaxWeightsRanges)
		part := ranges[:k]
		ranges = ranges[k:]
		return e.fetchWeights(ctx, addr, sha, part)
	}}, nil
}

func (e *Endpoint) fetchWeights(ctx context.Context, addr, sha string, ranges []WeightRange) (io.ReadCloser, error) {
	req, err := encodeWeightsRequest(sha, ranges)
	if err != nil {
		return nil, err
	}
	st, err := e.Dial(ctx, addr, KindWeights)
	if err != nil {
		return nil, fmt.Errorf("weights from %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() {
		st.CancelRead(0)
		st.CancelWrite(0)
	})
	fail := func(err error) (io.ReadCloser, error) {
		stop()
		st.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("weights from %s: %w", addr, err)
	}
	_ = st.SetDeadline(time.Now().Add(weightsIdle))
	if err := WriteFrame(st, req); err != nil {
		return fail(err)
	}
	_ = st.CloseWrite()
	var status [1]byte
	if _, err := io.ReadFull(st, status[:]); err != nil {
		return fail(err)
	}
	if status[0] != WeightsOK {
		var l [2]byte
		if _, err := io.ReadFull(st, l[:]); err != nil {
			return fail(err)
		}
		msg := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(st, msg); err != nil {
			return fail(err)
		}
		return fail(&WeightsError{Status: status[0], Msg: string(msg)})
	}
	var n [8]byte
	if _, err := io.ReadFull(st, n[:]); err != nil {
		return fail(err)
	}
	want := int64(0)
	for _, r := range ranges {
		want += r.N
	}
	if got := int64(binary.BigEndian.Uint64(n[:])); got != want {
		return fail(fmt.Errorf("peer announced %d bytes for a request of %d", got, want))
	}
	return &weightsReader{st: st, left: want, crc: crc32.New(castagnoli), stop: stop}, nil
}

// weightsReader reads one response's data and checks its trailer.
type weightsReader struct {
	st   *Stream
	left int64
	crc  hash.Hash32
	stop func() bool
	err  error
}

func (r *weightsReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.left == 0 {
		r.err = r.trailer()
		return 0, r.err
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	_ = r.st.SetReadDeadline(time.Now().Add(weightsIdle))
	n, err := r.st.Read(p)
	r.crc.Write(p[:n])
	r.left -= int64(n)
	switch {
	case r.left == 0:
		// Check the trailer with the last bytes, so a reader that stops
		// at the length it asked for (io.ReadFull) still sees a bad
		// checksum: the last byte is withheld with the error.
		if terr := r.trailer(); terr != io.EOF {
			r.err = terr
			return n - 1, terr
		}
		r.err = io.EOF
		return n, nil
	case err == io.EOF:
		r.err = io.ErrUnexpectedEOF
	case err != nil:
		r.err = err
	}
	return n, r.err
}

// trailer reads and checks the CRC32C: io.EOF when it matches.
func (r *weightsReader) trailer() error {
	var tr [4]byte
	if _, err := io.ReadFull(r.st, tr[:]); err != nil {
		return fmt.Errorf("weights trailer: %w", err)
	}
	if binary.BigEndian.Uint32(tr[:]) != r.crc.Sum32() {
		return ErrWeightsChecksum
	}
	return io.EOF
}

func (r *weightsReader) Close() error {
	r.stop()
	return r.st.Close()
}

// chainedWeights reads consecutive responses as one.
type chainedWeights struct {
	ctx  context.Context
	cur  io.ReadCloser
	next func(context.Context) (io.ReadCloser, error)
	err  error
}

func (c *chainedWeights) Read(p []byte) (int, error) {
	for c.err == nil {
		if c.cur == nil {
			c.cur, c.err = c.next(c.ctx)
			if c.err != nil {
				break
			}
		}
		n, err := c.cur.Read(p)
		if err == io.EOF {
			c.cur.Close()
			c.cur = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		return n, err
	}
	return 0, c.err
}

func (c *chainedWeights) Close() error {
	if c.cur != nil {
		return c.cur.Close()
	}
	return nil
}
