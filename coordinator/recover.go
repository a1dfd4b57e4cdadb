package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// Outage recovery. A cluster that has lost a majority of its voters for
// good cannot elect a leader, and no Raft command can change that (a
// change needs a leader). The operator then writes, on every server that
// is left, a file naming the servers the cluster is to have, as Consul's
// peers.json does, and starts them: each rewrites its Raft configuration
// to exactly those servers before it starts, keeping its log and state.
//
// The file is RecoveryFile in the data dir's raft folder, a JSON array of
// {"id": NODE-ID, "address": HOST:QUIC-PORT, "non_voter": false}; it is
// removed once applied. Every server named must be given the same file.
const RecoveryFile = "peers.json"

// RecoveryPath is where a server with data dir dataDir reads its recovery
// file.
func RecoveryPath(dataDir string) string {
	return filepath.Join(dataDir, "raft", RecoveryFile)
}

// RecoveryEntry is one server of a recovery file.
type RecoveryEntry struct {
	ID       string `json:"id"`
	Address  string `json:"address"`
	NonVoter bool   `json:"non_voter,omitempty"`
}

// WriteRecovery writes the recovery file of the server with data dir
// dataDir: on its next start the cluster's configuration becomes servers.
func WriteRecovery(dataDir string, servers []RecoveryEntry) error {
	if len(servers) == 0 {
		return errors.New("coordinator: a recovery configuration needs at least one server")
	}
	b, err := json.MarshalIndent(servers, "", "  ")
	if err != nil {
		return err
	}
	p := RecoveryPath(dataDir)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// applyRecovery rewrites the stored Raft configuration to the one in dir's
// recovery file, when there is one, then removes the file. A file that
// cannot be read or names no voter stops the start with an error that
// says which file, so the operator can fix it: starting without it would
// leave the cluster without a leader.
func applyRecovery(dir string, rc *raft.Config, store interface {
	raft.LogStore
	raft.StableStore
}, snaps raft.SnapshotStore, trans raft.Transport, log *zap.Logger) error {
	p := filepath.Join(dir, RecoveryFile)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	conf, err := raft.ReadConfigJSON(p)
	if err != nil {
		return fmt.Errorf("recovery file %s: %w (a JSON array of {\"id\", \"address\", \"non_voter\"}; remove it to start without recovery)", p, err)
	}
	voters := 0
	for _, s := range conf.Servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	if voters == 0 {
		return fmt.Errorf("recovery file %s names no voter", p)
	}
	// A fresh state machine: recovery replays the log into it to take a
	// snapshot, and the server's own is restored from that snapshot after.
	if err := raft.RecoverCluster(rc, NewFSM(), store, store, snaps, trans, conf); err != nil {
		return fmt.Errorf("recovery file %s: %w", p, err)
	}
	if err := os.Remove(p); err != nil {
		return fmt.Errorf("recovery applied, but its file stays: %w", err)
	}
	ids := make([]string, 0, len(conf.Servers))
	for _, s := range conf.Servers {
		ids = append(ids, string(s.ID))
	}
	log.Warn("recovered the Raft configuration from the recovery file", zap.String("file", p), zap.Strings("servers", ids), zap.Int("voters", voters))
	return nil
}

// Stored is what a server's data dir holds of the cluster: the Raft
// configuration, and the term and index of the last entry of its log (or
// of its snapshot, when the log holds none past it): what an election
// compares to pick the most up-to-date server.
type Stored struct {
	Servers   []ServerInfo
	LastTerm  uint64
	LastIndex uint64
}

// After reports whether s's log is more up to date than o's, as Raft
// compares them: the later last term, then the longer log.
func (s *Stored) After(o *Stored) bool {
	if s.LastTerm != o.LastTerm {
		return s.LastTerm > o.LastTerm
	}
	return s.LastIndex > o.LastIndex
}

// ReadStored reads what dataDir holds of the cluster without starting a
// server (the server must not be running): nil when there is no Raft
// state there.
func ReadStored(dataDir string) (*Stored, error) {
	dir := filepath.Join(dataDir, "raft")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	hl := hclog.NewNullLogger()
	store, err := openStore(dir, hl, zap.NewNop())
	if err != nil {
		return nil, err
	}
	defer store.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 3, hl)
	if err != nil {
		return nil, fmt.Errorf("raft snapshots: %w", err)
	}
	has, err := raft.HasExistingState(store, store, snaps)
	if err != nil || !has {
		return nil, err
	}
	out := &Stored{}
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		out.LastTerm, out.LastIndex = metas[0].Term, metas[0].Index
	}
	if last, err := store.LastIndex(); err == nil && last > out.LastIndex {
		var l raft.Log
		if err := store.GetLog(last, &l); err == nil {
			out.LastTerm, out.LastIndex = l.Term, l.Index
		}
	}
	rc := raft.DefaultConfig()
	rc.LocalID = "offline-reader"
	rc.Logger = hl
	_, trans := raft.NewInmemTransport("")
	conf, err := raft.GetConfiguration(rc, NewFSM(), store, store, snaps, trans)
	if err != nil {
		return nil, err
	}
	for _, s := range conf.Servers {
		out.Servers = append(out.Servers, ServerInfo{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}
