//go:build linux

package telemetry

import (
	"encoding/binary"
	"net/netip"
)

// Packet builders for the BPF_PROG_TEST_RUN tests: headers are written
// byte by byte from the RFCs, checksums left zero (the classifier does not
// read them).

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }

// udp returns a UDP header and payload; length 0 means the real length.
func udp(sport, dport uint16, payload []byte, length int) []byte {
	if length == 0 {
		length = 8 + len(payload)
	}
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(length))
	return append(b, payload...)
}

// ipv4 returns an IPv4 header (with optLen bytes of NOP options, a multiple
// of 4) and the given transport bytes.
func ipv4(src, dst netip.Addr, proto byte, optLen int, fragOff uint16, l4 []byte) []byte {
	hl := 20 + optLen
	b := make([]byte, hl, hl+len(l4))
	b[0] = 0x40 | byte(hl/4)
	binary.BigEndian.PutUint16(b[2:], uint16(hl+len(l4)))
	binary.BigEndian.PutUint16(b[6:], fragOff)
	b[8] = 64
	b[9] = proto
	s, d := src.As4(), dst.As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	for i := 20; i < hl; i++ {
		b[i] = 1 // NOP
	}
	return append(b, l4...)
}

// ipv6 returns an IPv6 header and the given transport bytes.
func ipv6(src, dst netip.Addr, next byte, l4 []byte) []byte {
	b := make([]byte, 40, 40+len(l4))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(l4)))
	b[6] = next
	b[7] = 64
	s, d := src.As16(), dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, l4...)
}

// eth prepends an Ethernet header (and one 802.1Q tag when vlan is set).
func eth(proto uint16, vlan bool, l3 []byte) []byte {
	b := []byte{2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2}
	if vlan {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, 42)
	}
	b = binary.BigEndian.AppendUint16(b, proto)
	return append(b, l3...)
}

// tcp returns a minimal TCP header (no options) and payload.
func tcp(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	b[12] = 5 << 4
	return append(b, payload...)
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// counted is what one classifier run should add to the map.
type counted struct {
	key            peersPeerKey
	bytes, packets uint64
}

// reference is a model of the classifier in Go, written from its
// specification (see bpf/peers.c): the fuzz target compares the two.
func reference(pkt []byte, l2, egress bool, port uint16, gsoSegs, gsoSize uint32) (counted, bool) {
	var c counted
	off := 0
	var proto uint16
	if l2 {
		if len(pkt) < 14 {
			return c, false
		}
		proto, off = be16(pkt[12:]), 14
		if proto == 0x8100 || proto == 0x88a8 {
			if len(pkt) < off+4 {
				return c, false
			}
			proto, off = be16(pkt[off+2:]), off+4
		}
	} else {
		if len(pkt) < 1 {
			return c, false
		}
		switch pkt[0] >> 4 {
		case 4:
			proto = 0x0800
		case 6:
			proto = 0x86dd
		default:
			return c, false
		}
	}
	switch proto {
	case 0x0800:
		if len(pkt) < off+20 {
			return c, false
		}
		ip := pkt[off:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[0]>>4 != 4 || ip[9] != 17 || ihl < 20 || be16(ip[6:])&0x1fff != 0 {
			return c, false
		}
		c.key.Addr[10], c.key.Addr[11] = 0xff, 0xff
		if egress {
			copy(c.key.Addr[12:], ip[16:20])
		} else {
			copy(c.key.Addr[12:], ip[12:16])
		}
		off += ihl
	case 0x86dd:
		if len(pkt) < off+40 {
			return c, false
		}
		ip := pkt[off:]
		if ip[0]>>4 != 6 || ip[6] != 17 {
			return c, false
		}
		if egress {
			copy(c.key.Addr[:], ip[24:40])
		} else {
			copy(c.key.Addr[:], ip[8:24])
		}
		off += 40
	default:
		return c, false
	}
	if len(pkt) < off+8 {
		return c, false
	}
	sport, dport, ulen := be16(pkt[off:]), be16(pkt[off+2:]), int(be16(pkt[off+4:]))
	if egress {
		if sport != port {
			return c, false
		}
		c.key.Port, c.key.Dir = dport, uint8(Tx)
	} else {
		if dport != port {
			return c, false
		}
		c.key.Port, c.key.Dir = sport, uint8(Rx)
	}
	if gsoSize != 0 {
		c.bytes = uint64(len(pkt) - off - 8)
		c.packets = uint64(gsoSegs)
		if c.packets == 0 {
			c.packets = (c.bytes + uint64(gsoSize) - 1) / uint64(gsoSize)
		}
		if c.packets == 0 {
			c.packets = 1
		}
		return c, true
	}
	if ulen < 8 || off+ulen > len(pkt) {
		return c, false
	}
	c.bytes, c.packets = uint64(ulen-8), 1
	return c, true
}
