package membership

import (
	"strings"
	"testing"

	"shoal/coordinator"
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
