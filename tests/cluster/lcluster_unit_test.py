#!/usr/bin/env python3
"""Unit tests of the local cluster's pure parts (no root, no processes):
patches, selectors, Pod Security checks, the store's watch semantics, the
SPDY framing and header compression, the protobuf decoder and the
registry's write path (graceful deletion, finalizers, conflicts)."""

import asyncio
import os
import struct
import sys
import unittest
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                "local-cluster"))

from lcluster import admission, errors, patch, protobuf, selectors, store, streams  # noqa: E402
from lcluster import resources as R  # noqa: E402
from lcluster.registry import Registry  # noqa: E402


class PatchTest(unittest.TestCase):
    def test_strategic_merge_merges_containers_by_name_and_keeps_order(self):
        orig = {"spec": {"containers": [{"name": "a", "image": "1", "env": [
            {"name": "X", "value": "1"}]}, {"name": "b", "image": "2"}]}}
        p = {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                      "containers": [{"name": "a", "image": "3",
                                      "env": [{"name": "Y", "value": "2"}]}]}}
        out = patch.strategic_merge_patch(orig, p, "Pod")
        self.assertEqual([c["name"] for c in out["spec"]["containers"]], ["b", "a"])
        a = out["spec"]["containers"][1]
        self.assertEqual(a["image"], "3")
        self.assertEqual([e["name"] for e in a["env"]], ["X", "Y"])

    def test_strategic_merge_directives(self):
        orig = {"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}},
                "spec": {"containers": [{"name": "a"}, {"name": "b"}], "args": ["1", "2"]}}
        p = {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "labels": {"x": None}},
             "spec": {"containers": [{"name": "b", "$patch": "delete"}], "args": ["3"]}}
        out = patch.strategic_merge_patch(orig, p)
        self.assertEqual(out["metadata"]["finalizers"], ["b"])
        self.assertEqual(out["metadata"]["labels"], {"y": "2"})
        self.assertEqual(out["spec"]["containers"], [{"name": "a"}])
        self.assertEqual(out["spec"]["args"], ["3"], "lists without a strategy are replaced")

    def test_pdb_selector_is_replaced_not_merged(self):
        orig = {"spec": {"selector": {"matchLabels": {"a": "1", "b": "2"}}}}
        out = patch.strategic_merge_patch(orig, {"spec": {"selector": {
            "matchLabels": {"a": "1"}}}}, "PodDisruptionBudget")
        self.assertEqual(out["spec"]["selector"], {"matchLabels": {"a": "1"}})

    def test_json_patch_and_merge_patch(self):
        doc = {"a": {"b": [1, 2]}, "c": 1}
        out = patch.json_patch(doc, [{"op": "add", "path": "/a/b/-", "value": 3},
                                     {"op": "remove", "path": "/c"},
                                     {"op": "replace", "path": "/a/b/0", "value": 0}])
        self.assertEqual(out, {"a": {"b": [0, 2, 3]}})
        with self.assertRaises(errors.ApiError):
            patch.json_patch(doc, [{"op": "test", "path": "/c", "value": 2}])
        self.assertEqual(patch.merge_patch({"a": 1, "b": {"c": 1}}, {"a": None, "b": {"d": 2}}),
                         {"b": {"c": 1, "d": 2}})


class SelectorTest(unittest.TestCase):
    def test_label_selector_operators(self):
        reqs = selectors.parse_label_selector("app=web,tier in (a, b),!canary,env!=prod,x")
        self.assertTrue(selectors.labels_match(reqs, {"app": "web", "tier": "b", "x": ""}))
        self.assertFalse(selectors.labels_match(reqs, {"app": "web", "tier": "c", "x": ""}))
        self.assertFalse(selectors.labels_match(reqs, {"app": "web", "tier": "a", "x": "",
                                                       "canary": "1"}))
        self.assertFalse(selectors.labels_match(reqs, {"app": "web", "tier": "a"}))

    def test_field_selector_refuses_unknown_fields(self):
        f = selectors.parse_field_selector("spec.nodeName=n1,metadata.name!=x", "Pod")
        self.assertTrue(selectors.fields_match(f, {"metadata": {"name": "y"},
                                                   "spec": {"nodeName": "n1"}}))
        with self.assertRaises(errors.ApiError) as cm:
            selectors.parse_field_selector("spec.bogus=1", "Pod")
        self.assertEqual(cm.exception.message, "field label not supported: spec.bogus")


class PodSecurityTest(unittest.TestCase):
    AGENT = {"hostPID": True, "volumes": [{"name": "sock", "hostPath": {"path": "/run/x"}}],
             "containers": [{"name": "agent", "securityContext": {
                 "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "SETUID"]},
                 "appArmorProfile": {"type": "Unconfined"}}}]}

    def test_baseline_names_each_violation(self):
        v = admission.pod_security_violations(self.AGENT, "baseline")
        self.assertEqual(v, [
            "host namespaces (hostPID=true)",
            'non-default capabilities (container "agent" must not include "SYS_ADMIN" in '
            "securityContext.capabilities.add)",
            'hostPath volumes (volume "sock")',
            'forbidden AppArmor profile (container "agent" must not set appArmorProfile.type '
            'to "Unconfined")'])
        self.assertEqual(admission.pod_security_violations(self.AGENT, "privileged"), [])

    def test_restricted_needs_non_root_and_seccomp(self):
        spec = {"containers": [{"name": "c", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
        v = admission.pod_security_violations(spec, "restricted")
        self.assertTrue(any(x.startswith("runAsNonRoot != true") for x in v), v)
        self.assertTrue(any(x.startswith("seccompProfile") for x in v), v)
        spec["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {
            "type": "RuntimeDefault"}}
        self.assertEqual(admission.pod_security_violations(spec, "restricted"), [])


def _obj(name, ns="default", labels=None):
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {}}}


class StoreTest(unittest.TestCase):
    def test_watch_sees_objects_leave_and_enter_its_selector(self):
        async def go():
            st = store.Store()
            match = lambda o: o["metadata"]["labels"].get("app") == "web"  # noqa: E731
            st.create(R.PODS, _obj("a", labels={"app": "web"}))
            w = st.watch(R.PODS, "default", match, since_rv=1)
            a = st.get(R.PODS, "default", "a")
            a["metadata"]["labels"] = {"app": "other"}
            st.update(R.PODS, a)
            b = st.create(R.PODS, _obj("b"))
            b["metadata"]["labels"] = {"app": "web"}
            st.update(R.PODS, b)
            got = []
            while not w.queue.empty():
                etype, o = w.queue.get_nowait()
                got.append((etype, o["metadata"]["name"]))
            return got
        self.assertEqual(asyncio.run(go()), [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "b")])

    def test_stale_resource_version_is_a_conflict(self):
        st = store.Store()
        o = st.create(R.CONFIGMAPS, _obj("c"))
        o2 = dict(o, data={"k": "v"})
        st.update(R.CONFIGMAPS, o2, expect_rv=o["metadata"]["resourceVersion"])
        with self.assertRaises(errors.ApiError) as cm:
            st.update(R.CONFIGMAPS, dict(o, data={"k": "w"}),
                      expect_rv=o["metadata"]["resourceVersion"])
        self.assertEqual(cm.exception.code, 409)


class RegistryTest(unittest.TestCase):
    def setUp(self):
        self.reg = Registry(store.Store())
        self.reg.create(R.NAMESPACES, "", {"metadata": {"name": "default"}})

    def test_scheduled_pods_are_deleted_gracefully_and_finalizers_hold_them(self):
        pod = {"metadata": {"name": "p", "finalizers": ["x/y"]},
               "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}
        self.reg.create(R.PODS, "default", pod)
        obj, gone = self.reg.delete(R.PODS, "default", "p")
        self.assertFalse(gone)
        self.assertTrue(obj["metadata"]["deletionTimestamp"])
        self.assertEqual(obj["metadata"]["deletionGracePeriodSeconds"], 30)
        obj, gone = self.reg.delete(R.PODS, "default", "p", {"gracePeriodSeconds": 0})
        self.assertFalse(gone, "the finalizer holds it")
        obj["metadata"]["finalizers"] = []
        self.reg.update(R.PODS, "default", "p", obj)
        self.assertIsNone(self.reg.store.get(R.PODS, "default", "p"))

    def test_invalid_objects_are_422_with_field_causes(self):
        with self.assertRaises(errors.ApiError) as cm:
            self.reg.create(R.PODS, "default", {"metadata": {"name": "Bad_Name"},
                                                "spec": {"containers": [{"name": "c"}]}})
        e = cm.exception
        self.assertEqual((e.code, e.reason), (422, "Invalid"))
        fields = {c["field"] for c in e.details["causes"]}
        self.assertEqual(fields, {"metadata.name", "spec.containers[0].image"})

    def test_namespace_must_exist(self):
        with self.assertRaises(errors.ApiError) as cm:
            self.reg.create(R.CONFIGMAPS, "nope", {"metadata": {"name": "c"}})
        self.assertEqual(cm.exception.message, 'namespaces "nope" not found')


class SpdyTest(unittest.TestCase):
    def test_header_blocks_round_trip_through_the_dictionary(self):
        # Two sessions' codecs: what one side deflates the other inflates,
        # the zlib stream kept across blocks as SPDY requires.
        a = streams.SpdySession(None, None, None)
        b = streams.SpdySession(None, None, None)
        for hdrs in ({"streamtype": "data", "port": "8080", "requestid": "0"},
                     {"streamtype": "error", "port": "8080", "requestid": "1"}):
            self.assertEqual(b._decode_headers(a._encode_headers(hdrs)), hdrs)
        self.assertEqual(zlib.adler32(streams.SPDY_DICT), 0xE3C6A7C2)

    def test_frames_reach_the_stream_and_pings_are_echoed(self):
        async def go():
            client = streams.SpdySession(None, None, None)  # only its encoder
            frames = bytearray()
            block = client._encode_headers({"streamType": "data", "port": "80"})
            syn = struct.pack(">IIBB", 1, 0, 0, 0) + block
            frames += struct.pack(">HHI", 0x8003, streams.SYN_STREAM, len(syn)) + syn
            frames += struct.pack(">II", 1, 5) + b"hello"
            frames += struct.pack(">II", 1, 1 << 24)  # FIN
            frames += struct.pack(">HHI", 0x8003, streams.PING, 4) + struct.pack(">I", 7)
            reader = asyncio.StreamReader()
            reader.feed_data(bytes(frames))
            sent = []

            class W:
                def write(self, d):
                    sent.append(d)

                async def drain(self):
                    pass

                def close(self):
                    pass
            got = []

            async def on_stream(st):
                while True:
                    d = await st.read()
                    if not d:
                        break
                    got.append((st.header("port"), d))
            s = streams.SpdySession(reader, W(), on_stream)
            run = asyncio.ensure_future(s.run())
            for _ in range(100):
                if got and len(sent) == 2:
                    break
                await asyncio.sleep(0.01)
            reader.feed_eof()  # the peer goes: the session ends
            await run
            types = [struct.unpack(">HH", f[:4])[1] for f in sent]
            return got, types
        got, types = asyncio.run(go())
        self.assertEqual(got, [("80", b"hello")])
        self.assertEqual(types, [streams.SYN_REPLY, streams.PING])


class ProtobufTest(unittest.TestCase):
    @staticmethod
    def _ld(num, data):
        def varint(n):
            out = b""
            while True:
                b = n & 0x7F
                n >>= 7
                out += bytes([b | (0x80 if n else 0)])
                if not n:
                    return out
        return varint(num << 3 | 2) + varint(len(data)) + data

    def test_a_secret_as_kubectl_create_sends_it(self):
        ld = self._ld
        meta = ld(1, b"s1") + ld(2, b"") + ld(3, b"")
        secret = ld(1, meta) + ld(2, ld(1, b"token") + ld(2, b"abc")) + ld(3, b"Opaque")
        body = protobuf.MAGIC + ld(1, ld(1, b"v1") + ld(2, b"Secret")) + ld(2, secret)
        self.assertEqual(protobuf.decode(body), {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"},
            "data": {"token": "YWJj"}, "type": "Opaque"})

    def test_an_unknown_kind_is_415(self):
        ld = self._ld
        body = protobuf.MAGIC + ld(1, ld(1, b"v1") + ld(2, b"Service")) + ld(2, b"")
        with self.assertRaises(errors.ApiError) as cm:
            protobuf.decode(body)
        self.assertEqual(cm.exception.code, 415)


if __name__ == "__main__":
    unittest.main(verbosity=2)
