"""One pod on a node: what a kubelet does for it, run by the node agent
(node.py) as one PodWorker task. The pod runs as real containers in the
node's containerd: a network namespace (network.py), volumes (emptyDir,
secret, configMap, downwardAPI, projected, hostPath under the node's own
root), env (fieldRef, secretKeyRef, configMapKeyRef, envFrom),
securityContext (user, capabilities, read-only root, privileged,
allowPrivilegeEscalation, seccomp RuntimeDefault), hostPID/hostNetwork/
hostIPC, init and ephemeral containers (targetContainerName shares the
target's PID namespace), readiness/liveness/startup probes (exec,
tcpSocket, httpGet), restarts with back-off, preStop hooks, graceful
termination, and its status as a kubelet posts it.

Call-order rules: the PodWorker task does everything to its pod (starting,
stopping, status), woken by `kick`; the containerd event reader and the
probe tasks only record what they saw and kick it.
"""

import asyncio
import base64
import copy
import json
import logging
import os
import re
import shutil
import time

from . import errors
from . import network
from .client import ApiFailure
from .runtime import InvalidImageName, RuntimeError_, normalize_image, run

log = logging.getLogger("pod")

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


