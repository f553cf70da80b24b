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

#endif /* SIPHON_BPF_SHARED_TYPES_H */
