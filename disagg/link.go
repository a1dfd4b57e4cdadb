package disagg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/zap"

	"shoal/parallel"
	"shoal/transport"
)

// The KV link: parallel.KVLink over the node's QUIC endpoint, one kv stream
// per (transfer, destination).
//
//	sender → receiver: data frames, then one end frame with the stream's
//	                   totals, then FIN
//	receiver → sender: one ack frame once the end frame's totals matched
//	                   and every piece of the stream was taken by Next;
//	                   or one abort frame with the reason, at any time
//
// A receiver that aborts also stops reading (STOP_SENDING), so a sender
// blocked in a write fails at once and then finds the reason on its read
// side. A sender that gives up (its ctx ended inside a frame, or before
// the ack) resets its stream; the receiver takes that, like an abort frame
// from the sender, as the end of the transfer.

// Defaults of LinkOptions.
const (
	DefaultIdleTimeout = 30 * time.Second
	DefaultMaxBuffered = 64 << 20
)

const (
	// controlTimeout bounds writing an ack or abort frame to a peer that
	// does not read it.
	controlTimeout = 2 * time.Second
	// answerGrace is how long a sender whose write failed waits for the
	// receiver's abort frame, which says why.
	answerGrace = time.Second
	// closeGrace is how long a stream whose pieces were all taken may
	// still deliver its end frame (to be acked) after its inbox closed.
	closeGrace = 2 * time.Second
	// codeKVAbort resets a kv stream's direction that one side gave up.
	codeKVAbort quic.StreamErrorCode = 0x30
	// kindByte is the stream-kind byte transport writes first on a stream,
	// counted as framing.
	kindByte = 1
)

// Errors of the link, matched with errors.Is; the error text names the
// transfer, the peer and the reason. Corrupt frames wrap the codec's
// errors (ErrChecksum, ErrBadFrame, ErrFrameTooLarge, ErrTruncated).
var (
	// ErrAborted: the other side gave the transfer up (an abort frame, a
	// reset stream, a stream that ended before its end frame) or refused
	// it (a transfer it does not expect, totals that do not match).
	ErrAborted = errors.New("kv transfer aborted")
	// ErrIdle: nothing arrived for the idle timeout.
	ErrIdle = errors.New("kv transfer idle")
	// ErrClosed: the inbox or the link was closed.
	ErrClosed = errors.New("kv link closed")
)

// LinkOptions configure a Link. Zero values take the defaults.
type LinkOptions struct {
	// IdleTimeout fails an inbox whose transfer saw nothing (no frame
	// arrived and Next took nothing) for this long, and a stream that
	// sent no frame for this long: Next then returns an error wrapping
	// ErrIdle instead of waiting forever. DefaultIdleTimeout if zero.
	IdleTimeout time.Duration
	// MaxFrame is the largest data-frame payload the link writes (larger
	// pieces are split into frames of whole positions) and accepts.
	// MaxFrame if zero, and never more; all nodes should agree.
	MaxFrame int
	// MaxBuffered bounds the bytes of decoded pieces an inbox holds that
	// Next has not taken. A piece that does not fit waits in its stream's
	// handler, which stops reading meanwhile, so QUIC flow control slows
	// the sender down. A piece larger than the bound is taken when the
	// inbox is empty. DefaultMaxBuffered if zero.
	MaxBuffered int
	// Logger receives the link's logs; none if nil.
	Logger *zap.Logger
}

// LinkStats counts a link's traffic in bytes, both as a sender and as a
// receiver, of whole frames written or read. Payload is the K and V of
// data frames; Framing is everything else this link puts on kv streams or
// reads from them: 40 bytes of header and checksum per data frame, end,
// ack and abort frames whole (64, 40 and 40 plus the reason), and the one
// stream-kind byte of each stream. QUIC's own packet overhead is not
// counted.
type LinkStats struct {
	SentPayload, SentFraming uint64
	RecvPayload, RecvFraming uint64
	SentFrames, RecvFrames   uint64 // data frames
	StreamsOpened            uint64 // kv streams this link opened as a sender
	StreamsAccepted          uint64 // kv streams it served as a receiver
}

// Link is parallel.KVLink over a transport endpoint's kv streams. Safe for
// concurrent use.
type Link struct {
	ep          *transport.Endpoint
	idle        time.Duration
	maxFrame    int
	maxBuffered int
	log         *zap.Logger

	mu      sync.Mutex
	closed  bool
	inboxes map[uint64]*inbox
	served  map[*transport.Stream]struct{}
	outs    map[*outStream]struct{}
	wg      sync.WaitGroup // stream handlers and senders' answer readers

	sentPayload, sentFraming, recvPayload, recvFraming atomic.Uint64
	sentFrames, recvFrames, opened, accepted           atomic.Uint64
}

var _ parallel.KVLink = (*Link)(nil)

// NewLink serves kv streams on ep (it takes over transport.KindKV there)
// and sends over it.
func NewLink(ep *transport.Endpoint, opt LinkOptions) *Link {
	if opt.IdleTimeout <= 0 {
		opt.IdleTimeout = DefaultIdleTimeout
	}
	if opt.MaxFrame <= 0 || opt.MaxFrame > MaxFrame {
		opt.MaxFrame = MaxFrame
	}
	if opt.MaxBuffered <= 0 {
		opt.MaxBuffered = DefaultMaxBuffered
	}
	if opt.Logger == nil {
		opt.Logger = zap.NewNop()
	}
	l := &Link{
		ep:          ep,
		idle:        opt.IdleTimeout,
		maxFrame:    opt.MaxFrame,
		maxBuffered: opt.MaxBuffered,
		log:         opt.Logger.Named("kvlink"),
		inboxes:     map[uint64]*inbox{},
		served:      map[*transport.Stream]struct{}{},
		outs:        map[*outStream]struct{}{},
	}
	ep.Handle(transport.KindKV, l.serve)
	return l
}

// Stats returns the link's byte and frame counts so far.
func (l *Link) Stats() LinkStats {
	return LinkStats{
		SentPayload: l.sentPayload.Load(), SentFraming: l.sentFraming.Load(),
		RecvPayload: l.recvPayload.Load(), RecvFraming: l.recvFraming.Load(),
		SentFrames: l.sentFrames.Load(), RecvFrames: l.recvFrames.Load(),
		StreamsOpened: l.opened.Load(), StreamsAccepted: l.accepted.Load(),
	}
}

// Close stops serving kv streams: every inbox fails with ErrClosed (its
// senders get an abort), every stream is abandoned, and Close returns once
// the link's goroutines have ended (within about two seconds even if a
// peer does not read its abort frame). Closing twice does nothing.
func (l *Link) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	inboxes := l.inboxes
	l.inboxes = map[uint64]*inbox{}
	served := make([]*transport.Stream, 0, len(l.served))
	for s := range l.served {
		served = append(served, s)
	}
	outs := make([]*outStream, 0, len(l.outs))
	for o := range l.outs {
		outs = append(outs, o)
	}
	l.mu.Unlock()
	l.ep.Handle(transport.KindKV, nil)
	for id, in := range inboxes {
		in.fail(fmt.Errorf("kv transfer %d: %w", id, ErrClosed))
		in.stopTimer()
	}
	for _, s := range served {
		s.CancelRead(codeKVAbort)
	}
	for _, o := range outs {
		o.abandon(fmt.Errorf("kv transfer %d to %s: %w", o.id, o.addr, ErrClosed))
	}
	l.wg.Wait()
}

// track runs f in a goroutine the link waits for on Close; false (and f
// does not run) once the link is closed.
func (l *Link) track(f func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
	return true
}

func peerName(p transport.Peer) string {
	if p.Addr == nil {
		return p.ID
	}
	if p.ID == "" {
		return p.Addr.String()
	}
	return p.ID + " (" + p.Addr.String() + ")"
}

// withDeadline runs f with the stream deadline set by set following ctx:
// its deadline, and one in the past if ctx ends while f runs.
func withDeadline(ctx context.Context, set func(time.Time) error, f func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	_ = set(dl)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = set(time.Unix(1, 0))
		close(fired)
	})
	err := f()
	if !stop() {
		<-fired
	}
	_ = set(time.Time{})
	return err
}

// writeControl writes an end, ack or abort frame within controlTimeout and
// counts it as framing.
func (l *Link) writeControl(s *transport.Stream, f *Frame) error {
	_ = s.SetWriteDeadline(time.Now().Add(controlTimeout))
	err := WriteFrame(s, f)
	_ = s.SetWriteDeadline(time.Time{})
	if err == nil {
		l.sentFraming.Add(uint64(headerLen + len(f.Payload) + trailerLen))
	}
	return err
}

// tally is what one stream carried, to compare with its end frame.
type tally struct {
	frames, bytes uint64
	perLayer      map[int]uint64 // positions per layer
}

func (t *tally) add(f *Frame) {
	if t.perLayer == nil {
		t.perLayer = map[int]uint64{}
	}
	t.frames++
	t.bytes += uint64(len(f.Payload))
	t.perLayer[f.Layer] += uint64(f.Count)
}

// totals are the end frame's totals: data frames, their payload bytes, the
// layers sent and the most positions sent of any layer.
func (t *tally) totals() Totals {
	tot := Totals{Frames: t.frames, Bytes: t.bytes, Layers: uint32(len(t.perLayer))}
	for _, n := range t.perLayer {
		tot.Positions = max(tot.Positions, uint32(min(n, 1<<32-1)))
	}
	return tot
}

// ---- receiving ----

// Receive registers transfer id: pieces any sender sends for it from now
// on arrive in the returned inbox, until its Close. Registering an id that
// is registered already, or on a closed link, gives an inbox whose Next
// fails.
func (l *Link) Receive(id uint64) parallel.KVInbox {
	in := &inbox{l: l, id: id, wake: make(chan struct{}), done: make(chan struct{}), streams: map[*recvStream]struct{}{}, born: time.Now()}
	in.cond.L = &in.mu
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		in.err = fmt.Errorf("kv transfer %d: %w", id, ErrClosed)
		close(in.done)
	case l.inboxes[id] != nil:
		in.err = fmt.Errorf("kv transfer %d is already registered here", id)
		close(in.done)
	default:
		l.inboxes[id] = in
		in.mu.Lock()
		in.timer = time.AfterFunc(l.idle, in.checkIdle)
		in.mu.Unlock()
	}
	return in
}

// inbox is one registered transfer on the receiving side.
type inbox struct {
	l    *Link
	id   uint64
	born time.Time
	last atomic.Int64 // since born, of the last frame that arrived or piece taken

	mu      sync.Mutex
	cond    sync.Cond // handlers wait here for room
	queue   []queued
	bytes   int
	wake    chan struct{} // closed and replaced when a piece is queued
	err     error         // set once: the transfer failed or the inbox closed
	done    chan struct{} // closed with err
	streams map[*recvStream]struct{}
	timer   *time.Timer
	grace   time.Time // after Close: the last moment a stream may end cleanly
}

type queued struct {
	p    *parallel.KVPiece
	rs   *recvStream
	size int
}

// recvStream is one sender's stream into an inbox; pending, ended and
// drained are guarded by the inbox's mu.
type recvStream struct {
	s       *transport.Stream
	peer    string
	pending int           // pieces queued and not yet taken
	ended   bool          // the end frame arrived and matched
	drained chan struct{} // closed when pending drops to zero after ended
}

func (in *inbox) touch() { in.last.Store(int64(time.Since(in.born))) }

func (in *inbox) checkIdle() {
	quiet := time.Since(in.born) - time.Duration(in.last.Load())
	if quiet < in.l.idle {
		in.mu.Lock()
		if in.err == nil {
			in.timer.Reset(in.l.idle - quiet)
		}
		in.mu.Unlock()
		return
	}
	in.mu.Lock()
	open := len(in.streams)
	in.mu.Unlock()
	in.fail(fmt.Errorf("kv transfer %d: nothing arrived for %v (%d streams open): %w", in.id, in.l.idle, open, ErrIdle))
}

func (in *inbox) stopTimer() {
	in.mu.Lock()
	if in.timer != nil {
		in.timer.Stop()
	}
	in.mu.Unlock()
}

// fail fails the transfer with err unless it failed already: queued pieces
// are dropped, Next and the handlers waiting for room return the error, and
// every open stream stops reading; its handler then sends the sender an
// abort frame with the reason.
func (in *inbox) fail(err error) { in.end(err, false) }

// end is fail, or with graceful (Close) fail but for the streams whose
// pieces were all taken: those may still deliver their end frame within
// closeGrace, and are acked if it matches; any other frame, or none, gets
// the abort.
func (in *inbox) end(err error, graceful bool) {
	in.mu.Lock()
	if in.err != nil {
		in.mu.Unlock()
		return
	}
	in.err = err
	var cancel []*recvStream
	if graceful {
		in.grace = time.Now().Add(min(closeGrace, in.l.idle))
	}
	for rs := range in.streams {
		if graceful && rs.pending == 0 {
			_ = rs.s.SetReadDeadline(in.grace)
		} else {
			cancel = append(cancel, rs)
		}
	}
	in.queue, in.bytes = nil, 0
	close(in.done)
	in.cond.Broadcast()
	if in.timer != nil {
		in.timer.Stop()
	}
	in.mu.Unlock()
	in.l.log.Debug("kv transfer ended", zap.Uint64("transfer", in.id), zap.Error(err))
	for _, rs := range cancel {
		rs.s.CancelRead(codeKVAbort)
	}
}

// setReadDeadline bounds the next read of a stream of the inbox: the idle
// timeout, or the grace left after Close.
func (in *inbox) setReadDeadline(s *transport.Stream) {
	in.mu.Lock()
	defer in.mu.Unlock()
	dl := time.Now().Add(in.l.idle)
	if !in.grace.IsZero() && in.grace.Before(dl) {
		dl = in.grace
	}
	_ = s.SetReadDeadline(dl)
}

// Next returns the next piece from any sender, in arrival order, with K and
// V decoded for the frame's whole head range. Once the transfer failed (a
// sender aborted, a frame was corrupt, a stream's totals did not match,
// the idle timeout passed, the inbox or link closed) it returns that error,
// and pieces still queued are dropped. ctx ending returns ctx's error and
// leaves the inbox as it was.
func (in *inbox) Next(ctx context.Context) (*parallel.KVPiece, error) {
	for {
		in.mu.Lock()
		if in.err != nil {
			err := in.err
			in.mu.Unlock()
			return nil, err
		}
		if len(in.queue) > 0 {
			q := in.queue[0]
			in.queue[0] = queued{}
			in.queue = in.queue[1:]
			in.bytes -= q.size
			q.rs.pending--
			if q.rs.pending == 0 && q.rs.ended {
				close(q.rs.drained)
			}
			in.cond.Broadcast()
			in.mu.Unlock()
			in.touch()
			return q.p, nil
		}
		wake := in.wake
		in.mu.Unlock()
		select {
		case <-wake:
		case <-in.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("kv transfer %d: waiting for a piece: %w", in.id, ctx.Err())
		}
	}
}

// Close unregisters the transfer: queued pieces are dropped, senders still
// sending get an abort frame ("closed by the receiver"), and a later
// stream for the id is refused as unexpected. A stream whose pieces were
// all taken may still deliver its end frame for a moment (closeGrace) and
// is then acked, so that a consumer may close as soon as it has every
// piece it expects.
func (in *inbox) Close() {
	in.l.mu.Lock()
	if in.l.inboxes[in.id] == in {
		delete(in.l.inboxes, in.id)
	}
	in.l.mu.Unlock()
	in.end(fmt.Errorf("kv transfer %d was closed by the receiver: %w", in.id, ErrClosed), true)
	in.stopTimer()
}

// deliver queues p, waiting while the inbox is full; it fails once the
// transfer failed.
func (in *inbox) deliver(rs *recvStream, p *parallel.KVPiece, size int) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	for {
		if in.err != nil {
			return in.err
		}
		if in.bytes == 0 || in.bytes+size <= in.l.maxBuffered {
			in.queue = append(in.queue, queued{p: p, rs: rs, size: size})
			in.bytes += size
			rs.pending++
			close(in.wake)
			in.wake = make(chan struct{})
			return nil
		}
		in.cond.Wait()
	}
}

// buffered is the bytes of pieces queued.
func (in *inbox) buffered() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.bytes
}

// bind attaches a stream to the inbox of transfer id.
func (l *Link) bind(rs *recvStream, id uint64) (*inbox, error) {
	l.mu.Lock()
	in := l.inboxes[id]
	l.mu.Unlock()
	if in == nil {
		return nil, fmt.Errorf("kv transfer %d is not expected here", id)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.err != nil {
		return nil, in.err
	}
	in.streams[rs] = struct{}{}
	return in, nil
}

func (in *inbox) unbind(rs *recvStream) {
	in.mu.Lock()
	delete(in.streams, rs)
	in.mu.Unlock()
}

// serve is the kv stream handler.
func (l *Link) serve(s *transport.Stream) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		s.CancelRead(codeKVAbort)
		s.CancelWrite(codeKVAbort)
		return
	}
	l.served[s] = struct{}{}
	l.wg.Add(1)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.served, s)
		l.mu.Unlock()
		l.wg.Done()
	}()
	l.accepted.Add(1)
	l.recvFraming.Add(kindByte)

	rs := &recvStream{s: s, peer: peerName(s.Peer)}
	in, err := l.receive(rs)
	if in != nil {
		in.unbind(rs)
	}
	if err == nil {
		_ = s.Close()
		return
	}
	if errors.Is(err, io.EOF) { // an empty stream
		_ = s.Close()
		return
	}
	if in != nil {
		in.fail(err)
		in.mu.Lock()
		err = in.err // the reason the transfer failed, maybe on another stream
		in.mu.Unlock()
	}
	s.CancelRead(codeKVAbort)
	_ = l.writeControl(s, AbortFrame(transferOf(in, err), err.Error()))
	_ = s.Stream.Close()
}

// transferOf is the transfer an abort frame names: the inbox's, or the one
// an unknown stream asked for (from a refusal) or 0.
func transferOf(in *inbox, err error) uint64 {
	if in != nil {
		return in.id
	}
	var u *unexpected
	if errors.As(err, &u) {
		return u.id
	}
	return 0
}

// unexpected is the refusal of a stream whose transfer is not registered.
type unexpected struct {
	id  uint64
	err error
}

func (u *unexpected) Error() string { return u.err.Error() }
func (u *unexpected) Unwrap() error { return u.err }

// receive reads one stream: it binds to the inbox of the first frame's
// transfer, queues its pieces and answers its end frame with an ack once
// every piece was taken. It returns the inbox it bound to and nil after the
// ack, io.EOF for a stream that ended before any frame, or why the stream
// failed.
func (l *Link) receive(rs *recvStream) (*inbox, error) {
	s := rs.s
	fr := NewFrameReader(s, l.maxFrame)
	var in *inbox
	var got tally
	for {
		if in == nil {
			_ = s.SetReadDeadline(time.Now().Add(l.idle))
		} else {
			in.setReadDeadline(s)
		}
		f, err := fr.Read()
		if err != nil {
			return in, l.readError(in, rs, err)
		}
		if f.Kind == KindData {
			l.recvPayload.Add(uint64(len(f.Payload)))
			l.recvFraming.Add(headerLen + trailerLen)
			l.recvFrames.Add(1)
		} else {
			l.recvFraming.Add(uint64(headerLen + len(f.Payload) + trailerLen))
		}
		if in == nil {
			if in, err = l.bind(rs, f.Transfer); err != nil {
				l.log.Debug("refused a kv stream", zap.String("peer", rs.peer), zap.Uint64("transfer", f.Transfer), zap.Error(err))
				return nil, &unexpected{id: f.Transfer, err: err}
			}
		} else if f.Transfer != in.id {
			return in, fmt.Errorf("kv transfer %d: %s sent a frame of transfer %d on the same stream: %w", in.id, rs.peer, f.Transfer, ErrBadFrame)
		}
		in.touch()
		switch f.Kind {
		case KindData:
			n := f.Count * f.Heads() * f.HeadDim
			kv := make([]uint16, f.halves()*n)
			p := &parallel.KVPiece{Layer: f.Layer, Pos: f.Pos, N: f.Count, HeadLo: f.HeadLo, HeadHi: f.HeadHi, HeadDim: f.HeadDim, K: kv[:n:n]}
			if !f.KOnly {
				p.V = kv[n:]
			}
			if err := f.DecodeHeads(f.HeadLo, f.HeadHi, p.K, p.V); err != nil {
				return in, fmt.Errorf("kv transfer %d: frame from %s: %w", in.id, rs.peer, err)
			}
			got.add(f)
			if err := in.deliver(rs, p, 2*f.halves()*n); err != nil {
				return in, err
			}
		case KindEnd:
			want, err := f.Totals()
			if err != nil {
				return in, fmt.Errorf("kv transfer %d: end frame from %s: %w", in.id, rs.peer, err)
			}
			if have := got.totals(); have != want {
				return in, fmt.Errorf("kv transfer %d: %s says it sent %d frames, %d bytes, %d layers × %d positions; %d frames, %d bytes, %d layers × %d positions arrived: %w",
					in.id, rs.peer, want.Frames, want.Bytes, want.Layers, want.Positions, have.Frames, have.Bytes, have.Layers, have.Positions, ErrAborted)
			}
			return in, l.ack(in, rs)
		case KindAbort:
			return in, fmt.Errorf("kv transfer %d aborted by the sender %s: %s: %w", in.id, rs.peer, f.Reason(), ErrAborted)
		default:
			return in, fmt.Errorf("kv transfer %d: %s sent an %v frame, which only a receiver sends: %w", in.id, rs.peer, f.Kind, ErrBadFrame)
		}
	}
}

// ack answers a matched end frame once every piece of the stream was taken
// by Next.
func (l *Link) ack(in *inbox, rs *recvStream) error {
	in.mu.Lock()
	rs.ended = true
	var drained chan struct{}
	if rs.pending > 0 {
		rs.drained = make(chan struct{})
		drained = rs.drained
	}
	in.mu.Unlock()
	if drained != nil {
		select {
		case <-drained:
		case <-in.done:
			select {
			case <-drained: // taken, then the inbox closed
			default:
				return in.err
			}
		case <-rs.s.Context().Done():
			return fmt.Errorf("kv transfer %d: %s went away before its pieces were taken: %w", in.id, rs.peer, ErrAborted)
		}
	}
	if err := l.writeControl(rs.s, AckFrame(in.id)); err != nil {
		return fmt.Errorf("kv transfer %d: ack to %s: %w", in.id, rs.peer, err)
	}
	return nil
}

// readError says why reading a stream failed.
func (l *Link) readError(in *inbox, rs *recvStream, err error) error {
	if in != nil {
		in.mu.Lock()
		failed := in.err
		in.mu.Unlock()
		if failed != nil {
			return failed
		}
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	what := "kv stream"
	if in != nil {
		what = fmt.Sprintf("kv transfer %d", in.id)
	}
	var fe *frameError
	var se *quic.StreamError
	switch {
	case closed:
		return fmt.Errorf("%s from %s: %w", what, rs.peer, ErrClosed)
	case err == io.EOF && in == nil:
		return io.EOF
	case err == io.EOF:
		return fmt.Errorf("%s: the stream from %s ended before its end frame: %w", what, rs.peer, ErrAborted)
	case errors.As(err, &fe):
		l.log.Warn("refused a kv frame", zap.String("peer", rs.peer), zap.Error(err))
		return fmt.Errorf("%s: stream from %s: %w", what, rs.peer, err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%s: nothing from %s for %v: %w", what, rs.peer, l.idle, ErrIdle)
	case errors.As(err, &se) && se.Remote:
		return fmt.Errorf("%s: %s reset its stream (code %#x): %w", what, rs.peer, uint64(se.ErrorCode), ErrAborted)
	}
	return fmt.Errorf("%s: reading the stream from %s: %w", what, rs.peer, err)
}

// ---- sending ----

// Sender starts sending transfer id from this host.
func (l *Link) Sender(id uint64) parallel.KVSender {
	return &sender{l: l, id: id, outs: map[string]*outStream{}}
}

// sender sends one transfer; each destination gets its own stream, opened
// on the first Send to it, and Sends to different destinations run in
// parallel.
type sender struct {
	l  *Link
	id uint64

	mu     sync.Mutex
	outs   map[string]*outStream
	order  []*outStream
	closed bool
	first  error // the first error of any Send
	result error // Close's, once it returned
	done   chan struct{}
}

// outStream is a transfer's stream to one destination.
type outStream struct {
	l    *Link
	id   uint64
	addr string
	sem  chan struct{} // the right to write; held for a piece or the end

	// Guarded by sem.
	ended bool
	frame Frame // reused for its payload buffer
	sent  tally

	mu      sync.Mutex
	st      *transport.Stream
	err     error         // the stream is unusable
	verdict chan struct{} // closed when the receiver answered (or the read side ended)
	answer  error         // nil for an ack
}

func (s *sender) record(err error) {
	s.mu.Lock()
	if s.first == nil {
		s.first = err
	}
	s.mu.Unlock()
}

// Send writes p to addr as one data frame or, if larger than the frame
// limit, several of whole positions. It returns once the frames are
// written to the stream (QUIC holds them until the peer acknowledges
// them; p is not kept), and blocks while the receiver's flow-control
// window is full, until ctx ends. After a failed Send the stream to addr
// is unusable and later Sends to it fail.
func (s *sender) Send(ctx context.Context, addr string, p *parallel.KVPiece) error {
	err := s.send(ctx, addr, p)
	if err != nil {
		s.record(err)
	}
	return err
}

func (s *sender) send(ctx context.Context, addr string, p *parallel.KVPiece) error {
	if err := checkPiece(s.id, p); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("kv transfer %d: send to %s after Close", s.id, addr)
	}
	o := s.outs[addr]
	if o == nil {
		o = &outStream{l: s.l, id: s.id, addr: addr, sem: make(chan struct{}, 1)}
		s.outs[addr] = o
		s.order = append(s.order, o)
	}
	s.mu.Unlock()
	return o.send(ctx, p)
}

func checkPiece(id uint64, p *parallel.KVPiece) error {
	if p == nil {
		return fmt.Errorf("kv transfer %d: nil piece", id)
	}
	heads := p.HeadHi - p.HeadLo
	if p.Layer < 0 || p.Pos < 0 || p.N <= 0 || p.HeadLo < 0 || heads <= 0 || p.HeadDim <= 0 {
		return fmt.Errorf("kv transfer %d: piece of layer %d positions [%d,%d) heads [%d,%d) dim %d: not a valid range",
			id, p.Layer, p.Pos, p.Pos+p.N, p.HeadLo, p.HeadHi, p.HeadDim)
	}
	if n := p.N * heads * p.HeadDim; len(p.K) != n || len(p.V) != n && p.V != nil { // (nil V: K only)
		return fmt.Errorf("kv transfer %d: piece of layer %d, %d positions × heads [%d,%d) × dim %d takes %d values each of k and v, got %d and %d",
			id, p.Layer, p.N, p.HeadLo, p.HeadHi, p.HeadDim, n, len(p.K), len(p.V))
	}
	return nil
}

func (o *outStream) acquire(ctx context.Context) error {
	select {
	case o.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("kv transfer %d to %s: waiting for the stream: %w", o.id, o.addr, ctx.Err())
	}
}

func (o *outStream) release() { <-o.sem }

// failed is why the stream is unusable: its own error, or the receiver's
// abort if that arrived already.
func (o *outStream) failed() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return o.err
	}
	if o.verdict != nil {
		select {
		case <-o.verdict:
			if o.answer != nil {
				return o.answer
			}
			return fmt.Errorf("kv transfer %d to %s: the receiver acknowledged the transfer before its end frame: %w", o.id, o.addr, ErrBadFrame)
		default:
		}
	}
	return nil
}

// abandon makes the stream unusable with err (unless it is already) and
// resets both directions.
func (o *outStream) abandon(err error) {
	o.mu.Lock()
	if o.err == nil {
		o.err = err
	}
	st := o.st
	o.mu.Unlock()
	if st != nil {
		st.CancelWrite(codeKVAbort)
		st.CancelRead(codeKVAbort)
	}
}

func (o *outStream) stream() *transport.Stream {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.st
}

func (o *outStream) send(ctx context.Context, p *parallel.KVPiece) error {
	if err := o.acquire(ctx); err != nil {
		return err
	}
	defer o.release()
	if o.ended {
		return fmt.Errorf("kv transfer %d: send to %s after Close", o.id, o.addr)
	}
	if err := o.failed(); err != nil {
		return err
	}
	if o.stream() == nil {
		if err := o.open(ctx); err != nil {
			o.abandon(err)
			return err
		}
	}
	heads := p.HeadHi - p.HeadLo
	kOnly := p.V == nil // the receiver's V is a view of K
	proto := Frame{HeadLo: p.HeadLo, HeadHi: p.HeadHi, HeadDim: p.HeadDim, KOnly: kOnly}
	per := proto.maxPositions(o.l.maxFrame)
	if per == 0 {
		return fmt.Errorf("kv transfer %d to %s: one position of %d heads × dim %d takes %d bytes, over the %d-byte frame limit",
			o.id, o.addr, heads, p.HeadDim, proto.dataLen(1, heads), o.l.maxFrame)
	}
	stride := heads * p.HeadDim
	for a := 0; a < p.N; a += per {
		n := min(per, p.N-a)
		f := &o.frame
		*f = Frame{Kind: KindData, Transfer: o.id, Layer: p.Layer, Pos: p.Pos + a, Count: n,
			HeadLo: p.HeadLo, HeadHi: p.HeadHi, HeadDim: p.HeadDim, DType: F16, KOnly: kOnly, Payload: f.Payload}
		var v []uint16
		if !kOnly {
			v = p.V[a*stride : (a+n)*stride]
		}
		if err := f.SetKV(p.K[a*stride:(a+n)*stride], v); err != nil {
			return fmt.Errorf("kv transfer %d to %s: %w", o.id, o.addr, err)
		}
		if err := o.write(ctx, f); err != nil {
			return err
		}
		o.sent.add(f)
		o.l.sentPayload.Add(uint64(len(f.Payload)))
		o.l.sentFraming.Add(headerLen + trailerLen)
		o.l.sentFrames.Add(1)
	}
	return nil
}

// open dials the stream and starts reading the receiver's answer.
func (o *outStream) open(ctx context.Context) error {
	st, err := o.l.ep.Dial(ctx, o.addr, transport.KindKV)
	if err != nil {
		return fmt.Errorf("kv transfer %d: open a kv stream to %s: %w", o.id, o.addr, err)
	}
	o.l.opened.Add(1)
	o.l.sentFraming.Add(kindByte)
	verdict := make(chan struct{})
	o.mu.Lock()
	o.st, o.verdict = st, verdict
	o.mu.Unlock()
	o.l.mu.Lock()
	if !o.l.closed {
		o.l.outs[o] = struct{}{}
	}
	o.l.mu.Unlock()
	if !o.l.track(func() { o.readAnswer(st, verdict) }) {
		err := fmt.Errorf("kv transfer %d to %s: %w", o.id, o.addr, ErrClosed)
		o.mu.Lock()
		o.answer = err
		close(verdict)
		o.mu.Unlock()
		return err
	}
	return nil
}

// readAnswer waits for the receiver's ack or abort frame.
func (o *outStream) readAnswer(st *transport.Stream, verdict chan struct{}) {
	f, err := NewFrameReader(st, MaxReason).Read()
	if err == nil {
		o.l.recvFraming.Add(uint64(headerLen + len(f.Payload) + trailerLen))
	}
	var se *quic.StreamError
	var ans error
	switch {
	case err == nil && f.Kind == KindAck && f.Transfer == o.id:
	case err == nil && f.Kind == KindAbort:
		ans = fmt.Errorf("kv transfer %d to %s: aborted by the receiver: %s: %w", o.id, o.addr, f.Reason(), ErrAborted)
	case err == nil:
		ans = fmt.Errorf("kv transfer %d to %s: the receiver answered with an unexpected %v: %w", o.id, o.addr, f, ErrBadFrame)
	case err == io.EOF:
		ans = fmt.Errorf("kv transfer %d to %s: the receiver closed the stream without an answer: %w", o.id, o.addr, ErrAborted)
	case errors.As(err, &se) && se.Remote:
		ans = fmt.Errorf("kv transfer %d to %s: the receiver reset the stream (code %#x): %w", o.id, o.addr, uint64(se.ErrorCode), ErrAborted)
	default:
		ans = fmt.Errorf("kv transfer %d to %s: waiting for the receiver's answer: %w", o.id, o.addr, err)
	}
	o.mu.Lock()
	o.answer = ans
	close(verdict)
	o.mu.Unlock()
}

// write writes one frame within ctx. A frame the codec refuses leaves the
// stream as it was; a failed write abandons it, with the receiver's reason
// when it sent one.
func (o *outStream) write(ctx context.Context, f *Frame) error {
	st := o.stream()
	err := withDeadline(ctx, st.SetWriteDeadline, func() error { return WriteFrame(st, f) })
	if err == nil {
		return nil
	}
	var fe *frameError
	if errors.As(err, &fe) {
		return fmt.Errorf("kv transfer %d to %s: %w", o.id, o.addr, err)
	}
	if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
		// The stream's deadline is ctx's, and may fire a moment before
		// ctx reports it.
		cause := ctx.Err()
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		err = fmt.Errorf("kv transfer %d to %s: writing a %v frame: %w", o.id, o.addr, f.Kind, cause)
	} else {
		err = fmt.Errorf("kv transfer %d to %s: writing a %v frame: %w", o.id, o.addr, f.Kind, err)
		o.mu.Lock()
		verdict := o.verdict
		o.mu.Unlock()
		t := time.NewTimer(answerGrace)
		select {
		case <-verdict:
			o.mu.Lock()
			if o.err != nil {
				err = o.err // abandoned meanwhile (the link closed)
			} else if errors.Is(o.answer, ErrAborted) {
				err = o.answer
			}
			o.mu.Unlock()
		case <-t.C:
		}
		t.Stop()
	}
	o.abandon(err)
	return err
}

// Close writes each stream's end frame with its totals, waits (within
// ctx) for every receiver's ack, and closes the streams, in parallel over
// destinations. It returns the first error of any Send, else the first
// error of the streams in the order they were opened (a receiver's abort
// names its reason and address). Closing again returns the same.
func (s *sender) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		done := s.done
		s.mu.Unlock()
		<-done
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.result
	}
	s.closed = true
	s.done = make(chan struct{})
	order := s.order
	s.mu.Unlock()
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, o := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = o.finish(ctx)
		}()
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.result = s.first
	for _, err := range errs {
		if s.result == nil {
			s.result = err
		}
	}
	close(s.done)
	return s.result
}

// finish ends one stream: end frame, FIN, the receiver's answer.
func (o *outStream) finish(ctx context.Context) error {
	defer func() {
		o.l.mu.Lock()
		delete(o.l.outs, o)
		o.l.mu.Unlock()
	}()
	if err := o.acquire(ctx); err != nil {
		o.abandon(err)
		return err
	}
	defer o.release()
	o.ended = true
	if err := o.failed(); err != nil {
		o.abandon(err)
		return err
	}
	st := o.stream()
	if st == nil {
		return nil
	}
	end := EndFrame(o.id, o.sent.totals())
	if err := o.write(ctx, end); err != nil {
		return err
	}
	o.l.sentFraming.Add(headerLen + endLen + trailerLen)
	_ = st.CloseWrite()
	o.mu.Lock()
	verdict := o.verdict
	o.mu.Unlock()
	select {
	case <-verdict:
	case <-ctx.Done():
		err := fmt.Errorf("kv transfer %d to %s: no ack from the receiver: %w", o.id, o.addr, ctx.Err())
		o.abandon(err)
		return err
	}
	o.mu.Lock()
	err := o.err
	if err == nil {
		err = o.answer
	}
	o.mu.Unlock()
	if err != nil {
		o.abandon(err)
		return err
	}
	st.CancelRead(0)
	return nil
}
