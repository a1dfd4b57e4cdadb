package coordinator

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// snapshotVersion is the first byte of every snapshot.
const snapshotVersion = 1

// FSM is the raft.FSM of the cluster state.
type FSM struct {
	mu    sync.RWMutex
	state *State
	log   *zap.Logger

	// changed is closed and replaced after every apply or restore, so
	// readers can wait for the next change.
	changed chan struct{}
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an FSM with an empty state.
func NewFSM() *FSM {
	return &FSM{state: NewState(), log: zap.L().Named("fsm"), changed: make(chan struct{})}
}

// Apply dispatches a log entry by its type byte.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return nil
	}
	t := MessageType(l.Data[0])
	ignoreUnknown := t&IgnoreUnknownTypeFlag != 0
	t &^= IgnoreUnknownTypeFlag
	h, ok := commands[t]
	if !ok {
		if ignoreUnknown {
			f.log.Warn("skipping unknown command type", zap.Uint8("type", uint8(t)), zap.Uint64("index", l.Index))
			return nil
		}
		// Diverging silently would be worse: stop like Consul does.
		panic(fmt.Errorf("unknown command type %d at index %d: upgrade this server", t, l.Index))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res := h(f.state, l.Index, l.Data[1:])
	f.state.Index = l.Index
	close(f.changed)
	f.changed = make(chan struct{})
	return res
}

// View calls fn with the current state under a read lock. fn must not
// keep or modify it.
func (f *FSM) View(fn func(s *State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.state)
}

// State returns a deep copy of the current state.
func (f *FSM) State() *State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state.Clone()
}

// Changed returns a channel closed at the next apply or restore.
func (f *FSM) Changed() <-chan struct{} {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.changed
}

// Snapshot captures a copy of the state; Persist writes it outside the
// FSM lock.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{state: f.State()}, nil
}

// Restore replaces the state with a snapshot: it decodes into a fresh
// state and swaps it in at once.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s, err := ReadSnapshot(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state = s
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	return nil
}

// ReadSnapshot decodes what snapshot.Persist wrote.
func ReadSnapshot(r io.Reader) (*State, error) {
	var v [1]byte
	if _, err := io.ReadFull(r, v[:]); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if v[0] != snapshotVersion {
		return nil, fmt.Errorf("snapshot version %d: this server reads version %d", v[0], snapshotVersion)
	}
	s := NewState()
	if err := json.NewDecoder(r).Decode(s); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	// Maps a snapshot omitted (null) come back as nil; keep them usable.
	fresh := NewState()
	if s.Nodes == nil {
		s.Nodes = fresh.Nodes
	}
	if s.Tokens == nil {
		s.Tokens = fresh.Tokens
	}
	if s.Models == nil {
		s.Models = fresh.Models
	}
	if s.Plans == nil {
		s.Plans = fresh.Plans
	}
	if s.Shards == nil {
		s.Shards = fresh.Shards
	}
	return s, nil
}

type snapshot struct{ state *State }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	err := func() error {
		if _, err := sink.Write([]byte{snapshotVersion}); err != nil {
			return err
		}
		return json.NewEncoder(sink).Encode(s.state)
	}()
	if err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
