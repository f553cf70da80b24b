#!/usr/bin/env python3
"""Checks the siphon-agent Kubernetes manifests (images/k8s/) offline.

A dry run without a cluster: the structure and the fields the deployment
depends on, as images/README.md describes them.

  check_manifests.py [--agent BIN] [--capabilities FILE] [--permissions FILE] MANIFEST...

Each YAML document of each file is one of:
  * a Secret holding the client token,
  * a batch/v1 Job running the targeted agent (hostPID, pinned to a node,
    owned by the Node, the runtime socket read-only, the exact capability
    set, resources, ttlSecondsAfterFinished; nothing that holds a node: see
    check_disruption),
  * a strategic patch of a pod's ephemeralcontainers subresource,
  * a `kubectl debug --custom` partial container spec (its arguments are
    those after `--arguments-only --` in the file's comments),
  * the user's RBAC (rbac.yaml): a Role, a ClusterRole and their bindings,
    rbac.authorization.k8s.io/v1, no wildcard, no list or watch of Secrets,
    cluster-scoped rules only for nodes and namespaces, every binding's
    roleRef defined in the files checked; with --permissions (a JSON list
    of {"verb", "resource", "ns"} that `siphon --target` asks `kubectl auth
    can-i`), every one of them granted (ns "": by the ClusterRole).
The agent's arguments are checked against the agent's own command line: the
options `siphon-agent --help` and `siphon-agent MODE --help` list (name,
whether it takes a value, its choices, what it excludes or needs). Without
--agent only the mode words are checked. A --handover-socket must be where
only another agent reaches it: never the pod's /dev/shm nor an emptyDir
(the agent refuses both), and under a read-only root the container's own
/dev.

Placeholders are ${UPPER_CASE}; the checker substitutes a sample value for
each before checking arguments.

Exit 0 when every document passes; 1 with one line per problem
(FILE: document N: what is wrong); 2 on bad usage.
"""

import argparse
import json
import os
import posixpath
import re
import subprocess
import sys

import yaml

PLACEHOLDER = re.compile(r"\$\{([^}\s]*)\}")
GOOD_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
MODES = ("targeted", "ephemeral", "targetless")
# kubectl debug --custom refuses these fields (KEP-4292).
DEBUG_PROFILE_FORBIDDEN = ("name", "image", "command", "lifecycle", "volumeDevices")
# The API refuses these in an ephemeral container.
EPHEMERAL_FORBIDDEN = ("ports", "resources", "livenessProbe", "readinessProbe", "startupProbe",
                       "lifecycle")


def load_capabilities(path):
    caps = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                caps.append(line)
    if not caps:
        raise ValueError(f"{path}: no capabilities listed")
    if len(set(caps)) != len(caps):
        raise ValueError(f"{path}: a capability is listed twice")
    return caps


# ------------------------------------------------------------ the agent's CLI

class AgentCli:
    """The agent's options, read from its --help output (CLI11's format)."""

    OPTION = re.compile(
        r"^  (?:-\w,)?(--[A-Za-z0-9][\w-]*)"  # name
        r"(?: ([A-Z]+)(?::\{([^}]*)\})?[^ ]*)?"  # TYPE[:{a,b}][=default | :range]
        r"(.*)$")

    def __init__(self, agent):
        self.agent = agent
        top = self._help([])
        self.global_opts = self._options(top)
        self.modes = {}
        in_sub = False
        for line in top.splitlines():
            if line.startswith("Subcommands:"):
                in_sub = True
                continue
            if in_sub:
                m = re.match(r"^  (\w+)\s", line)
                if m:
                    self.modes[m.group(1)] = self._options(self._help([m.group(1)]))
        if not self.modes:
            raise RuntimeError(f"{agent} --help lists no subcommands")

    def _help(self, args):
        r = subprocess.run([self.agent] + args + ["--help"], capture_output=True, text=True,
                           timeout=30, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"{self.agent} {' '.join(args)} --help: exit {r.returncode}: "
                               f"{r.stderr.strip()}")
        return r.stdout

    def _options(self, text):
        opts = {}
        for line in text.splitlines():
            m = self.OPTION.match(line)
            if not m:
                continue
            name, typ, choices, rest = m.groups()
            if name in ("--help", "--version"):
                continue
            excludes = re.findall(r"Excludes: ((?:--[\w-]+ ?)+)", rest or "")
            needs = re.findall(r"Needs: ((?:--[\w-]+ ?)+)", rest or "")
            opts[name] = {
                "value": typ is not None,
                "type": typ,
                "choices": choices.split(",") if choices else None,
                "excludes": " ".join(excludes).split(),
                "needs": " ".join(needs).split(),
            }
        return opts

    def check(self, args):
        """Problems with `args` (a mode and its options), as strings."""
        problems = []
        if not args:
            return ["no arguments (the agent needs a mode)"]
        mode = args[0]
        if mode not in self.modes:
            return [f"mode {mode!r} is not one of the agent's ({', '.join(sorted(self.modes))})"]
        known = dict(self.global_opts)
        known.update(self.modes[mode])
        seen = {}
        i = 1
        while i < len(args):
            a = args[i]
            if not a.startswith("--"):
                problems.append(f"unexpected argument {a!r} (not an option of `{mode}`)")
                i += 1
                continue
            name, eq, inline = a.partition("=")
            spec = known.get(name)
            if spec is None:
                problems.append(f"unknown option {name} for `siphon-agent {mode}`")
                i += 1
                continue
            value = None
            if spec["value"]:
                if eq:
                    value = inline
                elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                    value = args[i + 1]
                    i += 1
                else:
                    problems.append(f"option {name} needs a value")
            elif eq:
                problems.append(f"option {name} takes no value")
            if value is not None:
                if spec["choices"] and value not in spec["choices"]:
                    problems.append(f"{name} {value!r}: expected one of {', '.join(spec['choices'])}")
                if spec["type"] in ("INT", "UINT") and not re.fullmatch(r"-?\d+", value):
                    problems.append(f"{name} {value!r}: expected a number")
            if name in seen:
                problems.append(f"option {name} given twice")
            seen[name] = value
            i += 1
        for name in seen:
            spec = known[name]
            for other in spec["excludes"]:
                if other in seen:
                    problems.append(f"{name} excludes {other}")
            for other in spec["needs"]:
                if other not in seen:
                    problems.append(f"{name} needs {other}")
        if mode == "targeted" and "--pid" not in seen and "--container-id" not in seen:
            problems.append("targeted needs --pid or --container-id")
        # The agent's rule: a socket alone does not say which API it speaks;
        # a Kubernetes-style ID (containerd://ID) does.
        if ("--runtime-endpoint" in seen and "--runtime" not in seen
                and "://" not in (seen.get("--container-id") or "")):
            problems.append("--runtime-endpoint needs --runtime (or a containerd://ID)")
        return problems


def check_mode_words(args):
    if not args:
        return ["no arguments (the agent needs a mode)"]
    if args[0] not in MODES:
        return [f"mode {args[0]!r} is not one of the agent's ({', '.join(MODES)})"]
    return []


# ------------------------------------------------------------ the documents

class Checker:
    def __init__(self, capabilities, cli):
        self.capabilities = capabilities
        self.cli = cli
        self.problems = []
        self.where = ""
        self.roles = set()     # (kind, name) of the Roles and ClusterRoles seen
        self.grants = set()    # (role kind, apiGroup, resource, verb)
        self.bindings = []     # (where, kind, roleRef kind, roleRef name)

    def fail(self, msg):
        self.problems.append(f"{self.where}: {msg}")

    def require(self, cond, msg):
        if not cond:
            self.fail(msg)
        return cond

    # The agent's arguments, placeholders filled with sample values.
    def check_args(self, args, mode, ctx):
        if not isinstance(args, list) or not all(isinstance(a, (str, int)) for a in args):
            self.fail(f"{ctx}: args must be a list of strings")
            return None
        args = [PLACEHOLDER.sub(lambda m: "sample-" + m.group(1).lower().replace("_", "-"),
                                str(a)) for a in args]
        problems = self.cli.check(args) if self.cli else check_mode_words(args)
        for p in problems:
            self.fail(f"{ctx}: agent arguments: {p}")
        if args and args[0] != mode:
            self.fail(f"{ctx}: the agent's mode must be `{mode}`, not `{args[0]}`")
        if "--insecure-no-auth" in args:
            self.fail(f"{ctx}: --insecure-no-auth: a deployed agent must require a token")
        return args

    # --handover-socket where only another agent reaches it (docs/SECURITY.md,
    # "The handover socket"): the agent refuses /dev/shm and any directory
    # others may write (an emptyDir is 0777) at start-up; under a read-only
    # root, /dev (the container's own tmpfs) is where it can bind.
    def check_handover(self, args, ctx, mounts, read_only):
        def value(flag):
            i = args.index(flag)
            return args[i + 1] if i + 1 < len(args) else ""
        if "--take-over" in args and value("--take-over") == "auto":
            self.require("--handover-socket" in args,
                         f"{ctx}: --take-over auto finds the old agent's socket at this agent's "
                         "--handover-socket path: give it")
        if "--handover-socket" not in args:
            return
        path = value("--handover-socket")
        if not self.require(path.startswith("/"),
                            f"{ctx}: --handover-socket {path!r}: must be an absolute path"):
            return
        d = posixpath.dirname(posixpath.normpath(path))
        if d == "/dev/shm" or d.startswith("/dev/shm/"):
            self.fail(f"{ctx}: --handover-socket {path}: /dev/shm is shared by every container "
                      "of the pod (containerd, CRI-O): the agent refuses it; use the "
                      "container's own /dev (/dev/siphon-handover.sock)")
            return
        under = [(mp, v) for mp, v in mounts
                 if d == mp or d.startswith(mp.rstrip("/") + "/")]
        mount = max(under, key=lambda mv: len(mv[0]), default=None)
        if mount is not None and "emptyDir" in mount[1]:
            self.fail(f"{ctx}: --handover-socket {path}: {mount[0]} is an emptyDir (mode 0777, "
                      "and any container of the pod may mount it): the agent refuses it; use "
                      "the container's own /dev (/dev/siphon-handover.sock)")
        elif mount is None and read_only and d != "/dev":
            self.fail(f"{ctx}: --handover-socket {path}: {d} is on the read-only root file "
                      "system; use the container's own /dev (/dev/siphon-handover.sock)")

    def check_security_context(self, sc, ctx):
        if not self.require(isinstance(sc, dict), f"{ctx}: no securityContext"):
            return
        self.require(sc.get("privileged") is False,
                     f"{ctx}: securityContext.privileged must be false (explicitly)")
        caps = sc.get("capabilities")
        if not self.require(isinstance(caps, dict), f"{ctx}: no securityContext.capabilities"):
            return
        self.require(caps.get("drop") == ["ALL"],
                     f"{ctx}: capabilities.drop must be [ALL], is {caps.get('drop')!r}")
        add = caps.get("add")
        if not self.require(isinstance(add, list), f"{ctx}: no capabilities.add list"):
            return
        for c in add:
            self.require(isinstance(c, str) and not c.startswith("CAP_"),
                         f"{ctx}: capability {c!r}: write it without CAP_ (Kubernetes spelling)")
        if len(set(add)) != len(add):
            self.fail(f"{ctx}: a capability is added twice")
        want = set(self.capabilities)
        got = set(str(c) for c in add)
        if got != want:
            extra = sorted(got - want)
            missing = sorted(want - got)
            self.fail(f"{ctx}: capabilities.add must be exactly images/capabilities.txt"
                      + (f"; extra: {', '.join(extra)}" if extra else "")
                      + (f"; missing: {', '.join(missing)}" if missing else ""))
        if "SYS_ADMIN" in got and sc.get("allowPrivilegeEscalation") is False:
            self.fail(f"{ctx}: allowPrivilegeEscalation: false with SYS_ADMIN is refused by the "
                      "API server")
        self.require(sc.get("readOnlyRootFilesystem") is True,
                     f"{ctx}: readOnlyRootFilesystem must be true")
        self.require(sc.get("runAsNonRoot") is not True,
                     f"{ctx}: runAsNonRoot: the agent's capabilities are a root process's")

    def check_token_env(self, container, ctx):
        env = container.get("env") or []
        for e in env:
            if isinstance(e, dict) and e.get("name") == "SIPHON_TOKEN":
                ref = ((e.get("valueFrom") or {}).get("secretKeyRef") or {})
                self.require(bool(ref.get("name")) and bool(ref.get("key")),
                             f"{ctx}: SIPHON_TOKEN must come from a Secret (valueFrom."
                             "secretKeyRef), never a literal value")
                return True
        return False

    # ---- what lets every disruption tool evict the agent (agent-job.yaml)
    SIPHON_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/managed-by")
    LOST_NODE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")

    def check_xtables_lock(self, container, ctx):
        """Under a read-only root without an emptyDir, iptables-legacy's lock
        (default /run/xtables.lock) must be in the container's own /dev."""
        env = {e.get("name"): e.get("value") for e in container.get("env") or []
               if isinstance(e, dict)}
        lock = env.get("XTABLES_LOCKFILE") or ""
        self.require(lock.startswith("/dev/") and not lock.startswith("/dev/shm/"),
                     f"{ctx}: env XTABLES_LOCKFILE must name a file in the container's /dev "
                     f"(not /dev/shm, the pod's), got {lock!r}: the root is read-only and "
                     "there is no /run to write /run/xtables.lock in")

    def check_disruption(self, job, pod):
        template = (job.get("spec") or {}).get("template") or {}
        tmeta = template.get("metadata") or {}
        ann = tmeta.get("annotations") or {}
        self.require(ann.get("cluster-autoscaler.kubernetes.io/safe-to-evict") == "true",
                     "pod template needs the annotation cluster-autoscaler.kubernetes.io/"
                     "safe-to-evict: \"true\" (its hostPath counts as local storage: Cluster "
                     "Autoscaler would keep the node)")
        for where, meta in (("Job", job.get("metadata") or {}), ("pod template", tmeta)):
            a = meta.get("annotations") or {}
            self.require("karpenter.sh/do-not-disrupt" not in a,
                         f"{where}: no karpenter.sh/do-not-disrupt (it would hold the node)")
            for k in meta.get("labels") or {}:
                self.require(k in self.SIPHON_LABELS or k.startswith("siphon.dev/"),
                             f"{where}: label {k!r} is not Siphon's own (app.kubernetes.io/name, "
                             "app.kubernetes.io/managed-by, siphon.dev/*): a "
                             "PodDisruptionBudget of the application could select the agent")
            labels = meta.get("labels") or {}
            self.require(labels.get("app.kubernetes.io/name") == "siphon-agent",
                         f"{where}: needs the label app.kubernetes.io/name: siphon-agent")
        self.require(not tmeta.get("ownerReferences"),
                     "pod template: no ownerReferences (the Job is the pod's controller owner, "
                     "which lets kubectl drain evict it without --force)")
        for v in pod.get("volumes") or []:
            self.require(not (isinstance(v, dict) and "emptyDir" in v),
                         f"volume {v.get('name') if isinstance(v, dict) else v!r}: no emptyDir "
                         "(`kubectl drain` refuses a node with one unless told "
                         "--delete-emptydir-data; the agent writes only in its container's /dev)")
        for c in pod.get("containers") or []:
            self.check_xtables_lock(c, f"container {c.get('name')!r}")
        tol = [t for t in pod.get("tolerations") or [] if isinstance(t, dict)]
        for t in tol:
            self.require(t.get("effect") == "NoExecute",
                         f"toleration {t}: only NoExecute taints (with nodeName the scheduler's "
                         "taints never apply; tolerating karpenter.sh/disrupted:NoSchedule makes "
                         "Karpenter skip the agent's eviction)")
        first = {}
        for taint in self.LOST_NODE_TAINTS + ("node.kubernetes.io/out-of-service",
                                              "example.com/dedicated"):
            for t in tol:
                if t.get("effect") in (None, "", "NoExecute") and (
                        (t.get("operator") == "Exists" and t.get("key") in (None, "", taint)) or
                        t.get("key") == taint):
                    first[taint] = t
                    break
        for taint in self.LOST_NODE_TAINTS:
            secs = (first.get(taint) or {}).get("tolerationSeconds")
            self.require(isinstance(secs, int) and 0 < secs <= 300,
                         f"{taint}:NoExecute: the first toleration matching it needs a "
                         "tolerationSeconds of 1..300 (or the pod stays bound to a dead node)")
        oos = first.get("node.kubernetes.io/out-of-service")
        self.require(oos is not None and oos.get("tolerationSeconds") == 0,
                     "node.kubernetes.io/out-of-service:NoExecute: the first toleration matching "
                     "it needs tolerationSeconds: 0 (a node declared shut down)")
        other = first.get("example.com/dedicated")
        self.require(other is not None and other.get("tolerationSeconds") is None,
                     "pod needs a toleration of every other NoExecute taint (operator: Exists, "
                     "effect: NoExecute, no key): the agent must run where its target runs")

    # ---- kind: Job
    def check_job(self, doc):
        self.require(doc.get("apiVersion") == "batch/v1",
                     f"Job apiVersion must be batch/v1, is {doc.get('apiVersion')!r}")
        meta = doc.get("metadata") or {}
        self.require(bool(meta.get("name")), "Job has no metadata.name")
        self.require(bool(meta.get("namespace")), "Job has no metadata.namespace")
        owners = meta.get("ownerReferences") or []
        nodes = [o for o in owners if isinstance(o, dict) and o.get("kind") == "Node"]
        if self.require(len(nodes) == 1, "Job needs one ownerReference to its Node"):
            o = nodes[0]
            self.require(o.get("apiVersion") == "v1", "ownerReference to the Node: apiVersion v1")
            self.require(bool(o.get("name")) and bool(o.get("uid")),
                         "ownerReference to the Node needs name and uid")
            self.require(o.get("blockOwnerDeletion") is not True,
                         "ownerReference to the Node must not block the Node's deletion")
            self.require(o.get("controller") is not True,
                         "ownerReference to the Node must not be a controller reference")
        spec = doc.get("spec") or {}
        self.require(spec.get("backoffLimit") == 0, "Job spec.backoffLimit must be 0")
        ttl = spec.get("ttlSecondsAfterFinished")
        self.require(isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0,
                     "Job spec.ttlSecondsAfterFinished must be set (seconds)")
        if "activeDeadlineSeconds" in spec:
            ads = spec["activeDeadlineSeconds"]
            self.require(isinstance(ads, int) and ads > 0,
                         "Job spec.activeDeadlineSeconds must be a positive number")
        pod = ((spec.get("template") or {}).get("spec")) or {}
        if not self.require(bool(pod), "Job has no spec.template.spec"):
            return
        self.require(pod.get("restartPolicy") == "Never", "pod restartPolicy must be Never")
        self.require(bool(pod.get("nodeName")), "pod must be pinned with nodeName")
        self.require(pod.get("hostPID") is True, "pod needs hostPID: true")
        self.require(pod.get("hostNetwork") is not True, "pod must not use hostNetwork")
        self.require(pod.get("hostIPC") is not True, "pod must not use hostIPC")
        self.check_disruption(doc, pod)
        self.require(pod.get("automountServiceAccountToken") is False,
                     "pod must not mount a service account token (automountServiceAccountToken: "
                     "false)")
        containers = pod.get("containers") or []
        if not self.require(len(containers) == 1, "pod must run exactly one container, the agent"):
            return
        c = containers[0]
        ctx = f"container {c.get('name')!r}"
        self.require(bool(c.get("image")), f"{ctx}: no image")
        self.require("command" not in c,
                     f"{ctx}: no command: the image's entrypoint is the agent (args only)")
        self.check_security_context(c.get("securityContext"), ctx)
        res = c.get("resources") or {}
        req = res.get("requests") or {}
        lim = res.get("limits") or {}
        self.require("cpu" in req and "memory" in req,
                     f"{ctx}: resources.requests needs cpu and memory")
        self.require("memory" in lim, f"{ctx}: resources.limits needs memory")

        volumes = {v.get("name"): v for v in (pod.get("volumes") or []) if isinstance(v, dict)}
        mounts = c.get("volumeMounts") or []
        by_path = {}
        socket_mounts = []
        for m in mounts:
            v = volumes.get(m.get("name"))
            if not self.require(v is not None,
                                f"{ctx}: volumeMount {m.get('name')!r} has no volume"):
                continue
            by_path[m.get("mountPath")] = (m, v)
            if "hostPath" in v:
                self.require(m.get("readOnly") is True,
                             f"{ctx}: hostPath volume {m.get('name')!r} must be mounted readOnly")
                hp = v["hostPath"] or {}
                if str(hp.get("path", "")).endswith(".sock"):
                    socket_mounts.append(m)
                    self.require(hp.get("type") == "Socket",
                                 f"{ctx}: hostPath {hp.get('path')} must have type: Socket")
        self.require(len(socket_mounts) == 1,
                     f"{ctx}: the container runtime's socket must be mounted (one hostPath "
                     "*.sock, readOnly)")
        for name, v in volumes.items():
            if "hostPath" in v:
                self.require(any(m.get("name") == name for m in mounts),
                             f"volume {name!r}: an unused hostPath volume")

        args = self.check_args(c.get("args"), "targeted", ctx)
        if args is None:
            return
        self.check_handover(args, ctx, [(mp, mv[1]) for mp, mv in by_path.items() if mp],
                            (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is True)
        self.require("--container-id" in args or "--pid" in args,
                     f"{ctx}: the Job targets a container: --container-id")
        if "--runtime-endpoint" in args:
            ep = args[args.index("--runtime-endpoint") + 1] if \
                args.index("--runtime-endpoint") + 1 < len(args) else ""
            self.require(any(m.get("mountPath") == ep for m in socket_mounts),
                         f"{ctx}: --runtime-endpoint {ep} is not where the socket is mounted")
        if "--token-file" in args:
            i = args.index("--token-file")
            path = args[i + 1] if i + 1 < len(args) else ""
            d = os.path.dirname(path)
            mv = by_path.get(d)
            if self.require(mv is not None and "secret" in mv[1],
                            f"{ctx}: --token-file {path}: its directory must be a mounted Secret"):
                items = mv[1]["secret"].get("items")
                if items:
                    self.require(any(it.get("path") == os.path.basename(path) for it in items),
                                 f"{ctx}: --token-file {path}: the Secret volume has no such item")
        else:
            self.require(self.check_token_env(c, ctx),
                         f"{ctx}: the agent needs a token: --token-file from a Secret")

    # ---- kind: Secret
    def check_secret(self, doc):
        self.require(doc.get("apiVersion") == "v1", "Secret apiVersion must be v1")
        meta = doc.get("metadata") or {}
        self.require(bool(meta.get("name")), "Secret has no metadata.name")
        data = dict(doc.get("stringData") or {})
        data.update(doc.get("data") or {})
        self.require("token" in data, "Secret holds no `token` key")

    # ---- ephemeralcontainers patch
    def check_ephemeral_patch(self, doc):
        ecs = (doc.get("spec") or {}).get("ephemeralContainers")
        if not self.require(isinstance(ecs, list) and len(ecs) == 1,
                            "patch must add exactly one ephemeral container"):
            return
        c = ecs[0]
        ctx = f"ephemeral container {c.get('name')!r}"
        self.require(bool(c.get("name")), f"{ctx}: no name")
        self.require(bool(c.get("image")), f"{ctx}: no image")
        self.require(bool(c.get("targetContainerName")),
                     f"{ctx}: targetContainerName is needed to see the target's processes")
        self.require("command" not in c, f"{ctx}: no command: the entrypoint is the agent")
        for f in EPHEMERAL_FORBIDDEN:
            self.require(f not in c, f"{ctx}: {f} is not allowed in an ephemeral container")
        self.check_security_context(c.get("securityContext"), ctx)
        args = self.check_args(c.get("args"), "ephemeral", ctx)
        if args is not None:
            # No volumes in an ephemeral container.
            self.check_handover(args, ctx, [], (c.get("securityContext") or {}).get(
                "readOnlyRootFilesystem") is True)
        if args is not None and "--token-file" not in args:
            self.require(self.check_token_env(c, ctx),
                         f"{ctx}: the agent needs a token: SIPHON_TOKEN from a Secret")
        self.check_xtables_lock(c, ctx)

    # ---- kubectl debug --custom profile
    def check_debug_profile(self, doc, text):
        ctx = "kubectl debug profile"
        for f in DEBUG_PROFILE_FORBIDDEN:
            self.require(f not in doc, f"{ctx}: kubectl debug --custom refuses the field {f}")
        for f in EPHEMERAL_FORBIDDEN:
            self.require(f not in doc, f"{ctx}: {f} is not allowed in an ephemeral container")
        self.check_security_context(doc.get("securityContext"), ctx)
        self.require(self.check_token_env(doc, ctx),
                     f"{ctx}: the agent needs a token: SIPHON_TOKEN from a Secret")
        self.check_xtables_lock(doc, ctx)
        cmd = re.findall(r"--arguments-only\s+--\s+(.*)$", text, re.MULTILINE)
        if self.require(len(cmd) >= 1, f"{ctx}: the comments must show the kubectl debug command "
                        "(`... --arguments-only -- ephemeral ...`)"):
            for line in cmd:
                self.check_args(line.split(), "ephemeral", f"{ctx} command")

    # ---- RBAC (rbac.yaml)
    def check_rbac(self, doc):
        kind = doc.get("kind")
        self.require(doc.get("apiVersion") == "rbac.authorization.k8s.io/v1",
                     f"{kind}: apiVersion must be rbac.authorization.k8s.io/v1")
        name = (doc.get("metadata") or {}).get("name")
        self.require(bool(name), f"{kind}: no metadata.name")
        if kind in ("Role", "ClusterRole"):
            self.roles.add((kind, name))
            rules = doc.get("rules")
            if not self.require(isinstance(rules, list) and rules, f"{kind} {name}: no rules"):
                return
            for r in rules:
                groups, resources, verbs = (r.get("apiGroups"), r.get("resources"),
                                            r.get("verbs"))
                ok = all(isinstance(x, list) and x for x in (groups, resources, verbs))
                if not self.require(ok, f"{kind} {name}: each rule needs apiGroups, resources "
                                    "and verbs (lists)"):
                    continue
                self.require("*" not in groups + resources + verbs,
                             f"{kind} {name}: no wildcard (least privilege)")
                if "secrets" in resources:
                    self.require(not {"list", "watch"} & set(verbs),
                                 f"{kind} {name}: list or watch of secrets reads every Secret")
                if kind == "ClusterRole":
                    self.require(set(resources) <= {"nodes", "namespaces"},
                                 f"ClusterRole {name}: cluster-wide rules only for nodes and "
                                 "namespaces")
                for g in groups:
                    for res in resources:
                        for v in verbs:
                            self.grants.add((kind, g, res, v))
        else:
            ref = doc.get("roleRef") or {}
            self.require(bool(doc.get("subjects")), f"{kind} {name}: no subjects")
            self.bindings.append((self.where, kind, ref.get("kind"), ref.get("name")))

    def check_rbac_links(self, permissions):
        for where, kind, ref_kind, ref_name in self.bindings:
            if (ref_kind, ref_name) not in self.roles:
                self.problems.append(f"{where}: {kind}'s roleRef {ref_kind} {ref_name} is not "
                                     "defined in the files checked")
        seen = set()
        for p in permissions or []:
            if (p["verb"], p["resource"], p["ns"]) in seen:
                continue
            seen.add((p["verb"], p["resource"], p["ns"]))
            res = p["resource"]
            group = ""
            base = res.split("/", 1)
            if "." in base[0]:
                name, group = base[0].split(".", 1)
                res = name + ("/" + base[1] if len(base) > 1 else "")
            kind = "ClusterRole" if not p["ns"] else "Role"
            if (kind, group, res, p["verb"]) not in self.grants:
                self.problems.append(
                    f"rbac: siphon asks `auth can-i {p['verb']} {p['resource']}"
                    f"{' -n ' + p['ns'] if p['ns'] else ''}`, which no {kind} grants")

    def check_file(self, path):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            self.problems.append(f"{path}: {e.strerror}")
            return
        for m in PLACEHOLDER.finditer(text):
            if not GOOD_PLACEHOLDER.match(m.group(1)):
                self.problems.append(f"{path}: placeholder {m.group(0)!r}: write ${{UPPER_CASE}}")
        if re.search(r"\$\{(?![^}\s]*\})", text):
            self.problems.append(f"{path}: an unterminated ${{ placeholder")
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            self.problems.append(f"{path}: not valid YAML: {e}")
            return
        if not docs:
            self.problems.append(f"{path}: no YAML document")
        for n, doc in enumerate(docs, 1):
            self.where = f"{path}: document {n}"
            if not isinstance(doc, dict):
                self.fail("not a mapping")
                continue
            kind = doc.get("kind")
            if kind == "Job":
                self.check_job(doc)
            elif kind == "Secret":
                self.check_secret(doc)
            elif kind is None and "ephemeralContainers" in (doc.get("spec") or {}):
                self.check_ephemeral_patch(doc)
            elif kind is None and "securityContext" in doc and "spec" not in doc:
                self.check_debug_profile(doc, text)
            elif kind in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
                self.check_rbac(doc)
            else:
                self.fail(f"unknown document (kind {kind!r}): expected a Job, a Secret, an "
                          "ephemeralcontainers patch, a kubectl debug profile or RBAC")


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--agent", help="siphon-agent binary whose --help the arguments must fit")
    p.add_argument("--capabilities",
                   default=os.path.join(here, "..", "..", "images", "capabilities.txt"))
    p.add_argument("--permissions",
                   help="JSON list of {verb, resource, ns} the RBAC documents must grant")
    p.add_argument("manifests", nargs="+")
    a = p.parse_args(argv)
    try:
        caps = load_capabilities(a.capabilities)
    except (OSError, ValueError) as e:
        print(f"check_manifests: {e}", file=sys.stderr)
        return 2
    cli = None
    if a.agent:
        try:
            cli = AgentCli(a.agent)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"check_manifests: {e}", file=sys.stderr)
            return 2
    checker = Checker(caps, cli)
    for m in a.manifests:
        checker.check_file(m)
    permissions = None
    if a.permissions:
        with open(a.permissions, encoding="utf-8") as f:
            permissions = json.load(f)
    checker.check_rbac_links(permissions)
    for problem in checker.problems:
        print(problem)
    if checker.problems:
        print(f"check_manifests: {len(checker.problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_manifests: {len(a.manifests)} file(s) ok"
          + ("" if cli else " (agent arguments: mode words only; give --agent)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
