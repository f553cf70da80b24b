// SPDX-License-Identifier: GPL-2.0
/* mirror.bpf.c: a TC classifier (ingress and egress) that copies the TCP
 * packets of the mirrored ports to user space, for the mirror feature.
 *
 * It never changes a packet's fate: every path returns TC_ACT_UNSPEC (TCX:
 * "next", i.e. carry on as if we were not there). A broken or slow agent can
 * lose copies, never the application's traffic.
 *
 * Attached through TCX links (kernel >= 6.6) held only by the agent's fds,
 * never pinned: when the agent dies, however it dies, the kernel closes the
 * fds, the links go, and the program with them.
 *
 * Why a ring buffer and not bpf_perf_event_output(skb, ...): the perf
 * output would copy the skb without a scratch buffer, but a perf record's
 * size is a __u16 (perf_event_header.size), so a sample cannot carry a
 * 64 KiB GRO/TSO super-packet whole. A ring buffer record can.
 * bpf_ringbuf_reserve() only takes constant sizes, so the record is
 * reserved in the smallest of a few size classes that holds the packet
 * (powers of two and the halves between, so at most a third of a record is
 * slack) and the packet is copied once, straight into it
 * (bpf_skb_load_bytes reads paged data too). The header's cap_len says how
 * much of the record is packet.
 *
 * Loss is counted, never silent: a full ring buffer counts in `failed`.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "common.h"

char LICENSE[] SEC("license") = "GPL";

#ifndef TC_ACT_UNSPEC
#define TC_ACT_UNSPEC (-1)
#endif

/* Bytes copied from the IP header on: a whole IPv4 packet (tot_len is a
 * __u16) and an IPv6 one without a jumbo payload. BIG TCP packets (> 64 KiB)
 * are cut here; orig_len says how long they were.
 */
#define MIRROR_MAX_CAPTURE 65536
#define MIRROR_MAX_PORTS 4096

enum mirror_direction {
	MIRROR_INGRESS = 0,
	MIRROR_EGRESS = 1,
};

/* One ring buffer record: this header, then cap_len bytes from the IP
 * header on. Mirrored by MirrorPacketHeader in loader/mirror_loader.h (sizes
 * and offsets checked there).
 */
struct mirror_event_header {
	__u64 timestamp_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
	__u32 ifindex;
	__u32 orig_len;	    /* bytes from the IP header to the end of the skb */
	__u32 cap_len;	    /* of them, the bytes that follow this header */
	__u8 direction;	    /* enum mirror_direction */
	__u8 pad[3];
};

/* Per-CPU counters, summed by user space. */
struct mirror_counters {
	__u64 seen;   /* TCP packets of a mirrored port */
	__u64 copied; /* of them, handed to user space */
	__u64 failed; /* of them, lost: ring buffer full or unreadable skb */
};

/* Mirrored ports (host byte order) -> 1; a packet matches by source or
 * destination port. Updated by user space at run time.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MIRROR_MAX_PORTS);
	__type(key, __u16);
	__type(value, __u8);
} mirror_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mirror_counters);
} mirror_stats SEC(".maps");

/* Size set by the loader before load (a power of two, pages). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} mirror_events SEC(".maps");

/* Since 6.3: the kernel's sk_buff behind the context, to read its header
 * offsets, which __sk_buff does not expose.
 */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* Offset of the network header from skb->data. At TC, skb->data is at the
 * MAC header on both sides (ingress pushes the MAC header back before the
 * classifiers run, egress resets it at __dev_queue_xmit), so this is the
 * device's link-layer header length: 14 on Ethernet, veth and loopback, 0 on
 * devices without one (tun, wireguard, ipip).
 */
static __always_inline __u32 network_offset(struct __sk_buff *skb)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);

	return (__u32)(__u16)(kskb->network_header - kskb->mac_header);
}

/* True when the packet is TCP over IPv4/IPv6 (no IPv6 extension headers, no
 * non-first IPv4 fragment) and one of its ports is mirrored.
 */
static __always_inline bool is_mirrored(struct __sk_buff *skb, __u32 l3)
{
	struct tcphdr tcp;
	__u32 l4;
	__u16 port;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, l3, &ip, sizeof(ip)))
			return false;
		if (ip.version != 4 || ip.protocol != IPPROTO_TCP)
			return false;
		if (ip.frag_off & bpf_htons(0x1fff))
			return false;
		l4 = l3 + ip.ihl * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, l3, &ip6, sizeof(ip6)))
			return false;
		if (ip6.nexthdr != IPPROTO_TCP)
			return false;
		l4 = l3 + sizeof(ip6);
	} else {
		return false;
	}

	/* Source and destination ports: the first 4 bytes. */
	if (bpf_skb_load_bytes(skb, l4, &tcp, 4))
		return false;
	port = bpf_ntohs(tcp.source);
	if (bpf_map_lookup_elem(&mirror_ports, &port))
		return true;
	port = bpf_ntohs(tcp.dest);
	return bpf_map_lookup_elem(&mirror_ports, &port) != NULL;
}

/* Reserves a record of `class` packet bytes, copies the packet's first
 * `cap` bytes (1 <= cap <= class) from the IP header on into it and submits
 * it. 0, or -1 when the ring is full or the skb unreadable.
 */
static __always_inline int copy_out(struct __sk_buff *skb, __u32 l3, __u32 len, __u64 cap,
				    __u8 direction, const __u32 class)
{
	struct mirror_event_header *hdr;

	/* The verifier needs 1 <= cap <= class on the very register passed
	 * to the helper; the empty asm keeps clang from checking a 32-bit
	 * copy instead (it then rejects the sign-extended one: "R4 min value
	 * is negative").
	 */
	asm volatile("" : "+r"(cap));
	if (cap < 1 || cap > class)
		return -1;
	hdr = bpf_ringbuf_reserve(&mirror_events, sizeof(*hdr) + class, 0);
	if (!hdr)
		return -1;
	hdr->timestamp_ns = bpf_ktime_get_ns();
	hdr->ifindex = skb->ifindex;
	hdr->orig_len = len;
	hdr->cap_len = (__u32)cap;
	hdr->direction = direction;
	hdr->pad[0] = hdr->pad[1] = hdr->pad[2] = 0;
	if (bpf_skb_load_bytes(skb, l3, (void *)(hdr + 1), cap)) {
		bpf_ringbuf_discard(hdr, 0);
		return -1;
	}
	bpf_ringbuf_submit(hdr, 0);
	return 0;
}

/* The size classes: the first that holds the packet is taken. */
#define MIRROR_CLASS(c) \
	if (cap <= (c)) \
		return copy_out(skb, l3, len, cap, direction, (c))

static __always_inline int copy_packet(struct __sk_buff *skb, __u32 l3, __u32 len, __u64 cap,
				       __u8 direction)
{
	MIRROR_CLASS(128);
	MIRROR_CLASS(256);
	MIRROR_CLASS(512);
	MIRROR_CLASS(1024);
	MIRROR_CLASS(1536);
	MIRROR_CLASS(2048);
	MIRROR_CLASS(3072);
	MIRROR_CLASS(4096);
	MIRROR_CLASS(6144);
	MIRROR_CLASS(8192);
	MIRROR_CLASS(12288);
	MIRROR_CLASS(16384);
	MIRROR_CLASS(24576);
	MIRROR_CLASS(32768);
	MIRROR_CLASS(49152);
	return copy_out(skb, l3, len, cap, direction, MIRROR_MAX_CAPTURE);
}

static __always_inline void mirror(struct __sk_buff *skb, __u8 direction)
{
	struct mirror_counters *stats;
	__u32 zero = 0, l3, len;
	__u64 cap;

	l3 = network_offset(skb);
	if (!is_mirrored(skb, l3))
		return;

	stats = bpf_map_lookup_elem(&mirror_stats, &zero);
	if (!stats)
		return;
	stats->seen++;

	if (skb->len <= l3)
		goto failed;
	len = skb->len - l3;
	cap = len < MIRROR_MAX_CAPTURE ? len : MIRROR_MAX_CAPTURE;
	if (copy_packet(skb, l3, len, cap, direction))
		goto failed;
	stats->copied++;
	return;
failed:
	stats->failed++;
}

SEC("tc")
int mirror_ingress(struct __sk_buff *skb)
{
	mirror(skb, MIRROR_INGRESS);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int mirror_egress(struct __sk_buff *skb)
{
	mirror(skb, MIRROR_EGRESS);
	return TC_ACT_UNSPEC;
}
