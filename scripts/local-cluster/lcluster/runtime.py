"""A node's containerd, driven with `ctr` (no CRI plugin: containerd 1.6's
CRI would bring CNI and the kubelet's world). Each container is a
containerd container in namespace k8s.io with a full OCI spec written by
the node agent (`ctr run --config`): its root is an overlay mount of a
snapshot prepared from the image's layers, so the image, snapshots and
container records all live in the node's containerd, and a client asking
that containerd (Containers.Get, Tasks.Get) sees what a kubelet's
containerd would show."""

import asyncio
import hashlib
import json
import logging
import os
import re

log = logging.getLogger("runtime")

NAMESPACE = "k8s.io"


class RuntimeError_(Exception):
    pass


async def run(*argv, timeout=60, check=True, stdin=None):
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError_("%s timed out after %ss" % (" ".join(argv[:4]), timeout))
    if check and proc.returncode != 0:
        raise RuntimeError_("%s: %s" % (" ".join(argv[:6]), (err or out).decode(
            errors="replace").strip()))
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


_NAME_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


class InvalidImageName(Exception):
    pass


def normalize_image(ref):
    """The fully qualified name of an image reference, as the Docker
    reference grammar defines it (docker.io and library/ added, :latest
    when neither tag nor digest)."""
    if not ref or ref != ref.strip() or any(c.isspace() for c in ref):
        raise InvalidImageName("invalid reference format")
    name, digest = ref, ""
    if "@" in ref:
        name, digest = ref.split("@", 1)
        if not re.match(r"^sha256:[0-9a-f]{64}$", digest):
            raise InvalidImageName("invalid reference format")
    tag = ""
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
        if not _TAG.match(tag):
            raise InvalidImageName("invalid reference format")
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        domain, path = parts[0], parts[1:]
    else:
        domain, path = "docker.io", parts
        if len(path) == 1:
            path = ["library"] + path
    for comp in path:
        if not _NAME_COMPONENT.match(comp):
            if comp.lower() != comp:
                raise InvalidImageName("invalid reference format: repository name (%s) must be "
                                       "lowercase" % "/".join(path))
            raise InvalidImageName("invalid reference format")
    full = domain + "/" + "/".join(path)
    if digest:
        return full + (":" + tag if tag else "") + "@" + digest
    return full + ":" + (tag or "latest")


class Containerd:
    def __init__(self, socket, root):
        self.socket = socket
        self.root = root  # the node's directory: rootfs mounts, fifos, runc state
        self.runc_root = os.path.join(root, "runc")
        self._configs = {}
        self._seccomp = {}

    def ctr(self, *args):
        return ("ctr", "-a", self.socket, "-n", NAMESPACE) + args

    async def call(self, *args, **kw):
        return await run(*self.ctr(*args), **kw)

    async def base_spec(self):
        """containerd's default OCI spec (mounts, devices, masked paths,
        the default capabilities) and, apart, its default seccomp profile,
        from a container record made and removed for the purpose."""
        cid = "spec-template-" + hashlib.sha1(self.socket.encode()).hexdigest()[:8]
        await self.call("containers", "delete", cid, check=False)
        await self.call("containers", "create", "--seccomp", "--rootfs", "/nonexistent", cid)
        try:
            _, out, _ = await self.call("containers", "info", cid)
        finally:
            await self.call("containers", "delete", cid, check=False)
        return json.loads(out)["Spec"]

    async def seccomp_for(self, caps, default_caps):
        """containerd's default seccomp profile for a container with these
        capabilities: it allows more syscalls (setns, mount, bpf...) to a
        container holding CAP_SYS_ADMIN and so on, as the CRI's
        RuntimeDefault does."""
        key = tuple(sorted(caps))
        if key in self._seccomp:
            return self._seccomp[key]
        cid = "seccomp-template-" + hashlib.sha1(
            (self.socket + ",".join(key)).encode()).hexdigest()[:12]
        args = ["containers", "create", "--seccomp"]
        for c in key:
            if c not in default_caps:
                args += ["--cap-add", c]
        for c in default_caps:
            if c not in key:
                args += ["--cap-drop", c]
        await self.call("containers", "delete", cid, check=False)
        await self.call(*args, "--rootfs", "/nonexistent", cid)
        try:
            _, out, _ = await self.call("containers", "info", cid)
        finally:
            await self.call("containers", "delete", cid, check=False)
        prof = json.loads(out)["Spec"]["linux"].get("seccomp")
        self._seccomp[key] = prof
        return prof

    async def images(self):
        """{name: manifest or index digest}"""
        _, out, _ = await self.call("images", "ls")
        imgs = {}
        for line in out.splitlines()[1:]:
            f = line.split()
            if len(f) >= 3:
                imgs[f[0]] = f[2]
        return imgs

    async def _content(self, digest):
        _, out, _ = await self.call("content", "get", digest)
        return json.loads(out)

    async def image_config(self, name, digest):
        """(manifest digest, image config) of an image."""
        key = (name, digest)
        if key in self._configs:
            return self._configs[key]
        doc = await self._content(digest)
        mdigest = digest
        if "manifests" in doc:
            pick = None
            for m in doc["manifests"]:
                p = m.get("platform") or {}
                if p.get("os", "linux") == "linux" and p.get("architecture") in (
                        None, _arch()):
                    pick = m
                    break
            if pick is None:
                raise RuntimeError_("image %s has no manifest for linux/%s" % (name, _arch()))
            mdigest = pick["digest"]
            doc = await self._content(mdigest)
        config = await self._content(doc["config"]["digest"])
        self._configs[key] = (mdigest, config)
        return mdigest, config

    @staticmethod
    def chain_id(diff_ids):
        chain = diff_ids[0]
        for d in diff_ids[1:]:
            chain = "sha256:" + hashlib.sha256((chain + " " + d).encode()).hexdigest()
        return chain

    async def prepare_rootfs(self, cid, chain, target):
        await self.call("snapshots", "rm", cid, check=False)
        await self.call("snapshots", "prepare", cid, chain)
        _, out, _ = await self.call("snapshots", "mounts", target, cid)
        m = re.match(r"^mount -t (\S+) (\S+) (\S+)(?: -o (\S+))?\s*$", out.strip())
        if not m:
            raise RuntimeError_("cannot read the snapshot's mount: %r" % out)
        fstype, source, _, opts = m.groups()
        os.makedirs(target, exist_ok=True)
        argv = ["mount", "-t", fstype, source, target]
        if opts:
            argv += ["-o", opts]
        await run(*argv)

    async def start(self, cid, spec_path, log_path, pid_file, labels):
        args = ["run", "--config", spec_path, "-d", "--log-uri", "file://" + log_path,
                "--runc-root", self.runc_root, "--pid-file", pid_file]
        for k, v in labels.items():
            args += ["--label", "%s=%s" % (k, v)]
        await self.call(*args, cid)

    async def kill(self, cid, sig):
        await self.call("task", "kill", "-s", sig, cid, check=False)

    async def remove(self, cid, rootfs):
        await self.call("task", "delete", "--force", cid, check=False)
        await self.call("containers", "delete", cid, check=False)
        if rootfs and os.path.ismount(rootfs):
            await run("umount", "-l", rootfs, check=False)
        await self.call("snapshots", "rm", cid, check=False)

    async def exec(self, cid, argv, timeout):
        exec_id = "probe-" + os.urandom(6).hex()
        fifo = os.path.join(self.root, "fifo")
        os.makedirs(fifo, exist_ok=True)
        try:
            rc, out, err = await run(*self.ctr("task", "exec", "--fifo-dir", fifo, "--exec-id",
                                               exec_id, cid, *argv), timeout=timeout,
                                     check=False)
            return rc, out + err
        except RuntimeError_ as e:
            return -1, str(e)

    async def tasks(self):
        """{id: (pid, status)}"""
        _, out, _ = await self.call("tasks", "ls", check=False)
        res = {}
        for line in out.splitlines()[1:]:
            f = line.split()
            if len(f) >= 3:
                res[f[0]] = (int(f[1]), f[2])
        return res

    async def containers(self):
        _, out, _ = await self.call("containers", "ls", "-q", check=False)
        return [l.strip() for l in out.splitlines() if l.strip()]

    async def events(self):
        """Yields (topic, payload) from `ctr events` until it ends."""
        proc = await asyncio.create_subprocess_exec(
            *self.ctr("events"), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, stdin=asyncio.subprocess.DEVNULL,
            preexec_fn=_die_with_parent)
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                m = re.match(rb"^\S+ \S+ \S+ \S+ (\S+) (\S+) (.*)$", line.strip())
                if not m:
                    continue
                try:
                    payload = json.loads(m.group(3))
                except ValueError:
                    payload = {}
                yield m.group(2).decode(), payload
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _die_with_parent():
    """In the child: SIGKILL when the node agent exits (PR_SET_PDEATHSIG),
    so no `ctr events` outlives it."""
    import ctypes
    import signal
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))


def _arch():
    m = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(m, m)
