// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// Per-peer byte and packet counters for one UDP port (the agent's QUIC
// port), read by node/links/telemetry. Four tc classifiers share one map: ingress
// and egress, each for interfaces whose packets start with an Ethernet
// header (ether, loopback, veth, bridges) and for interfaces without a
// link-layer header (tun, wireguard, ipip). They only read the packet and
// always return TCX_NEXT (== TC_ACT_UNSPEC): nothing is dropped, changed or
// redirected, and programs attached after them still run.
//
// What is counted: UDP over IPv4 (options allowed) or IPv6 whose next
// header is UDP (extension headers are not walked: such packets are not
// counted), behind at most one 802.1Q/802.1ad tag. Egress packets whose
// source port is quic_port count as tx to (destination address, destination
// port); ingress packets whose destination port is quic_port count as rx
// from (source address, source port). Bytes are UDP payload bytes (UDP
// length - 8), the unit of quic-go's ConnectionStats. Not counted: IP
// fragments (quic-go sets DF and never sends them), malformed or truncated
// packets (a UDP length the packet cannot hold), anything not UDP.
//
// GSO/GRO: a UDP GSO skb at tc egress (quic-go sends with UDP_SEGMENT) and
// a GRO-merged one at tc ingress carry one set of headers for gso_segs
// datagrams. Their payload is skb->len minus the headers (exact: each
// datagram gets its own copy of the headers when segmented, the payload
// bytes are split without loss), and their datagram count is gso_segs, or,
// where a path left gso_segs unset, ceil(payload / gso_size), which is exact
// for UDP because every segment but the last carries exactly gso_size bytes.

#include "shim.h"

char __license[] SEC("license") = "Dual MIT/GPL";

// The port to count, set by the loader before the program is loaded (the
// verifier then sees a constant).
const volatile __u16 quic_port = 7947;

enum direction {
	DIR_TX = 0,
	DIR_RX = 1,
};

struct peer_key {
	__u8 addr[16]; // IPv6, or IPv4 mapped as ::ffff:a.b.c.d
	__u16 port;    // the peer's UDP port, host byte order
	__u8 dir;      // enum direction
	__u8 pad;
};

struct peer_val {
	__u64 bytes;   // UDP payload bytes
	__u64 packets; // UDP datagrams
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct peer_key);
	__type(value, struct peer_val);
} peers SEC(".maps");

// Diagnostics, per direction: skbs counted, and how many of them were
// GSO/GRO skbs. Index = dir * 2 + (0: skbs, 1: gso skbs).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} skb_stats SEC(".maps");

static __always_inline void bump_stat(__u32 idx)
{
	__u64 *n = bpf_map_lookup_elem(&skb_stats, &idx);
	if (n)
		*n += 1;
}

static __always_inline void add(struct peer_key *key, __u64 bytes, __u64 packets)
{
	struct peer_val *v = bpf_map_lookup_elem(&peers, key);
	if (!v) {
		struct peer_val init = {.bytes = bytes, .packets = packets};
		if (bpf_map_update_elem(&peers, key, &init, BPF_NOEXIST) == 0)
			return;
		// Another CPU created the entry in the meantime.
		v = bpf_map_lookup_elem(&peers, key);
		if (!v)
			return;
	}
	// The map is per CPU: no other CPU writes this value.
	v->bytes += bytes;
	v->packets += packets;
}

static __always_inline int account(struct __sk_buff *skb, const int has_l2, const int dir)
{
	struct peer_key key;
	__u32 off = 0;
	__be16 proto;

	__builtin_memset(&key, 0, sizeof(key));

	if (has_l2) {
		struct ethhdr eth;
		if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
			return TCX_NEXT;
		proto = eth.h_proto;
		off = ETH_HLEN;
		if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
			struct vlan_hdr vh;
			if (bpf_skb_load_bytes(skb, off, &vh, sizeof(vh)) < 0)
				return TCX_NEXT;
			proto = vh.h_vlan_encapsulated_proto;
			off += sizeof(vh);
		}
	} else {
		__u8 first;
		if (bpf_skb_load_bytes(skb, 0, &first, 1) < 0)
			return TCX_NEXT;
		if ((first >> 4) == 4)
			proto = bpf_htons(ETH_P_IP);
		else if ((first >> 4) == 6)
			proto = bpf_htons(ETH_P_IPV6);
		else
			return TCX_NEXT;
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		__u32 ihl;
		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
			return TCX_NEXT;
		if ((ip.ver_ihl >> 4) != 4 || ip.protocol != IPPROTO_UDP)
			return TCX_NEXT;
		ihl = (__u32)(ip.ver_ihl & 0x0f) * 4;
		if (ihl < sizeof(ip))
			return TCX_NEXT;
		// A later fragment has no UDP header.
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return TCX_NEXT;
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__be32 a = dir == DIR_TX ? ip.daddr : ip.saddr;
		__builtin_memcpy(&key.addr[12], &a, 4);
		off += ihl;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return TCX_NEXT;
		if ((ip6.ver_prio >> 4) != 6 || ip6.nexthdr != IPPROTO_UDP)
			return TCX_NEXT;
		if (dir == DIR_TX)
			__builtin_memcpy(key.addr, ip6.daddr, 16);
		else
			__builtin_memcpy(key.addr, ip6.saddr, 16);
		off += sizeof(ip6);
	} else {
		return TCX_NEXT;
	}

	struct udphdr uh;
	if (bpf_skb_load_bytes(skb, off, &uh, sizeof(uh)) < 0)
		return TCX_NEXT;
	if (dir == DIR_TX) {
		if (bpf_ntohs(uh.source) != quic_port)
			return TCX_NEXT;
		key.port = bpf_ntohs(uh.dest);
	} else {
		if (bpf_ntohs(uh.dest) != quic_port)
			return TCX_NEXT;
		key.port = bpf_ntohs(uh.source);
	}
	key.dir = dir;

	__u64 len = skb->len;
	__u64 l4 = (__u64)off + sizeof(uh); // where the UDP payload starts
	__u64 gso_size = skb->gso_size;
	__u64 bytes, packets;
	if (gso_size) {
		// One skb, several datagrams: the UDP length field holds the
		// total and may have wrapped above 64 KiB (BIG TCP-sized GRO), so
		// take the payload from the skb's length.
		if (len < l4)
			return TCX_NEXT;
		bytes = len - l4;
		packets = skb->gso_segs;
		if (!packets)
			packets = (bytes + gso_size - 1) / gso_size;
		if (!packets)
			packets = 1;
	} else {
		// One datagram. The UDP length field excludes link-layer padding
		// (short Ethernet frames); a length the packet cannot hold is
		// malformed, and the stack will drop it too.
		__u64 ulen = bpf_ntohs(uh.len);
		if (ulen < sizeof(uh) || off + ulen > len)
			return TCX_NEXT;
		bytes = ulen - sizeof(uh);
		packets = 1;
	}

	add(&key, bytes, packets);
	bump_stat(dir * 2);
	if (gso_size)
		bump_stat(dir * 2 + 1);
	return TCX_NEXT;
}

SEC("tcx/ingress")
int count_ingress(struct __sk_buff *skb)
{
	return account(skb, 1, DIR_RX);
}

SEC("tcx/egress")
int count_egress(struct __sk_buff *skb)
{
	return account(skb, 1, DIR_TX);
}

SEC("tcx/ingress")
int count_ingress_l3(struct __sk_buff *skb)
{
	return account(skb, 0, DIR_RX);
}

SEC("tcx/egress")
int count_egress_l3(struct __sk_buff *skb)
{
	return account(skb, 0, DIR_TX);
}
