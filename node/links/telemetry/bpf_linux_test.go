//go:build linux

package telemetry

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// skbContext mirrors the kernel's struct __sk_buff (192 bytes), the context
// BPF_PROG_TEST_RUN takes for tc programs. The kernel accepts only a few
// fields as input (gso_segs and gso_size among them); the rest must be zero.
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol uint32
	VlanPresent, VlanTCI, VlanProto            uint32
	Priority, IngressIfindex, Ifindex, TCIndex uint32
	CB                                         [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID     uint32
	Family, RemoteIP4, LocalIP4                uint32
	RemoteIP6, LocalIP6                        [4]uint32
	RemotePort, LocalPort, DataMeta            uint32
	FlowKeys, Tstamp                           uint64
	WireLen, GSOSegs                           uint32
	Sk                                         uint64
	GSOSize                                    uint32
	TstampType                                 uint8
	_                                          [3]uint8
	HWTstamp                                   uint64
}

// tcxNext is TCX_NEXT (-1) as BPF_PROG_TEST_RUN reports it.
const tcxNext = 0xffffffff

const testPort = 7947

var (
	peer4  = netip.MustParseAddr("192.0.2.7")
	local4 = netip.MustParseAddr("198.51.100.1")
	peer6  = netip.MustParseAddr("2001:db8::7")
	local6 = netip.MustParseAddr("2001:db8::1")
)

// requireRoot skips the test unless it runs as root.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF and CAP_NET_ADMIN) to load eBPF programs; skipped")
	}
}

// loadForTest loads the classifiers for port, attached nowhere; it skips the
// test when the kernel refuses for lack of privileges.
func loadForTest(t testing.TB, port uint16) *Probe {
	t.Helper()
	requireRoot(t)
	p, err := load(port)
	if errors.Is(err, os.ErrPermission) {
		t.Skipf("loading eBPF not permitted here: %v", err)
	}
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// run runs one classifier on one packet and checks its verdict.
func run(t testing.TB, prog *ebpf.Program, pkt []byte, gsoSegs, gsoSize uint32) {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt, Context: skbContext{GSOSegs: gsoSegs, GSOSize: gsoSize}})
	if err != nil {
		t.Fatalf("test run (%d bytes): %v", len(pkt), err)
	}
	if ret != tcxNext {
		t.Fatalf("verdict %#x, want TCX_NEXT (%#x): the classifier must never drop or redirect", ret, uint32(tcxNext))
	}
}

// entries reads the raw map: key → per-CPU sums.
func entries(t testing.TB, p *Probe) map[peersPeerKey]peersPeerVal {
	t.Helper()
	out := map[peersPeerKey]peersPeerVal{}
	var (
		k  peersPeerKey
		vs []peersPeerVal
	)
	it := p.objs.Peers.Iterate()
	for it.Next(&k, &vs) {
		var sum peersPeerVal
		for _, v := range vs {
			sum.Bytes += v.Bytes
			sum.Packets += v.Packets
		}
		out[k] = sum
	}
	if err := it.Err(); err != nil {
		t.Fatalf("iterate: %v", err)
	}
	return out
}

// clearMap empties the map between cases.
func clearMap(t testing.TB, p *Probe) {
	t.Helper()
	for k := range entries(t, p) {
		if err := p.objs.Peers.Delete(k); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
}

func keyFor(ap netip.AddrPort, d Direction) peersPeerKey {
	return peersPeerKey{Addr: ap.Addr().As16(), Port: ap.Port(), Dir: uint8(d)}
}

func TestSkbContextLayout(t *testing.T) {
	if n := binary.Size(skbContext{}); n != 192 {
		t.Fatalf("skbContext is %d bytes, struct __sk_buff is 192", n)
	}
}

func TestClassifiers(t *testing.T) {
	p := loadForTest(t, testPort)
	o := p.objs
	pl := payload(1200)
	const peerPort = 40000
	type want struct {
		peer           netip.AddrPort
		dir            Direction
		bytes, packets uint64
	}
	cases := []struct {
		name             string
		prog             *ebpf.Program
		pkt              []byte
		times            int
		gsoSegs, gsoSize uint32
		want             *want // nil: nothing counted
	}{
		{name: "ipv4 egress from the port", prog: o.CountEgress,
			pkt:  eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, peerPort, pl, 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Tx, 1200, 1}},
		{name: "ipv4 ingress to the port", prog: o.CountIngress,
			pkt:  eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:333], 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Rx, 333, 1}},
		{name: "ipv4 accumulates", prog: o.CountIngress, times: 5,
			pkt:  eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:100], 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Rx, 500, 5}},
		{name: "ipv6 egress from the port", prog: o.CountEgress,
			pkt:  eth(0x86dd, false, ipv6(local6, peer6, 17, udp(testPort, peerPort, pl, 0))),
			want: &want{netip.AddrPortFrom(peer6, peerPort), Tx, 1200, 1}},
		{name: "ipv6 ingress to the port", prog: o.CountIngress,
			pkt:  eth(0x86dd, false, ipv6(peer6, local6, 17, udp(peerPort, testPort, pl[:77], 0))),
			want: &want{netip.AddrPortFrom(peer6, peerPort), Rx, 77, 1}},
		{name: "ipv4 with options", prog: o.CountIngress,
			pkt:  eth(0x0800, false, ipv4(peer4, local4, 17, 12, 0, udp(peerPort, testPort, pl[:500], 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Rx, 500, 1}},
		{name: "ipv4 max options", prog: o.CountEgress,
			pkt:  eth(0x0800, false, ipv4(local4, peer4, 17, 40, 0, udp(testPort, peerPort, pl[:10], 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Tx, 10, 1}},
		{name: "802.1Q tag", prog: o.CountIngress,
			pkt:  eth(0x0800, true, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:64], 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Rx, 64, 1}},
		{name: "ethernet padding is not payload", prog: o.CountIngress,
			pkt:  append(eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:2], 0))), make([]byte, 16)...),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Rx, 2, 1}},
		{name: "unfragmented with MF set", prog: o.CountIngress,
			pkt:  eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0x2000, udp(peerPort, testPort, pl[:300], 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Rx, 300, 1}},
		{name: "empty payload", prog: o.CountEgress,
			pkt:  eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, peerPort, nil, 0))),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Tx, 0, 1}},
		{name: "gso egress: segments from gso_segs", prog: o.CountEgress,
			pkt:     eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, peerPort, payload(2500), 0))),
			gsoSegs: 3, gsoSize: 1000,
			want: &want{netip.AddrPortFrom(peer4, peerPort), Tx, 2500, 3}},
		{name: "gso ingress ipv6", prog: o.CountIngress,
			pkt:     eth(0x86dd, false, ipv6(peer6, local6, 17, udp(peerPort, testPort, payload(3*1100), 0))),
			gsoSegs: 3, gsoSize: 1100,
			want: &want{netip.AddrPortFrom(peer6, peerPort), Rx, 3300, 3}},
		{name: "gso without gso_segs: ceil(payload/gso_size)", prog: o.CountEgress,
			pkt:     eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, peerPort, payload(2500), 0))),
			gsoSize: 1000,
			want:    &want{netip.AddrPortFrom(peer4, peerPort), Tx, 2500, 3}},
		{name: "gso takes bytes from the skb, not the udp length", prog: o.CountEgress,
			pkt:     eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, peerPort, payload(2000), 8+2000-1024))),
			gsoSegs: 2, gsoSize: 1000,
			want: &want{netip.AddrPortFrom(peer4, peerPort), Tx, 2000, 2}},
		{name: "l3 device ipv4 egress", prog: o.CountEgressL3,
			pkt:  ipv4(local4, peer4, 17, 0, 0, udp(testPort, peerPort, pl[:900], 0)),
			want: &want{netip.AddrPortFrom(peer4, peerPort), Tx, 900, 1}},
		{name: "l3 device ipv6 ingress", prog: o.CountIngressL3,
			pkt:  ipv6(peer6, local6, 17, udp(peerPort, testPort, pl[:901], 0)),
			want: &want{netip.AddrPortFrom(peer6, peerPort), Rx, 901, 1}},

		// Not ours.
		{name: "egress to the port is not ours", prog: o.CountEgress,
			pkt: eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(peerPort, testPort, pl, 0)))},
		{name: "ingress from the port is not ours", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(testPort, peerPort, pl, 0)))},
		{name: "another port", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort+1, pl, 0)))},
		{name: "another port ipv6", prog: o.CountEgress,
			pkt: eth(0x86dd, false, ipv6(local6, peer6, 17, udp(testPort+1, peerPort, pl, 0)))},
		{name: "tcp on the port", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 6, 0, 0, tcp(peerPort, testPort, pl)))},
		{name: "tcp on the port ipv6", prog: o.CountEgress,
			pkt: eth(0x86dd, false, ipv6(local6, peer6, 6, tcp(testPort, peerPort, pl)))},
		{name: "ipv6 extension header", prog: o.CountIngress,
			pkt: eth(0x86dd, false, ipv6(peer6, local6, 0, append([]byte{17, 0, 1, 4, 0, 0, 0, 0}, udp(peerPort, testPort, pl, 0)...)))},
		{name: "arp", prog: o.CountIngress,
			pkt: eth(0x0806, false, make([]byte, 28))},

		// Malformed or truncated: not counted, no crash, still TCX_NEXT.
		// BPF_PROG_TEST_RUN itself refuses frames whose EtherType says IP
		// but which are too short for an IP header, so those cases come
		// behind an 802.1Q tag (the kernel sees EtherType 0x8100 and lets
		// them through; the classifier reads the inner type) or on the
		// no-L2 classifiers.
		{name: "vlan tag cut", prog: o.CountIngress, pkt: eth(0x8100, false, []byte{0})},
		{name: "vlan tag only", prog: o.CountIngress, pkt: eth(0x0800, true, nil)},
		{name: "ipv4 header cut", prog: o.CountIngress,
			pkt: eth(0x0800, true, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, nil, 0))[:19])},
		{name: "udp header cut", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, nil, 0))[:27])},
		{name: "ipv6 header cut", prog: o.CountIngress,
			pkt: eth(0x86dd, true, ipv6(peer6, local6, 17, nil)[:39])},
		{name: "ipv6 udp header cut", prog: o.CountEgress,
			pkt: eth(0x86dd, false, ipv6(local6, peer6, 17, udp(testPort, peerPort, nil, 0))[:47])},
		{name: "l3 device ipv4 header cut", prog: o.CountIngressL3,
			pkt: ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, nil, 0))[:19]},
		{name: "l3 device ipv6 header cut", prog: o.CountEgressL3,
			pkt: ipv6(local6, peer6, 17, udp(testPort, peerPort, nil, 0))[:39]},
		{name: "ihl beyond the packet", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 40, 0, nil)[:30])},
		{name: "ihl below 5", prog: o.CountIngress,
			pkt: func() []byte {
				b := eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:40], 0)))
				b[14] = 0x44
				return b
			}()},
		{name: "wrong ip version", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv6(peer6, local6, 17, udp(peerPort, testPort, pl[:40], 0)))},
		{name: "udp length beyond the packet", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:40], 49)))},
		{name: "udp length below 8", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, pl[:40], 7)))},
		{name: "first fragment (datagram longer than the packet)", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0x2000, udp(peerPort, testPort, pl[:300], 8+1200)))},
		{name: "later fragment", prog: o.CountIngress,
			pkt: eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0x0010, udp(peerPort, testPort, pl[:40], 0)))},
		{name: "l3 device garbage", prog: o.CountIngressL3, pkt: payload(40)},
		{name: "l3 device udp header cut", prog: o.CountIngressL3,
			pkt: ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, nil, 0))[:24]},
		{name: "gso shorter than its headers", prog: o.CountIngress,
			pkt:     eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(peerPort, testPort, nil, 0)))[:40],
			gsoSegs: 2, gsoSize: 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clearMap(t, p)
			n := max(c.times, 1)
			for range n {
				run(t, c.prog, c.pkt, c.gsoSegs, c.gsoSize)
			}
			got := entries(t, p)
			if c.want == nil {
				if len(got) != 0 {
					t.Fatalf("counted %v, want nothing", got)
				}
				return
			}
			k := keyFor(c.want.peer, c.want.dir)
			v, ok := got[k]
			if !ok || len(got) != 1 {
				t.Fatalf("map %v, want one entry under %v %v", got, c.want.peer, c.want.dir)
			}
			if v.Bytes != c.want.bytes || v.Packets != c.want.packets {
				t.Fatalf("%v %v: %d bytes %d packets, want %d bytes %d packets",
					c.want.peer, c.want.dir, v.Bytes, v.Packets, c.want.bytes, c.want.packets)
			}
			// The reference model agrees with the hand-written expectation.
			egress := c.prog == o.CountEgress || c.prog == o.CountEgressL3
			l2 := c.prog == o.CountEgress || c.prog == o.CountIngress
			r, ok := reference(c.pkt, l2, egress, testPort, c.gsoSegs, c.gsoSize)
			if !ok || r.key != k || r.bytes*uint64(n) != v.Bytes || r.packets*uint64(n) != v.Packets {
				t.Fatalf("reference model disagrees: %+v %v", r, ok)
			}
		})
	}
}

// TestPeersMerge checks what Peers makes of the map: tx and rx of one peer
// in one row, IPv4 unmapped, sorted.
func TestPeersMerge(t *testing.T) {
	p := loadForTest(t, testPort)
	o := p.objs
	run(t, o.CountEgress, eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, 5000, payload(10), 0))), 0, 0)
	run(t, o.CountIngress, eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(5000, testPort, payload(20), 0))), 0, 0)
	run(t, o.CountIngress, eth(0x0800, false, ipv4(peer4, local4, 17, 0, 0, udp(5000, testPort, payload(20), 0))), 0, 0)
	run(t, o.CountEgress, eth(0x86dd, false, ipv6(local6, peer6, 17, udp(testPort, 6000, payload(30), 0))), 0, 0)
	run(t, o.CountEgress, eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, 4000, payload(1), 0))), 0, 0)
	got, err := p.Peers()
	if err != nil {
		t.Fatal(err)
	}
	want := []PeerStats{
		{Peer: netip.AddrPortFrom(peer4, 4000), Tx: Counters{1, 1}},
		{Peer: netip.AddrPortFrom(peer4, 5000), Tx: Counters{10, 1}, Rx: Counters{40, 2}},
		{Peer: netip.AddrPortFrom(peer6, 6000), Tx: Counters{30, 1}},
	}
	if len(got) != len(want) {
		t.Fatalf("Peers = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Peers[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	skbs, gso, err := p.skbCounts()
	if err != nil {
		t.Fatal(err)
	}
	if skbs != [2]uint64{3, 2} || gso != [2]uint64{} {
		t.Errorf("skb counts tx/rx %v, gso %v; want [3 2], [0 0]", skbs, gso)
	}
}

// FuzzClassifiers runs the classifiers on arbitrary packets and compares
// what they count with the Go reference model; the verdict must always be
// TCX_NEXT.
func FuzzClassifiers(f *testing.F) {
	pl := payload(300)
	f.Add(eth(0x0800, false, ipv4(local4, peer4, 17, 0, 0, udp(testPort, 1, pl, 0))), uint8(0), uint16(0), uint16(0))
	f.Add(eth(0x0800, true, ipv4(peer4, local4, 17, 8, 0, udp(2, testPort, pl, 0))), uint8(1), uint16(0), uint16(0))
	f.Add(eth(0x86dd, false, ipv6(local6, peer6, 17, udp(testPort, 3, pl, 0))), uint8(0), uint16(3), uint16(100))
	f.Add(ipv6(peer6, local6, 17, udp(4, testPort, pl, 0)), uint8(3), uint16(0), uint16(0))
	f.Add(ipv4(local4, peer4, 17, 4, 0, udp(testPort, 5, pl, 0)), uint8(2), uint16(0), uint16(70))
	f.Fuzz(func(t *testing.T, pkt []byte, which uint8, gsoSegs, gsoSize uint16) {
		// BPF_PROG_TEST_RUN takes at least an Ethernet header's worth
		// and at most about a page.
		if len(pkt) < 14 || len(pkt) > 3000 {
			t.Skip()
		}
		p := fuzzProbe(t)
		clearMap(t, p)
		egress, l2 := which&1 == 0, which&2 == 0
		progs := map[[2]bool]*ebpf.Program{
			{true, true}: p.objs.CountEgress, {false, true}: p.objs.CountIngress,
			{true, false}: p.objs.CountEgressL3, {false, false}: p.objs.CountIngressL3,
		}
		ret, err := progs[[2]bool{egress, l2}].Run(&ebpf.RunOptions{
			Data: pkt, Context: skbContext{GSOSegs: uint32(gsoSegs), GSOSize: uint32(gsoSize)}})
		if errors.Is(err, unix.EINVAL) {
			t.Skip("BPF_PROG_TEST_RUN refuses this frame (an IP EtherType with a short IP header)")
		}
		if err != nil {
			t.Fatal(err)
		}
		if ret != tcxNext {
			t.Fatalf("verdict %#x, want TCX_NEXT", ret)
		}
		got := entries(t, p)
		want, ok := reference(pkt, l2, egress, testPort, uint32(gsoSegs), uint32(gsoSize))
		if !ok {
			if len(got) != 0 {
				t.Fatalf("counted %v, the model counts nothing", got)
			}
			return
		}
		if v, found := got[want.key]; !found || len(got) != 1 || v.Bytes != want.bytes || v.Packets != want.packets {
			t.Fatalf("counted %v, the model counts %+v", got, want)
		}
	})
}

var fuzzLoaded *Probe

// fuzzProbe loads the classifiers once per process for the fuzz target.
func fuzzProbe(t *testing.T) *Probe {
	requireRoot(t)
	if fuzzLoaded == nil {
		p, err := load(testPort)
		if errors.Is(err, os.ErrPermission) {
			t.Skipf("loading eBPF not permitted here: %v", err)
		}
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		fuzzLoaded = p
	}
	return fuzzLoaded
}
