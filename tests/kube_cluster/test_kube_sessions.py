#!/usr/bin/env python3
"""`siphon --target` against the local cluster (scripts/local-cluster.sh, real
kubectl): the scenarios of issue 41 end to end (docs/KUBERNETES.md).

From a fresh cluster: exec, env, fs, fs mount, steal and mirror by target;
each failure's line
(a namespace whose Pod Security level the agent cannot meet, a forbidden
user, an image that does not exist, a wrong container); a port-forward killed
mid-download resumes byte-exact; two sessions share one agent; Ctrl-C leaves
no Job, pod or Secret; a killed CLI's agent ends after its timeouts; the
config file drives a session; `kubectl siphon` works.

Root only; exits 77 (ctest's skip) with the reason when it cannot run (no
root, no scripts/local-cluster.sh in this tree: $SIPHON_LOCAL_CLUSTER_SCRIPT
names another). One `up` for the suite, `down` at the end unless the cluster
was up before.

  test_kube_sessions.py --siphon BIN [unittest args...]
"""

import argparse
import hashlib
import http.server
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.environ.get("SIPHON_LOCAL_CLUSTER_SCRIPT",
                        os.path.join(REPO, "scripts", "local-cluster.sh"))
SKIP = 77
ENV = {}
ARGS = argparse.Namespace(siphon=None)
NS = "kube-sessions"
BASELINE_NS = "kube-sessions-baseline"


def skip(reason):
    print("SKIPPED: " + reason)
    sys.exit(SKIP)


def eventually(fn, what, timeout=90.0, every=0.3):
    """fn()'s first truthy value; the deadline only turns a hang into a failure."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - reported at the deadline
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last})")


def env():
    return dict(os.environ, KUBECONFIG=ENV["KUBECONFIG"])


def kubectl(*args, check=True, input=None):
    p = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=120,
                       env=env(), input=input)
    if check and p.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {p.stderr}")
    return p


def siphon(*args, binary=None, timeout=180, cwd=None, stdin=subprocess.DEVNULL):
    argv = [binary or ARGS.siphon, "--no-config", *args] if cwd is None else \
        [binary or ARGS.siphon, *args]
    return subprocess.run(argv, capture_output=True, timeout=timeout, env=env(), cwd=cwd,
                          stdin=stdin)


def start(*args):
    return subprocess.Popen([ARGS.siphon, "--no-config", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env(), stdin=subprocess.DEVNULL)


def leftovers(ns=NS):
    out = kubectl("get", "jobs,secrets,pods", "-n", ns, "-l",
                  "app.kubernetes.io/managed-by=siphon", "-o", "name").stdout.split()
    # A pod of a removed Job may still be terminating for a moment.
    return [o for o in out if o]


def web_pod():
    pods = json.loads(kubectl("get", "pods", "-n", NS, "-l", "app=web", "-o", "json").stdout)
    ready = sorted((p["metadata"]["creationTimestamp"], p["metadata"]["name"], p)
                   for p in pods["items"]
                   if any(c["type"] == "Ready" and c["status"] == "True"
                          for c in p["status"].get("conditions", [])))
    return ready[0][2]


class Output:
    """A running process's stdout or stderr, read without blocking: what it
    wrote so far."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.data = b""
        os.set_blocking(pipe.fileno(), False)

    def read(self):
        try:
            chunk = self.pipe.read()
        except (BlockingIOError, ValueError):  # nothing yet; closed by communicate()
            chunk = None
        self.data += chunk or b""
        return self.data.decode(errors="replace")

    def line(self, prefix):
        return next((x for x in self.read().splitlines() if x.startswith(prefix)), None)


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
      containers:
      - name: app
        image: %(image)s
        # 16 MiB to download: more than the sockets on the way hold, so a
        # port-forward killed after the first bytes is killed mid-transfer.
        command: ["/bin/busybox", "sh", "-c", "mkdir -p /tmp/www && /bin/busybox dd
          if=/dev/urandom of=/tmp/www/big bs=1048576 count=16 2>/dev/null && exec
          /bin/busybox httpd -f -p 8080 -h /tmp/www"]
        env: [{name: SIPHON_TEST_COLOR, value: blue}]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"""


class KubeSessionsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for ns, level in ((NS, "privileged"), (BASELINE_NS, "baseline")):
            kubectl("create", "namespace", ns, check=False)
            kubectl("label", "namespace", ns, "--overwrite",
                    f"pod-security.kubernetes.io/enforce={level}")
        kubectl("apply", "-f", "-", input=WEB % {"ns": NS, "image": ENV["APP_IMAGE"]})
        kubectl("-n", NS, "rollout", "status", "deploy/web", "--timeout=120s")

    @classmethod
    def tearDownClass(cls):
        for ns in (NS, BASELINE_NS):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)

    def target(self, *args):
        return ["--target", "deploy/web", "-n", NS, "--agent-image", ENV["AGENT_IMAGE"], *args]

    def assertClean(self):
        eventually(lambda: not leftovers(), "no Job, pod or Secret of siphon's left")

    def test_exec_env_and_fs_by_target(self):
        pod = web_pod()["metadata"]["name"]
        # No --local-dns: the pods here have no /etc/resolv.conf, which exec
        # takes as the resolver's defaults (issue 40).
        r = siphon(*self.target("exec", "--", "/bin/sh", "-c",
                                 "hostname; echo $SIPHON_TEST_COLOR"))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertEqual(r.stdout.decode().split(), [pod, "blue"], r.stderr.decode())
        err = r.stderr.decode()
        self.assertIn(f"siphon: target deployment/web: pod {pod} (2 of 2 Ready), container app",
                      err)
        self.assertIn("siphon: agent ready after ", err)
        self.assertIn("siphon: removed agent siphon-agent-", err)
        r = siphon(*self.target("env"))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn("SIPHON_TEST_COLOR=blue", r.stdout.decode())
        r = siphon(*self.target("fs", "ls", "/tmp/www"))
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn("big", r.stdout.decode())
        self.assertClean()

    def test_steal_by_target(self):
        pod = web_pod()
        ip = pod["status"]["podIP"]

        class Here(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = b"stolen by the test\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Here)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        p = start("--target", f"pod/{pod['metadata']['name']}", "-n", NS, "--agent-image",
                  ENV["AGENT_IMAGE"], "steal", "-p", "8080", "--to",
                  f"127.0.0.1:{server.server_address[1]}")
        # The client is the other pod: connections from this machine come
        # from the node's address, which the agent never steals (--probe-source
        # $(NODE_IP): the kubelet's probes).
        pods = json.loads(kubectl("get", "pods", "-n", NS, "-l", "app=web", "-o",
                                  "json").stdout)["items"]
        other = next(x["metadata"]["name"] for x in pods
                     if x["metadata"]["name"] != pod["metadata"]["name"])
        try:
            def stolen():
                r = kubectl("exec", "-n", NS, other, "--", "/bin/busybox", "wget", "-q", "-O-",
                            f"http://{ip}:8080/", check=False)
                return "stolen by the test" in r.stdout
            eventually(stolen, "the pod's port 8080 answered from this machine")
        finally:
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
            server.shutdown()
            server.server_close()
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertClean()

    def test_mirror_by_target(self):
        pod = web_pod()
        ip = pod["status"]["podIP"]
        path = f"/mirrored-{secrets.token_hex(4)}"
        p = start("--target", f"pod/{pod['metadata']['name']}", "-n", NS, "--agent-image",
                  ENV["AGENT_IMAGE"], "mirror", "-p", "8080", "--stdout")
        out, err = Output(p.stdout), Output(p.stderr)
        pods = json.loads(kubectl("get", "pods", "-n", NS, "-l", "app=web", "-o",
                                  "json").stdout)["items"]
        other = next(x["metadata"]["name"] for x in pods
                     if x["metadata"]["name"] != pod["metadata"]["name"])
        try:
            eventually(lambda: err.line("mirror: port 8080"), "the mirror's line")

            def mirrored():
                # From the other pod: the application answers (its 404 for
                # a file it has not), and the mirror prints the request.
                r = kubectl("exec", "-n", NS, other, "--", "/bin/busybox", "wget", "-q", "-O-",
                            f"http://{ip}:8080{path}", check=False)
                self.assertIn("404", r.stderr, "the application did not answer")
                return f"GET {path} HTTP/1.1" in out.read()
            eventually(mirrored, "the request copied to the mirror's stdout")
        finally:
            p.send_signal(signal.SIGINT)
            _, rest = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err.read() + rest.decode())
        self.assertIn(">>> #", out.read())
        self.assertClean()

    def test_fs_mount_by_target(self):
        pod = web_pod()["metadata"]["name"]
        want = kubectl("exec", "-n", NS, pod, "--", "/bin/busybox", "sha256sum",
                       "/tmp/www/big").stdout.split()[0]
        d = tempfile.mkdtemp(prefix="siphon-kube-mount.")
        # Files written through the mount: an agent that serves them rw
        # (--agent-fs-mode; the default is read-only).
        p = start(*self.target("--agent-fs-mode", "rw", "fs", "mount", d))
        out, err = Output(p.stdout), Output(p.stderr)
        try:
            line = eventually(lambda: out.line("mounted "), "the mounted line")
            self.assertIn(f" at {d} (rw, agent kube:{NS}/siphon-agent-", line)
            # The deployment's pod: its 16 MiB file read through the mount.
            with open(os.path.join(d, "tmp/www/big"), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), want)
            # Written through the mount, read in the pod.
            with open(os.path.join(d, "tmp/www/from-the-mount"), "w") as f:
                f.write("written through siphon fs mount\n")
            r = kubectl("exec", "-n", NS, pod, "--", "/bin/busybox", "cat",
                        "/tmp/www/from-the-mount")
            self.assertEqual(r.stdout, "written through siphon fs mount\n")
            os.unlink(os.path.join(d, "tmp/www/from-the-mount"))
        finally:
            p.send_signal(signal.SIGINT)
            _, rest = p.communicate(timeout=120)
            if os.path.ismount(d):
                subprocess.run(["fusermount3", "-u", "-z", d], check=False)
            os.rmdir(d)
        self.assertEqual(p.returncode, 0, err.read() + rest.decode())
        self.assertIn("siphon: removed agent siphon-agent-", err.read() + rest.decode())
        self.assertClean()

    def test_each_failure_is_one_line(self):
        cases = [
            (["--target", "deploy/web", "-n", NS, "--agent-namespace", BASELINE_NS],
             f'siphon: namespace {BASELINE_NS} enforces Pod Security "baseline"; the agent (job) '
             'needs "privileged"'),
            (["--context", "siphon-local-restricted", "--target", "deploy/web", "-n", NS],
             "siphon: forbidden: you may not "),
            (["--target", "deploy/web", "-n", NS, "--agent-image", "docker.io/siphon/none:0"],
             "siphon: the agent image docker.io/siphon/none:0 cannot be pulled on "),
            (["--target", "deploy/web", "-n", NS, "--container", "api"],
             "has no container 'api'; its containers: app"),
        ]
        for args, line in cases:
            if "--agent-image" not in args:
                args = args + ["--agent-image", ENV["AGENT_IMAGE"]]
            t0 = time.monotonic()
            r = siphon(*args, "info")
            err = r.stderr.decode()
            self.assertEqual(r.returncode, 1, err)
            self.assertIn(line, err)
            self.assertEqual(err.count(line), 1, err)
            # Within seconds, never only at the start timeout (2 min).
            self.assertLess(time.monotonic() - t0, 60, err)
        self.assertClean()

    def test_a_killed_port_forward_resumes_byte_exact(self):
        pod = web_pod()["metadata"]["name"]
        whole = siphon("--target", f"pod/{pod}", "-n", NS, "--agent-image", ENV["AGENT_IMAGE"],
                       "fs", "cat", "/tmp/www/big")
        self.assertEqual(whole.returncode, 0, whole.stderr.decode())
        p = start("--target", f"pod/{pod}", "-n", NS, "--agent-image", ENV["AGENT_IMAGE"],
                  "forward", "-L", "0:127.0.0.1:8080")
        try:
            line = eventually(lambda: self._forwarding(p), "the forward's line")
            port = int(line.rsplit(":", 1)[1].split()[0])
            got = b""
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"GET /big HTTP/1.0\r\n\r\n")
                got += s.recv(65536)
                # The session's port-forward dies mid-download.
                for child in self._children(p.pid):
                    with open(f"/proc/{child}/cmdline", "rb") as f:
                        cmdline = f.read()
                    if b"port-forward" in cmdline:
                        os.kill(child, signal.SIGKILL)
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            body = got.split(b"\r\n\r\n", 1)[1]
            self.assertEqual(body, whole.stdout, f"{len(body)} of {len(whole.stdout)} bytes")
        finally:
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)
        self.assertIn("session resumed, nothing lost", err.decode())
        self.assertClean()

    def test_two_sessions_share_one_agent_and_ctrl_c_leaves_nothing(self):
        p = start(*self.target("forward", "-L", "0:127.0.0.1:8080"))
        try:
            eventually(lambda: self._forwarding(p), "the first session")
            r = siphon(*self.target("info"))
            err = r.stderr.decode()
            self.assertEqual(r.returncode, 0, err)
            self.assertIn("siphon: reusing the running agent siphon-agent-", err)
            self.assertIn(b"sessions          2", r.stdout)
            # One agent per Ready pod of the two-replica deployment, shared.
            self.assertEqual(len(kubectl("get", "jobs", "-n", NS, "-o", "name").stdout.split()), 2)

        finally:
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err.decode())
        self.assertIn("siphon: removed agent siphon-agent-", err.decode())
        self.assertClean()

    def test_a_killed_clis_agent_ends_after_its_timeouts(self):
        p = start(*self.target("--agent-idle-timeout", "2s", "forward", "-L",
                               "0:127.0.0.1:8080"))
        eventually(lambda: self._forwarding(p), "the session")
        p.kill()
        p.communicate(timeout=30)

        def ended():
            pods = json.loads(kubectl("get", "pods", "-n", NS, "-l",
                                      "app.kubernetes.io/managed-by=siphon", "-o",
                                      "json").stdout)["items"]
            return all(x["status"].get("phase") in ("Succeeded", "Failed") for x in pods)
        # The session grace (60 s), then the idle timeout (2 s).
        eventually(ended, "the agent to exit by itself", timeout=150)
        r = siphon("agents", "-n", NS, "clean")
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(b"removed " + NS.encode() + b"/siphon-agent-", r.stdout)
        self.assertClean()

    def test_the_config_file_and_kubectl_siphon(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, ".siphon.json"), "w") as f:
                json.dump({"target": "deploy/web", "namespace": NS,
                           "agent-image": ENV["AGENT_IMAGE"],
                           "env": {"include": ["SIPHON_TEST_*"]}}, f)
            os.mkdir(os.path.join(d, "src"))
            plugin = os.path.join(os.path.dirname(ARGS.siphon), "kubectl-siphon")
            path = os.path.dirname(plugin) + os.pathsep + os.environ.get("PATH", "")
            # `kubectl siphon` finds the plugin on PATH.
            r = subprocess.run(["kubectl", "siphon", "env"], capture_output=True, timeout=180,
                               cwd=os.path.join(d, "src"), env=dict(env(), PATH=path))
            self.assertEqual(r.returncode, 0, r.stderr.decode())
            self.assertEqual(r.stdout.decode(), "SIPHON_TEST_COLOR=blue\n")
        self.assertClean()

    @staticmethod
    def _children(pid):
        out = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
        return out

    @staticmethod
    def _forwarding(p):
        # `forward` says where it listens on stderr; read it without blocking.
        os.set_blocking(p.stderr.fileno(), False)
        data = p.stderr.read() or b""
        KubeSessionsTest._seen = getattr(KubeSessionsTest, "_seen", b"") + data
        for line in KubeSessionsTest._seen.decode(errors="replace").splitlines():
            if line.startswith("forwarding "):
                KubeSessionsTest._seen = b""
                return line.split(" -> ")[0]
        return None


def with_cluster(env, argv, before=None, after=None, verbosity=1):
    """Runs the unittest `argv` against the local cluster: skips (77)
    without root or the script, `up` (its KUBECONFIG=... lines into `env`),
    `before()`, the tests, `after()`, and `down` unless it was up before.
    The exit code."""
    if os.geteuid() != 0:
        skip("the local cluster needs root")
    if not os.path.exists(SCRIPT):
        skip(f"no local cluster script at {SCRIPT}")
    status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True, timeout=120)
    was_up = status.returncode == 0 and "Ready" in status.stdout
    up = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, timeout=900)
    if up.returncode != 0:
        print(up.stdout + up.stderr)
        return 1
    for line in up.stdout.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            env[k] = v
    try:
        if before:
            before()
        prog = unittest.main(argv=[sys.argv[0]] + argv, exit=False, verbosity=verbosity)
        return 0 if prog.result.wasSuccessful() else 1
    finally:
        if after:
            after()
        if not was_up:
            subprocess.run([SCRIPT, "down"], timeout=300)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--siphon", required=True)
    a, rest = p.parse_known_args()
    ARGS.siphon = os.path.abspath(a.siphon)
    return with_cluster(ENV, rest)


if __name__ == "__main__":
    sys.exit(main())
