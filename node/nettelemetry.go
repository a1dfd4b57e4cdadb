package node

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"shoal/coordinator"
	"shoal/node/telemetry"
	"shoal/transport"
)

// Network telemetry modes (Config.NetTelemetry, shoal agent --net-telemetry).
const (
	NetTelemetryAuto = "auto" // eBPF where it can be loaded, else quic-go's counts
	NetTelemetryEBPF = "ebpf" // eBPF or fail to start
	NetTelemetryQUIC = "quic" // quic-go's counts only (the default of an in-process agent)
)

// netTelemetry counts what crosses the wire to and from each peer: eBPF
// classifiers on the interfaces the cluster's traffic uses (TCX, legacy
// tc where the kernel has no TCX) or, where eBPF cannot be loaded, the QUIC
// connections' own counts. RTT and losses always come from QUIC.
type netTelemetry struct {
	log   *zap.Logger
	ep    *transport.Endpoint
	probe *telemetry.Probe // nil: the QUIC counts
	why   string           // why eBPF is not in use ("" when it is)

	mu     sync.Mutex
	ifaces map[netip.Addr]string // peer IP -> the interface that routes to it
}

// peerTraffic is one peer's counters and what the last window achieved.
type peerTraffic struct {
	Peer                 netip.AddrPort
	TxBytes, RxBytes     uint64
	TxPackets, RxPackets uint64
	PacketsLost          uint64
	SmoothedRTT, MinRTT  time.Duration
	Iface                string
	// QUIC's own counts, also when eBPF counted the fields above.
	QUICTxBytes, QUICRxBytes     uint64
	QUICTxPackets, QUICRxPackets uint64
}

func startNetTelemetry(mode string, ep *transport.Endpoint, log *zap.Logger) (*netTelemetry, error) {
	t := &netTelemetry{log: log, ep: ep, ifaces: map[netip.Addr]string{}}
	if mode == "" {
		mode = NetTelemetryQUIC
	}
	if mode == NetTelemetryQUIC {
		t.why = "--net-telemetry quic"
		return t, nil
	}
	p, err := telemetry.Attach(uint16(ep.Addr().Port), nil)
	if err != nil {
		if mode == NetTelemetryEBPF {
			return nil, err
		}
		if !errors.Is(err, telemetry.ErrUnsupported) {
			log.Warn("eBPF telemetry failed to load", zap.Error(err))
		}
		t.why = err.Error()
		log.Info("network telemetry from QUIC's own counts: eBPF is not available", zap.Error(err))
		return t, nil
	}
	t.probe = p
	log.Info("network telemetry from eBPF", zap.String("source", p.Source()), zap.Uint16("port", p.Port()))
	return t, nil
}

// Source names where the byte and packet counts come from.
func (t *netTelemetry) Source() string {
	if t.probe != nil {
		return t.probe.Source()
	}
	return telemetry.SourceQUIC
}

// watch makes sure the interface that routes to each peer is attached.
func (t *netTelemetry) watch(peers []netip.Addr) {
	for _, ip := range peers {
		t.mu.Lock()
		_, known := t.ifaces[ip]
		t.mu.Unlock()
		if known {
			continue
		}
		name, err := telemetry.InterfaceFor(ip)
		if err != nil {
			t.log.Debug("no route to peer", zap.Stringer("peer", ip), zap.Error(err))
			continue
		}
		if t.probe != nil {
			if err := t.probe.AddInterface(name); err != nil {
				t.log.Warn("cannot count traffic on interface", zap.String("iface", name), zap.Error(err))
				continue
			}
		}
		t.mu.Lock()
		t.ifaces[ip] = name
		t.mu.Unlock()
	}
}

// peers reads every peer's counters: eBPF's bytes and packets when
// attached, QUIC's otherwise; QUIC's RTT and losses.
func (t *netTelemetry) peers() []peerTraffic {
	quic := t.ep.PeerStats()
	byAddr := map[netip.AddrPort]*peerTraffic{}
	var order []netip.AddrPort
	get := func(ap netip.AddrPort) *peerTraffic {
		p := byAddr[ap]
		if p == nil {
			p = &peerTraffic{Peer: ap}
			byAddr[ap] = p
			order = append(order, ap)
		}
		return p
	}
	for _, q := range quic {
		p := get(q.Peer)
		p.PacketsLost, p.SmoothedRTT, p.MinRTT = q.PacketsLost, q.SmoothedRTT, q.MinRTT
		p.QUICTxBytes, p.QUICRxBytes, p.QUICTxPackets, p.QUICRxPackets = q.BytesSent, q.BytesReceived, q.PacketsSent, q.PacketsReceived
		if t.probe == nil {
			p.TxBytes, p.RxBytes, p.TxPackets, p.RxPackets = q.BytesSent, q.BytesReceived, q.PacketsSent, q.PacketsReceived
		}
	}
	if t.probe != nil {
		rows, err := t.probe.Peers()
		if err != nil {
			t.log.Debug("reading eBPF counters", zap.Error(err))
		}
		for _, r := range rows {
			p := get(r.Peer)
			p.TxBytes, p.RxBytes, p.TxPackets, p.RxPackets = r.Tx.Bytes, r.Rx.Bytes, r.Tx.Packets, r.Rx.Packets
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]peerTraffic, 0, len(order))
	for _, ap := range order {
		p := byAddr[ap]
		p.Iface = t.ifaces[ap.Addr()]
		out = append(out, *p)
	}
	return out
}

func (t *netTelemetry) close() {
	if t != nil && t.probe != nil {
		if err := t.probe.Close(); err != nil {
			t.log.Warn("detaching eBPF counters", zap.Error(err))
		}
	}
}

// memberByAddr maps QUIC addresses to gossip members.
func memberByAddr(members []coordinator.Member) map[netip.AddrPort]coordinator.Member {
	out := make(map[netip.AddrPort]coordinator.Member, len(members))
	for _, m := range members {
		if ap, err := netip.ParseAddrPort(m.RPCAddr); err == nil {
			out[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] = m
		}
	}
	return out
}

var (
	descPeerBytes   = prometheus.NewDesc("shoal_peer_bytes_total", "Bytes this node's QUIC port exchanged with a peer (UDP payload: QUIC packets), by direction (tx, rx); source says whether eBPF or QUIC's own counts measured them (with eBPF, both are exported).", []string{"peer", "addr", "direction", "source"}, nil)
	descPeerPackets = prometheus.NewDesc("shoal_peer_packets_total", "UDP datagrams (eBPF) or QUIC packets (quic) exchanged with a peer, by direction.", []string{"peer", "addr", "direction", "source"}, nil)
	descPeerLost    = prometheus.NewDesc("shoal_peer_packets_lost_total", "QUIC packets sent to a peer and declared lost (quic-go's loss detection).", []string{"peer", "addr"}, nil)
	descPeerRTT     = prometheus.NewDesc("shoal_peer_rtt_seconds", "QUIC's smoothed round-trip time to a peer on the open connection.", []string{"peer", "addr"}, nil)
	descPeerIface   = prometheus.NewDesc("shoal_peer_interface_info", "The interface that routes to a peer (1 per peer).", []string{"peer", "addr", "iface"}, nil)
	descNetSource   = prometheus.NewDesc("shoal_net_telemetry_info", "Where per-peer traffic counts come from (ebpf-tcx, ebpf-tc or quic); reason says why eBPF is not used.", []string{"source", "reason"}, nil)
)

// netCollector exports the per-peer traffic counts at scrape time.
type netCollector struct{ a *Agent }

func (c netCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPeerBytes, descPeerPackets, descPeerLost, descPeerRTT, descPeerIface, descNetSource} {
		ch <- d
	}
}

func (c netCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.a.net
	if t == nil {
		return
	}
	src := t.Source()
	ch <- prometheus.MustNewConstMetric(descNetSource, prometheus.GaugeValue, 1, src, t.why)
	byAddr := memberByAddr(c.a.gossip.Members())
	for _, p := range t.peers() {
		addr := p.Peer.String()
		name := addr
		if m, ok := byAddr[p.Peer]; ok {
			name = m.Name
		}
		ch <- prometheus.MustNewConstMetric(descPeerBytes, prometheus.CounterValue, float64(p.TxBytes), name, addr, "tx", src)
		ch <- prometheus.MustNewConstMetric(descPeerBytes, prometheus.CounterValue, float64(p.RxBytes), name, addr, "rx", src)
		ch <- prometheus.MustNewConstMetric(descPeerPackets, prometheus.CounterValue, float64(p.TxPackets), name, addr, "tx", src)
		ch <- prometheus.MustNewConstMetric(descPeerPackets, prometheus.CounterValue, float64(p.RxPackets), name, addr, "rx", src)
		if src != telemetry.SourceQUIC { // QUIC's own counts beside eBPF's, to compare
			q := telemetry.SourceQUIC
			ch <- prometheus.MustNewConstMetric(descPeerBytes, prometheus.CounterValue, float64(p.QUICTxBytes), name, addr, "tx", q)
			ch <- prometheus.MustNewConstMetric(descPeerBytes, prometheus.CounterValue, float64(p.QUICRxBytes), name, addr, "rx", q)
			ch <- prometheus.MustNewConstMetric(descPeerPackets, prometheus.CounterValue, float64(p.QUICTxPackets), name, addr, "tx", q)
			ch <- prometheus.MustNewConstMetric(descPeerPackets, prometheus.CounterValue, float64(p.QUICRxPackets), name, addr, "rx", q)
		}
		ch <- prometheus.MustNewConstMetric(descPeerLost, prometheus.CounterValue, float64(p.PacketsLost), name, addr)
		if p.SmoothedRTT > 0 {
			ch <- prometheus.MustNewConstMetric(descPeerRTT, prometheus.GaugeValue, p.SmoothedRTT.Seconds(), name, addr)
		}
		if p.Iface != "" {
			ch <- prometheus.MustNewConstMetric(descPeerIface, prometheus.GaugeValue, 1, name, addr, p.Iface)
		}
	}
}
