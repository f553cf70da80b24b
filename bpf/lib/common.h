/* Small helpers shared by the BPF programs. Include after vmlinux.h and
 * <bpf/bpf_helpers.h>.
 */
#ifndef SIPHON_BPF_COMMON_H
#define SIPHON_BPF_COMMON_H

#include <bpf/bpf_endian.h>

/* Macros are not in BTF, so vmlinux.h does not have them. */
#ifndef ETH_P_IP
#define ETH_P_IP 0x0800
#endif
#ifndef ETH_P_IPV6
#define ETH_P_IPV6 0x86DD
#endif
#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* Copies the UDP header of the packet into *udp. Returns 0, or -1 when the
 * packet is not UDP over IPv4/IPv6.
 *
 * Offsets are taken from the network header (BPF_HDR_START_NET), not from
 * skb->data: where skb->data points depends on the hook (a UDP socket filter
 * runs with it at the UDP header, a tc program at the MAC header). IPv6
 * extension headers are not walked; a datagram behind one is not UDP here.
 */
static __always_inline int load_udp_header(struct __sk_buff *skb,
					   struct udphdr *udp)
{
	__u32 off;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes_relative(skb, 0, &ip, sizeof(ip),
						BPF_HDR_START_NET))
			return -1;
		if (ip.version != 4 || ip.protocol != IPPROTO_UDP)
			return -1;
		/* A fragment other than the first carries no UDP header. */
		if (ip.frag_off & bpf_htons(0x1fff))
			return -1;
		off = ip.ihl * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes_relative(skb, 0, &ip6, sizeof(ip6),
						BPF_HDR_START_NET))
			return -1;
		if (ip6.nexthdr != IPPROTO_UDP)
			return -1;
		off = sizeof(ip6);
	} else {
		return -1;
	}

	if (bpf_skb_load_bytes_relative(skb, off, udp, sizeof(*udp),
					BPF_HDR_START_NET))
		return -1;
	return 0;
}

#endif /* SIPHON_BPF_COMMON_H */
