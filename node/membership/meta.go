package membership

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/memberlist"

	"shoal/coordinator"
)

// Meta is what a node gossips about itself, and answers Node.Hello with;
// short keys keep it far below memberlist's 512-byte limit.
type Meta struct {
	Name      string  `json:"n"`
	Role      string  `json:"r"`
	Version   string  `json:"v"`
	Proto     int     `json:"p,omitempty"` // the protocol the node speaks (absent: 1)
	QUIC      int     `json:"q"`
	HTTP      int     `json:"h"`
	Expect    int     `json:"e,omitempty"`
	Mem       uint64  `json:"mt"`
	Free      uint64  `json:"mf"`
	Cores     int     `json:"c"`
	GFLOPS    float64 `json:"g"`
	GBps      float64 `json:"b"`
	Accel     string  `json:"a,omitempty"`
	GPU       string  `json:"gn,omitempty"`
	GPUMem    uint64  `json:"gm,omitempty"`
	GPUGBps   float64 `json:"gb,omitempty"`
	GPUShared bool    `json:"gs,omitempty"`
	Serves    string  `json:"sv,omitempty"` // the pool the operator pinned the node to
}

// Encode is m as gossiped, refused when over memberlist's limit.
func (m *Meta) Encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("node metadata is %d bytes, limit %d (shorten --name)", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// Caps are the capacities m advertises.
func (m *Meta) Caps() coordinator.Capabilities {
	return coordinator.Capabilities{MemTotal: m.Mem, MemFree: m.Free, Cores: m.Cores, GFLOPS: m.GFLOPS, MemGBps: m.GBps, Accel: m.Accel, Serves: m.Serves,
		GPU: m.GPU, GPUMem: m.GPUMem, GPUGBps: m.GPUGBps, GPUShared: m.GPUShared}
}

// MetaOf is the metadata gossip gave for member m: what an agent of a
// version before Node.Hello is taken to have said.
func MetaOf(m coordinator.Member) Meta {
	got := Meta{Name: m.Name, Version: m.Version, Proto: m.Protocol, Expect: m.Expect, Mem: m.Caps.MemTotal, Free: m.Caps.MemFree, Cores: m.Caps.Cores,
		GFLOPS: m.Caps.GFLOPS, GBps: m.Caps.MemGBps, Accel: m.Caps.Accel, Serves: m.Caps.Serves,
		GPU: m.Caps.GPU, GPUMem: m.Caps.GPUMem, GPUGBps: m.Caps.GPUGBps, GPUShared: m.Caps.GPUShared}
	if _, p, err := net.SplitHostPort(m.HTTPAddr); err == nil {
		got.HTTP, _ = strconv.Atoi(p)
	}
	return got
}

// Certified is gossip member m as certified: identity (id, name, role)
// from the certificate (a certificate from before names were bound keeps
// gossip's name), the addresses from m, the rest from the node's own
// metadata md.
func Certified(m coordinator.Member, id, name, role string, md Meta) coordinator.Member {
	if name == "" {
		name = m.Name
	}
	out := coordinator.Member{
		ID: id, Name: name, Role: role, Addr: m.Addr, RPCAddr: m.RPCAddr, Version: md.Version, Protocol: md.Proto, Status: m.Status, Expect: md.Expect,
		Caps: md.Caps(),
	}
	if host, _, err := net.SplitHostPort(m.RPCAddr); err == nil && md.HTTP > 0 {
		out.HTTPAddr = net.JoinHostPort(host, strconv.Itoa(md.HTTP))
	}
	return out
}

func memberOf(n *memberlist.Node, st coordinator.NodeStatus) coordinator.Member {
	var m Meta
	_ = json.Unmarshal(n.Meta, &m)
	ip := n.Addr.String()
	mb := coordinator.Member{
		ID: n.Name, Name: m.Name, Role: m.Role, Version: m.Version, Protocol: m.Proto, Status: st, Expect: m.Expect,
		Addr: net.JoinHostPort(ip, strconv.Itoa(int(n.Port))),
		Caps: m.Caps(),
	}
	if m.QUIC > 0 {
		mb.RPCAddr = net.JoinHostPort(ip, strconv.Itoa(m.QUIC))
	}
	if m.HTTP > 0 {
		mb.HTTPAddr = net.JoinHostPort(ip, strconv.Itoa(m.HTTP))
	}
	return mb
}
