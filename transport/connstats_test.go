package transport

import (
	"context"
	"io"
	"testing"
	"time"
)

// TestPeerStats: each side's PeerStats names the other by address and node
// ID and counts what crossed: a 2 MB upload is at least 2 MB sent by the
// dialer and received by the listener, the two sides agree on the bytes
// (QUIC packets both count), and the totals survive the connection's close.
func TestPeerStats(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "node-a", RoleServer)
	b := newEndpoint(t, ca, "node-b", RoleClient)
	got := make(chan int64, 1)
	a.Handle(KindProbe, func(s *Stream) {
		defer s.Close()
		n, _ := io.Copy(io.Discard, s)
		got <- n
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.Dial(ctx, a.Addr().String(), KindProbe)
	if err != nil {
		t.Fatal(err)
	}
	const size = 2 << 20
	if _, err := s.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	select {
	case n := <-got:
		if n != size {
			t.Fatalf("listener read %d bytes, want %d", n, size)
		}
	case <-ctx.Done():
		t.Fatal("upload did not arrive")
	}
	one := func(ep *Endpoint, want string) PeerStat {
		t.Helper()
		st := ep.PeerStats()
		if len(st) != 1 || st[0].NodeID != want {
			t.Fatalf("peer stats %+v, want one row for %s", st, want)
		}
		return st[0]
	}
	sb, sa := one(b, "node-a"), one(a, "node-b")
	if sb.Peer.String() != a.Addr().String() || sb.Conns != 1 {
		t.Fatalf("dialer's row %+v, want peer %s with 1 connection", sb, a.Addr())
	}
	if sb.BytesSent < size || sa.BytesReceived < size {
		t.Fatalf("sent %d, received %d bytes, want at least %d", sb.BytesSent, sa.BytesReceived, size)
	}
	if sa.BytesReceived > size*11/10 {
		t.Fatalf("received %d bytes for a %d-byte upload: more than 10%% overhead", sa.BytesReceived, size)
	}
	// A burst over loopback can overflow the receiver's socket buffer: the
	// sender counts what it resent, declared lost.
	if d := int64(sb.BytesSent-sb.BytesLost) - int64(sa.BytesReceived); d < -int64(size)/50 || d > int64(size)/50 {
		t.Fatalf("dialer sent %d bytes (%d lost), listener received %d: off by more than 2%%", sb.BytesSent, sb.BytesLost, sa.BytesReceived)
	}
	if sb.SmoothedRTT <= 0 || sb.PacketsSent == 0 || sa.PacketsReceived == 0 {
		t.Fatalf("no RTT or packets: %+v", sb)
	}
	// Closing the connection keeps what it carried.
	b.mu.Lock()
	d := b.conns[a.Addr().String()]
	b.mu.Unlock()
	b.forget(a.Addr().String(), d.conn)
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := one(b, "node-a")
		if after.Conns == 0 {
			if after.BytesSent < sb.BytesSent || after.SmoothedRTT != 0 {
				t.Fatalf("after the close: %+v, before: %+v", after, sb)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the closed connection is still counted open")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
