package transport

import (
	"context"
	"testing"
	"time"

	"shoal/internal/version"
)

func TestProbeLoopback(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(map[bool]string{false: "quic", true: "direct"}[direct], func(t *testing.T) { testProbe(t, direct) })
	}
}

func testProbe(t *testing.T, direct bool) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	b := newEndpoint(t, ca, "b", RoleClient)
	ServeProbe(a, 8<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	probe := b.Probe
	if direct {
		probe = b.ProbeDirect
	}
	p, err := probe(ctx, a.Addr().String(), 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rtt %v (min %v, max %v over %d pings), %d bytes in %v: %.0f MB/s",
		p.RTT, p.RTTMin, p.RTTMax, p.Pings, p.Bytes, p.Elapsed, p.Bandwidth/1e6)
	if p.Pings != probePings || p.RTT <= 0 || p.RTTMin > p.RTT || p.RTT > p.RTTMax || p.RTT > time.Second {
		t.Fatalf("implausible round trips: %+v", p)
	}
	if p.Bytes != 4<<20 || p.Elapsed <= 0 || p.Bandwidth < 1e6 || p.Bandwidth > 1e12 {
		t.Fatalf("implausible bandwidth: %+v", p)
	}
	// Latency only.
	if p, err := probe(ctx, a.Addr().String(), 0); err != nil || p.Bytes != 0 || p.RTT <= 0 {
		t.Fatalf("ping-only probe: %+v %v", p, err)
	}
	// A bulk transfer above the server's limit is refused.
	if _, err := probe(ctx, a.Addr().String(), 16<<20); err == nil {
		t.Fatal("bulk above the server's limit accepted")
	}
	// The server closes its side once it reads the client's end.
	deadline := time.Now().Add(3 * time.Second)
	for directLinks(a)+directLinks(b) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d direct connections left open after the probes", directLinks(a)+directLinks(b))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestProbeDirectRefused: an endpoint that serves no probes, one of an
// older protocol and one of another CA answer no direct probe.
func TestProbeDirectRefused(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	b := newEndpoint(t, ca, "b", RoleServer)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	quiet := newEndpoint(t, ca, "quiet", RoleServer)
	if _, err := b.ProbeDirect(ctx, quiet.Addr().String(), 1<<10); err == nil {
		t.Fatal("an endpoint without ServeProbe answered")
	}
	id, _ := SelfIssue(ca, "old", RoleServer)
	old, err := Listen(Config{Bind: "127.0.0.1:0", Identity: id, Protocols: version.Window{Min: 1, Max: version.DirectProtocol - 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	ServeProbe(old, 0)
	if _, err := b.ProbeDirect(ctx, old.Addr().String(), 1<<10); err == nil {
		t.Fatal("a protocol-3 endpoint answered a direct probe")
	}
	a, x := intruderPair(t)
	ServeProbe(a, 0)
	if _, err := x.ProbeDirect(ctx, a.Addr().String(), 1<<10); err == nil {
		t.Fatal("a direct probe from a foreign CA answered")
	}
	if _, err := b.Probe(ctx, quiet.Addr().String(), 0); err == nil {
		t.Fatal("QUIC probe of an endpoint without ServeProbe answered")
	}
}

func TestProbeRefusesPeerFromAnotherCA(t *testing.T) {
	a, x := intruderPair(t)
	ServeProbe(a, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := x.Probe(ctx, a.Addr().String(), 1<<10); err == nil {
		t.Fatal("probe from a foreign CA answered")
	}
}
