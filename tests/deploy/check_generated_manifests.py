#!/usr/bin/env python3
"""What `siphon --target` creates, held to images/k8s/ (issue 41).

The client builds the agent's Job, Secret and ephemeral patch itself
(layer-protocol/kube/agent_manifest.cc) "from the same content as"
images/k8s/agent-job.yaml and ephemeral-patch.yaml. This test makes that
true and keeps it true: tests/unit/kube/manifest_dump writes what the client
would create for fixed inputs, and

  * check_manifests.py (with the agent's own --help) accepts it;
  * every setting that gives the agent its powers or bounds them is the same
    as in the YAML files with their placeholders filled (securityContext of
    pod and container, host namespaces, tolerations, resources, volumes and
    where they are mounted, env, the Job's limits), and the arguments are
    the same flags, the pod template's annotations (safe-to-evict) and
    labels (only Siphon's); the only differences are the documented ones (listening
    on the pod's loopback, the idle timeout, the Job's TTL, labels and
    annotations naming the target, the Secret owned by the Job);
  * images/k8s/rbac.yaml grants every `kubectl auth can-i` the client asks.

  check_generated_manifests.py --dump BIN --agent BIN
"""

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
K8S = os.path.join(HERE, "..", "..", "images", "k8s")
CHECKER = os.path.join(HERE, "check_manifests.py")
ARGS = argparse.Namespace(dump=None, agent=None)


def load_docs(path, values=None):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if values is not None:
        text = re.sub(r"\$\{([A-Z_]+)\}", lambda m: values.get(m.group(1), m.group(0)), text)
    return [d for d in yaml.safe_load_all(text) if d is not None]


def flags(args):
    """The options of an argument list, with their values ({--flag: value})."""
    out = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out[a] = value
            i += 2 if value is not None else 1
        else:
            out[a] = None  # the mode word
            i += 1
    return out


class GeneratedManifestsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="siphon-generated-")
        subprocess.run([ARGS.dump, cls.tmp.name], check=True, timeout=60)
        with open(os.path.join(cls.tmp.name, "values.json"), encoding="utf-8") as f:
            cls.values = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def generated(self, name):
        return os.path.join(self.tmp.name, name)

    def checker(self, *args):
        return subprocess.run([sys.executable, CHECKER, "--agent", ARGS.agent, *args],
                              capture_output=True, text=True, timeout=120, check=False)

    def test_check_manifests_accepts_them(self):
        r = self.checker(self.generated("job.yaml"), self.generated("ephemeral.yaml"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_the_job_is_agent_job_yaml(self):
        want = {d["kind"]: d for d in load_docs(os.path.join(K8S, "agent-job.yaml"), self.values)}
        got = {d["kind"]: d for d in load_docs(self.generated("job.yaml"))}
        wj, gj = want["Job"], got["Job"]
        self.assertEqual(gj["apiVersion"], wj["apiVersion"])
        for k in ("backoffLimit", "activeDeadlineSeconds"):
            self.assertEqual(gj["spec"][k], wj["spec"][k], k)
        # Documented: finished agents go sooner (docs/KUBERNETES.md).
        self.assertLessEqual(gj["spec"]["ttlSecondsAfterFinished"],
                             wj["spec"]["ttlSecondsAfterFinished"])
        self.assertEqual(gj["metadata"]["ownerReferences"], wj["metadata"]["ownerReferences"])
        for k, v in wj["metadata"]["labels"].items():
            self.assertEqual(gj["metadata"]["labels"].get(k), v, k)
        # What disruption tools read on the pod (issue 42): the template's
        # annotations and labels of the YAML, and only Siphon's labels.
        wt, gt = wj["spec"]["template"]["metadata"], gj["spec"]["template"]["metadata"]
        for k, v in (wt.get("annotations") or {}).items():
            self.assertEqual((gt.get("annotations") or {}).get(k), v, k)
        for k, v in wt["labels"].items():
            self.assertEqual(gt["labels"].get(k), v, k)
        for k in gt["labels"]:
            self.assertTrue(k in ("app.kubernetes.io/name", "app.kubernetes.io/managed-by")
                            or k.startswith("siphon.dev/"), k)
        wp, gp = wj["spec"]["template"]["spec"], gj["spec"]["template"]["spec"]
        self.assertEqual(sorted(gp), sorted(wp), "the pod spec's fields")
        for k in wp:
            if k in ("containers", "volumes"):
                continue
            self.assertEqual(gp[k], wp[k], k)
        wc, gc = wp["containers"][0], gp["containers"][0]
        self.assertEqual(sorted(gc), sorted(wc), "the container's fields")
        for k in ("name", "image", "imagePullPolicy", "env", "ports", "resources",
                  "securityContext"):
            self.assertEqual(gc[k], wc[k], k)
        # Volumes: the same sources at the same paths (names may differ).
        def mounts(pod, c):
            by_name = {v["name"]: {k: v[k] for k in v if k != "name"} for v in pod["volumes"]}
            return sorted((m["mountPath"], m.get("readOnly", False),
                           json.dumps(by_name[m["name"]], sort_keys=True))
                          for m in c["volumeMounts"])
        self.assertEqual(mounts(gp, gc), mounts(wp, wc))
        wf, gf = flags(wc["args"]), flags(gc["args"])
        self.assertEqual(sorted(gf), sorted(wf), "the agent's options")
        for k in wf:
            if k in ("--listen", "--idle-timeout"):
                continue
            self.assertEqual(gf[k], wf[k], k)
        # Documented: only the pod's loopback, where the port-forward reaches it.
        self.assertEqual(gf["--listen"], "127.0.0.1:7140")
        self.assertEqual(wf["--listen"], "0.0.0.0:7140")
        # The Secret: same content, then owned by the Job (patched in).
        ws, gs = want["Secret"], got["Secret"]
        self.assertEqual(gs["type"], ws["type"])
        self.assertEqual(gs["stringData"], ws["stringData"])
        self.assertEqual(gs["metadata"]["ownerReferences"][0]["uid"],
                         ws["metadata"]["ownerReferences"][0]["uid"])

    def test_the_ephemeral_patch_is_ephemeral_patch_yaml(self):
        values = dict(self.values, AGENT_NAMESPACE=self.values["POD_NAMESPACE"])
        want = load_docs(os.path.join(K8S, "ephemeral-patch.yaml"), values)
        got = [d for d in load_docs(self.generated("ephemeral.yaml")) if "spec" in d]
        wc, gc = want[-1]["spec"]["ephemeralContainers"][0], got[0]["spec"]["ephemeralContainers"][0]
        self.assertEqual(sorted(gc), sorted(wc))
        for k in ("name", "image", "imagePullPolicy", "targetContainerName", "env",
                  "securityContext"):
            self.assertEqual(gc[k], wc[k], k)
        wf, gf = flags(wc["args"]), flags(gc["args"])
        self.assertEqual(sorted(gf), sorted(wf))
        for k in wf:
            if k in ("--listen", "--idle-timeout", "--container-id"):
                continue
            self.assertEqual(gf[k], wf[k], k)
        self.assertEqual(gf["--listen"], "127.0.0.1:7140")

    def test_rbac_grants_every_permission_asked(self):
        r = self.checker("--permissions", self.generated("permissions.json"),
                         os.path.join(K8S, "rbac.yaml"))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_rbac_missing_a_permission_is_found(self):
        docs = load_docs(os.path.join(K8S, "rbac.yaml"))
        broken = copy.deepcopy(docs)
        role = next(d for d in broken if d["kind"] == "Role")
        role["rules"] = [r for r in role["rules"] if "pods/portforward" not in r["resources"]]
        path = os.path.join(self.tmp.name, "rbac-broken.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump_all(broken, f)
        r = self.checker("--permissions", self.generated("permissions.json"), path)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("auth can-i create pods/portforward -n shop`, which no Role grants", r.stdout)

    def test_rbac_wildcards_and_secret_lists_are_refused(self):
        docs = load_docs(os.path.join(K8S, "rbac.yaml"))
        for edit, expected in (
                (lambda role: role["rules"].append(
                    {"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}), "no wildcard"),
                (lambda role: role["rules"].append(
                    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}),
                 "reads every Secret")):
            broken = copy.deepcopy(docs)
            edit(next(d for d in broken if d["kind"] == "Role"))
            path = os.path.join(self.tmp.name, "rbac-broken.yaml")
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump_all(broken, f)
            r = self.checker(path)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn(expected, r.stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dump", required=True)
    p.add_argument("--agent", required=True)
    a, rest = p.parse_known_args()
    ARGS.dump, ARGS.agent = a.dump, a.agent
    unittest.main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
