package coordinator

import (
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"shoal/internal/version"
)

// Protocols in the Raft log. A cluster being upgraded holds servers of
// two adjacent releases, each working with the other's protocol, so:
//
//   - every command a server writes carries its window in the log entry's
//     Extensions (protocolExt), and every snapshot its window in the state
//     (State.WrittenBy); a server skips a command, and refuses a snapshot,
//     written by a build whose window and its own do not meet (the
//     connection refuses such a server first; this keeps a log copied
//     between machines by hand from being misread);
//   - a command type added in protocol N (commandProtocol) is written only
//     once every server of the Raft configuration speaks N, as Consul gates
//     new features on its servers' versions: until then Server.Apply
//     refuses it with the servers that lag named;
//   - the leader records the cluster's protocol, the newest every alive
//     node speaks (ProtocolSetType, State.Protocol), once it is above the
//     recorded one: what a whole cluster may rely on, and what
//     shoal upgrade-check reads.

// commandProtocol is the protocol each command type was added in, where
// it is above 1 (every type before protocols were named).
var commandProtocol = map[MessageType]int{
	ProtocolSetType: 2,
}

// protocolExt is w as a log entry's Extensions: "sp", the newest protocol,
// the oldest.
func protocolExt(w version.Window) []byte {
	return []byte{'s', 'p', byte(w.Max), byte(w.Min)}
}

// parseProtocolExt reads protocolExt; ok is false for an entry without one
// (written by a build from before protocol 2).
func parseProtocolExt(b []byte) (w version.Window, ok bool) {
	if len(b) < 4 || b[0] != 's' || b[1] != 'p' || b[3] == 0 || b[2] < b[3] {
		return w, false
	}
	return version.Window{Min: int(b[3]), Max: int(b[2])}, true
}

// readable reports whether a reader of window r reads what a writer of
// window w wrote: w writes what w.Min reads, and r reads back to r.Min.
func readable(w, r version.Window) bool { return w.Min <= r.Max && w.Max >= r.Min }

// entryProtocol is the window of the build that wrote l (protocol 1 alone
// for an entry without one).
func entryProtocol(l *raft.Log) version.Window {
	if w, ok := parseProtocolExt(l.Extensions); ok {
		return w
	}
	return version.Window{Min: 1, Max: 1}
}

// ProtocolSetRequest records the cluster's protocol: the newest every
// alive node speaks. It only ever rises.
type ProtocolSetRequest struct {
	Protocol int `json:"protocol"`
}

// Validate checks the protocol's bounds.
func (r *ProtocolSetRequest) Validate() error {
	if r.Protocol < 1 || r.Protocol > 255 {
		return invalid("protocol %d: want 1 to 255", r.Protocol)
	}
	return nil
}

func applyProtocolSet(s *State, _ uint64, r *ProtocolSetRequest) any {
	if r.Protocol > s.Protocol {
		s.Protocol = r.Protocol
	}
	return nil
}

// protocols is the window this server speaks.
func (s *Server) protocols() version.Window { return s.cfg.Protocols.Or() }

// serversSpeak checks that every server of the Raft configuration speaks
// protocol p, by the protocol its registration records (this server's own
// window for itself): a 409 *Error naming those that do not.
func (s *Server) serversSpeak(p int) error {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	var lag []string
	s.fsm.View(func(st *State) {
		for _, srv := range f.Configuration().Servers {
			id := string(srv.ID)
			if id == s.cfg.NodeID {
				if s.protocols().Max < p {
					lag = append(lag, fmt.Sprintf("%s (this server, protocol %d)", id, s.protocols().Max))
				}
				continue
			}
			n := st.Nodes[id]
			switch {
			case n == nil:
				lag = append(lag, id+" (not registered yet)")
			case version.Of(n.Protocol) < p:
				lag = append(lag, fmt.Sprintf("%s (shoal %s, protocol %d)", n.Name, n.Version, version.Of(n.Protocol)))
			}
		}
	})
	if len(lag) > 0 {
		sort.Strings(lag)
		return errorf(http.StatusConflict, "the cluster's servers do not all speak protocol %d yet: %s; upgrade them first", p, strings.Join(lag, ", "))
	}
	return nil
}

// clusterProtocol is the newest protocol every alive node of st speaks,
// this server included; 0 when no node is alive.
func (s *Server) clusterProtocol(st *State) int {
	p := s.protocols().Max
	for _, n := range st.Nodes {
		if n.Status == StatusAlive {
			p = min(p, version.Of(n.Protocol))
		}
	}
	return p
}

// raiseProtocol records the cluster's protocol once every alive node
// speaks one above the recorded (the leader, on reconcile).
func (s *Server) raiseProtocol() {
	var p, recorded int
	s.fsm.View(func(st *State) { p, recorded = s.clusterProtocol(st), version.Of(st.Protocol) })
	if p <= recorded {
		return
	}
	if err := s.serversSpeak(commandProtocol[ProtocolSetType]); err != nil {
		return // a server still runs a build that predates the command
	}
	if err := s.Apply(ProtocolSetType|IgnoreUnknownTypeFlag, ProtocolSetRequest{Protocol: p}, applyTimeout); err != nil {
		s.log.Warn("recording the cluster's protocol", zap.Error(err))
		return
	}
	s.log.Info("the cluster speaks a newer protocol", zap.Int("protocol", p))
}
