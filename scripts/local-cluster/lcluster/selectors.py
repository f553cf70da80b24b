"""Label selectors (the query string form and the LabelSelector object) and
field selectors, as the API reference describes them."""

import re

from .errors import bad_request


# -- label selectors ----------------------------------------------------------
# A parsed selector is a list of (key, op, values): op in "=", "!=", "in",
# "notin", "exists", "!exists".

_TOKEN = re.compile(r"\s*(!=|==|=|\(|\)|,|!|[^\s!=(),]+)")


def parse_label_selector(text):
    if text is None:
        return []
    text = text.strip()
    if not text:
        return []
    toks = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise bad_request("unable to parse requirement: invalid label selector %r" % text)
        toks.append(m.group(1))
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    reqs = []
    i = 0

    def need(cond):
        if not cond:
            raise bad_request("unable to parse requirement: invalid label selector %r" % text)

    while i < len(toks):
        if toks[i] == "!":
            need(i + 1 < len(toks))
            reqs.append((toks[i + 1], "!exists", []))
            i += 2
        else:
            key = toks[i]
            i += 1
            if i >= len(toks) or toks[i] == ",":
                reqs.append((key, "exists", []))
            elif toks[i] in ("=", "=="):
                need(i + 1 < len(toks) and toks[i + 1] not in (",",))
                reqs.append((key, "=", [toks[i + 1]]))
                i += 2
            elif toks[i] == "!=":
                need(i + 1 < len(toks))
                reqs.append((key, "!=", [toks[i + 1]]))
                i += 2
            elif toks[i] in ("in", "notin"):
                op = toks[i]
                need(i + 1 < len(toks) and toks[i + 1] == "(")
                i += 2
                vals = []
                while i < len(toks) and toks[i] != ")":
                    if toks[i] != ",":
                        vals.append(toks[i])
                    i += 1
                need(i < len(toks))
                i += 1
                reqs.append((key, op, vals))
            else:
                need(False)
        if i < len(toks):
            need(toks[i] == ",")
            i += 1
    return reqs


def selector_object_to_reqs(sel):
    """A LabelSelector object ({matchLabels, matchExpressions}) as reqs.
    None selects nothing (returns None); {} selects everything."""
    if sel is None:
        return None
    reqs = [(k, "=", [v]) for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists",
              "DoesNotExist": "!exists"}.get(e.get("operator"))
        if op is None:
            raise bad_request("%r is not a valid label selector operator" % e.get("operator"))
        reqs.append((e.get("key"), op, list(e.get("values") or [])))
    return reqs


def labels_match(reqs, labels):
    if reqs is None:
        return False
    labels = labels or {}
    for key, op, vals in reqs:
        has = key in labels
        v = labels.get(key)
        if op == "=" and not (has and v == vals[0]):
            return False
        if op == "!=" and has and v == vals[0]:
            return False
        if op == "in" and not (has and v in vals):
            return False
        if op == "notin" and has and v in vals:
            return False
        if op == "exists" and not has:
            return False
        if op == "!exists" and has:
            return False
    return True


def selector_matches(sel_obj, labels):
    return labels_match(selector_object_to_reqs(sel_obj), labels)


def selector_string(sel_obj):
    """The query-string form of a LabelSelector (for status.selector)."""
    parts = []
    for k, v in sorted((sel_obj.get("matchLabels") or {}).items()):
        parts.append("%s=%s" % (k, v))
    for e in sel_obj.get("matchExpressions") or []:
        op = e.get("operator")
        if op == "In":
            parts.append("%s in (%s)" % (e["key"], ",".join(e.get("values") or [])))
        elif op == "NotIn":
            parts.append("%s notin (%s)" % (e["key"], ",".join(e.get("values") or [])))
        elif op == "Exists":
            parts.append(e["key"])
        elif op == "DoesNotExist":
            parts.append("!" + e["key"])
    return ",".join(parts)


# -- field selectors ------------------------------------------------------------

def _get_path(obj, path):
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


# Fields each kind can be selected on, besides metadata.name/namespace.
FIELDS = {
    "Pod": ["spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
            "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
            "status.nominatedNodeName"],
    "Event": ["involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
              "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
              "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"],
    "Secret": ["type"],
    "Node": ["spec.unschedulable"],
    "Namespace": ["status.phase"],
    "ReplicaSet": ["status.replicas"],
    "Job": ["status.successful"],
}


def parse_field_selector(text, kind):
    """[(path, op, value)] with op "=" or "!="."""
    if not text:
        return []
    allowed = {"metadata.name", "metadata.namespace"} | set(FIELDS.get(kind, []))
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "!=" in part:
            k, v = part.split("!=", 1)
            op = "!="
        elif "==" in part:
            k, v = part.split("==", 1)
            op = "="
        elif "=" in part:
            k, v = part.split("=", 1)
            op = "="
        else:
            raise bad_request("invalid selector: '%s'; can't understand '%s'" % (text, part))
        k = k.strip()
        if k not in allowed:
            raise bad_request('field label not supported: %s' % k)
        out.append((k, op, v.strip()))
    return out


def fields_match(reqs, obj):
    for path, op, value in reqs:
        if path == "source" and obj.get("kind") == "Event":
            got = (obj.get("source") or {}).get("component", "")
        else:
            got = _get_path(obj, path)
        if (got == value) != (op == "="):
            return False
    return True
