package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"go.uber.org/zap"
)

// Stream error codes of the tensor streams (activations, collectives).
const (
	codeTensorAbort  quic.StreamErrorCode = 0x20 // the writer gave up inside a frame
	codeTensorBad    quic.StreamErrorCode = 0x21 // the reader refused a frame
	codeTensorClosed quic.StreamErrorCode = 0x22 // the reader's mailbox or group hub closed
)

// streamReady is the byte a tensor stream's handler writes once it serves
// the stream, so that the dialer knows its frames will be read.
const streamReady = 0x01

// message is a received tensor frame waiting for its reader.
type message struct {
	from  Peer
	frame TensorFrame
	size  int     // bytes counted against the inbox budget
	buf   *[]byte // pooled buffer under frame.Payload
}

// recvPool recycles the buffers frames are read into, so that a stream of
// large activations does not allocate (and zero) a new buffer each time.
var recvPool = sync.Pool{New: func() any { return new([]byte) }}

// decode decodes the payload into dst and returns the buffer to the pool;
// the message must not be used afterwards.
func (m *message) decode(dst []float32) error {
	err := m.frame.Decode(dst)
	if m.buf != nil {
		recvPool.Put(m.buf)
		m.buf = nil
	}
	m.frame.Payload = nil
	return err
}

type inboxKey struct {
	id  uint64
	tag string
}

type waiter struct {
	from string
	ch   chan *message // capacity 1
}

func fromMatches(from string, p Peer) bool {
	return from == "" || from == p.ID || (p.Addr != nil && from == p.Addr.String())
}

// inbox holds received tensor frames until someone asks for them by (id,
// tag). It buffers at most limit bytes; a frame that does not fit waits in
// the stream's handler, which then stops reading, so QUIC flow control
// slows the sender down. A frame somebody is already waiting for is handed
// over without counting against the budget.
type inbox struct {
	mu      sync.Mutex
	cond    sync.Cond
	queued  map[inboxKey][]*message
	waiting map[inboxKey][]*waiter
	bytes   int
	limit   int
	err     error
	done    chan struct{}
	drop    func(tag string) bool // frames nobody will ever read (closed groups)
}

func newInbox(limit int) *inbox {
	in := &inbox{
		queued:  map[inboxKey][]*message{},
		waiting: map[inboxKey][]*waiter{},
		limit:   limit,
		done:    make(chan struct{}),
	}
	in.cond.L = &in.mu
	return in
}

// deliver stores m or hands it to a waiting reader. It blocks while the
// buffer is full and fails once the inbox is closed.
func (in *inbox) deliver(m *message) error { return in.deliverCtx(context.Background(), m) }

// deliverCtx is deliver giving up when ctx ends while the inbox is full.
func (in *inbox) deliverCtx(ctx context.Context, m *message) error {
	key := inboxKey{m.frame.ID, m.frame.Tag}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			in.mu.Lock()
			in.cond.Broadcast()
			in.mu.Unlock()
		})
		defer stop()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	for {
		if in.err != nil {
			return in.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		ws := in.waiting[key]
		for i, w := range ws {
			if fromMatches(w.from, m.from) {
				in.removeWaiter(key, i)
				w.ch <- m
				return nil
			}
		}
		if in.drop != nil && in.drop(m.frame.Tag) {
			return nil
		}
		if in.bytes == 0 || in.bytes+m.size <= in.limit {
			in.queued[key] = append(in.queued[key], m)
			in.bytes += m.size
			return nil
		}
		in.cond.Wait()
	}
}

func (in *inbox) removeWaiter(key inboxKey, i int) {
	ws := in.waiting[key]
	if len(ws) == 1 {
		delete(in.waiting, key)
		return
	}
	in.waiting[key] = append(ws[:i:i], ws[i+1:]...)
}

// errLinkLost is returned by take when the stream to the awaited peer ended.
var errLinkLost = errors.New("the stream to the peer ended")

// take returns the oldest frame with the key sent by from ("" for anyone),
// waiting for it until ctx ends, the inbox closes or lost is closed (nil
// never is).
func (in *inbox) take(ctx context.Context, key inboxKey, from string, lost <-chan struct{}) (*message, error) {
	in.mu.Lock()
	if in.err != nil {
		in.mu.Unlock()
		return nil, in.err
	}
	q := in.queued[key]
	for i, m := range q {
		if fromMatches(from, m.from) {
			if len(q) == 1 {
				delete(in.queued, key)
			} else {
				in.queued[key] = append(q[:i:i], q[i+1:]...)
			}
			in.bytes -= m.size
			in.cond.Broadcast()
			in.mu.Unlock()
			return m, nil
		}
	}
	w := &waiter{from: from, ch: make(chan *message, 1)}
	in.waiting[key] = append(in.waiting[key], w)
	in.cond.Broadcast() // a handler blocked on a full buffer may hold this frame
	in.mu.Unlock()

	var err error
	select {
	case m := <-w.ch:
		return m, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-in.done:
		err = in.err
	case <-lost:
		err = errLinkLost
	}
	in.mu.Lock()
	for i, x := range in.waiting[key] {
		if x == w {
			in.removeWaiter(key, i)
			break
		}
	}
	in.mu.Unlock()
	select {
	case m := <-w.ch: // delivered while giving up
		return m, nil
	default:
		return nil, err
	}
}

// purge drops the queued frames whose tag matches.
func (in *inbox) purge(match func(tag string) bool) {
	in.mu.Lock()
	for k, q := range in.queued {
		if match(k.tag) {
			for _, m := range q {
				in.bytes -= m.size
			}
			delete(in.queued, k)
		}
	}
	in.cond.Broadcast()
	in.mu.Unlock()
}

// buffered reports the bytes held for readers.
func (in *inbox) buffered() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.bytes
}

func (in *inbox) close(err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.err != nil {
		return
	}
	in.err = err
	in.queued = map[inboxKey][]*message{}
	in.bytes = 0
	close(in.done)
	in.cond.Broadcast()
}

// serveTensorStream reads the frames of one incoming stream into in until
// the stream ends, a frame is refused or the inbox closes.
func serveTensorStream(s *Stream, in *inbox, typ MsgType, maxPayload int) {
	log := zap.L().Named("transport")
	select {
	case <-in.done:
		s.CancelRead(codeTensorClosed)
		s.CancelWrite(codeTensorClosed)
		return
	default:
	}
	exit := make(chan struct{})
	defer close(exit)
	go func() {
		select {
		case <-in.done:
			s.CancelRead(codeTensorClosed)
			s.CancelWrite(codeTensorClosed)
		case <-exit:
		}
	}()
	if _, err := s.Write([]byte{streamReady}); err != nil {
		s.CancelRead(codeTensorClosed)
		return
	}
	for {
		bp := recvPool.Get().(*[]byte)
		f, body, err := readTensorFrame(s, maxPayload, *bp)
		*bp = body[:0]
		if err == nil && f.Type != typ {
			err = fmt.Errorf("%w: message type %d on a %v stream", ErrBadTensorFrame, f.Type, s.Kind)
		}
		if err != nil {
			if errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrBadTensorFrame) || errors.Is(err, ErrChecksum) {
				log.Warn("refused tensor frame", zap.Stringer("kind", s.Kind), zap.String("peer", s.Peer.ID), zap.Error(err))
				s.CancelRead(codeTensorBad)
				s.CancelWrite(codeTensorBad)
				return
			}
			s.CancelRead(codeTensorClosed)
			_ = s.Stream.Close()
			return
		}
		m := &message{from: s.Peer, frame: f, size: len(f.Payload) + len(f.Tag), buf: bp}
		if in.deliver(m) != nil {
			return
		}
	}
}

// links keeps one long-lived outgoing stream of a kind per peer address.
// Writes to one peer are serialized; a frame is written whole or the stream
// is abandoned and the next write opens a new one.
type links struct {
	ep   *Endpoint
	kind Kind

	mu     sync.Mutex
	out    map[string]*link
	closed bool
}

type link struct {
	sem chan struct{} // the right to write; held for a whole frame

	mu   sync.Mutex // guards st and dead against close
	st   *Stream
	dead chan struct{} // closed when the peer ends the stream
}

func newLinks(ep *Endpoint, kind Kind) *links {
	return &links{ep: ep, kind: kind, out: map[string]*link{}}
}

func (l *links) get(addr string) (*link, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, net.ErrClosed
	}
	k := l.out[addr]
	if k == nil {
		k = &link{sem: make(chan struct{}, 1)}
		l.out[addr] = k
	}
	return k, nil
}

// lost returns a channel closed when the current stream to addr ends, or
// nil when there is none.
func (l *links) lost(addr string) <-chan struct{} {
	l.mu.Lock()
	k := l.out[addr]
	l.mu.Unlock()
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.st == nil {
		return nil
	}
	return k.dead
}

// protocol is the protocol negotiated on the current stream to addr, 0
// when there is none.
func (l *links) protocol(addr string) int {
	l.mu.Lock()
	k := l.out[addr]
	l.mu.Unlock()
	if k == nil {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.st == nil {
		return 0
	}
	return k.st.Peer.Protocol
}

func abandon(st *Stream) {
	st.CancelWrite(codeTensorAbort)
	st.CancelRead(codeTensorAbort)
}

// stream returns the open stream of k, opening one when there is none or
// the peer ended it. The caller holds k.sem.
func (l *links) stream(ctx context.Context, k *link, addr string) (*Stream, error) {
	k.mu.Lock()
	st, dead := k.st, k.dead
	k.mu.Unlock()
	if st != nil {
		select {
		case <-dead:
			abandon(st)
		default:
			return st, nil
		}
	}
	st, dead, err := l.open(ctx, addr)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		abandon(st)
		return nil, net.ErrClosed
	}
	k.mu.Lock()
	k.st, k.dead = st, dead
	k.mu.Unlock()
	return st, nil
}

// write sends one complete frame to addr. ctx bounds waiting for the
// stream, opening it and the write itself (which blocks while the peer's
// flow-control window is full).
func (l *links) write(ctx context.Context, addr string, frame []byte) error {
	k, err := l.get(addr)
	if err != nil {
		return err
	}
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-k.sem }()
	st, err := l.stream(ctx, k, addr)
	if err != nil {
		return err
	}
	err = withDeadline(ctx, st.SetWriteDeadline, func() error {
		_, err := st.Write(frame)
		return err
	})
	if err != nil {
		abandon(st)
		k.mu.Lock()
		if k.st == st {
			k.st = nil
		}
		k.mu.Unlock()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

// withDeadline runs f with the stream deadline set by set following ctx:
// its deadline, and an immediate one if ctx is cancelled while f runs.
func withDeadline(ctx context.Context, set func(time.Time) error, f func() error) error {
	dl, _ := ctx.Deadline()
	_ = set(dl)
	if ctx.Done() == nil {
		return f()
	}
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

// open dials a stream and waits for the handler's ready byte. A peer that
// does not serve the kind yet (it is still starting) is retried until ctx
// ends.
func (l *links) open(ctx context.Context, addr string) (*Stream, chan struct{}, error) {
	backoff := 5 * time.Millisecond
	for {
		st, err := l.ep.Dial(ctx, addr, l.kind)
		if err == nil {
			var b [1]byte
			err = withDeadline(ctx, st.SetReadDeadline, func() error {
				_, err := io.ReadFull(st, b[:])
				return err
			})
			if err == nil && b[0] == streamReady {
				dead := make(chan struct{})
				go func() {
					// The peer never writes after the ready byte: any
					// return means the stream or connection ended.
					_, _ = st.Read(b[:])
					close(dead)
				}()
				return st, dead, nil
			}
			abandon(st)
			if err == nil {
				err = fmt.Errorf("unexpected greeting %#02x", b[0])
			}
		}
		var se *quic.StreamError
		if !errors.As(err, &se) || se.ErrorCode != codeUnknownKind || ctx.Err() != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w (%v)", ctx.Err(), err)
			}
			return nil, nil, fmt.Errorf("open %v stream to %s: %w", l.kind, addr, err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("open %v stream to %s: %w (the peer does not serve it)", l.kind, addr, ctx.Err())
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}

// close abandons every stream; writes in progress fail at once.
func (l *links) close() {
	l.mu.Lock()
	l.closed = true
	out := l.out
	l.out = map[string]*link{}
	l.mu.Unlock()
	for _, k := range out {
		k.mu.Lock()
		if k.st != nil {
			abandon(k.st)
			k.st = nil
		}
		k.mu.Unlock()
	}
}
