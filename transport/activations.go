package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// MailboxOptions tune a Mailbox. Zero values take the defaults.
type MailboxOptions struct {
	// MaxFrame bounds the payload of one received tensor frame
	// (DefaultMaxTensorFrame); larger frames are refused unread.
	MaxFrame int
	// MaxBuffered bounds the bytes of received tensors held until Recv asks
	// for them (DefaultMaxBuffered). A full mailbox stops reading, and QUIC
	// flow control then blocks the sender's Send.
	MaxBuffered int
}

// DefaultMaxBuffered is the default receive buffer of a Mailbox and of the
// collectives of an endpoint.
const DefaultMaxBuffered = 64 << 20

// ErrClosed is returned by calls on a closed Mailbox or Group.
var ErrClosed = errors.New("transport: closed")

// Mailbox moves activations (hidden states) between pipeline stages over
// streams of KindActivations: one long-lived stream per peer and direction,
// frames matched to receivers by (id, tag).
type Mailbox struct {
	ep       *Endpoint
	in       *inbox
	out      *links
	maxFrame int
	once     sync.Once
	stop     func() bool
}

// NewMailbox serves KindActivations on ep. An endpoint has one mailbox;
// it closes with the endpoint.
func NewMailbox(ep *Endpoint, opt MailboxOptions) *Mailbox {
	if opt.MaxFrame <= 0 {
		opt.MaxFrame = DefaultMaxTensorFrame
	}
	if opt.MaxBuffered <= 0 {
		opt.MaxBuffered = DefaultMaxBuffered
	}
	m := &Mailbox{ep: ep, in: newInbox(opt.MaxBuffered), out: newLinks(ep, KindActivations), maxFrame: opt.MaxFrame}
	ep.Handle(KindActivations, func(s *Stream) {
		serveTensorStream(s, m.in, MsgActivation, m.maxFrame)
	})
	m.stop = context.AfterFunc(ep.ctx, func() { m.shutdown(net.ErrClosed) })
	return m
}

var framePool = sync.Pool{New: func() any { return new([]byte) }}

// Send encodes the rows x cols tensor data as dtype and sends it to the
// endpoint at addr, where Recv(ctx, <this node>, id, tag, ...) takes it.
// It returns once the frame is handed to QUIC; it blocks while the receiver
// is behind (its buffer and the flow-control window are full) and fails when
// ctx ends first.
func (m *Mailbox) Send(ctx context.Context, addr string, id uint64, tag string, dtype DType, rows, cols int, data []float32) error {
	h := TensorHeader{Type: MsgActivation, DType: dtype, ID: id, Tag: tag, Rows: rows, Cols: cols}
	if err := h.check(); err != nil {
		return err
	}
	if n := dtype.EncodedLen(len(data)); n > m.maxFrame {
		return fmt.Errorf("transport: send %q #%d: %w: %d bytes, limit %d", tag, id, ErrFrameTooLarge, n, m.maxFrame)
	}
	bp := framePool.Get().(*[]byte)
	defer framePool.Put(bp)
	b, err := AppendTensorMessage((*bp)[:0], h, data)
	*bp = b
	if err != nil {
		return err
	}
	if m.ep.IsSelf(ctx, addr) {
		// To this node's own mailbox (logits to a driver that is also the
		// last stage): the frame is read from memory, not carried through
		// QUIC's encryption, packets and syscalls twice. On one core that
		// was about 10 ms of a 110 ms decode step of 8 sequences, each
		// returning 128 KB of logits.
		if err := m.deliverSelf(ctx, b); err != nil {
			return fmt.Errorf("transport: send %q #%d to this node: %w", tag, id, err)
		}
		return nil
	}
	if err := m.out.write(ctx, addr, b); err != nil {
		return fmt.Errorf("transport: send %q #%d to %s: %w", tag, id, addr, err)
	}
	return nil
}

// Local reports whether Send to addr stays on this node (delivered from
// memory, nothing on the network).
func (m *Mailbox) Local(ctx context.Context, addr string) bool { return m.ep.IsSelf(ctx, addr) }

// deliverSelf puts an encoded tensor message into this mailbox as if it
// had arrived from this node, checks included.
func (m *Mailbox) deliverSelf(ctx context.Context, b []byte) error {
	bp := recvPool.Get().(*[]byte)
	f, body, err := readTensorFrame(bytes.NewReader(b), m.maxFrame, *bp)
	*bp = body[:0]
	if err == nil && f.Type != MsgActivation {
		err = fmt.Errorf("%w: message type %d for a mailbox", ErrBadTensorFrame, f.Type)
	}
	if err != nil {
		recvPool.Put(bp)
		return err
	}
	return m.in.deliverCtx(ctx, &message{from: m.ep.selfPeer(), frame: f, size: len(f.Payload) + len(f.Tag), buf: bp})
}

// Recv waits for the tensor sent with id and tag by from (a node ID or
// endpoint address; "" accepts any sender), decodes it into dst and
// returns its shape. dst must hold at least rows*cols values. Frames with
// the same (id, tag) from one sender are received in the order sent.
func (m *Mailbox) Recv(ctx context.Context, from string, id uint64, tag string, dst []float32) (rows, cols int, err error) {
	msg, err := m.in.take(ctx, inboxKey{id, tag}, from, nil)
	if err != nil {
		if from == "" {
			from = "any peer"
		}
		return 0, 0, fmt.Errorf("transport: receive %q #%d from %s: %w", tag, id, from, err)
	}
	if err := msg.decode(dst); err != nil {
		return msg.frame.Rows, msg.frame.Cols, err
	}
	return msg.frame.Rows, msg.frame.Cols, nil
}

// Buffered reports the bytes of received tensors not yet taken by Recv.
func (m *Mailbox) Buffered() int { return m.in.buffered() }

// Close stops serving activations: pending and later calls fail with
// ErrClosed, streams are reset. It does not close the endpoint.
func (m *Mailbox) Close() error {
	m.stop()
	m.shutdown(ErrClosed)
	return nil
}

func (m *Mailbox) shutdown(err error) {
	m.once.Do(func() {
		m.in.close(err)
		m.out.close()
	})
}
