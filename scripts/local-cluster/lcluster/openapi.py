"""OpenAPI v3 as far as kubectl needs it: the discovery document
(/openapi/v3) and, per group-version, the paths with the query parameters
each operation takes and the x-kubernetes-group-version-kind of each
operation. `kubectl apply` reads them to learn that the server takes
fieldValidation (then it validates nothing itself); it finds no schemas
and computes its strategic merge patches from its compiled-in types, as
it does for any server without them.

There are no schemas: `kubectl explain` does not work."""

import hashlib
import json

from . import resources as R

_COMMON = ["pretty", "dryRun", "fieldManager", "fieldValidation"]
_LIST = ["allowWatchBookmarks", "continue", "fieldSelector", "labelSelector", "limit",
         "resourceVersion", "resourceVersionMatch", "sendInitialEvents", "timeoutSeconds",
         "watch"]


def _params(names, path_params):
    out = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
           for p in path_params]
    out += [{"name": n, "in": "query", "schema": {"type": "string"}} for n in names]
    return out


def _op(op_id, gvk, names, path_params, action):
    return {"operationId": op_id, "parameters": _params(names, path_params),
            "responses": {"200": {"description": "OK"}},
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk}


def group_version_doc(group, version):
    paths = {}
    prefix = "/api/%s" % version if not group else "/apis/%s/%s" % (group, version)
    for r in R.RESOURCES:
        if (r.group, r.version) != (group, version):
            continue
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        base = prefix + ("/namespaces/{namespace}/" if r.namespaced else "/") + r.plural
        pp = ["namespace"] if r.namespaced else []
        coll = {}
        if "create" in r.verbs:
            coll["post"] = _op("create" + r.kind, gvk, _COMMON, pp, "post")
        if "list" in r.verbs:
            coll["get"] = _op("list" + r.kind, gvk, _LIST, pp, "list")
        if "deletecollection" in r.verbs:
            coll["delete"] = _op("deletecollection" + r.kind, gvk, _COMMON + _LIST, pp,
                                 "deletecollection")
        paths[base] = coll
        if "get" in r.verbs:
            one = {"get": _op("read" + r.kind, gvk, ["pretty"], pp + ["name"], "get"),
                   "put": _op("replace" + r.kind, gvk, _COMMON, pp + ["name"], "put"),
                   "patch": _op("patch" + r.kind, gvk, _COMMON + ["force"], pp + ["name"],
                                "patch"),
                   "delete": _op("delete" + r.kind, gvk, _COMMON + [
                       "gracePeriodSeconds", "propagationPolicy", "orphanDependents"],
                       pp + ["name"], "delete")}
            paths[base + "/{name}"] = one
        for sub, (sg, sv, sk, verbs) in r.subresources.items():
            sgvk = {"group": sg, "version": sv, "kind": sk}
            ops = {}
            if "get" in verbs:
                ops["get"] = _op("read%s%s" % (r.kind, sub.title()), sgvk, ["pretty"],
                                 pp + ["name"], "get")
            if "update" in verbs:
                ops["put"] = _op("replace%s%s" % (r.kind, sub.title()), sgvk, _COMMON,
                                 pp + ["name"], "put")
            if "patch" in verbs:
                ops["patch"] = _op("patch%s%s" % (r.kind, sub.title()), sgvk, _COMMON,
                                   pp + ["name"], "patch")
            if "create" in verbs:
                ops["post"] = _op("create%s%s" % (r.kind, sub.title()), sgvk, _COMMON,
                                  pp + ["name"], "post")
            paths[base + "/{name}/" + sub] = ops
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.4"},
            "paths": paths, "components": {"schemas": {}}}


def _key(group, version):
    return "api/%s" % version if not group else "apis/%s/%s" % (group, version)


_DOCS = {}


def docs():
    if not _DOCS:
        for g, v in R.groups():
            body = json.dumps(group_version_doc(g, v), separators=(",", ":")).encode()
            _DOCS[_key(g, v)] = (body, hashlib.sha512(body).hexdigest().upper()[:128])
    return _DOCS


def root():
    return {"paths": {k: {"serverRelativeURL": "/openapi/v3/%s?hash=%s" % (k, h)}
                      for k, (_, h) in docs().items()}}
