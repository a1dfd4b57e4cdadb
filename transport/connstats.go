package transport

import (
	"context"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/quic-go/quic-go"
)

// PeerStat is what the endpoint's QUIC connections to one peer address
// carried: bytes and packets as quic-go counts them (QUIC packets, UDP
// and IP headers excluded), those of closed connections included, and
// the RTT and losses of the open one. It is the network telemetry where
// eBPF is not available.
type PeerStat struct {
	Peer            netip.AddrPort
	NodeID          string // from the peer's certificate; "" before one was verified
	Conns           int    // open connections
	BytesSent       uint64
	PacketsSent     uint64
	BytesReceived   uint64
	PacketsReceived uint64
	PacketsLost     uint64
	BytesLost       uint64        // sent bytes declared lost (resent), of which some may have arrived after all
	SmoothedRTT     time.Duration // of the open connection that sent most; 0 with none open
	MinRTT          time.Duration
}

type tracked struct {
	peer netip.AddrPort
	id   string
}

// track counts conn in PeerStats until it closes, then folds its final
// numbers into its peer's totals.
func (e *Endpoint) track(conn *quic.Conn, id string) {
	peer := addrPort(conn.RemoteAddr())
	e.mu.Lock()
	if e.live == nil {
		e.live, e.retired = map[*quic.Conn]tracked{}, map[netip.AddrPort]*PeerStat{}
	}
	e.live[conn] = tracked{peer: peer, id: id}
	e.mu.Unlock()
	context.AfterFunc(conn.Context(), func() {
		st := conn.ConnectionStats()
		e.mu.Lock()
		defer e.mu.Unlock()
		delete(e.live, conn)
		r := e.retired[peer]
		if r == nil {
			r = &PeerStat{Peer: peer}
			e.retired[peer] = r
		}
		if id != "" {
			r.NodeID = id
		}
		r.BytesSent += st.BytesSent
		r.PacketsSent += st.PacketsSent
		r.BytesReceived += st.BytesReceived
		r.PacketsReceived += st.PacketsReceived
		r.PacketsLost += st.PacketsLost
		r.BytesLost += st.BytesLost
	})
}

// PeerStats lists, per peer address, what every connection to or from it
// carried so far, sorted by address.
func (e *Endpoint) PeerStats() []PeerStat {
	e.mu.Lock()
	by := make(map[netip.AddrPort]*PeerStat, len(e.retired)+len(e.live))
	for p, r := range e.retired {
		c := *r
		by[p] = &c
	}
	live := make(map[*quic.Conn]tracked, len(e.live))
	for c, t := range e.live {
		live[c] = t
	}
	e.mu.Unlock()
	most := map[netip.AddrPort]uint64{}
	for c, t := range live {
		st := c.ConnectionStats()
		s := by[t.peer]
		if s == nil {
			s = &PeerStat{Peer: t.peer}
			by[t.peer] = s
		}
		if t.id != "" {
			s.NodeID = t.id
		}
		s.Conns++
		s.BytesSent += st.BytesSent
		s.PacketsSent += st.PacketsSent
		s.BytesReceived += st.BytesReceived
		s.PacketsReceived += st.PacketsReceived
		s.PacketsLost += st.PacketsLost
		s.BytesLost += st.BytesLost
		if st.BytesSent >= most[t.peer] {
			most[t.peer] = st.BytesSent
			s.SmoothedRTT, s.MinRTT = st.SmoothedRTT, st.MinRTT
		}
	}
	out := make([]PeerStat, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer.String() < out[j].Peer.String() })
	return out
}

func addrPort(a net.Addr) netip.AddrPort {
	if u, ok := a.(*net.UDPAddr); ok {
		ap := u.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}
