package transport

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

func testMessage(id uint64, tag string, size int) *message {
	return &message{
		from:  Peer{ID: "p", Addr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}},
		frame: TensorFrame{TensorHeader: TensorHeader{ID: id, Tag: tag}, Payload: make([]byte, size)},
		size:  size,
	}
}

func TestInboxBoundsAndHandOver(t *testing.T) {
	in := newInbox(100)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := in.deliver(testMessage(1, "a", 60)); err != nil {
		t.Fatal(err)
	}
	// The second frame does not fit: deliver blocks...
	blocked := make(chan error, 1)
	go func() { blocked <- in.deliver(testMessage(2, "a", 60)) }()
	select {
	case <-blocked:
		t.Fatal("delivered beyond the budget")
	case <-time.After(50 * time.Millisecond):
	}
	// ...until a reader waits for it (handed over, not buffered).
	m, err := in.take(ctx, inboxKey{2, "a"}, "127.0.0.1:9", nil)
	if err != nil || m.frame.ID != 2 {
		t.Fatalf("take: %v %v", m, err)
	}
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	if in.buffered() != 60 {
		t.Fatalf("buffered %d, want 60", in.buffered())
	}
	// A sender filter that does not match waits; the matching one takes.
	short, scancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer scancel()
	if _, err := in.take(short, inboxKey{1, "a"}, "q", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wrong sender: %v", err)
	}
	if _, err := in.take(ctx, inboxKey{1, "a"}, "p", nil); err != nil || in.buffered() != 0 {
		t.Fatalf("take by node id: %v, %d buffered", err, in.buffered())
	}
	// A lost link ends a wait.
	lost := make(chan struct{})
	close(lost)
	if _, err := in.take(ctx, inboxKey{3, "a"}, "", lost); !errors.Is(err, errLinkLost) {
		t.Fatalf("lost link: %v", err)
	}
	// Dropped tags are not kept; purge frees the budget; close fails all.
	in.drop = func(tag string) bool { return tag == "gone" }
	_ = in.deliver(testMessage(4, "gone", 10))
	_ = in.deliver(testMessage(5, "b", 10))
	if in.buffered() != 10 {
		t.Fatalf("buffered %d, want 10", in.buffered())
	}
	in.purge(func(tag string) bool { return tag == "b" })
	if in.buffered() != 0 {
		t.Fatalf("buffered %d after purge", in.buffered())
	}
	in.close(ErrClosed)
	if _, err := in.take(ctx, inboxKey{6, "a"}, "", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if err := in.deliver(testMessage(6, "a", 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("deliver after close: %v", err)
	}
}

func TestGroupFrameLimit(t *testing.T) {
	tg := newTestGroup(t, 2, GroupConfig{})
	err := tg.groups[0].AllGather(make([]float32, DefaultMaxTensorFrame/4+1), make([]float32, 1))
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
}
