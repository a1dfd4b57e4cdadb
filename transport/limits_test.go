package transport

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// settleGoroutines waits up to d for the goroutine count to fall to at
// most want and returns the last count.
func settleGoroutines(want int, d time.Duration) int {
	var n int
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= want || time.Now().After(end) {
			return n
		}
	}
}

// openIdle opens n streams of kind k on conn and writes only the kind
// byte, as a peer that holds streams open without a request does.
func openIdle(t *testing.T, ctx context.Context, conn *quic.Conn, k Kind, n int) []*quic.Stream {
	t.Helper()
	out := make([]*quic.Stream, 0, n)
	for range n {
		s, err := conn.OpenStreamSync(ctx)
		if err != nil {
			t.Fatalf("stream %d of %d: %v", len(out)+1, n, err)
		}
		if _, err := s.Write([]byte{byte(k)}); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// TestIdleRPCStreamsReclaimed: a verified client opens as many RPC streams
// as one connection may hold and never sends a request. Every stream is
// ended once the request timeout passes (not after the call timeout, a
// minute here), the server's goroutines return to where they were, and a
// call from another node is answered meanwhile.
func TestIdleRPCStreamsReclaimed(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "srv", RoleServer)
	rpc := newRPCServer(srv, KindRPC, time.Minute, 3*time.Second)
	rpc.Register("ping", func(ctx context.Context, p Peer, body json.RawMessage) (any, error) { return "pong", nil })
	flood := newEndpoint(t, ca, "flood", RoleClient)
	other := newEndpoint(t, ca, "other", RoleClient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Connections (and their goroutines) first, then the baseline.
	var out string
	if err := Call(ctx, flood, srv.Addr().String(), KindRPC, "ping", nil, &out); err != nil || out != "pong" {
		t.Fatalf("ping: %q %v", out, err)
	}
	if err := Call(ctx, other, srv.Addr().String(), KindRPC, "ping", nil, &out); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	baseline := runtime.NumGoroutine()
	conn, err := flood.conn(ctx, srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	streams := openIdle(t, ctx, conn, KindRPC, MaxStreamsPerConn)
	// The connection is full: one more stream is refused by QUIC's
	// stream limit, not served (unless opening them outlasted the
	// request timeout, which gives credit back).
	if _, err := conn.OpenStream(); time.Since(t0) >= rpc.request {
		t.Logf("opening the streams took %v: the first were reset before the last opened", time.Since(t0))
	} else if err == nil {
		t.Fatalf("stream %d opened: the limit is %d", MaxStreamsPerConn+1, MaxStreamsPerConn)
	} else if !errors.As(err, new(*quic.StreamLimitReachedError)) {
		t.Fatalf("stream %d: %v, want the stream limit", MaxStreamsPerConn+1, err)
	}
	// The server takes each stream on a goroutine of its own.
	peak := 0
	for end := time.Now().Add(2 * time.Second); peak < baseline+MaxStreamsPerConn && time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		peak = max(peak, runtime.NumGoroutine())
	}
	// Another node is served meanwhile.
	if err := Call(ctx, other, srv.Addr().String(), KindRPC, "ping", nil, &out); err != nil || out != "pong" {
		t.Fatalf("ping from another node during the flood: %q %v", out, err)
	}
	// Every idle stream is ended by the server.
	var wg sync.WaitGroup
	var mu sync.Mutex
	reset := 0
	for _, s := range streams {
		wg.Go(func() {
			_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
			var b [1]byte
			_, err := s.Read(b[:])
			var se *quic.StreamError
			if err == io.EOF || errors.As(err, &se) && se.Remote {
				mu.Lock()
				reset++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	took := time.Since(t0)
	n := settleGoroutines(baseline+5, 5*time.Second)
	t.Logf("%d idle streams: %d ended by the server within %v; goroutines %d before, %d at the peak, %d after",
		len(streams), reset, took.Round(time.Millisecond), baseline, peak, n)
	if reset != len(streams) {
		t.Errorf("%d of %d idle streams were ended by the server", reset, len(streams))
	}
	if peak < baseline+MaxStreamsPerConn/2 {
		t.Errorf("goroutines at the peak: %d, baseline %d: the flood did not reach the server", peak, baseline)
	}
	if n > baseline+5 {
		t.Errorf("goroutines: %d after the idle streams were reset, %d before", n, baseline)
	}
	// The connection is usable again: its stream credit came back.
	if err := CallStream(ctx, mustDial(t, ctx, flood, srv), "ping", nil, &out); err != nil || out != "pong" {
		t.Fatalf("ping after the flood: %q %v", out, err)
	}
}

func mustDial(t *testing.T, ctx context.Context, from, to *Endpoint) *Stream {
	t.Helper()
	s, err := from.Dial(ctx, to.Addr().String(), KindRPC)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRPCRequestAllocatesAsItArrives: a request frame that announces the
// frame limit and sends a few bytes is reset at the request timeout, and
// the server never allocated what it announced.
func TestRPCRequestAllocatesAsItArrives(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "srv", RoleServer)
	newRPCServer(srv, KindRPC, time.Minute, 200*time.Millisecond)
	cli := newEndpoint(t, ca, "cli", RoleClient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 64
	streams := make([]*Stream, n)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range streams {
		s := mustDial(t, ctx, cli, srv)
		// 256 KiB announced, 3 bytes sent.
		if _, err := s.Write([]byte{0, 0x04, 0, 0, '{', '"', 'm'}); err != nil {
			t.Fatal(err)
		}
		streams[i] = s
	}
	for _, s := range streams {
		_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [1]byte
		if _, err := s.Read(b[:]); err == nil {
			t.Fatal("a stream with a truncated request was answered")
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	const announced = 256 << 10
	t.Logf("%d requests announcing %d bytes each: %d bytes allocated in all", n, announced, alloc)
	if alloc >= n*announced/4 {
		t.Errorf("%d bytes allocated for %d truncated requests: the announced sizes were allocated", alloc, n)
	}
}

// TestTensorStreamsPerConnBounded: a connection may hold maxTensorStreams
// activation streams; the next one is reset at once.
func TestTensorStreamsPerConnBounded(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "srv", RoleServer)
	mb := NewMailbox(srv, MailboxOptions{})
	defer mb.Close()
	cli := newEndpoint(t, ca, "cli", RoleClient)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := cli.conn(ctx, srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	streams := openIdle(t, ctx, conn, KindActivations, maxTensorStreams+1)
	// The streams are served concurrently: any one of them is the one
	// over the limit.
	served, refused := []*quic.Stream{}, 0
	for i, s := range streams {
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		_, err := s.Read(b[:])
		var se *quic.StreamError
		switch {
		case err == nil && b[0] == streamReady:
			served = append(served, s)
		case errors.As(err, &se) && se.ErrorCode == codeTooManyStreams:
			refused++
		default:
			t.Errorf("stream %d: %v", i+1, err)
		}
	}
	if len(served) != maxTensorStreams || refused != 1 {
		t.Fatalf("%d activation streams served on one connection and %d refused, want %d and 1", len(served), refused, maxTensorStreams)
	}
	// One ends: a new one is served.
	served[0].CancelWrite(0)
	served[0].CancelRead(0)
	var s *quic.Stream
	for end := time.Now().Add(5 * time.Second); ; {
		s = openIdle(t, ctx, conn, KindActivations, 1)[0]
		_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if _, err := s.Read(b[:]); err == nil {
			break
		} else if time.Now().After(end) {
			t.Fatalf("no activation stream after one ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConnsPerPeerBounded: one node holds at most MaxConnsPerPeer
// connections; the next is closed with a message that says so, and
// another node still connects.
func TestConnsPerPeerBounded(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	srv := newEndpoint(t, ca, "srv", RoleServer)
	NewRPCServer(srv, KindRPC, time.Minute).Register("ping", func(ctx context.Context, p Peer, body json.RawMessage) (any, error) {
		return p.ID, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for i := range MaxConnsPerPeer + 1 {
		// Each endpoint has its own socket, so its own connection.
		ep := newEndpoint(t, ca, "same-node", RoleClient)
		var out string
		err = Call(ctx, ep, srv.Addr().String(), KindRPC, "ping", nil, &out)
		if i < MaxConnsPerPeer && err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || ae.ErrorCode != codeTooManyConns || !strings.Contains(ae.ErrorMessage, "connections") {
		t.Fatalf("connection %d: %v, want it closed for too many connections", MaxConnsPerPeer+1, err)
	}
	t.Logf("connection %d: %v", MaxConnsPerPeer+1, err)
	var out string
	if err := Call(ctx, newEndpoint(t, ca, "another-node", RoleClient), srv.Addr().String(), KindRPC, "ping", nil, &out); err != nil || out != "another-node" {
		t.Fatalf("another node: %q %v", out, err)
	}
}
