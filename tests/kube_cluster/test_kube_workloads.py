#!/usr/bin/env python3
"""Sessions that follow their workload (issue 42, docs/CONTINUITY.md
"Workloads"), against the local cluster (scripts/local-cluster.sh, real
kubectl):

  * a Deployment of two replicas, one per node, under a steady load to both
    pod addresses (from a network namespace of the test's own on the
    cluster's bridge: the node's own address is never stolen); one
    `siphon exec --steal 8080 --filter-header` session: both pods' matching
    requests reach the developer's program; `kubectl drain` of one node:
    the replacement is covered, the program's PID is the same before and
    after, no request to the pod that stayed failed, and the counts and the
    time without coverage are printed; then a rollout (a new ReplicaSet)
    and a scale from 1 to 3 and back under the same load and session;
  * a single-replica StatefulSet: its pod deleted and recreated under the
    same name; the session waits, says what it waits for, resumes on the
    new pod; a file open through `--fs-remote` that is the same there reads
    on, one that changed answers ESTALE;
  * a node that vanishes (local-cluster.sh node-down): the session moves to
    the other pod.

Root only; exits 77 (ctest's skip) with the reason when it cannot run. One
`up` for the suite, `down` at the end unless the cluster was up before.

  test_kube_workloads.py --siphon BIN [unittest args...]
"""

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_kube_sessions as ks  # noqa: E402  (the cluster's helpers)

NS = "kube-workloads"
BRIDGE = "slc0"
FILTER = "x-siphon-dev: yes"

WEB = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: %(ns)s}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 3
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector: {matchLabels: {app: web}}
      containers:
      - name: app
        image: %(image)s
        command: ["/bin/busybox", "sh", "-c", "mkdir -p /tmp/www && hostname >/tmp/www/who
          && exec /bin/busybox httpd -f -p 8080 -h /tmp/www"]
        env: [{name: ROLL, value: "0"}]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"""

DB = """
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: %(ns)s}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: app
        image: %(image)s
        # /tmp/www/big differs in every pod (its bytes and its time);
        # /tmp/www/same is the same in every pod (its size and its time).
        command: ["/bin/busybox", "sh", "-c", "mkdir -p /tmp/www && /bin/busybox dd
          if=/dev/urandom of=/tmp/www/big bs=1048576 count=2 2>/dev/null && /bin/busybox dd
          if=/dev/zero of=/tmp/www/same bs=1048576 count=2 2>/dev/null && /bin/busybox touch
          -d '2024-01-01 00:00:00' /tmp/www/same && exec /bin/busybox httpd -f -p 8080 -h
          /tmp/www"]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"""

# The developer's program: answers every request with its PID.
DEV_SERVER = r"""
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        body = ("dev %d\n" % os.getpid()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
try:
    http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
except KeyboardInterrupt:  # the session's Ctrl-C
    sys.exit(0)
"""

# The load: every pod address in IPFILE, with and without the filter's
# header, about 20 times a second each; one JSON line per request.
LOAD = r"""
import json, socket, sys, time
ipfile, out = sys.argv[1], open(sys.argv[2], "a", buffering=1)
def get(ip, match):
    t = time.time()
    hdr = "X-Siphon-Dev: yes\r\n" if match else ""
    try:
        s = socket.create_connection((ip, 8080), timeout=2)
        s.sendall(("GET /who HTTP/1.0\r\nHost: x\r\n%s\r\n" % hdr).encode())
        data = b""
        while True:
            c = s.recv(4096)
            if not c:
                break
            data += c
        s.close()
        body = data.split(b"\r\n\r\n", 1)[1].decode(errors="replace").strip() if b"\r\n\r\n" in data else ""
        ok = data.startswith(b"HTTP/1.") and b" 200 " in data.split(b"\r\n", 1)[0]
        return {"t": t, "ip": ip, "match": match, "ok": ok, "body": body}
    except OSError as e:
        return {"t": t, "ip": ip, "match": match, "ok": False, "body": "", "error": str(e)}
while True:
    try:
        ips = [l.strip() for l in open(ipfile) if l.strip()]
    except OSError:
        ips = []
    for ip in ips:
        for match in (True, False):
            out.write(json.dumps(get(ip, match)) + "\n")
    time.sleep(0.05)
"""

# Reads two files through the session's mount before and after the test
# says the pod was replaced (a line on stdin).
READER = r"""
import errno, os, sys
fds = {p: os.open(p, os.O_RDONLY) for p in ("/tmp/www/same", "/tmp/www/big")}
for p, fd in fds.items():
    os.pread(fd, 4096, 0)
print("before ok", flush=True)
sys.stdin.readline()
for p, fd in fds.items():
    try:
        n = len(os.pread(fd, 4096, 1 << 20))
        print("after %s ok %d" % (p, n), flush=True)
    except OSError as e:
        print("after %s %s" % (p, errno.errorcode.get(e.errno, e.errno)), flush=True)
"""


def web_pods(app="web"):
    items = json.loads(ks.kubectl("get", "pods", "-n", NS, "-l", f"app={app}", "-o",
                                  "json").stdout)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def is_ready(p):
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (p.get("status") or {}).get("conditions") or [])


class Load:
    """The load generator in a network namespace of its own on the cluster's
    bridge; the pod addresses it sends to follow the Ready pods."""

    def __init__(self, tmp):
        self.netns = "siphon-wl-" + secrets.token_hex(3)
        self.veth = "swl" + secrets.token_hex(3)
        self.ip = f"10.244.250.{10 + secrets.randbelow(200)}"
        self.ipfile = os.path.join(tmp, "ips")
        self.out = os.path.join(tmp, "load.jsonl")
        self.script = os.path.join(tmp, "load.py")
        with open(self.script, "w") as f:
            f.write(LOAD)
        open(self.ipfile, "w").close()
        for cmd in (["ip", "netns", "add", self.netns],
                    ["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0",
                     "netns", self.netns],
                    ["ip", "link", "set", self.veth, "master", BRIDGE, "up"],
                    ["ip", "-n", self.netns, "addr", "add", f"{self.ip}/16", "dev", "eth0"],
                    ["ip", "-n", self.netns, "link", "set", "eth0", "up"],
                    ["ip", "-n", self.netns, "link", "set", "lo", "up"]):
            subprocess.run(cmd, check=True, capture_output=True)
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{self.netns}", "/usr/bin/python3", self.script,
             self.ipfile, self.out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stop_follow = threading.Event()
        self.ready_since = {}  # ip -> first time seen Ready
        self.follower = threading.Thread(target=self._follow, daemon=True)
        self.follower.start()

    def _follow(self):
        while not self.stop_follow.is_set():
            try:
                ips = []
                for p in web_pods():
                    ip = (p.get("status") or {}).get("podIP")
                    if ip and is_ready(p):
                        ips.append(ip)
                        self.ready_since.setdefault(ip, time.time())
                with open(self.ipfile + ".new", "w") as f:
                    f.write("\n".join(ips) + "\n")
                os.replace(self.ipfile + ".new", self.ipfile)
            except Exception:  # noqa: BLE001 - a kubectl hiccup: next round
                pass
            time.sleep(0.3)

    def records(self):
        with open(self.out) as f:
            return [json.loads(line) for line in f if line.strip()]

    def close(self):
        self.stop_follow.set()
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


class WorkloadsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ks.kubectl("create", "namespace", NS, check=False)
        ks.kubectl("label", "namespace", NS, "--overwrite",
                   "pod-security.kubernetes.io/enforce=privileged")
        for manifest in (WEB, DB):
            ks.kubectl("apply", "-f", "-",
                       input=manifest % {"ns": NS, "image": ks.ENV["APP_IMAGE"]})
        ks.kubectl("-n", NS, "rollout", "status", "deploy/web", "--timeout=120s")
        ks.kubectl("-n", NS, "rollout", "status", "sts/db", "--timeout=120s")

    @classmethod
    def tearDownClass(cls):
        ks.kubectl("delete", "namespace", NS, "--wait=false", check=False)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="siphon-workloads.")

    def session(self, target, *args):
        return subprocess.Popen(
            [ks.ARGS.siphon, "--no-config", "--target", target, "-n", NS, "--agent-image",
             ks.ENV["AGENT_IMAGE"], *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.PIPE, env=ks.env())

    def assertClean(self):
        ks.eventually(lambda: not ks.leftovers(NS), "no Job, pod or Secret of siphon's left")

    def dev_reached(self, load, ip, since):
        return [r for r in load.records()
                if r["ip"] == ip and r["match"] and r["t"] >= since and r["ok"]
                and r["body"].startswith("dev ")]

    def wait_covered(self, load, what, err=None):
        """Every Ready pod's matching requests answered by the program;
        the program's PID. `err`: the session's stderr, told on a failure."""
        def covered():
            since = time.time() - 1.5
            ips = [p["status"]["podIP"] for p in web_pods() if is_ready(p)]
            pids = set()
            for ip in ips:
                got = self.dev_reached(load, ip, since)
                if not got:
                    return None
                pids.add(got[-1]["body"].split()[1])
            return pids if len(pids) == 1 else None
        try:
            pids = ks.eventually(covered, what, timeout=120)
        except AssertionError as e:
            raise AssertionError(f"{e}; the session said:\n{err.read() if err else ''}")
        return pids.pop()

    def test_1_drain_rollout_and_scale_keep_the_program_and_every_pod_covered(self):
        load = Load(self.tmp)
        dev = os.path.join(self.tmp, "dev.py")
        with open(dev, "w") as f:
            f.write(DEV_SERVER)
        p = self.session("deploy/web", "exec", "--steal", "8080:18080", "--filter-header",
                         FILTER, "--", "/usr/bin/python3", dev, "18080")
        err = ks.Output(p.stderr)
        drained = None
        try:
            pid = self.wait_covered(load, "both pods' matching requests at the program", err)
            t_drain = time.time()
            before = {x["metadata"]["name"]: x for x in web_pods()}
            stay = next(iter(before.values()))
            go = next(x for x in before.values() if x is not stay)
            drained = go["spec"]["nodeName"]
            r = ks.kubectl("drain", drained, "--ignore-daemonsets", "--timeout=120s",
                           check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            new_pid = self.wait_covered(load, "the replacement's matching requests", err)
            self.assertEqual(new_pid, pid, "the program was restarted")
            # The replacement: covered how long after it was Ready.
            replacement = [x for x in web_pods() if x["metadata"]["name"] not in before]
            self.assertEqual(len(replacement), 1)
            rip = replacement[0]["status"]["podIP"]
            first = min(x["t"] for x in self.dev_reached(load, rip, 0))
            gap = first - load.ready_since.get(rip, first)
            records = [x for x in load.records() if x["t"] >= t_drain]
            stay_ip = stay["status"]["podIP"]
            stay_failed = [x for x in records if x["ip"] == stay_ip and not x["ok"]]
            go_failed = [x for x in records if x["ip"] == go["status"]["podIP"] and not x["ok"]]
            print(f"\n  drain: {len(records)} requests since, {len(stay_failed)} failed on the "
                  f"pod that stayed, {len(go_failed)} on the evicted one; the replacement "
                  f"covered {gap:.2f} s after it was Ready", file=sys.stderr)
            self.assertEqual(stay_failed, [], "a request to the pod that stayed failed")
            text = err.read()
            self.assertIn("siphon: pod " + replacement[0]["metadata"]["name"], text)
            self.assertIn(" is Ready: covered by agent siphon-agent-", text)
            ks.kubectl("uncordon", drained)
            drained = None

            # A rollout: a new ReplicaSet, every pod replaced.
            ks.kubectl("-n", NS, "set", "env", "deploy/web", "ROLL=1")
            ks.kubectl("-n", NS, "rollout", "status", "deploy/web", "--timeout=120s")
            self.assertEqual(self.wait_covered(load, "the rollout's pods", err), pid)
            # Scale 1 -> 3 -> 1.
            for n in (1, 3, 1):
                ks.kubectl("-n", NS, "scale", "deploy/web", f"--replicas={n}")
                ks.eventually(lambda: len([x for x in web_pods() if is_ready(x)]) == n and
                              len(web_pods()) == n, f"{n} Ready pods")
                self.assertEqual(self.wait_covered(load, f"{n} pods covered", err), pid)
            records = load.records()
            matched = [x for x in records if x["match"]]
            print(f"  {len(records)} requests in all, {len(matched)} matching, "
                  f"{sum(1 for x in matched if x['body'].startswith('dev '))} at the program, "
                  f"{sum(1 for x in records if not x['ok'])} failed", file=sys.stderr)
            # The ones without the header never reached the program.
            self.assertFalse([x for x in records if not x["match"]
                              and x["body"].startswith("dev ")])
        finally:
            if drained:
                ks.kubectl("uncordon", drained, check=False)
            p.send_signal(signal.SIGINT)
            _, rest = p.communicate(timeout=120)
            load.close()
            ks.kubectl("-n", NS, "scale", "deploy/web", "--replicas=2", check=False)
        said = err.read() + rest.decode()
        print("  the session said:\n    " + "\n    ".join(said.splitlines()), file=sys.stderr)
        self.assertEqual(p.returncode, 0, said)
        self.assertClean()

    def test_2_a_single_pod_recreated_under_its_name(self):
        reader = os.path.join(self.tmp, "reader.py")
        with open(reader, "w") as f:
            f.write(READER)
        p = self.session("sts/db", "exec", "--fs-remote", "/tmp/www", "--", "/usr/bin/python3",
                         reader)
        out, err = ks.Output(p.stdout), ks.Output(p.stderr)
        try:
            ks.eventually(lambda: out.line("before ok"), "the reader's first reads", timeout=120)
            old_uid = json.loads(ks.kubectl("get", "pod", "-n", NS, "db-0", "-o",
                                            "json").stdout)["metadata"]["uid"]
            t0 = time.monotonic()
            ks.kubectl("delete", "pod", "-n", NS, "db-0", "--wait=false")
            ks.eventually(lambda: "siphon: no agent to work with" in err.read(),
                          "the waiting line")
            line = ks.eventually(lambda: next((x for x in err.read().splitlines()
                                               if x.startswith("siphon: resumed on pod db-0")),
                                              None), "the resumed line", timeout=120)
            print(f"\n  db-0 deleted: {line} ({time.monotonic() - t0:.1f} s)", file=sys.stderr)
            new_uid = json.loads(ks.kubectl("get", "pod", "-n", NS, "db-0", "-o",
                                            "json").stdout)["metadata"]["uid"]
            self.assertNotEqual(new_uid, old_uid)
            self.assertIn("waiting up to 300.0 s for a Ready pod of statefulset/db", err.read())
            p.stdin.write(b"go\n")
            p.stdin.flush()
            ks.eventually(lambda: out.line("after /tmp/www/big"), "the reader's second reads")
            self.assertEqual(out.line("after /tmp/www/same"), "after /tmp/www/same ok 4096")
            self.assertEqual(out.line("after /tmp/www/big"), "after /tmp/www/big ESTALE")
            p.stdin.close()
            p.stdin = None  # communicate() below must not flush it
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
            _, rest = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err.read() + rest.decode())
        self.assertClean()

    def test_3_a_node_that_vanishes(self):
        p = self.session("deploy/web", "--replicas", "all", "forward", "-L",
                         "0:127.0.0.1:8080")
        err = ks.Output(p.stderr)
        node = None
        try:
            ks.eventually(lambda: err.read().count(" covered by agent ") >= 1,
                          "the other pod covered", timeout=120)
            first = next(x for x in err.read().splitlines()
                         if x.startswith("siphon: target deployment/web: pod "))
            pod = first.split(": pod ")[1].split()[0]
            node = json.loads(ks.kubectl("get", "pod", "-n", NS, pod, "-o",
                                         "json").stdout)["spec"]["nodeName"]
            t0 = time.monotonic()
            r = subprocess.run([ks.SCRIPT, "node-down", node], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            ks.eventually(lambda: "siphon: files, names, env and new outgoing connections now "
                          "go to pod " in err.read(), "the move to the other pod")
            print(f"\n  node {node} down: moved after {time.monotonic() - t0:.1f} s",
                  file=sys.stderr)
        finally:
            if node:
                subprocess.run([ks.SCRIPT, "node-up", node], capture_output=True, timeout=120)
            p.send_signal(signal.SIGINT)
            _, rest = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err.read() + rest.decode())
        ks.kubectl("-n", NS, "rollout", "status", "deploy/web", "--timeout=120s")
        self.assertClean()


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--siphon", required=True)
    args, rest = a.parse_known_args()
    ks.ARGS.siphon = os.path.abspath(args.siphon)
    return ks.with_cluster(ks.ENV, rest)


if __name__ == "__main__":
    sys.exit(main())
