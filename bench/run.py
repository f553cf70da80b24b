#!/usr/bin/env python3
"""Siphon's traffic and footprint benchmarks: every figure next to its
baselines, measured in the same run on the same machine (bench/README.md).

Topology (all namespaces made here, removed on exit, even on failure):

  client ns ──veth── pod ns ──veth── node ns
  (iperf3 -c, wrk,   (the application:  (siphon-agent, siphon CLI,
   h2load,            nginx :80, :81 h2c, the developer's servers:
   idle clients)      iperf3 :5201,       nginx :8080, :8081 h2c, iperf3 :5202;
                      dnsmasq, files)     the peer's second socat)

  direct  client -> pod app                        (the physical limit)
  siphon  client -> pod:P -> agent -> CLI -> node server   (siphon steal)
  peer    client -> pod:P -> iptables REDIRECT -> socat (pod) -> socat (node)
          -> node server   (the same two hops, socat -b 262144)

Slow links (emulated_link(), bench/linkemu): a near and a far namespace, a
TAP device in each, linkemu between them holding each frame for the one-way
delay. The mount group's agent runs in the far one, its mount in the near
one (nsenter --net: this mount namespace, so the readers here see it).

Run by scripts/bench.sh, which builds in Release first.

Over 600 lines: every benchmark and its baselines are driven from here so
that one run measures them all on the same machine state.
"""
import argparse
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import signal
import statistics
import subprocess
import struct
import sys
import threading
import time
from contextlib import ExitStack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from links import Links  # noqa: E402 - the links group, beside this file
from handover import Handover  # noqa: E402 - the handover group, beside this file
from kube import Kube  # noqa: E402 - the kube group, beside this file
from workloads import Workloads  # noqa: E402 - the workloads group, beside this file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def sh(*argv, check=True, capture=True, timeout=300, netns=None, stdin=None):
    argv = [str(a) for a in argv]
    if netns:
        argv = ["ip", "netns", "exec", netns] + argv
    r = subprocess.run(argv, capture_output=capture, text=True, timeout=timeout, input=stdin)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


class Procs:
    """Background processes, killed and reaped on exit."""

    def __init__(self):
        self.procs = []

    def start(self, argv, netns=None, **kw):
        argv = [str(a) for a in argv]
        if netns:
            argv = ["ip", "netns", "exec", netns] + argv
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def stop(self, p, sig=signal.SIGTERM, timeout=5):
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p in self.procs:
            self.procs.remove(p)
        return p.returncode

    def close(self):
        # SIGTERM first: nginx's master stops its workers only when it is
        # asked to (a SIGKILLed master leaves them running).
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 5
        for p in reversed(self.procs):
            try:
                p.wait(max(0.0, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_secs(pid):
    """User + system CPU seconds of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command's ")": field 3 (state) first, so utime (14) and
    # stime (15) are the 12th and 13th.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values):
    values = sorted(values)
    return {"median": statistics.median(values), "min": values[0], "max": values[-1],
            "runs": values}


class Bench:
    def __init__(self, args, stack, procs):
        self.args = args
        self.stack = stack
        self.procs = procs
        self.build = os.path.abspath(args.build)
        self.agent_bin = os.path.join(self.build, "agent", "siphon-agent")
        self.cli_bin = os.path.join(self.build, "layer-protocol", "cli", "siphon")
        self.tag = secrets.token_hex(3)
        self.client, self.pod, self.node = (f"sb{r}-{self.tag}" for r in ("c", "p", "n"))
        octet = 1 + int(self.tag[:2], 16) % 250
        self.pod_ip = f"10.77.{octet}.1"
        self.client_ip = f"10.77.{octet}.2"
        self.pod_node_ip = f"10.78.{octet}.1"
        self.node_ip = f"10.78.{octet}.2"
        self.tmp = sh("mktemp", "-d", "/tmp/siphon-bench.XXXXXX").stdout.strip()
        self.stack.callback(shutil.rmtree, self.tmp, True)
        self.token_file = os.path.join(self.tmp, "token")
        with open(self.token_file, "w") as f:
            f.write(secrets.token_hex(16))
        os.chmod(self.token_file, 0o600)
        self.results = []
        self.links = 0  # emulated links made so far (their names and addresses)
        self.failed = []  # scenarios that failed (the run goes on; main() reports them)
        self.reps = 3 if args.quick else 5
        self.secs = 2 if args.quick else 10

    # ------------------------------------------------------------- topology
    def setup(self):
        for ns in (self.client, self.pod, self.node):
            sh("ip", "netns", "add", ns)
            self.stack.callback(sh, "ip", "netns", "del", ns, check=False)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        cp, pc = f"sb{self.tag}c", f"sb{self.tag}p"
        pn, np_ = f"sb{self.tag}q", f"sb{self.tag}n"
        sh("ip", "link", "add", cp, "netns", self.client, "type", "veth", "peer", "name", pc,
           "netns", self.pod)
        sh("ip", "link", "add", pn, "netns", self.pod, "type", "veth", "peer", "name", np_,
           "netns", self.node)
        for ns, dev, ip in ((self.client, cp, self.client_ip), (self.pod, pc, self.pod_ip),
                            (self.pod, pn, self.pod_node_ip), (self.node, np_, self.node_ip)):
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        # Many short connections from one client address.
        for ns in (self.client, self.pod, self.node):
            sh("sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=10000 65000", netns=ns)
            sh("sysctl", "-q", "-w", "net.ipv4.tcp_tw_reuse=1", netns=ns)

        # The application in the pod and the developer's servers in the node.
        # 81 and 8081: HTTP/2 with prior knowledge (h2c), for the filtered
        # steal group.
        self.pod_nginx = self.nginx(self.pod, 80, "pod", h2_port=81)
        self.node_nginx = self.nginx(self.node, 8080, "node", h2_port=8081)
        self.procs.start(["iperf3", "-s", "-p", "5201"], netns=self.pod,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.start(["iperf3", "-s", "-p", "5202"], netns=self.node,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_port(self.pod, 80)
        self.wait_port(self.pod, 81)
        self.wait_port(self.node, 8081)
        self.wait_port(self.pod, 5201)
        self.wait_port(self.node, 8080)
        self.wait_port(self.node, 5202)

    def nginx(self, ns, port, name, h2_port=None):
        d = os.path.join(self.tmp, f"nginx-{name}")
        os.makedirs(d)
        conf = os.path.join(d, "nginx.conf")
        # The same answer over HTTP/2 with prior knowledge (h2c), when asked.
        h2 = "" if h2_port is None else f"""  server {{
    listen {h2_port} http2 reuseport backlog=4096;
    location / {{ return 200 "hello, world\\n"; }}
  }}
"""
        with open(conf, "w") as f:
            f.write(f"""
worker_processes 2;
worker_rlimit_nofile 65536;
pid {d}/nginx.pid;
error_log {d}/error.log;
daemon off;
events {{ worker_connections 16384; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path {d};
  proxy_temp_path {d};
  fastcgi_temp_path {d};
  uwsgi_temp_path {d};
  scgi_temp_path {d};
  server {{
    listen {port} reuseport backlog=4096;
    location / {{ return 200 "hello, world\\n"; }}
  }}
{h2}}}
""")
        return self.procs.start(["nginx", "-c", conf], netns=ns, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def wait_port(self, ns, port, timeout=10, udp=False, proc=None, log_path=None):
        """Waits until something listens on `port` in `ns`. With `proc` (the
        process meant to listen there), says at once when it exited, with
        the end of its stderr (`log_path`)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = sh("ss", "-Hluln" if udp else "-Htln", f"sport = :{port}", netns=ns, check=False)
            if r.stdout.strip():
                return
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"nothing listens on {port} in {ns}: {' '.join(proc.args[-3:])} "
                                   f"exited {proc.returncode}{self.tail(log_path)}")
            time.sleep(0.05)
        state = "" if proc is None else f" (its process {'runs' if proc.poll() is None else 'exited'})"
        raise RuntimeError(f"nothing listens on {port} in {ns} after {timeout} s{state}"
                           f"{self.tail(log_path)}")

    @staticmethod
    def tail(log_path):
        if not log_path or not os.path.exists(log_path):
            return ""
        with open(log_path, errors="replace") as f:
            text = f.read().strip()
        return f": {text[-500:]}" if text else ""

    def listener(self, argv, ns, port, name, attempts=3):
        """Starts `argv` in `ns` and waits until it listens on `port`: a
        process that exits first (a port not yet free, say) is started
        again, up to `attempts` times; the last failure says why."""
        for attempt in range(attempts):
            log_path = os.path.join(self.tmp, f"{name}-{time.time_ns()}.log")
            p = self.procs.start(argv, netns=ns, stderr=open(log_path, "w"))
            try:
                self.wait_port(ns, port, proc=p, log_path=log_path)
                return p
            except RuntimeError as e:
                self.procs.stop(p)
                if attempt + 1 == attempts:
                    raise
                log(f"{name}: {e}; starting it again")
                time.sleep(0.3)

    def pod_pid(self):
        # The nginx master is the target: `ip netns exec` execs in place.
        return self.pod_nginx.pid

    # --------------------------------------------------------------- agents
    def start_agent(self, netns=None):
        p = self.procs.start(
            [self.agent_bin, "--listen", "127.0.0.1:0", "--token-file", self.token_file,
             "--first-client-timeout", "0", "--log-level", "warn", "targeted", "--pid",
             self.pod_pid()],
            netns=self.node if netns is None else (netns or None), stdout=subprocess.PIPE, stderr=open(os.path.join(self.tmp,
                                                                              "agent.log"), "a"),
            text=True)
        line = p.stdout.readline()
        m = re.search(r"listen=(\S+)", line)
        if not m:
            raise RuntimeError(f"agent: no ready line ({line!r})")
        return p, m.group(1)

    def cli(self, endpoint, *args, netns=None, **kw):
        return self.procs.start([self.cli_bin, "--agent", endpoint, "--token-file",
                                 self.token_file] + [str(a) for a in args],
                                netns=netns or self.node, **kw)

    def start_cli(self, endpoint, name, ready, *args, netns=None):
        """Starts `siphon <args>` (in the node namespace, or `netns`) with
        stderr in a log file and waits for the line matching `ready` there.
        Returns the process and the log's path."""
        log_path = os.path.join(self.tmp, f"{name}-{time.time_ns()}.log")
        f = open(log_path, "w")
        p = self.cli(endpoint, *args, netns=netns, stdout=subprocess.DEVNULL, stderr=f)
        deadline = time.time() + 10
        while time.time() < deadline:
            with open(log_path) as r:
                text = r.read()
            if re.search(ready, text):
                return p, log_path
            if p.poll() is not None:
                raise RuntimeError(f"siphon {name} exited: {text}")
            time.sleep(0.02)
        raise RuntimeError(f"siphon {name} did not start")

    def start_steal(self, endpoint, port, to):
        return self.start_cli(endpoint, "steal", "stealing port", "steal", "--port", port, "--to",
                              to)[0]

    def peer_on(self, port, to_port):
        """iptables REDIRECT in the pod -> socat (pod) -> socat (node) -> to_port."""
        relay1, relay2 = 15080 + port % 1000, 16080 + port % 1000
        a = self.listener(["socat", "-b", "262144",
                           f"TCP-LISTEN:{relay1},reuseaddr,fork,backlog=4096",
                           f"TCP:{self.node_ip}:{relay2}"], self.pod, relay1, "peer-relay-pod")
        b = self.listener(["socat", "-b", "262144",
                           f"TCP-LISTEN:{relay2},reuseaddr,fork,backlog=4096",
                           f"TCP:127.0.0.1:{to_port}"], self.node, relay2, "peer-relay-node")
        rule = ["-t", "nat", "-p", "tcp", "--dport", str(port), "-j", "REDIRECT", "--to-ports",
                str(relay1)]
        sh("iptables", "-A", "PREROUTING", *rule, netns=self.pod)

        def off():
            sh("iptables", "-D", "PREROUTING", *rule, netns=self.pod, check=False)
            self.procs.stop(a)
            self.procs.stop(b)
        return off

    # ------------------------------------------------------- emulated links
    def emulated_link(self, stack, delay_ms, rate=None, queue=None, offload=False, loss=0.0):
        """Two network namespaces, near and far, joined by bench/linkemu: a
        TAP device in each and the emulator between them holding each frame
        `delay_ms` each way (RTT 2 x delay_ms), at `rate` bytes/s behind a
        `queue`-byte buffer when given, losing `loss` percent of the frames
        each way (bench/README.md, "Link emulator").
        Addresses 10.(79+k).X.1 (near) and .2 (far), /24, a route only to
        each other. Everything is undone by `stack` (emulator first, then
        the namespaces), even on failure. Returns an object with near, far
        (namespace names), near_ip, far_ip and rtt_ms (measured with ping
        once the link is up, ARP resolved)."""
        k = self.links
        self.links += 1
        near, far = f"sbl{k}n-{self.tag}", f"sbl{k}f-{self.tag}"
        tap_near, tap_far = f"sl{self.tag}{k}n", f"sl{self.tag}{k}f"
        octet = 1 + int(self.tag[:2], 16) % 250
        near_ip, far_ip = f"10.{79 + k}.{octet}.1", f"10.{79 + k}.{octet}.2"
        for ns in (near, far):
            sh("ip", "netns", "add", ns)
            stack.callback(sh, "ip", "netns", "del", ns, check=False)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        argv = [os.path.join(self.build, "bench", "linkemu"), "--tap-a", tap_near, "--netns-a",
                near, "--tap-b", tap_far, "--netns-b", far, "--delay-ms", delay_ms,
                "--fifo", "10"]
        if rate:
            argv += ["--rate", rate]
        if queue:
            argv += ["--queue", queue]
        if offload:
            argv.append("--offload")
        if loss:
            argv += ["--loss", loss]
        log_path = os.path.join(self.tmp, f"linkemu-{k}.log")
        emu = self.procs.start(argv, stdout=subprocess.PIPE, stderr=open(log_path, "w"),
                               text=True)

        def stop():
            self.procs.stop(emu)
            with open(log_path) as f:
                counters = "; ".join(f.read().split("\n")).strip("; ")
            if counters:
                log(f"link {k}: {counters}")
        stack.callback(stop)
        if "ready" not in emu.stdout.readline():
            raise RuntimeError(f"linkemu did not start: {open(log_path).read().strip()}")
        for ns, dev, ip in ((near, tap_near, near_ip), (far, tap_far, far_ip)):
            # No IPv6 on the link: its router and neighbour solicitations
            # would be the only other traffic on it.
            sh("sysctl", "-q", "-w", f"net.ipv6.conf.{dev}.disable_ipv6=1", netns=ns,
               check=False)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        link = argparse.Namespace(near=near, far=far, near_ip=near_ip, far_ip=far_ip,
                                  rtt_ms=None)
        if shutil.which("ping"):
            sh("ping", "-c", "1", "-W", "5", far_ip, netns=near)  # ARP, once
            r = sh("ping", "-c", "10", "-i", "0.05", "-q", far_ip, netns=near)
            m = re.search(r"= [\d.]+/([\d.]+)/", r.stdout)
            link.rtt_ms = float(m.group(1)) if m else None
        log(f"link {k}: {near} {near_ip} <-> {far} {far_ip}, one-way {delay_ms} ms, "
            f"ping RTT {link.rtt_ms} ms")
        return link

    # ------------------------------------------------------------ the runs
    def modes(self, scenario, port, to_port, run_once, value_key):
        """Runs `run_once()` for direct, siphon and peer, interleaved per
        repetition, and records the medians."""
        values = {"direct": [], "siphon": [], "peer": []}
        agent, endpoint = self.start_agent()
        try:
            for rep in range(self.reps):
                for mode in ("direct", "siphon", "peer"):
                    if mode == "siphon":
                        steal = self.start_steal(endpoint, port, f"127.0.0.1:{to_port}")
                        try:
                            values[mode].append(run_once())
                        finally:
                            self.procs.stop(steal, signal.SIGINT)
                    elif mode == "peer":
                        off = self.peer_on(port, to_port)
                        try:
                            values[mode].append(run_once())
                        finally:
                            off()
                    else:
                        values[mode].append(run_once())
                    log(f"{scenario} rep {rep + 1}/{self.reps} {mode}: {values[mode][-1]}")
        finally:
            self.procs.stop(agent)
        return {m: summary([v[value_key] if isinstance(v, dict) else v for v in vals])
                for m, vals in values.items()}, values

    def iperf_json(self, argv, netns):
        # An iperf3 server runs one test at a time and may still be closing
        # the previous one: "busy" is worth a retry, anything else is not.
        for attempt in range(5):
            r = sh(*argv, netns=netns, timeout=self.secs + 60, check=False)
            data = json.loads(r.stdout) if r.stdout.strip() else {"error": r.stderr.strip()}
            if "busy" not in data.get("error", ""):
                return data
            time.sleep(1)
        return data

    def iperf(self, parallel):
        data = self.iperf_json(["iperf3", "-c", self.pod_ip, "-p", "5201", "-t", self.secs, "-P",
                                parallel, "-J"], self.client)
        if "error" in data:
            raise RuntimeError(f"iperf3: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 1e9  # Gbit/s

    def wrk(self, close=False):
        argv = ["wrk", "-t", "2", "-c", "32", "-d", f"{self.secs}s", "--latency"]
        if close:
            argv += ["-H", "Connection: close"]
        r = sh(*argv, f"http://{self.pod_ip}:80/", netns=self.client, timeout=self.secs + 60)
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", r.stdout).group(1))
        m = re.search(r"99%\s+([\d.]+)(us|ms|s)", r.stdout)
        p99 = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", r.stdout)
        if errors:
            raise RuntimeError(f"wrk reported errors: {errors.group(0)}")
        return {"rps": rps, "p99_ms": p99}

    def record(self, name, unit, measured, targets, extra=None):
        row = {"scenario": name, "unit": unit, "measured": measured, "targets": targets}
        checks = []
        for baseline, minimum in targets.items():
            if baseline == "absolute_max":
                ok = measured["siphon"]["median"] <= minimum
                checks.append({"vs": "limit", "want": f"<= {minimum}", "ok": ok})
                continue
            if baseline == "absolute_min":
                ok = measured["siphon"]["median"] >= minimum
                checks.append({"vs": "limit", "want": f">= {minimum}", "ok": ok})
                continue
            if baseline.endswith("_max"):
                # A cost (latency): siphon at most `minimum` times the baseline.
                ratio = measured["siphon"]["median"] / measured[baseline[:-4]]["median"]
                checks.append({"vs": baseline[:-4], "ratio": round(ratio, 3),
                               "want": f"<= {minimum}x", "ok": ratio <= minimum})
                continue
            ratio = measured["siphon"]["median"] / measured[baseline]["median"]
            if minimum is None:  # reported next to the baseline, no target
                checks.append({"vs": baseline, "ratio": round(ratio, 3), "want": "reported",
                               "ok": None})
                continue
            checks.append({"vs": baseline, "ratio": round(ratio, 3), "want": f">= {minimum}x",
                           "ok": ratio >= minimum})
        row["checks"] = checks
        if extra:
            row.update(extra)
        self.results.append(row)
        log(f"{name}: " + ", ".join(
            f"{c['vs']} {c.get('ratio', measured['siphon']['median'])} ({c['want']}" +
            ("" if c["ok"] is None else f": {'ok' if c['ok'] else 'MISSED'}") + ")"
            for c in checks))

    def bulk(self, parallel, targets, name):
        measured, _ = self.modes(name, 5201, 5202, lambda: self.iperf(parallel), None)
        self.record(name, "Gbit/s", measured, targets)

    def http(self, close, targets, name):
        measured, raw = self.modes(name, 80, 8080, lambda: self.wrk(close), "rps")
        p99 = {m: summary([v["p99_ms"] for v in vals]) for m, vals in raw.items()}
        self.record(name, "requests/s", measured, targets, {"p99_ms": p99})

    # ------------------------------------------------------ filtered steal
    def wrk_rps(self, port, headers=()):
        """wrk keep-alive (2 threads, 32 connections) to the pod's `port`:
        requests/s; any socket error or non-2xx answer is a failed run."""
        argv = ["wrk", "-t", "2", "-c", "32", "-d", f"{self.secs}s"]
        for h in headers:
            argv += ["-H", h]
        r = sh(*argv, f"http://{self.pod_ip}:{port}/", netns=self.client, timeout=self.secs + 60)
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", r.stdout)
        if errors:
            raise RuntimeError(f"wrk reported errors: {errors.group(0)}")
        return float(re.search(r"Requests/sec:\s+([\d.]+)", r.stdout).group(1))

    def h2load_rps(self, port, headers=()):
        """h2load with prior knowledge (2 threads, 32 connections, 10 streams
        in flight on each) to the pod's `port`: requests/s; a failed, errored
        or non-2xx request is a failed run."""
        argv = ["h2load", "-t", "2", "-c", "32", "-m", "10", "-D", self.secs]
        for h in headers:
            argv += ["-H", h]
        r = sh(*argv, f"http://{self.pod_ip}:{port}/", netns=self.client, timeout=self.secs + 60)
        rps = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", r.stdout)
        counts = re.search(r"requests: .* (\d+) failed, (\d+) errored, (\d+) timeout", r.stdout)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", r.stdout)
        if not (rps and counts and codes):
            raise RuntimeError(f"h2load: unexpected output: {r.stdout[-2000:]}")
        if any(int(n) for n in counts.groups()) or any(int(n) for n in codes.groups()[1:]):
            raise RuntimeError(f"h2load reported errors: {counts.group(0)}; {codes.group(0)}")
        return float(rps.group(1))

    def filtered(self):
        """HTTP-filtered steal (docs/STEAL.md) against direct and against an
        unfiltered steal of the same port, HTTP/1.1 (wrk, keep-alive, pod
        port 80) and HTTP/2 (h2load, prior knowledge, pod port 81), all
        interleaved per repetition:
          direct       the client to the pod's nginx;
          unfiltered   `siphon steal` of the port to the node's nginx (raw
                       bytes: HTTP/1.1 to 8080, HTTP/2 to 8081);
          matching     `siphon steal --filter-header 'x-bench: ^1$'` and
                       requests with that header: each one a StolenRequest
                       stream, answered by the node's nginx (HTTP/1.1, 8080);
          passthrough  the same filtered steal, requests without the
                       header: parsed by the agent and sent to the pod's
                       nginx over its pooled connections."""
        protos = (("HTTP/1.1 keep-alive, 32 connections (wrk)", 80, 8080, self.wrk_rps),
                  ("HTTP/2, 32 connections x 10 streams (h2load)", 81, 8081, self.h2load_rps))
        modes = ("direct", "unfiltered", "matching", "passthrough")
        values = {(port, m): [] for _, port, _, _ in protos for m in modes}
        header = "x-bench: 1"
        agent, endpoint = self.start_agent()
        try:
            for rep in range(self.reps):
                for _, port, _, load in protos:
                    values[(port, "direct")].append(load(port))
                steals = [self.start_steal(endpoint, port, f"127.0.0.1:{raw_port}")
                          for _, port, raw_port, _ in protos]
                try:
                    for _, port, _, load in protos:
                        values[(port, "unfiltered")].append(load(port))
                finally:
                    for p in steals:
                        self.procs.stop(p, signal.SIGINT)
                # One session per port, each answered by the node's HTTP/1.1
                # server: the CLI speaks HTTP/1.1 to it whatever the client
                # spoke to the agent.
                steals = [self.start_cli(endpoint, "steal-filtered", "stealing port", "steal",
                                         "--port", port, "--to", "127.0.0.1:8080",
                                         "--filter-header", "x-bench: ^1$")[0]
                          for _, port, _, _ in protos]
                try:
                    for _, port, _, load in protos:
                        values[(port, "matching")].append(load(port, [header]))
                        values[(port, "passthrough")].append(load(port))
                finally:
                    for p in steals:
                        self.procs.stop(p, signal.SIGINT)
                for name, port, _, _ in protos:
                    log(f"filtered rep {rep + 1}/{self.reps} {name}: " + ", ".join(
                        f"{m} {values[(port, m)][-1]:.0f}" for m in modes) + " req/s")
        finally:
            self.procs.stop(agent)
        for name, port, _, _ in protos:
            direct = summary(values[(port, "direct")])
            unfiltered = summary(values[(port, "unfiltered")])
            self.record(f"steal (unfiltered), {name}", "requests/s",
                        {"siphon": unfiltered, "direct": direct}, {"direct": 0.3})
            for mode, what, targets in (
                    ("matching", "requests matching the filter (to the local server)",
                     {"direct": 0.2, "unfiltered": 0.5}),
                    ("passthrough", "requests not matching (to the application)",
                     {"direct": 0.4, "unfiltered": 1.0})):
                self.record(f"filtered steal, {name}, {what}", "requests/s",
                            {"siphon": summary(values[(port, mode)]), "direct": direct,
                             "unfiltered": unfiltered}, targets)

    def idle_connections(self, count=1000):
        agent, endpoint = self.start_agent()
        steal = self.start_steal(endpoint, 80, "127.0.0.1:8080")
        try:
            script = os.path.join(ROOT, "bench", "idle_clients.py")
            duration = 5 if self.args.quick else 10
            clients = self.procs.start(["python3", script, self.pod_ip, "80", count, duration],
                                       netns=self.client, stdout=subprocess.PIPE, text=True)
            time.sleep(duration * 0.8)
            agent_rss = rss_kib(agent.pid) / 1024
            cli_rss = rss_kib(steal.pid) / 1024
            out, _ = clients.communicate(timeout=duration + 60)
            stats = json.loads(out)
            if stats["errors"]:
                raise RuntimeError(f"idle clients: {stats}")
        finally:
            self.procs.stop(steal, signal.SIGINT)
            self.procs.stop(agent)
        self.record(f"steal, {count} concurrent idle-ish connections (1 req/s each)", "MiB RSS",
                    {"siphon": summary([agent_rss])}, {"absolute_max": 64},
                    {"cli_rss_mib": round(cli_rss, 1), "requests": stats["requests"]})

    def forward_bulk(self, targets):
        """siphon forward vs a socat two-hop relay, both to the pod's iperf3."""
        values = {"siphon": [], "peer": []}
        agent, endpoint = self.start_agent()
        try:
            for rep in range(self.reps):
                fwd_log = os.path.join(self.tmp, f"forward-{time.time_ns()}.log")
                fwd = self.cli(endpoint, "forward", "-L", "127.0.0.1:17201:127.0.0.1:5201",
                               stdout=subprocess.DEVNULL, stderr=open(fwd_log, "w"))
                self.wait_port(self.node, 17201, proc=fwd, log_path=fwd_log)
                values["siphon"].append(self.iperf_from_node(17201))
                self.procs.stop(fwd, signal.SIGINT)
                a = self.listener(["socat", "-b", "262144",
                                   "TCP-LISTEN:17202,reuseaddr,fork,backlog=4096",
                                   f"TCP:{self.pod_node_ip}:17203"], self.node, 17202,
                                  "forward-peer-node")
                b = self.listener(["socat", "-b", "262144",
                                   "TCP-LISTEN:17203,reuseaddr,fork,backlog=4096",
                                   "TCP:127.0.0.1:5201"], self.pod, 17203, "forward-peer-pod")
                values["peer"].append(self.iperf_from_node(17202))
                self.procs.stop(a)
                self.procs.stop(b)
                log(f"forward rep {rep + 1}: siphon {values['siphon'][-1]:.2f} "
                    f"peer {values['peer'][-1]:.2f} Gbit/s")
        finally:
            self.procs.stop(agent)
        self.record("outgoing: bulk TCP through siphon forward", "Gbit/s",
                    {m: summary(v) for m, v in values.items()}, targets)

    def iperf_from_node(self, port):
        data = self.iperf_json(["iperf3", "-c", "127.0.0.1", "-p", port, "-t", self.secs, "-J"],
                               self.node)
        if "error" in data:
            raise RuntimeError(f"iperf3 through port {port}: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 1e9

    # ------------------------------------------------------------ exec
    def exec_cli(self, endpoint, *args, timeout=None):
        """`siphon exec ARGS` in the node (the developer's machine): its
        stdout, or an error with its stderr."""
        r = sh(self.cli_bin, "--agent", endpoint, "--token-file", self.token_file, "exec", *args,
               netns=self.node, timeout=timeout or self.secs + 120, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"siphon exec {' '.join(map(str, args))}: exit {r.returncode}: "
                               f"{r.stderr[-2000:]}")
        return r.stdout

    def exec_group(self):
        """`siphon exec`: a program on the developer's machine reaching the
        pod's services through the agent, against the same through `siphon
        forward`, and against the same load generator run inside the pod."""
        agent, endpoint = self.start_agent()
        # The pod's DNS server, on its own address (services() has one on
        # 127.0.0.1).
        with open(os.path.join(self.tmp, "dnsperf.txt"), "w") as f:
            f.write("db.bench.svc.cluster.local A\n")
        dns = self.procs.start(["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
                                f"--listen-address={self.pod_ip}", "--bind-interfaces",
                                "--port=53", "--pid-file=", "--user=root", "--cache-size=1000",
                                "--address=/db.bench.svc.cluster.local/10.96.0.15"],
                               netns=self.pod, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_port(self.pod, 53, udp=True)
        fwd_port = 17211
        fwd = self.cli(endpoint, "forward", "-L", f"127.0.0.1:{fwd_port}:{self.pod_ip}:5201",
                       "-L", f"127.0.0.1:{fwd_port + 1}:{self.pod_ip}:80",
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_port(self.node, fwd_port)
        self.wait_port(self.node, fwd_port + 1)
        # connect + request + first byte of the answer, N times: the median,
        # in ms, printed as one JSON line.
        ttfb = ("import json,socket,statistics,sys,time\n"
                "host,port,n=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])\n"
                "t=[]\n"
                "for i in range(n):\n"
                "    a=time.perf_counter()\n"
                "    s=socket.create_connection((host,port))\n"
                "    s.sendall(b'GET / HTTP/1.1\\r\\nHost: pod\\r\\nConnection: close\\r\\n\\r\\n')\n"
                "    s.recv(1)\n"
                "    t.append((time.perf_counter()-a)*1000)\n"
                "    s.close()\n"
                "print(json.dumps({'median_ms':statistics.median(t)}))\n")
        values = {k: {"siphon": [], "forward": [], "pod": []} for k in
                  ("bulk", "ttfb", "http", "dns")}
        startup = {"exec": [], "exec_bare": [], "info": []}
        try:
            for rep in range(self.reps):
                # Bulk download (iperf3 -R: the server in the pod sends).
                out = self.exec_cli(endpoint, "--", "iperf3", "-c", self.pod_ip, "-p", "5201",
                                    "-R", "-t", self.secs, "-J")
                values["bulk"]["siphon"].append(
                    json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9)
                data = self.iperf_json(["iperf3", "-c", "127.0.0.1", "-p", fwd_port, "-R", "-t",
                                        self.secs, "-J"], self.node)
                if "error" in data:
                    raise RuntimeError(f"iperf3 through forward: {data['error']}")
                values["bulk"]["forward"].append(
                    data["end"]["sum_received"]["bits_per_second"] / 1e9)
                # Connect to first byte.
                n = "50" if self.args.quick else "200"
                out = self.exec_cli(endpoint, "--", "/usr/bin/python3", "-c", ttfb, self.pod_ip,
                                    "80", n)
                values["ttfb"]["siphon"].append(json.loads(out)["median_ms"])
                r = sh("/usr/bin/python3", "-c", ttfb, "127.0.0.1", fwd_port + 1, n,
                       netns=self.node)
                values["ttfb"]["forward"].append(json.loads(r.stdout)["median_ms"])
                # HTTP keep-alive from the program (wrk) against wrk in the pod.
                wrk = ["wrk", "-t", "2", "-c", "32", "-d", f"{self.secs}s",
                       f"http://{self.pod_ip}:80/"]
                out = self.exec_cli(endpoint, "--", *wrk)
                if re.search(r"Non-2xx or 3xx responses|Socket errors", out):
                    raise RuntimeError(f"wrk through exec reported errors: {out}")
                values["http"]["siphon"].append(
                    float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)))
                r = sh(*wrk, netns=self.pod, timeout=self.secs + 60)
                values["http"]["pod"].append(
                    float(re.search(r"Requests/sec:\s+([\d.]+)", r.stdout).group(1)))
                # The same through `siphon forward` (reported): what of the
                # gap is the session's path, not exec's.
                r = sh(*wrk[:-1], f"http://127.0.0.1:{fwd_port + 1}/", netns=self.node,
                       timeout=self.secs + 60)
                values["http"]["forward"].append(
                    float(re.search(r"Requests/sec:\s+([\d.]+)", r.stdout).group(1)))
                # DNS queries/s (dnsperf, UDP) from the program against in the pod.
                dnsperf = ["dnsperf", "-s", self.pod_ip, "-d",
                           os.path.join(self.tmp, "dnsperf.txt"), "-l", self.secs, "-c", "4",
                           "-Q", "200000"]
                out = self.exec_cli(endpoint, "--", *dnsperf)
                values["dns"]["siphon"].append(
                    float(re.search(r"Queries per second:\s+([\d.]+)", out).group(1)))
                r = sh(*dnsperf, netns=self.pod, timeout=self.secs + 60)
                values["dns"]["pod"].append(
                    float(re.search(r"Queries per second:\s+([\d.]+)", r.stdout).group(1)))
                # Start to exit: `exec -- true`; the same without the target's
                # environment and files (no calls but the session's); and the
                # session alone (`siphon info`).
                for key, args in (("exec", ["exec", "--", "true"]),
                                  ("exec_bare", ["exec", "--no-target-env", "--local-dns",
                                                 "--no-udp", "--", "true"]),
                                  ("info", ["info"])):
                    times = []
                    for _ in range(5):
                        t0 = time.perf_counter()
                        sh(self.cli_bin, "--agent", endpoint, "--token-file", self.token_file,
                           *args, netns=self.node)
                        times.append((time.perf_counter() - t0) * 1000)
                    startup[key].append(statistics.median(times))
                log(f"exec rep {rep + 1}: bulk {values['bulk']['siphon'][-1]:.2f} vs forward "
                    f"{values['bulk']['forward'][-1]:.2f} Gbit/s; first byte "
                    f"{values['ttfb']['siphon'][-1]:.2f} vs {values['ttfb']['forward'][-1]:.2f} "
                    f"ms; http {values['http']['siphon'][-1]:.0f} vs pod "
                    f"{values['http']['pod'][-1]:.0f}/s; dns {values['dns']['siphon'][-1]:.0f} vs "
                    f"pod {values['dns']['pod'][-1]:.0f}/s; exec -- true "
                    f"{startup['exec'][-1]:.0f} ms")
        finally:
            self.procs.stop(fwd, signal.SIGINT)
            self.procs.stop(dns)
            self.procs.stop(agent)
        pick = lambda k, *modes: {m: summary(values[k][m]) for m in modes}  # noqa: E731
        self.record("exec: bulk TCP download by the program (iperf3 -R)", "Gbit/s",
                    pick("bulk", "siphon", "forward"), {"forward": 0.9})
        self.record("exec: connect to first byte of a new connection", "ms (median)",
                    pick("ttfb", "siphon", "forward"), {"forward_max": 1.5})
        self.record("exec: HTTP keep-alive from the program (wrk, 32 connections)",
                    "requests/s", pick("http", "siphon", "pod", "forward"),
                    {"pod": 0.5, "forward": None})
        self.record("exec: DNS queries/s from the program (dnsperf, UDP)", "queries/s",
                    pick("dns", "siphon", "pod"), {"pod": 0.5})
        self.record("exec: `siphon exec -- true`, start to exit", "ms",
                    {"siphon": summary(startup["exec"]),
                     "exec_bare": summary(startup["exec_bare"]),
                     "session": summary(startup["info"])},
                    {"session": None, "exec_bare": None})

    # ---------------------------------------------------------------- mirror
    def start_mirror(self, endpoint, port, to):
        return self.start_cli(endpoint, "mirror", r"mirror: port \d+", "mirror", "--port", port,
                              "--to", to)

    def stop_mirror(self, p, log_path):
        """Stops `siphon mirror` and returns (bytes replayed, gap bytes) of the
        client->server direction, from its summary line."""
        self.procs.stop(p, signal.SIGINT)
        with open(log_path) as r:
            text = r.read()
        m = re.search(r"client->server (\d+) bytes \(gaps (\d+) bytes\)", text)
        if not m:
            raise RuntimeError(f"siphon mirror: no summary line in {text[-2000:]!r}")
        return int(m.group(1)), int(m.group(2))

    def pod_packets(self):
        """Packets through the pod's interface to the client, both ways: the
        packets the mirror's TC programs see there."""
        dev = f"sb{self.tag}p"
        r = sh("cat", f"/sys/class/net/{dev}/statistics/rx_packets",
               f"/sys/class/net/{dev}/statistics/tx_packets", netns=self.pod)
        return sum(int(x) for x in r.stdout.split())

    def mirrored_run(self, endpoint, port, measure):
        """`measure()` with `siphon mirror --port port --to` the sink on:
        (its result, bytes copied, gap bytes, and the CPU the agent and the
        CLI spent meanwhile with the packets that crossed the pod's
        interface)."""
        p, path = self.start_mirror(endpoint, port, "127.0.0.1:19000")
        cpu0 = (cpu_secs(self.mirror_agent.pid), cpu_secs(p.pid))
        packets0 = self.pod_packets()
        try:
            result = measure()
            cpu = (cpu_secs(self.mirror_agent.pid) - cpu0[0], cpu_secs(p.pid) - cpu0[1])
            packets = self.pod_packets() - packets0
        finally:
            copied, gaps = self.stop_mirror(p, path)
        return result, copied, gaps, {"agent": cpu[0], "cli": cpu[1], "packets": packets,
                                      "bytes": copied}

    @staticmethod
    def mirror_costs(runs):
        """CPU seconds per GB copied and CPU milliseconds per thousand
        packets, agent and CLI, per run: {name: summary}."""
        out = {}
        for who in ("agent", "cli"):
            out[f"{who}_cpu_s_per_gb"] = summary(
                [r[who] / max(r["bytes"] / 1e9, 1e-9) for r in runs])
            out[f"{who}_cpu_ms_per_1000_packets"] = summary(
                [r[who] * 1000 / max(r["packets"] / 1000, 1e-9) for r in runs])
        return out

    @staticmethod
    def cost_text(c):
        return (f"agent {c['agent']:.2f} s CPU, CLI {c['cli']:.2f} s CPU for "
                f"{c['bytes'] >> 20} MiB in {c['packets']} packets")

    def mirror(self):
        """The application's throughput (bulk, and small HTTP requests) with
        a mirror on against without, what the mirror's CPU costs per GB and
        per thousand packets, and the highest rate it copies without a gap."""
        sink = self.listener(["socat", "-u", "-b", "262144",
                              "TCP-LISTEN:19000,reuseaddr,fork,backlog=64", "GOPEN:/dev/null"],
                             self.node, 19000, "mirror-sink")
        agent, endpoint = self.start_agent()
        self.mirror_agent = agent
        values = {"direct": [], "siphon": []}
        http = {"direct": [], "siphon": []}
        bulk_costs, http_costs = [], []
        try:
            for rep in range(self.reps):
                values["direct"].append(self.iperf(1))
                got, copied, gaps, cost = self.mirrored_run(endpoint, 5201, lambda: self.iperf(1))
                values["siphon"].append(got)
                bulk_costs.append(cost)
                log(f"mirror rep {rep + 1}/{self.reps}: without {values['direct'][-1]:.2f}, "
                    f"with {values['siphon'][-1]:.2f} Gbit/s; mirror copied {copied >> 20} MiB, "
                    f"gaps {gaps >> 20} MiB; {self.cost_text(cost)}")
                # Small keep-alive requests to the pod's nginx: the TC
                # programs copy requests and answers, the agent reassembles
                # both directions and sends the requests (no --both), which
                # the CLI replays to the sink.
                http["direct"].append(self.wrk_rps(80))
                got, copied, gaps, cost = self.mirrored_run(endpoint, 80,
                                                            lambda: self.wrk_rps(80))
                http["siphon"].append(got)
                http_costs.append(cost)
                log(f"mirror http rep {rep + 1}/{self.reps}: without {http['direct'][-1]:.0f}, "
                    f"with {http['siphon'][-1]:.0f} requests/s; mirror copied "
                    f"{copied >> 10} KiB, gaps {gaps} bytes; {self.cost_text(cost)}")
            self.record("mirror on: the application's own bulk TCP throughput (iperf3)", "Gbit/s",
                        {m: summary(v) for m, v in values.items()}, {"direct": 0.95},
                        {"costs": self.mirror_costs(bulk_costs)})
            self.record("mirror on: the application's small HTTP keep-alive requests (wrk, "
                        "32 connections, nginx in the pod)", "requests/s",
                        {m: summary(v) for m, v in http.items()}, {"direct": 0.95},
                        {"costs": self.mirror_costs(http_costs)})

            # Rates doubling until the mirror reports a gap, then three
            # halvings of the interval between the last clean rate and the
            # first one with a gap: the highest clean rate counts (doubling
            # alone could only say "8 Gbit/s" for anything up to 16).
            # Against the application's unmirrored throughput above.
            def clean_at(rate):
                """The application's Gbit/s at `rate` Mbit/s, or None when the
                mirror reported a gap; raises when iperf3 failed."""
                p, path = self.start_mirror(endpoint, 5201, "127.0.0.1:19000")
                try:
                    data = self.iperf_json(["iperf3", "-c", self.pod_ip, "-p", "5201", "-t",
                                            self.secs, "-b", f"{rate}M", "-J"], self.client)
                finally:
                    copied, gaps = self.stop_mirror(p, path)
                if "error" in data:
                    raise RuntimeError(f"iperf3: {data['error']}")
                got = data["end"]["sum_received"]["bits_per_second"] / 1e9
                log(f"mirror at {rate} Mbit/s: application {got:.2f} Gbit/s, copied "
                    f"{copied >> 20} MiB, gaps {gaps} bytes")
                return None if gaps else got

            best = 0.0
            clean, gap_rate = 0, None
            rate = 250
            while rate <= 64000:
                got = clean_at(rate)
                if got is None:
                    gap_rate = rate
                    break
                best, clean = got, rate
                if got < rate / 1000 * 0.9:
                    break  # the application itself tops out here
                rate *= 2
            for _ in range(3 if gap_rate else 0):
                rate = (clean + gap_rate) // 2
                got = clean_at(rate)
                if got is None:
                    gap_rate = rate
                else:
                    best, clean = max(best, got), rate
            self.record("mirror: highest rate copied with zero gaps (iperf3 -b, doubling, "
                        "then 3 halvings)", "Gbit/s",
                        {"siphon": summary([best]), "direct": values and
                         summary(values["direct"])}, {"direct": 0.5})
        finally:
            self.procs.stop(agent)
            self.procs.stop(sink)

    def startup(self, runs=21):
        times = []
        for _ in range(runs):
            # In the host's namespace: `ip netns exec` would add its own start.
            t0 = time.perf_counter()
            p, _ = self.start_agent(netns="")
            times.append((time.perf_counter() - t0) * 1000)
            self.procs.stop(p)
        self.record("agent start to ready line, targeted --pid", "ms",
                    {"siphon": summary(times)}, {"absolute_max": 50})

    def idle_rss(self):
        agent, endpoint = self.start_agent()
        fwd = self.cli(endpoint, "forward", "-L", "127.0.0.1:0:127.0.0.1:5201",
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        fwd.stderr.readline()  # "forwarding ...": the session is up
        time.sleep(1)
        rss = rss_kib(agent.pid) / 1024
        self.procs.stop(fwd, signal.SIGINT)
        self.procs.stop(agent)
        self.record("agent idle RSS with one session", "MiB", {"siphon": summary([rss])},
                    {"absolute_max": 16})

    def isolation(self):
        """One session reading a 64 MiB file (`siphon fs cat`) while other
        clients misbehave and a stopped consumer holds its stream, against
        the same read alone, interleaved. tests/privileged/isolation checks
        that it stays byte-exact; this measures how fast it stays."""
        path = os.path.join(self.tmp, "isolation.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(64 << 20))
        with open(path, "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        token = open(self.token_file).read().strip()
        # The agent in this namespace, so this process's sockets reach it.
        agent, endpoint = self.start_agent(netns="")
        port = int(endpoint.rsplit(":", 1)[1])
        endless = self.procs.start(["socat", "-U", "TCP-LISTEN:5301,reuseaddr,fork",
                                    "OPEN:/dev/zero"], netns=self.pod, stderr=subprocess.DEVNULL)
        self.wait_port(self.pod, 5301)

        def read_once():
            t0 = time.perf_counter()
            r = subprocess.run([self.cli_bin, "--agent", endpoint, "--token-file",
                                self.token_file, "fs", "cat", path], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=300)
            secs = time.perf_counter() - t0
            if r.returncode != 0 or hashlib.sha256(r.stdout).hexdigest() != want:
                raise RuntimeError(f"siphon fs cat: exit {r.returncode}, "
                                   f"{len(r.stdout)} bytes: {r.stderr.decode()[-500:]}")
            return (64 << 20) / 1e6 / secs

        values = {"baseline": [], "siphon": []}
        try:
            for rep in range(self.reps):
                values["baseline"].append(read_once())
                # X: a consumer that read some of its stream and stopped.
                x = subprocess.Popen([self.cli_bin, "--agent", endpoint, "--token-file",
                                      self.token_file, "--client-name", "x", "connect",
                                      "127.0.0.1:5301"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
                got = 0
                while got < (4 << 20):
                    chunk = x.stdout.read1(1 << 20)
                    if not chunk:
                        raise RuntimeError("siphon connect (X) ended early")
                    got += len(chunk)
                x.send_signal(signal.SIGSTOP)
                load = Misbehavers(port, token)
                load.start()
                try:
                    values["siphon"].append(read_once())
                finally:
                    load.stop()
                    x.kill()
                    x.wait()
                log(f"isolation rep {rep + 1}/{self.reps}: alone {values['baseline'][-1]:.0f}, "
                    f"with misbehaving clients {values['siphon'][-1]:.0f} MB/s "
                    f"({load.rounds} garbage rounds)")
        finally:
            self.procs.stop(endless)
            self.procs.stop(agent)
        self.record("files: 64 MiB read while other clients misbehave (vs the same read alone)",
                    "MB/s", {"siphon": summary(values["siphon"]),
                             "baseline": summary(values["baseline"])}, {"baseline": 0.5})

    def services(self):
        """Files and DNS through the agent (bench/service_bench.cc) against
        local stat/read and c-ares inside the pod."""
        tool = os.path.join(self.build, "bench", "service_bench")
        if not os.path.exists(tool):
            log("service_bench not built: files and DNS scenarios skipped")
            return
        root = os.path.join(self.tmp, "podroot")
        data = os.path.join(root, "data")
        os.makedirs(os.path.join(root, "etc"))
        os.makedirs(os.path.join(data, "many"))
        os.makedirs(os.path.join(root, "bin"))
        shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
        with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
            f.write("nameserver 127.0.0.1\nsearch bench.svc.cluster.local\noptions ndots:5\n")
        for i in range(10000):
            open(os.path.join(data, "many", f"f{i:05d}"), "w").close()
        with open(os.path.join(data, "big.bin"), "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(64 if self.args.quick else 256):
                f.write(chunk)
        self.procs.start(["dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
                          "--listen-address=127.0.0.1", "--bind-interfaces", "--port=53",
                          "--pid-file=", "--user=root", "--cache-size=1000",
                          "--address=/db.bench.svc.cluster.local/10.96.0.15",
                          "--address=/db.bench.svc.cluster.local/fd00::15"],
                         netns=self.pod, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pod = self.procs.start(["chroot", root, "/bin/busybox", "sleep", "3600"], netns=self.pod)
        self.wait_port(self.pod, 53, udp=True)
        agent = self.procs.start(
            [self.agent_bin, "--listen", "127.0.0.1:0", "--token-file", self.token_file,
             "--first-client-timeout", "0", "--log-level", "warn", "targeted", "--pid", pod.pid],
            netns=self.node, stdout=subprocess.PIPE, text=True)
        endpoint = re.search(r"listen=(\S+)", agent.stdout.readline()).group(1)
        reps = str(self.reps)
        try:
            for scenario, extra, name, unit, targets in (
                    ("stat", ["--paths-dir", "/data/many", "--count", "10000"],
                     "files: stat of 10,000 paths, pipelined", "ops/s", {"absolute_min": 20000}),
                    ("fscat", ["--path", "/data/big.bin"],
                     "files: sequential read of a big file", "MB/s", {"baseline": 0.3}),
                    ("dns", ["--name", "db", "--count", "10000"],
                     "DNS: 10,000 lookups against dnsmasq in the pod, pipelined", "lookups/s",
                     {"baseline": 0.5})):
                r = sh(tool, "--agent", endpoint, "--token-file", self.token_file, "--scenario",
                       scenario, "--pod-pid", pod.pid, "--repeat", reps, *extra, netns=self.node,
                       timeout=600)
                out = json.loads(r.stdout)
                measured = {"siphon": summary(out["siphon"]["rates"]),
                            "baseline": summary(out["baseline"]["rates"])}
                self.record(name, unit, measured, targets)
        finally:
            self.procs.stop(agent)

    def mount_root(self):
        """The mount group's target root: busybox (the pod's process), 100
        directories of 100 empty files (data/tree), a file of random bytes
        (data/big.bin, 64 MiB quick, 256 MiB otherwise) and a committed git
        repository of 5,000 files in 50 directories (data/repo). Returns
        (root, big file's path, its size in MiB)."""
        root = os.path.join(self.tmp, "mountroot")
        data = os.path.join(root, "data")
        os.makedirs(os.path.join(root, "bin"))
        shutil.copy("/bin/busybox", os.path.join(root, "bin", "busybox"))
        for d in range(100):
            tree = os.path.join(data, "tree", f"d{d:03d}")
            os.makedirs(tree)
            for i in range(100):
                open(os.path.join(tree, f"f{i:03d}"), "w").close()
        mib = 64 if self.args.quick else 256
        big = os.path.join(data, "big.bin")
        with open(big, "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(mib):
                f.write(chunk)
        repo = os.path.join(data, "repo")
        for d in range(50):
            sub = os.path.join(repo, "src", f"m{d:02d}")
            os.makedirs(sub)
            for i in range(100):
                p = os.path.join(sub, f"file{i:03d}.txt")
                with open(p, "w") as f:
                    f.write(f"module {d} file {i}\n")
                # Older than the index git writes next: files as new as the
                # index are "racily clean" and every status would read them.
                os.utime(p, (1600000000, 1600000000))
        for argv in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q",
                      "-m", "5,000 files"]):
            subprocess.run(["git", "-C", repo] + argv, check=True, env=self.git_env(),
                           capture_output=True)
        return root, big, mib

    @staticmethod
    def git_env():
        # No system or user configuration: the same git, here and anywhere.
        return dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")

    def files_agent(self, pod_pid, listen="127.0.0.1:0", netns=None):
        """siphon-agent targeted at `pod_pid`: (process, endpoint)."""
        agent = self.procs.start(
            [self.agent_bin, "--listen", listen, "--token-file", self.token_file,
             "--first-client-timeout", "0", "--log-level", "warn", "targeted", "--pid", pod_pid],
            netns=netns, stdout=subprocess.PIPE, text=True)
        m = re.search(r"listen=(\S+)", agent.stdout.readline())
        if not m:
            raise RuntimeError("siphon-agent: no ready line")
        return agent, m.group(1)

    def mount(self):
        """`siphon fs mount` (layer-protocol/fuse/), each repetition a new
        mount (the kernel's FUSE caches cold):
          - a sequential read of a big file through the mount against a local
            read of the same file and `siphon fs cat`;
          - find + stat of 10,000 files in 100 directories, over loopback and
            over an emulated 20 ms RTT link (bench/linkemu), in round trips;
          - random 4 KiB reads (fio, 4 jobs) of the big file, every block
            once through a new mount (each read crosses the mount), then the
            same for a while from the kernel's cache, against local reads;
          - `git status` of a 5,000-file repository, on a new mount and
            again, against git status of the same repository locally."""
        if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
            log("no /dev/fuse or fusermount3: mount scenarios skipped")
            return
        have_fio = shutil.which("fio") is not None
        if not have_fio:
            log("no fio: the random-read rows are skipped (scripts/bench.sh installs it)")
        root, big, mib = self.mount_root()
        repo = os.path.join(root, "data", "repo")
        mnt = os.path.join(self.tmp, "mnt")
        os.makedirs(mnt)
        with ExitStack() as group:
            pod = self.procs.start(["chroot", root, "/bin/busybox", "sleep", "3600"],
                                   netns=self.pod)
            group.callback(self.procs.stop, pod)
            # The loopback agent, the mounts and the readers in this machine's
            # own network and mount namespaces (`ip netns exec` would give each
            # its own mount namespace, where the others do not see the mount).
            agent, endpoint = self.files_agent(pod.pid)
            group.callback(self.procs.stop, agent)
            # Across the link: the agent in the far namespace (`ip netns exec`
            # is fine for it), the mount in the near one through `nsenter
            # --net`, which keeps this mount namespace, so find here sees it.
            link = self.emulated_link(group, delay_ms=10)
            far_agent, far_endpoint = self.files_agent(pod.pid, f"{link.far_ip}:0", link.far)
            group.callback(self.procs.stop, far_agent)
            rtt = (link.rtt_ms or 20.0) / 1000

            def mounted(body, agent_endpoint=endpoint, netns=None):
                argv = [self.cli_bin, "--agent", agent_endpoint, "--token-file",
                        self.token_file, "fs", "mount", mnt, "--ro"]
                if netns:
                    argv = ["nsenter", f"--net=/run/netns/{netns}"] + argv
                p = self.procs.start(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    deadline = time.time() + 10
                    while not os.path.ismount(mnt):
                        if p.poll() is not None:
                            raise RuntimeError("siphon fs mount exited")
                        if time.time() > deadline:
                            raise RuntimeError("siphon fs mount: not mounted after 10 s")
                        time.sleep(0.02)
                    return body()
                finally:
                    self.procs.stop(p)
                    sh("fusermount3", "-uz", mnt, check=False)

            def timed(argv):
                t0 = time.perf_counter()
                sh(*argv, timeout=600)
                return time.perf_counter() - t0

            def fio(path, timed_run):
                """fio randread, 4 jobs, each over its own quarter of the
                file: IOPS. One pass (each 4 KiB block read once), or for
                half the scenario time. --invalidate=0: nothing dropped
                from the page cache before the job."""
                quarter = f"{mib // 4}M"
                argv = ["fio", "--name=r", "--rw=randread", "--bs=4k", "--numjobs=4",
                        f"--filename={path}", f"--size={quarter}",
                        f"--offset_increment={quarter}", "--invalidate=0", "--group_reporting",
                        "--output-format=json"]
                if timed_run:
                    argv += ["--time_based", f"--runtime={max(1, self.secs // 2)}"]
                job = json.loads(sh(*argv, timeout=600).stdout)["jobs"][0]
                if job["error"] or not job["read"]["total_ios"]:
                    raise RuntimeError(f"fio {path}: error {job['error']}, "
                                       f"{job['read']['total_ios']} reads")
                return job["read"]["iops"]

            def git_status(path):
                """Seconds for `git status` in `path`, which must be clean."""
                t0 = time.perf_counter()
                r = subprocess.run(["git", "-C", path, "status"], env=self.git_env(),
                                   capture_output=True, text=True, timeout=600)
                seconds = time.perf_counter() - t0
                if r.returncode != 0 or "nothing to commit" not in r.stdout:
                    raise RuntimeError(f"git status in {path}: {r.returncode} {r.stdout[-500:]} "
                                       f"{r.stderr[-500:]}")
                return seconds

            size_mb = mib * 1048576 / 1e6
            dd = lambda path: ["dd", f"if={path}", "of=/dev/null", "bs=1M", "status=none"]
            find_argv = ["sh", "-c", 'find "$0" -printf "%s %m\\n" >/dev/null',
                         mnt + "/data/tree"]
            read = {"siphon": [], "local": [], "fscat": [], "fuse": []}
            ceiling_bin = os.path.join(self.build, "bench", "fuse_ceiling")

            def ceiling_read():
                """MB/s of the same dd through bench/fuse_ceiling: a FUSE file
                system that does no work (the file in its memory), mounted
                like siphon's, new each time. FUSE's own cost on this machine."""
                p = self.procs.start([ceiling_bin, mnt, "--size-mib", str(mib)],
                                     stdout=subprocess.PIPE, text=True)
                try:
                    if p.stdout.readline().strip() != "mounted":
                        raise RuntimeError("fuse_ceiling: not mounted")
                    # The readahead siphon's mount sets itself: four reads.
                    dev = os.stat(mnt).st_dev
                    with open(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb",
                              "w") as knob:
                        knob.write(str(4 * 1044480 // 1024))
                    return size_mb / timed(dd(mnt + "/big.bin"))
                finally:
                    self.procs.stop(p)
                    sh("fusermount3", "-uz", mnt, check=False)
            find = {"siphon": []}
            wan = []  # seconds for the find across the link
            wan_git = []  # seconds for git status across the link, new mount
            cold = {"siphon": []}
            warm = {"siphon": []}
            fio_local = []  # the baseline of both: local reads from the page cache
            git = {"siphon": [], "local": []}
            git_again = {"siphon": [], "local": []}
            mnt_big, mnt_repo = mnt + "/data/big.bin", mnt + "/data/repo"

            def fio_mounted():
                return fio(mnt_big, False), fio(mnt_big, True)

            def git_mounted():
                return git_status(mnt_repo), git_status(mnt_repo)

            with open(big, "rb") as f:  # the local file in the page cache
                while f.read(1 << 20):
                    pass
            git_status(repo)  # the local repository's index and files cached
            for rep in range(self.reps):
                read["siphon"].append(size_mb / mounted(lambda: timed(dd(mnt_big))))
                if os.path.exists(ceiling_bin):
                    read["fuse"].append(ceiling_read())
                read["local"].append(size_mb / timed(dd(big)))
                read["fscat"].append(size_mb / timed(
                    ["sh", "-c", '"$0" --agent "$1" --token-file "$2" fs cat /data/big.bin '
                     '>/dev/null', self.cli_bin, endpoint, self.token_file]))
                find["siphon"].append(10100 / mounted(lambda: timed(find_argv)))
                wan.append(mounted(lambda: timed(find_argv), far_endpoint, link.near))
                log(f"mount rep {rep + 1}/{self.reps}: find over the link {wan[-1]:.2f} s "
                    f"({wan[-1] / rtt / 100:.2f} round trips per directory)")
                wan_git.append(mounted(lambda: git_status(mnt_repo), far_endpoint, link.near))
                log(f"mount rep {rep + 1}/{self.reps}: git status over the link "
                    f"{wan_git[-1]:.2f} s ({wan_git[-1] / rtt:.0f} round trips)")
                if have_fio:
                    c, w = mounted(fio_mounted)
                    cold["siphon"].append(c)
                    warm["siphon"].append(w)
                    # One local pass over the file takes a few milliseconds:
                    # the time-based run is the steadier baseline, and the
                    # same thing (every read a page-cache hit).
                    fio_local.append(fio(big, True))
                    log(f"mount rep {rep + 1}/{self.reps}: fio IOPS cold {c:.0f}, warm {w:.0f}, "
                        f"local {fio_local[-1]:.0f}")
                first, again = mounted(git_mounted)
                git["siphon"].append(first * 1000)
                git_again["siphon"].append(again * 1000)
                git["local"].append(git_status(repo) * 1000)
                git_again["local"].append(git_status(repo) * 1000)
            self.record(f"fs mount: sequential read of a {mib} MiB file (dd bs=1M)", "MB/s",
                        {k: summary(v) for k, v in read.items() if v},
                        {"local": 0.3, "fscat": 0.8, **({"fuse": None} if read["fuse"] else {})},
                        {"note": "fuse: bench/fuse_ceiling, FUSE doing no work, "
                                 f"{summary(read['fuse'])['median']:.0f} MB/s"}
                        if read["fuse"] else None)
            self.record("fs mount: find + stat of 10,000 files in 100 directories", "entries/s",
                        {"siphon": summary(find["siphon"])}, {"absolute_min": 20000})
            rtt_note = f"ping RTT {rtt * 1000:.2f} ms"
            self.record("fs mount, 20 ms RTT link (bench/linkemu): find + stat of 10,000 files in "
                        "100 dirs", "entries/s", {"siphon": summary([10100 / s for s in wan])}, {},
                        {"rtt_ms": rtt * 1000, "note": rtt_note})
            per_file = summary([s / rtt / 10000 for s in wan])
            self.record("fs mount, 20 ms RTT link: that find's round trips per directory (time / "
                        "RTT / 100)", "round trips",
                        {"siphon": summary([s / rtt / 100 for s in wan])}, {"absolute_max": 1.5},
                        {"rtt_ms": rtt * 1000, "round_trips_per_file": per_file,
                         "note": f"per file {per_file['median']:.4f}"})
            self.record("fs mount, 20 ms RTT link: git status of the 5,000-file repository (52 "
                        "directories), new mount", "round trips",
                        {"siphon": summary([s / rtt for s in wan_git])}, {},
                        {"rtt_ms": rtt * 1000, "seconds": summary(wan_git),
                         "note": f"time / RTT; {summary(wan_git)['median']:.2f} s"})
            if have_fio:
                local = {"local": summary(fio_local)}
                self.record(f"fs mount: random 4 KiB reads, cold (fio, 4 jobs, each block of a "
                            f"{mib} MiB file once, new mount)", "IOPS",
                            {"siphon": summary(cold["siphon"]), **local}, {"local": None})
                self.record(f"fs mount: random 4 KiB reads, warm (the same fio for "
                            f"{max(1, self.secs // 2)} s after: the kernel's cache)", "IOPS",
                            {"siphon": summary(warm["siphon"]), **local}, {"local": None})
            times = "ratio: the mount's time / local time"
            self.record("fs mount: git status of a 5,000-file repository, new mount", "ms",
                        {k: summary(v) for k, v in git.items()}, {"local": None}, {"note": times})
            self.record("fs mount: git status again on the same mount (within --attr-timeout)",
                        "ms", {k: summary(v) for k, v in git_again.items()}, {"local": None},
                        {"note": times})


def _pb_field(number, payload):
    """A length-delimited protobuf field (wire type 2)."""
    def varint(n):
        out = b""
        while True:
            b, n = n & 0x7F, n >> 7
            out += bytes([b | (0x80 if n else 0)])
            if not n:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _frame(body):
    return struct.pack(">I", len(body)) + body


def hello_frame(name, token):
    """Frame{hello: Hello{version{1, 0}, client_name, auth_token}}, encoded
    by hand (proto/siphon/v1): enough for a handshake from Python."""
    version = b"\x08\x01"  # major = 1 (minor 0 is the default)
    hello = _pb_field(1, version) + _pb_field(2, name.encode()) + _pb_field(3, token.encode())
    return _frame(_pb_field(2, hello))


def goaway_frame():
    return _frame(_pb_field(8, b"\x08\x15"))  # Goaway{code: CANCELLED (21)}


class Misbehavers:
    """The misbehaving clients of tests/privileged/isolation, as load:
    garbage before and after a handshake, handshakes held half-sent,
    connect/disconnect churn (plain, clean Goaway, cut), until stop()."""

    def __init__(self, port, token):
        self.port, self.token = port, token
        self.stop_flag = threading.Event()
        self.rounds = 0
        self.stalled = []
        self.threads = [threading.Thread(target=self.garbage, daemon=True),
                        threading.Thread(target=self.churn, daemon=True)]

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        s.settimeout(10)
        return s

    @staticmethod
    def drain(s):
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
        s.close()

    def garbage(self):
        payloads = [b"GET / HTTP/1.1\r\nHost: agent\r\n\r\n",
                    struct.pack(">I", 0xFFFFFFF0) + b"xxxx",
                    struct.pack(">I", 16) + b"\xff" * 16]
        while not self.stop_flag.is_set():
            self.rounds += 1
            for p in payloads:
                try:
                    s = self.connect()
                    s.sendall(p)
                    self.drain(s)
                except OSError:
                    pass
            try:
                s = self.connect()
                s.sendall(hello_frame("garbage", self.token))
                s.recv(65536)  # the Welcome
                s.sendall(struct.pack(">I", 0x7FFFFFFF))
                self.drain(s)
            except OSError:
                pass
            time.sleep(0.02)

    def churn(self):
        n = 0
        while not self.stop_flag.is_set():
            n += 1
            try:
                s = self.connect()
                if n % 3:
                    s.sendall(hello_frame("churn", self.token))
                    s.recv(65536)
                    if n % 3 == 1:
                        s.sendall(goaway_frame())
                s.close()
            except OSError:
                pass
            time.sleep(0.005)

    def start(self):
        for _ in range(8):
            s = self.connect()
            s.sendall(struct.pack(">I", 100)[:2])
            self.stalled.append(s)
        for t in self.threads:
            t.start()

    def stop(self):
        self.stop_flag.set()
        for t in self.threads:
            t.join()
        for s in self.stalled:
            s.close()


def markdown(results, meta):
    lines = [f"Measured {meta['date']} on {meta['machine']}, `{meta['command']}`.", "",
             "| scenario | siphon | direct / baseline | peer | ratios (target) |",
             "|---|---|---|---|---|"]
    for r in results:
        m = r["measured"]

        def cell(k):
            if k not in m:
                return "—"
            v = m[k]
            return f"{v['median']:.3g} ({v['min']:.3g}–{v['max']:.3g})"
        base = next((k for k in ("direct", "baseline", "local", "forward", "pod", "session", "rtt")
                     if k in m),
                    "baseline")
        checks = "; ".join(
            (f"{c['ratio']}× {c['vs']} ({c['want']})" if "ratio" in c else f"{c['want']}") +
            ("" if c["ok"] is None else " ✓" if c["ok"] else " ✗") for c in r["checks"])
        extra = ""
        if "p99_ms" in r:
            extra = " p99 ms: " + ", ".join(f"{k} {v['median']:.2f}" for k, v in r["p99_ms"].items())
        if "cli_rss_mib" in r:
            extra = f" CLI RSS {r['cli_rss_mib']} MiB"
        if "costs" in r:
            c = {k: v["median"] for k, v in r["costs"].items()}
            extra += (f" CPU per GB copied: agent {c['agent_cpu_s_per_gb']:.2f} s, CLI "
                      f"{c['cli_cpu_s_per_gb']:.2f} s; per 1000 packets: agent "
                      f"{c['agent_cpu_ms_per_1000_packets']:.1f} ms, CLI "
                      f"{c['cli_cpu_ms_per_1000_packets']:.1f} ms")
        if "note" in r:
            extra += f" ({r['note']})"
        lines.append(f"| {r['scenario']} ({r['unit']}){extra} | {cell('siphon')} | {cell(base)} | "
                     f"{cell('peer')} | {checks} |")
    lines.append("")
    lines.append("Each cell: median (min–max) of the repetitions. ✓ target met, ✗ missed.")
    for failure in meta.get("failed", []):
        lines.append(f"\nFAILED (not measured): {failure}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "latest.json"))
    ap.add_argument("--only", default="", help="comma-separated scenario groups")
    ap.add_argument("--links", default="",
                    help="the links group's links, RTT_MS:LOSS_PERCENT,... (default: all four)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (network namespaces, BPF, iptables)")
    # The load generators and baselines (scripts/bench.sh installs them): a
    # missing one is named now, not found as a failed scenario minutes in.
    missing = [t for t in ("ip", "ss", "iptables", "iperf3", "wrk", "h2load", "nginx", "socat")
               if shutil.which(t) is None]
    if missing:
        sys.exit(f"bench: not installed: {' '.join(missing)} "
                 "(scripts/bench.sh installs them; or apt-get install iperf3 wrk "
                 "nghttp2-client nginx-light socat iproute2 iptables)")
    for path in ("agent/siphon-agent", "layer-protocol/cli/siphon"):
        if not os.access(os.path.join(args.build, path), os.X_OK):
            sys.exit(f"bench: no {path} in {args.build}: build it first "
                     "(scripts/bench.sh builds build-release/)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    groups = [g for g in args.only.split(",") if g] or [
        "bulk", "bulk8", "http", "short", "filtered", "idle", "forward", "startup", "rss",
        "services", "mirror", "isolation", "mount", "exec", "handover", "links", "kube",
        "workloads"]
    with ExitStack() as stack:
        procs = Procs()
        stack.callback(procs.close)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        b = Bench(args, stack, procs)
        b.setup()
        runs = [
            ("bulk", lambda: b.bulk(1, {"direct": 0.5, "peer": 1.0},
                                    "steal, one bulk TCP stream (iperf3)")),
            ("bulk8", lambda: b.bulk(8, {"peer": 1.0},
                                     "steal, 8 parallel bulk streams (iperf3 -P 8)")),
            ("http", lambda: b.http(False, {"direct": 0.5, "peer": 3.0},
                                    "steal, HTTP keep-alive, 32 connections, 13-byte body (wrk)")),
            ("short", lambda: b.http(True, {"peer": 2.0},
                                     "steal, new connection per request, 32 concurrent (wrk)")),
            ("filtered", b.filtered),
            ("idle", lambda: b.idle_connections(1000)),
            ("forward", lambda: b.forward_bulk({"peer": 1.0})),
            ("startup", b.startup),
            ("rss", b.idle_rss),
            ("services", b.services),
            ("mirror", b.mirror),
            ("isolation", b.isolation),
            ("mount", b.mount),
            ("exec", b.exec_group),
            ("handover", lambda: Handover(b, log, sh, summary).run()),
            ("links", lambda: Links(b, log, sh, summary).run()),
            ("kube", lambda: Kube(b, log, sh, summary).run()),
            ("workloads", lambda: Workloads(b, log, sh, summary).run()),
        ]
        for group, run in runs:
            if group not in groups:
                continue
            # A group that fails is named at the end; the others still run.
            # Its processes are stopped by its own finally blocks, and any
            # it left are ended here before the next group starts.
            before = list(procs.procs)
            try:
                run()
            except Exception as e:  # noqa: BLE001 - reported below, the run goes on
                log(f"group {group} FAILED: {e}")
                b.failed.append(f"{group}: {e}")
                for p in [p for p in procs.procs if p not in before]:
                    procs.stop(p)
        cpu = ""
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            cpu = m.group(1) if m else "?"
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{os.cpu_count()} cores, {cpu}, kernel {os.uname().release}",
                "command": "scripts/bench.sh" + (" --quick" if args.quick else "")}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": b.results}, f, indent=2)
        meta["failed"] = b.failed
        md = markdown(b.results, meta)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(md)
        print(md)
        if b.failed:
            log("failed: " + "; ".join(b.failed))
            sys.exit(1)


if __name__ == "__main__":
    main()
