#!/usr/bin/env python3
"""The local cluster (scripts/local-cluster.sh) shows what disrupts a node,
with real kubectl (issue 42, docs/KUBERNETES.md, "Nodes come and go"):

  * a Deployment's two replicas spread one per node (preferred pod
    anti-affinity), and required anti-affinity leaves a third Pending;
  * `kubectl drain NODE --ignore-daemonsets` (no --force, no
    --delete-emptydir-data) evicts the real agent's Job pod
    (images/k8s/agent-job.yaml as it ships, targeting the Deployment's pod)
    and the Deployment's pod, waits (429, retried) while a
    PodDisruptionBudget of the Deployment forbids it and never because of
    the agent; the processes really end; the replacement runs on the other
    node; the evicted Job pod is not replaced (backoffLimit 0, failed 1);
  * `local-cluster.sh node-down`: the node NotReady, its pods not Ready, the
    unreachable NoExecute taint, a pod tolerating it for 3 s deleted and
    replaced elsewhere, one tolerating it for ever still bound; `node-up`:
    the node Ready, the deleted pod gone, the other restarted;
  * a StatefulSet's pod deleted comes back under its name with a new UID.

Root only; exits 77 (ctest's skip) without root or the cluster script. One
`up` for the suite, `down` at the end unless the cluster was up before.

  test_local_cluster_disruptions.py [unittest args...]
"""

import json
import os
import subprocess
import sys
import threading
import time
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_kube_sessions import REPO, SCRIPT, with_cluster  # noqa: E402 (the cluster's helpers)
from test_kube_sessions import eventually as _eventually  # noqa: E402

ENV = {}
NS = "disruptions"
NODE1, NODE2 = "local-node-1", "local-node-2"
AGENT_JOB = "siphon-agent-d1"


def eventually(fn, what, timeout=60.0, every=0.3):
    return _eventually(fn, what, timeout=timeout, every=every)


def kubectl(*args, check=True, input=None, timeout=120):
    p = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, KUBECONFIG=ENV["KUBECONFIG"]), input=input)
    if check and p.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {p.stderr}")
    return p


def apply(obj):
    kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(obj))


def pods(selector):
    out = kubectl("get", "pods", "-n", NS, "-l", selector, "-o", "json").stdout
    return json.loads(out)["items"]


def ready(p):
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (p.get("status") or {}).get("conditions") or [])


def pids_with(marker):
    """Host pids whose command line holds marker (a container's shell)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    out.append(int(d))
        except OSError:
            pass
    return out


def gone(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line for line in f)
    except OSError:
        return True


def loop(marker, on_term):
    """A shell that loops until killed; on_term: its SIGTERM trap."""
    return ["sh", "-c", f"trap '{on_term}' TERM; while true; do sleep 1; done # {marker}"]


def agent_job(session, node, container_id):
    """images/k8s/agent-job.yaml as it ships (its Secret and Job, the
    placeholders filled in): the real agent, targeting container_id."""
    node_uid = kubectl("get", "node", node, "-o", "jsonpath={.metadata.uid}").stdout
    values = {"AGENT_NAMESPACE": NS, "SESSION": session, "NODE_NAME": node,
              "NODE_UID": node_uid, "CONTAINER_ID": container_id,
              "IMAGE": ENV["AGENT_IMAGE"], "TOKEN": "t" * 40}
    with open(os.path.join(REPO, "images", "k8s", "agent-job.yaml")) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace("${%s}" % k, v)
    assert "${" not in "".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    return text


def web_deployment(name, replicas, anti, marker):
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {
                         "metadata": {"labels": {"app": name}},
                         "spec": {"affinity": {"podAntiAffinity": anti},
                                  "terminationGracePeriodSeconds": 5,
                                  "containers": [{
                                      "name": "web", "image": ENV["APP_IMAGE"],
                                      "command": loop(marker, "exit 0"),
                                      "readinessProbe": {
                                          "exec": {"command": ["sh", "-c", "test -e /tmp/ready"]},
                                          "periodSeconds": 1}}]}}}}


def hostname_term(app):
    return {"labelSelector": {"matchLabels": {"app": app}},
            "topologyKey": "kubernetes.io/hostname"}


def make_ready(pod):
    kubectl("exec", "-n", NS, pod["metadata"]["name"], "--", "sh", "-c", ": >/tmp/ready")


class DisruptionsTest(unittest.TestCase):
    def test_1_drain_evicts_the_agent_and_waits_for_the_budget(self):
        t0 = time.monotonic()
        # Whatever fails, the later tests get both nodes back.
        self.addCleanup(kubectl, "uncordon", NODE1, check=False)
        for kind, name in (("deployment", "web"), ("pdb", "web"), ("job", AGENT_JOB),
                           ("secret", "siphon-token-d1")):
            self.addCleanup(kubectl, "delete", kind, "-n", NS, name, "--ignore-not-found",
                            check=False)
        apply(web_deployment("web", 2, {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": hostname_term("web")}]}, "marker-web"))
        running = eventually(lambda: (lambda ps: ps if len(ps) == 2 and all(
            p["status"].get("phase") == "Running" for p in ps) else None)(pods("app=web")),
            "web's 2 pods running")
        by_node = {p["spec"]["nodeName"]: p for p in running}
        self.assertEqual(sorted(by_node), [NODE1, NODE2], "one replica per node")
        make_ready(by_node[NODE1])
        eventually(lambda: any(ready(p) for p in pods("app=web")), "web on node 1 ready")
        # The budget allows no disruption while only one replica is Ready.
        apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "web"},
               "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
        # The real agent (read-only root, no emptyDir) targeting web on node 1.
        cid = by_node[NODE1]["status"]["containerStatuses"][0]["containerID"]
        self.assertTrue(cid.startswith("containerd://"), cid)
        cid = cid[len("containerd://"):]
        kubectl("apply", "-f", "-", input=agent_job("d1", NODE1, cid))
        agent = eventually(lambda: [p for p in pods(f"job-name={AGENT_JOB}") if ready(p)],
                           "the agent's Job pod ready")[0]
        self.assertEqual(agent["spec"]["nodeName"], NODE1)
        self.assertFalse([v for v in agent["spec"]["volumes"] if "emptyDir" in v])
        self.assertEqual(agent["metadata"]["ownerReferences"][0]["kind"], "Job")
        self.assertTrue(agent["metadata"]["ownerReferences"][0]["controller"])
        agent_pids = eventually(
            lambda: pids_with("targeted\0--container-id\0containerd://" + cid),
            "the agent's process")
        web1_pids = pids_with("marker-web")
        eventually(lambda: kubectl("get", "pdb", "-n", NS, "web", "-o",
                                   "jsonpath={.status.currentHealthy}").stdout == "1",
                   "the budget's status")
        print(f"\n  set-up {time.monotonic() - t0:.1f} s", file=sys.stderr)

        t1 = time.monotonic()
        drain = subprocess.Popen(
            ["kubectl", "drain", NODE1, "--ignore-daemonsets", "--timeout=60s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, KUBECONFIG=ENV["KUBECONFIG"]))
        out = []
        reader = threading.Thread(target=lambda: out.extend(drain.stdout), daemon=True)
        reader.start()
        try:
            # Refused by the budget, retried; the agent's pod is evicted
            # meanwhile (no emptyDir: no --delete-emptydir-data) and the
            # agent ends on its SIGTERM.
            eventually(lambda: any("disruption budget" in line for line in out),
                       "drain retrying on the budget's 429")
            eventually(lambda: not pods(f"job-name={AGENT_JOB}"), "the agent's pod evicted")
            self.assertTrue(all(gone(p) for p in agent_pids), "the agent's processes ended")
            self.assertIsNone(drain.poll(), "drain waits for the budget:\n" + "".join(out))
            web2 = by_node[NODE2]
            make_ready(web2)
            self.assertEqual(drain.wait(timeout=60), 0, "".join(out))
        finally:
            if drain.poll() is None:
                drain.kill()
            reader.join(5)
        text = "".join(out)
        self.assertIn("evicted", text)
        self.assertNotIn("--force", text)
        self.assertNotIn("--delete-emptydir-data", text)
        print(f"  drain {time.monotonic() - t1:.1f} s", file=sys.stderr)
        # One shell per web pod: the evicted one's ended, the other's runs.
        self.assertEqual(len(web1_pids), 2)
        self.assertEqual(sum(1 for p in web1_pids if gone(p)), 1, "web's evicted pod ended")
        # The replacement on node 2; no new agent pod (backoffLimit 0).
        new = eventually(lambda: [p for p in pods("app=web") if p["metadata"]["uid"] not in
                                  {by_node[NODE1]["metadata"]["uid"], web2["metadata"]["uid"]}
                                  and p["status"].get("phase") == "Running"],
                         "web's replacement running")[0]
        self.assertEqual(new["spec"]["nodeName"], NODE2)
        make_ready(new)
        eventually(lambda: all(ready(p) for p in pods("app=web")) and len(pods("app=web")) == 2,
                   "both web pods Ready on node 2")
        job = json.loads(kubectl("get", "job", "-n", NS, AGENT_JOB, "-o", "json").stdout)
        self.assertEqual(job["status"].get("failed"), 1)
        self.assertFalse(pods(f"job-name={AGENT_JOB}"), "no new agent pod on the drained node")
        kubectl("uncordon", NODE1)
        kubectl("delete", "pdb", "-n", NS, "web")
        kubectl("delete", "deployment", "-n", NS, "web")

    def test_2_required_anti_affinity(self):
        t0 = time.monotonic()
        apply(web_deployment("solo", 3, {"requiredDuringSchedulingIgnoredDuringExecution": [
            hostname_term("solo")]}, "marker-solo"))

        def spread():
            ps = pods("app=solo")
            bound = sorted(p["spec"].get("nodeName") or "" for p in ps)
            return ps if len(ps) == 3 and bound == ["", NODE1, NODE2] else None
        ps = eventually(spread, "two solo pods on distinct nodes, one pending")
        pending = next(p for p in ps if not p["spec"].get("nodeName"))
        msg = eventually(lambda: kubectl(
            "get", "pod", "-n", NS, pending["metadata"]["name"], "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}").stdout,
            "the pending pod's reason")
        self.assertIn("didn't match pod anti-affinity rules", msg)
        kubectl("delete", "deployment", "-n", NS, "solo")
        print(f"\n  anti-affinity {time.monotonic() - t0:.1f} s", file=sys.stderr)

    def test_3_node_down_and_up(self):
        t0 = time.monotonic()
        unreachable = {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                       "effect": "NoExecute"}
        lost = web_deployment("lost", 1, {}, "marker-lost")
        spec = lost["spec"]["template"]["spec"]
        spec["nodeSelector"] = {"kubernetes.io/hostname": NODE2}
        spec["tolerations"] = [dict(unreachable, tolerationSeconds=3)]
        apply(lost)
        apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stay"},
               "spec": {"nodeName": NODE2, "tolerations": [unreachable],
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "c", "image": ENV["APP_IMAGE"],
                                        "command": loop("marker-stay", "exit 0")}]}})
        old = eventually(lambda: [p for p in pods("app=lost")
                                  if p["status"].get("phase") == "Running"], "lost running")[0]
        eventually(lambda: kubectl("get", "pod", "-n", NS, "stay", "-o",
                                   "jsonpath={.status.phase}").stdout == "Running", "stay running")
        stay_pids = eventually(lambda: pids_with("marker-stay"), "stay's process")
        lost_pids = pids_with("marker-lost")

        r = subprocess.run([SCRIPT, "node-down", NODE2], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(all(gone(p) for p in stay_pids + lost_pids), "containers killed")
        node = json.loads(kubectl("get", "node", NODE2, "-o", "json").stdout)
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        self.assertEqual(conds["Ready"], "Unknown")
        self.assertIn({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                      [{k: t[k] for k in ("key", "effect")} for t in node["spec"]["taints"]])
        self.assertIn("NotReady", kubectl("get", "node", NODE2).stdout)
        stay = json.loads(kubectl("get", "pod", "-n", NS, "stay", "-o", "json").stdout)
        self.assertFalse(ready(stay))
        # Tolerated for 3 s: deleted (Terminating: nobody confirms it ended)
        # and replaced on the node that answers.
        eventually(lambda: json.loads(kubectl("get", "pod", "-n", NS, old["metadata"]["name"],
                                              "-o", "json").stdout)["metadata"].get(
            "deletionTimestamp"), "the lost pod marked for deletion", timeout=30)
        kubectl("patch", "deployment", "-n", NS, "lost", "--type=json", "-p", json.dumps(
            [{"op": "remove", "path": "/spec/template/spec/nodeSelector"}]))
        eventually(lambda: [p for p in pods("app=lost") if p["spec"].get("nodeName") == NODE1
                            and p["status"].get("phase") == "Running"],
                   "lost's replacement running on node 1")
        stay = json.loads(kubectl("get", "pod", "-n", NS, "stay", "-o", "json").stdout)
        self.assertFalse(stay["metadata"].get("deletionTimestamp"), "tolerated for ever: stays")
        print(f"\n  node-down {time.monotonic() - t0:.1f} s", file=sys.stderr)

        t1 = time.monotonic()
        r = subprocess.run([SCRIPT, "node-up", NODE2], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        eventually(lambda: kubectl("get", "pod", "-n", NS, old["metadata"]["name"],
                                   check=False).returncode != 0, "the deleted pod gone")

        def restarted():
            p = json.loads(kubectl("get", "pod", "-n", NS, "stay", "-o", "json").stdout)
            cs = (p["status"].get("containerStatuses") or [{}])[0]
            return cs.get("restartCount", 0) >= 1 and cs.get("ready") and p
        eventually(restarted, "stay restarted and ready")
        node = json.loads(kubectl("get", "node", NODE2, "-o", "json").stdout)
        self.assertFalse([t for t in node["spec"].get("taints") or []
                          if t["key"] == "node.kubernetes.io/unreachable"])
        self.assertIn(" Ready", kubectl("get", "node", NODE2).stdout)
        kubectl("delete", "deployment", "-n", NS, "lost")
        kubectl("delete", "pod", "-n", NS, "stay")
        print(f"  node-up {time.monotonic() - t1:.1f} s", file=sys.stderr)

    def test_4_statefulset_pod_recreated_with_its_name(self):
        t0 = time.monotonic()
        apply({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
               "spec": {"replicas": 1, "serviceName": "db",
                        "selector": {"matchLabels": {"app": "db"}},
                        "template": {"metadata": {"labels": {"app": "db"}},
                                     "spec": {"terminationGracePeriodSeconds": 1,
                                              "containers": [{
                                                  "name": "db", "image": ENV["APP_IMAGE"],
                                                  "command": loop("marker-db", "exit 0")}]}}}})

        def running_uid():
            p = kubectl("get", "pod", "-n", NS, "db-0", "-o", "json", check=False)
            if p.returncode:
                return None
            p = json.loads(p.stdout)
            return p["metadata"]["uid"] if p["status"].get("phase") == "Running" and not \
                p["metadata"].get("deletionTimestamp") else None
        uid = eventually(running_uid, "db-0 running")
        kubectl("delete", "pod", "-n", NS, "db-0", "--wait=false")
        new = eventually(lambda: (lambda u: u if u and u != uid else None)(running_uid()),
                         "db-0 back with a new UID")
        self.assertNotEqual(new, uid)
        kubectl("delete", "statefulset", "-n", NS, "db")
        print(f"\n  statefulset {time.monotonic() - t0:.1f} s", file=sys.stderr)


def main():
    def after():
        kubectl("delete", "namespace", NS, "--wait=false", check=False)
        for n in (NODE1, NODE2):
            kubectl("uncordon", n, check=False)
            subprocess.run([SCRIPT, "node-up", n], capture_output=True, timeout=120)
    return with_cluster(ENV, sys.argv[1:], before=lambda: kubectl("create", "namespace", NS),
                        after=after, verbosity=2)


if __name__ == "__main__":
    sys.exit(main())
