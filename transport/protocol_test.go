package transport

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"shoal/internal/version"
)

func endpointOf(t *testing.T, ca *CA, id, role string, w version.Window, build string) *Endpoint {
	t.Helper()
	ident, err := SelfIssue(ca, id, role)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := Listen(Config{Bind: "127.0.0.1:0", Identity: ident, HandshakeTimeout: 2 * time.Second, Protocols: w, Build: build})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

// TestProtocolNegotiation: two endpoints speak the newest protocol both
// windows hold, and both ends of every stream know which; a build of
// protocol 1 alone (what every build before protocols were negotiated
// offers) still talks to this one. Windows that do not meet refuse the
// connection at the dial, with both versions in the error, whichever side
// is the newer; a join dial (DialPinnedAs) is refused the same way.
func TestProtocolNegotiation(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, c := range []struct {
		name         string
		server, dial version.Window
		want         int
	}{
		{"same", version.Window{Min: 1, Max: 2}, version.Window{Min: 1, Max: 2}, 2},
		{"old dialer", version.Window{Min: 1, Max: 2}, version.Window{Min: 1, Max: 1}, 1},
		{"old listener", version.Window{Min: 1, Max: 1}, version.Window{Min: 1, Max: 2}, 1},
		{"newer both", version.Window{Min: 2, Max: 3}, version.Window{Min: 1, Max: 2}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := endpointOf(t, ca, "srv", RoleServer, c.server, "1.0.0")
			cli := endpointOf(t, ca, "cli", RoleClient, c.dial, "0.9.0")
			seen := make(chan int, 1)
			srv.Handle(KindProbe, func(s *Stream) {
				seen <- s.Peer.Protocol
				echo(s)
			})
			s, err := cli.Dial(ctx, srv.Addr().String(), KindProbe)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if err := WriteFrame(s, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadFrame(s, 64); err != nil {
				t.Fatal(err)
			}
			if got := <-seen; got != c.want || s.Peer.Protocol != c.want {
				t.Errorf("listener saw protocol %d, dialer %d; want %d", got, s.Peer.Protocol, c.want)
			}
		})
	}

	for _, c := range []struct {
		name         string
		server, dial version.Window
		sb, db       string
		want         []string
	}{
		{"dialer too new", version.Window{Min: 1, Max: 2}, version.Window{Min: 8, Max: 9}, "0.9.0", "1.6.0",
			[]string{"this node runs shoal 1.6.0 (protocol 9, works with protocols 8-9)", "runs shoal 0.9.0, protocol 2 (works with protocols 1-2)", "upgrade the peer to a release of protocol 8"}},
		{"dialer too old", version.Window{Min: 8, Max: 9}, version.Window{Min: 1, Max: 2}, "1.6.0", "0.9.0",
			[]string{"this node runs shoal 0.9.0 (protocol 2, works with protocols 1-2)", "runs shoal 1.6.0, protocol 9 (works with protocols 8-9)", "this node's release is too old"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := endpointOf(t, ca, "srv", RoleServer, c.server, c.sb)
			cli := endpointOf(t, ca, "cli", RoleClient, c.dial, c.db)
			srv.Handle(KindProbe, echo)
			_, err := cli.Dial(ctx, srv.Addr().String(), KindProbe)
			var m *version.Mismatch
			if !errors.As(err, &m) {
				t.Fatalf("dial across windows %v and %v: %v, want a version mismatch", c.dial, c.server, err)
			}
			for _, w := range append(c.want, srv.Addr().String()) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			// A node joining without a certificate learns the same.
			_, _, err = DialPinnedAs(ctx, srv.Addr().String(), CAHash(ca.Cert), KindJoin, 2*time.Second, c.dial, c.db)
			if !errors.As(err, &m) || !strings.Contains(err.Error(), c.want[1]) {
				t.Errorf("join across windows: %v", err)
			}
			// The listener still serves its own protocol.
			same := endpointOf(t, ca, "peer", RoleClient, c.server, c.sb)
			s, err := same.Dial(ctx, srv.Addr().String(), KindProbe)
			if err != nil {
				t.Fatalf("a dialer of the listener's window after a refusal: %v", err)
			}
			s.Close()
		})
	}
}

// TestGroupProtocol: a group knows the newest protocol every member
// speaks once its first collective has reached them all (0 before): the
// oldest build's newest, on every member alike, so they agree on whether
// to run the collectives that a newer protocol adds (tensor-parallel
// overlap, version.OverlapProtocol).
func TestGroupProtocol(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	newer := version.Window{Min: 1, Max: version.OverlapProtocol}
	older := version.Window{Min: 1, Max: version.OverlapProtocol - 1}
	for _, c := range []struct {
		name    string
		windows []version.Window
		want    int
	}{
		{"same", []version.Window{newer, newer, newer}, version.OverlapProtocol},
		{"one older", []version.Window{newer, older, newer}, version.OverlapProtocol - 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var eps []*Endpoint
			var addrs []string
			for i, w := range c.windows {
				ep := endpointOf(t, ca, "n"+strconv.Itoa(i), RoleServer, w, "1.0.0")
				eps, addrs = append(eps, ep), append(addrs, ep.Addr().String())
			}
			gs := make([]*Group, len(eps))
			for r, ep := range eps {
				g, err := NewGroup(ep, GroupConfig{ID: "proto-" + c.name, Members: addrs, Rank: r, Timeout: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				if p := g.Protocol(); p != 0 {
					t.Errorf("rank %d: protocol %d before any collective", r, p)
				}
				gs[r] = g
			}
			errs := make(chan error, len(gs))
			for _, g := range gs {
				go func() { errs <- g.AllReduceSum([]float32{1, 2, 3}) }()
			}
			for range gs {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			for r, g := range gs {
				if p := g.Protocol(); p != c.want {
					t.Errorf("rank %d: protocol %d, want %d", r, p, c.want)
				}
			}
		})
	}
}
