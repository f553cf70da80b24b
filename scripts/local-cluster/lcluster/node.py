"""A node agent: what a kubelet does for this cluster's pods, talking to the
API server over HTTPS like one. It registers its Node and keeps its status
fresh, watches the pods bound to it, and runs each as real containers in
its own containerd: a network namespace per pod (network.py), volumes
(emptyDir, secret, configMap, downwardAPI, projected, hostPath under the
node's own root), env (fieldRef, secretKeyRef, configMapKeyRef, envFrom),
securityContext (user, capabilities, read-only root, privileged,
allowPrivilegeEscalation, seccomp RuntimeDefault), hostPID/hostNetwork/
hostIPC, init and ephemeral containers (targetContainerName shares the
target's PID namespace), readiness/liveness/startup probes (exec, tcpSocket,
httpGet), restarts with back-off, preStop hooks, graceful termination, logs
and port-forward (served to the API server on a Unix socket).

Call-order rules: one PodWorker task per pod does everything to its pod
(starting, stopping, status), woken by `kick`; the containerd event reader
and the probe tasks only record what they saw and kick it.
"""

import asyncio
import base64
import copy
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import time

from . import errors
from . import network
from .client import ApiClient, ApiFailure
from .runtime import Containerd, InvalidImageName, RuntimeError_, normalize_image, run

log = logging.getLogger("node")

KUBELET_OWNED = {"PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"}
# hostPath paths that mean the machine itself (one kernel for all nodes);
# every other hostPath resolves under the node's own root.
HOST_PATHS = ("/proc", "/sys", "/dev", "/lib/modules", "/usr/src")
BACKOFF_MAX = 300.0
CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
        "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
        "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO",
        "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
        "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE",
        "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
        "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"]


class MountError(Exception):
    pass


class ConfigError(Exception):
    pass


def _quantity(q):
    """A resource quantity as a number (bytes, or cores)."""
    if q is None:
        return None
    s = str(q)
    m = re.match(r"^([0-9.]+)([a-zA-Z]*)$", s)
    if not m:
        return None
    n, suf = float(m.group(1)), m.group(2)
    mult = {"": 1, "m": 0.001, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1024,
            "Mi": 1024 ** 2, "Gi": 1024 ** 3, "Ti": 1024 ** 4}.get(suf)
    return None if mult is None else n * mult


def _expand(s, env):
    """$(VAR) references as the API defines them ($$ escapes)."""
    def rep(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", rep, s)


class Run:
    """One incarnation of a container in containerd."""

    def __init__(self, cid, restart, log_path, rootfs, cdir):
        self.cid = cid
        self.restart = restart
        self.log_path = log_path
        self.rootfs = rootfs
        self.dir = cdir
        self.pid = 0
        self.started_at = None
        self.finished_at = None
        self.exit_code = None
        self.oom = False
        self.ready = False
        self.started = False
        self.probe_tasks = []
        self.kill_reason = None
        self.removed = False


class Slot:
    """A container of the pod spec and its history."""

    def __init__(self, kind, spec):
        self.kind = kind  # "init", "main", "ephemeral"
        self.spec = spec
        self.name = spec["name"]
        self.current = None
        self.last = None        # terminated state of the previous run
        self.final = None       # terminated state when it will not run again
        self.restarts = 0
        self.waiting = ("ContainerCreating", None)
        self.backoff = 0.0
        self.not_before = 0.0
        self.image = spec.get("image", "")
        self.image_id = ""
        self.done = False       # init: succeeded; ephemeral: ran
        self.runs = []          # every Run, for logs


class PodWorker:
    def __init__(self, node, pod):
        self.node = node
        self.pod = pod
        md = pod["metadata"]
        self.uid, self.ns, self.name = md["uid"], md["namespace"], md["name"]
        self.dir = os.path.join(node.pods_dir, self.uid)
        self.kick = asyncio.Event()
        self.gone = False
        self.sandbox = False
        self.ip = None
        short = self.uid.replace("-", "")[:10]
        self.netns = "slc-%s-%s" % (node.index, short)
        self.veth = "slcv%s" % short[:10]
        self.slots = {}
        self.volumes = {}
        self.mounts = []        # our own mounts in the pod dir (tmpfs, ipc ns)
        self.start_time = errors.rfc3339()
        self.last_status = None
        self.phase_override = None  # (phase, reason, message)
        self.events_sent = {}
        self.task = None
        self._sync_slots()

    # -- spec tracking ----------------------------------------------------------------
    def update(self, pod):
        self.pod = pod
        self._sync_slots()
        self.kick.set()

    def _sync_slots(self):
        spec = self.pod["spec"]
        for kind, key in (("init", "initContainers"), ("main", "containers"),
                          ("ephemeral", "ephemeralContainers")):
            for c in spec.get(key) or []:
                s = self.slots.get(c["name"])
                if s is None:
                    self.slots[c["name"]] = Slot(kind, c)
                elif s.spec.get("image") != c.get("image") and kind == "main":
                    s.spec = c
                    if s.current is not None and s.current.exit_code is None:
                        s.current.kill_reason = "image changed"

    def slots_of(self, kind):
        return [s for s in self.slots.values() if s.kind == kind]

    @property
    def deleting(self):
        return bool(self.pod["metadata"].get("deletionTimestamp"))

    def event(self, etype, reason, message, once_key=None):
        key = once_key or (reason, message)
        now = time.monotonic()
        if now - self.events_sent.get(key, -1e9) < 30:
            return
        self.events_sent[key] = now
        self.node.spawn(self.node.post_event(self.pod, etype, reason, message))

    # -- state across node agent restarts ---------------------------------------------
    _RUN_FIELDS = ("cid", "restart", "log_path", "rootfs", "dir", "pid", "started_at",
                   "finished_at", "exit_code", "oom", "ready", "started", "removed")
    _SLOT_FIELDS = ("restarts", "last", "final", "waiting", "backoff", "image", "image_id",
                    "done")

    def save(self):
        if not os.path.isdir(self.dir):
            return
        state = {"ip": self.ip, "sandbox": self.sandbox, "mounts": self.mounts,
                 "volumes": self.volumes, "start_time": self.start_time,
                 "phase_override": self.phase_override, "slots": {}}
        for name, s in self.slots.items():
            d = {k: getattr(s, k) for k in self._SLOT_FIELDS}
            d["runs"] = [{k: getattr(r, k) for k in self._RUN_FIELDS} for r in s.runs]
            d["current"] = s.runs.index(s.current) if s.current in s.runs else None
            state["slots"][name] = d
        text = json.dumps(state)
        if text == getattr(self, "_saved", None):
            return
        tmp = os.path.join(self.dir, "state.json.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(self.dir, "state.json"))
        self._saved = text

    def restore(self, state, tasks):
        """Back to what save() wrote; a container that stopped meanwhile is
        reaped by the next step (its exit status was lost with the events)."""
        self.ip = state.get("ip")
        self.sandbox = state.get("sandbox", False)
        self.mounts = state.get("mounts") or []
        self.volumes = state.get("volumes") or {}
        self.start_time = state.get("start_time") or self.start_time
        po = state.get("phase_override")
        self.phase_override = tuple(po) if po else None
        if self.ip and not self.pod["spec"].get("hostNetwork"):
            self.node.ipam.used.add(self.ip)
        if self.sandbox and not self.pod["spec"].get("hostNetwork") and \
                not os.path.exists(network.netns_path(self.netns)):
            raise RuntimeError("its network namespace is gone")
        for name, d in (state.get("slots") or {}).items():
            s = self.slots.get(name)
            if s is None:
                continue
            for k in self._SLOT_FIELDS:
                v = d.get(k)
                setattr(s, k, tuple(v) if k == "waiting" and v else v)
            for rd in d.get("runs") or []:
                r = Run(rd["cid"], rd["restart"], rd["log_path"], rd["rootfs"], rd["dir"])
                for k in self._RUN_FIELDS:
                    setattr(r, k, rd.get(k))
                s.runs.append(r)
            cur = d.get("current")
            if cur is not None and cur < len(s.runs):
                r = s.runs[cur]
                s.current = r
                if r.exit_code is None:
                    self.node.by_cid[r.cid] = (self, s, r)
                    if tasks.get(r.cid, (0, "STOPPED"))[1] != "RUNNING":
                        r.exit_code = 255
                        r.finished_at = errors.rfc3339()
                    else:
                        self._start_probes(s, r, adopted=True)

    def cids(self):
        return {r.cid for s in self.slots.values() for r in s.runs if not r.removed}

    # -- main loop --------------------------------------------------------------------
    async def run(self):
        try:
            while True:
                try:
                    await asyncio.wait_for(self.kick.wait(), 1.0)
                except asyncio.TimeoutError:
                    pass
                self.kick.clear()
                if self.gone:
                    await self.stop_all(0)
                    await self.teardown()
                    return
                if self.deleting:
                    await self.terminate()
                    return
                try:
                    await self.step()
                except Exception:
                    log.exception("pod %s/%s", self.ns, self.name)
                await self.push_status()
                self.save()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod worker %s/%s failed", self.ns, self.name)
        finally:
            self.node.workers.pop(self.uid, None)

    async def step(self):
        await self._reap()
        if self.phase_override:
            return
        if not self.sandbox:
            try:
                await self.setup_sandbox()
            except MountError as e:
                self.event("Warning", "FailedMount", str(e))
                return
        ads = self.pod["spec"].get("activeDeadlineSeconds")
        if ads is not None and (errors.now() - errors.parse_time(self.start_time)
                                ).total_seconds() >= ads:
            self.event("Normal", "DeadlineExceeded", "Pod was active on the node longer than the "
                       "specified deadline")
            await self.stop_all(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            self.phase_override = ("Failed", "DeadlineExceeded", "Pod was active on the node "
                                   "longer than the specified deadline")
            return
        for s in self.slots_of("init"):
            if s.done:
                continue
            if s.current is None and s.final is None:
                await self._maybe_start(s)
            if s.final is not None and not s.done:
                self.phase_override = ("Failed", None, None)
            break
        else:
            for s in self.slots_of("main"):
                if s.current is None and s.final is None:
                    await self._maybe_start(s)
        for s in self.slots_of("ephemeral"):
            if not s.done and s.current is None:
                await self._maybe_start(s)
        for s in self.slots.values():
            r = s.current
            if r is not None and r.exit_code is None and r.kill_reason and not getattr(
                    r, "killing", False):
                r.killing = True
                self.node.spawn(self._kill_run(s, r, self._grace()))

    def _grace(self):
        g = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if g is None:
            g = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        return g

    async def _maybe_start(self, s):
        if time.monotonic() < s.not_before:
            return
        await self.start_container(s)

    async def _reap(self):
        """Handles runs that exited: removes them from containerd, keeps
        their final state, decides restarts."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for s in self.slots.values():
            r = s.current
            if r is None or r.exit_code is None:
                continue
            term = self._terminated(s, r)
            await self._remove_run(r)
            s.current = None
            if s.kind == "ephemeral":
                s.done = True
                s.final = term
                continue
            if s.kind == "init":
                if r.exit_code == 0:
                    s.done = True
                    s.final = term
                    continue
                restart = policy != "Never"
            else:
                restart = policy == "Always" or (policy == "OnFailure" and r.exit_code != 0)
            if not restart:
                s.final = term
                continue
            s.last = term
            s.restarts += 1
            if s.backoff:
                s.not_before = time.monotonic() + s.backoff
                s.waiting = ("CrashLoopBackOff", "back-off %ds restarting failed container=%s "
                             "pod=%s_%s(%s)" % (s.backoff, s.name, self.name, self.ns, self.uid))
                self.event("Warning", "BackOff", "Back-off restarting failed container %s in "
                           "pod %s_%s(%s)" % (s.name, self.name, self.ns, self.uid))
            ran = (errors.parse_time(term["finishedAt"]) - errors.parse_time(
                term["startedAt"])).total_seconds() if term.get("startedAt") else 0
            s.backoff = 10.0 if ran > 600 or not s.backoff else min(BACKOFF_MAX, s.backoff * 2)

    def _terminated(self, s, r):
        code = r.exit_code
        reason = "OOMKilled" if r.oom else ("Completed" if code == 0 else "Error")
        t = {"exitCode": code, "reason": reason, "containerID": "containerd://" + r.cid,
             "startedAt": r.started_at, "finishedAt": r.finished_at or errors.rfc3339()}
        msg = ""
        tpath = os.path.join(r.dir, "termination-log")
        try:
            with open(tpath, "rb") as f:
                msg = f.read(4096).decode(errors="replace")
        except OSError:
            pass
        if not msg and code and s.spec.get("terminationMessagePolicy") == \
                "FallbackToLogsOnError":
            msg = _tail(r.log_path, 80, 2048)
        if msg:
            t["message"] = msg
        return t

    async def _remove_run(self, r):
        if r.removed:
            return
        r.removed = True
        for t in r.probe_tasks:
            t.cancel()
        self.node.by_cid.pop(r.cid, None)
        await self.node.rt.remove(r.cid, r.rootfs)

    # -- sandbox ----------------------------------------------------------------------------
    async def setup_sandbox(self):
        spec = self.pod["spec"]
        os.makedirs(self.dir, exist_ok=True)
        if not spec.get("hostNetwork"):
            if self.ip is None:
                self.ip = self.node.ipam.allocate()
            await network.create_pod_network(self.netns, self.veth, self.node.bridge, self.ip,
                                             self.node.cluster_prefix)
        else:
            self.ip = self.node.node_ip
        ipc = os.path.join(self.dir, "ipc")
        if not spec.get("hostIPC") and not os.path.ismount(ipc):
            open(ipc, "a").close()
            await run("unshare", "--ipc=" + ipc, "true")
            self.mounts.append(ipc)
        hostname = spec.get("hostname") or self.name
        with open(os.path.join(self.dir, "hosts"), "w") as f:
            f.write("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost "
                    "ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n"
                    "fe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n%s\t%s\n" % (
                        self.ip, hostname))
        with open(os.path.join(self.dir, "hostname"), "w") as f:
            f.write(hostname + "\n")
        await self.setup_volumes()
        self.sandbox = True

    async def setup_volumes(self):
        vdir = os.path.join(self.dir, "volumes")
        os.makedirs(vdir, exist_ok=True)
        for v in self.pod["spec"].get("volumes") or []:
            name = v["name"]
            path = os.path.join(vdir, name)
            if "hostPath" in v:
                self.volumes[name] = self._host_path(name, v["hostPath"])
                continue
            if "emptyDir" in v:
                os.makedirs(path, exist_ok=True)
                os.chmod(path, 0o777)
                ed = v["emptyDir"] or {}
                if ed.get("medium") == "Memory" and not os.path.ismount(path):
                    opts = "mode=1777"
                    size = _quantity(ed.get("sizeLimit"))
                    if size:
                        opts += ",size=%d" % int(size)
                    await run("mount", "-t", "tmpfs", "-o", opts, "tmpfs", path)
                    self.mounts.append(path)
            elif "secret" in v:
                await self._write_keyed(path, v["secret"], "secret")
            elif "configMap" in v:
                await self._write_keyed(path, v["configMap"], "configmap")
            elif "downwardAPI" in v:
                self._write_downward(path, v["downwardAPI"].get("items") or [],
                                     v["downwardAPI"].get("defaultMode", 0o644))
            elif "projected" in v:
                os.makedirs(path, exist_ok=True)
                dm = v["projected"].get("defaultMode", 0o644)
                for src in v["projected"].get("sources") or []:
                    if "secret" in src:
                        await self._write_keyed(path, dict(src["secret"], defaultMode=dm),
                                                "secret", clean=False)
                    elif "configMap" in src:
                        await self._write_keyed(path, dict(src["configMap"], defaultMode=dm),
                                                "configmap", clean=False)
                    elif "downwardAPI" in src:
                        self._write_downward(path, src["downwardAPI"].get("items") or [], dm)
            else:
                kind = next((k for k in v if k != "name"), "unknown")
                raise MountError('MountVolume.SetUp failed for volume "%s" : volume type %s is '
                                 "not supported by the local cluster" % (name, kind))
            self.volumes[name] = path

    def _host_path(self, name, hp):
        p = hp.get("path", "")
        if any(p == h or p.startswith(h + "/") for h in HOST_PATHS):
            real = p
        else:
            real = os.path.join(self.node.host_root, p.lstrip("/"))
        t = hp.get("type") or ""
        fail = 'MountVolume.SetUp failed for volume "%s" : hostPath type check failed: %s ' % (
            name, p)
        if t in ("", "DirectoryOrCreate") and not os.path.exists(real):
            os.makedirs(real, 0o755, exist_ok=True)
        elif t == "FileOrCreate" and not os.path.exists(real):
            os.makedirs(os.path.dirname(real), exist_ok=True)
            open(real, "a").close()
        elif t == "Directory" and not os.path.isdir(real):
            raise MountError(fail + "is not a directory")
        elif t == "File" and not os.path.isfile(real):
            raise MountError(fail + "is not a file")
        elif t == "Socket":
            import stat
            try:
                if not stat.S_ISSOCK(os.stat(real).st_mode):
                    raise MountError(fail + "is not a socket file")
            except FileNotFoundError:
                raise MountError(fail + "is not a socket file")
        elif t in ("CharDevice", "BlockDevice"):
            import stat
            try:
                mode = os.stat(real).st_mode
            except FileNotFoundError:
                raise MountError(fail + "is not a %s" % t)
            if (t == "CharDevice" and not stat.S_ISCHR(mode)) or (
                    t == "BlockDevice" and not stat.S_ISBLK(mode)):
                raise MountError(fail + "is not a %s" % t)
        return real

    async def _write_keyed(self, path, src, kind, clean=True):
        name = src.get("secretName") if kind == "secret" else src.get("name")
        optional = src.get("optional", False)
        plural = "secrets" if kind == "secret" else "configmaps"
        try:
            obj = await self.node.api.get("/api/v1/namespaces/%s/%s/%s" % (self.ns, plural, name))
        except ApiFailure as e:
            if e.status == 404 and optional:
                obj = {}
            elif e.status == 404:
                raise MountError('MountVolume.SetUp failed for volume "%s" : %s "%s" not found' % (
                    os.path.basename(path), kind, name))
            else:
                raise MountError(str(e))
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()} \
            if kind == "secret" else dict(
                {k: v.encode() for k, v in (obj.get("data") or {}).items()},
                **{k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        if clean and os.path.isdir(path):
            shutil.rmtree(path)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o755)
        dm = src.get("defaultMode", 0o644)
        items = src.get("items")
        files = [(i["key"], i["path"], i.get("mode", dm)) for i in items] if items else \
            [(k, k, dm) for k in data]
        for key, rel, mode in files:
            if key not in data:
                if optional:
                    continue
                raise MountError('MountVolume.SetUp failed for volume "%s" : configmap references '
                                 "non-existent config key: %s" % (os.path.basename(path), key)
                                 if kind == "configmap" else
                                 'MountVolume.SetUp failed for volume "%s" : references '
                                 "non-existent secret key: %s" % (os.path.basename(path), key))
            dst = os.path.join(path, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(data[key])
            os.chmod(dst, mode)

    def _write_downward(self, path, items, dm):
        os.makedirs(path, exist_ok=True)
        for it in items:
            fr = it.get("fieldRef")
            if not fr:
                continue
            val = self._field(fr.get("fieldPath", ""), file_form=True)
            dst = os.path.join(path, it["path"])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "w") as f:
                f.write(val)
            os.chmod(dst, it.get("mode", dm))

    def _field(self, fp, file_form=False):
        md = self.pod["metadata"]
        if fp in ("metadata.labels", "metadata.annotations") and file_form:
            d = md.get(fp.split(".")[1]) or {}
            return "".join('%s="%s"\n' % (k, d[k]) for k in sorted(d))
        m = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", fp)
        if m:
            return (md.get(m.group(1)) or {}).get(m.group(2), "")
        return {"metadata.name": md.get("name", ""), "metadata.namespace": md.get("namespace", ""),
                "metadata.uid": md.get("uid", ""),
                "spec.nodeName": self.pod["spec"].get("nodeName", ""),
                "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", ""),
                "status.hostIP": self.node.node_ip, "status.hostIPs": self.node.node_ip,
                "status.podIP": self.ip or "", "status.podIPs": self.ip or ""}.get(fp, "")

    # -- containers -----------------------------------------------------------------------------
    async def _env(self, c):
        env = {}
        order = []

        def put(k, v):
            if k not in env:
                order.append(k)
            env[k] = v
        for ef in c.get("envFrom") or []:
            prefix = ef.get("prefix", "")
            for kind, key in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
                ref = ef.get(kind)
                if not ref:
                    continue
                try:
                    obj = await self.node.api.get("/api/v1/namespaces/%s/%s/%s" % (
                        self.ns, key, ref["name"]))
                except ApiFailure as e:
                    if e.status == 404 and ref.get("optional"):
                        continue
                    raise ConfigError('%s "%s" not found' % (
                        "secret" if kind == "secretRef" else "configmap", ref["name"]))
                for k, v in (obj.get("data") or {}).items():
                    put(prefix + k, base64.b64decode(v).decode(errors="replace")
                        if kind == "secretRef" else v)
        for e in c.get("env") or []:
            if "value" in e or "valueFrom" not in e:
                put(e["name"], _expand(e.get("value", ""), env))
                continue
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                put(e["name"], self._field(vf["fieldRef"].get("fieldPath", "")))
            elif "resourceFieldRef" in vf:
                rf = vf["resourceFieldRef"]
                res = rf.get("resource", "")
                target = next((x for x in self.pod["spec"]["containers"]
                               if x["name"] == rf.get("containerName", c["name"])), c)
                kind, _, rname = res.partition(".")
                q = _quantity(((target.get("resources") or {}).get(kind) or {}).get(rname))
                div = _quantity(rf.get("divisor", "1")) or 1
                if q is None:
                    q = self.node.capacity_cpu if rname == "cpu" else self.node.capacity_mem
                put(e["name"], str(int(-(-q // div))))
            else:
                ref = vf.get("secretKeyRef") or vf.get("configMapKeyRef")
                secret = "secretKeyRef" in vf
                try:
                    obj = await self.node.api.get("/api/v1/namespaces/%s/%s/%s" % (
                        self.ns, "secrets" if secret else "configmaps", ref["name"]))
                except ApiFailure as ex:
                    if ex.status == 404 and ref.get("optional"):
                        continue
                    raise ConfigError('%s "%s" not found' % (
                        "secret" if secret else "configmap", ref["name"]))
                data = obj.get("data") or {}
                if ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError("couldn't find key %s in %s %s/%s" % (
                        ref["key"], "Secret" if secret else "ConfigMap", self.ns, ref["name"]))
                v = data[ref["key"]]
                put(e["name"], base64.b64decode(v).decode(errors="replace") if secret else v)
        return env, order

    async def start_container(self, s):
        node = self.node
        c = s.spec
        s.waiting = ("ContainerCreating", None)
        # The image: never pulled, present in the node's containerd or not.
        try:
            ref = normalize_image(c.get("image", ""))
        except InvalidImageName as e:
            s.waiting = ("InvalidImageName", 'Failed to apply default image tag "%s": couldn\'t '
                         "parse image name \"%s\": %s" % (c.get("image"), c.get("image"), e))
            self.event("Warning", "InspectFailed", s.waiting[1])
            return
        images = await node.rt.images()
        if ref not in images:
            first = s.waiting[0] not in ("ErrImagePull", "ImagePullBackOff")
            msg = ('failed to pull and unpack image "%s": failed to resolve reference "%s": '
                   "%s: not found (the local cluster never pulls: import the image into the "
                   "node's containerd)" % (ref, ref, ref))
            if first or s.waiting[0] == "ImagePullBackOff":
                s.waiting = ("ErrImagePull", msg)
                self.event("Normal", "Pulling", 'Pulling image "%s"' % c.get("image"))
                self.event("Warning", "Failed", 'Failed to pull image "%s": %s' % (
                    c.get("image"), msg))
                self.event("Warning", "Failed", "Error: ErrImagePull")
                s.backoff_img = min(BACKOFF_MAX, getattr(s, "backoff_img", 5.0) * 2)
                s.not_before = time.monotonic() + 2.0
            else:
                s.waiting = ("ImagePullBackOff", 'Back-off pulling image "%s"' % c.get("image"))
                self.event("Normal", "BackOff", 'Back-off pulling image "%s"' % c.get("image"))
                self.event("Warning", "Failed", "Error: ImagePullBackOff")
                s.not_before = time.monotonic() + getattr(s, "backoff_img", 10.0)
            return
        mdigest, config = await node.rt.image_config(ref, images[ref])
        s.image = ref
        s.image_id = "%s@%s" % (ref.split("@")[0].rsplit(":", 1)[0], mdigest)
        self.event("Normal", "Pulled", 'Container image "%s" already present on machine' %
                   c.get("image"), once_key=("Pulled", s.name, s.restarts))
        try:
            env, order = await self._env(c)
        except ConfigError as e:
            s.waiting = ("CreateContainerConfigError", str(e))
            self.event("Warning", "Failed", "Error: " + str(e))
            s.not_before = time.monotonic() + 2.0
            return
        cid = errors.hex_id(64)
        cdir = os.path.join(self.dir, "containers", cid)
        os.makedirs(cdir, exist_ok=True)
        ldir = os.path.join(self.dir, "logs", s.name)
        os.makedirs(ldir, exist_ok=True)
        r = Run(cid, s.restarts, os.path.join(ldir, "%d.log" % s.restarts),
                os.path.join(cdir, "rootfs"), cdir)
        open(os.path.join(cdir, "termination-log"), "w").close()
        try:
            spec = self._oci_spec(s, r, config, env, order)
        except ConfigError as e:
            s.waiting = ("CreateContainerError", str(e))
            self.event("Warning", "Failed", "Error: " + str(e))
            s.not_before = time.monotonic() + 5.0
            return
        r.started_at = errors.rfc3339()
        try:
            cfg = config.get("rootfs", {}).get("diff_ids") or []
            await node.rt.prepare_rootfs(cid, node.rt.chain_id(cfg), r.rootfs)
            self._resolve_user(spec, r, s)
            if r.seccomp:
                spec["linux"]["seccomp"] = await node.rt.seccomp_for(
                    spec["process"]["capabilities"]["bounding"], node.default_caps)
            spec_path = os.path.join(cdir, "config.json")
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            node.by_cid[cid] = (self, s, r)
            s.current = r
            s.runs.append(r)
            await node.rt.start(cid, spec_path, r.log_path, os.path.join(cdir, "pid"), {
                "io.kubernetes.pod.name": self.name, "io.kubernetes.pod.namespace": self.ns,
                "io.kubernetes.pod.uid": self.uid, "io.kubernetes.container.name": s.name})
        except (RuntimeError_, ConfigError, OSError) as e:
            msg = str(e)
            log.warning("pod %s/%s container %s: %s", self.ns, self.name, s.name, msg)
            self.event("Warning", "Failed", "Error: failed to start container \"%s\": %s" % (
                s.name, msg))
            r.exit_code = 128
            r.finished_at = errors.rfc3339()
            r.start_error = msg
            self.kick.set()
            return
        try:
            with open(os.path.join(cdir, "pid")) as f:
                r.pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            r.pid = 0
        s.waiting = None
        self.event("Normal", "Created", "Created container " + s.name,
                   once_key=("Created", s.name, s.restarts))
        self.event("Normal", "Started", "Started container " + s.name,
                   once_key=("Started", s.name, s.restarts))
        self._start_probes(s, r)

    def _oci_spec(self, s, r, config, env, order):
        node = self.node
        c = s.spec
        pod = self.pod
        pspec = pod["spec"]
        psc = pspec.get("securityContext") or {}
        csc = c.get("securityContext") or {}
        spec = copy.deepcopy(node.base_spec)
        ic = config.get("config") or {}
        # argv: command replaces the entrypoint, args the image's Cmd.
        if c.get("command"):
            argv = [_expand(a, env) for a in c["command"]] + [_expand(a, env)
                                                              for a in c.get("args") or []]
        elif c.get("args") is not None and "args" in c:
            argv = list(ic.get("Entrypoint") or []) + [_expand(a, env) for a in c["args"]]
        else:
            argv = list(ic.get("Entrypoint") or []) + list(ic.get("Cmd") or [])
        if not argv:
            raise ConfigError("no command specified")
        hostname = pspec.get("hostname") or self.name
        envl = list(ic.get("Env") or [])
        img_keys = {e.split("=", 1)[0] for e in envl}
        for k in order:
            if k in img_keys:
                envl = [e for e in envl if e.split("=", 1)[0] != k]
            envl.append("%s=%s" % (k, env[k]))
        if not pspec.get("hostNetwork"):
            envl.append("HOSTNAME=" + hostname)
        proc = spec["process"]
        proc["args"] = argv
        proc["env"] = envl
        proc["cwd"] = c.get("workingDir") or ic.get("WorkingDir") or "/"
        proc["terminal"] = bool(c.get("tty"))
        # No rlimits: like the CRI, the process keeps the runtime's own.
        proc.pop("rlimits", None)
        privileged = bool(csc.get("privileged"))
        if privileged:
            caps = ["CAP_" + x for x in CAPS[:self.node.cap_last + 1]]
        else:
            caps = [x for x in proc["capabilities"]["bounding"]]
            drop = {d.upper().replace("CAP_", "") for d in (csc.get("capabilities") or {}).get(
                "drop") or []}
            if "ALL" in drop:
                caps = []
            else:
                caps = [x for x in caps if x.replace("CAP_", "") not in drop]
            for a in (csc.get("capabilities") or {}).get("add") or []:
                a = a.upper().replace("CAP_", "")
                if a == "ALL":
                    caps = ["CAP_" + x for x in CAPS[:self.node.cap_last + 1]]
                elif "CAP_" + a not in caps:
                    caps.append("CAP_" + a)
        proc["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps}
        proc["noNewPrivileges"] = csc.get("allowPrivilegeEscalation") is False and not privileged
        proc["user"] = {"uid": 0, "gid": 0}
        r.user_request = (csc.get("runAsUser", psc.get("runAsUser")),
                          csc.get("runAsGroup", psc.get("runAsGroup")),
                          list(psc.get("supplementalGroups") or []) + (
                              [psc["fsGroup"]] if psc.get("fsGroup") is not None else []),
                          csc.get("runAsNonRoot", psc.get("runAsNonRoot")), ic.get("User", ""))
        spec["root"] = {"path": r.rootfs, "readonly": bool(csc.get("readOnlyRootFilesystem"))}
        spec["hostname"] = hostname
        mounts = [m for m in spec["mounts"] if m["destination"] not in ("/run",)]
        extra = []
        mounts.append({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                       "options": ["nosuid", "noexec", "nodev", "relatime",
                                   "rw" if privileged else "ro"]})
        if privileged:
            for m in mounts:
                if m["destination"] == "/sys":
                    m["options"] = [o for o in m["options"] if o != "ro"] + ["rw"]
        for f, dst in (("hosts", "/etc/hosts"), ("hostname", "/etc/hostname")):
            extra.append({"destination": dst, "type": "bind",
                           "source": os.path.join(self.dir, f), "options": ["rbind", "rw"]})
        if c.get("terminationMessagePath"):
            extra.append({"destination": c["terminationMessagePath"], "type": "bind",
                           "source": os.path.join(r.dir, "termination-log"),
                           "options": ["rbind", "rw"]})
        for vm in c.get("volumeMounts") or []:
            src = self.volumes.get(vm["name"])
            if src is None:
                raise ConfigError('volume "%s" is not mounted' % vm["name"])
            if vm.get("subPath"):
                src = os.path.join(src, vm["subPath"])
                if not os.path.exists(src):
                    os.makedirs(src, exist_ok=True)
            opts = ["rbind", "rprivate", "ro" if vm.get("readOnly") else "rw"]
            extra.append({"destination": vm["mountPath"], "type": "bind", "source": src,
                          "options": opts})
        # Parents before children, as containerd's CRI orders them: /run
        # before /var/run/siphon (which the image's /var/run -> ../run link
        # puts under it) and before /run/containerd/containerd.sock.
        extra.sort(key=lambda m: os.path.normpath(m["destination"]).count("/"))
        spec["mounts"] = mounts + extra
        lx = spec["linux"]
        ns = [{"type": "mount"}]
        if not pspec.get("hostNetwork"):
            ns.append({"type": "network", "path": network.netns_path(self.netns)})
            ns.append({"type": "uts"})
        if not pspec.get("hostIPC"):
            ns.append({"type": "ipc", "path": os.path.join(self.dir, "ipc")})
        if not pspec.get("hostPID"):
            target = c.get("targetContainerName") if s.kind == "ephemeral" else None
            tslot = self.slots.get(target) if target else None
            if tslot is not None and tslot.current is not None and tslot.current.pid:
                ns.append({"type": "pid", "path": "/proc/%d/ns/pid" % tslot.current.pid})
            else:
                ns.append({"type": "pid"})
        if node.cgroup2:
            ns.append({"type": "cgroup"})
        lx["namespaces"] = ns
        if pspec.get("hostNetwork"):
            spec.pop("hostname", None)
        lx["cgroupsPath"] = "%s/pod%s/%s" % (node.cgroup_parent, self.uid, r.cid)
        res = {"devices": lx.get("resources", {}).get("devices", [])}
        if privileged:
            res["devices"] = [{"allow": True, "access": "rwm"}]
            lx.pop("maskedPaths", None)
            lx.pop("readonlyPaths", None)
        limits = (c.get("resources") or {}).get("limits") or {}
        mem = _quantity(limits.get("memory"))
        if mem:
            res["memory"] = {"limit": int(mem)}
        cpu = _quantity(limits.get("cpu"))
        if cpu:
            res["cpu"] = {"quota": int(cpu * 100000), "period": 100000}
        lx["resources"] = res
        sc = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        lx.pop("seccomp", None)
        r.seccomp = sc == "RuntimeDefault" and not privileged
        return spec

    def _resolve_user(self, spec, r, s):
        """The process's uid and gids: runAsUser/runAsGroup, else the image's
        User (a name is looked up in the image's /etc/passwd)."""
        rootfs = r.rootfs
        uid, gid, groups, nonroot, image_user = r.user_request
        if uid is None:
            u = (image_user or "").split(":")[0]
            if u.isdigit() or u == "":
                uid = int(u or 0)
            else:
                uid = _passwd_lookup(rootfs, u)
                if uid is None:
                    raise ConfigError('unable to find user %s: no matching entries in passwd '
                                      "file" % u)
        if gid is None:
            g = (image_user or "").split(":")[1] if ":" in (image_user or "") else ""
            gid = int(g) if g.isdigit() else 0
        if nonroot and uid == 0:
            raise ConfigError("container has runAsNonRoot and image will run as root (pod: "
                              '"%s_%s(%s)", container: %s)' % (self.name, self.ns, self.uid,
                                                                s.name))
        spec["process"]["user"] = {"uid": int(uid), "gid": int(gid)}
        if groups:
            spec["process"]["user"]["additionalGids"] = [int(x) for x in groups]

    # -- probes -----------------------------------------------------------------------------------
    def _start_probes(self, s, r, adopted=False):
        c = s.spec
        sp, rp, lp = c.get("startupProbe"), c.get("readinessProbe"), c.get("livenessProbe")
        if adopted and r.started:
            sp = None
        if not sp:
            r.started = True
        if not rp and s.kind != "ephemeral":
            r.ready = r.started
        started = asyncio.Event()
        if r.started:
            started.set()
        if sp:
            r.probe_tasks.append(asyncio.ensure_future(self._probe_loop(s, r, sp, "Startup",
                                                                        started)))
        if rp:
            r.probe_tasks.append(asyncio.ensure_future(self._probe_loop(s, r, rp, "Readiness",
                                                                        started)))
        if lp:
            r.probe_tasks.append(asyncio.ensure_future(self._probe_loop(s, r, lp, "Liveness",
                                                                        started)))

    async def _probe_loop(self, s, r, p, kind, started):
        if kind != "Startup":
            await started.wait()
        await asyncio.sleep(p.get("initialDelaySeconds", 0))
        ok_run, bad_run = 0, 0
        while r.exit_code is None and not r.removed:
            ok, why = await self._probe_once(s, r, p)
            if ok:
                ok_run, bad_run = ok_run + 1, 0
            else:
                ok_run, bad_run = 0, bad_run + 1
                self.event("Warning", "Unhealthy", "%s probe failed: %s" % (kind, why),
                           once_key=("Unhealthy", s.name, kind))
            if kind == "Startup":
                if ok:
                    r.started = True
                    if not s.spec.get("readinessProbe"):
                        r.ready = True
                    started.set()
                    self.kick.set()
                    return
                if bad_run >= p.get("failureThreshold", 3):
                    r.kill_reason = "startup probe"
                    self.event("Normal", "Killing", "Container %s failed startup probe, will be "
                               "restarted" % s.name)
                    self.kick.set()
                    return
            elif kind == "Readiness":
                if ok and ok_run >= p.get("successThreshold", 1) and not r.ready:
                    r.ready = True
                    self.kick.set()
                elif not ok and bad_run >= p.get("failureThreshold", 3) and r.ready:
                    r.ready = False
                    self.kick.set()
            else:
                if not ok and bad_run >= p.get("failureThreshold", 3):
                    r.kill_reason = "liveness probe"
                    self.event("Normal", "Killing", "Container %s failed liveness probe, will be "
                               "restarted" % s.name)
                    self.kick.set()
                    return
            await asyncio.sleep(p.get("periodSeconds", 10) if ok or kind != "Startup" else
                                p.get("periodSeconds", 10))

    async def _probe_once(self, s, r, p):
        timeout = p.get("timeoutSeconds", 1)
        host = self.ip or "127.0.0.1"
        try:
            if "exec" in p:
                rc, out = await self.node.rt.exec(r.cid, p["exec"].get("command") or [],
                                                  timeout + 5)
                return rc == 0, "command %s exited with %d: %s" % (
                    p["exec"].get("command"), rc, out.strip()[:200])
            if "tcpSocket" in p:
                port = self._port(s, p["tcpSocket"].get("port"))
                h = p["tcpSocket"].get("host") or host
                _, w = await asyncio.wait_for(asyncio.open_connection(
                    h, port, local_addr=(self.node.node_ip, 0) if not self.pod["spec"].get(
                        "hostNetwork") else None), timeout)
                w.close()
                return True, ""
            if "httpGet" in p:
                g = p["httpGet"]
                port = self._port(s, g.get("port"))
                h = g.get("host") or host
                ssl_ctx = None
                if g.get("scheme") == "HTTPS":
                    import ssl
                    ssl_ctx = ssl.create_default_context()
                    ssl_ctx.check_hostname = False
                    ssl_ctx.verify_mode = ssl.CERT_NONE
                rd, w = await asyncio.wait_for(asyncio.open_connection(
                    h, port, ssl=ssl_ctx, local_addr=(self.node.node_ip, 0)
                    if not self.pod["spec"].get("hostNetwork") else None), timeout)
                hdrs = {"Host": "%s:%d" % (h, port), "User-Agent": "kube-probe/1.32",
                        "Accept": "*/*", "Connection": "close"}
                for hh in g.get("httpHeaders") or []:
                    hdrs[hh["name"]] = hh["value"]
                w.write(("GET %s HTTP/1.1\r\n" % (g.get("path") or "/") + "".join(
                    "%s: %s\r\n" % kv for kv in hdrs.items()) + "\r\n").encode())
                line = await asyncio.wait_for(rd.readline(), timeout)
                w.close()
                parts = line.split()
                code = int(parts[1]) if len(parts) > 1 else 0
                return 200 <= code < 400, "HTTP probe failed with statuscode: %d" % code
            if "grpc" in p:
                return False, "gRPC probes are not supported by the local cluster"
            return True, ""
        except (OSError, asyncio.TimeoutError, ValueError) as e:
            return False, str(e) or type(e).__name__

    def _port(self, s, port):
        if isinstance(port, int):
            return port
        if isinstance(port, str) and port.isdigit():
            return int(port)
        for c in self.pod["spec"].get("containers") or []:
            for p in c.get("ports") or []:
                if p.get("name") == port:
                    return p["containerPort"]
        raise ValueError("named port %s not found" % port)

    # -- stopping ---------------------------------------------------------------------------------
    async def _kill_run(self, s, r, grace):
        """preStop, SIGTERM (the image's stop signal), SIGKILL after the grace
        period; returns once the run exited."""
        deadline = time.monotonic() + grace
        hook = (s.spec.get("lifecycle") or {}).get("preStop")
        if hook and r.exit_code is None and grace > 0:
            try:
                await asyncio.wait_for(self._hook(s, r, hook), max(0.1, grace))
            except asyncio.TimeoutError:
                pass
        if r.exit_code is None:
            await self.node.rt.kill(r.cid, "SIGTERM")
        while r.exit_code is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if r.exit_code is None:
            await self.node.rt.kill(r.cid, "SIGKILL")
            for _ in range(100):
                if r.exit_code is not None:
                    break
                await asyncio.sleep(0.1)
        if r.exit_code is None:
            # No exit event (containerd restarted?): ask it directly.
            tasks = await self.node.rt.tasks()
            if tasks.get(r.cid, (0, "STOPPED"))[1] == "STOPPED":
                r.exit_code = 137
                r.finished_at = errors.rfc3339()
        self.kick.set()

    async def _hook(self, s, r, hook):
        if "exec" in hook:
            await self.node.rt.exec(r.cid, hook["exec"].get("command") or [], 3600)
        elif "httpGet" in hook:
            await self._probe_once(s, r, {"httpGet": hook["httpGet"], "timeoutSeconds": 30})
        elif "sleep" in hook:
            await asyncio.sleep(hook["sleep"].get("seconds", 0))

    async def stop_all(self, grace):
        runs = [(s, s.current) for s in self.slots.values()
                if s.current is not None and s.current.exit_code is None]
        await asyncio.gather(*(self._kill_run(s, r, grace) for s, r in runs))
        await self._reap_final()

    async def _reap_final(self):
        for s in self.slots.values():
            r = s.current
            if r is None:
                continue
            term = self._terminated(s, r) if r.exit_code is not None else None
            await self._remove_run(r)
            s.current = None
            if term:
                s.final = term

    async def terminate(self):
        grace = self._grace()
        self.event("Normal", "Killing", "Stopping pod %s" % self.name)
        await self.stop_all(grace)
        codes = [s.final.get("exitCode") for s in self.slots.values() if s.final and
                 s.kind == "main"]
        self.phase_override = ("Succeeded" if codes and all(c == 0 for c in codes) and all(
            s.final for s in self.slots_of("main")) else "Failed", None, None)
        await self.push_status()
        await self.teardown()
        try:
            await self.node.api.request(
                "DELETE", "/api/v1/namespaces/%s/pods/%s" % (self.ns, self.name),
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                 "preconditions": {"uid": self.uid}})
        except (ApiFailure, OSError) as e:
            log.info("final delete of %s/%s: %s", self.ns, self.name, e)

    async def teardown(self):
        for s in self.slots.values():
            for r in s.runs:
                await self._remove_run(r)
        if self.sandbox or os.path.exists(network.netns_path(self.netns)):
            await network.delete_pod_network(self.netns, self.veth)
        if self.ip and not self.pod["spec"].get("hostNetwork"):
            self.node.ipam.release(self.ip)
        for m in reversed(self.mounts):
            await run("umount", "-l", m, check=False)
        self.mounts = []
        await _umount_under(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.sandbox = False

    # -- status ------------------------------------------------------------------------------------
    def _container_status(self, s):
        st = {"name": s.name, "image": s.image or s.spec.get("image", ""),
              "imageID": s.image_id, "restartCount": s.restarts}
        r = s.current
        if r is not None and r.exit_code is None:
            st["state"] = {"running": {"startedAt": r.started_at}}
            st["containerID"] = "containerd://" + r.cid
            st["ready"] = bool(r.ready) if s.kind != "ephemeral" else False
            st["started"] = bool(r.started)
        elif s.final is not None and (s.current is None or s.current.exit_code is not None):
            st["state"] = {"terminated": s.final}
            st["containerID"] = s.final["containerID"]
            st["ready"] = False
            st["started"] = False
        elif r is not None:
            st["state"] = {"terminated": self._terminated(s, r)}
            st["containerID"] = "containerd://" + r.cid
            st["ready"] = False
            st["started"] = False
        else:
            reason, msg = s.waiting or ("ContainerCreating", None)
            w = {"reason": reason}
            if msg:
                w["message"] = msg
            st["state"] = {"waiting": w}
            st["ready"] = False
            st["started"] = False
            if s.last:
                st["containerID"] = s.last["containerID"]
        st["lastState"] = {"terminated": s.last} if s.last else {}
        if s.kind == "ephemeral":
            st.pop("ready", None)
            st.pop("started", None)
            st["ready"] = False
        return st

    def compute_status(self):
        pod = self.pod
        spec = pod["spec"]
        old = pod.get("status") or {}
        inits = [self._container_status(s) for s in self.slots_of("init")]
        mains = []
        for c in spec.get("containers") or []:
            s = self.slots[c["name"]]
            cs = self._container_status(s)
            if not all(x.done for x in self.slots_of("init")) and "waiting" in cs["state"]:
                cs["state"] = {"waiting": {"reason": "PodInitializing"}}
            mains.append(cs)
        ephs = [self._container_status(s) for s in self.slots_of("ephemeral")]
        running = stopped = succeeded = waiting = 0
        for cs in mains:
            stt = cs["state"]
            if "running" in stt:
                running += 1
            elif "terminated" in stt:
                stopped += 1
                if stt["terminated"].get("exitCode") == 0:
                    succeeded += 1
            elif cs.get("lastState", {}).get("terminated"):
                stopped += 1
            else:
                waiting += 1
        policy = spec.get("restartPolicy", "Always")
        init_done = all(s.done for s in self.slots_of("init"))
        if self.phase_override:
            phase = self.phase_override[0]
        elif not init_done or waiting:
            phase = "Pending"
        elif running:
            phase = "Running"
        elif stopped:
            if policy == "Always":
                phase = "Running"
            elif stopped == succeeded:
                phase = "Succeeded"
            elif policy == "Never":
                phase = "Failed"
            else:
                phase = "Running"
        else:
            phase = "Pending"
        st = {"phase": phase, "hostIP": self.node.node_ip,
              "hostIPs": [{"ip": self.node.node_ip}], "startTime": self.start_time}
        if self.ip and self.sandbox or (self.ip and phase in ("Succeeded", "Failed")):
            st["podIP"] = self.ip
            st["podIPs"] = [{"ip": self.ip}]
        if "qosClass" in old:
            st["qosClass"] = old["qosClass"]
        if self.phase_override and self.phase_override[1]:
            st["reason"] = self.phase_override[1]
            st["message"] = self.phase_override[2]
        conds = [c for c in old.get("conditions") or [] if c.get("type") not in KUBELET_OWNED]
        st["conditions"] = conds
        from .registry import set_condition
        prev = {c["type"]: c for c in old.get("conditions") or []}
        for c in prev.values():
            if c["type"] in KUBELET_OWNED:
                conds.append(copy.deepcopy(c))
        terminal = phase in ("Succeeded", "Failed")
        set_condition(st, "PodReadyToStartContainers", "True" if self.sandbox and not terminal
                      else "False")
        pending_init = [s.name for s in self.slots_of("init") if not s.done]
        if pending_init:
            set_condition(st, "Initialized", "False", "ContainersNotInitialized",
                          "containers with incomplete status: [%s]" % " ".join(pending_init))
        else:
            set_condition(st, "Initialized", "True")
        unready = [cs["name"] for cs in mains if not cs.get("ready")]
        if terminal:
            set_condition(st, "ContainersReady", "False", "PodCompleted", "")
            set_condition(st, "Ready", "False", "PodCompleted", "")
        elif unready:
            msg = "containers with unready status: [%s]" % " ".join(unready)
            set_condition(st, "ContainersReady", "False", "ContainersNotReady", msg)
            set_condition(st, "Ready", "False", "ContainersNotReady", msg)
        else:
            set_condition(st, "ContainersReady", "True")
            set_condition(st, "Ready", "True")
        order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                 "PodScheduled"]
        st["conditions"].sort(key=lambda c: order.index(c["type"]) if c["type"] in order else 99)
        for c in st["conditions"]:
            c.setdefault("lastProbeTime", None)
        if inits:
            st["initContainerStatuses"] = inits
        st["containerStatuses"] = mains
        if ephs:
            st["ephemeralContainerStatuses"] = ephs
        return st

    async def push_status(self):
        st = self.compute_status()
        if st == self.last_status:
            return
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.name, "namespace": self.ns}, "status": st}
        try:
            pod = await self.node.api.request(
                "PUT", "/api/v1/namespaces/%s/pods/%s/status" % (self.ns, self.name), body)
            self.last_status = st
            if pod.get("metadata", {}).get("uid") == self.uid:
                self.pod = pod
        except ApiFailure as e:
            if e.status == 404:
                self.gone = True
                self.kick.set()
            else:
                log.warning("status of %s/%s: %s", self.ns, self.name, e)
        except OSError as e:
            log.warning("status of %s/%s: %s", self.ns, self.name, e)


def _passwd_lookup(rootfs, name):
    try:
        with open(os.path.join(rootfs, "etc/passwd")) as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) > 2 and parts[0] == name:
                    return int(parts[2])
    except OSError:
        pass
    return None


def _tail(path, lines, limit):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            data = f.read()
    except OSError:
        return ""
    out = b"\n".join(data.split(b"\n")[-lines:])
    return out[-limit:].decode(errors="replace")


async def _umount_under(d):
    mps = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mp = line.split()[4].replace("\\040", " ")
                if mp == d or mp.startswith(d + "/"):
                    mps.append(mp)
    except OSError:
        return
    for mp in sorted(mps, key=len, reverse=True):
        await run("umount", "-l", mp, check=False)


class Node:
    def __init__(self, args):
        self.name = args.name
        self.dir = args.dir
        # Short, for names with a length limit: the node's number.
        digits = re.sub(r"[^0-9]", "", self.name)
        self.index = "n" + (digits[-3:] or hashlib.sha1(self.name.encode()).hexdigest()[:3])
        self.host_root = os.path.join(self.dir, "host")
        self.pods_dir = os.path.join(self.dir, "pods")
        self.bridge = args.bridge
        self.ipam = network.Ipam(args.pod_cidr)
        self.node_ip = self.ipam.gateway
        self.pod_prefix = int(args.pod_cidr.split("/")[1])
        self.cluster_prefix = int(args.cluster_cidr.split("/")[1])
        self.pod_cidr = args.pod_cidr
        with open(args.token_file) as f:
            token = f.read().strip()
        self.api = ApiClient(args.server, args.ca, token)
        self.rt = Containerd(args.containerd_socket, self.dir)
        self.cgroup_parent = args.cgroup_parent
        self.cgroup2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        self.workers = {}
        self.by_cid = {}
        self.tasks = set()
        self.capacity_cpu = os.cpu_count() or 1
        self.capacity_mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        try:
            with open("/proc/sys/kernel/cap_last_cap") as f:
                self.cap_last = int(f.read())
        except OSError:
            self.cap_last = 40
        self.socket_path = os.path.join(self.dir, "kubelet.sock")

    def spawn(self, coro):
        t = asyncio.ensure_future(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t

    async def run(self):
        os.makedirs(self.pods_dir, exist_ok=True)
        os.makedirs(self.host_root, exist_ok=True)
        base = await self.rt.base_spec()
        base["linux"].pop("seccomp", None)
        self.default_caps = list(base["process"]["capabilities"]["bounding"])
        self.base_spec = base
        await network.ensure_bridge(self.bridge, self.node_ip, self.pod_prefix)
        await self.register()
        await self.adopt()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = await asyncio.start_unix_server(self.serve, self.socket_path, limit=1 << 20)
        self.spawn(self.event_loop())
        self.spawn(self.heartbeat())
        log.info("node %s ready (ip %s, pods %s)", self.name, self.node_ip, self.pod_cidr)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        import signal
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watch = self.spawn(self.watch_pods())
        await stop.wait()
        # Leaving like a kubelet that stops: the pods' containers keep
        # running and the next start adopts them (scripts/local-cluster.sh
        # down removes them).
        watch.cancel()
        server.close()
        for w in list(self.workers.values()):
            if w.task:
                w.task.cancel()
            w.save()

    async def adopt(self):
        """Takes back the pods an earlier run of this node agent left
        running (their state in pods/UID/state.json, their containers in
        containerd), and removes everything else it left: containers,
        mounts, network namespaces, pod directories."""
        try:
            lst = await self.api.get("/api/v1/pods?fieldSelector=spec.nodeName%3D" + self.name)
            pods = {p["metadata"]["uid"]: p for p in lst["items"]}
        except (ApiFailure, OSError) as e:
            log.warning("listing this node's pods: %s", e)
            pods = {}
        tasks = await self.rt.tasks()
        keep_cids = set()
        for uid in os.listdir(self.pods_dir):
            path = os.path.join(self.pods_dir, uid, "state.json")
            pod = pods.get(uid)
            try:
                with open(path) as f:
                    state = json.load(f)
            except (OSError, ValueError):
                state = None
            if pod is None or state is None:
                continue
            w = PodWorker(self, pod)
            try:
                w.restore(state, tasks)
            except Exception:
                log.exception("adopting pod %s", uid)
                continue
            self.workers[uid] = w
            keep_cids |= w.cids()
        await self.cleanup_leftovers(keep_cids)
        for w in self.workers.values():
            log.info("adopted pod %s/%s", w.ns, w.name)
            w.task = self.spawn(w.run())
            w.kick.set()

    async def cleanup_leftovers(self, keep_cids=frozenset()):
        """What an earlier run of this node left and no adopted pod owns:
        containers, mounts, network namespaces and veths, pod directories."""
        orphans = [c for c in await self.rt.containers() if c not in keep_cids]
        for cid in orphans:
            await self.rt.kill(cid, "SIGKILL")
        for _ in range(20):
            tasks = await self.rt.tasks()
            if all(st != "RUNNING" for c, (_, st) in tasks.items() if c in orphans):
                break
            await asyncio.sleep(0.1)
        kept_dirs = [os.path.join(self.pods_dir, uid) for uid in self.workers]
        for cid in orphans:
            await self.rt.remove(cid, None)
        mps = []
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    mps.append(line.split()[4].replace("\\040", " "))
        except OSError:
            pass
        for mp in sorted(mps, key=len, reverse=True):
            if mp.startswith(self.pods_dir + "/") and not any(
                    mp == d or mp.startswith(d + "/") for d in kept_dirs):
                await run("umount", "-l", mp, check=False)
        _, out, _ = await run("ctr", "-a", self.rt.socket, "-n", "k8s.io", "snapshots", "ls",
                              check=False)
        for line in out.splitlines()[1:]:
            f = line.split()
            if f and len(f) >= 3 and f[2] == "Active" and f[0] not in keep_cids:
                await run("ctr", "-a", self.rt.socket, "-n", "k8s.io", "snapshots", "rm", f[0],
                          check=False)
        prefix = "slc-%s-" % self.index
        kept_ns = {w.netns for w in self.workers.values()}
        if os.path.isdir("/run/netns"):
            for n in os.listdir("/run/netns"):
                if n.startswith(prefix) and n not in kept_ns:
                    await run("ip", "netns", "del", n, check=False)
        for uid in os.listdir(self.pods_dir):
            if uid not in self.workers:
                shutil.rmtree(os.path.join(self.pods_dir, uid), ignore_errors=True)

    # -- the Node object ----------------------------------------------------------------------
    def _node_status(self):
        now = errors.rfc3339()
        osimg = "Linux"
        try:
            with open("/etc/os-release") as f:
                for line in f:
                    if line.startswith("PRETTY_NAME="):
                        osimg = line.split("=", 1)[1].strip().strip('"')
        except OSError:
            pass
        cap = {"cpu": str(self.capacity_cpu), "memory": "%dKi" % (self.capacity_mem // 1024),
               "pods": "110", "ephemeral-storage": "100Gi"}

        def cond(t, s, reason, msg):
            return {"type": t, "status": s, "reason": reason, "message": msg,
                    "lastHeartbeatTime": now, "lastTransitionTime": self.started}
        return {"capacity": cap, "allocatable": dict(cap),
                "conditions": [
                    cond("MemoryPressure", "False", "KubeletHasSufficientMemory",
                         "kubelet has sufficient memory available"),
                    cond("DiskPressure", "False", "KubeletHasNoDiskPressure",
                         "kubelet has no disk pressure"),
                    cond("PIDPressure", "False", "KubeletHasSufficientPID",
                         "kubelet has sufficient PID available"),
                    cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")],
                "addresses": [{"type": "InternalIP", "address": self.node_ip},
                              {"type": "Hostname", "address": self.name}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "nodeInfo": {"machineID": _read("/etc/machine-id"), "systemUUID": "",
                             "bootID": _read("/proc/sys/kernel/random/boot_id"),
                             "kernelVersion": os.uname().release, "osImage": osimg,
                             "containerRuntimeVersion": "containerd://1.6",
                             "kubeletVersion": "v1.32.4", "kubeProxyVersion": "v1.32.4",
                             "operatingSystem": "linux",
                             "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                                 os.uname().machine, os.uname().machine)}}

    async def register(self):
        self.started = errors.rfc3339()
        _, out, _ = await run("containerd", "--version", check=False)
        m = re.search(r"\s(\d+\.\d+\.\d+)", out)
        ver = m.group(1) if m else "1.6"
        status = self._node_status()
        status["nodeInfo"]["containerRuntimeVersion"] = "containerd://" + ver
        self.runtime_version = status["nodeInfo"]["containerRuntimeVersion"]
        arch = status["nodeInfo"]["architecture"]
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": arch, "beta.kubernetes.io/os": "linux",
                  "beta.kubernetes.io/arch": arch}
        ann = {"local-cluster.siphon.dev/kubelet-socket": self.socket_path,
               "local-cluster.siphon.dev/containerd-socket": self.rt.socket,
               "node.alpha.kubernetes.io/ttl": "0"}
        try:
            node = await self.api.get("/api/v1/nodes/" + self.name)
            node["metadata"].setdefault("labels", {}).update(labels)
            node["metadata"].setdefault("annotations", {}).update(ann)
            node["spec"]["podCIDR"] = self.pod_cidr
            node["spec"]["podCIDRs"] = [self.pod_cidr]
            node = await self.api.request("PUT", "/api/v1/nodes/" + self.name, node)
        except ApiFailure as e:
            if e.status != 404:
                raise
            node = await self.api.request("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": labels, "annotations": ann},
                "spec": {"podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]},
                "status": status})
        node["status"] = status
        await self.api.request("PUT", "/api/v1/nodes/%s/status" % self.name, node)

    async def heartbeat(self):
        while True:
            await asyncio.sleep(10)
            try:
                node = await self.api.get("/api/v1/nodes/" + self.name)
                st = self._node_status()
                # A test may make the node report another runtime (what
                # a client says for a runtime the agent cannot ask).
                st["nodeInfo"]["containerRuntimeVersion"] = (
                    node["metadata"].get("annotations") or {}).get(
                    "local-cluster.siphon.dev/report-runtime-version", self.runtime_version)
                old = {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}
                for c in st["conditions"]:
                    if c["type"] in old and old[c["type"]].get("status") == c["status"]:
                        c["lastTransitionTime"] = old[c["type"]].get("lastTransitionTime",
                                                                     c["lastTransitionTime"])
                node["status"] = st
                await self.api.request("PUT", "/api/v1/nodes/%s/status" % self.name, node)
            except ApiFailure as e:
                if e.status == 404:
                    await self.register()
            except OSError as e:
                log.warning("heartbeat: %s", e)

    async def post_event(self, pod, etype, reason, message):
        md = pod["metadata"]
        ev = {"apiVersion": "v1", "kind": "Event",
              "metadata": {"name": "%s.%s" % (md["name"], errors.hex_id(16)),
                           "namespace": md["namespace"]},
              "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": md["name"],
                                 "namespace": md["namespace"], "uid": md["uid"]},
              "reason": reason, "message": message, "type": etype, "count": 1,
              "firstTimestamp": errors.rfc3339(), "lastTimestamp": errors.rfc3339(),
              "source": {"component": "kubelet", "host": self.name},
              "reportingComponent": "kubelet", "reportingInstance": self.name}
        try:
            await self.api.request("POST", "/api/v1/namespaces/%s/events" % md["namespace"], ev)
        except (ApiFailure, OSError):
            pass

    # -- pods -------------------------------------------------------------------------------------
    async def watch_pods(self):
        sel = "fieldSelector=spec.nodeName%3D" + self.name
        rv = None
        while True:
            try:
                if rv is None:
                    lst = await self.api.get("/api/v1/pods?" + sel)
                    rv = lst["metadata"]["resourceVersion"]
                    seen = set()
                    for p in lst["items"]:
                        seen.add(p["metadata"]["uid"])
                        self._pod_event("ADDED", p)
                    for uid, w in list(self.workers.items()):
                        if uid not in seen:
                            w.gone = True
                            w.kick.set()
                async for etype, obj in self.api.watch(
                        "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion=%s&%s" % (
                            rv, sel)):
                    if etype == "ERROR":
                        rv = None
                        break
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if etype != "BOOKMARK":
                        self._pod_event(etype, obj)
            except asyncio.CancelledError:
                raise
            except ApiFailure as e:
                if e.status == 410:
                    rv = None
                else:
                    log.warning("pod watch: %s", e)
                    await asyncio.sleep(1)
            except Exception as e:
                log.warning("pod watch: %s", e)
                await asyncio.sleep(1)

    def _pod_event(self, etype, pod):
        uid = pod["metadata"]["uid"]
        w = self.workers.get(uid)
        if etype == "DELETED":
            if w is not None:
                w.gone = True
                w.kick.set()
            return
        if w is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                return  # finished before this node agent started
            w = PodWorker(self, pod)
            self.workers[uid] = w
            w.task = self.spawn(w.run())
            w.kick.set()
        else:
            w.update(pod)

    async def event_loop(self):
        while True:
            try:
                async for topic, ev in self.rt.events():
                    if topic == "/tasks/exit":
                        cid = ev.get("container_id") or ev.get("id")
                        ent = self.by_cid.get(cid)
                        if ent and (ev.get("id") in (None, cid)):
                            w, s, r = ent
                            r.exit_code = ev.get("exit_status", 0)
                            r.finished_at = errors.rfc3339()
                            w.kick.set()
                    elif topic == "/tasks/oom":
                        ent = self.by_cid.get(ev.get("container_id"))
                        if ent:
                            ent[2].oom = True
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("containerd events: %s", e)
            await asyncio.sleep(1)
            # Exits missed while the event stream was down.
            tasks = await self.rt.tasks()
            for cid, (w, s, r) in list(self.by_cid.items()):
                if r.exit_code is None and tasks.get(cid, (0, "STOPPED"))[1] == "STOPPED" \
                        and r.pid:
                    r.exit_code = 137
                    r.finished_at = errors.rfc3339()
                    w.kick.set()

    # -- the kubelet socket: logs and port-forward -----------------------------------------------
    async def serve(self, reader, writer):
        try:
            line = await reader.readline()
            req = json.loads(line or b"{}")
            op = req.get("op")
            w = next((x for x in self.workers.values() if x.uid == req.get("uid")), None)
            if w is None:
                await self._answer(writer, {"error": 'pod "%s" not found on node %s' % (
                    req.get("pod"), self.name), "code": 404, "reason": "NotFound"})
                return
            if op == "portforward":
                await self._portforward(w, req, reader, writer)
            elif op == "exec":
                await self._exec(w, req, reader, writer)
            elif op == "logs":
                await self._logs(w, req, writer)
            else:
                await self._answer(writer, {"error": "unknown operation", "code": 400})
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            try:
                writer.close()
            except Exception:
                pass

    @staticmethod
    async def _answer(writer, obj):
        writer.write(json.dumps(obj).encode() + b"\n")
        await writer.drain()

    async def _portforward(self, w, req, reader, writer):
        port = int(req.get("port", 0))
        path = None if w.pod["spec"].get("hostNetwork") else network.netns_path(w.netns)
        if path and not os.path.exists(path):
            await self._answer(writer, {"error": "pod %s has no network namespace yet" % w.name,
                                        "code": 500})
            return
        loop = asyncio.get_running_loop()
        try:
            sock = await loop.run_in_executor(None, network.connect_in_netns, path, port)
        except OSError as e:
            await self._answer(writer, {
                "error": 'failed to connect to localhost:%d inside namespace "%s", %s' % (
                    port, w.netns, e.args[-1] if e.args else e), "code": 500})
            return
        pr, pw = await asyncio.open_connection(sock=sock)
        await self._answer(writer, {"ok": True})

        async def pipe(src, dst):
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    dst.write(data)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()
            except (ConnectionError, OSError):
                pass
        a = asyncio.ensure_future(pipe(reader, pw))
        b = asyncio.ensure_future(pipe(pr, writer))
        await b
        a.cancel()
        pw.close()

    async def _exec(self, w, req, reader, writer):
        """Runs the command in the container (`ctr task exec`, on a pty for
        tty) and relays it in execstream's frames."""
        from . import execstream as ex
        s = w.slots.get(req.get("container"))
        r = s.current if s else None
        if r is None or r.exit_code is not None:
            await self._answer(writer, {"error": 'container "%s" in pod "%s" is not running' % (
                req.get("container"), w.name), "code": 400})
            return
        fifo = os.path.join(self.dir, "fifo")
        os.makedirs(fifo, exist_ok=True)
        argv = list(self.rt.ctr("task", "exec", "--fifo-dir", fifo, "--exec-id",
                                "exec-" + os.urandom(6).hex()))
        tty = bool(req.get("tty"))
        if tty:
            argv.append("-t")
        argv += [r.cid] + list(req.get("command") or [])
        master = None
        if tty:
            import fcntl
            import pty
            import termios
            master, slave = pty.openpty()

            def ctty():
                os.setsid()
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # ctr's own log lines (a resize after the end) stay out of the
            # terminal: the command's output comes through the console.
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=slave, stdout=slave, stderr=asyncio.subprocess.DEVNULL,
                preexec_fn=ctty)
            os.close(slave)
        else:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if req.get("stdin") else
                asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
        await self._answer(writer, {"ok": True})
        loop = asyncio.get_running_loop()

        async def pump(stream, chan):
            while True:
                data = await stream.read(65536)
                if not data:
                    return
                await ex.write_frame(writer, chan, data)

        async def pump_pty():
            while True:
                try:
                    data = await loop.run_in_executor(None, os.read, master, 65536)
                except OSError:
                    return
                if not data:
                    return
                await ex.write_frame(writer, ex.STDOUT, data)

        async def from_api():
            try:
                while True:
                    chan, data = await ex.read_frame(reader)
                    if chan == ex.STDIN:
                        if tty:
                            os.write(master, data)
                        elif proc.stdin:
                            proc.stdin.write(data)
                            await proc.stdin.drain()
                    elif chan == ex.CLOSE and proc.stdin and not tty:
                        proc.stdin.close()
                    elif chan == ex.RESIZE and tty:
                        import fcntl
                        import termios
                        size = json.loads(data)
                        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack(
                            "HHHH", size.get("Height", 24), size.get("Width", 80), 0, 0))
            except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
                # The client is gone: so is the command.
                if proc.returncode is None:
                    proc.kill()
        up = asyncio.ensure_future(from_api())
        try:
            if tty:
                out = asyncio.ensure_future(pump_pty())
                code = await proc.wait()
                await asyncio.wait([out], timeout=1)
                out.cancel()
            else:
                await asyncio.gather(pump(proc.stdout, ex.STDOUT), pump(proc.stderr, ex.STDERR))
                code = await proc.wait()
            await ex.write_frame(writer, ex.ERROR, json.dumps({"exitCode": code}).encode())
        finally:
            up.cancel()
            if master is not None:
                os.close(master)
            if proc.returncode is None:
                proc.kill()

    async def _logs(self, w, req, writer):
        s = w.slots.get(req.get("container"))
        if s is None or not s.runs:
            await self._answer(writer, {"error": 'container "%s" in pod "%s" is waiting to start: '
                                        "ContainerCreating" % (req.get("container"), w.name),
                                        "code": 400})
            return
        runs = s.runs
        if req.get("previous"):
            if len(runs) < 2:
                await self._answer(writer, {"error": 'previous terminated container "%s" in pod '
                                            '"%s" not found' % (s.name, w.name), "code": 400})
                return
            r = runs[-2]
        else:
            r = runs[-1]
        await self._answer(writer, {"ok": True})
        try:
            f = open(r.log_path, "rb")
        except OSError:
            return
        with f:
            data = f.read()
            tail = req.get("tailLines")
            if tail is not None:
                lines = data.split(b"\n")
                if lines and lines[-1] == b"":
                    lines = lines[:-1]
                    data = b"\n".join(lines[-tail:]) + (b"\n" if lines[-tail:] else b"")
                else:
                    data = b"\n".join(lines[-tail:])
            limit = req.get("limitBytes")
            sent = 0
            if limit is not None:
                data = data[:limit]
            writer.write(data)
            await writer.drain()
            sent += len(data)
            if not req.get("follow") or req.get("previous"):
                return
            while True:
                chunk = f.read(65536)
                if chunk:
                    if limit is not None:
                        chunk = chunk[:max(0, limit - sent)]
                        if not chunk:
                            return
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)
                    continue
                if r.exit_code is not None or r.removed or w.gone:
                    rest = f.read()
                    if rest:
                        writer.write(rest)
                        await writer.drain()
                    return
                await asyncio.sleep(0.2)


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""
