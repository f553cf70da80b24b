/* Structs shared by the BPF programs and their C++ loaders.
 *
 * Fixed-width kernel types only, laid out without implicit padding: both
 * compilers must agree on every offset. The C++ side checks the sizes with
 * static_assert.
 */
#ifndef SIPHON_BPF_SHARED_TYPES_H
#define SIPHON_BPF_SHARED_TYPES_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

/* probe.bpf.c: value of the single entry of the `counters` array map. */
struct probe_counters {
	__u64 packets;	     /* UDP datagrams that matched source_port */
	__u64 payload_bytes; /* their UDP payload, headers excluded */
	__u64 ignored;	     /* datagrams seen but not matched */
};

/* steal.bpf.c: keys of the `listeners` sockmap. */
enum {
	STEAL_LISTENER_V4 = 0, /* AF_INET listener */
	STEAL_LISTENER_V6 = 1, /* AF_INET6 (IPV6_V6ONLY) listener */
	STEAL_LISTENER_COUNT = 2,
};

/* steal.bpf.c: sizes of the `steal_ports` and `passthrough` hash maps. */
enum {
	STEAL_MAX_PORTS = 4096,
	STEAL_MAX_PASSTHROUGH = 16384,
	STEAL_MAX_EXEMPT_SOURCES = 256,
};

/* steal.bpf.c: key of the `passthrough` map, one of the agent's own
 * connections to the application that must not be stolen. The connecting
 * socket is matched by its source port, as sk_lookup sees it on the
 * receiving side (ctx->remote_port).
 */
struct steal_passthrough_key {
	__u16 port;   /* source port of the agent's socket, host byte order */
	__u16 family; /* AF_INET or AF_INET6: the family of the packets */
};

/* A source prefix exempt from every steal (--probe-source: the kubelet's
 * probes must reach the application). An LPM trie key: IPv4 sources as
 * v4-mapped IPv6 (::ffff:a.b.c.d), prefixlen counted on the 128 bits.
 */
struct steal_source_key {
	__u32 prefixlen;
	__u8 addr[16];
};

#endif /* SIPHON_BPF_SHARED_TYPES_H */
