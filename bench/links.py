"""The `links` group of bench/run.py: Siphon where users are, the agent and
the developer's machine joined by a slow link (bench/README.md, "Over a
link"). For each link (round trip 20 and 50 ms, 200 Mbit/s, a queue of one
bandwidth-delay product, loss 0 and 0.5 %), made by bench/linkemu:

  client ns ── pod ns (nginx :80, iperf3 :5201, :5204)
                  │ (sk_lookup steal, the agent's connections)
  far ns: siphon-agent ══ emulated link ══ near ns: siphon steal / forward /
                                            fs cat, nginx :8090, iperf3 :5301,
                                            :5302, a streaming server :8091

and the limit beside each figure, in the same run: plain TCP (iperf3)
between far and near over the same link.
"""
import json
import os
import signal
import statistics
import subprocess
import time
from contextlib import ExitStack

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "link_probe.py")
PY = "/usr/bin/python3"
RATE_MBIT = 200


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Links:
    def __init__(self, bench, log, sh, summary):
        self.b = bench
        self.log = log
        self.sh = sh
        self.summary = summary

    # ------------------------------------------------------------ helpers
    def probe(self, netns, *args, timeout=120):
        r = self.sh(PY, PROBE, *args, netns=netns, timeout=timeout)
        return json.loads(r.stdout)

    def iperf(self, netns, host, port, reverse=False, seconds=None):
        argv = ["iperf3", "-c", host, "-p", port, "-t", seconds or self.b.secs, "-J"]
        if reverse:
            argv.append("-R")
        data = self.b.iperf_json(argv, netns)
        if "error" in data:
            raise RuntimeError(f"iperf3 {host}:{port}: {data['error']}")
        return data["end"]["sum_received"]["bits_per_second"] / 1e6  # Mbit/s


    def fs_cat(self, link, endpoint, path):
        """`siphon fs cat PATH > /dev/null` in the near namespace: seconds."""
        t0 = time.monotonic()
        r = subprocess.run(["ip", "netns", "exec", link.near, self.b.cli_bin, "--agent", endpoint,
                            "--token-file", self.b.token_file, "fs", "cat", path],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"siphon fs cat {path}: exit {r.returncode}: {r.stderr[-1000:]}")
        return time.monotonic() - t0

    def big_files(self):
        """Files of random bytes for fs cat: 8, 16, 32 and 64 MiB (the agent's
        target is the pod's nginx, whose root is this machine's)."""
        d = os.path.join(self.b.tmp, "links-files")
        os.makedirs(d, exist_ok=True)
        chunk = os.urandom(1 << 20)
        files = {}
        for mib in (8, 16, 32, 64):
            p = os.path.join(d, f"{mib}.bin")
            with open(p, "wb") as f:
                for _ in range(mib):
                    f.write(chunk)
            files[mib] = p
        return files

    # ------------------------------------------------------------ the group
    def run(self):
        b = self.b
        # The pod's second iperf3, for `siphon forward` (5201 is stolen).
        b.procs.start(["iperf3", "-s", "-p", "5204"], netns=b.pod, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
        b.wait_port(b.pod, 5204)
        files = self.big_files()
        links = [(20, 0.0), (50, 0.0), (20, 0.5), (50, 0.5)]
        if b.args.quick:
            links = [(20, 0.0), (50, 0.0), (50, 0.5)]
        if b.args.links:
            links = [(int(r), float(l)) for r, l in
                     (item.split(":") for item in b.args.links.split(","))]
        for rtt_ms, loss in links:
            try:
                self.one_link(rtt_ms, loss, files)
            except Exception as e:  # noqa: BLE001 - one link's failure is reported, the rest run
                self.log(f"links: the {rtt_ms} ms / {loss} % link FAILED: {e}")
                b.failed.append(f"links {rtt_ms} ms {loss} %: {e}")

    def one_link(self, rtt_ms, loss, files):
        b = self.b
        rate = RATE_MBIT * 1_000_000 // 8
        bdp = rate * rtt_ms // 1000
        label = f"{rtt_ms} ms RTT, {RATE_MBIT} Mbit/s, loss {loss} %"
        with ExitStack() as st:
            link = b.emulated_link(st, delay_ms=rtt_ms / 2, rate=str(rate), queue=str(bdp),
                                   loss=loss)
            rtt = link.rtt_ms or float(rtt_ms)
            self.log(f"links: {label}: ping RTT {rtt:.2f} ms (configured {rtt_ms})")
            near_nginx = b.nginx(link.near, 8090, f"near-{link.near}")
            st.callback(b.procs.stop, near_nginx)
            for port in (5301, 5302):
                p = b.procs.start(["iperf3", "-s", "-p", port], netns=link.near,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                st.callback(b.procs.stop, p)
            streamer = b.procs.start([PY, PROBE, "stream", "8091"], netns=link.near,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            st.callback(b.procs.stop, streamer)
            for port in (8090, 5301, 5302, 8091):
                b.wait_port(link.near, port)
            agent, endpoint = b.files_agent(b.pod_pid(), f"{link.far_ip}:0", link.far)
            st.callback(b.procs.stop, agent)
            steal, _ = b.start_cli(endpoint, "links-steal", "stealing port", "steal",
                                   "--port", 5201, "--to", "127.0.0.1:5301",
                                   "--port", 80, "--to", "127.0.0.1:8090",
                                   "--port", 8092, "--to", "127.0.0.1:8091", netns=link.near)
            st.callback(b.procs.stop, steal, signal.SIGINT)
            fwd = b.cli(endpoint, "forward", "-L", "127.0.0.1:17301:127.0.0.1:5204",
                        netns=link.near, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            st.callback(b.procs.stop, fwd, signal.SIGINT)
            b.wait_port(link.near, 17301)

            # Bulk, interleaved per repetition: plain TCP far->near (the
            # direction of each bulk row below), the steal's stream, the
            # forward's download, fs cat of a file that takes about the
            # same time as the others at plain TCP's rate.
            vals = {"plain": [], "steal": [], "forward": [], "fscat": []}
            fscat_mib = None
            for rep in range(b.reps):
                vals["plain"].append(self.iperf(link.far, link.near_ip, 5302))
                vals["steal"].append(self.iperf(b.client, b.pod_ip, 5201))
                vals["forward"].append(self.iperf(link.near, "127.0.0.1", 17301, reverse=True))
                if fscat_mib is None:
                    want = vals["plain"][0] / 8 * b.secs  # MB plain TCP moves in one run
                    fscat_mib = max([m for m in files if m <= max(want, 8)])
                secs = self.fs_cat(link, endpoint, files[fscat_mib])
                vals["fscat"].append(fscat_mib * 1.048576 * 8 / secs)  # Mbit/s
                self.log(f"links {label} rep {rep + 1}/{b.reps}: " + ", ".join(
                    f"{k} {v[-1]:.0f}" for k, v in vals.items()) + " Mbit/s")
            plain = self.summary(vals["plain"])
            for key, what, target in (
                    ("steal", "steal, one bulk stream (iperf3)", 0.8),
                    ("forward", "outgoing (siphon forward), one bulk stream (iperf3 -R)", 0.8),
                    ("fscat", f"files: siphon fs cat of {fscat_mib} MiB", 0.7)):
                b.record(f"link {label}: {what}", "Mbit/s",
                         {"siphon": self.summary(vals[key]), "baseline": plain},
                         {"baseline": target}, {"note": "baseline: plain TCP over the link"})

            # One request on a new stolen connection, and on a kept-alive one
            # after 5 s of silence: in round trips of the link.
            count = 10 if b.args.quick else 20
            new = self.probe(b.client, "new", b.pod_ip, 80, count)["ms"]
            idle_n = 2 if b.args.quick else 4
            idle = self.probe(b.client, "idle", b.pod_ip, 80, idle_n, 5,
                              timeout=60 + 6 * idle_n)["ms"]
            # For comparison, the same two straight over the link (a new
            # connection costs its handshake's round trip there).
            plain_new = self.probe(link.far, "new", link.near_ip, 8090, count)["ms"]
            plain_idle = self.probe(link.far, "idle", link.near_ip, 8090, idle_n, 5,
                                    timeout=60 + 6 * idle_n)["ms"]
            limit = rtt + 5
            for what, ms, plain_ms, plain_what in (
                    ("one HTTP request on a new stolen connection", new, plain_new,
                     "a new plain connection"),
                    ("one HTTP request on a stolen keep-alive connection after 5 s idle", idle,
                     plain_idle, "a plain keep-alive connection after 5 s idle")):
                b.record(f"link {label}: {what}", "ms",
                         {"siphon": self.summary(ms), "rtt": self.summary([rtt]),
                          "plain": self.summary(plain_ms)},
                         {"absolute_max": round(limit, 1)},
                         {"note": f"round trips: {statistics.median(ms) / rtt:.2f}; limit "
                                  f"1 RTT + 5 ms; {plain_what} over the link: "
                                  f"{statistics.median(plain_ms) / rtt:.2f} RTT"})

            # Small requests while one bulk download fills the link: through
            # the steal (the bulk stream stolen too, one session), and
            # straight over the link beside a plain bulk stream.
            small = {}
            for mode in ("plain", "siphon"):
                if mode == "siphon":
                    bulk = b.procs.start(["iperf3", "-c", b.pod_ip, "-p", 5201, "-R", "-t",
                                          b.secs + 3], netns=b.client,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    host, port, ns = b.pod_ip, 80, b.client
                else:
                    bulk = b.procs.start(["iperf3", "-c", link.near_ip, "-p", 5302, "-R", "-t",
                                          b.secs + 3], netns=link.far,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    host, port, ns = link.near_ip, 8090, link.far
                try:
                    # The bulk stream past its start-up: over the 50 ms link
                    # BBR's start-up on the session's connection (its first
                    # bulk that way) lasts about 2.5 s here, with up to a
                    # round trip of queue (bench/README.md).
                    time.sleep(3)
                    small[mode] = self.probe(ns, "small", host, port, b.secs, 20,
                                             timeout=b.secs + 120)["ms"]
                finally:
                    b.procs.stop(bulk, timeout=b.secs + 10)
            p95 = {m: pct(v, 0.95) for m, v in small.items()}
            b.record(f"link {label}: small HTTP requests beside a bulk download, p95", "ms",
                     {"siphon": self.summary([p95["siphon"]]),
                      "baseline": self.summary([p95["plain"]])},
                     {"baseline_max": 1.5},
                     {"note": f"medians siphon {statistics.median(small['siphon']):.1f}, plain "
                              f"{statistics.median(small['plain']):.1f} ms; "
                              f"{len(small['siphon'])} and {len(small['plain'])} requests; "
                              "baseline: beside plain TCP"})

            # A cut of the transport (ss -K of the CLI's connection in the
            # near namespace) in the middle of a steady stolen stream: the
            # longest silence the client sees.
            if rtt_ms == 50 and loss == 0:
                reader = b.procs.start([PY, PROBE, "gap", b.pod_ip, 8092, 6], netns=b.client,
                                       stdout=subprocess.PIPE, text=True)
                time.sleep(2.5)
                self.sh("ss", "-K", "-t", "state", "established", "dst", link.far_ip,
                        netns=link.near)
                out, _ = reader.communicate(timeout=60)
                result = json.loads(out)
                silence = result["longest_ms"]
                b.record(f"link {label}: stolen stream's silence across a transport cut", "ms",
                         {"siphon": self.summary([silence]), "rtt": self.summary([rtt])},
                         {"absolute_max": round(3 * rtt + 100, 1)},
                         {"note": f"at {result['at_s']:.2f} s of 6; limit 3 RTT + 100 ms"})
