package coordinator

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"shoal/internal/version"
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

	// done is the index of the last command this FSM has taken in, the
	// skipped ones included, or of the state a restore swapped in. Raft
	// counts an entry applied when it hands it to the FSM's goroutine,
	// before the FSM has run it; Server.CaughtUp reads this instead.
	done atomic.Uint64

	// applyHook, when set (tests), runs before each command: a slow FSM.
	applyHook func()

	// protocols is the window of the server (version.This unless a test
	// runs it as another build).
	protocols version.Window
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an FSM with an empty state.
func NewFSM() *FSM {
	return &FSM{state: NewState(), log: zap.L().Named("fsm"), changed: make(chan struct{}), protocols: version.This}
}

// Apply dispatches a log entry by its type byte. Every server applies the
// same entries in the same order, so every decision below is the same on
// each of them and their states stay equal:
//
//   - a command of a type this server does not know is skipped with an
//     error (with or without IgnoreUnknownTypeFlag): Consul stops on one,
//     but an entry no server can apply would then stop every server, on
//     every restart, for good; an older server that skips a newer type
//     is the lesser harm, and Server.Apply and Client.Handle refuse such
//     a command before it is written;
//   - a command that fails its checks (Validate: sizes, counts, names,
//     the model profile's bounds) is skipped with a 400 error, the state
//     unchanged, its index included;
//   - a handler that panics despite them is recovered: the panic is
//     logged with the index and answered as a 500 error (what the handler
//     wrote before it panicked stays, the same on every server).
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	if f.applyHook != nil {
		f.applyHook()
	}
	defer f.took(l.Index)
	if len(l.Data) == 0 {
		return nil
	}
	t := MessageType(l.Data[0])
	if w := entryProtocol(l); !readable(w, f.protocols) {
		f.log.Error("skipping a command written by a build of another protocol: upgrade this server", zap.String("command", CommandName(t)),
			zap.Uint64("index", l.Index), zap.Stringer("written_by", w), zap.Stringer("reads", f.protocols))
		return invalid("command %s at index %d was written by a server of %v; this server reads %v", CommandName(t), l.Index, w, f.protocols)
	}
	ignoreUnknown := t&IgnoreUnknownTypeFlag != 0
	t &^= IgnoreUnknownTypeFlag
	c, ok := commandTable[t]
	if !ok {
		if ignoreUnknown {
			f.log.Warn("skipping a command of unknown type (flagged as safe to skip)", zap.Uint8("type", uint8(t)), zap.Uint64("index", l.Index))
		} else {
			f.log.Error("skipping a command of unknown type: a newer server wrote it? upgrade this one", zap.Uint8("type", uint8(t)), zap.Uint64("index", l.Index))
		}
		return errUnknownType(t)
	}
	req, err := f.check(c, t, l)
	if err != nil {
		f.log.Warn("skipping an invalid command", zap.String("command", CommandName(t)), zap.Uint64("index", l.Index), zap.Error(err))
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	defer func() {
		f.state.Index = l.Index
		close(f.changed)
		f.changed = make(chan struct{})
	}()
	return f.apply(c, t, l.Index, req)
}

// took records that the command at index has been taken in.
func (f *FSM) took(index uint64) {
	if index > f.done.Load() {
		f.done.Store(index)
	}
}

// Done returns the index of the last command the FSM has taken in
// (applied or skipped) or restored.
func (f *FSM) Done() uint64 { return f.done.Load() }

// check decodes and checks a command, a panic (a bug in a check) turned
// into an error like one in a handler.
func (f *FSM) check(c command, t MessageType, l *raft.Log) (req any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = f.recovered(t, l.Index, p)
		}
	}()
	return c.check(l.Data[1:])
}

// apply runs a checked command's handler, recovering a panic.
func (f *FSM) apply(c command, t MessageType, index uint64, req any) (res any) {
	defer func() {
		if p := recover(); p != nil {
			res = f.recovered(t, index, p)
		}
	}()
	return c.apply(f.state, index, req)
}

// recovered logs a panic of command t at index and returns its error.
func (f *FSM) recovered(t MessageType, index uint64, p any) error {
	f.log.Error("a command panicked: skipped (a bug: please report it with this log)", zap.String("command", CommandName(t)),
		zap.Uint64("index", index), zap.Any("panic", p), zap.Stack("stack"))
	return &Error{Code: http.StatusInternalServerError, Msg: fmt.Sprintf("command %s at index %d panicked: %v", CommandName(t), index, p)}
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
	st := f.State()
	w := f.protocols
	st.WrittenBy = &w
	return &snapshot{state: st}, nil
}

// Restore replaces the state with a snapshot: it decodes into a fresh
// state and swaps it in at once.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s, err := ReadSnapshot(rc)
	if err != nil {
		return err
	}
	w := version.Window{Min: 1, Max: 1} // a snapshot from before protocol 2
	if s.WrittenBy != nil {
		w = *s.WrittenBy
	}
	if !readable(w, f.protocols) {
		return fmt.Errorf("snapshot written by a server of %v; this server reads %v: run a release of the snapshot's window", w, f.protocols)
	}
	f.log.Info("restored a snapshot", zap.Uint64("index", s.Index), zap.Stringer("written_by", w))
	s.WrittenBy = nil
	// What no command could have written is dropped, with a log, rather
	// than refused: a server must start on the snapshot it has.
	s.sanitize(func(what, key string, err error) {
		f.log.Error("restore: dropping an invalid entry of the snapshot", zap.String("what", what), zap.String("key", key), zap.Error(err))
	})
	f.mu.Lock()
	f.state = s
	f.done.Store(s.Index)
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
