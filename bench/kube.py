"""The `kube` group of bench/run.py: a Kubernetes session from the command
line to its exit (docs/KUBERNETES.md, bench/README.md "Kubernetes"), on the
local cluster (scripts/local-cluster.sh, real kubectl), with its agent image
built from this run's build (SIPHON_AGENT_BIN=BUILD/agent/siphon-agent).

  siphon --target deploy/web exec -- true, start to exit:
    cold      no agent runs: the session resolves the target, creates the
              agent's Secret and Job, waits for its ready line, reaches it
              through a port-forward, runs `true`, removes the Job and Secret
              (the image is present on the node)
    warm      another session on the same target holds its agent: the
              session finds it and reuses it (and leaves it)
    baseline  the same warm agent, reached by hand: a `kubectl port-forward`
              started beforehand, the token read from the agent's Secret,
              `siphon --agent 127.0.0.1:PORT --token-file F exec -- true`

Each repetition: one cold run (no agent of the target runs), then the holder
session starts (its agent is the warm one), the hand-made port-forward to
that agent, and three warm and three baseline runs interleaved (their
medians); then the holder ends and its agent goes before the next
repetition. Beside the times, each run's phase lines are timestamped as
they come on stderr, so the record says where a cold start spends its time.
"""
import base64
import json
import os
import re
import signal
import statistics
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "local-cluster.sh")
NS = "siphon-bench-kube"
INNER = 3  # warm and baseline runs per repetition (their median)

WEB = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: %(ns)s}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: %(image)s
        command: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/tmp"]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
"""

# The phase lines of a session (docs/KUBERNETES.md, "While it starts"), in
# the order they come: the name each is reported under.
PHASES = [
    ("siphon: resolving ", "resolving"),
    ("siphon: target ", "resolved"),
    ("siphon: reusing the running agent ", "reused"),
    ("siphon: creating agent ", "creating"),
    ("siphon: scheduled on ", "scheduled"),
    ("siphon: agent started after ", "started"),
    ("siphon: agent ready after ", "ready"),
    ("siphon: removed agent ", "removed"),
]


class Kube:
    def __init__(self, bench, log, sh, summary):
        self.b = bench
        self.log = log
        self.sh = sh
        self.summary = summary
        self.env = None
        self.image = None

    # ------------------------------------------------------------ helpers
    def kubectl(self, *args, check=True, input=None, timeout=120):
        r = subprocess.run(["kubectl", *map(str, args)], capture_output=True, text=True,
                           env=self.env, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(map(str, args))}: {r.stderr.strip()}")
        return r

    def target(self):
        return [self.b.cli_bin, "--no-config", "--target", "deploy/web", "-n", NS,
                "--agent-image", self.image]

    def timed(self, argv):
        """Runs a siphon command to its exit: (ms from start to exit, {phase:
        ms from start}, stderr). Its stderr is read line by line as it comes,
        each phase line timestamped."""
        phases = {}
        lines = []
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=self.env)

        def read():
            for line in p.stderr:
                at = (time.perf_counter() - t0) * 1000
                lines.append(line)
                for prefix, name in PHASES:
                    if line.startswith(prefix) and name not in phases:
                        phases[name] = at

        reader = threading.Thread(target=read)
        reader.start()
        try:
            rc = p.wait(timeout=300)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            reader.join()
        ms = (time.perf_counter() - t0) * 1000
        if rc != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {rc}: {''.join(lines)[-2000:]}")
        return ms, phases, "".join(lines)

    def agents(self):
        return json.loads(self.kubectl("get", "pods", "-n", NS, "-l",
                                       "app.kubernetes.io/managed-by=siphon", "-o",
                                       "json").stdout)["items"]

    def wait_no_agent(self, timeout=120):
        """Until no agent pod, Job or Secret of siphon's is left in the
        namespace (the last session removed them; its pod takes a moment to
        go)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.kubectl("get", "jobs,secrets,pods", "-n", NS, "-l",
                               "app.kubernetes.io/managed-by=siphon", "-o", "name").stdout
            if not out.split():
                return
            time.sleep(0.3)
        raise RuntimeError(f"siphon's objects still in {NS} after {timeout} s: {out}")

    def hand_forward(self, stack_procs):
        """The baseline's transport, made by hand as a user would: the
        agent's pod and port from its labels and annotations, its token from
        its Secret, a `kubectl port-forward` to it. (address, token file)."""
        pods = [p for p in self.agents() if p["status"].get("phase") == "Running"
                and "deletionTimestamp" not in p["metadata"]]
        if len(pods) != 1:
            raise RuntimeError(f"expected one running agent in {NS}, found {len(pods)}")
        meta = pods[0]["metadata"]
        ann = meta.get("annotations", {})
        secret = ann["siphon.dev/token-secret"]
        port = ann.get("siphon.dev/port", "7140")
        data = self.kubectl("get", "secret", secret, "-n", NS, "-o",
                            "jsonpath={.data.token}").stdout
        token_file = os.path.join(self.b.tmp, "kube-token")
        with open(token_file, "wb") as f:
            f.write(base64.b64decode(data))
        os.chmod(token_file, 0o600)
        pf = stack_procs.start(["kubectl", "port-forward", "-n", NS, f"pod/{meta['name']}",
                                f":{port}", "--address", "127.0.0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env=self.env)
        line = pf.stdout.readline()
        m = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) ", line)
        if not m:
            raise RuntimeError(f"kubectl port-forward: {line!r}")
        # Its stdout ("Handling connection for ...", one per dial) read on,
        # so that kubectl never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in pf.stdout], daemon=True).start()
        return pf, f"127.0.0.1:{m.group(1)}", token_file

    def start_holder(self):
        """A session that holds the target's agent (it creates it): `siphon
        --target deploy/web forward`, until it is stopped."""
        p = self.b.procs.start([*self.target(), "forward", "-L", "0:127.0.0.1:8080"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=self.env)
        seen = []
        for line in p.stderr:
            seen.append(line)
            if line.startswith("forwarding "):
                break
        else:
            raise RuntimeError(f"the holder session ended: {''.join(seen)[-2000:]}")
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        return p

    # ---------------------------------------------------------------- run
    def up(self):
        status = subprocess.run([SCRIPT, "status"], capture_output=True, text=True, timeout=120)
        was_up = status.returncode == 0 and "Ready" in status.stdout
        # The agent image from this run's build (local-cluster.sh builds it
        # from SIPHON_AGENT_BIN and imports it into both nodes when it
        # changed).
        up = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, timeout=900,
                            env=dict(os.environ, SIPHON_AGENT_BIN=self.b.agent_bin))
        if up.returncode != 0:
            raise RuntimeError(f"local-cluster.sh up: {up.stderr[-2000:]}")
        values = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        self.env = dict(os.environ, KUBECONFIG=values["KUBECONFIG"])
        self.image = values["AGENT_IMAGE"]
        return was_up, values["APP_IMAGE"]

    def run(self):
        if not os.path.exists(SCRIPT):
            raise RuntimeError(f"no {SCRIPT}")
        was_up, app_image = self.up()
        try:
            self.kubectl("create", "namespace", NS, check=False)
            self.kubectl("label", "namespace", NS, "--overwrite",
                         "pod-security.kubernetes.io/enforce=privileged")
            self.kubectl("apply", "-f", "-", input=WEB % {"ns": NS, "image": app_image})
            self.kubectl("-n", NS, "rollout", "status", "deploy/web", "--timeout=120s")
            self.measure()
        finally:
            self.kubectl("delete", "namespace", NS, "--wait=false", check=False)
            if not was_up:
                subprocess.run([SCRIPT, "down"], capture_output=True, timeout=300)

    def measure(self):
        b = self.b
        exec_true = ["exec", "--", "true"]
        # One cold session first, not counted: the node's first container of
        # the agent image unpacks its snapshot.
        self.timed([*self.target(), *exec_true])
        self.wait_no_agent()
        cold, warm, hand = [], [], []
        cold_phases, warm_phases = [], []
        for rep in range(b.reps):
            ms, phases, err = self.timed([*self.target(), *exec_true])
            if "removed agent" not in err:
                raise RuntimeError(f"the cold session did not remove its agent: {err[-2000:]}")
            cold.append(ms)
            cold_phases.append(dict(phases, exit=ms))
            self.wait_no_agent()
            holder = self.start_holder()
            pf = None
            try:
                pf, address, token_file = self.hand_forward(b.procs)
                w, h = [], []
                for _ in range(INNER):
                    ms, phases, err = self.timed([*self.target(), *exec_true])
                    if "reusing the running agent" not in err:
                        raise RuntimeError(f"the warm session did not reuse: {err[-2000:]}")
                    w.append(ms)
                    warm_phases.append(dict(phases, exit=ms))
                    ms, _, _ = self.timed([b.cli_bin, "--no-config", "--agent", address,
                                           "--token-file", token_file, *exec_true])
                    h.append(ms)
                warm.append(statistics.median(w))
                hand.append(statistics.median(h))
            finally:
                if pf is not None:
                    b.procs.stop(pf)
                b.procs.stop(holder, signal.SIGINT, timeout=120)
            self.wait_no_agent()
            self.log(f"kube rep {rep + 1}/{b.reps}: cold {cold[-1]:.0f} ms, warm {warm[-1]:.0f} "
                     f"ms, by hand (--agent through kubectl port-forward) {hand[-1]:.0f} ms")

        def at(runs, name):
            values = [r[name] for r in runs if name in r]
            return statistics.median(values) if values else float("nan")

        cold_note = ("each run creates its agent (Job + Secret) and removes it; phases, median "
                     "ms from start: target resolved {:.0f}, creating {:.0f}, scheduled {:.0f}, "
                     "container started {:.0f}, ready line {:.0f}, agent removed {:.0f}, exit "
                     "{:.0f}").format(*(at(cold_phases, k) for k in (
                         "resolved", "creating", "scheduled", "started", "ready", "removed",
                         "exit")))
        warm_note = ("another session holds the agent, reused; phases, median ms from start: "
                     "target resolved {:.0f}, reusing {:.0f}, exit {:.0f}").format(
                         *(at(warm_phases, k) for k in ("resolved", "reused", "exit")))
        baseline = ("baseline: `siphon --agent` through a hand-made kubectl port-forward to the "
                    "warm agent (token from its Secret)")
        b.record("kube: `siphon --target deploy/web exec -- true`, cold agent, start to exit",
                 "ms", {"siphon": self.summary(cold), "baseline": self.summary(hand)},
                 {"baseline": None}, {"note": f"{cold_note}; {baseline}"})
        b.record("kube: `siphon --target deploy/web exec -- true`, warm agent, start to exit",
                 "ms", {"siphon": self.summary(warm), "baseline": self.summary(hand)},
                 {"baseline": None}, {"note": f"{warm_note}; {baseline}"})
