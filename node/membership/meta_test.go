package membership

import (
	"strings"
	"testing"

	"github.com/hashicorp/memberlist"

	"shoal/coordinator"
	"shoal/internal/version"
)

func TestMetaEncodeLimit(t *testing.T) {
	m := Meta{Name: "a", Role: coordinator.RoleServer, QUIC: 7947, HTTP: 8080}
	if _, err := m.Encode(); err != nil {
		t.Fatal(err)
	}
	m.Name = strings.Repeat("x", 600)
	if _, err := m.Encode(); err == nil {
		t.Fatal("metadata over memberlist's limit was accepted")
	}
}

// A member certified from the metadata gossip gave is the gossip member
// with the certificate's identity.
func TestCertifiedFromGossipMeta(t *testing.T) {
	m := coordinator.Member{ID: "g", Name: "gossip-name", Role: coordinator.RoleClient, Addr: "10.0.0.1:7946",
		RPCAddr: "10.0.0.1:7947", HTTPAddr: "10.0.0.1:8080", Version: "v1", Status: coordinator.StatusAlive,
		Caps: coordinator.Capabilities{MemTotal: 8, MemFree: 4, Cores: 2, GFLOPS: 1.5, MemGBps: 10, Accel: "cpu", Serves: "decode"}}
	got := Certified(m, "id", "", coordinator.RoleServer, MetaOf(m))
	want := m
	want.ID, want.Role = "id", coordinator.RoleServer
	if got != want {
		t.Fatalf("certified %+v, want %+v", got, want)
	}
}

// TestGossipRefusesOtherProtocols: alive messages (and merges) of a node
// whose gossiped protocol is outside this node's window are refused, as
// its QUIC connections are; a node that gossips none is protocol 1, a
// build from before protocols were named, which this window holds.
func TestGossipRefusesOtherProtocols(t *testing.T) {
	g := &Gossip{protocols: version.Window{Min: 1, Max: 2}}
	node := func(p int) *memberlist.Node {
		b, err := (&Meta{Name: "n", Version: "x", Proto: p}).Encode()
		if err != nil {
			t.Fatal(err)
		}
		return &memberlist.Node{Name: "id", Meta: b, State: memberlist.StateAlive}
	}
	for _, p := range []int{0, 1, 2} {
		if err := g.NotifyAlive(node(p)); err != nil {
			t.Errorf("protocol %d: %v", p, err)
		}
	}
	err := g.NotifyAlive(node(9))
	if err == nil || !strings.Contains(err.Error(), "protocol 9") || !strings.Contains(err.Error(), "protocols 1-2") {
		t.Errorf("protocol 9: %v", err)
	}
	if err := g.NotifyMerge([]*memberlist.Node{node(2), node(9)}); err == nil {
		t.Error("a merge listing a node of protocol 9 alive was taken")
	}
}
