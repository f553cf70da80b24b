"""A node agent: the kubelet of one node, talking to the API server over
HTTPS like one. It registers its Node and keeps its status fresh, watches
the pods bound to it and runs one PodWorker (pod.py) per pod, reads its
containerd's events, adopts the pods an earlier run left, and serves logs,
port-forward and exec to the API server on a Unix socket (kubelet.sock).
"""

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import struct

from . import errors
from . import network
from .client import ApiClient, ApiFailure
from .pod import PodWorker
from .runtime import Containerd, run

log = logging.getLogger("node")


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
