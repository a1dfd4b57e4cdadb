package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"shoal/internal/version"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"shoal/internal/nodeaddr"
	"shoal/internal/zapio"
)

// Member is a node as gossip sees it.
type Member struct {
	ID       string
	Name     string
	Role     string
	Addr     string // gossip
	RPCAddr  string // QUIC; the raft address of a server
	HTTPAddr string
	Version  string
	Protocol int // the protocol it speaks (0: a build from before protocol 2, which speaks 1)
	Status   NodeStatus
	Expect   int // the server's --bootstrap-expect
	Caps     Capabilities
}

// Membership is the gossip view the leader reconciles.
type Membership interface {
	Members() []Member
	// Events delivers a (coalesced) signal when membership changes.
	Events() <-chan struct{}
}

// Config of a coordinator server.
type Config struct {
	NodeID    string
	DataDir   string // raft/ below it holds the log, stable store and snapshots
	Layer     raft.StreamLayer
	Members   Membership
	Bootstrap int // --bootstrap-expect; 0 waits to be added by a leader

	// PeerHasState asks another server whether it already belongs to a
	// Raft cluster, so a late server does not bootstrap a second one.
	PeerHasState func(ctx context.Context, m Member) (bool, error)

	// OnLeader runs once each time this server gains leadership, after the
	// barrier and before the first reconcile (e.g. to seed state).
	OnLeader func()

	// Certify asks the node gossip lists as m, over a connection that
	// verifies its certificate, who it is: the answer's ID, Name and Role
	// are the certificate's, its addresses the ones that reached it, its
	// Version and Caps the node's own report on that connection. Gossip
	// is only a hint that m exists: the leader registers a node, plans on
	// it and adds it to Raft only as Certify answers. An error (no answer,
	// another node's certificate) leaves the node out. Required.
	Certify func(ctx context.Context, m Member) (Member, error)

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	ReconcileInterval  time.Duration
	// DeadServerGrace is how long a voter may be failed before the leader
	// replaces or removes it.
	DeadServerGrace time.Duration
	// ServerStabilization is how long a non-voter must be healthy before
	// promotion.
	ServerStabilization time.Duration
	SnapshotThreshold   uint64
	SnapshotInterval    time.Duration
	// Protocols is the window of protocols this server speaks (zero: this
	// build's, version.This); tests run a server as another build.
	Protocols version.Window

	fsmHook func() // tests: runs before each command the FSM takes in
}

func (c *Config) defaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 500 * time.Millisecond
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = 500 * time.Millisecond
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = c.HeartbeatTimeout / 2
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = 2 * time.Second
	}
	if c.DeadServerGrace == 0 {
		c.DeadServerGrace = 30 * time.Second
	}
	if c.ServerStabilization == 0 {
		c.ServerStabilization = 2 * time.Second
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 2 * time.Minute
	}
}

// ErrNotLeader is returned by Apply on a follower; callers forward.
var ErrNotLeader = &Error{Code: http.StatusServiceUnavailable, Msg: "not the leader"}

// errLeadershipLost is Apply's answer when the leader lost its term while
// the command was committing: it is an ErrNotLeader (the write may be
// sent again), but the command may have been applied all the same.
var errLeadershipLost = fmt.Errorf("%w (%s)", ErrNotLeader, outcomeUnknown)

// outcomeUnknown is in the text of an error whose command may have been
// applied (it travels in the message between agents).
const outcomeUnknown = "leadership lost while committing: the command may have been applied"

// ErrNoLeader means the cluster has no leader right now.
var ErrNoLeader = &Error{Code: http.StatusServiceUnavailable, Msg: "no cluster leader"}

// Server is one Raft voter or non-voter with the cluster FSM.
type Server struct {
	cfg   Config
	raft  *raft.Raft
	fsm   *FSM
	store *wal.WAL // the Raft log and stable store
	trans *raft.NetworkTransport
	log   *zap.Logger

	notify   chan bool
	shutdown chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	removed map[string]time.Time // nodes an operator removed, kept out of reconcile a while
	seen    map[string]time.Time // when the leader first saw a server healthy as non-voter
	failed  map[string]time.Time // when the leader first saw a server failed
	planSig map[string]string    // per model, the planning inputs of the last committed decision

	certs certifier // the leader's certified view of gossip members

	startIndex uint64      // the last log index read back at start
	caughtUp   atomic.Bool // latched by CaughtUp
}

// NewServer opens the stores and starts Raft.
func NewServer(cfg Config) (*Server, error) {
	cfg.defaults()
	if cfg.NodeID == "" || cfg.DataDir == "" || cfg.Layer == nil || cfg.Members == nil || cfg.Certify == nil {
		return nil, errors.New("coordinator: NodeID, DataDir, Layer, Members and Certify are required")
	}
	dir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	log := zap.L().Named("coordinator")
	hl := hclog.New(&hclog.LoggerOptions{
		Name:   "raft",
		Output: zapio.Writer{L: zap.L().Named("raft")},
		Level:  hclogLevel(zap.L().Core()),
	})
	store, err := openStore(dir, hl, log)
	if err != nil {
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 3, hl)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("raft snapshots: %w", err)
	}
	fsm := NewFSM()
	fsm.applyHook = cfg.fsmHook
	fsm.protocols = cfg.Protocols.Or()
	// Servers are dialed by ID where gossip and the state say they are
	// now, not only at the address the configuration recorded: a server
	// that restarts on a new IP keeps its ID.
	resolver := newAddrResolver(cfg.Members, fsm, log)
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		ServerAddressProvider: resolver,
		Stream:                cfg.Layer,
		MaxPool:               3,
		Timeout:               2 * time.Second,
		Logger:                hl,
	})
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hl
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = 20 * time.Millisecond
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = 1024
	notify := make(chan bool, 10)
	rc.NotifyCh = notify
	if err := applyRecovery(dir, rc, store, snaps, trans, log); err != nil {
		trans.Close()
		store.Close()
		return nil, err
	}
	r, err := raft.NewRaft(rc, fsm, store, store, snaps, trans)
	if err != nil {
		trans.Close()
		store.Close()
		return nil, fmt.Errorf("raft: %w", err)
	}
	resolver.raft.Store(r)
	s := &Server{
		cfg: cfg, raft: r, fsm: fsm, store: store, trans: trans, log: log,
		notify: notify, shutdown: make(chan struct{}),
		removed: map[string]time.Time{}, seen: map[string]time.Time{}, failed: map[string]time.Time{},
		startIndex: r.LastIndex(),
	}
	s.wg.Add(2)
	go s.monitorLeadership()
	go s.maybeBootstrap()
	return s, nil
}

func hclogLevel(c zapcore.Core) hclog.Level {
	switch {
	case c.Enabled(zapcore.DebugLevel):
		return hclog.Debug
	case c.Enabled(zapcore.InfoLevel):
		return hclog.Info
	case c.Enabled(zapcore.WarnLevel):
		return hclog.Warn
	}
	return hclog.Error
}

// FSM returns the state machine (read it with View or State).
func (s *Server) FSM() *FSM { return s.fsm }

// Raft exposes the raft instance for status queries.
func (s *Server) Raft() *raft.Raft { return s.raft }

// IsLeader reports whether this server leads.
func (s *Server) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leader returns the leader's ID and raft (QUIC) address, empty if none.
func (s *Server) Leader() (id, addr string) {
	a, i := s.raft.LeaderWithID()
	_, addr = nodeaddr.Split(string(a)) // raft learns it as resolved, with the ID
	return string(i), addr
}

// CaughtUp reports whether this server's copy of the state is whole: it
// has applied the log it read back at start, or, having heard from a
// leader since, every entry of its log is committed and applied (a tail
// it held that the cluster never committed was replaced). Raft restores
// only the last snapshot at start; the entries after it are applied once
// a leader says they are committed, so until then the copy can be far
// behind (empty, before a first snapshot). A leader just elected says
// nothing is committed (0) until an entry of its own term is: a commit
// index below the log's end is not yet a whole copy (TestReadWhileCatchingUp
// read an empty state that way on a loaded host).
func (s *Server) CaughtUp() bool {
	if s.caughtUp.Load() {
		return true
	}
	applied, commit := s.raft.AppliedIndex(), s.raft.CommitIndex()
	ok := applied >= s.startIndex ||
		!s.raft.LastContact().IsZero() && commit >= s.raft.LastIndex() && applied >= commit
	if ok && !s.fsmReached(applied) {
		ok = false
	}
	if ok {
		s.caughtUp.Store(true)
	}
	return ok
}

// fsmReached reports whether the FSM has taken in every command up to
// index: Raft's applied index moves when it hands entries to the FSM's
// goroutine, before they are run, so a read right after it could miss
// them. The entries after the FSM's last command are read back from the
// log: if none of them up to index is a command (noops and configuration
// changes never reach the FSM), the FSM is there. Entries at or below the
// last snapshot are in the state already (a restore is done before Raft
// moves its index past it), and so are entries compacted out of the log.
func (s *Server) fsmReached(index uint64) bool {
	lo := s.fsm.Done()
	if snap, err := strconv.ParseUint(s.raft.Stats()["last_snapshot_index"], 10, 64); err == nil && snap > lo {
		lo = snap
	}
	var l raft.Log
	for i := index; i > lo; i-- {
		if err := s.store.GetLog(i, &l); err != nil {
			return true // compacted: i and below are in a snapshot
		}
		if l.Type == raft.LogCommand {
			return false
		}
	}
	return true
}

// HasState reports whether this server belongs to a Raft cluster.
func (s *Server) HasState() bool {
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	return len(f.Configuration().Servers) > 0
}

// ServerInfo is one entry of the Raft configuration.
type ServerInfo struct {
	ID      string `json:"id"`
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
}

// Servers returns the Raft configuration sorted by ID.
func (s *Server) Servers() ([]ServerInfo, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	lid, _ := s.Leader()
	var out []ServerInfo
	for _, srv := range f.Configuration().Servers {
		out = append(out, ServerInfo{
			ID: string(srv.ID), Address: string(srv.Address),
			Voter: srv.Suffrage == raft.Voter, Leader: string(srv.ID) == lid,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Apply proposes a command on the leader and waits for it to be applied.
// The FSM's response error, if any, is returned. A command the FSM would
// skip (an unknown type, one that fails its checks: ValidateCommand) is
// refused with a 400 error before it is written.
func (s *Server) Apply(t MessageType, req any, timeout time.Duration) error {
	if !s.IsLeader() {
		return ErrNotLeader
	}
	b, err := Encode(t, req)
	if err != nil {
		return err
	}
	if err := ValidateCommand(t, b[1:]); err != nil {
		return err
	}
	if p := commandProtocol[t&^IgnoreUnknownTypeFlag]; p > 1 {
		if err := s.serversSpeak(p); err != nil {
			return err
		}
	}
	f := s.raft.ApplyLog(raft.Log{Data: b, Extensions: protocolExt(s.protocols())}, timeout)
	err = s.wait(f)
	if err != nil {
		if errors.Is(err, raft.ErrLeadershipLost) {
			return errLeadershipLost
		}
		if errors.Is(err, raft.ErrNotLeader) {
			return ErrNotLeader
		}
		return fmt.Errorf("raft apply: %w", err)
	}
	if r, ok := f.Response().(error); ok {
		return r
	}
	return nil
}

// wait is f.Error(), or raft.ErrRaftShutdown once the server shuts down:
// a command or change raft took but had not started when it shut down is
// never answered, and Shutdown waits for the leader loop that may be
// waiting on it (a coordinator test hung there under -race).
func (s *Server) wait(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-s.shutdown:
		return raft.ErrRaftShutdown
	}
}

// maybeBootstrap bootstraps the cluster once Bootstrap servers that all
// expect that count are alive in gossip, unless Raft state exists or a
// peer already belongs to a cluster.
func (s *Server) maybeBootstrap() {
	defer s.wg.Done()
	if s.cfg.Bootstrap == 0 {
		return
	}
	has, err := raft.HasExistingState(s.store, s.store, nilSnapshots{})
	if err == nil && has {
		return
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.shutdown:
			return
		case <-t.C:
		}
		if s.HasState() {
			return
		}
		var servers []Member
		ok := true
		for _, m := range s.cfg.Members.Members() {
			if m.Role != RoleServer || m.Status != StatusAlive {
				continue
			}
			if m.Expect != 0 && m.Expect != s.cfg.Bootstrap {
				s.log.Error("servers disagree on --bootstrap-expect; not bootstrapping",
					zap.String("peer", m.Name), zap.Int("peer_expect", m.Expect), zap.Int("expect", s.cfg.Bootstrap))
				ok = false
				break
			}
			servers = append(servers, m)
		}
		if !ok || len(servers) < s.cfg.Bootstrap {
			continue
		}
		if servers = s.certifyServers(servers); len(servers) < s.cfg.Bootstrap {
			continue
		}
		if s.peersHaveState(servers) {
			s.log.Info("a peer already belongs to a cluster; waiting to be added by its leader")
			return
		}
		sort.Slice(servers, func(i, j int) bool { return servers[i].ID < servers[j].ID })
		var conf raft.Configuration
		for _, m := range servers {
			conf.Servers = append(conf.Servers, raft.Server{
				ID: raft.ServerID(m.ID), Address: raft.ServerAddress(m.RPCAddr), Suffrage: raft.Voter,
			})
		}
		s.log.Info("bootstrapping the cluster", zap.Int("servers", len(conf.Servers)))
		if err := s.raft.BootstrapCluster(conf).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			s.log.Error("bootstrap failed", zap.Error(err))
		}
		return
	}
}

// certifyServers keeps the gossiped servers whose certificates say they
// are servers, with the addresses that presented them.
func (s *Server) certifyServers(ms []Member) []Member {
	var out []Member
	for _, m := range ms {
		ctx, cancel := context.WithTimeout(context.Background(), certifyTimeout)
		got, err := s.cfg.Certify(ctx, m)
		cancel()
		if err == nil && (got.ID != m.ID || got.Role != RoleServer) {
			err = fmt.Errorf("its certificate is node %q role %q", got.ID, got.Role)
		}
		if err != nil {
			s.log.Warn("bootstrap: a gossiped server did not prove it is one", zap.String("id", m.ID), zap.String("name", m.Name), zap.Error(err))
			continue
		}
		got.Expect, got.Status = m.Expect, m.Status
		out = append(out, got)
	}
	return out
}

func (s *Server) peersHaveState(servers []Member) bool {
	if s.cfg.PeerHasState == nil {
		return false
	}
	for _, m := range servers {
		if m.ID == s.cfg.NodeID {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		has, err := s.cfg.PeerHasState(ctx, m)
		cancel()
		if err == nil && has {
			return true
		}
	}
	return false
}

type nilSnapshots struct{}

func (nilSnapshots) Create(raft.SnapshotVersion, uint64, uint64, raft.Configuration, uint64, raft.Transport) (raft.SnapshotSink, error) {
	return nil, errors.New("unused")
}
func (nilSnapshots) List() ([]*raft.SnapshotMeta, error) { return nil, nil }
func (nilSnapshots) Open(string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	return nil, nil, errors.New("unused")
}

// Snapshot forces a snapshot now.
func (s *Server) Snapshot() error { return s.raft.Snapshot().Error() }

// Leave hands leadership to another voter if this server leads, so a
// graceful stop costs no election timeout.
func (s *Server) Leave() {
	if !s.IsLeader() {
		return
	}
	if err := s.raft.LeadershipTransfer().Error(); err != nil {
		s.log.Warn("leadership transfer failed", zap.Error(err))
	} else {
		s.log.Info("leadership transferred")
	}
}

// Shutdown stops Raft and closes the stores.
func (s *Server) Shutdown() error {
	select {
	case <-s.shutdown:
		return nil
	default:
	}
	close(s.shutdown)
	err := s.raft.Shutdown().Error()
	s.wg.Wait()
	_ = s.trans.Close()
	if cerr := s.store.Close(); err == nil {
		err = cerr
	}
	return err
}

// Addr of this server as raft knows it.
func (s *Server) Addr() net.Addr { return s.cfg.Layer.Addr() }
