/* Minimal definitions for peers.c, written for this package so that
 * generating needs nothing but clang and llvm-strip: no kernel or libbpf
 * headers. Only the few types, constants and helpers peers.c uses are here;
 * their values are the kernel's stable UAPI (include/uapi/linux/bpf.h and
 * friends). */
#ifndef SHOAL_TELEMETRY_SHIM_H
#define SHOAL_TELEMETRY_SHIM_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;
typedef __u16 __be16;
typedef __u32 __be32;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF-style map definitions, as cilium/ebpf and libbpf read them. */
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

/* Map types and update flags. */
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_PERCPU_HASH 10
#define BPF_NOEXIST 1

/* tc/tcx verdicts. TCX_NEXT (== TC_ACT_UNSPEC) hands the packet on
 * unchanged to whatever runs after this program. */
#define TC_ACT_UNSPEC (-1)
#define TC_ACT_OK 0
#define TCX_NEXT (-1)
#define TCX_PASS 0

/* Protocol numbers. */
#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IPPROTO_UDP 17
#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

/* Byte order: BPF targets built here are little-endian (bpfel). */
#define bpf_htons(x) ((__be16)__builtin_bswap16(x))
#define bpf_ntohs(x) ((__u16)__builtin_bswap16(x))

struct ethhdr {
	__u8 h_dest[6];
	__u8 h_source[6];
	__be16 h_proto;
} __attribute__((packed));

struct vlan_hdr {
	__be16 h_vlan_TCI;
	__be16 h_vlan_encapsulated_proto;
};

struct iphdr {
	__u8 ver_ihl; /* version in the high nibble, IHL (32-bit words) in the low */
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__be32 saddr;
	__be32 daddr;
};

struct ipv6hdr {
	__u8 ver_prio; /* version in the high nibble */
	__u8 flow_lbl[3];
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__u16 check;
};

/* The tc program context, laid out as the kernel's UAPI struct __sk_buff
 * up to gso_size (the verifier rewrites each access; only the offsets
 * matter, and the fields after gso_size are not used). */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
	__u32 napi_id;
	__u32 family;
	__u32 remote_ip4;
	__u32 local_ip4;
	__u32 remote_ip6[4];
	__u32 local_ip6[4];
	__u32 remote_port;
	__u32 local_port;
	__u32 data_meta;
	__u64 flow_keys; /* a pointer in the kernel's header, 8 bytes wide */
	__u64 tstamp;
	__u32 wire_len;
	__u32 gso_segs;
	__u64 sk; /* a pointer in the kernel's header, 8 bytes wide */
	__u32 gso_size;
};

/* Helpers, by their stable numbers in enum bpf_func_id. None is GPL-only. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value, __u64 flags) = (void *)2;
static long (*bpf_skb_load_bytes)(const void *skb, __u32 offset, void *to, __u32 len) = (void *)26;

#endif
