package transport

import (
	"context"
	"testing"
	"time"
)

func TestProbeLoopback(t *testing.T) {
	ca, _ := DeriveCA(testSecret)
	a := newEndpoint(t, ca, "a", RoleServer)
	b := newEndpoint(t, ca, "b", RoleClient)
	ServeProbe(a, 8<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := b.Probe(ctx, a.Addr().String(), 4<<20)
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
	if p, err := b.Probe(ctx, a.Addr().String(), 0); err != nil || p.Bytes != 0 || p.RTT <= 0 {
		t.Fatalf("ping-only probe: %+v %v", p, err)
	}
	// A bulk transfer above the server's limit is refused.
	if _, err := b.Probe(ctx, a.Addr().String(), 16<<20); err == nil {
		t.Fatal("bulk above the server's limit accepted")
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
