"""PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and
Kubernetes' strategic merge patch (the patch strategies of the built-in
types for the fields kubectl and controllers touch; the directives $patch,
$retainKeys, $setElementOrder/F and $deleteFromPrimitiveList/F)."""

import copy

from .errors import bad_request, ApiError


# -- JSON merge patch -----------------------------------------------------------

def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    out = dict(target)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# -- JSON patch -----------------------------------------------------------------

def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request("invalid JSON pointer %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts, path):
    cur = doc
    for p in parts:
        if isinstance(cur, dict):
            if p not in cur:
                raise _unprocessable("doc is missing path: %s" % path)
            cur = cur[p]
        elif isinstance(cur, list):
            try:
                cur = cur[int(p)]
            except (ValueError, IndexError):
                raise _unprocessable("doc is missing path: %s" % path)
        else:
            raise _unprocessable("doc is missing path: %s" % path)
    return cur


def _unprocessable(msg):
    return ApiError(422, "Invalid", msg)


def json_patch(doc, ops):
    if not isinstance(ops, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        kind = op.get("op")
        path = op.get("path", "")
        parts = _pointer(path)
        if kind == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise _unprocessable("testing value %s failed" % path)
            continue
        if kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            val = copy.deepcopy(_walk(doc, src, op.get("from")))
            if kind == "move":
                doc = _remove(doc, src, op.get("from"))
            doc = _add(doc, parts, val, path)
            continue
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        elif kind == "remove":
            doc = _remove(doc, parts, path)
        elif kind == "replace":
            _walk(doc, parts, path)
            doc = _remove(doc, parts, path)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        else:
            raise bad_request("unknown json patch operation %r" % kind)
    return doc


def _add(doc, parts, value, path):
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                i = int(last)
            except ValueError:
                raise _unprocessable("invalid index in %s" % path)
            if i < 0 or i > len(parent):
                raise _unprocessable("index out of range in %s" % path)
            parent.insert(i, value)
    else:
        raise _unprocessable("doc is missing path: %s" % path)
    return doc


def _remove(doc, parts, path):
    if not parts:
        return None
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable("doc is missing path: %s" % path)
        del parent[last]
    elif isinstance(parent, list):
        try:
            del parent[int(last)]
        except (ValueError, IndexError):
            raise _unprocessable("doc is missing path: %s" % path)
    return doc


# -- strategic merge patch ----------------------------------------------------------

# Lists merged element by element on a key (patchStrategy "merge" with a
# patchMergeKey in the API's Go types); every other list of objects is
# replaced whole.
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "volumes": "name", "imagePullSecrets": "name", "env": "name", "volumeMounts": "mountPath",
    "volumeDevices": "devicePath", "hostAliases": "ip", "ownerReferences": "uid",
    "conditions": "type", "addresses": "type", "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name", "schedulingGates": "name", "containerStatuses": "name",
    "initContainerStatuses": "name", "ephemeralContainerStatuses": "name",
}
# Lists of scalars merged as sets.
PRIMITIVE_MERGE = {"finalizers"}
CONTAINER_LISTS = {"containers", "initContainers", "ephemeralContainers"}


def _merge_key(path, field):
    if field == "ports":
        # Container ports merge on containerPort, a Service's on port.
        if len(path) >= 1 and path[-1] in CONTAINER_LISTS:
            return "containerPort"
        if path == ["spec"]:
            return "port"
        return None
    if field == "conditions" and path and path[-1] != "status":
        return None
    return MERGE_KEYS.get(field)


# Maps replaced whole rather than merged (patchStrategy "replace").
REPLACE_MAPS = {("PodDisruptionBudget", ("spec", "selector"))}


def strategic_merge_patch(original, patch, kind=""):
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _smp_map(copy.deepcopy(original) if isinstance(original, dict) else {}, patch, [],
                    kind)


def _smp_map(orig, patch, path, kind=""):
    directive = patch.get("$patch")
    if (kind, tuple(path)) in REPLACE_MAPS:
        directive = "replace"
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    retain = patch.get("$retainKeys")
    if retain is not None:
        orig = {k: v for k, v in orig.items() if k in retain}
    orders = {}
    deletes = {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/"):
            orders[k.split("/", 1)[1]] = v
        elif k.startswith("$deleteFromPrimitiveList/"):
            deletes[k.split("/", 1)[1]] = v
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            orig.pop(k, None)
            continue
        cur = orig.get(k)
        if isinstance(v, dict):
            merged = _smp_map(cur if isinstance(cur, dict) else {}, v, path + [k], kind)
            if merged is None:
                orig.pop(k, None)
            else:
                orig[k] = merged
        elif isinstance(v, list):
            orig[k] = _smp_list(cur if isinstance(cur, list) else [], v, path, k)
        else:
            orig[k] = copy.deepcopy(v)
    for k, vals in deletes.items():
        if isinstance(orig.get(k), list):
            orig[k] = [x for x in orig[k] if x not in vals]
    for k, order in orders.items():
        if isinstance(orig.get(k), list):
            orig[k] = _apply_order(orig[k], order, _merge_key(path, k))
    return orig


def _smp_list(orig, patch, path, field):
    if any(isinstance(e, dict) and e.get("$patch") == "replace" for e in patch):
        return [copy.deepcopy(e) for e in patch
                if not (isinstance(e, dict) and e.get("$patch") == "replace")]
    key = _merge_key(path, field)
    if key is None:
        if field in PRIMITIVE_MERGE:
            out = list(orig)
            for e in patch:
                if e not in out:
                    out.append(e)
            return out
        return [copy.deepcopy(e) for e in patch]
    out = [copy.deepcopy(e) for e in orig]
    for e in patch:
        if not isinstance(e, dict):
            raise bad_request("the list %s holds objects merged on %r" % (field, key))
        if key not in e:
            raise bad_request("map: %s does not contain declared merge key: %s" % (e, key))
        idx = next((i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == e[key]),
                   None)
        if e.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
            continue
        if idx is None:
            out.append(_smp_map({}, e, path + [field]))
        else:
            out[idx] = _smp_map(out[idx], e, path + [field])
    return out


def _apply_order(items, order, key):
    def ident(x):
        return x.get(key) if key and isinstance(x, dict) else x
    wanted = [ident(o) if key else o for o in order]
    placed = []
    rest = []
    by_id = {}
    for it in items:
        i = ident(it)
        if i in wanted and i not in by_id:
            by_id[i] = it
        else:
            rest.append(it)
    for w in wanted:
        if w in by_id:
            placed.append(by_id[w])
    return placed + rest
