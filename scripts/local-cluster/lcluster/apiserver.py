"""The API server's HTTP side: discovery (legacy and aggregated v2),
/version, the REST verbs on every resource, watches, the subresources
(status, scale, log, portforward, eviction, binding, ephemeralcontainers,
finalize), access reviews, authentication and authorization, and errors in
the Status form."""

import asyncio
import copy
import json
import logging
import os
import time

from . import auth
from . import errors
from . import execstream
from . import openapi
from . import resources as R
from . import tables
from .httpserver import Response
from .registry import Registry
from .selectors import (fields_match, labels_match, parse_field_selector,
                        parse_label_selector)
from .streams import PortForwardError, WebSocketStream, serve_portforward, ws_accept

log = logging.getLogger("apiserver")

K8S_VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.4",
               "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
               "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23.6", "compiler": "gc",
               "platform": "linux/amd64"}

AGG_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGG_V2B1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
PF_WS_PROTOCOL = "SPDY/3.1+portforward.k8s.io"
BOOKMARK_EVERY = 15.0


def _json(status, body, headers=None, content_type="application/json"):
    return Response(status, body, content_type=content_type, headers=headers)


def _status_response(err):
    return _json(err.code, err.status(), headers=err.headers)


class ApiServer:
    def __init__(self, store, tokens, address):
        self.store = store
        self.registry = Registry(store)
        self.authorizer = auth.Authorizer(store)
        self.tokens = tokens
        self.address = address  # "127.0.0.1:PORT", for /api's serverAddressByClientCIDRs
        self.stream_idle_timeout = 4 * 3600.0  # the kubelet's default

    # -- entry -----------------------------------------------------------------------
    async def handle(self, req):
        t0 = time.monotonic()
        try:
            resp = await self._handle(req)
        except errors.ApiError as e:
            resp = _status_response(e)
        except json.JSONDecodeError as e:
            resp = _status_response(errors.bad_request("error decoding the body: %s" % e))
        if resp is not None:
            log.info("%s %s -> %d (%.0f ms) %s", req.method, req.target, resp.status,
                     (time.monotonic() - t0) * 1000, req.user.name if req.user else "-")
        else:
            log.info("%s %s -> stream/upgrade ended (%.0f ms)", req.method, req.target,
                     (time.monotonic() - t0) * 1000)
        return resp

    def _authenticate(self, req):
        h = req.headers.get("Authorization") or ""
        if h.lower().startswith("bearer "):
            user = self.tokens.get(h[7:].strip())
            if user:
                return user
        raise errors.ApiError(401, "Unauthorized", "Unauthorized")

    def _authorize(self, req, attrs):
        ok, _ = self.authorizer.authorize(req.user, attrs)
        if not ok:
            raise errors.ApiError(403, "Forbidden", auth.forbidden_message(req.user, attrs),
                                  {"name": attrs.name, "group": attrs.group,
                                   "kind": attrs.resource} if attrs.resource_request else None)

    async def _handle(self, req):
        path = req.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return Response(200, "ok", content_type="text/plain; charset=utf-8")
        req.user = self._authenticate(req)
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] not in ("api", "apis") or (
                parts[0] == "api" and len(parts) < 2) or (parts[0] == "apis" and len(parts) < 3):
            self._authorize(req, auth.Attributes(req.method.lower() if req.method != "GET"
                                                 else "get", path=path))
            return self._non_resource(req, path, parts)
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        else:
            group, version, rest = parts[1], parts[2], parts[3:]
        if not rest:
            self._authorize(req, auth.Attributes("get", path=path))
            return self._group_version(req, group, version)
        watch_prefix = False
        if rest[0] == "watch":
            watch_prefix = True
            rest = rest[1:]
        ns, plural, name, sub = "", None, "", ""
        if rest and rest[0] == "namespaces" and len(rest) >= 3:
            ns, plural = rest[1], rest[2]
            name = rest[3] if len(rest) > 3 else ""
            sub = rest[4] if len(rest) > 4 else ""
            if len(rest) > 5:
                raise errors.ApiError(404, "NotFound", "the server could not find the requested "
                                      "resource")
        else:
            plural = rest[0]
            name = rest[1] if len(rest) > 1 else ""
            sub = rest[2] if len(rest) > 2 else ""
        res = R.lookup(group, version, plural)
        if res is None or (sub and sub not in res.subresources):
            raise errors.ApiError(404, "NotFound", "the server could not find the requested "
                                  "resource")
        if ns and not res.namespaced:
            raise errors.ApiError(404, "NotFound", "the server could not find the requested "
                                  "resource")
        if res.kind == "Namespace" and name:
            ns = ""
        watching = watch_prefix or req.arg("watch") in ("1", "true", "True")
        verb = self._verb(req.method, name, watching, sub)
        authz_ns = name if res.kind == "Namespace" and name else ns
        self._authorize(req, auth.Attributes(verb, group, plural, sub, authz_ns, name))
        if verb == "get" and sub in ("portforward", "exec", "attach"):
            # A WebSocket upgrade is a GET, but what it does is a create:
            # like the API (AuthorizePodWebsocketUpgradeCreatePermission),
            # both must be allowed.
            self._authorize(req, auth.Attributes("create", group, plural, sub, authz_ns, name))
        return await self._dispatch(req, res, ns, name, sub, verb)

    @staticmethod
    def _verb(method, name, watching, sub):
        if method == "GET":
            if sub in ("portforward", "exec", "attach"):
                return "get"
            if watching:
                return "watch"
            return "get" if name else "list"
        return {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())

    # -- discovery ------------------------------------------------------------------
    def _non_resource(self, req, path, parts):
        if path == "/version":
            return _json(200, K8S_VERSION)
        if path == "/openapi/v3":
            return _json(200, openapi.root())
        if path.startswith("/openapi/v3/"):
            doc = openapi.docs().get(path[len("/openapi/v3/"):])
            if doc is not None:
                return Response(200, doc[0], headers=[
                    ("Cache-Control", "public, immutable"), ("Etag", '"%s"' % doc[1])])
        accept = req.headers.get("Accept") or ""
        if path == "/api":
            if AGG_V2 in accept or AGG_V2B1 in accept:
                return self._aggregated(core=True, v2=AGG_V2 in accept)
            return _json(200, {"kind": "APIVersions", "versions": ["v1"],
                               "serverAddressByClientCIDRs": [
                                   {"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}]})
        if path == "/apis":
            if AGG_V2 in accept or AGG_V2B1 in accept:
                return self._aggregated(core=False, v2=AGG_V2 in accept)
            return _json(200, {"kind": "APIGroupList", "apiVersion": "v1",
                               "groups": [self._group(g, v) for g, v in R.groups() if g]})
        if len(parts) == 2 and parts[0] == "apis":
            for g, v in R.groups():
                if g == parts[1]:
                    grp = self._group(g, v)
                    grp.update({"kind": "APIGroup", "apiVersion": "v1"})
                    return _json(200, grp)
        raise errors.ApiError(404, "NotFound", "the server could not find the requested resource")

    @staticmethod
    def _group(g, v):
        gv = {"groupVersion": "%s/%s" % (g, v), "version": v}
        return {"name": g, "versions": [gv], "preferredVersion": gv}

    def _group_version(self, req, group, version):
        if (group, version) not in R.groups():
            raise errors.ApiError(404, "NotFound", "the server could not find the requested "
                                  "resource")
        out = []
        for r in R.RESOURCES:
            if (r.group, r.version) != (group, version):
                continue
            e = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                 "kind": r.kind, "verbs": r.verbs}
            if r.short:
                e["shortNames"] = r.short
            if r.categories:
                e["categories"] = r.categories
            out.append(e)
            for sub, (sg, sv, sk, verbs) in r.subresources.items():
                se = {"name": "%s/%s" % (r.plural, sub), "singularName": "",
                      "namespaced": r.namespaced, "kind": sk, "verbs": verbs}
                if (sg, sv) != (r.group, r.version):
                    se["group"] = sg
                    se["version"] = sv
                out.append(se)
        gv = version if not group else "%s/%s" % (group, version)
        return _json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                           "resources": out})

    def _aggregated(self, core, v2):
        items = []
        for g, v in R.groups():
            if bool(g) == core:
                continue
            resources = []
            for r in R.RESOURCES:
                if (r.group, r.version) != (g, v):
                    continue
                e = {"resource": r.plural, "responseKind": {"group": r.group, "version": r.version,
                                                           "kind": r.kind},
                     "scope": "Namespaced" if r.namespaced else "Cluster",
                     "singularResource": r.singular, "verbs": r.verbs}
                if r.short:
                    e["shortNames"] = r.short
                if r.categories:
                    e["categories"] = r.categories
                subs = []
                for sub, (sg, sv, sk, verbs) in r.subresources.items():
                    subs.append({"subresource": sub, "responseKind": {"group": sg, "version": sv,
                                                                     "kind": sk},
                                 "verbs": verbs})
                if subs:
                    e["subresources"] = subs
                resources.append(e)
            items.append({"metadata": {"name": g, "creationTimestamp": None},
                          "versions": [{"version": v, "resources": resources,
                                        "freshness": "Current"}]})
        ver = "v2" if v2 else "v2beta1"
        ct = AGG_V2 if v2 else AGG_V2B1
        return _json(200, {"kind": "APIGroupDiscoveryList",
                           "apiVersion": "apidiscovery.k8s.io/" + ver, "metadata": {},
                           "items": items}, content_type=ct)

    # -- resources ------------------------------------------------------------------
    async def _dispatch(self, req, res, ns, name, sub, verb):
        reg = self.registry
        dry = "All" in req.query.get("dryRun", [])
        if not res.stored:
            if verb != "create":
                raise errors.method_not_allowed()
            return self._review(req, res, ns)
        if sub == "log":
            return await self._logs(req, ns, name)
        if sub == "portforward":
            return await self._portforward(req, ns, name)
        if sub == "exec":
            return await self._exec(req, ns, name)
        if sub == "attach":
            raise errors.bad_request("attach is not supported by the local cluster")
        if sub == "eviction":
            body = req.json() or {}
            obj, _ = reg.evict(ns, name, body)
            return _json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Success", "code": 201})
        if sub == "binding":
            body = req.json() or {}
            target = (body.get("target") or {}).get("name")
            if not target:
                raise errors.bad_request("binding has no target")
            reg.bind(ns, name, target)
            return _json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Success", "code": 201})
        if sub == "scale":
            if verb == "get":
                return _json(200, reg.scale_of(res, reg.get(res, ns, name)))
            if verb == "update":
                obj, w = reg.set_scale(res, ns, name, req.json() or {}, dry)
                return self._with_warnings(_json(200, obj), w)
            if verb == "patch":
                obj, w = reg.patch(res, ns, name, req.headers.get("Content-Type"), req.body,
                                   "scale", dry)
                return self._with_warnings(_json(200, obj), w)
            raise errors.method_not_allowed()
        accept = req.headers.get("Accept") or ""
        if verb == "get":
            obj = reg.get(res, ns, name)
            if tables.wants_table(accept):
                return _json(200, tables.table(res, [obj], obj["metadata"]["resourceVersion"],
                                               req.arg("includeObject", "Metadata")))
            return _json(200, obj)
        if verb in ("list", "watch", "deletecollection"):
            lsel = parse_label_selector(req.arg("labelSelector"))
            fsel = parse_field_selector(req.arg("fieldSelector"), res.kind)
            if verb == "watch":
                return await self._watch(req, res, ns or None, lsel, fsel,
                                         tables.wants_table(accept))
            items = [o for o in self.store.list(res, ns or None)
                     if labels_match(lsel, o["metadata"].get("labels")) and fields_match(fsel, o)]
            if verb == "deletecollection":
                opts = req.json() or {}
                for o in items:
                    try:
                        reg.delete(res, o["metadata"].get("namespace", ""), o["metadata"]["name"],
                                   opts, dry)
                    except errors.ApiError as e:
                        if e.code != 404:
                            raise
                items = [copy.deepcopy(o) for o in items]
            rv = str(self.store.rv)
            if tables.wants_table(accept) and verb == "list":
                return _json(200, tables.table(res, items, rv, req.arg("includeObject",
                                                                      "Metadata")))
            return _json(200, {"kind": res.list_kind, "apiVersion": res.api_version,
                               "metadata": {"resourceVersion": rv}, "items": items})
        if verb == "create":
            if name and not sub:
                raise errors.method_not_allowed()
            obj, w = reg.create(res, ns, req.json(), dry)
            return self._with_warnings(_json(201, obj), w)
        if verb == "update":
            obj, w = reg.update(res, ns, name, req.json(), sub, dry)
            return self._with_warnings(_json(200, obj), w)
        if verb == "patch":
            obj, w = reg.patch(res, ns, name, req.headers.get("Content-Type"), req.body, sub, dry)
            return self._with_warnings(_json(200, obj), w)
        if verb == "delete":
            opts = req.json() or {}
            for k in ("gracePeriodSeconds",):
                if req.arg(k) is not None:
                    opts[k] = int(req.arg(k))
            if req.arg("propagationPolicy"):
                opts["propagationPolicy"] = req.arg("propagationPolicy")
            obj, gone = reg.delete(res, ns, name, opts, dry)
            return _json(200, obj)
        raise errors.method_not_allowed()

    @staticmethod
    def _with_warnings(resp, warnings):
        for w in warnings or []:
            resp.headers.add("Warning", '299 - "%s"' % w.replace('"', '\\"'))
        return resp

    # -- watch ------------------------------------------------------------------------
    async def _watch(self, req, res, ns, lsel, fsel, as_table):
        def match(o):
            return labels_match(lsel, o["metadata"].get("labels")) and fields_match(fsel, o)
        rv_param = req.arg("resourceVersion") or ""
        send_initial = req.arg("sendInitialEvents") == "true"
        bookmarks = req.arg("allowWatchBookmarks") == "true"
        try:
            timeout = float(req.arg("timeoutSeconds") or 1800)
        except ValueError:
            raise errors.bad_request("invalid timeoutSeconds")
        if rv_param in ("", "0") or send_initial:
            watcher = self.store.watch(res, ns, match, None)
            initial = [o for o in self.store.list(res, ns) if match(o)]
        else:
            try:
                since = int(rv_param)
            except ValueError:
                raise errors.bad_request('invalid resource version: "%s"' % rv_param)
            watcher = self.store.watch(res, ns, match, since)
            initial = []
        start_rv = str(self.store.rv)
        try:
            await req.stream_start(200)
            gone = req.client_gone()

            async def send(etype, obj):
                if as_table and etype != "BOOKMARK":
                    obj = tables.table(res, [obj], obj["metadata"]["resourceVersion"],
                                       req.arg("includeObject", "Metadata"))
                await req.stream_write(json.dumps({"type": etype, "object": obj},
                                                  separators=(",", ":")).encode() + b"\n")

            for o in initial:
                await send("ADDED", o)
            if send_initial:
                await send("BOOKMARK", self._bookmark(res, start_rv, initial_end=True))
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                get = asyncio.ensure_future(watcher.queue.get())
                done, _ = await asyncio.wait({get, gone}, timeout=min(left, BOOKMARK_EVERY),
                                             return_when=asyncio.FIRST_COMPLETED)
                if gone in done:
                    get.cancel()
                    break
                if get in done:
                    etype, obj = get.result()
                    await send(etype, obj)
                else:
                    get.cancel()
                    if bookmarks:
                        await send("BOOKMARK", self._bookmark(res, str(self.store.rv)))
            await req.stream_end()
        except (ConnectionError, OSError):
            pass
        finally:
            self.store.unwatch(watcher)
        return None

    @staticmethod
    def _bookmark(res, rv, initial_end=False):
        md = {"resourceVersion": rv}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": res.kind, "apiVersion": res.api_version, "metadata": md}

    # -- reviews --------------------------------------------------------------------------
    def _review(self, req, res, ns):
        body = req.json() or {}
        spec = body.get("spec") or {}
        out = {"kind": res.kind, "apiVersion": res.api_version,
               "metadata": {"creationTimestamp": None}, "spec": spec}
        if res.kind == "SelfSubjectReview":
            out["status"] = {"userInfo": req.user.info()}
            return _json(201, out)
        if res.kind == "SelfSubjectRulesReview":
            rr, nr = self.authorizer.rules(req.user, spec.get("namespace", ""))
            out["status"] = {"resourceRules": rr, "nonResourceRules": nr, "incomplete": False}
            return _json(201, out)
        if res.kind == "SelfSubjectAccessReview":
            user = req.user
        else:
            user = auth.User(spec.get("user", ""), spec.get("uid", ""), spec.get("groups") or [])
        ra = spec.get("resourceAttributes")
        nra = spec.get("nonResourceAttributes")
        if ra:
            attrs = auth.Attributes(ra.get("verb", ""), ra.get("group", ""),
                                    ra.get("resource", ""), ra.get("subresource", ""),
                                    ns if res.kind == "LocalSubjectAccessReview" else
                                    ra.get("namespace", ""), ra.get("name", ""))
        elif nra:
            attrs = auth.Attributes(nra.get("verb", ""), path=nra.get("path", ""))
        else:
            raise errors.invalid(res, res.kind, "", [(
                "spec.resourceAttributes", "FieldValueRequired", "",
                "spec.resourceAttributes: Invalid value: \"null\": exactly one of "
                "nonResourceAttributes or resourceAttributes must be specified")])
        allowed, reason = self.authorizer.authorize(user, attrs)
        out["status"] = {"allowed": allowed}
        if reason:
            out["status"]["reason"] = reason
        return _json(201, out)

    # -- logs and port-forward: through the pod's node ---------------------------------
    def _node_socket(self, node_name):
        node = self.store.get(R.NODES, "", node_name, copy_=False)
        if node is None:
            raise errors.ApiError(500, "InternalError", 'node "%s" not found' % node_name)
        sock = (node["metadata"].get("annotations") or {}).get(
            "local-cluster.siphon.dev/kubelet-socket")
        if not sock or not os.path.exists(sock):
            raise errors.ApiError(502, "InternalError", "the kubelet of node %s is not reachable"
                                  % node_name)
        return sock

    async def _node_open(self, node_name, request):
        sock = self._node_socket(node_name)
        try:
            r, w = await asyncio.open_unix_connection(sock, limit=1 << 20)
        except OSError as e:
            raise errors.ApiError(502, "InternalError", "dialing the kubelet of node %s: %s" % (
                node_name, e))
        w.write(json.dumps(request).encode() + b"\n")
        await w.drain()
        line = await r.readline()
        try:
            answer = json.loads(line or b"{}")
        except ValueError:
            answer = {"error": "bad answer from the kubelet", "code": 500}
        if "error" in answer:
            w.close()
            raise errors.ApiError(answer.get("code", 500), answer.get("reason", "BadRequest"),
                                  answer["error"])
        return r, w

    def _pick_container(self, pod, container):
        spec = pod["spec"]
        names = [c["name"] for c in spec.get("containers") or []]
        init = [c["name"] for c in spec.get("initContainers") or []]
        eph = [c["name"] for c in spec.get("ephemeralContainers") or []]
        if not container:
            if len(names) == 1:
                return names[0]
            msg = "a container name must be specified for pod %s, choose one of: [%s]" % (
                pod["metadata"]["name"], " ".join(names))
            if init:
                msg += " or one of the init containers: [%s]" % " ".join(init)
            if eph:
                msg += " or one of the ephemeral containers: [%s]" % " ".join(eph)
            raise errors.bad_request(msg)
        if container not in names + init + eph:
            msg = "container %s is not valid for pod %s" % (container, pod["metadata"]["name"])
            raise errors.bad_request(msg)
        return container

    async def _logs(self, req, ns, name):
        pod = self.registry.get(R.PODS, ns, name)
        container = self._pick_container(pod, req.arg("container"))
        node = pod["spec"].get("nodeName")
        st = pod.get("status") or {}
        cs = None
        for lst in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for c in st.get(lst) or []:
                if c.get("name") == container:
                    cs = c
        previous = req.arg("previous") in ("true", "1")
        if not node or cs is None or (not previous and "waiting" in (cs.get("state") or {})
                                      and not cs.get("lastState", {}).get("terminated")
                                      and not cs.get("containerID")):
            reason = ((cs or {}).get("state") or {}).get("waiting", {}).get(
                "reason", "ContainerCreating")
            raise errors.bad_request('container "%s" in pod "%s" is waiting to start: %s' % (
                container, name, reason))
        request = {"op": "logs", "namespace": ns, "pod": name, "uid": pod["metadata"]["uid"],
                   "container": container, "follow": req.arg("follow") in ("true", "1"),
                   "previous": previous, "tailLines": _int(req.arg("tailLines")),
                   "limitBytes": _int(req.arg("limitBytes")),
                   "sinceSeconds": _int(req.arg("sinceSeconds")),
                   "timestamps": req.arg("timestamps") in ("true", "1")}
        r, w = await self._node_open(node, request)
        try:
            await req.stream_start(200, "text/plain")
            gone = req.client_gone()
            while True:
                read = asyncio.ensure_future(r.read(65536))
                done, _ = await asyncio.wait({read, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone in done:
                    read.cancel()
                    break
                chunk = read.result()
                if not chunk:
                    break
                await req.stream_write(chunk)
            await req.stream_end()
        except (ConnectionError, OSError):
            pass
        finally:
            w.close()
        return None

    async def _exec(self, req, ns, name):
        pod = self.registry.get(R.PODS, ns, name)
        container = self._pick_container(pod, req.arg("container"))
        command = req.query.get("command") or []
        if not command:
            raise errors.bad_request("you must specify at least 1 command")
        node = pod["spec"].get("nodeName")
        running = False
        for lst in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
            for c in (pod.get("status") or {}).get(lst) or []:
                if c.get("name") == container and "running" in (c.get("state") or {}):
                    running = True
        if not node or not running:
            raise errors.bad_request('container %s is not running (pod "%s")' % (
                container, name))
        flag = lambda k: req.arg(k) in ("true", "1")  # noqa: E731
        tty = flag("tty")
        upgrade = (req.headers.get("Upgrade") or "").lower()
        request = {"op": "exec", "uid": pod["metadata"]["uid"], "pod": name,
                   "container": container, "command": command, "stdin": flag("stdin"),
                   "tty": tty}
        if upgrade == "websocket":
            protos = [p.strip() for p in (req.headers.get("Sec-WebSocket-Protocol") or "")
                      .split(",")]
            proto = next((p for p in ("v5.channel.k8s.io", "v4.channel.k8s.io")
                          if p in protos), None)
            if proto is None:
                raise errors.bad_request("unsupported exec WebSocket subprotocols %s" % protos)
            nr, nw = await self._node_open(node, request)
            key = req.headers.get("Sec-WebSocket-Key") or ""
            reader, writer = await req.upgrade([
                ("Upgrade", "websocket"), ("Connection", "Upgrade"),
                ("Sec-WebSocket-Accept", ws_accept(key)), ("Sec-WebSocket-Protocol", proto)])
            try:
                await execstream.serve_ws(reader, writer, nr, nw, command,
                                          proto == "v5.channel.k8s.io")
            finally:
                nw.close()
            return None
        if upgrade.startswith("spdy/3.1"):
            protos = [p.strip() for v in req.headers.get_all("X-Stream-Protocol-Version")
                      for p in v.split(",")]
            if "v4.channel.k8s.io" not in protos:
                raise errors.ApiError(403, "Forbidden", "unable to upgrade: unable to negotiate "
                                      "protocol: client supports %s, server supports "
                                      "[v4.channel.k8s.io]" % protos)
            nr, nw = await self._node_open(node, request)
            reader, writer = await req.upgrade([
                ("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io")])
            want = ["error"] + [k for k in ("stdin", "stdout", "stderr") if flag(k)] + (
                ["resize"] if tty else [])
            if tty and "stderr" in want:
                want.remove("stderr")  # a terminal has no separate stderr
            try:
                await execstream.serve_spdy(reader, writer, nr, nw, command, want)
            finally:
                nw.close()
            return None
        raise errors.bad_request("Upgrade request required")

    async def _portforward(self, req, ns, name):
        pod = self.registry.get(R.PODS, ns, name)
        node = pod["spec"].get("nodeName")
        if not node:
            raise errors.bad_request("pod %s is not scheduled" % name)
        uid = pod["metadata"]["uid"]
        upgrade = (req.headers.get("Upgrade") or "").lower()
        describe = "pod %s_%s, uid %s" % (name, ns, uid)

        async def dial(port):
            try:
                return await self._node_open(node, {"op": "portforward", "uid": uid,
                                                    "namespace": ns, "pod": name, "port": port})
            except errors.ApiError as e:
                raise PortForwardError(e.message)

        if upgrade == "websocket":
            protos = [p.strip() for p in (req.headers.get("Sec-WebSocket-Protocol") or "")
                      .split(",")]
            if PF_WS_PROTOCOL not in protos:
                raise errors.bad_request("unsupported port-forward WebSocket subprotocols %s; "
                                         "this server speaks %s" % (protos, PF_WS_PROTOCOL))
            key = req.headers.get("Sec-WebSocket-Key") or ""
            reader, writer = await req.upgrade([
                ("Upgrade", "websocket"), ("Connection", "Upgrade"),
                ("Sec-WebSocket-Accept", ws_accept(key)),
                ("Sec-WebSocket-Protocol", PF_WS_PROTOCOL)])
            ws = WebSocketStream(reader, writer)
            await serve_portforward(ws, ws, dial, describe, self.stream_idle_timeout)
            return None
        if upgrade.startswith("spdy/3.1"):
            protos = [p.strip() for v in req.headers.get_all("X-Stream-Protocol-Version")
                      for p in v.split(",")]
            if "portforward.k8s.io" not in protos:
                raise errors.ApiError(403, "Forbidden", "unable to upgrade: unable to negotiate "
                                      "protocol: client supports %s, server supports "
                                      "[portforward.k8s.io]" % protos)
            reader, writer = await req.upgrade([
                ("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "portforward.k8s.io")])
            await serve_portforward(reader, writer, dial, describe, self.stream_idle_timeout)
            return None
        raise errors.bad_request("Upgrade request required")


def _int(v):
    try:
        return int(v) if v not in (None, "") else None
    except ValueError:
        raise errors.bad_request("invalid integer %r" % v)
