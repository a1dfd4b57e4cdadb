package links

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"

	"shoal/node/links/telemetry"
	"shoal/transport"
)

// Where the per-peer traffic counts come from (node.Config.NetTelemetry,
// shoal agent --net-telemetry).
const (
	ModeAuto = "auto" // eBPF where it can be loaded, else quic-go's counts
	ModeEBPF = "ebpf" // eBPF or fail to start
	ModeQUIC = "quic" // quic-go's counts only (the default of an in-process agent)
)

// Traffic counts what crosses the wire to and from each peer: eBPF
// classifiers on the interfaces the cluster's traffic uses (TCX, legacy
// tc where the kernel has no TCX) or, where eBPF cannot be loaded, the QUIC
// connections' own counts. RTT and losses always come from QUIC.
type Traffic struct {
	log   *zap.Logger
	ep    *transport.Endpoint
	probe *telemetry.Probe // nil: the QUIC counts
	why   string           // why eBPF is not in use ("" when it is)

	mu     sync.Mutex
	ifaces map[netip.Addr]string // peer IP -> the interface that routes to it
}

// PeerTraffic is one peer's counters and what the last window achieved.
type PeerTraffic struct {
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

// StartTraffic counts the traffic of ep's port as mode says: eBPF (ModeEBPF:
// or an error), QUIC's own counts (ModeQUIC, or ""), or eBPF where it
// loads and QUIC's counts where not (ModeAuto).
func StartTraffic(mode string, ep *transport.Endpoint, log *zap.Logger) (*Traffic, error) {
	t := &Traffic{log: log, ep: ep, ifaces: map[netip.Addr]string{}}
	if mode == "" {
		mode = ModeQUIC
	}
	if mode == ModeQUIC {
		t.why = "--net-telemetry quic"
		return t, nil
	}
	p, err := telemetry.Attach(uint16(ep.Addr().Port), nil)
	if err != nil {
		if mode == ModeEBPF {
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
func (t *Traffic) Source() string {
	if t.probe != nil {
		return t.probe.Source()
	}
	return telemetry.SourceQUIC
}

// Watch makes sure the interface that routes to each peer is attached.
func (t *Traffic) Watch(peers []netip.Addr) {
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

// Peers reads every peer's counters: eBPF's bytes and packets when
// attached, QUIC's otherwise; QUIC's RTT and losses.
func (t *Traffic) Peers() []PeerTraffic {
	quic := t.ep.PeerStats()
	byAddr := map[netip.AddrPort]*PeerTraffic{}
	var order []netip.AddrPort
	get := func(ap netip.AddrPort) *PeerTraffic {
		p := byAddr[ap]
		if p == nil {
			p = &PeerTraffic{Peer: ap}
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
	out := make([]PeerTraffic, 0, len(order))
	for _, ap := range order {
		p := byAddr[ap]
		p.Iface = t.ifaces[ap.Addr()]
		out = append(out, *p)
	}
	return out
}

// Close detaches the eBPF counters; t may be nil.
func (t *Traffic) Close() {
	if t != nil && t.probe != nil {
		if err := t.probe.Close(); err != nil {
			t.log.Warn("detaching eBPF counters", zap.Error(err))
		}
	}
}
