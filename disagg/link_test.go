package disagg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shoal/parallel"
	"shoal/transport"
	"shoal/transport/transporttest"
)

var linkCA = sync.OnceValue(func() *transport.CA { return transporttest.CA("disagg-link-test-secret-0123") })

// listen opens an endpoint on loopback with a certificate for node, closed
// when the test ends.
func listen(t *testing.T, node string) *transport.Endpoint {
	t.Helper()
	ep := transporttest.Listen(t, linkCA(), node)
	t.Cleanup(func() { ep.Close() })
	return ep
}

// newLink serves kv streams on ep until the test ends (closed before ep).
func newLink(t *testing.T, ep *transport.Endpoint, opt LinkOptions) *Link {
	l := NewLink(ep, opt)
	t.Cleanup(l.Close)
	return l
}

// noLeaks fails the test if, once everything the test set up is closed,
// more goroutines run than before it started. Call it first, so that its
// check runs after the other cleanups.
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("%d goroutines before the test, %d after:\n%s", before, n, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func addr(ep *transport.Endpoint) string { return ep.Addr().String() }

// kvStamp is a distinct F16 bit pattern per element.
func kvStamp(isV bool, layer, pos, head, d int) uint16 {
	x := uint16(layer*7919+pos*131+head*17+d) & 0x7fff
	if isV {
		x |= 0x8000
	}
	return x
}

// piece builds the stamped piece of layer, positions [pos, pos+n) and
// heads [lo, hi) of dim.
func piece(layer, pos, n, lo, hi, dim int) *parallel.KVPiece {
	p := &parallel.KVPiece{Layer: layer, Pos: pos, N: n, HeadLo: lo, HeadHi: hi, HeadDim: dim}
	for t := pos; t < pos+n; t++ {
		for h := lo; h < hi; h++ {
			for d := 0; d < dim; d++ {
				p.K = append(p.K, kvStamp(false, layer, t, h, d))
				p.V = append(p.V, kvStamp(true, layer, t, h, d))
			}
		}
	}
	return p
}

// checkStamps compares a received piece with the stamps.
func checkStamps(t *testing.T, p *parallel.KVPiece) {
	t.Helper()
	want := piece(p.Layer, p.Pos, p.N, p.HeadLo, p.HeadHi, p.HeadDim)
	if len(p.K) != len(want.K) || len(p.V) != len(want.V) {
		t.Fatalf("piece layer %d [%d,+%d) heads [%d,%d): %d and %d values, want %d", p.Layer, p.Pos, p.N, p.HeadLo, p.HeadHi, len(p.K), len(p.V), len(want.K))
	}
	for i := range want.K {
		if p.K[i] != want.K[i] || p.V[i] != want.V[i] {
			t.Fatalf("piece layer %d [%d,+%d) heads [%d,%d): element %d is k %#x v %#x, want %#x %#x",
				p.Layer, p.Pos, p.N, p.HeadLo, p.HeadHi, i, p.K[i], p.V[i], want.K[i], want.V[i])
		}
	}
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLinkTwoSenders: two tensor-parallel prefill members (heads [0,2) and
// [2,4)) send four layers of a 37-token prompt in chunks to one decode
// member; every element arrives once and intact, both senders' Close see
// the ack, and the byte counts are exactly payload plus 40 bytes a frame,
// the end frame, the stream-kind byte and the ack.
func TestLinkTwoSenders(t *testing.T) {
	noLeaks(t)
	const (
		id, layers, prompt, chunk, dim = 7, 4, 37, 16, 8
	)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	epA, epB, epC := listen(t, "a"), listen(t, "b"), listen(t, "c")
	lA, lB, lC := newLink(t, epA, LinkOptions{}), newLink(t, epB, LinkOptions{}), newLink(t, epC, LinkOptions{})
	in := lC.Receive(id)
	defer in.Close()

	send := func(l *Link, lo, hi int) (payload uint64, frames int, err error) {
		s := l.Sender(id)
		for layer := 0; layer < layers; layer++ {
			for p := 0; p < prompt; p += chunk {
				pc := piece(layer, p, min(chunk, prompt-p), lo, hi, dim)
				if err := s.Send(ctx, addr(epC), pc); err != nil {
					return 0, 0, err
				}
				payload += uint64(DataLen(pc.N, hi-lo, dim))
				frames++
			}
		}
		return payload, frames, s.Close(ctx)
	}
	type result struct {
		payload uint64
		frames  int
		err     error
	}
	res := make([]chan result, 2)
	for i, l := range []*Link{lA, lB} {
		res[i] = make(chan result, 1)
		go func() {
			p, f, err := send(l, 2*i, 2*i+2)
			res[i] <- result{p, f, err}
		}()
	}

	seen := map[[3]int]int{} // layer, head, position → times
	for n := 0; n < 2*layers*3; n++ {
		p, err := in.Next(ctx)
		if err != nil {
			t.Fatalf("piece %d: %v", n, err)
		}
		checkStamps(t, p)
		for h := p.HeadLo; h < p.HeadHi; h++ {
			for q := p.Pos; q < p.Pos+p.N; q++ {
				seen[[3]int{p.Layer, h, q}]++
			}
		}
	}
	if len(seen) != layers*4*prompt {
		t.Fatalf("%d (layer, head, position) arrived, want %d", len(seen), layers*4*prompt)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("layer %d head %d position %d arrived %d times", k[0], k[1], k[2], n)
		}
	}
	var total uint64
	for i, l := range []*Link{lA, lB} {
		r := <-res[i]
		if r.err != nil {
			t.Fatalf("sender %d: %v", i, r.err)
		}
		total += r.payload
		want := LinkStats{
			SentPayload: r.payload, SentFraming: uint64(40*r.frames + 64 + 1), SentFrames: uint64(r.frames),
			RecvFraming: 40, StreamsOpened: 1,
		}
		if got := l.Stats(); got != want {
			t.Errorf("sender %d stats %+v, want %+v", i, got, want)
		}
	}
	want := LinkStats{
		RecvPayload: total, RecvFraming: 2 * (40*12 + 64 + 1), RecvFrames: 24,
		SentFraming: 2 * 40, StreamsAccepted: 2,
	}
	eventually(t, "receiver stats", func() bool { return lC.Stats() == want })
}

// TestLinkSplitsLargePieces: a piece over the sender's frame limit goes as
// frames of whole positions, each arriving as its own piece.
func TestLinkSplitsLargePieces(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{MaxFrame: 4096})
	lB := newLink(t, epB, LinkOptions{})
	in := lB.Receive(3)
	defer in.Close()
	s := lA.Sender(3)
	// 2 heads × dim 8: 64 bytes a position, 64 positions a frame.
	big := piece(5, 10, 100, 1, 3, 8)
	if err := s.Send(ctx, addr(epB), big); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close(ctx) }()
	var k, v []uint16
	for _, want := range [][2]int{{10, 64}, {74, 36}} {
		p, err := in.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p.Layer != 5 || p.Pos != want[0] || p.N != want[1] || p.HeadLo != 1 || p.HeadHi != 3 || p.HeadDim != 8 {
			t.Fatalf("piece layer %d positions [%d,+%d) heads [%d,%d)×%d, want layer 5 [%d,+%d) heads [1,3)×8",
				p.Layer, p.Pos, p.N, p.HeadLo, p.HeadHi, p.HeadDim, want[0], want[1])
		}
		k, v = append(k, p.K...), append(v, p.V...)
	}
	if !slicesEqual(k, big.K) || !slicesEqual(v, big.V) {
		t.Fatal("the frames do not add up to the piece")
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if st := lA.Stats(); st.SentFrames != 2 || st.SentPayload != 6400 {
		t.Fatalf("sent %d frames, %d payload bytes; want 2 and 6400", st.SentFrames, st.SentPayload)
	}
	// A position that cannot fit one frame is refused before anything
	// is written.
	s2 := lA.Sender(4)
	if err := s2.Send(ctx, addr(epB), piece(0, 0, 1, 0, 64, 32)); err == nil || !strings.Contains(err.Error(), "frame limit") {
		t.Fatalf("oversized position: %v", err)
	}
	_ = s2.Close(ctx)
}

func slicesEqual(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLinkRefusesUnknownTransfer: a transfer nobody registered is aborted
// by the receiver, and the sender's Close says so, naming the transfer
// and the receiver.
func TestLinkRefusesUnknownTransfer(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{})
	newLink(t, epB, LinkOptions{})
	s := lA.Sender(99)
	_ = s.Send(ctx, addr(epB), piece(0, 0, 4, 0, 2, 8)) // may pass before the refusal arrives
	err := s.Close(ctx)
	if err == nil || !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "kv transfer 99 is not expected here") || !strings.Contains(err.Error(), addr(epB)) {
		t.Fatalf("Close: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the refusal took until the test's deadline")
	}
}

// rawStream opens a kv stream from ep to the node at to, to write frames
// by hand.
func rawStream(t *testing.T, ctx context.Context, ep *transport.Endpoint, to string) *transport.Stream {
	t.Helper()
	st, err := ep.Dial(ctx, to, transport.KindKV)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func frameBytes(t *testing.T, f *Frame) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := WriteFrame(&b, f); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func rawDataFrame(t *testing.T, id uint64, layer int) *Frame {
	t.Helper()
	p := piece(layer, 0, 3, 0, 2, 4)
	f := &Frame{Kind: KindData, Transfer: id, Layer: layer, Count: 3, HeadHi: 2, HeadDim: 4, DType: F16}
	if err := f.SetKV(p.K, p.V); err != nil {
		t.Fatal(err)
	}
	return f
}

// readAbort reads the receiver's answer on a raw stream: it must be an
// abort frame whose reason contains want.
func readAbort(t *testing.T, st *transport.Stream, want string) {
	t.Helper()
	_ = st.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := ReadFrame(st, MaxReason)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	if f.Kind != KindAbort || !strings.Contains(f.Reason(), want) {
		t.Fatalf("answer %v, want an abort naming %q", f, want)
	}
}

// TestLinkCorruptFrames: a frame with a bad checksum, a stream of garbage
// and an end frame whose totals do not match are each refused with a
// reason (to the inbox as an error, to the writer as an abort frame), and
// the link goes on serving good transfers.
func TestLinkCorruptFrames(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{})
	lB := newLink(t, epB, LinkOptions{})

	t.Run("checksum", func(t *testing.T) {
		in := lB.Receive(5)
		defer in.Close()
		st := rawStream(t, ctx, epA, addr(epB))
		good := frameBytes(t, rawDataFrame(t, 5, 0))
		bad := frameBytes(t, rawDataFrame(t, 5, 1))
		bad[headerLen+3] ^= 0x40
		if _, err := st.Write(good); err != nil {
			t.Fatal(err)
		}
		p, err := in.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkStamps(t, p)
		if _, err := st.Write(bad); err != nil {
			t.Fatal(err)
		}
		_, err = in.Next(ctx)
		if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "kv transfer 5") {
			t.Fatalf("after a corrupt frame: %v", err)
		}
		readAbort(t, st, "checksum")
	})

	t.Run("garbage", func(t *testing.T) {
		st := rawStream(t, ctx, epA, addr(epB))
		if _, err := st.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("x", 64))); err != nil {
			t.Fatal(err)
		}
		readAbort(t, st, "not a kv frame")
	})

	t.Run("totals", func(t *testing.T) {
		in := lB.Receive(6)
		defer in.Close()
		st := rawStream(t, ctx, epA, addr(epB))
		f := rawDataFrame(t, 6, 0)
		if _, err := st.Write(frameBytes(t, f)); err != nil {
			t.Fatal(err)
		}
		if _, err := in.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Write(frameBytes(t, EndFrame(6, Totals{Frames: 2, Bytes: 2 * uint64(len(f.Payload)), Layers: 1, Positions: 6}))); err != nil {
			t.Fatal(err)
		}
		_, err := in.Next(ctx)
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "says it sent 2 frames") {
			t.Fatalf("after an end frame that does not match: %v", err)
		}
		readAbort(t, st, "says it sent 2 frames")
	})

	t.Run("good after", func(t *testing.T) {
		in := lB.Receive(8)
		defer in.Close()
		s := lA.Sender(8)
		if err := s.Send(ctx, addr(epB), piece(2, 0, 5, 0, 2, 8)); err != nil {
			t.Fatal(err)
		}
		p, err := in.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		checkStamps(t, p)
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// sendUntilError sends 16 KiB pieces to to until a Send fails, counting
// the pieces sent.
func sendUntilError(ctx context.Context, s parallel.KVSender, to string, sent *atomic.Int64) error {
	for i := 0; ; i++ {
		if err := s.Send(ctx, to, piece(i%32, 64*(i/32), 64, 0, 8, 8)); err != nil {
			return err
		}
		sent.Add(1)
	}
}

// waitStalled waits until sent stops growing for 200 ms.
func waitStalled(t *testing.T, sent *atomic.Int64, failed <-chan error) int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	last, since := sent.Load(), time.Now()
	for time.Since(since) < 200*time.Millisecond {
		select {
		case err := <-failed:
			t.Fatalf("the sender failed instead of blocking: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if n := sent.Load(); n != last {
			last, since = n, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatal("the sender never blocked")
		}
	}
	return last
}

// TestLinkBackpressure: a receiver whose consumer does not take pieces
// holds at most MaxBuffered bytes; its handler stops reading, QUIC flow
// control blocks the sender, whose Send returns at its context's deadline
// instead of hanging. Meanwhile the same transfer's stream to another
// receiver is not held up.
func TestLinkBackpressure(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const limit = 64 << 10
	epA, epB, epC := listen(t, "a"), listen(t, "b"), listen(t, "c")
	lA := newLink(t, epA, LinkOptions{})
	lB := newLink(t, epB, LinkOptions{MaxBuffered: limit})
	lC := newLink(t, epC, LinkOptions{})
	inB, inC := lB.Receive(11), lC.Receive(11)
	defer inB.Close()
	defer inC.Close()
	s := lA.Sender(11)

	sendCtx, sendCancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer sendCancel()
	var sent atomic.Int64
	failed := make(chan error, 1)
	start := time.Now()
	go func() { failed <- sendUntilError(sendCtx, s, addr(epB), &sent) }()
	n := waitStalled(t, &sent, failed)
	if bytes := n * 16 << 10; bytes > 16<<20 {
		t.Fatalf("%d bytes went to a receiver that takes nothing before the sender blocked", bytes)
	}
	if b := inB.(*inbox).buffered(); b > limit {
		t.Fatalf("the inbox holds %d bytes, limit %d", b, limit)
	}

	// The stream to C is not held up by the blocked one to B.
	if err := s.Send(ctx, addr(epC), piece(0, 0, 4, 0, 2, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := inC.Next(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		t.Fatalf("the blocked send returned before the other stream was served: %v", err)
	default:
	}

	err := <-failed
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "kv transfer 11 to "+addr(epB)) {
		t.Fatalf("blocked send: %v", err)
	}
	t.Logf("%d pieces (%d KiB) sent before the sender blocked; Send returned after %v", n, n*16, time.Since(start).Round(time.Millisecond))
	closeCtx, closeCancel := context.WithTimeout(ctx, 3*time.Second)
	defer closeCancel()
	if err := s.Close(closeCtx); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close after a failed send: %v", err)
	}
}

// TestLinkIdle: an inbox that sees nothing for the idle timeout fails Next
// instead of waiting; a sender that went quiet is aborted with the reason.
func TestLinkIdle(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const idle = 300 * time.Millisecond
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{})
	lB := newLink(t, epB, LinkOptions{IdleTimeout: idle})

	t.Run("nothing arrives", func(t *testing.T) {
		in := lB.Receive(1)
		defer in.Close()
		start := time.Now()
		_, err := in.Next(ctx)
		if !errors.Is(err, ErrIdle) || !strings.Contains(err.Error(), "kv transfer 1") {
			t.Fatalf("Next: %v", err)
		}
		if d := time.Since(start); d < idle-50*time.Millisecond {
			t.Fatalf("idle after %v, timeout %v", d, idle)
		}
	})

	t.Run("sender goes quiet", func(t *testing.T) {
		in := lB.Receive(2)
		defer in.Close()
		s := lA.Sender(2)
		if err := s.Send(ctx, addr(epB), piece(0, 0, 4, 0, 2, 8)); err != nil {
			t.Fatal(err)
		}
		if _, err := in.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := in.Next(ctx); !errors.Is(err, ErrIdle) {
			t.Fatalf("Next after the sender went quiet: %v", err)
		}
		// The sender learns why when it goes on.
		time.Sleep(100 * time.Millisecond)
		err := s.Close(ctx)
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "nothing") {
			t.Fatalf("Close of the quiet sender: %v", err)
		}
	})
}

// TestLinkInboxCloseStopsSender: closing an inbox while a sender is
// sending makes its Send fail with the receiver's reason.
func TestLinkInboxCloseStopsSender(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{})
	lB := newLink(t, epB, LinkOptions{})
	in := lB.Receive(21)
	s := lA.Sender(21)
	var sent atomic.Int64
	failed := make(chan error, 1)
	go func() { failed <- sendUntilError(ctx, s, addr(epB), &sent) }()
	for i := 0; i < 3; i++ {
		if _, err := in.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	in.Close()
	select {
	case err := <-failed:
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "kv transfer 21 was closed by the receiver") {
			t.Fatalf("Send after the inbox closed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sender did not notice the closed inbox within 5s")
	}
	if err := s.Close(ctx); !errors.Is(err, ErrAborted) {
		t.Fatalf("Close: %v", err)
	}
	if _, err := in.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	// A later stream of the closed transfer is unexpected.
	s2 := lA.Sender(21)
	_ = s2.Send(ctx, addr(epB), piece(0, 0, 1, 0, 1, 8))
	if err := s2.Close(ctx); err == nil || !strings.Contains(err.Error(), "not expected here") {
		t.Fatalf("a stream after Close: %v", err)
	}
}

// TestLinkCloseEndsHandlers: closing a link ends its handlers, whether
// they wait for a first frame or for room in a full inbox, fails its
// inboxes and aborts the senders feeding them.
func TestLinkCloseEndsHandlers(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{})
	lB := NewLink(epB, LinkOptions{MaxBuffered: 16 << 10})
	in := lB.Receive(31)
	defer in.Close()
	s := lA.Sender(31)
	var sent atomic.Int64
	failed := make(chan error, 1)
	go func() { failed <- sendUntilError(ctx, s, addr(epB), &sent) }()
	waitStalled(t, &sent, failed)
	rawStream(t, ctx, epA, addr(epB)) // a handler waiting for the first frame
	eventually(t, "two streams served", func() bool { return lB.Stats().StreamsAccepted == 2 })

	start := time.Now()
	lB.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Link.Close took %v", d)
	}
	select {
	case err := <-failed:
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("Send to a closed link: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sender did not notice the closed link within 5s")
	}
	if _, err := in.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next on a closed link: %v", err)
	}
	if _, err := lB.Receive(32).Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Receive on a closed link: %v", err)
	}
	_ = s.Close(ctx)
}

// TestLinkReceiveTwice: registering an id twice is refused in Next.
func TestLinkReceiveTwice(t *testing.T) {
	noLeaks(t)
	l := newLink(t, listen(t, "a"), LinkOptions{})
	in := l.Receive(1)
	defer in.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := l.Receive(1).Next(ctx); err == nil || !strings.Contains(err.Error(), fmt.Sprint("kv transfer 1 is already registered")) {
		t.Fatalf("second Receive: %v", err)
	}
}

// TestLinkCloseAfterLastPiece: a consumer that closes its inbox as soon as
// it took every piece, before the sender's end frame arrived, does not
// fail the transfer: the sender's Close sees the ack.
func TestLinkCloseAfterLastPiece(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	epA, epB := listen(t, "a"), listen(t, "b")
	lA := newLink(t, epA, LinkOptions{})
	lB := newLink(t, epB, LinkOptions{})
	in := lB.Receive(41)
	s := lA.Sender(41)
	for layer := 0; layer < 3; layer++ {
		if err := s.Send(ctx, addr(epB), piece(layer, 0, 8, 0, 2, 8)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if _, err := in.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	in.Close()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close after the consumer took everything and closed: %v", err)
	}
}
