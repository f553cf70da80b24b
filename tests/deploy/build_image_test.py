#!/usr/bin/env python3
"""Tests of scripts/build-image.sh, without root or a container runtime.

Builds the agent image from the agent under test and reads the OCI layout
back: the blobs are what the index, manifest and config say (digests,
sizes, diff_id), the config has the exec-form entrypoint, PATH and labels
of images/Dockerfile, and the layer holds the agent, its containerd helper
(which alone links gRPC), iptables (both flavours, the tool names the agent
runs, the modules) and every library
each binary needs (its DT_NEEDED entries and its loader, followed through
the image's own symlinks), and no shell. A second build must give the same
bytes. Bad input must be refused with a message naming the problem.

  build_image_test.py --agent BIN [unittest args]
"""

import argparse
import hashlib
import io
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "build-image.sh")
ARGS = argparse.Namespace(agent=None)
NAME = "docker.io/siphon-test/siphon-agent:unit"


def build(out, *extra, agent=None):
    cmd = ["bash", SCRIPT, "--agent", agent or ARGS.agent, *extra, out, NAME]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


class Image:
    """An OCI layout tar, read back."""

    def __init__(self, path):
        with tarfile.open(path) as t:
            self.files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
        self.index = json.loads(self.files["index.json"])
        self.manifest_desc = self.index["manifests"][0]
        self.manifest = json.loads(self.blob(self.manifest_desc))
        self.config = json.loads(self.blob(self.manifest["config"]))
        self.layer_bytes = self.blob(self.manifest["layers"][0])
        self.layer = tarfile.open(fileobj=io.BytesIO(self.layer_bytes))
        self.members = {m.name.lstrip("./").rstrip("/"): m for m in self.layer.getmembers()}

    def blob(self, desc):
        algo, digest = desc["digest"].split(":")
        data = self.files[f"blobs/{algo}/{digest}"]
        assert hashlib.sha256(data).hexdigest() == digest, f"blob {digest}: wrong digest"
        assert len(data) == desc["size"], f"blob {digest}: wrong size"
        return data

    # The member a path names, following symlinks inside the image.
    def resolve(self, path, depth=0):
        if depth > 40:
            return None
        parts = path.strip("/").split("/")
        cur = ""
        for i, part in enumerate(parts):
            cur = posixpath.join(cur, part) if cur else part
            m = self.members.get(cur)
            if m is None:
                return None
            if m.issym():
                target = m.linkname
                base = posixpath.dirname(cur)
                target = posixpath.normpath(target if target.startswith("/")
                                            else posixpath.join("/", base, target))
                rest = "/".join(parts[i + 1:])
                return self.resolve(posixpath.join(target, rest) if rest else target, depth + 1)
        return self.members.get(cur)

    def read(self, path):
        m = self.resolve(path)
        return self.layer.extractfile(m).read() if m is not None and m.isfile() else None


def elf_needs(data):
    """(interpreter or None, [DT_NEEDED names]) of an ELF image, via readelf."""
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        hdr = subprocess.run(["readelf", "-lW", f.name], capture_output=True, text=True,
                             check=True, env={**os.environ, "LC_ALL": "C"}).stdout
        dyn = subprocess.run(["readelf", "-dW", f.name], capture_output=True, text=True,
                             check=True, env={**os.environ, "LC_ALL": "C"}).stdout
    interp = None
    for line in hdr.splitlines():
        if "Requesting program interpreter:" in line:
            interp = line.split(":", 1)[1].strip().rstrip("]")
    needed = [line.split("[", 1)[1].rstrip("]") for line in dyn.splitlines()
              if "(NEEDED)" in line]
    return interp, needed


class BuildImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="siphon-build-image-")
        cls.tar = os.path.join(cls.tmp, "a.tar")
        r = build(cls.tar)
        if r.returncode != 0:
            raise AssertionError(f"build-image.sh failed: exit {r.returncode}\n{r.stderr}")
        cls.out = r.stdout
        cls.image = Image(cls.tar)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_layout_is_consistent(self):
        img = self.image
        self.assertEqual(json.loads(img.files["oci-layout"]), {"imageLayoutVersion": "1.0.0"})
        self.assertEqual(img.manifest_desc["annotations"]["io.containerd.image.name"], NAME)
        self.assertEqual(img.config["rootfs"]["diff_ids"],
                         [img.manifest["layers"][0]["digest"]],
                         "an uncompressed layer's diff_id is its digest")
        self.assertEqual(img.config["os"], "linux")
        self.assertIn(NAME, self.out)

    def test_config_matches_the_dockerfile(self):
        cfg = self.image.config["config"]
        self.assertEqual(cfg["Entrypoint"], ["/usr/local/bin/siphon-agent"])
        self.assertEqual(cfg["Cmd"], ["--help"])
        self.assertIn("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                      cfg["Env"])
        version = subprocess.run([ARGS.agent, "--version"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        labels = cfg["Labels"]
        self.assertEqual(labels["org.opencontainers.image.title"], "siphon-agent")
        self.assertEqual(labels["org.opencontainers.image.version"], version)
        self.assertIn("org.opencontainers.image.source", labels)
        self.assertIn("org.opencontainers.image.revision", labels)
        # The Dockerfile's labels are the same set.
        with open(os.path.join(HERE, "..", "..", "images", "Dockerfile"), encoding="utf-8") as f:
            dockerfile = f.read()
        for key in labels:
            self.assertIn(key + "=", dockerfile)
        self.assertIn('ENTRYPOINT ["/usr/local/bin/siphon-agent"]', dockerfile)

    def test_agent_is_the_given_binary_without_debug_sections(self):
        m = self.image.members["usr/local/bin/siphon-agent"]
        self.assertTrue(m.isfile())
        self.assertEqual(m.mode & 0o777, 0o755)
        self.assertLessEqual(m.size, os.path.getsize(ARGS.agent))
        data = self.image.read("/usr/local/bin/siphon-agent")
        self.assertEqual(data[:4], b"\x7fELF")

    def test_the_containerd_helper_is_beside_the_agent(self):
        m = self.image.members["usr/local/bin/siphon-containerd"]
        self.assertTrue(m.isfile())
        self.assertEqual(m.mode & 0o777, 0o755)
        # gRPC is the helper's, not the agent's.
        _, agent_needs = elf_needs(self.image.read("/usr/local/bin/siphon-agent"))
        _, helper_needs = elf_needs(self.image.read("/usr/local/bin/siphon-containerd"))
        self.assertFalse([n for n in agent_needs if "grpc" in n], agent_needs)
        self.assertTrue([n for n in helper_needs if "grpc" in n], helper_needs)

    def test_iptables_tools_the_agent_runs_are_there(self):
        for fam in ("iptables", "ip6tables"):
            for flavour in ("nft", "legacy"):
                for verb in ("save", "restore"):
                    name = f"/usr/sbin/{fam}-{flavour}-{verb}"
                    m = self.image.resolve(name)
                    self.assertIsNotNone(m, name)
                    self.assertTrue(m.isfile() and m.mode & 0o111, name)
                    self.assertTrue(m.name.endswith(f"xtables-{flavour}-multi"), name)
        mods = [n for n in self.image.members if "/xtables/libxt_" in n]
        self.assertIn("REDIRECT", " ".join(mods).upper())
        self.assertTrue(any(n.endswith("libxt_conntrack.so") for n in mods), mods[:5])
        for f in ("/etc/protocols", "/etc/services"):
            if os.path.exists(f):
                self.assertIsNotNone(self.image.read(f), f)

    def test_every_binary_finds_its_libraries_and_loader(self):
        libdirs = set()
        for n, m in self.image.members.items():
            if m.isfile() and ".so" in posixpath.basename(n):
                libdirs.add("/" + posixpath.dirname(n))
        self.assertTrue(libdirs)
        todo = ["/usr/local/bin/siphon-agent", "/usr/local/bin/siphon-containerd",
                "/usr/sbin/xtables-nft-multi",
                "/usr/sbin/xtables-legacy-multi"]
        todo += ["/" + n for n in self.image.members if "/xtables/lib" in n]
        seen = set()
        while todo:
            path = todo.pop()
            if path in seen:
                continue
            seen.add(path)
            data = self.image.read(path)
            self.assertIsNotNone(data, f"{path} is missing from the image")
            interp, needed = elf_needs(data)
            if interp:
                self.assertIsNotNone(self.image.read(interp), f"{path}: loader {interp} missing")
            for lib in needed:
                found = [d + "/" + lib for d in sorted(libdirs) if self.image.resolve(d + "/" + lib)]
                self.assertTrue(found, f"{path} needs {lib}, which the image lacks")
                todo.append(found[0])
        self.assertGreater(len(seen), 20)

    def test_no_shell_and_standard_mount_points(self):
        for sh in ("/bin/sh", "/usr/bin/sh", "/bin/bash", "/bin/busybox"):
            self.assertIsNone(self.image.resolve(sh), sh)
        for d in ("tmp", "run", "proc", "sys", "dev"):
            self.assertTrue(self.image.members[d].isdir(), d)
        self.assertEqual(self.image.members["tmp"].mode & 0o7777, 0o1777)
        self.assertEqual(self.image.resolve("/var/run"), self.image.members["run"])
        for m in self.image.members.values():
            self.assertEqual((m.uid, m.gid, m.mtime), (0, 0, 0), m.name)

    def test_rebuild_gives_the_same_bytes(self):
        again = os.path.join(self.tmp, "b.tar")
        r = build(again)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.tar, "rb") as a, open(again, "rb") as b:
            self.assertTrue(a.read() == b.read(), "two builds of the same inputs differ")

    # ---------------------------------------------------------------- bad input
    def assertRefused(self, agent, expected, code=1):
        r = build(os.path.join(self.tmp, "bad.tar"), agent=agent)
        self.assertEqual(r.returncode, code, r.stdout + r.stderr)
        self.assertIn(expected, r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "bad.tar")))

    def test_missing_binary(self):
        self.assertRefused(os.path.join(self.tmp, "no-such-agent"), "does not exist")

    def test_not_elf(self):
        p = os.path.join(self.tmp, "script")
        with open(p, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\necho 0.1.0\n")
        os.chmod(p, 0o755)
        self.assertRefused(p, "is not an ELF executable")

    def test_not_executable(self):
        p = os.path.join(self.tmp, "agent-0644")
        shutil.copyfile(ARGS.agent, p)
        os.chmod(p, 0o644)
        self.assertRefused(p, "is not executable")

    def test_agent_without_its_containerd_helper(self):
        p = os.path.join(self.tmp, "lonely", "siphon-agent")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        shutil.copyfile(ARGS.agent, p)
        os.chmod(p, 0o755)
        self.assertRefused(p, "siphon-containerd is missing")

    def test_directory(self):
        self.assertRefused(self.tmp, "is not a regular file")

    def test_usage(self):
        r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60,
                           check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage: scripts/build-image.sh", r.stderr)
        r = subprocess.run(["bash", SCRIPT, "--bogus", "x.tar"], capture_output=True, text=True,
                           timeout=60, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option --bogus", r.stderr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    known, rest = p.parse_known_args()
    ARGS.agent = os.path.abspath(known.agent)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
