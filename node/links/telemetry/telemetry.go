package telemetry

import (
	"errors"
	"net/netip"
	"slices"
	"time"
)

// Direction says which way traffic flowed, seen from this node.
type Direction uint8

const (
	// Tx is traffic this node sent to the peer.
	Tx Direction = 0
	// Rx is traffic this node received from the peer.
	Rx Direction = 1
)

func (d Direction) String() string {
	switch d {
	case Tx:
		return "tx"
	case Rx:
		return "rx"
	}
	return "unknown"
}

// Counters count UDP payload bytes and UDP datagrams (eBPF) or QUIC packets
// (quic-go). Payload bytes exclude the IP and UDP headers, which is also
// what quic-go counts, so the two sources measure the same thing.
type Counters struct {
	Bytes, Packets uint64
}

// PeerStats is one peer's traffic with this node since counting began.
type PeerStats struct {
	// Peer is the peer's address and UDP port; IPv4 addresses are always
	// in their 4-byte form (never ::ffff:a.b.c.d), without a zone.
	Peer   netip.AddrPort
	Tx, Rx Counters

	// Only the quic-go source knows these; they are zero from eBPF.
	PacketsLost uint64
	SmoothedRTT time.Duration // weighted by packets over the peer's connections
	MinRTT      time.Duration // the least over the peer's connections
}

// Source names: where a Reader's numbers come from.
const (
	SourceTCX  = "ebpf-tcx" // eBPF classifiers attached with TCX links
	SourceTC   = "ebpf-tc"  // eBPF classifiers attached as legacy tc clsact filters
	SourceQUIC = "quic"     // quic-go's connection statistics
)

// Reader is what both the eBPF Probe and the quic-go fallback provide.
type Reader interface {
	// Source is one of SourceTCX, SourceTC, SourceQUIC.
	Source() string
	// Peers returns every peer's counters, sorted by address and port.
	Peers() ([]PeerStats, error)
	Close() error
}

var _ Reader = (*Probe)(nil)

// ErrUnsupported is wrapped by the errors of Attach (and InterfaceFor where
// routes cannot be read) when eBPF cannot be used here: not Linux, no
// privileges (CAP_BPF and CAP_NET_ADMIN, or root), a kernel too old or
// without a needed feature, or a verifier refusal. The wrapped reason is
// kept (errors.Is(err, os.ErrPermission) holds for missing privileges).
// Callers test it with errors.Is and fall back to the quic-go source.
var ErrUnsupported = errors.New("telemetry: eBPF counters unsupported here")

// ConnStat is what the fallback reads: one row per open QUIC connection,
// taken from quic-go's (*quic.Conn).ConnectionStats and RemoteAddr.
type ConnStat struct {
	Peer                   netip.AddrPort
	BytesSent, PacketsSent uint64
	BytesReceived          uint64
	PacketsReceived        uint64
	PacketsLost            uint64
	SmoothedRTT, MinRTT    time.Duration
}

// FromQUIC turns connection rows into PeerStats, one per peer address and
// port (several connections to one peer are summed; IPv4-mapped addresses
// are unmapped so they meet eBPF's keys). Rows cover open connections only:
// when a connection closes its bytes leave the sum, so a caller exporting
// monotonic counters must keep closed connections' totals itself.
func FromQUIC(rows []ConnStat) []PeerStats {
	type acc struct {
		ps      PeerStats
		rttSum  float64 // SmoothedRTT × packets
		rttPkts uint64
		rttLast time.Duration // a row's SmoothedRTT when none had packets
	}
	by := make(map[netip.AddrPort]*acc, len(rows))
	for _, r := range rows {
		peer := normalize(r.Peer)
		a := by[peer]
		if a == nil {
			a = &acc{ps: PeerStats{Peer: peer}}
			by[peer] = a
		}
		a.ps.Tx.Bytes += r.BytesSent
		a.ps.Tx.Packets += r.PacketsSent
		a.ps.Rx.Bytes += r.BytesReceived
		a.ps.Rx.Packets += r.PacketsReceived
		a.ps.PacketsLost += r.PacketsLost
		if r.MinRTT > 0 && (a.ps.MinRTT == 0 || r.MinRTT < a.ps.MinRTT) {
			a.ps.MinRTT = r.MinRTT
		}
		if r.SmoothedRTT > 0 {
			w := r.PacketsSent + r.PacketsReceived
			a.rttSum += float64(r.SmoothedRTT) * float64(w)
			a.rttPkts += w
			a.rttLast = r.SmoothedRTT
		}
	}
	out := make([]PeerStats, 0, len(by))
	for _, a := range by {
		switch {
		case a.rttPkts > 0:
			a.ps.SmoothedRTT = time.Duration(a.rttSum/float64(a.rttPkts) + 0.5)
		default:
			a.ps.SmoothedRTT = a.rttLast
		}
		out = append(out, a.ps)
	}
	sortPeers(out)
	return out
}

// QUICReader is the fallback Reader: it calls rows on every Peers call
// (the transport provides it from its open connections).
type QUICReader struct {
	rows func() []ConnStat
}

// NewQUICReader returns a Reader over quic-go's connection statistics.
func NewQUICReader(rows func() []ConnStat) *QUICReader {
	return &QUICReader{rows: rows}
}

// Source returns SourceQUIC.
func (q *QUICReader) Source() string { return SourceQUIC }

// Peers sums the current rows per peer.
func (q *QUICReader) Peers() ([]PeerStats, error) { return FromQUIC(q.rows()), nil }

// Close does nothing.
func (q *QUICReader) Close() error { return nil }

var _ Reader = (*QUICReader)(nil)

// normalize gives an address the form PeerStats uses: IPv4 unmapped, no zone.
func normalize(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
}

func sortPeers(ps []PeerStats) {
	slices.SortFunc(ps, func(a, b PeerStats) int { return a.Peer.Compare(b.Peer) })
}
