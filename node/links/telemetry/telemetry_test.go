package telemetry

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

func TestFromQUIC(t *testing.T) {
	a := netip.MustParseAddrPort("192.0.2.1:7947")
	aMapped := netip.MustParseAddrPort("[::ffff:192.0.2.1]:7947")
	b := netip.MustParseAddrPort("[2001:db8::2]:7947")
	c := netip.MustParseAddrPort("192.0.2.1:50000") // same host, another port
	rows := []ConnStat{
		{Peer: a, BytesSent: 1000, PacketsSent: 10, BytesReceived: 2000, PacketsReceived: 20, PacketsLost: 1,
			SmoothedRTT: 10 * time.Millisecond, MinRTT: 8 * time.Millisecond},
		{Peer: aMapped, BytesSent: 500, PacketsSent: 5, BytesReceived: 100, PacketsReceived: 5, PacketsLost: 2,
			SmoothedRTT: 40 * time.Millisecond, MinRTT: 5 * time.Millisecond},
		{Peer: b, BytesSent: 7, PacketsSent: 1, SmoothedRTT: 3 * time.Millisecond, MinRTT: 2 * time.Millisecond},
		{Peer: c, BytesReceived: 9, PacketsReceived: 1},
		{Peer: b}, // a fresh connection: no RTT sample yet
	}
	got := FromQUIC(rows)
	want := []PeerStats{
		{Peer: a, Tx: Counters{1500, 15}, Rx: Counters{2100, 25}, PacketsLost: 3,
			// (10ms×30 packets + 40ms×10 packets) / 40 packets
			SmoothedRTT: 17500 * time.Microsecond, MinRTT: 5 * time.Millisecond},
		{Peer: c, Rx: Counters{9, 1}},
		{Peer: b, Tx: Counters{7, 1}, SmoothedRTT: 3 * time.Millisecond, MinRTT: 2 * time.Millisecond},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FromQUIC:\n got %+v\nwant %+v", got, want)
	}
	if len(FromQUIC(nil)) != 0 {
		t.Fatal("FromQUIC(nil) not empty")
	}
}

func TestQUICReader(t *testing.T) {
	calls := 0
	r := NewQUICReader(func() []ConnStat {
		calls++
		return []ConnStat{{Peer: netip.MustParseAddrPort("[::ffff:10.0.0.1]:1"), BytesSent: uint64(calls)}}
	})
	for i := 1; i <= 2; i++ {
		ps, err := r.Peers()
		if err != nil || len(ps) != 1 || ps[0].Tx.Bytes != uint64(i) || ps[0].Peer != netip.MustParseAddrPort("10.0.0.1:1") {
			t.Fatalf("Peers #%d = %+v, %v", i, ps, err)
		}
	}
	if r.Source() != SourceQUIC || r.Close() != nil {
		t.Fatalf("Source %q", r.Source())
	}
}

func TestDirectionString(t *testing.T) {
	if Tx.String() != "tx" || Rx.String() != "rx" || Direction(9).String() != "unknown" {
		t.Fatal(Tx.String(), Rx.String())
	}
}

func TestInterfaceForLoopback(t *testing.T) {
	name, err := InterfaceFor(netip.MustParseAddr("127.0.0.1"))
	if err != nil {
		t.Skipf("no route to 127.0.0.1 here: %v", err)
	}
	if name == "" {
		t.Fatal("empty interface name for 127.0.0.1")
	}
	names, err := Interfaces([]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::ffff:127.0.0.1")})
	if err != nil || len(names) != 1 || names[0] != name {
		t.Fatalf("Interfaces = %v, %v; want [%s]", names, err, name)
	}
	if _, err := InterfaceFor(netip.Addr{}); err == nil {
		t.Fatal("InterfaceFor(invalid) succeeded")
	}
}
