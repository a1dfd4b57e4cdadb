package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func mailboxPair(t *testing.T, opt MailboxOptions) (a, b *Endpoint, ma, mb *Mailbox) {
	t.Helper()
	ca, _ := DeriveCA(testSecret)
	a = newEndpoint(t, ca, "stage-0", RoleServer)
	b = newEndpoint(t, ca, "stage-1", RoleServer)
	ma, mb = NewMailbox(a, opt), NewMailbox(b, opt)
	t.Cleanup(func() { ma.Close(); mb.Close() })
	return a, b, ma, mb
}

func TestMailboxSendRecv(t *testing.T) {
	a, b, ma, mb := mailboxPair(t, MailboxOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := rand.New(rand.NewPCG(7, 8))
	x := randVec(r, 5*70, 4)
	baddr := b.Addr().String()
	for i, dt := range []DType{F32, F16, Q8_0} {
		if err := ma.Send(ctx, baddr, uint64(i), "h", dt, 5, 70, x); err != nil {
			t.Fatal(err)
		}
	}
	// Receive out of order, by node ID and by address.
	for _, i := range []int{2, 0, 1} {
		dt := []DType{F32, F16, Q8_0}[i]
		from := "stage-0"
		if i == 1 {
			from = a.Addr().String()
		}
		got := make([]float32, 400)
		rows, cols, err := mb.Recv(ctx, from, uint64(i), "h", got)
		if err != nil {
			t.Fatal(err)
		}
		if rows != 5 || cols != 70 {
			t.Fatalf("%v: shape %dx%d", dt, rows, cols)
		}
		want := make([]float32, len(x))
		_ = DecodeTensor(dt, AppendTensor(nil, dt, x), want)
		if !slicesEqualBits(got[:350], want) {
			t.Fatalf("%v: received values differ from the encoding's", dt)
		}
		if dt == F32 && !slicesEqualBits(got[:350], x) {
			t.Fatal("f32 not exact")
		}
	}
	// One long-lived stream carries every tensor to a peer.
	st := ma.out.out[baddr].st
	for i := range 20 {
		if err := ma.Send(ctx, baddr, 100+uint64(i), "x", F32, 1, 3, []float32{1, 2, float32(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if ma.out.out[baddr].st != st {
		t.Fatal("a new stream was opened for later tensors")
	}
	got := make([]float32, 3)
	for i := range 20 {
		if _, _, err := mb.Recv(ctx, "", 100+uint64(i), "x", got); err != nil || got[2] != float32(i) {
			t.Fatalf("tensor %d: %v %v", i, got, err)
		}
	}
	// A destination too small is an error, not a panic.
	_ = ma.Send(ctx, baddr, 7, "small", F32, 2, 2, []float32{1, 2, 3, 4})
	if _, _, err := mb.Recv(ctx, "", 7, "small", got); err == nil {
		t.Fatal("4 values decoded into 3")
	}
	// Both directions.
	if err := mb.Send(ctx, a.Addr().String(), 1, "back", F32, 1, 1, []float32{42}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ma.Recv(ctx, "stage-1", 1, "back", got); err != nil || got[0] != 42 {
		t.Fatalf("reverse direction: %v %v", got[0], err)
	}
}

func TestMailboxRecvTimesOut(t *testing.T) {
	_, _, ma, _ := mailboxPair(t, MailboxOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := ma.Recv(ctx, "stage-1", 1, "never", make([]float32, 1))
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("got %v after %v", err, time.Since(start))
	}
	if !strings.Contains(err.Error(), "stage-1") {
		t.Fatalf("error does not name the peer: %v", err)
	}
}

func TestMailboxSendToDeadPeerFails(t *testing.T) {
	_, b, ma, _ := mailboxPair(t, MailboxOptions{})
	addr := b.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ma.Send(ctx, addr, 1, "x", F32, 1, 1, []float32{1}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	start := time.Now()
	var err error
	for i := 0; i < 50 && err == nil; i++ { // the first writes may land before the close is seen
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		err = ma.Send(sctx, addr, uint64(2+i), "x", F32, 1, 1024, make([]float32, 1024))
		scancel()
		time.Sleep(10 * time.Millisecond)
	}
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("send to a closed peer: %v after %v", err, time.Since(start))
	}
	t.Logf("after %v: %v", time.Since(start), err)
}

func TestMailboxBackpressure(t *testing.T) {
	const limit = 1 << 20
	const frame = 256 << 10 // bytes per tensor
	const total = 200       // 50 MB in all
	_, b, ma, mb := mailboxPair(t, MailboxOptions{MaxBuffered: limit})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sent atomic.Int64
	errc := make(chan error, 1)
	go func() {
		x := make([]float32, frame/4)
		for i := range total {
			x[0] = float32(i)
			if err := ma.Send(ctx, b.Addr().String(), uint64(i), "act", F32, 1, len(x), x); err != nil {
				errc <- err
				return
			}
			sent.Add(1)
		}
		errc <- nil
	}()
	time.Sleep(500 * time.Millisecond)
	stalled := sent.Load()
	if stalled >= total {
		t.Fatalf("sender finished %d tensors with nobody receiving", stalled)
	}
	if got := mb.Buffered(); got > limit+frame {
		t.Fatalf("receiver buffers %d bytes, limit %d", got, limit)
	}
	t.Logf("sender stalled after %d of %d tensors (%d MB in flow-control windows and buffer)", stalled, total, stalled*frame>>20)
	got := make([]float32, frame/4)
	for i := range total {
		if _, _, err := mb.Recv(ctx, "", uint64(i), "act", got); err != nil {
			t.Fatal(err)
		}
		if got[0] != float32(i) {
			t.Fatalf("tensor %d carries %v", i, got[0])
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestMailboxFrameAboveLimitRefused(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	b := newEndpoint(t, ca, "b", RoleServer)
	ma := NewMailbox(a, MailboxOptions{})
	mb := NewMailbox(b, MailboxOptions{MaxFrame: 1024})
	defer ma.Close()
	defer mb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := b.Addr().String()
	if err := ma.Send(ctx, addr, 1, "big", F32, 1, 1000, make([]float32, 1000)); err != nil {
		t.Fatal(err) // handed to QUIC; the receiver refuses it
	}
	short, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer scancel()
	if _, _, err := mb.Recv(short, "", 1, "big", make([]float32, 1000)); err == nil {
		t.Fatal("frame above the receiver's limit was delivered")
	}
	// The refusal resets the stream; the next tensor goes on a new one.
	k := ma.out.out[addr]
	select {
	case <-k.dead:
	case <-ctx.Done():
		t.Fatal("stream not reset after a refused frame")
	}
	if err := ma.Send(ctx, addr, 2, "ok", F32, 1, 2, []float32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := mb.Recv(ctx, "", 2, "ok", make([]float32, 2)); err != nil {
		t.Fatal(err)
	}
	// The sender refuses what its own limit would refuse.
	if err := mb.Send(ctx, a.Addr().String(), 3, "big", F32, 1, 1000, make([]float32, 1000)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("sender-side limit: %v", err)
	}
}

func TestMailboxRefusesPeerFromAnotherCA(t *testing.T) {
	a, x := intruderPair(t)
	ma, mx := NewMailbox(a, MailboxOptions{}), NewMailbox(x, MailboxOptions{})
	defer ma.Close()
	defer mx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := mx.Send(ctx, a.Addr().String(), 1, "evil", F32, 1, 1, []float32{1})
	if err == nil {
		t.Fatal("intruder opened an activations stream")
	}
	t.Logf("intruder refused: %v", err)
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	if _, _, err := ma.Recv(short, "", 1, "evil", make([]float32, 1)); err == nil {
		t.Fatal("tensor from a foreign CA delivered")
	}
	// Nor can a cluster member be fooled into sending to the intruder.
	if err := ma.Send(ctx, x.Addr().String(), 1, "leak", F32, 1, 1, []float32{1}); err == nil {
		t.Fatal("sent activations to a peer with a foreign certificate")
	}
}

func TestMailboxCloseUnblocksRecv(t *testing.T) {
	_, _, ma, _ := mailboxPair(t, MailboxOptions{})
	closeUnblocks(t, func() error {
		_, _, err := ma.Recv(context.Background(), "", 1, "x", make([]float32, 1))
		return err
	}, ma.Close)
}

// closeUnblocks runs call, then close, and checks that call returns
// ErrClosed soon after.
func closeUnblocks(t *testing.T, call func() error, close func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	time.Sleep(50 * time.Millisecond)
	close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("got %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not unblock the pending call")
	}
}

// intruderPair is a cluster endpoint and one with a certificate from
// another CA.
func intruderPair(t *testing.T) (member, intruder *Endpoint) {
	t.Helper()
	ca, _ := DeriveCA(testSecret)
	other, _ := DeriveCA("another-secret-0123456789")
	return newEndpoint(t, ca, "a", RoleServer), newEndpoint(t, other, "intruder", RoleServer)
}

func ExampleMailbox() {
	ca, _ := DeriveCA("example-secret-0123456789")
	idA, _ := SelfIssue(ca, "a", RoleServer)
	idB, _ := SelfIssue(ca, "b", RoleServer)
	a, _ := Listen(Config{Bind: "127.0.0.1:0", Identity: idA})
	b, _ := Listen(Config{Bind: "127.0.0.1:0", Identity: idB})
	defer a.Close()
	defer b.Close()
	ma, mb := NewMailbox(a, MailboxOptions{}), NewMailbox(b, MailboxOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = ma.Send(ctx, b.Addr().String(), 17, "hidden", F16, 2, 2, []float32{1, 2, 3, 4})
	dst := make([]float32, 4)
	rows, cols, err := mb.Recv(ctx, "a", 17, "hidden", dst)
	fmt.Println(rows, cols, dst, err)
	// Output: 2 2 [1 2 3 4] <nil>
}

// TestMailboxSendToSelf sends to the endpoint's own address: the tensor
// arrives from this node without a stream (the driver that is also the
// last stage takes its logits from memory), a full mailbox still holds the
// sender back until ctx ends, and another node's address is not "self".
func TestMailboxSendToSelf(t *testing.T) {
	a, b, ma, _ := mailboxPair(t, MailboxOptions{MaxBuffered: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	self := a.Addr().String()
	if !a.IsSelf(ctx, self) || a.IsSelf(ctx, b.Addr().String()) {
		t.Fatalf("IsSelf(own address) %v, IsSelf(the other's) %v", a.IsSelf(ctx, self), a.IsSelf(ctx, b.Addr().String()))
	}
	x := []float32{1.5, -2, 3.25, 1e-3}
	for i, dt := range []DType{F32, F16} {
		if err := ma.Send(ctx, self, uint64(i), "logits", dt, 2, 2, x); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, 4)
		rows, cols, err := ma.Recv(ctx, "stage-0", uint64(i), "logits", got)
		if err != nil || rows != 2 || cols != 2 {
			t.Fatalf("%v: %dx%d %v", dt, rows, cols, err)
		}
		want := make([]float32, 4)
		_ = DecodeTensor(dt, AppendTensor(nil, dt, x), want)
		if !slicesEqualBits(got, want) {
			t.Fatalf("%v: got %v, want %v", dt, got, want)
		}
	}
	ma.out.mu.Lock()
	_, dialed := ma.out.out[self]
	ma.out.mu.Unlock()
	if dialed {
		t.Fatal("a stream to this node was opened for its own tensors")
	}
	// 64 bytes of buffer: the first frame is queued, the second waits for
	// room and gives up with its context.
	big := make([]float32, 32)
	if err := ma.Send(ctx, self, 10, "full", F32, 1, 32, big); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if err := ma.Send(short, self, 11, "full", F32, 1, 32, big); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send to a full mailbox of this node: %v, want the deadline", err)
	}
}
