"""Pod networking on this machine: one bridge shared by the nodes (each
node's address on it is the node's InternalIP and the gateway of its pod
CIDR), and per pod a network namespace with a veth whose other end is on
the bridge. Pods get an address of their node's CIDR with an on-link route
for the whole cluster CIDR and no default route, so they reach this
machine and each other and nothing beyond; this machine reaches every pod
through the bridge's connected routes."""

import ctypes
import ipaddress
import os
import socket

from .runtime import run

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


async def ensure_bridge(bridge, node_ip, prefix):
    rc, _, _ = await run("ip", "link", "show", bridge, check=False)
    if rc != 0:
        rc, _, err = await run("ip", "link", "add", bridge, "type", "bridge", check=False)
        if rc != 0 and "File exists" not in err:
            raise RuntimeError("ip link add %s: %s" % (bridge, err.strip()))
    _, out, _ = await run("ip", "-o", "addr", "show", "dev", bridge)
    if " %s/" % node_ip not in out:
        rc, _, err = await run("ip", "addr", "add", "%s/%d" % (node_ip, prefix), "dev", bridge,
                               check=False)
        if rc != 0 and "File exists" not in err:
            raise RuntimeError("ip addr add %s: %s" % (node_ip, err.strip()))
    await run("ip", "link", "set", bridge, "up")


def netns_path(name):
    return "/run/netns/" + name


async def create_pod_network(netns, veth, bridge, ip, cluster_prefix):
    await delete_pod_network(netns, veth)
    await run("ip", "netns", "add", netns)
    await run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
    await run("ip", "link", "set", veth, "master", bridge)
    await run("ip", "link", "set", veth, "up")
    await run("ip", "-n", netns, "addr", "add", "%s/%d" % (ip, cluster_prefix), "dev", "eth0")
    await run("ip", "-n", netns, "link", "set", "eth0", "up")
    await run("ip", "-n", netns, "link", "set", "lo", "up")
    # An address used by an earlier pod may still be in this machine's
    # neighbour table with that pod's MAC: traffic would go nowhere until
    # the entry expires.
    await run("ip", "neigh", "flush", "to", ip, "dev", bridge, check=False)


async def delete_pod_network(netns, veth):
    await run("ip", "link", "del", veth, check=False)
    if os.path.exists(netns_path(netns)):
        await run("ip", "netns", "del", netns, check=False)


def connect_in_netns(path, port, timeout=5.0):
    """A TCP connection to localhost:port inside the network namespace at
    `path` (None: this one), made from a thread that enters the namespace
    and leaves it again: a socket keeps the namespace it was made in."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(path, os.O_RDONLY) if path else None
    try:
        if target is not None and _libc.setns(target, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, "setns: " + os.strerror(e))
        errs = []
        try:
            for fam, addr in ((socket.AF_INET, ("127.0.0.1", port)),
                              (socket.AF_INET6, ("::1", port))):
                s = socket.socket(fam, socket.SOCK_STREAM)
                s.settimeout(timeout)
                try:
                    s.connect(addr)
                    s.settimeout(None)
                    s.setblocking(False)
                    return s
                except OSError as e:
                    s.close()
                    errs.append("%s: dial %s %s:%d: connect: %s" % (
                        "IPv4" if fam == socket.AF_INET else "IPv6",
                        "tcp4" if fam == socket.AF_INET else "tcp6",
                        addr[0] if fam == socket.AF_INET else "[::1]", port,
                        (e.strerror or str(e)).lower()))
            raise ConnectionRefusedError(", ".join(errs))
        finally:
            if target is not None:
                _libc.setns(own, CLONE_NEWNET)
    finally:
        os.close(own)
        if target is not None:
            os.close(target)


class Ipam:
    """Addresses of one node's pod CIDR: .1 is the node, pods from .2."""

    def __init__(self, cidr):
        self.net = ipaddress.ip_network(cidr)
        self.used = set()
        self.hosts = [str(h) for h in list(self.net.hosts())[1:]]
        self.next = 0

    @property
    def gateway(self):
        return str(self.net.network_address + 1)

    def allocate(self):
        """The next free address after the last one given (not the lowest:
        a fresh address makes stale neighbour entries elsewhere harmless)."""
        for i in range(len(self.hosts)):
            s = self.hosts[(self.next + i) % len(self.hosts)]
            if s not in self.used:
                self.used.add(s)
                self.next = (self.next + i + 1) % len(self.hosts)
                return s
        raise RuntimeError("no address left in %s" % self.net)

    def release(self, ip):
        self.used.discard(ip)
