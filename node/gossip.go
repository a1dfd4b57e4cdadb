package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/transport"
)

// meta is what a node gossips about itself; short keys keep it far below
// memberlist's 512-byte limit.
type meta struct {
	Name    string  `json:"n"`
	Role    string  `json:"r"`
	Version string  `json:"v"`
	QUIC    int     `json:"q"`
	HTTP    int     `json:"h"`
	Expect  int     `json:"e,omitempty"`
	Mem     uint64  `json:"mt"`
	Free    uint64  `json:"mf"`
	Cores   int     `json:"c"`
	GFLOPS  float64 `json:"g"`
	GBps    float64 `json:"b"`
	Accel   string  `json:"a,omitempty"`
	Serves  string  `json:"sv,omitempty"` // the pool the operator pinned the node to
}

func (m *meta) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("node metadata is %d bytes, limit %d (shorten --name)", len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

// gossip tracks memberlist's view, including dead and left nodes that
// Members() no longer lists.
type gossip struct {
	ml   *memberlist.Memberlist
	meta []byte

	mu     sync.Mutex
	nodes  map[string]*memberlist.Node
	status map[string]coordinator.NodeStatus
	events chan struct{}

	revoked func(id string) bool       // node IDs removed from the cluster
	joined  func(id string, ip net.IP) // a member was seen alive (nil: nothing to do)
}

// NotifyAlive implements memberlist.AliveDelegate: a removed node's alive
// messages are ignored, so it cannot come back through gossip.
func (g *gossip) NotifyAlive(n *memberlist.Node) error {
	if g.revoked != nil && g.revoked(n.Name) {
		return fmt.Errorf("node %s was removed from the cluster", n.Name)
	}
	return nil
}

// NotifyMerge implements memberlist.MergeDelegate: a join or push/pull
// from a removed node, or that says one is alive, is refused (one that
// lists it dead or left, as every peer's does for a while, is not).
func (g *gossip) NotifyMerge(peers []*memberlist.Node) error {
	for _, n := range peers {
		if n.State != memberlist.StateAlive {
			continue
		}
		if err := g.NotifyAlive(n); err != nil {
			return err
		}
	}
	return nil
}

func newGossip(m []byte) *gossip {
	return &gossip{
		meta:   m,
		nodes:  map[string]*memberlist.Node{},
		status: map[string]coordinator.NodeStatus{},
		events: make(chan struct{}, 1),
	}
}

// NodeMeta implements memberlist.Delegate.
func (g *gossip) NodeMeta(limit int) []byte { return g.meta }

// NotifyMsg implements memberlist.Delegate.
func (g *gossip) NotifyMsg([]byte) {}

// GetBroadcasts implements memberlist.Delegate.
func (g *gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState implements memberlist.Delegate.
func (g *gossip) LocalState(join bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (g *gossip) MergeRemoteState(buf []byte, join bool) {}

func (g *gossip) set(n *memberlist.Node, st coordinator.NodeStatus) {
	g.mu.Lock()
	c := *n
	g.nodes[n.Name] = &c
	g.status[n.Name] = st
	g.mu.Unlock()
	select {
	case g.events <- struct{}{}:
	default:
	}
}

// NotifyJoin implements memberlist.EventDelegate.
func (g *gossip) NotifyJoin(n *memberlist.Node) {
	g.set(n, coordinator.StatusAlive)
	if g.joined != nil {
		g.joined(n.Name, n.Addr)
	}
}

// NotifyLeave implements memberlist.EventDelegate.
func (g *gossip) NotifyLeave(n *memberlist.Node) {
	st := coordinator.StatusFailed
	if n.State == memberlist.StateLeft {
		st = coordinator.StatusLeft
	}
	g.set(n, st)
}

// NotifyUpdate implements memberlist.EventDelegate.
func (g *gossip) NotifyUpdate(n *memberlist.Node) {
	g.mu.Lock()
	st := g.status[n.Name]
	g.mu.Unlock()
	if st == "" {
		st = coordinator.StatusAlive
	}
	g.set(n, st)
}

// Events implements coordinator.Membership.
func (g *gossip) Events() <-chan struct{} { return g.events }

// Members implements coordinator.Membership.
func (g *gossip) Members() []coordinator.Member {
	suspect := map[string]bool{}
	if g.ml != nil {
		for _, n := range g.ml.Members() {
			if n.State == memberlist.StateSuspect {
				suspect[n.Name] = true
			}
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]coordinator.Member, 0, len(g.nodes))
	for id, n := range g.nodes {
		st := g.status[id]
		if st == coordinator.StatusAlive && suspect[id] {
			st = coordinator.StatusSuspect
		}
		out = append(out, memberOf(n, st))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func memberOf(n *memberlist.Node, st coordinator.NodeStatus) coordinator.Member {
	var m meta
	_ = json.Unmarshal(n.Meta, &m)
	ip := n.Addr.String()
	mb := coordinator.Member{
		ID: n.Name, Name: m.Name, Role: m.Role, Version: m.Version, Status: st, Expect: m.Expect,
		Addr: net.JoinHostPort(ip, strconv.Itoa(int(n.Port))),
		Caps: coordinator.Capabilities{MemTotal: m.Mem, MemFree: m.Free, Cores: m.Cores, GFLOPS: m.GFLOPS, MemGBps: m.GBps, Accel: m.Accel, Serves: m.Serves},
	}
	if m.QUIC > 0 {
		mb.RPCAddr = net.JoinHostPort(ip, strconv.Itoa(m.QUIC))
	}
	if m.HTTP > 0 {
		mb.HTTPAddr = net.JoinHostPort(ip, strconv.Itoa(m.HTTP))
	}
	return mb
}

// joinLoop joins gossip through the seeds and --join addresses, retrying
// until it succeeds or the agent stops, then keeps the peer list on disk
// for restarts.
func (a *Agent) joinLoop() {
	defer a.bg.Done()
	peersFile := filepath.Join(a.cfg.DataDir, "peers.json")
	var saved []string
	if b, err := os.ReadFile(peersFile); err == nil {
		_ = json.Unmarshal(b, &saved)
	}
	backoff := 200 * time.Millisecond
	joined := len(a.cfg.Join) == 0 && len(a.seeds) == 0 && len(saved) == 0
	for attempt := 0; !joined; attempt++ {
		seeds := append(append([]string{}, a.seeds...), saved...)
		for _, j := range a.cfg.Join {
			addr, _ := joinAddr(j)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var got []string
			if err := transport.Call(ctx, a.ep, addr, transport.KindRPC, methodSeeds, nil, &got); err == nil {
				seeds = append(seeds, got...)
			} else if errors.Is(err, transport.ErrRevoked) {
				cancel()
				a.log.Error("the cluster refuses this node: it was removed with 'shoal node rm'; stopping", zap.String("addr", addr), zap.Error(err))
				go a.close(false) // waits for this loop to return
				return
			} else if attempt%10 == 9 {
				a.log.Warn("cannot reach join address yet", zap.String("addr", addr), zap.Error(err))
			}
			cancel()
		}
		var others []string
		self := a.GossipAddr()
		for _, s := range seeds {
			if s != self {
				others = append(others, s)
			}
		}
		if len(others) > 0 {
			if n, err := a.ml.Join(others); n > 0 {
				a.log.Info("joined gossip", zap.Int("contacted", n))
				joined = true
				break
			} else if attempt%10 == 9 {
				a.log.Warn("gossip join failed; retrying", zap.Error(err))
			}
		} else if len(a.cfg.Join) == 0 {
			break
		}
		select {
		case <-a.done:
			return
		case <-time.After(backoff):
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
	a.life.joined.Store(true)
	a.checkReady()
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		var addrs []string
		for _, m := range a.gossip.Members() {
			if m.Status == coordinator.StatusAlive && m.ID != a.id {
				addrs = append(addrs, m.Addr)
			}
		}
		if len(addrs) > 0 {
			b, _ := json.Marshal(addrs)
			_ = os.WriteFile(peersFile, b, 0o600)
		}
		select {
		case <-a.done:
			return
		case <-t.C:
		}
	}
}
