#!/usr/bin/env python3
"""Tests of tests/deploy/check_manifests.py on the real manifests.

The manifests of images/k8s/ must pass; then each test breaks one copy of a
manifest in one way (written to a temporary file, as text or through YAML)
and the checker must reject it with the expected problem, so the check
cannot pass vacuously.

  check_manifests_test.py --agent BIN [--manifests DIR] [unittest args]
"""

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check_manifests.py")
ARGS = argparse.Namespace(agent=None, manifests=os.path.join(HERE, "..", "..", "images", "k8s"))

JOB = "agent-job.yaml"
PATCH = "ephemeral-patch.yaml"
PROFILE = "ephemeral-debug-profile.yaml"


def manifest(name):
    return os.path.join(ARGS.manifests, name)


def read(name):
    with open(manifest(name), encoding="utf-8") as f:
        return f.read()


def run_checker(paths):
    cmd = [sys.executable, CHECKER]
    if ARGS.agent:
        cmd += ["--agent", ARGS.agent]
    return subprocess.run(cmd + list(paths), capture_output=True, text=True, timeout=120,
                          check=False)


class CheckManifestsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="siphon-deploy-")

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    # A copy of `name` with `edit(docs)` applied to its YAML documents.
    def broken_yaml(self, name, edit):
        docs = list(yaml.safe_load_all(read(name)))
        docs = copy.deepcopy(docs)
        edit(docs)
        text = read(name).split("\n")
        # Keep the comments (the debug profile's command lives there).
        comments = "\n".join(line for line in text if line.startswith("#"))
        return self.write(name, comments + "\n" + yaml.safe_dump_all(docs, sort_keys=False))

    # A copy of `name` with one text replacement (which must apply).
    def broken_text(self, name, old, new):
        text = read(name)
        self.assertIn(old, text, f"the test's edit does not apply to {name}")
        return self.write(name, text.replace(old, new, 1))

    def assertRejected(self, path, expected):
        r = run_checker([path])
        self.assertEqual(r.returncode, 1, f"checker accepted a broken manifest:\n{r.stdout}"
                         f"{r.stderr}")
        self.assertIn(expected, r.stdout)

    # ---------------------------------------------------------------- good
    def test_real_manifests_pass(self):
        names = sorted(n for n in os.listdir(ARGS.manifests) if n.endswith(".yaml"))
        for required in (JOB, PATCH, PROFILE):
            self.assertIn(required, names)
        r = run_checker([manifest(n) for n in names])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"{len(names)} file(s) ok", r.stdout)

    def test_roundtrip_through_yaml_still_passes(self):
        # The YAML rewrite the other tests use changes nothing by itself.
        for name in (JOB, PATCH, PROFILE):
            r = run_checker([self.broken_yaml(name, lambda docs: None)])
            self.assertEqual(r.returncode, 0, name + ":\n" + r.stdout + r.stderr)

    # ---------------------------------------------------------------- Job
    @staticmethod
    def job(docs):
        return next(d for d in docs if d.get("kind") == "Job")

    @classmethod
    def pod(cls, docs):
        return cls.job(docs)["spec"]["template"]["spec"]

    @classmethod
    def agent(cls, docs):
        return cls.pod(docs)["containers"][0]

    def test_job_without_host_pid(self):
        self.assertRejected(self.broken_text(JOB, "hostPID: true", "hostPID: false"),
                            "hostPID: true")

    def test_job_privileged(self):
        def edit(docs):
            self.agent(docs)["securityContext"]["privileged"] = True
        self.assertRejected(self.broken_yaml(JOB, edit), "privileged must be false")

    def test_job_privileged_missing(self):
        def edit(docs):
            del self.agent(docs)["securityContext"]["privileged"]
        self.assertRejected(self.broken_yaml(JOB, edit), "privileged must be false")

    def test_job_extra_capability(self):
        def edit(docs):
            self.agent(docs)["securityContext"]["capabilities"]["add"].append("SYS_MODULE")
        self.assertRejected(self.broken_yaml(JOB, edit), "extra: SYS_MODULE")

    def test_job_missing_capability(self):
        self.assertRejected(self.broken_text(JOB, "- NET_RAW ", "- NET_ADMIN "),
                            "missing: NET_RAW")

    def test_job_no_drop_all(self):
        def edit(docs):
            self.agent(docs)["securityContext"]["capabilities"]["drop"] = ["NET_RAW"]
        self.assertRejected(self.broken_yaml(JOB, edit), "capabilities.drop must be [ALL]")

    def test_job_no_escalation_with_sys_admin(self):
        self.assertRejected(
            self.broken_text(JOB, "allowPrivilegeEscalation: true", "allowPrivilegeEscalation: false"),
            "allowPrivilegeEscalation: false with SYS_ADMIN")

    def test_job_writable_root(self):
        self.assertRejected(
            self.broken_text(JOB, "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"),
            "readOnlyRootFilesystem must be true")

    def test_job_socket_writable(self):
        def edit(docs):
            for m in self.agent(docs)["volumeMounts"]:
                if m["name"] == "containerd-sock":
                    m["readOnly"] = False
        self.assertRejected(self.broken_yaml(JOB, edit), "must be mounted readOnly")

    def test_job_socket_not_mounted(self):
        def edit(docs):
            c = self.agent(docs)
            c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] != "containerd-sock"]
        self.assertRejected(self.broken_yaml(JOB, edit), "socket must be mounted")

    def test_job_without_ttl(self):
        def edit(docs):
            del self.job(docs)["spec"]["ttlSecondsAfterFinished"]
        self.assertRejected(self.broken_yaml(JOB, edit), "ttlSecondsAfterFinished")

    def test_job_retries(self):
        def edit(docs):
            self.job(docs)["spec"]["backoffLimit"] = 6
        self.assertRejected(self.broken_yaml(JOB, edit), "backoffLimit must be 0")

    def test_job_without_tolerations(self):
        def edit(docs):
            del self.pod(docs)["tolerations"]
        self.assertRejected(self.broken_yaml(JOB, edit), "every other NoExecute taint")

    def test_job_toleration_of_every_taint(self):
        # What the Job had before issue 42: Karpenter would skip its eviction
        # and it would stay bound to an unreachable node for ever.
        def edit(docs):
            self.pod(docs)["tolerations"] = [{"operator": "Exists"}]
        path = self.broken_yaml(JOB, edit)
        self.assertRejected(path, "only NoExecute taints")
        self.assertRejected(path, "node.kubernetes.io/unreachable:NoExecute: the first toleration")

    def test_job_tolerates_karpenters_disruption_taint(self):
        def edit(docs):
            self.pod(docs)["tolerations"].insert(0, {"key": "karpenter.sh/disrupted",
                                                     "operator": "Exists",
                                                     "effect": "NoSchedule"})
        self.assertRejected(self.broken_yaml(JOB, edit), "karpenter.sh/disrupted")

    def test_job_catch_all_before_the_bounded_tolerations(self):
        # The first matching toleration counts: the bound would never apply.
        def edit(docs):
            tol = self.pod(docs)["tolerations"]
            tol.insert(0, tol.pop())
        self.assertRejected(self.broken_yaml(JOB, edit),
                            "node.kubernetes.io/not-ready:NoExecute: the first toleration")

    def test_job_tolerates_out_of_service(self):
        def edit(docs):
            self.pod(docs)["tolerations"] = [
                t for t in self.pod(docs)["tolerations"]
                if t.get("key") != "node.kubernetes.io/out-of-service"]
        self.assertRejected(self.broken_yaml(JOB, edit), "out-of-service")

    def test_job_without_safe_to_evict(self):
        def edit(docs):
            del self.job(docs)["spec"]["template"]["metadata"]["annotations"]
        self.assertRejected(self.broken_yaml(JOB, edit), "safe-to-evict")

    def test_job_do_not_disrupt(self):
        def edit(docs):
            self.job(docs)["spec"]["template"]["metadata"]["annotations"][
                "karpenter.sh/do-not-disrupt"] = "true"
        self.assertRejected(self.broken_yaml(JOB, edit), "karpenter.sh/do-not-disrupt")

    def test_job_carries_an_application_label(self):
        def edit(docs):
            self.job(docs)["spec"]["template"]["metadata"]["labels"]["app"] = "web"
        self.assertRejected(self.broken_yaml(JOB, edit), "label 'app' is not Siphon's own")

    def test_job_with_an_emptydir(self):
        # kubectl drain refuses a node whose pods have one (issue 42).
        def edit(docs):
            self.pod(docs)["volumes"].append({"name": "tmp", "emptyDir": {"medium": "Memory"}})
            self.agent(docs)["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
        self.assertRejected(self.broken_yaml(JOB, edit), "no emptyDir")

    def test_job_owned_by_a_pod(self):
        def edit(docs):
            self.job(docs)["metadata"]["ownerReferences"][0]["kind"] = "Pod"
        self.assertRejected(self.broken_yaml(JOB, edit), "ownerReference to its Node")

    def test_job_owner_blocks_deletion(self):
        def edit(docs):
            self.job(docs)["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = True
        self.assertRejected(self.broken_yaml(JOB, edit), "must not block")

    def test_job_without_resources(self):
        def edit(docs):
            del self.agent(docs)["resources"]
        self.assertRejected(self.broken_yaml(JOB, edit), "resources.requests")

    def test_job_not_pinned(self):
        def edit(docs):
            del self.pod(docs)["nodeName"]
        self.assertRejected(self.broken_yaml(JOB, edit), "nodeName")

    def test_job_wrong_api_version(self):
        self.assertRejected(self.broken_text(JOB, "apiVersion: batch/v1", "apiVersion: batch/v2"),
                            "apiVersion must be batch/v1")

    def test_job_misspelt_mode(self):
        self.assertRejected(self.broken_text(JOB, "- targeted", "- targetted"),
                            "mode 'targetted'")

    def test_job_unknown_agent_option(self):
        def edit(docs):
            self.agent(docs)["args"] += ["--no-such-option", "1"]
        self.assertRejected(self.broken_yaml(JOB, edit), "unknown option --no-such-option")

    def test_job_insecure(self):
        def edit(docs):
            self.agent(docs)["args"].append("--insecure-no-auth")
        self.assertRejected(self.broken_yaml(JOB, edit), "--insecure-no-auth")

    def test_job_token_file_outside_the_secret(self):
        self.assertRejected(self.broken_text(JOB, "- /var/run/siphon/token", "- /etc/token"),
                            "must be a mounted Secret")

    def test_job_endpoint_elsewhere(self):
        def edit(docs):
            a = self.agent(docs)["args"]
            a[a.index("--runtime-endpoint") + 1] = "/run/other.sock"
        self.assertRejected(self.broken_yaml(JOB, edit), "not where the socket is mounted")

    def test_job_shell_command(self):
        def edit(docs):
            self.agent(docs)["command"] = ["/bin/sh", "-c"]
        self.assertRejected(self.broken_yaml(JOB, edit), "no command")

    def test_bad_placeholder(self):
        self.assertRejected(self.broken_text(JOB, "${NODE_NAME}", "${node-name}"),
                            "placeholder '${node-name}'")

    def test_not_yaml(self):
        self.assertRejected(self.write(JOB, read(JOB) + "\n  : [unclosed\n"), "not valid YAML")

    def test_job_bad_choice_is_caught_by_the_agents_cli(self):
        if not ARGS.agent:
            self.skipTest("needs --agent: choices come from the agent's --help")
        def edit(docs):
            self.agent(docs)["args"] += ["--fs-mode", "wr"]
        self.assertRejected(self.broken_yaml(JOB, edit), "--fs-mode 'wr': expected one of ro")

    # ---------------------------------------------------------------- ephemeral
    @staticmethod
    def eph(docs):
        return docs[0]["spec"]["ephemeralContainers"][0]

    def test_patch_with_resources(self):
        def edit(docs):
            self.eph(docs)["resources"] = {"limits": {"memory": "1Gi"}}
        self.assertRejected(self.broken_yaml(PATCH, edit), "resources is not allowed")

    def test_patch_without_target(self):
        def edit(docs):
            del self.eph(docs)["targetContainerName"]
        self.assertRejected(self.broken_yaml(PATCH, edit), "targetContainerName")

    def test_patch_wrong_mode(self):
        self.assertRejected(self.broken_text(PATCH, "- ephemeral", "- targetless"),
                            "mode must be `ephemeral`")

    def test_patch_literal_token(self):
        def edit(docs):
            env = self.eph(docs)["env"]
            env[0] = {"name": "SIPHON_TOKEN", "value": "secret"}
        self.assertRejected(self.broken_yaml(PATCH, edit), "must come from a Secret")

    def test_patch_capability_with_cap_prefix(self):
        self.assertRejected(self.broken_text(PATCH, "- SETPCAP", "- CAP_SETPCAP"),
                            "without CAP_")

    # The handover socket where other containers reach it (issue: /dev/shm
    # is the pod's, shared by every container).
    UPGRADE = "ephemeral-upgrade-patch.yaml"

    def test_patch_handover_socket_in_dev_shm(self):
        for name in (PATCH, self.UPGRADE):
            self.assertRejected(
                self.broken_text(name, "- /dev/siphon-handover.sock",
                                 "- /dev/shm/siphon-handover.sock"),
                "/dev/shm is shared by every container of the pod")

    def test_patch_handover_socket_on_the_read_only_root(self):
        self.assertRejected(
            self.broken_text(PATCH, "- /dev/siphon-handover.sock", "- /run/siphon-handover.sock"),
            "/run is on the read-only root file system")

    def test_patch_handover_socket_relative(self):
        self.assertRejected(
            self.broken_text(PATCH, "- /dev/siphon-handover.sock", "- siphon-handover.sock"),
            "must be an absolute path")

    def test_upgrade_take_over_auto_without_a_socket(self):
        self.assertRejected(
            self.broken_text(self.UPGRADE,
                             "- --handover-socket\n        - /dev/siphon-handover.sock\n", ""),
            "--take-over auto finds the old agent's socket")

    def test_job_handover_socket_on_the_read_only_root(self):
        def edit(docs):
            self.agent(docs)["args"] += ["--handover-socket", "/tmp/siphon-handover.sock"]
        self.assertRejected(self.broken_yaml(JOB, edit), "/tmp is on the read-only root")

    def test_profile_with_image(self):
        def edit(docs):
            docs[0]["image"] = "busybox"
        self.assertRejected(self.broken_yaml(PROFILE, edit), "refuses the field image")

    def test_profile_privileged(self):
        self.assertRejected(self.broken_text(PROFILE, "privileged: false", "privileged: true"),
                            "privileged must be false")

    def test_profile_command_line_mode(self):
        self.assertRejected(
            self.broken_text(PROFILE, "--arguments-only -- ephemeral",
                             "--arguments-only -- ephemerl"),
            "mode 'ephemerl'")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", default=os.environ.get("SIPHON_AGENT_BIN"))
    p.add_argument("--manifests", default=ARGS.manifests)
    known, rest = p.parse_known_args()
    ARGS.agent = known.agent
    ARGS.manifests = known.manifests
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
