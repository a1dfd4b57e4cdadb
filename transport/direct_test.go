package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"shoal/internal/version"
)

// directLinks is how many direct connections e holds open.
func directLinks(e *Endpoint) int {
	e.direct.mu.Lock()
	defer e.direct.mu.Unlock()
	return len(e.direct.conns)
}

// directCalls runs the same sequence of all-reduces and all-gathers of
// several sizes (inline and concurrent writes, direct and reduce-scatter
// algorithms) on tg and returns every member's results.
func directCalls(t *testing.T, tg *testGroup, seed uint64) [][][]float32 {
	t.Helper()
	n := len(tg.groups)
	sizes := []int{1, 100, 2048, 9000, 70000, 300000, 2048, 3}
	out := make([][][]float32, n)
	noErrors(t, tg.each(func(r int, g *Group) error {
		rng := rand.New(rand.NewPCG(seed, uint64(r)))
		for c, size := range sizes {
			x := make([]float32, size)
			for i := range x {
				x[i] = rng.Float32()*2 - 1
			}
			if err := g.AllReduceSum(x); err != nil {
				return fmt.Errorf("call %d: %w", c, err)
			}
			out[r] = append(out[r], x)
			part := make([]float32, 1+c+r)
			for i := range part {
				part[i] = float32(r*1000 + c*10 + i)
			}
			all := make([]float32, n*(1+c)+n*(n-1)/2)
			if err := g.AllGather(part, all); err != nil {
				return fmt.Errorf("all-gather %d: %w", c, err)
			}
			out[r] = append(out[r], all)
		}
		return nil
	}))
	return out
}

// TestDirectMatchesQUIC: collectives over direct links give every member
// the same bits as over QUIC streams, for 2 and 3 members and every wire
// dtype, and every member reaches every other one directly.
func TestDirectMatchesQUIC(t *testing.T) {
	for _, n := range []int{2, 3} {
		for _, dt := range []DType{F32, F16, Q8_0} {
			t.Run(fmt.Sprintf("members=%d/%v", n, dt), func(t *testing.T) {
				quic := newTestGroup(t, n, GroupConfig{ID: "q", DType: dt, NoDirect: true, DirectMaxBytes: 16 << 10})
				direct := newTestGroup(t, n, GroupConfig{ID: "d", DType: dt, DirectMaxBytes: 16 << 10})
				want := directCalls(t, quic, 7)
				got := directCalls(t, direct, 7)
				for r := range n {
					if d := quic.groups[r].Direct(); d != 0 {
						t.Fatalf("rank %d of the QUIC-only group has %d direct peers", r, d)
					}
					if d := direct.groups[r].Direct(); d != n-1 {
						t.Fatalf("rank %d reaches %d of %d peers directly", r, d, n-1)
					}
					for c := range want[r] {
						for i := range want[r][c] {
							if got[r][c][i] != want[r][c][i] {
								t.Fatalf("rank %d call %d value %d: direct %v, QUIC %v", r, c, i, got[r][c][i], want[r][c][i])
							}
						}
					}
				}
				for r := 1; r < n; r++ {
					for c := range got[0] {
						if fmt.Sprint(got[r][c][:min(8, len(got[r][c]))]) != fmt.Sprint(got[0][c][:min(8, len(got[0][c]))]) {
							t.Fatalf("ranks 0 and %d differ in call %d", r, c)
						}
					}
				}
			})
		}
	}
}

// TestDirectOlderPeerStaysOnQUIC: a member of an older protocol neither
// listens for direct links nor is dialed; the group works over QUIC.
func TestDirectOlderPeerStaysOnQUIC(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	newer := newEndpoint(t, ca, "new", RoleServer)
	ident, _ := SelfIssue(ca, "old", RoleServer)
	older, err := Listen(Config{Bind: "127.0.0.1:0", Identity: ident, Protocols: version.Window{Min: 1, Max: version.DirectProtocol - 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	if older.direct.ln != nil {
		t.Fatal("an endpoint of protocol 3 listens for direct links")
	}
	tg := groupsOn(t, []*Endpoint{newer, older}, GroupConfig{ID: "mixed"})
	directCalls(t, tg, 1)
	for r, g := range tg.groups {
		if d := g.Direct(); d != 0 {
			t.Fatalf("rank %d: %d direct peers with a protocol-3 member", r, d)
		}
	}
	if n := directLinks(newer); n != 0 {
		t.Fatalf("the newer member holds %d direct links", n)
	}
}

// TestDirectPortTakenFallsBack: when another program holds a member's TCP
// port, the group stays on QUIC after one failed dial, and its results are
// right.
func TestDirectPortTakenFallsBack(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	b := newEndpoint(t, ca, "b", RoleServer)
	// b's port answers TCP with something that is not shoal.
	_ = b.direct.ln.Close()
	ln, err := net.Listen("tcp", b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n"))
			_ = c.Close()
		}
	}()
	tg := groupsOn(t, []*Endpoint{a, b}, GroupConfig{ID: "taken"})
	start := time.Now()
	got := directCalls(t, tg, 3)
	if took := time.Since(start); took > 3*directTimeout {
		t.Fatalf("the calls took %v", took)
	}
	if d := tg.groups[1].Direct(); d != 0 {
		t.Fatalf("rank 1: %d direct peers", d)
	}
	// b's link to a is direct, a's to b is not; the sums still agree.
	for c := range got[0] {
		if got[0][c][0] != got[1][c][0] {
			t.Fatalf("call %d: %v against %v", c, got[0][c][0], got[1][c][0])
		}
	}
}

// TestDirectRefusesStrangers: a TCP client without a certificate, with a
// certificate of another CA, with a hello that is not one or for a group
// that is not here gets nothing, and the group keeps working directly.
func TestDirectRefusesStrangers(t *testing.T) {
	tg := newTestGroup(t, 2, GroupConfig{ID: "g"})
	directCalls(t, tg, 5)
	target := tg.eps[0]
	addr := target.Addr().String()
	dial := func(tc *tls.Config) (*tls.Conn, error) {
		d := &net.Dialer{Timeout: time.Second}
		c, err := tls.DialWithDialer(d, "tcp", addr, tc)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		return c, nil
	}
	answer := func(c *tls.Conn, hello []byte) string {
		if err := WriteFrame(c, hello); err != nil {
			return "write: " + err.Error()
		}
		b, err := ReadFrame(c, 1024)
		if err != nil {
			return "read: " + err.Error()
		}
		return fmt.Sprintf("%d %s", b[0], b[1:])
	}

	// No certificate: the handshake (or the first read) fails.
	anon := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpnDirect}, MinVersion: tls.VersionTLS13} // #nosec G402 -- the test plays a stranger
	if c, err := dial(anon); err == nil {
		if got := answer(c, directHello{Group: "g", Rank: 1, First: 99}.append(nil)); !strings.HasPrefix(got, "read:") && !strings.HasPrefix(got, "write:") {
			t.Fatalf("a client without a certificate got an answer: %s", got)
		}
		c.Close()
	}
	// Another CA's certificate.
	other, _ := DeriveCA("another-secret-0123456789")
	stranger, _ := SelfIssue(other, "x", RoleServer)
	sc := stranger.ClientTLS()
	sc.NextProtos, sc.InsecureSkipVerify = []string{alpnDirect}, true // #nosec G402 -- the test plays a stranger
	if c, err := dial(sc); err == nil {
		if got := answer(c, directHello{Group: "g", Rank: 1, First: 99}.append(nil)); !strings.HasPrefix(got, "read:") && !strings.HasPrefix(got, "write:") {
			t.Fatalf("another CA's node got an answer: %s", got)
		}
		c.Close()
	}
	// A member of the cluster: a group that is not here, a rank that is
	// not one, a second link for a rank, a hello that is not one.
	ca, _ := DeriveCA(testSecret)
	peer, _ := SelfIssue(ca, "peer", RoleServer)
	pc := peer.ClientTLS()
	pc.NextProtos = []string{alpnDirect}
	for _, c := range []struct {
		name  string
		hello []byte
		want  string
	}{
		{"unknown group", directHello{Group: "nope", Rank: 1, First: 5}.append(nil), "no group"},
		{"own rank", directHello{Group: "g", Rank: 0, First: 50}.append(nil), "a link from rank 0"},
		{"rank outside", directHello{Group: "g", Rank: 7, First: 50}.append(nil), "a link from rank 7"},
		{"second link", directHello{Group: "g", Rank: 1, First: 50}.append(nil), "already has a link"},
		{"garbage", []byte{9, 9, 9}, "malformed tensor frame"},
		{"first call 0", directHello{Group: "g", Rank: 1}.append(nil), "malformed tensor frame"},
	} {
		conn, err := dial(pc)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := answer(conn, c.hello)
		conn.Close()
		if !strings.HasPrefix(got, "0 ") || !strings.Contains(got, c.want) {
			t.Fatalf("%s: answered %q, want a refusal with %q", c.name, got, c.want)
		}
	}
	// The group still works, directly.
	directCalls(t, tg, 6)
	if d := tg.groups[0].Direct(); d != 1 {
		t.Fatalf("rank 0: %d direct peers after the strangers", d)
	}
}

// TestDirectPeerDiesMidCall: a member waiting on a direct link for a peer
// that dies learns it at once, with the peer named, not after its timeout.
func TestDirectPeerDiesMidCall(t *testing.T) {
	const timeout = 10 * time.Second
	for _, size := range []int{64, 200000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			tg := newTestGroup(t, 2, GroupConfig{ID: "die", Timeout: timeout})
			for range 3 {
				noErrors(t, tg.each(func(r int, g *Group) error { return g.AllReduceSum(make([]float32, size)) }))
			}
			if tg.groups[0].Direct() != 1 {
				t.Fatal("not direct")
			}
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- tg.groups[0].AllReduceSum(make([]float32, size)) }()
			time.Sleep(100 * time.Millisecond)
			tg.eps[1].Close()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "rank 1 ("+tg.eps[1].Addr().String()+")") {
					t.Fatalf("got %v", err)
				}
				t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
			case <-time.After(timeout / 2):
				t.Fatal("the wait did not end when the peer died")
			}
			if err := tg.groups[0].AllReduceSum(make([]float32, 4)); err == nil || !strings.Contains(err.Error(), "unusable") {
				t.Fatalf("call after a failure: %v", err)
			}
		})
	}
}

// TestDirectCloseAndCancelUnblock: Close, and the caller's context, end a
// call waiting on a direct link.
func TestDirectCloseAndCancelUnblock(t *testing.T) {
	tg := newTestGroup(t, 2, GroupConfig{ID: "c", Timeout: 30 * time.Second})
	directCalls(t, tg, 2)
	closeUnblocks(t, func() error { return tg.groups[0].AllReduceSum(make([]float32, 8)) }, tg.groups[0].Close)

	tg = newTestGroup(t, 2, GroupConfig{ID: "x", Timeout: 30 * time.Second})
	directCalls(t, tg, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := tg.groups[0].AllReduceSumContext(ctx, make([]float32, 8))
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
		t.Fatalf("got %v after %v", err, time.Since(start))
	}
}

// TestDirectRevokedPeerCut: revoking a member closes its direct links.
func TestDirectRevokedPeerCut(t *testing.T) {
	tg := newTestGroup(t, 2, GroupConfig{ID: "r", Timeout: 10 * time.Second})
	directCalls(t, tg, 4)
	tg.eps[0].SetRevoked(func(id string) bool { return id == "tp-1" })
	tg.eps[0].CloseRevoked()
	if n := directLinks(tg.eps[0]); n != 0 {
		t.Fatalf("%d direct links left after revoking the only peer", n)
	}
	errs := tg.each(func(r int, g *Group) error { return g.AllReduceSum(make([]float32, 8)) })
	if errs[0] == nil && errs[1] == nil {
		t.Fatal("a revoked member's collective went through")
	}
}

func FuzzDirectHello(f *testing.F) {
	f.Add(directHello{Group: "g", Rank: 1, First: 2}.append(nil))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseDirectHello(b)
		if err != nil {
			return
		}
		back := h.append(nil)
		h2, err := parseDirectHello(back)
		if err != nil || h2 != h {
			t.Fatalf("%+v does not round-trip: %+v %v", h, h2, err)
		}
	})
}
