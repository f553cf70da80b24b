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
 * 64 KiB GRO/TSO super-packet whole. A ring buffer record can, at the cost of
 * one extra copy: bpf_ringbuf_reserve() only takes constant sizes, so the
 * packet is first copied into a per-CPU scratch slot (bpf_skb_load_bytes
 * reads paged data too) and then handed to bpf_ringbuf_output() with its
 * real length, so a small packet takes a small record.
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

struct mirror_event {
	struct mirror_event_header hdr;
	__u8 data[MIRROR_MAX_CAPTURE];
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

/* Scratch slots, one per CPU (the loader sets max_entries to the number of
 * possible CPUs). Not a PERCPU_ARRAY: per-CPU values are limited to 32 KiB.
 * TC programs run with bottom halves disabled, so nothing else on this CPU
 * uses the slot between the copy in and the copy out.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mirror_event);
} mirror_scratch SEC(".maps");

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

static __always_inline void mirror(struct __sk_buff *skb, __u8 direction)
{
	struct mirror_counters *stats;
	struct mirror_event *ev;
	__u32 zero = 0, cpu, l3, len;
	__u64 cap;

	l3 = network_offset(skb);
	if (!is_mirrored(skb, l3))
		return;

	stats = bpf_map_lookup_elem(&mirror_stats, &zero);
	if (!stats)
		return;
	stats->seen++;

	cpu = bpf_get_smp_processor_id();
	ev = bpf_map_lookup_elem(&mirror_scratch, &cpu);
	if (!ev || skb->len <= l3)
		goto failed;

	len = skb->len - l3;
	ev->hdr.timestamp_ns = bpf_ktime_get_ns();
	ev->hdr.ifindex = skb->ifindex;
	ev->hdr.orig_len = len;
	ev->hdr.direction = direction;
	cap = len < MIRROR_MAX_CAPTURE ? len : MIRROR_MAX_CAPTURE;
	/* The verifier needs 1 <= cap <= MIRROR_MAX_CAPTURE on the very
	 * register passed to the helpers; the empty asm keeps clang from
	 * checking a 32-bit copy instead (it then rejects the sign-extended
	 * one: "R4 min value is negative").
	 */
	asm volatile("" : "+r"(cap));
	if (cap < 1 || cap > MIRROR_MAX_CAPTURE)
		goto failed;
	ev->hdr.cap_len = (__u32)cap;
	if (bpf_skb_load_bytes(skb, l3, ev->data, cap))
		goto failed;
	if (bpf_ringbuf_output(&mirror_events, ev, sizeof(ev->hdr) + cap, 0))
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
