"""The `workloads` group of bench/run.py: a session that follows its
workload through a `kubectl drain` (docs/CONTINUITY.md section 9,
bench/README.md "Workloads"), on the local cluster (scripts/local-cluster.sh,
real kubectl), with the agent image from this run's build.

A Deployment of two replicas, one per node, under a steady load to both pod
addresses (tests/kube_cluster/test_kube_workloads.py's load: from a network
namespace on the cluster's bridge, half the requests carrying the filter's
header). Each repetition drains one node twice, the nodes in turn:

  baseline  no session: the drain, its replacement Ready, uncordon
  siphon    `siphon --target deploy/web exec --steal 8080 --filter-header`
            running through the drain

and counts, from the drain's start to 3 s after the replacement is Ready,
the requests that failed (no answer, or not 200), to the pod that stayed and
to the evicted one; for the session, the time from the replacement's Ready
(as the load's pod follower saw it, every 0.3 s) to its first matching
request answered by the developer's program.
"""
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "kube_cluster"))
import test_kube_sessions as ks  # noqa: E402 - the cluster's helpers
import test_kube_workloads as wl  # noqa: E402 - the workload, the load, the program

from kube import Kube  # noqa: E402


class Workloads(Kube):
    def drain_once(self, load, before_names):
        """Drains the node of one pod of `before_names`; (t0, pod that
        stayed, pod evicted, replacement's IP, its Ready time)."""
        pods = {p["metadata"]["name"]: p for p in wl.web_pods()}
        go = pods[sorted(before_names)[0]]
        stay = next(p for n, p in pods.items() if n != go["metadata"]["name"])
        node = go["spec"]["nodeName"]
        t0 = time.time()
        try:
            self.kubectl("drain", node, "--ignore-daemonsets", "--timeout=120s", timeout=180)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                now = [p for p in wl.web_pods() if wl.is_ready(p)
                       and p["metadata"]["name"] not in pods]
                if now:
                    ip = now[0]["status"]["podIP"]
                    while ip not in load.ready_since and time.monotonic() < deadline:
                        time.sleep(0.1)
                    return t0, stay["status"]["podIP"], go["status"]["podIP"], ip, \
                        load.ready_since[ip]
                time.sleep(0.2)
            state = [(p["metadata"]["name"], p["spec"].get("nodeName"), wl.is_ready(p))
                     for p in wl.web_pods()]
            raise RuntimeError(f"no replacement Ready within 120 s after draining {node} "
                               f"(pods before: {sorted(pods)}; now: {state})")
        finally:
            self.kubectl("uncordon", node, check=False)

    def failures(self, load, t0, t_ready, stay_ip, go_ip):
        time.sleep(3)
        recs = [r for r in load.records() if t0 <= r["t"] <= t_ready + 3]
        return (len(recs), sum(1 for r in recs if r["ip"] == stay_ip and not r["ok"]),
                sum(1 for r in recs if r["ip"] == go_ip and not r["ok"]))

    def settle(self):
        """Two Ready pods, one per node (a drain's replacement lands beside
        the other pod)."""
        for _ in range(4):
            self.kubectl("-n", wl.NS, "rollout", "status", "deploy/web", "--timeout=120s")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                pods = wl.web_pods()
                if len(pods) == 2 and all(wl.is_ready(p) for p in pods):
                    break
                time.sleep(0.3)
            if len({p["spec"].get("nodeName") for p in wl.web_pods()}) == 2:
                return
            # One of the two deleted: its replacement prefers the node
            # without the other.
            newest = max(wl.web_pods(), key=lambda p: p["metadata"]["creationTimestamp"])
            self.kubectl("-n", wl.NS, "delete", "pod", newest["metadata"]["name"], "--wait=true")
        raise RuntimeError("the two replicas did not spread over the two nodes")

    def run(self):
        was_up, app_image = self.up()
        ks.ENV.update(KUBECONFIG=self.env["KUBECONFIG"], APP_IMAGE=app_image,
                      AGENT_IMAGE=self.image)
        try:
            self.kubectl("create", "namespace", wl.NS, check=False)
            self.kubectl("label", "namespace", wl.NS, "--overwrite",
                         "pod-security.kubernetes.io/enforce=privileged")
            self.kubectl("apply", "-f", "-", input=wl.WEB % {"ns": wl.NS, "image": app_image})
            self.settle()
            self.measure_drains()
        finally:
            self.kubectl("delete", "namespace", wl.NS, "--wait=false", check=False)
            if not was_up:
                subprocess.run([ks.SCRIPT, "down"], capture_output=True, timeout=300)

    def measure_drains(self):
        b = self.b
        tmp = tempfile.mkdtemp(prefix="siphon-bench-workloads.", dir=b.tmp)
        dev = os.path.join(tmp, "dev.py")
        with open(dev, "w") as f:
            f.write(wl.DEV_SERVER)
        load = wl.Load(tmp)
        base_failed, siphon_failed, gaps, totals = [], [], [], []
        try:
            time.sleep(2)
            for rep in range(min(b.reps, 3)):
                names = {p["metadata"]["name"] for p in wl.web_pods()}
                t0, stay, go, _, ready = self.drain_once(load, names)
                n, fs, fg = self.failures(load, t0, ready, stay, go)
                base_failed.append(fs + fg)
                self.settle()
                p = b.procs.start(
                    [b.cli_bin, "--no-config", "--target", "deploy/web", "-n", wl.NS,
                     "--agent-image", self.image, "exec", "--steal", "8080:18080",
                     "--filter-header", wl.FILTER, "--", "/usr/bin/python3", dev, "18080"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, env=self.env)
                try:
                    self.covered(load)
                    names = {x["metadata"]["name"] for x in wl.web_pods()}
                    t0, stay, go, rip, ready = self.drain_once(load, names)
                    deadline = time.monotonic() + 60
                    first = None
                    while first is None and time.monotonic() < deadline:
                        got = [r["t"] for r in load.records() if r["ip"] == rip and r["match"]
                               and r["ok"] and r["body"].startswith("dev ")]
                        first = min(got) if got else None
                        time.sleep(0.2)
                    if first is None:
                        raise RuntimeError("the replacement was never covered")
                    gaps.append(max(0.0, (first - ready) * 1000))
                    n2, fs2, fg2 = self.failures(load, t0, ready, stay, go)
                    siphon_failed.append(fs2 + fg2)
                    totals.append((n, fs, fg, n2, fs2, fg2))
                finally:
                    b.procs.stop(p, signal.SIGINT, timeout=120)
                self.settle()
                self.log(f"workloads rep {rep + 1}: baseline {base_failed[-1]} failed of "
                         f"{n}; siphon {siphon_failed[-1]} failed of {n2}, replacement "
                         f"covered {gaps[-1]:.0f} ms after Ready")
        finally:
            load.close()
        detail = "; ".join(f"baseline {a} requests ({b_} failed on the pod that stayed, {c} on "
                           f"the evicted one), siphon {d} ({e}, {f})"
                           for a, b_, c, d, e, f in totals)
        b.record("workloads: requests failed through a `kubectl drain` of one of two replicas",
                 "requests", {"siphon": self.summary(siphon_failed),
                              "baseline": self.summary(base_failed)},
                 {},  # no ratio: the baseline's count is often 0
                 {"note": "load to both pod addresses, half with the filter's header, from the "
                          "drain to 3 s after the replacement is Ready; baseline: the same "
                          f"drain without a session. {detail}"})
        b.record("workloads: a drained pod's replacement, from Ready to its first stolen request",
                 "ms", {"siphon": self.summary(gaps)}, {},
                 {"note": "Ready as the load's follower saw it (polled every 0.3 s); most of it "
                          "is the new agent's start (the Job scheduled, its ready line) and one "
                          "round of the load (about 50 ms)"})

    def covered(self, load):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            since = time.time() - 1.5
            ips = [p["status"]["podIP"] for p in wl.web_pods() if wl.is_ready(p)]
            if ips and all(any(r["ip"] == ip and r["match"] and r["t"] >= since and r["ok"]
                               and r["body"].startswith("dev ") for r in load.records())
                           for ip in ips):
                return
            time.sleep(0.3)
        raise RuntimeError("the session never covered both pods")
