#!/usr/bin/env python3
"""The local cluster (scripts/local-cluster.sh) driven by real kubectl: what
Siphon's Kubernetes client and its scenarios rely on. One cluster for the
whole suite: `up` first, `down` last (and that `down` left nothing). Each
test works in its own namespace.

Root only; exits 77 (ctest's skip) with the reason when it cannot run.
Usage: test_cluster.py [--agent BIN] [unittest args...]
"""

import argparse
import base64
import hashlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "local-cluster.sh")
STATE = os.environ.get("SIPHON_LOCAL_CLUSTER_DIR", "/var/lib/siphon-local-cluster")
SKIP = 77
ENV = {}       # KUBECONFIG, AGENT_IMAGE, APP_IMAGE from `up`
REUSED = [False]


def skip(reason):
    print("SKIPPED: " + reason)
    sys.exit(SKIP)


def eventually(fn, what, timeout=60.0, every=0.2):
    """fn()'s first truthy value; a failure naming `what` at the deadline
    (the deadline only turns a hang into a failure)."""
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
    raise AssertionError("timed out waiting for %s (last error: %s)" % (what, last))


def kubectl(*args, ctx=None, input=None, check=True, timeout=120, env=None):
    argv = ["kubectl"] + (["--context", ctx] if ctx else []) + list(args)
    e = dict(os.environ, KUBECONFIG=ENV["KUBECONFIG"], **(env or {}))
    p = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, env=e)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(argv), p.returncode, p.stdout,
                                                       p.stderr))
    return p


def kjson(*args, **kw):
    return json.loads(kubectl(*(args + ("-o", "json")), **kw).stdout)


def apply(ns, manifest, **kw):
    return kubectl("apply", "-n", ns, "-f", "-", input=manifest, **kw)


class PortForward:
    """`kubectl port-forward` in the background, ready once it prints its
    "Forwarding from" lines; env picks the protocol."""

    def __init__(self, ns, target, ports, env=None):
        self.proc = subprocess.Popen(
            ["kubectl", "-n", ns, "port-forward", target] + ports, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, KUBECONFIG=ENV["KUBECONFIG"], **(env or {})))
        self.out = []
        want = len(ports)
        seen = 0
        deadline = time.monotonic() + 30
        while seen < want and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.out.append(line)
            if line.startswith("Forwarding from 127.0.0.1:"):
                seen += 1
        if seen < want:
            self.close()
            raise AssertionError("port-forward did not start:\n" + "".join(self.out))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stdout:
            self.out.append(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def render(path, values):
    with open(path) as f:
        text = f.read()
    return re.sub(r"\$\{([A-Z_]+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def apiserver_log():
    with open(os.path.join(STATE, "logs", "apiserver.log"), errors="replace") as f:
        return f.read()


class ClusterTest(unittest.TestCase):
    maxDiff = None

    def ns(self, name, labels=None):
        ns = "t-" + name
        kubectl("create", "namespace", ns)
        if labels:
            kubectl("label", "namespace", ns, *["%s=%s" % kv for kv in labels.items()])
        self.addCleanup(kubectl, "delete", "namespace", ns, "--wait=true", "--timeout=90s",
                        check=False, timeout=120)
        return ns

    def web(self, ns, name="web", replicas=2, extra=""):
        apply(ns, """
apiVersion: apps/v1
kind: Deployment
metadata: {name: %(name)s}
spec:
  replicas: %(replicas)d
  selector: {matchLabels: {app: %(name)s}}
  template:
    metadata: {labels: {app: %(name)s}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: web
        image: %(image)s
        command: ["/bin/busybox", "sh", "-c", "mkdir -p /www && /bin/busybox hostname > /www/index.html && echo serving on 8080 && exec /bin/busybox httpd -f -p 8080 -h /www"]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe:
          httpGet: {path: /, port: http}
          periodSeconds: 1
%(extra)s
""" % {"name": name, "replicas": replicas, "image": ENV["APP_IMAGE"], "extra": extra})
        kubectl("-n", ns, "rollout", "status", "deployment/" + name, "--timeout=90s",
                timeout=100)
        return kjson("-n", ns, "get", "pods", "-l", "app=" + name)["items"]

    # -- the API ------------------------------------------------------------------------
    def test_01_nodes_discovery_and_version(self):
        nodes = kjson("get", "nodes")["items"]
        self.assertEqual(len(nodes), 2)
        for n in nodes:
            ready = [c for c in n["status"]["conditions"] if c["type"] == "Ready"]
            self.assertEqual(ready[0]["status"], "True", n["metadata"]["name"])
            self.assertTrue(n["spec"]["podCIDR"])
        v = json.loads(kubectl("version", "-o", "json").stdout)
        self.assertEqual(v["serverVersion"]["minor"], "32")
        res = kubectl("api-resources", "-o", "name").stdout.split()
        for r in ("pods", "deployments.apps", "jobs.batch", "poddisruptionbudgets.policy",
                  "roles.rbac.authorization.k8s.io", "statefulsets.apps"):
            self.assertIn(r, res)

    def test_02_errors_are_status_objects(self):
        ns = self.ns("errors")
        p = kubectl("-n", ns, "get", "pod", "nope", check=False)
        self.assertIn('pods "nope" not found', p.stderr)
        kubectl("-n", ns, "create", "configmap", "c", "--from-literal=a=b")
        p = kubectl("-n", ns, "create", "configmap", "c", "--from-literal=a=b", check=False)
        self.assertIn('configmaps "c" already exists', p.stderr)
        p = apply(ns, """
apiVersion: apps/v1
kind: Deployment
metadata: {name: bad}
spec:
  selector: {matchLabels: {app: one}}
  template:
    metadata: {labels: {app: other}}
    spec: {containers: [{name: c, image: x}]}
""", check=False)
        self.assertIn('The Deployment "bad" is invalid: spec.template.metadata.labels: Invalid '
                      'value: map[string]string{"app":"other"}', p.stderr)
        self.assertIn("`selector` does not match template `labels`", p.stderr)
        # The raw answer is a Status object.
        cfg = json.loads(kubectl("config", "view", "--raw", "-o", "json").stdout)
        server = cfg["clusters"][0]["cluster"]["server"]
        token = [u for u in cfg["users"] if u["name"] == "siphon-local-admin"][0]["user"]["token"]
        ctx = ssl.create_default_context(cadata=base64.b64decode(
            cfg["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
        req = urllib.request.Request(server + "/api/v1/namespaces/%s/pods/nope" % ns,
                                     headers={"Authorization": "Bearer " + token})
        with self.assertRaises(urllib.error.HTTPError) as cm:
            urllib.request.urlopen(req, context=ctx, timeout=10)
        status = json.loads(cm.exception.read())
        self.assertEqual((status["kind"], status["code"], status["reason"]),
                         ("Status", 404, "NotFound"))

    # -- pods -----------------------------------------------------------------------------
    def test_03_deployment_pods_are_reachable_at_their_ips(self):
        ns = self.ns("web")
        pods = self.web(ns)
        self.assertEqual(len(pods), 2)
        for p in pods:
            self.assertIn(p["spec"]["nodeName"], ("local-node-1", "local-node-2"))
            sched = [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"]
            self.assertEqual(sched[0]["status"], "True")
        for p in pods:
            ip = p["status"]["podIP"]
            body = urllib.request.urlopen("http://%s:8080/" % ip, timeout=10).read().decode()
            # Its hostname is its name.
            self.assertEqual(body.strip(), p["metadata"]["name"])
            cs = p["status"]["containerStatuses"][0]
            self.assertTrue(cs["containerID"].startswith("containerd://"))
            self.assertTrue(cs["ready"])
            self.assertIn("serving on 8080",
                          kubectl("-n", ns, "logs", p["metadata"]["name"]).stdout)
        self.assertIn("serving on 8080", kubectl("-n", ns, "logs", "deploy/web").stdout)
        # kubectl exec over both protocols: output, stdin, the exit code.
        for env in ({}, {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}):
            p = kubectl("-n", ns, "exec", "-i", "deploy/web", "--", "/bin/busybox", "sh", "-c",
                        "/bin/busybox hostname; /bin/busybox sha256sum; exit 3",
                        input="from stdin\n", env=env, check=False)
            self.assertEqual(p.returncode, 3, p.stderr)
            self.assertIn(hashlib.sha256(b"from stdin\n").hexdigest(), p.stdout)
            self.assertIn(p.stdout.split()[0], [x["metadata"]["name"] for x in pods])
        # The Table kubectl prints.
        out = kubectl("-n", ns, "get", "pods", "-o", "wide").stdout
        self.assertRegex(out, r"web-\S+\s+1/1\s+Running\s+0\s+\S+\s+10\.")

    def test_04_port_forward_both_protocols_byte_exact(self):
        ns = self.ns("pf")
        apply(ns, """
apiVersion: v1
kind: Pod
metadata: {name: blob}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: %(image)s
    command: ["/bin/busybox", "sh", "-c", "mkdir -p /www && /bin/busybox dd if=/dev/urandom of=/www/blob bs=1M count=4 2>/dev/null && /bin/busybox sha256sum /www/blob && exec /bin/busybox httpd -f -p 8080 -h /www"]
    readinessProbe:
      httpGet: {path: /blob, port: 8080}
      periodSeconds: 1
  - name: sum
    image: %(image)s
    command: ["/bin/busybox", "nc", "-ll", "-p", "9000", "-e", "/bin/busybox", "sha256sum"]
""" % {"image": ENV["APP_IMAGE"]})
        kubectl("-n", ns, "wait", "--for=condition=Ready", "pod/blob", "--timeout=60s")
        want_down = kubectl("-n", ns, "logs", "blob", "-c", "web").stdout.split()[0]
        upload = os.urandom(3 << 20)
        want_up = hashlib.sha256(upload).hexdigest()
        for proto, env, method in (("websocket", {}, "GET"),
                                   ("spdy", {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"},
                                    "POST")):
            before = apiserver_log().count("%s /api/v1/namespaces/%s/pods/blob/portforward" % (
                method, ns))
            p1, p2 = free_port(), free_port()
            pf = PortForward(ns, "pod/blob", ["%d:8080" % p1, "%d:9000" % p2], env)
            try:
                got = urllib.request.urlopen("http://127.0.0.1:%d/blob" % p1,
                                             timeout=30).read()
                self.assertEqual(len(got), 4 << 20, proto)
                self.assertEqual(hashlib.sha256(got).hexdigest(), want_down, proto)
                s = socket.create_connection(("127.0.0.1", p2), timeout=30)
                s.sendall(upload)
                s.shutdown(socket.SHUT_WR)
                answer = b""
                while True:
                    d = s.recv(65536)
                    if not d:
                        break
                    answer += d
                s.close()
                self.assertEqual(answer.decode().split()[0], want_up, proto)
            finally:
                pf.close()
            # The API server logs an upgraded request once it ends.
            eventually(lambda: apiserver_log().count(
                "%s /api/v1/namespaces/%s/pods/blob/portforward" % (method, ns)) > before,
                "the %s port-forward to be a %s in the API server's log" % (proto, method),
                timeout=20)
        # A port nothing listens on: kubectl reports the pod's refusal.
        p1 = free_port()
        pf = PortForward(ns, "pod/blob", ["%d:7999" % p1])
        try:
            with socket.create_connection(("127.0.0.1", p1), timeout=10) as s:
                s.settimeout(10)
                self.assertEqual(s.recv(10), b"")
            eventually(lambda: "connection refused" in "".join(pf.out), "the refusal reported",
                       timeout=10)
        finally:
            pf.close()

    def test_05_drain_honours_the_disruption_budget(self):
        ns = self.ns("drain")
        pods = self.web(ns, replicas=2)
        apply(ns, """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
""")
        eventually(lambda: kjson("-n", ns, "get", "pdb", "web")["status"].get(
            "currentHealthy") == 2, "the budget to count 2 healthy pods")
        node = pods[0]["spec"]["nodeName"]
        self.addCleanup(kubectl, "uncordon", node, check=False)
        drain = subprocess.Popen(
            ["kubectl", "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
             "--force", "--timeout=120s"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env=dict(os.environ, KUBECONFIG=ENV["KUBECONFIG"]))
        out = []
        try:
            # 429 first: the budget allows no disruption.
            for line in drain.stdout:
                out.append(line)
                if "Cannot evict pod as it would violate the pod's disruption budget" in line:
                    break
            self.assertIn("disruption budget", "".join(out))
            self.assertIn("SchedulingDisabled", kubectl("get", "node", node).stdout)
            # A third replica (on the other node) makes room; the drain ends.
            kubectl("-n", ns, "scale", "deployment/web", "--replicas=3")
            rest, _ = drain.communicate(timeout=150)
            out.append(rest)
        finally:
            if drain.poll() is None:
                drain.kill()
                drain.wait()
        self.assertEqual(drain.returncode, 0, "".join(out))
        self.assertIn("node/%s drained" % node, "".join(out))
        left = [p for p in kjson("-n", ns, "get", "pods")["items"]
                if p["spec"].get("nodeName") == node]
        self.assertEqual(left, [])

    # -- the agent's manifests --------------------------------------------------------------
    def test_06_agent_job_and_ephemeral_container_reach_the_target(self):
        ns = self.ns("agent")
        pods = self.web(ns, replicas=1)
        pod = pods[0]
        node = pod["spec"]["nodeName"]
        cid = pod["status"]["containerStatuses"][0]["containerID"]
        node_obj = kjson("get", "node", node)
        values = {"AGENT_NAMESPACE": ns, "SESSION": "t6", "NODE_NAME": node,
                  "NODE_UID": node_obj["metadata"]["uid"],
                  "CONTAINER_ID": cid[len("containerd://"):], "IMAGE": ENV["AGENT_IMAGE"],
                  "TOKEN": os.urandom(32).hex()}
        kubectl("apply", "-f", "-", input=render(
            os.path.join(REPO, "images", "k8s", "agent-job.yaml"), values))
        # The target's pid, as the node's containerd knows it.
        sock = node_obj["metadata"]["annotations"]["local-cluster.siphon.dev/containerd-socket"]
        tasks = subprocess.run(["ctr", "-a", sock, "-n", "k8s.io", "tasks", "ls"],
                               capture_output=True, text=True).stdout
        pid = [l.split()[1] for l in tasks.splitlines() if l.startswith(values["CONTAINER_ID"])]
        self.assertEqual(len(pid), 1, tasks)
        logs = eventually(lambda: (lambda out: out if "siphon-agent ready" in out else None)(
            kubectl("-n", ns, "logs", "job/siphon-agent-t6", check=False).stdout),
            "the agent's ready line", timeout=60)
        self.assertIn("target_pid=%s" % pid[0], logs)
        agent = kjson("-n", ns, "get", "pods", "-l", "siphon.dev/session=t6")["items"][0]
        self.assertEqual(agent["spec"]["nodeName"], node)
        self.assertTrue(agent["status"]["containerStatuses"][0]["ready"])
        # The ephemeral form, through the subresource.
        values.update({"SESSION": "e6", "POD_NAMESPACE": ns, "POD_NAME": pod["metadata"]["name"],
                       "CONTAINER_NAME": "web"})
        kubectl("-n", ns, "create", "secret", "generic", "siphon-token-e6",
                "--from-literal=token=" + values["TOKEN"])
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(render(os.path.join(REPO, "images", "k8s", "ephemeral-patch.yaml"), values))
            f.flush()
            kubectl("-n", ns, "patch", "pod", pod["metadata"]["name"],
                    "--subresource=ephemeralcontainers", "--type=strategic", "--patch-file",
                    f.name)

        def eph_ready():
            out = kubectl("-n", ns, "logs", pod["metadata"]["name"], "-c", "siphon-agent-e6",
                          check=False).stdout
            return out if "siphon-agent ready" in out else None
        logs = eventually(eph_ready, "the ephemeral agent's ready line", timeout=60)
        self.assertIn("target_pid=", logs)
        st = kjson("-n", ns, "get", "pod", pod["metadata"]["name"])["status"]
        self.assertIn("running", st["ephemeralContainerStatuses"][0]["state"])
        # The Job goes with its pod; the Secret, owned by the Node, stays.
        kubectl("-n", ns, "delete", "job", "siphon-agent-t6", "--wait=true", "--timeout=60s")
        eventually(lambda: not kjson("-n", ns, "get", "pods", "-l",
                                     "siphon.dev/session=t6")["items"],
                   "the agent pod to go with its Job")
        kubectl("-n", ns, "get", "secret", "siphon-token-t6")

    def test_07_pod_security_admission(self):
        ns = self.ns("psa", {"pod-security.kubernetes.io/enforce": "baseline"})
        values = {"AGENT_NAMESPACE": ns, "SESSION": "p7", "NODE_NAME": "local-node-1",
                  "NODE_UID": kjson("get", "node", "local-node-1")["metadata"]["uid"],
                  "CONTAINER_ID": "0" * 64, "IMAGE": ENV["AGENT_IMAGE"],
                  "TOKEN": os.urandom(32).hex()}
        kubectl("apply", "-f", "-", input=render(
            os.path.join(REPO, "images", "k8s", "agent-job.yaml"), values))

        def failed_create():
            for e in kjson("-n", ns, "get", "events")["items"]:
                if e["reason"] == "FailedCreate":
                    return e["message"]
        msg = eventually(failed_create, "the Job's FailedCreate event")
        self.assertIn('violates PodSecurity "baseline:latest": host namespaces (hostPID=true)',
                      msg)
        self.assertIn('hostPath volumes (volume "containerd-sock")', msg)
        self.assertIn('"SYS_ADMIN"', msg)
        self.assertEqual(kjson("-n", ns, "get", "pods")["items"], [])
        p = apply(ns, """
apiVersion: v1
kind: Pod
metadata: {name: hostpid}
spec:
  hostPID: true
  containers: [{name: c, image: %s}]
""" % ENV["APP_IMAGE"], check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn('pods "hostpid" is forbidden: violates PodSecurity "baseline:latest": '
                      "host namespaces (hostPID=true)", p.stderr)

    def test_08_restricted_context_is_forbidden_until_a_role_allows(self):
        ns = self.ns("rbac")
        ctx = "siphon-local-restricted"
        self.assertEqual(kubectl("-n", ns, "get", "pods", ctx=ctx).returncode, 0)
        p = kubectl("-n", ns, "create", "secret", "generic", "s", "--from-literal=a=b", ctx=ctx,
                    check=False)
        self.assertIn('secrets is forbidden: User "siphon-restricted" cannot create resource '
                      '"secrets" in API group "" in the namespace "%s"' % ns, p.stderr)
        p = kubectl("-n", ns, "auth", "can-i", "create", "jobs.batch", ctx=ctx, check=False)
        self.assertEqual(p.stdout.strip(), "no")
        apply(ns, """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: secrets-writer}
rules:
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: secrets-writer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: secrets-writer}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: siphon-restricted}
""")
        self.assertEqual(kubectl("-n", ns, "auth", "can-i", "create", "secrets", ctx=ctx,
                                 check=False).stdout.strip(), "yes")
        kubectl("-n", ns, "create", "secret", "generic", "s", "--from-literal=a=b", ctx=ctx)
        # Still nothing elsewhere.
        p = kubectl("-n", "default", "create", "secret", "generic", "s", "--from-literal=a=b",
                    ctx=ctx, check=False)
        self.assertIn("forbidden", p.stderr)

    # -- controllers ------------------------------------------------------------------------
    def test_09_jobs_finish_fail_and_expire(self):
        ns = self.ns("jobs")
        apply(ns, """
apiVersion: batch/v1
kind: Job
metadata: {name: ok}
spec:
  ttlSecondsAfterFinished: 2
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: %(image)s, command: ["/bin/busybox", "true"]}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: fails}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: %(image)s, command: ["/bin/busybox", "sh", "-c", "exit 3"]}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: slow}
spec:
  activeDeadlineSeconds: 2
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers: [{name: c, image: %(image)s, command: ["/bin/busybox", "sleep", "600"]}]
""" % {"image": ENV["APP_IMAGE"]})
        kubectl("-n", ns, "wait", "--for=condition=Complete", "job/ok", "--timeout=60s")
        kubectl("-n", ns, "wait", "--for=condition=Failed", "job/fails", "--timeout=60s")
        kubectl("-n", ns, "wait", "--for=condition=Failed", "job/slow", "--timeout=60s")
        reasons = {c["type"]: c["reason"] for c in kjson("-n", ns, "get", "job", "fails")[
            "status"]["conditions"]}
        self.assertEqual(reasons["Failed"], "BackoffLimitExceeded")
        reasons = {c["type"]: c["reason"] for c in kjson("-n", ns, "get", "job", "slow")[
            "status"]["conditions"]}
        self.assertEqual(reasons["Failed"], "DeadlineExceeded")
        failed = kjson("-n", ns, "get", "pods", "-l", "job-name=fails")["items"]
        self.assertEqual(failed[0]["status"]["containerStatuses"][0]["state"]["terminated"][
            "exitCode"], 3)
        # ttlSecondsAfterFinished removes the finished Job and its pod.
        kubectl("-n", ns, "wait", "--for=delete", "job/ok", "--timeout=60s")

    def test_10_statefulset_ordinals_and_hostnames(self):
        ns = self.ns("sts")
        apply(ns, """
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 2
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: %s
        command: ["/bin/busybox", "sh", "-c", "/bin/busybox hostname; exec /bin/busybox sleep 3600"]
""" % ENV["APP_IMAGE"])
        kubectl("-n", ns, "rollout", "status", "statefulset/db", "--timeout=90s", timeout=100)
        for i in (0, 1):
            self.assertEqual(kubectl("-n", ns, "logs", "db-%d" % i).stdout.strip(),
                             "db-%d" % i)
        kubectl("-n", ns, "label", "pod", "db-0", "checked=yes")
        self.assertEqual(kjson("-n", ns, "get", "pods", "-l", "checked=yes")["items"][0][
            "metadata"]["name"], "db-0")

    def test_11_node_agent_restart_keeps_the_pods(self):
        # A kubelet restart: the containers keep running, the new node agent
        # adopts them (same container IDs), and what happened meanwhile (a
        # deletion) is done once it is back.
        ns = self.ns("restart")
        pods = self.web(ns, replicas=2)
        node = pods[0]["spec"]["nodeName"]
        mine = [p for p in pods if p["spec"]["nodeName"] == node]
        ids = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["containerID"]
               for p in mine}
        pidfile = os.path.join(STATE, "nodes", node, "node.pid")
        with open(pidfile) as f:
            os.kill(int(f.read()), signal.SIGTERM)
        eventually(lambda: subprocess.run([SCRIPT, "status"], capture_output=True, text=True)
                   .stdout.count("agent not running") == 1, "the node agent to stop")
        victim = mine[0]["metadata"]["name"]
        kubectl("-n", ns, "delete", "pod", victim, "--wait=false")
        up = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, timeout=120)
        self.assertEqual(up.returncode, 0, up.stderr)
        kubectl("-n", ns, "wait", "--for=delete", "pod/" + victim, "--timeout=60s")
        kubectl("-n", ns, "rollout", "status", "deployment/web", "--timeout=60s")
        now = {p["metadata"]["name"]: p for p in kjson("-n", ns, "get", "pods")["items"]}
        for name, cid in ids.items():
            if name == victim:
                continue
            self.assertEqual(now[name]["status"]["containerStatuses"][0]["containerID"], cid)
            self.assertEqual(now[name]["status"]["containerStatuses"][0]["restartCount"], 0)
        survivor = [n for n in ids if n != victim]
        target = "pod/" + (survivor[0] if survivor else next(iter(now)))
        port = free_port()
        pf = PortForward(ns, target, ["%d:8080" % port])
        try:
            body = urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=10).read()
            self.assertEqual(body.decode().strip(), target.split("/")[1])
        finally:
            pf.close()

    def test_12_api_server_restart_keeps_objects_and_idle_port_forwards_drop(self):
        # An API server restarted with a short stream idle timeout (the
        # kubelet's streamingConnectionIdleTimeout): the objects survive the
        # restart, and an idle port-forward ends with kubectl's "lost
        # connection to pod", the failure a supervised port-forward must
        # survive.
        ns = self.ns("idle")
        pods = self.web(ns, replicas=1)

        def restart_apiserver(idle):
            with open(os.path.join(STATE, "apiserver.pid")) as f:
                os.kill(int(f.read()), signal.SIGTERM)
            eventually(lambda: "apiserver: not running" in subprocess.run(
                [SCRIPT, "status"], capture_output=True, text=True).stdout,
                "the API server to stop")
            env = dict(os.environ)
            if idle:
                env["SIPHON_LOCAL_CLUSTER_STREAM_IDLE_TIMEOUT"] = str(idle)
            up = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, env=env,
                                timeout=120)
            self.assertEqual(up.returncode, 0, up.stderr)
        restart_apiserver(2)
        self.addCleanup(restart_apiserver, None)
        self.assertEqual(kjson("-n", ns, "get", "pod", pods[0]["metadata"]["name"])[
            "metadata"]["uid"], pods[0]["metadata"]["uid"])
        for env in ({}, {"KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"}):
            port = free_port()
            pf = PortForward(ns, "deployment/web", ["%d:8080" % port], env)
            try:
                body = urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=10).read()
                self.assertEqual(body.decode().strip(), pods[0]["metadata"]["name"])
                pf.proc.wait(30)
                eventually(lambda: "lost connection to pod" in "".join(pf.out),
                           "kubectl's message", timeout=5)
            finally:
                pf.close()

    # -- last: down -------------------------------------------------------------------------
    def test_99_down_leaves_nothing(self):
        if REUSED[0]:
            self.skipTest("the cluster was running before the suite: left up")
        with open(os.path.join(STATE, "apiserver.port")) as f:
            port = f.read().strip()
        p = subprocess.run([SCRIPT, "down"], capture_output=True, text=True, timeout=180)
        self.assertEqual(p.returncode, 0, p.stderr)
        REUSED[0] = True  # nothing left to take down
        self.assertFalse(os.path.exists(STATE))
        leftovers = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open("/proc/%s/cgroup" % pid) as f:
                    cg = f.read()
            except OSError:
                continue
            if STATE in cmd or "/siphon-local-cluster/" in cg:
                leftovers.append(cmd)
        self.assertEqual(leftovers, [])
        with open("/proc/self/mountinfo") as f:
            self.assertNotIn(STATE, f.read())
        netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        self.assertEqual([n for n in netns if n.startswith("slc-")], [])
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        self.assertNotRegex(links, r": (slc0|slcv\w+)[@:]")
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        self.assertNotIn("slc0", routes)
        import glob
        self.assertEqual(glob.glob("/sys/fs/cgroup/siphon-local-cluster") +
                         glob.glob("/sys/fs/cgroup/*/siphon-local-cluster"), [])
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            self.fail("the API server still listens on %s" % port)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", help="the siphon-agent binary for the agent image")
    args, rest = ap.parse_known_args()
    if os.geteuid() != 0:
        skip("the local cluster needs root (containerd, network namespaces, mounts)")
    for tool in ("kubectl", "containerd", "ctr", "runc", "ip"):
        if subprocess.run(["sh", "-c", "command -v " + tool], capture_output=True).returncode:
            skip("%s is not installed" % tool)
    env = dict(os.environ)
    if args.agent:
        env["SIPHON_AGENT_BIN"] = args.agent
    status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True, env=env).stdout
    REUSED[0] = "apiserver: running" in status
    t0 = time.monotonic()
    up = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, env=env, timeout=600)
    if up.returncode != 0:
        print(up.stdout + up.stderr)
        sys.exit(1)
    for line in up.stdout.splitlines():
        k, _, v = line.partition("=")
        if k in ("KUBECONFIG", "AGENT_IMAGE", "APP_IMAGE"):
            ENV[k] = v
    print("up took %.1f s%s" % (time.monotonic() - t0, " (reused)" if REUSED[0] else ""))
    t1 = time.monotonic()
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    print("the suite took %.1f s" % (time.monotonic() - t1))
    if not REUSED[0]:
        subprocess.run([SCRIPT, "down"], capture_output=True, text=True, timeout=180)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
