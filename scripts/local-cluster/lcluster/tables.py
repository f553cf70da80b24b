"""Server-side printing: the meta.k8s.io/v1 Table kubectl asks for
(`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), with the columns
`kubectl get` shows for each kind."""

from .errors import now, parse_time


def human_duration(seconds):
    s = int(max(seconds, 0))
    if s < 120:
        return "%ds" % s
    m = s // 60
    if m < 10:
        return "%dm%ds" % (m, s % 60) if s % 60 else "%dm" % m
    if m < 180:
        return "%dm" % m
    h = m // 60
    if h < 8:
        return "%dh%dm" % (h, m % 60) if m % 60 else "%dh" % h
    if h < 48:
        return "%dh" % h
    d = h // 24
    if h < 24 * 8:
        return "%dd%dh" % (d, h % 24) if h % 24 else "%dd" % d
    if d < 365 * 2:
        return "%dd" % d
    return "%dy%dd" % (d // 365, d % 365)


def age(ts):
    t = parse_time(ts)
    if t is None:
        return "<unknown>"
    return human_duration((now() - t).total_seconds())


def _col(name, typ="string", fmt="", priority=0, desc=""):
    return {"name": name, "type": typ, "format": fmt, "description": desc or name,
            "priority": priority}


def pod_status_reason(pod):
    """The STATUS column of `kubectl get pods`, as kubectl's printer derives it."""
    st = pod.get("status") or {}
    reason = st.get("reason") or st.get("phase") or "Unknown"
    init_ok = True
    for i, cs in enumerate(st.get("initContainerStatuses") or []):
        state = cs.get("state") or {}
        if "terminated" in state and state["terminated"].get("exitCode") == 0:
            continue
        init_ok = False
        if "terminated" in state:
            t = state["terminated"]
            reason = "Init:" + (t.get("reason") or ("Signal:%d" % t.get("signal", 0) if
                                                    t.get("signal") else
                                                    "ExitCode:%d" % t.get("exitCode", 0)))
        elif "waiting" in state and state["waiting"].get("reason") not in (None,
                                                                          "PodInitializing"):
            reason = "Init:" + state["waiting"]["reason"]
        else:
            reason = "Init:%d/%d" % (i, len((pod.get("spec") or {}).get("initContainers") or []))
        break
    if init_ok:
        has_running = False
        for cs in reversed(st.get("containerStatuses") or []):
            state = cs.get("state") or {}
            if "waiting" in state and state["waiting"].get("reason"):
                reason = state["waiting"]["reason"]
            elif "terminated" in state and state["terminated"].get("reason"):
                reason = state["terminated"]["reason"]
            elif "terminated" in state:
                t = state["terminated"]
                reason = ("Signal:%d" % t["signal"]) if t.get("signal") else (
                    "ExitCode:%d" % t.get("exitCode", 0))
            elif "running" in state and cs.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_row(p):
    st = p.get("status") or {}
    css = st.get("containerStatuses") or []
    total = len((p.get("spec") or {}).get("containers") or [])
    ready = sum(1 for c in css if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in css)
    last = None
    for c in css:
        t = ((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if t and (last is None or t > last):
            last = t
    rs = str(restarts) + (" (%s ago)" % age(last) if restarts and last else "")
    return [p["metadata"]["name"], "%d/%d" % (ready, total), pod_status_reason(p), rs,
            age(p["metadata"].get("creationTimestamp")), st.get("podIP") or "<none>",
            (p.get("spec") or {}).get("nodeName") or "<none>",
            st.get("nominatedNodeName") or "<none>", "<none>"]


def _node_row(n):
    conds = {c["type"]: c["status"] for c in (n.get("status") or {}).get("conditions") or []}
    s = "Ready" if conds.get("Ready") == "True" else (
        "NotReady" if "Ready" in conds else "Unknown")
    if (n.get("spec") or {}).get("unschedulable"):
        s += ",SchedulingDisabled"
    roles = sorted(k.split("/", 1)[1] for k in (n["metadata"].get("labels") or {})
                   if k.startswith("node-role.kubernetes.io/"))
    info = (n.get("status") or {}).get("nodeInfo") or {}
    addr = {a["type"]: a["address"] for a in (n.get("status") or {}).get("addresses") or []}
    return [n["metadata"]["name"], s, ",".join(roles) or "<none>",
            age(n["metadata"].get("creationTimestamp")), info.get("kubeletVersion", ""),
            addr.get("InternalIP", "<none>"), addr.get("ExternalIP", "<none>"),
            info.get("osImage", ""), info.get("kernelVersion", ""),
            info.get("containerRuntimeVersion", "")]


def _containers_images(spec):
    cs = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _selector(spec):
    from .selectors import selector_string
    return selector_string(spec.get("selector") or {}) or "<none>"


def _deploy_row(d):
    spec, st = d.get("spec") or {}, d.get("status") or {}
    c, i = _containers_images(spec)
    return [d["metadata"]["name"], "%d/%d" % (st.get("readyReplicas", 0), spec.get("replicas", 0)),
            st.get("updatedReplicas", 0), st.get("availableReplicas", 0),
            age(d["metadata"].get("creationTimestamp")), c, i, _selector(spec)]


def _rs_row(r):
    spec, st = r.get("spec") or {}, r.get("status") or {}
    c, i = _containers_images(spec)
    return [r["metadata"]["name"], spec.get("replicas", 0), st.get("replicas", 0),
            st.get("readyReplicas", 0), age(r["metadata"].get("creationTimestamp")), c, i,
            _selector(spec)]


def _sts_row(s):
    spec, st = s.get("spec") or {}, s.get("status") or {}
    c, i = _containers_images(spec)
    return [s["metadata"]["name"], "%d/%d" % (st.get("readyReplicas", 0), spec.get("replicas", 0)),
            age(s["metadata"].get("creationTimestamp")), c, i]


def _ds_row(d):
    spec, st = d.get("spec") or {}, d.get("status") or {}
    c, i = _containers_images(spec)
    ns = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    return [d["metadata"]["name"], st.get("desiredNumberScheduled", 0),
            st.get("currentNumberScheduled", 0), st.get("numberReady", 0),
            st.get("updatedNumberScheduled", 0), st.get("numberAvailable", 0),
            ",".join("%s=%s" % kv for kv in ns.items()) or "<none>",
            age(d["metadata"].get("creationTimestamp")), c, i, _selector(spec)]


def _job_row(j):
    spec, st = j.get("spec") or {}, j.get("status") or {}
    c, i = _containers_images(spec)
    conds = {x["type"]: x["status"] for x in st.get("conditions") or []}
    if conds.get("Complete") == "True":
        status = "Complete"
    elif conds.get("Failed") == "True":
        status = "Failed"
    elif conds.get("FailureTarget") == "True" or conds.get("SuccessCriteriaMet") == "True":
        status = "Terminating"
    elif spec.get("suspend"):
        status = "Suspended"
    else:
        status = "Running"
    comp = spec.get("completions")
    completions = "%d/%s" % (st.get("succeeded", 0), comp if comp is not None else "1 of %d" %
                             spec.get("parallelism", 1))
    dur = ""
    if st.get("startTime"):
        end = parse_time(st.get("completionTime")) or now()
        dur = human_duration((end - parse_time(st["startTime"])).total_seconds())
    return [j["metadata"]["name"], status, completions, dur,
            age(j["metadata"].get("creationTimestamp")), c, i, _selector(spec)]


def _pdb_row(p):
    spec, st = p.get("spec") or {}, p.get("status") or {}
    return [p["metadata"]["name"], str(spec["minAvailable"]) if "minAvailable" in spec else "N/A",
            str(spec["maxUnavailable"]) if "maxUnavailable" in spec else "N/A",
            st.get("disruptionsAllowed", 0), age(p["metadata"].get("creationTimestamp"))]


def _event_row(e):
    io = e.get("involvedObject") or {}
    last = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
    return [age(last), e.get("type", ""), e.get("reason", ""),
            "%s/%s" % ((io.get("kind") or "").lower(), io.get("name", "")),
            e.get("message", "")]


def _svc_row(s):
    spec = s.get("spec") or {}
    ports = ",".join("%s/%s" % (p.get("port"), p.get("protocol", "TCP"))
                     for p in spec.get("ports") or [])
    return [s["metadata"]["name"], spec.get("type", ""), spec.get("clusterIP") or "<none>",
            "<none>", ports or "<none>", age(s["metadata"].get("creationTimestamp")),
            ",".join("%s=%s" % kv for kv in (spec.get("selector") or {}).items()) or "<none>"]


def _default_row(o):
    return [o["metadata"]["name"], age(o["metadata"].get("creationTimestamp"))]


NAME = _col("Name", fmt="name", desc="Name must be unique within a namespace.")
AGE = _col("Age", desc="CreationTimestamp is a timestamp representing the server time when "
           "this object was created.")

COLUMNS = {
    "Pod": ([NAME, _col("Ready"), _col("Status"), _col("Restarts"), AGE, _col("IP", priority=1),
             _col("Node", priority=1), _col("Nominated Node", priority=1),
             _col("Readiness Gates", priority=1)], _pod_row),
    "Node": ([NAME, _col("Status"), _col("Roles"), AGE, _col("Version"),
              _col("Internal-IP", priority=1), _col("External-IP", priority=1),
              _col("OS-Image", priority=1), _col("Kernel-Version", priority=1),
              _col("Container-Runtime", priority=1)], _node_row),
    "Namespace": ([NAME, _col("Status"), AGE],
                  lambda n: [n["metadata"]["name"], (n.get("status") or {}).get("phase", ""),
                             age(n["metadata"].get("creationTimestamp"))]),
    "Deployment": ([NAME, _col("Ready"), _col("Up-to-date", "integer"),
                    _col("Available", "integer"), AGE, _col("Containers", priority=1),
                    _col("Images", priority=1), _col("Selector", priority=1)], _deploy_row),
    "ReplicaSet": ([NAME, _col("Desired", "integer"), _col("Current", "integer"),
                    _col("Ready", "integer"), AGE, _col("Containers", priority=1),
                    _col("Images", priority=1), _col("Selector", priority=1)], _rs_row),
    "StatefulSet": ([NAME, _col("Ready"), AGE, _col("Containers", priority=1),
                     _col("Images", priority=1)], _sts_row),
    "DaemonSet": ([NAME, _col("Desired", "integer"), _col("Current", "integer"),
                   _col("Ready", "integer"), _col("Up-to-date", "integer"),
                   _col("Available", "integer"), _col("Node Selector"), AGE,
                   _col("Containers", priority=1), _col("Images", priority=1),
                   _col("Selector", priority=1)], _ds_row),
    "Job": ([NAME, _col("Status"), _col("Completions"), _col("Duration"), AGE,
             _col("Containers", priority=1), _col("Images", priority=1),
             _col("Selector", priority=1)], _job_row),
    "PodDisruptionBudget": ([NAME, _col("Min Available"), _col("Max Unavailable"),
                             _col("Allowed Disruptions", "integer"), AGE], _pdb_row),
    "Secret": ([NAME, _col("Type"), _col("Data", "integer"), AGE],
               lambda s: [s["metadata"]["name"], s.get("type", ""), len(s.get("data") or {}),
                          age(s["metadata"].get("creationTimestamp"))]),
    "ConfigMap": ([NAME, _col("Data", "integer"), AGE],
                  lambda s: [s["metadata"]["name"], len(s.get("data") or {}),
                             age(s["metadata"].get("creationTimestamp"))]),
    "Event": ([_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")],
              _event_row),
    "Service": ([NAME, _col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"),
                 AGE, _col("Selector", priority=1)], _svc_row),
}


def partial_metadata(obj):
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {}}


def table(res, objs, rv, include_object="Metadata"):
    cols, row = COLUMNS.get(res.kind, ([NAME, AGE], _default_row))
    rows = []
    for o in objs:
        r = {"cells": row(o)}
        if include_object == "Object":
            r["object"] = o
        elif include_object != "None":
            r["object"] = partial_metadata(o)
        rows.append(r)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": cols, "rows": rows}


def wants_table(accept):
    return bool(accept) and "as=Table" in accept
