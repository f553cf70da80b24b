// SPDX-License-Identifier: GPL-2.0
/* steal.bpf.c: an sk_lookup program that steers new TCP connections of the
 * steered ports of a network namespace to the agent's listeners.
 *
 * sk_lookup runs when the kernel looks for a listening (or unconnected)
 * socket for a packet that opens a connection: for TCP, a SYN that matched no
 * established socket. Established connections never reach it, so connections
 * open before a port is steered keep going to the application.
 *
 * Attached to the target's netns through a bpf_link that only the agent's fd
 * holds (never pinned): when the agent dies the kernel drops the link and the
 * program with it, and lookups go back to the normal path.
 *
 * A broken agent must never break the target: every failure returns SK_PASS
 * (fall back to the normal socket lookup), never SK_DROP.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "common.h"
#include "shared_types.h"

char LICENSE[] SEC("license") = "GPL";

/* The agent's listeners, created in the target's netns: key
 * STEAL_LISTENER_V4 holds the AF_INET one, STEAL_LISTENER_V6 the IPV6_V6ONLY
 * AF_INET6 one (absent when the target has no IPv6). A lookup in a sockmap
 * from BPF returns a referenced socket, released below on every path.
 */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, STEAL_LISTENER_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} listeners SEC(".maps");

/* Steered local ports (host byte order) -> 1. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, STEAL_MAX_PORTS);
	__type(key, __u16);
	__type(value, __u8);
} steal_ports SEC(".maps");

/* The agent's own passthrough connections (to the application, on a steered
 * port), by the source port and family of the connecting socket -> 1. They
 * must reach the application, not the agent again. The source address is not
 * known before the connect(), so a client elsewhere that happens to use the
 * same source port while an entry exists (one connect() long) passes through
 * too: a missed steal, never a broken connection.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, STEAL_MAX_PASSTHROUGH);
	__type(key, struct steal_passthrough_key);
	__type(value, __u8);
} passthrough SEC(".maps");

/* Source prefixes no steal takes (--probe-source): the kubelet's health
 * probes, which must reach the application however the port is stolen.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, STEAL_MAX_EXEMPT_SOURCES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct steal_source_key);
	__type(value, __u8);
} exempt_sources SEC(".maps");

static __always_inline bool is_exempt_source(const struct bpf_sk_lookup *ctx)
{
	struct steal_source_key key = { .prefixlen = 128 };
	__u32 word;

	if (ctx->family == AF_INET) {
		word = ctx->remote_ip4;
		key.addr[10] = 0xff;
		key.addr[11] = 0xff;
		__builtin_memcpy(&key.addr[12], &word, 4);
	} else {
		word = ctx->remote_ip6[0];
		__builtin_memcpy(&key.addr[0], &word, 4);
		word = ctx->remote_ip6[1];
		__builtin_memcpy(&key.addr[4], &word, 4);
		word = ctx->remote_ip6[2];
		__builtin_memcpy(&key.addr[8], &word, 4);
		word = ctx->remote_ip6[3];
		__builtin_memcpy(&key.addr[12], &word, 4);
	}
	return bpf_map_lookup_elem(&exempt_sources, &key) != NULL;
}

static __always_inline bool is_passthrough(const struct bpf_sk_lookup *ctx)
{
	struct steal_passthrough_key key = {
		/* remote_port is a __be16 (network byte order) followed by
		 * 16 bits of padding, whereas local_port is a __u32 in host
		 * byte order: only remote_port needs a swap.
		 */
		.port = bpf_ntohs(ctx->remote_port),
		.family = (__u16)ctx->family,
	};

	return bpf_map_lookup_elem(&passthrough, &key) != NULL;
}

SEC("sk_lookup")
int steal_lookup(struct bpf_sk_lookup *ctx)
{
	struct bpf_sock *sk;
	__u16 port;
	__u32 key;

	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	if (ctx->family == AF_INET)
		key = STEAL_LISTENER_V4;
	else if (ctx->family == AF_INET6)
		key = STEAL_LISTENER_V6;
	else
		return SK_PASS;

	port = (__u16)ctx->local_port;
	if (!bpf_map_lookup_elem(&steal_ports, &port))
		return SK_PASS;
	if (is_passthrough(ctx))
		return SK_PASS;
	if (is_exempt_source(ctx))
		return SK_PASS;

	sk = bpf_map_lookup_elem(&listeners, &key);
	if (!sk)
		return SK_PASS;

	/* Fails with -EEXIST when another sk_lookup program on this netns
	 * already chose a socket (we do not override it), -ESOCKTNOSUPPORT
	 * when the listener is not listening any more. Either way the
	 * connection goes on to the normal lookup.
	 */
	bpf_sk_assign(ctx, sk, 0);
	bpf_sk_release(sk);
	return SK_PASS;
}
