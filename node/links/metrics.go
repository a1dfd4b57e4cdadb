package links

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"shoal/coordinator"
	"shoal/node/links/telemetry"
)

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

// NewCollector exports t's per-peer traffic counts at scrape time (nothing
// when t is nil), naming each peer as members (gossip's) do.
func NewCollector(t *Traffic, members func() []coordinator.Member) prometheus.Collector {
	return collector{t: t, members: members}
}

type collector struct {
	t       *Traffic
	members func() []coordinator.Member
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPeerBytes, descPeerPackets, descPeerLost, descPeerRTT, descPeerIface, descNetSource} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	t := c.t
	if t == nil {
		return
	}
	src := t.Source()
	ch <- prometheus.MustNewConstMetric(descNetSource, prometheus.GaugeValue, 1, src, t.why)
	byAddr := memberByAddr(c.members())
	for _, p := range t.Peers() {
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
