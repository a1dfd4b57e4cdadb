package coordinator

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"shoal/internal/version"
)

// TestProtocolGate: three servers, one of them a build of protocol 1 (the
// window of every build before protocols were named). Every entry the
// others write carries their window; the command added in protocol 2 is
// refused, with the server that lags named, until that server runs this
// build again, and the cluster's protocol is recorded as 2 only then.
func TestProtocolGate(t *testing.T) {
	c := newTestCluster(t)
	old := version.Window{Min: 1, Max: 1}
	a, b := c.add(3), c.add(3)
	lag := &testServer{id: "node-2", dir: c.base + "/node-2", addr: "127.0.0.1:0", expect: 3, protocols: old}
	c.addServer(lag)
	c.start(lag)
	waitFor(t, 20*time.Second, "three voters", func() bool {
		l := c.leader(10 * time.Second)
		v, _ := voters(l.srv)
		return v == 3
	})
	waitFor(t, 20*time.Second, "every server registered with its protocol", func() bool {
		st := c.leader(10 * time.Second).srv.FSM().State()
		n := st.Nodes[lag.id]
		return len(st.Nodes) == 3 && n != nil && n.Protocol == 1 && st.Nodes[a.id].Protocol == version.Protocol
	})

	err := c.onLeader(func(l *testServer) error {
		return l.srv.Apply(ProtocolSetType, ProtocolSetRequest{Protocol: 2}, 2*time.Second)
	})
	if StatusCode(err) != http.StatusConflict || !strings.Contains(err.Error(), "node-2") || !strings.Contains(err.Error(), "protocol 1") {
		t.Fatalf("the protocol-2 command with a server of protocol 1: %v, want a 409 naming it", err)
	}
	// The leader may be the old build itself, which writes entries of
	// its own window; the others write theirs.
	for _, s := range []*testServer{a, b} {
		if s.srv.IsLeader() {
			checkLastEntry(t, s.srv, version.This)
		}
	}
	time.Sleep(500 * time.Millisecond) // several reconciles
	if p := c.leader(10 * time.Second).srv.FSM().State().Protocol; p > 1 {
		t.Fatalf("the cluster's protocol was raised to %d with a server of protocol 1", p)
	}

	// The lagging server is upgraded: same data dir, this build.
	c.stop(lag)
	lag.protocols = version.Window{}
	c.start(lag)
	waitFor(t, 30*time.Second, "the cluster's protocol recorded as this build's on every server", func() bool {
		for _, s := range c.servers {
			if s.srv == nil || s.srv.FSM().State().Protocol != version.Protocol {
				return false
			}
		}
		return true
	})
	c.apply(t, ProtocolSetType, ProtocolSetRequest{Protocol: 2})
	checkLastEntry(t, c.leader(10*time.Second).srv, version.This)
}

// checkLastEntry checks that the last entry of s's log carries window w.
func checkLastEntry(t *testing.T, s *Server, w version.Window) {
	t.Helper()
	idx, err := s.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	for ; idx > 0; idx-- {
		var l raft.Log
		if err := s.store.GetLog(idx, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		if got, ok := parseProtocolExt(l.Extensions); !ok || got != w {
			t.Errorf("entry %d carries %q, want the window %v", idx, l.Extensions, w)
		}
		return
	}
	t.Error("no command in the log")
}

// TestProtocolOfEntriesAndSnapshots: an FSM skips a command written by a
// build whose window and its own do not meet (and applies one without a
// window, from before protocol 2), and restores a snapshot of a build
// before protocol 2 or of a window it shares, refusing one it does not
// with both windows named.
func TestProtocolOfEntriesAndSnapshots(t *testing.T) {
	f := NewFSM()
	drain := func(id string) []byte {
		b, _ := Encode(RegisterNodeType, RegisterNodeRequest{Node: Node{ID: id, Name: id, Status: StatusAlive}, Now: time.Now()})
		return b
	}
	f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: drain("old")})
	f.Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: drain("same"), Extensions: protocolExt(version.This)})
	res := f.Apply(&raft.Log{Index: 3, Type: raft.LogCommand, Data: drain("future"),
		Extensions: protocolExt(version.Window{Min: version.Protocol + 1, Max: version.Protocol + 2})})
	if err, ok := res.(error); !ok || !strings.Contains(err.Error(), "written by a server of") {
		t.Errorf("a command of a future window: %v", res)
	}
	st := f.State()
	if st.Nodes["old"] == nil || st.Nodes["same"] == nil || st.Nodes["future"] != nil {
		t.Fatalf("nodes after the three commands: %v", st.Nodes)
	}
	if f.Done() != 3 {
		t.Errorf("the skipped command was not taken in: done %d", f.Done())
	}

	// A snapshot of this FSM carries its window and restores elsewhere.
	snap, _ := f.Snapshot()
	var buf bytes.Buffer
	if err := snap.Persist(&sink{Buffer: &buf}); err != nil {
		t.Fatal(err)
	}
	var body struct {
		WrittenBy *version.Window `json:"written_by"`
	}
	if err := json.Unmarshal(buf.Bytes()[1:], &body); err != nil || body.WrittenBy == nil || *body.WrittenBy != version.This {
		t.Fatalf("snapshot's window: %+v %v", body.WrittenBy, err)
	}
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(buf.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if g.State().WrittenBy != nil || g.State().Nodes["same"] == nil {
		t.Errorf("restored state: %+v", g.State())
	}
	// One from before protocol 2 (no window) restores too.
	legacy := append([]byte{snapshotVersion}, []byte(`{"nodes":{"n":{"id":"n","name":"n","status":"alive"}},"index":7}`)...)
	if err := g.Restore(io.NopCloser(bytes.NewReader(legacy))); err != nil || g.State().Nodes["n"] == nil {
		t.Errorf("a snapshot from before protocol 2: %v", err)
	}
	future := append([]byte{snapshotVersion}, []byte(`{"nodes":{},"index":9,"written_by":{"min":8,"max":9}}`)...)
	err := g.Restore(io.NopCloser(bytes.NewReader(future)))
	if err == nil || !strings.Contains(err.Error(), "protocols 8-9") || !strings.Contains(err.Error(), version.This.String()) {
		t.Errorf("a snapshot of protocols 8-9: %v", err)
	}
	if g.State().Nodes["n"] == nil {
		t.Error("a refused snapshot replaced the state")
	}
}

// sink is a raft.SnapshotSink over a buffer.
type sink struct{ *bytes.Buffer }

func (s *sink) ID() string    { return "test" }
func (s *sink) Cancel() error { return nil }
func (s *sink) Close() error  { return nil }
