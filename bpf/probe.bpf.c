// SPDX-License-Identifier: GPL-2.0
/* probe.bpf.c: a socket filter that counts the UDP datagrams a socket receives.
 *
 * Attached with setsockopt(SO_ATTACH_BPF), it runs for every packet queued to
 * that one socket, before the packet is queued. It never drops: a socket
 * filter's return value is the number of bytes to keep (0 drops), and it
 * returns the full length.
 *
 * It exists to prove the BPF build and load path end to end (clang, vmlinux.h,
 * skeleton, loader, a real attach), and as a probe that a socket sees traffic.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "common.h"
#include "shared_types.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the loader before load: count only datagrams from this UDP source
 * port (host byte order); 0 counts every datagram. Being in .rodata, the
 * verifier sees it as a constant and prunes the branch it disables.
 */
const volatile __u16 source_port = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct probe_counters);
} counters SEC(".maps");

SEC("socket")
int count_udp(struct __sk_buff *skb)
{
	struct probe_counters *c;
	struct udphdr udp;
	__u32 key = 0;
	__u16 len;

	c = bpf_map_lookup_elem(&counters, &key);
	if (!c)
		return skb->len;

	if (load_udp_header(skb, &udp) ||
	    (source_port && bpf_ntohs(udp.source) != source_port)) {
		__sync_fetch_and_add(&c->ignored, 1);
		return skb->len;
	}

	/* The filter runs on every CPU that receives for this socket at once,
	 * hence atomic adds on the shared (not per-CPU) value.
	 */
	len = bpf_ntohs(udp.len);
	__sync_fetch_and_add(&c->packets, 1);
	if (len > sizeof(udp))
		__sync_fetch_and_add(&c->payload_bytes, len - sizeof(udp));
	return skb->len;
}
