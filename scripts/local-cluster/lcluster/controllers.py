"""The controllers and the scheduler, level-triggered: after any change in
the store (debounced) and once a second, every controller looks at the
whole state and writes only what differs from what it wants. With the few
dozen objects a test makes, a full pass costs well under a millisecond per
object, and level-triggering is what makes them converge whatever the order
of events.

Controllers: Namespace (termination), garbage collector (ownerReferences,
foreground and orphan deletion, cluster-scoped owners such as a Node),
scheduler (taints, node affinity, pod anti-affinity), node taints for
cordoned nodes, taint-based eviction (NoExecute), Deployment, ReplicaSet,
StatefulSet, DaemonSet, Job (with the job-tracking finalizer, backoffLimit,
activeDeadlineSeconds, ttlSecondsAfterFinished, suspend),
PodDisruptionBudget status, ServiceAccount "default" per namespace.
"""

import asyncio
import copy
import hashlib
import json
import logging
import math
import time

from . import errors
from . import resources as R
from .registry import is_pod_ready, set_condition
from .selectors import selector_object_to_reqs, labels_match

log = logging.getLogger("controllers")

JOB_TRACKING = "batch.kubernetes.io/job-tracking"
CREATE_RETRY = 5.0  # seconds between attempts after a failed pod creation
QUIET = {R.EVENTS.key, R.LEASES.key}


def _ref(obj, controller=True):
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": controller,
            "blockOwnerDeletion": True}


def controller_of(obj):
    for r in obj["metadata"].get("ownerReferences") or []:
        if r.get("controller"):
            return r
    return None


def _owned_by(obj, owner):
    c = controller_of(obj)
    return c is not None and c.get("uid") == owner["metadata"]["uid"]


def _terminal(pod):
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _deleting(obj):
    return bool(obj["metadata"].get("deletionTimestamp"))


def _active(pod):
    return not _terminal(pod) and not _deleting(pod)


def template_hash(template):
    h = hashlib.sha256(json.dumps(_pruned(template), sort_keys=True).encode()).digest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int.from_bytes(h[:8], "big")
    out = ""
    for _ in range(10):
        out += alphabet[n % len(alphabet)]
        n //= len(alphabet)
    return out


def _int_or_percent(v, total, round_up):
    if v is None:
        return 0
    if isinstance(v, str) and v.endswith("%"):
        x = float(v[:-1]) * total / 100.0
        return int(math.ceil(x)) if round_up else int(math.floor(x))
    return int(v)


def _available(pod, min_ready):
    if not is_pod_ready(pod) or _deleting(pod):
        return False
    if not min_ready:
        return True
    for c in pod["status"].get("conditions") or []:
        if c["type"] == "Ready":
            t = errors.parse_time(c.get("lastTransitionTime"))
            return t is not None and (errors.now() - t).total_seconds() >= min_ready
    return False


def tolerates(tolerations, taint):
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if op == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _match_node_selector_term(term, node):
    labels = node["metadata"].get("labels") or {}
    for e in term.get("matchExpressions") or []:
        op = e.get("operator")
        v = labels.get(e.get("key"))
        vals = e.get("values") or []
        if op == "In" and v not in vals:
            return False
        if op == "NotIn" and v in vals:
            return False
        if op == "Exists" and e.get("key") not in labels:
            return False
        if op == "DoesNotExist" and e.get("key") in labels:
            return False
        if op in ("Gt", "Lt"):
            try:
                if v is None or (op == "Gt" and not int(v) > int(vals[0])) or \
                        (op == "Lt" and not int(v) < int(vals[0])):
                    return False
            except ValueError:
                return False
    for e in term.get("matchFields") or []:
        if e.get("key") == "metadata.name":
            name = node["metadata"]["name"]
            if (e.get("operator") == "In") != (name in (e.get("values") or [])):
                return False
    return True


def node_fits_selector(pod_spec, node):
    labels = node["metadata"].get("labels") or {}
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    req = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = req.get("nodeSelectorTerms") or []
    if terms and not any(_match_node_selector_term(t, node) for t in terms):
        return False
    return True


def node_ready(node):
    for c in (node.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return c["status"] == "True"
    return False


class ControllerManager:
    def __init__(self, store, registry):
        self.store = store
        self.reg = registry
        self.dirty = asyncio.Event()
        self.retry_at = {}      # owner uid -> monotonic time of the next create attempt
        self.job_failed_at = {}  # job uid -> monotonic time of the last pod failure
        self.sched_msgs = {}    # pod uid -> last FailedScheduling message
        store.listeners.append(self._changed)

    def _changed(self, res, etype, obj, old):
        if res.key not in QUIET:
            self.dirty.set()

    async def run(self):
        while True:
            try:
                await asyncio.wait_for(self.dirty.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(0.02)
            self.dirty.clear()
            for step in (self.namespaces, self.garbage_collector, self.node_taints,
                         self.taint_eviction, self.deployments, self.replicasets, self.statefulsets, self.daemonsets,
                         self.jobs, self.scheduler, self.pdbs, self.service_accounts,
                         self.expire_events):
                try:
                    step()
                except errors.ApiError as e:
                    if e.code != 409:
                        log.warning("%s: %s", step.__name__, e.message)
                except Exception:
                    log.exception("%s failed", step.__name__)

    # -- helpers -------------------------------------------------------------------------
    def _pods(self, ns=None):
        return self.store.list(R.PODS, ns)

    def _update(self, res, obj, status=False):
        try:
            return self.reg.update(res, obj["metadata"].get("namespace", ""),
                                   obj["metadata"]["name"], obj,
                                   "status" if status else "")[0]
        except errors.ApiError as e:
            if e.code in (404, 409):
                return None
            raise

    def _set_status(self, res, obj, status):
        if obj.get("status") == status:
            return
        new = copy.deepcopy(obj)
        new["status"] = status
        new["metadata"].pop("resourceVersion", None)
        self._update(res, new, status=True)

    def _delete(self, res, obj, **opts):
        try:
            self.reg.delete(res, obj["metadata"].get("namespace", ""), obj["metadata"]["name"],
                            opts or None)
        except errors.ApiError as e:
            if e.code not in (404, 409):
                raise

    def _create_pod(self, owner, template, name=None, extra_labels=None, finalizers=None,
                    spec_patch=None):
        """Creates a pod from a template; on failure records a FailedCreate
        event on the owner and returns None (creation is retried after
        CREATE_RETRY seconds)."""
        uid = owner["metadata"]["uid"]
        if time.monotonic() < self.retry_at.get(uid, 0):
            return None
        tmeta = copy.deepcopy(template.get("metadata") or {})
        md = {"labels": dict(tmeta.get("labels") or {}, **(extra_labels or {})),
              "ownerReferences": [_ref(owner)]}
        if tmeta.get("annotations"):
            md["annotations"] = tmeta["annotations"]
        if name:
            md["name"] = name
        else:
            md["generateName"] = owner["metadata"]["name"] + "-"
        if finalizers:
            md["finalizers"] = finalizers
        spec = copy.deepcopy(template.get("spec") or {})
        if spec_patch:
            spec_patch(spec)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}
        try:
            created, _ = self.reg.create(R.PODS, owner["metadata"]["namespace"], pod)
        except errors.ApiError as e:
            self.retry_at[uid] = time.monotonic() + CREATE_RETRY
            self.reg.event(owner, "Warning", "FailedCreate", "Error creating: " + e.message,
                           _component(owner))
            self._note_failure(owner, e.message)
            return None
        self.retry_at.pop(uid, None)
        self.reg.event(owner, "Normal", "SuccessfulCreate",
                       "Created pod: " + created["metadata"]["name"], _component(owner))
        return created

    def _note_failure(self, owner, message):
        if owner["kind"] != "ReplicaSet":
            return
        st = copy.deepcopy(owner.get("status") or {})
        set_condition(st, "ReplicaFailure", "True", "FailedCreate", message)
        cur = self.store.get(R.REPLICASETS, owner["metadata"]["namespace"],
                             owner["metadata"]["name"], copy_=False)
        if cur is not None:
            self._set_status(R.REPLICASETS, cur, st)

    # -- namespaces ----------------------------------------------------------------------
    def namespaces(self):
        for ns in self.store.list(R.NAMESPACES):
            if not _deleting(ns):
                continue
            name = ns["metadata"]["name"]
            left = 0
            for res in R.RESOURCES:
                if not res.namespaced or not res.stored:
                    continue
                for o in list(self.store.list(res, name)):
                    left += 1
                    if _deleting(o) and not (res.kind == "Pod" and not o["spec"].get("nodeName")):
                        self._drop_finalizers_if_stuck(res, o)
                        continue
                    self._delete(res, o, propagationPolicy="Background")
            if left == 0:
                self.store.delete(R.NAMESPACES, "", name)

    def _drop_finalizers_if_stuck(self, res, o):
        if res.kind == "Pod" and o["metadata"].get("finalizers") and (
                _terminal(o) or not o["spec"].get("nodeName")):
            new = copy.deepcopy(o)
            new["metadata"]["finalizers"] = []
            new["metadata"].pop("resourceVersion", None)
            self._update(res, new)

    def service_accounts(self):
        for ns in self.store.list(R.NAMESPACES):
            if _deleting(ns):
                continue
            name = ns["metadata"]["name"]
            if self.store.get(R.SERVICEACCOUNTS, name, "default", copy_=False) is None:
                try:
                    self.reg.create(R.SERVICEACCOUNTS, name, {"metadata": {"name": "default"}})
                except errors.ApiError:
                    pass

    def expire_events(self):
        """Events live an hour after their last occurrence (the API
        server's --event-ttl)."""
        now = time.monotonic()
        if now < getattr(self, "_events_checked", 0) + 60:
            return
        self._events_checked = now
        for e in list(self.store.list(R.EVENTS)):
            t = errors.parse_time(e.get("lastTimestamp") or e["metadata"].get(
                "creationTimestamp"))
            if t is not None and (errors.now() - t).total_seconds() > 3600:
                self._delete(R.EVENTS, e)

    # -- garbage collector ------------------------------------------------------------------
    def _owner_exists(self, dep, ref):
        res = R.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
        if res is None:
            return True  # an owner kind this server does not know: leave it alone
        ns = dep["metadata"].get("namespace", "") if res.namespaced else ""
        o = self.store.get(res, ns, ref.get("name"), copy_=False)
        return o is not None and o["metadata"]["uid"] == ref.get("uid")

    def garbage_collector(self):
        objs = []
        for res in R.RESOURCES:
            if res.stored and res.key not in QUIET:
                objs.extend((res, o) for o in self.store.list(res))
        by_owner = {}
        for res, o in objs:
            for ref in o["metadata"].get("ownerReferences") or []:
                by_owner.setdefault(ref.get("uid"), []).append((res, o))
        for res, o in objs:
            md = o["metadata"]
            fins = md.get("finalizers") or []
            if _deleting(o) and "foregroundDeletion" in fins:
                deps = by_owner.get(md["uid"], [])
                if deps:
                    for dres, d in deps:
                        if not _deleting(d):
                            self._delete(dres, d, propagationPolicy="Foreground")
                else:
                    self._remove_finalizer(res, o, "foregroundDeletion")
            if _deleting(o) and "orphan" in fins:
                for dres, d in by_owner.get(md["uid"], []):
                    new = copy.deepcopy(d)
                    new["metadata"]["ownerReferences"] = [
                        r for r in d["metadata"].get("ownerReferences") or []
                        if r.get("uid") != md["uid"]]
                    new["metadata"].pop("resourceVersion", None)
                    self._update(dres, new)
                self._remove_finalizer(res, o, "orphan")
        for res, o in objs:
            refs = o["metadata"].get("ownerReferences") or []
            if not refs or _deleting(o):
                continue
            if not any(self._owner_exists(o, r) for r in refs):
                self._delete(res, o, propagationPolicy="Background")

    def _remove_finalizer(self, res, o, fin):
        cur = self.store.get(res, o["metadata"].get("namespace", ""), o["metadata"]["name"])
        if cur is None:
            return
        cur["metadata"]["finalizers"] = [f for f in cur["metadata"].get("finalizers") or []
                                         if f != fin]
        cur["metadata"].pop("resourceVersion", None)
        self._update(res, cur)

    # -- nodes and scheduling -------------------------------------------------------------------
    def node_taints(self):
        taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        for n in self.store.list(R.NODES):
            taints = (n.get("spec") or {}).get("taints") or []
            has = any(t.get("key") == taint["key"] for t in taints)
            want = bool((n.get("spec") or {}).get("unschedulable"))
            if has == want:
                continue
            new = copy.deepcopy(n)
            if want:
                new["spec"]["taints"] = taints + [dict(taint, timeAdded=errors.rfc3339())]
            else:
                new["spec"]["taints"] = [t for t in taints if t.get("key") != taint["key"]]
                if not new["spec"]["taints"]:
                    del new["spec"]["taints"]
            new["metadata"].pop("resourceVersion", None)
            self._update(R.NODES, new)

    def taint_eviction(self):
        """The taint manager: a pod on a node with a NoExecute taint it does
        not tolerate is deleted at once; one it tolerates for
        tolerationSeconds is deleted that long after the taint's timeAdded.
        For each taint the first matching toleration counts, as in
        Kubernetes. Deletion is graceful: on a node whose kubelet is gone
        the pod stays Terminating until it comes back."""
        now = time.time()
        nodes = {n["metadata"]["name"]: n for n in self.store.list(R.NODES)}
        for pod in self._pods():
            node = nodes.get(pod["spec"].get("nodeName"))
            if node is None or _deleting(pod) or _terminal(pod):
                continue
            due = None
            for taint in (node.get("spec") or {}).get("taints") or []:
                if taint.get("effect") != "NoExecute":
                    continue
                tol = next((t for t in pod["spec"].get("tolerations") or []
                            if tolerates([t], taint)), None)
                if tol is None:
                    due = now
                    break
                secs = tol.get("tolerationSeconds")
                if secs is None:
                    continue
                added = errors.parse_time(taint.get("timeAdded"))
                start = added.timestamp() if added is not None else now
                due = min(due if due is not None else math.inf, start + max(0, secs))
            if due is None or now < due:
                continue
            self.reg.event(pod, "Normal", "TaintManagerEviction",
                           "Marking for deletion Pod %s/%s" % (pod["metadata"]["namespace"],
                                                               pod["metadata"]["name"]),
                           "taint-eviction-controller")
            self._delete(R.PODS, pod)

    @staticmethod
    def _anti_affinity_terms(spec, kind):
        aa = (spec.get("affinity") or {}).get("podAntiAffinity") or {}
        if kind == "required":
            return [(1, t) for t in aa.get("requiredDuringSchedulingIgnoredDuringExecution") or []]
        return [(w.get("weight", 1), w.get("podAffinityTerm") or {})
                for w in aa.get("preferredDuringSchedulingIgnoredDuringExecution") or []]

    @staticmethod
    def _term_hits(term, pod_ns, node, placed, by_name):
        """Whether a pod matching the term's selector runs in the node's
        topology domain (its topologyKey label's value)."""
        key = term.get("topologyKey") or "kubernetes.io/hostname"
        value = (node["metadata"].get("labels") or {}).get(key)
        if value is None:
            return False
        reqs = selector_object_to_reqs(term.get("labelSelector"))
        if reqs is None:
            return False
        nss = term.get("namespaces") or [pod_ns]
        for ns, labels, node_name in placed:
            other = by_name.get(node_name)
            if other is None or ns not in nss:
                continue
            if (other["metadata"].get("labels") or {}).get(key) == value and \
                    labels_match(reqs, labels):
                return True
        return False

    def scheduler(self):
        nodes = self.store.list(R.NODES)
        by_name = {n["metadata"]["name"]: n for n in nodes}
        count = {}
        # Where pods run, for pod anti-affinity (those bound in this pass
        # added as they are).
        placed = []
        for p in self._pods():
            n = p["spec"].get("nodeName")
            if n and not _terminal(p):
                count[n] = count.get(n, 0) + 1
                placed.append((p["metadata"]["namespace"], p["metadata"].get("labels") or {}, n))
        for pod in self._pods():
            spec = pod["spec"]
            if spec.get("nodeName") or _deleting(pod) or \
                    spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            feasible, reasons = [], {}

            def no(reason):
                reasons[reason] = reasons.get(reason, 0) + 1
            for node in nodes:
                taints = list((node.get("spec") or {}).get("taints") or [])
                if not node_ready(node):
                    taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
                bad = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")
                       and not tolerates(spec.get("tolerations"), t)]
                if bad:
                    t = bad[0]
                    if t["key"] == "node.kubernetes.io/unschedulable":
                        no("node(s) were unschedulable")
                    else:
                        no("node(s) had untolerated taint {%s: %s}" % (t["key"],
                                                                        t.get("value", "")))
                    continue
                if not node_fits_selector(spec, node):
                    no("node(s) didn't match Pod's node affinity/selector")
                    continue
                if any(self._term_hits(t, pod["metadata"]["namespace"], node, placed, by_name)
                       for _, t in self._anti_affinity_terms(spec, "required")):
                    no("node(s) didn't match pod anti-affinity rules")
                    continue
                if count.get(node["metadata"]["name"], 0) >= 110:
                    no("Too many pods")
                    continue
                feasible.append(node)
            if feasible:
                preferred = self._anti_affinity_terms(spec, "preferred")

                def rank(n):
                    # Preferred anti-affinity first (the weight of the terms
                    # a node would break), then the emptier node.
                    broken = sum(w for w, t in preferred if self._term_hits(
                        t, pod["metadata"]["namespace"], n, placed, by_name))
                    return broken, count.get(n["metadata"]["name"], 0), n["metadata"]["name"]
                node = min(feasible, key=rank)
                name = node["metadata"]["name"]
                try:
                    self.reg.bind(pod["metadata"]["namespace"], pod["metadata"]["name"], name)
                except errors.ApiError:
                    continue
                count[name] = count.get(name, 0) + 1
                placed.append((pod["metadata"]["namespace"], pod["metadata"].get("labels") or {},
                               name))
                self.sched_msgs.pop(pod["metadata"]["uid"], None)
                self.reg.event(pod, "Normal", "Scheduled", "Successfully assigned %s/%s to %s" % (
                    pod["metadata"]["namespace"], pod["metadata"]["name"], name),
                    "default-scheduler")
                continue
            n = len(nodes)
            msg = "0/%d nodes are available: %s. preemption: 0/%d nodes are available: %d " \
                  "Preemption is not helpful for scheduling." % (
                      n, ", ".join("%d %s" % (c, r) for r, c in sorted(reasons.items())) or
                      "no nodes available to schedule pods", n, n)
            st = copy.deepcopy(pod.get("status") or {})
            set_condition(st, "PodScheduled", "False", "Unschedulable", msg, probe_time=True)
            self._set_status(R.PODS, pod, st)
            if self.sched_msgs.get(pod["metadata"]["uid"]) != msg:
                self.sched_msgs[pod["metadata"]["uid"]] = msg
                self.reg.event(pod, "Warning", "FailedScheduling", msg, "default-scheduler")

    # -- ReplicaSet ----------------------------------------------------------------------------
    def replicasets(self):
        for rs in self.store.list(R.REPLICASETS):
            if _deleting(rs):
                continue
            spec = rs["spec"]
            pods = [p for p in self._pods(rs["metadata"]["namespace"]) if _owned_by(p, rs)]
            active = [p for p in pods if _active(p)]
            want = spec.get("replicas", 1)
            if len(active) < want:
                for _ in range(want - len(active)):
                    if self._create_pod(rs, spec["template"]) is None:
                        break
            elif len(active) > want:
                for p in sorted(active, key=_deletion_rank)[:len(active) - want]:
                    self._delete(R.PODS, p)
            active = [p for p in self._pods(rs["metadata"]["namespace"])
                      if _owned_by(p, rs) and _active(p)]
            mrs = spec.get("minReadySeconds", 0)
            st = copy.deepcopy(rs.get("status") or {})
            st.update({"replicas": len(active), "fullyLabeledReplicas": len(active),
                       "readyReplicas": sum(1 for p in active if is_pod_ready(p)),
                       "availableReplicas": sum(1 for p in active if _available(p, mrs)),
                       "observedGeneration": rs["metadata"].get("generation", 1)})
            if st.get("conditions") and len(active) >= want:
                st["conditions"] = [c for c in st["conditions"] if c["type"] != "ReplicaFailure"]
                if not st["conditions"]:
                    del st["conditions"]
            for k in ("readyReplicas", "availableReplicas", "fullyLabeledReplicas"):
                if st[k] == 0:
                    del st[k]
            self._set_status(R.REPLICASETS, rs, st)

    # -- Deployment -----------------------------------------------------------------------------
    def deployments(self):
        for d in self.store.list(R.DEPLOYMENTS):
            if _deleting(d):
                continue
            self._deployment(d)

    def _deployment(self, d):
        ns = d["metadata"]["namespace"]
        spec = d["spec"]
        replicas = spec.get("replicas", 1)
        tmpl = spec["template"]
        h = template_hash(tmpl)
        rss = [r for r in self.store.list(R.REPLICASETS, ns) if _owned_by(r, d)]
        new = _new_rs(rss, tmpl)
        old = [r for r in rss if r is not new]
        revisions = [int((r["metadata"].get("annotations") or {}).get(
            "deployment.kubernetes.io/revision", "0")) for r in rss]
        if new is None:
            if spec.get("paused"):
                return
            labels = dict((tmpl.get("metadata") or {}).get("labels") or {}, **{
                "pod-template-hash": h})
            t = copy.deepcopy(tmpl)
            t.setdefault("metadata", {})["labels"] = labels
            sel = copy.deepcopy(spec["selector"])
            sel.setdefault("matchLabels", {})["pod-template-hash"] = h
            rev = max(revisions + [0]) + 1
            rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                  "metadata": {"name": "%s-%s" % (d["metadata"]["name"], h), "labels": labels,
                               "annotations": {"deployment.kubernetes.io/revision": str(rev),
                                               "deployment.kubernetes.io/desired-replicas":
                                                   str(replicas),
                                               "deployment.kubernetes.io/max-replicas":
                                                   str(replicas + self._surge(spec))},
                               "ownerReferences": [_ref(d)]},
                  "spec": {"replicas": 0, "selector": sel, "template": t,
                           "minReadySeconds": spec.get("minReadySeconds", 0)}}
            try:
                new, _ = self.reg.create(R.REPLICASETS, ns, rs)
            except errors.ApiError as e:
                self.reg.event(d, "Warning", "FailedCreate", e.message, "deployment-controller")
                return
            self.reg.event(d, "Normal", "ScalingReplicaSet", "Scaled up replica set %s from 0 "
                           "to %d" % (new["metadata"]["name"], replicas), "deployment-controller")
            self._set_annotation(d, "deployment.kubernetes.io/revision", str(
                max(revisions + [0]) + 1))
        else:
            rev = (new["metadata"].get("annotations") or {}).get(
                "deployment.kubernetes.io/revision")
            others = [int((r["metadata"].get("annotations") or {}).get(
                "deployment.kubernetes.io/revision", "0")) for r in old]
            if others and int(rev or 0) < max(others):
                # A rollback: the old ReplicaSet becomes the newest revision.
                rev = str(max(others) + 1)
                self._set_annotation(new, "deployment.kubernetes.io/revision", rev)
            if rev and (d["metadata"].get("annotations") or {}).get(
                    "deployment.kubernetes.io/revision") != rev:
                self._set_annotation(d, "deployment.kubernetes.io/revision", rev)
        if not spec.get("paused"):
            if spec["strategy"].get("type") == "Recreate":
                for r in old:
                    self._scale(r, 0)
                old_pods = [p for p in self._pods(ns) if any(_owned_by(p, r) for r in old)
                            and not _terminal(p)]
                if not old_pods:
                    self._scale(new, replicas)
            else:
                self._rolling(d, new, old, replicas)
        self._gc_history(d, new)
        self._deployment_status(d, replicas)

    def _surge(self, spec):
        ru = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        return _int_or_percent(ru.get("maxSurge", "25%"), spec.get("replicas", 1), True)

    def _rolling(self, d, new, old, replicas):
        spec = d["spec"]
        ru = spec["strategy"].get("rollingUpdate") or {}
        surge = _int_or_percent(ru.get("maxSurge", "25%"), replicas, True)
        unavail = _int_or_percent(ru.get("maxUnavailable", "25%"), replicas, False)
        if surge == 0 and unavail == 0:
            unavail = 1
        new = self.store.get(R.REPLICASETS, new["metadata"]["namespace"], new["metadata"]["name"],
                             copy_=False)
        if new is None:
            return
        old = [self.store.get(R.REPLICASETS, r["metadata"]["namespace"], r["metadata"]["name"],
                              copy_=False) for r in old]
        old = [r for r in old if r is not None]
        total = new["spec"]["replicas"] + sum(r["spec"]["replicas"] for r in old)
        cur = new["spec"]["replicas"]
        if cur < replicas:
            room = replicas + surge - total
            if room > 0:
                self._scale(new, min(replicas, cur + room))
        elif cur > replicas:
            self._scale(new, replicas)
        new = self.store.get(R.REPLICASETS, new["metadata"]["namespace"], new["metadata"]["name"],
                             copy_=False)
        all_count = new["spec"]["replicas"] + sum(r["spec"]["replicas"] for r in old)
        min_avail = replicas - unavail
        new_unavail = new["spec"]["replicas"] - (new.get("status") or {}).get(
            "availableReplicas", 0)
        budget = all_count - min_avail - new_unavail
        if budget <= 0:
            return
        for r in sorted(old, key=lambda r: r["metadata"]["creationTimestamp"]):
            if budget <= 0:
                break
            unhealthy = r["spec"]["replicas"] - (r.get("status") or {}).get("availableReplicas", 0)
            down = min(unhealthy, budget)
            if down > 0:
                self._scale(r, r["spec"]["replicas"] - down)
                budget -= down
        old = [self.store.get(R.REPLICASETS, r["metadata"]["namespace"], r["metadata"]["name"],
                              copy_=False) for r in old]
        old = [r for r in old if r is not None]
        all_count = new["spec"]["replicas"] + sum(r["spec"]["replicas"] for r in old)
        avail = (new.get("status") or {}).get("availableReplicas", 0) + sum(
            (r.get("status") or {}).get("availableReplicas", 0) for r in old)
        budget = avail - min_avail
        for r in sorted(old, key=lambda r: r["metadata"]["creationTimestamp"]):
            if budget <= 0:
                break
            down = min(r["spec"]["replicas"], budget)
            if down > 0:
                self._scale(r, r["spec"]["replicas"] - down)
                budget -= down

    def _scale(self, rs, n):
        if rs["spec"].get("replicas") == n:
            return
        new = copy.deepcopy(rs)
        before = new["spec"].get("replicas", 0)
        new["spec"]["replicas"] = n
        new["metadata"].pop("resourceVersion", None)
        if self._update(R.REPLICASETS, new) is not None:
            owner = controller_of(rs)
            if owner and owner.get("kind") == "Deployment":
                d = self.store.get(R.DEPLOYMENTS, rs["metadata"]["namespace"], owner["name"],
                                   copy_=False)
                if d is not None:
                    self.reg.event(d, "Normal", "ScalingReplicaSet", "Scaled %s replica set %s "
                                   "from %d to %d" % ("up" if n > before else "down",
                                                      rs["metadata"]["name"], before, n),
                                   "deployment-controller")

    def _set_annotation(self, obj, key, value):
        res = R.by_kind(obj["apiVersion"], obj["kind"])
        cur = self.store.get(res, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if cur is None or (cur["metadata"].get("annotations") or {}).get(key) == value:
            return
        cur["metadata"].setdefault("annotations", {})[key] = value
        cur["metadata"].pop("resourceVersion", None)
        self._update(res, cur)

    def _gc_history(self, d, new):
        limit = d["spec"].get("revisionHistoryLimit", 10)
        ns = d["metadata"]["namespace"]
        olds = [r for r in self.store.list(R.REPLICASETS, ns) if _owned_by(r, d)
                and (new is None or r["metadata"]["uid"] != new["metadata"]["uid"])
                and r["spec"].get("replicas", 0) == 0
                and (r.get("status") or {}).get("replicas", 0) == 0]
        olds.sort(key=lambda r: int((r["metadata"].get("annotations") or {}).get(
            "deployment.kubernetes.io/revision", "0")))
        for r in olds[:max(0, len(olds) - limit)]:
            self._delete(R.REPLICASETS, r, propagationPolicy="Background")

    def _deployment_status(self, d, replicas):
        d = self.store.get(R.DEPLOYMENTS, d["metadata"]["namespace"], d["metadata"]["name"],
                           copy_=False)
        if d is None:
            return
        spec = d["spec"]
        rss = [r for r in self.store.list(R.REPLICASETS, d["metadata"]["namespace"])
               if _owned_by(r, d)]
        new = _new_rs(rss, spec["template"])

        def s(r, k):
            return (r.get("status") or {}).get(k, 0)
        total = sum(s(r, "replicas") for r in rss)
        ready = sum(s(r, "readyReplicas") for r in rss)
        avail = sum(s(r, "availableReplicas") for r in rss)
        updated = s(new, "replicas") if new else 0
        ru = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        unavail_ok = _int_or_percent(ru.get("maxUnavailable", "25%"), replicas, False) \
            if spec["strategy"].get("type") != "Recreate" else 0
        st = copy.deepcopy(d.get("status") or {})
        st.update({"observedGeneration": d["metadata"].get("generation", 1), "replicas": total,
                   "updatedReplicas": updated, "readyReplicas": ready,
                   "availableReplicas": avail,
                   "unavailableReplicas": max(0, total - avail) if total else max(
                       0, replicas - avail)})
        for k in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas",
                  "unavailableReplicas"):
            if st[k] == 0:
                del st[k]
        if avail >= replicas - unavail_ok:
            set_condition(st, "Available", "True", "MinimumReplicasAvailable",
                          "Deployment has minimum availability.")
        else:
            set_condition(st, "Available", "False", "MinimumReplicasUnavailable",
                          "Deployment does not have minimum availability.")
        name = new["metadata"]["name"] if new else d["metadata"]["name"]
        done = new is not None and updated == replicas and total == replicas and \
            avail == replicas and s(new, "availableReplicas") == replicas
        before = d.get("status") or {}
        moved = any(before.get(k, 0) != st.get(k, 0) for k in (
            "replicas", "updatedReplicas", "readyReplicas", "availableReplicas"))
        now = errors.rfc3339()
        if done:
            if set_condition(st, "Progressing", "True", "NewReplicaSetAvailable",
                             'ReplicaSet "%s" has successfully progressed.' % name):
                _cond(st, "Progressing")["lastUpdateTime"] = now
        else:
            prog = _cond(st, "Progressing")
            stuck = prog is not None and prog.get("reason") == "ProgressDeadlineExceeded"
            if not stuck or moved:
                changed = set_condition(st, "Progressing", "True", "ReplicaSetUpdated",
                                        'ReplicaSet "%s" is progressing.' % name)
                p = _cond(st, "Progressing")
                if changed or moved or "lastUpdateTime" not in p:
                    p["lastUpdateTime"] = now
                else:
                    last = errors.parse_time(p["lastUpdateTime"])
                    if (errors.now() - last).total_seconds() > spec.get(
                            "progressDeadlineSeconds", 600):
                        set_condition(st, "Progressing", "False", "ProgressDeadlineExceeded",
                                      'ReplicaSet "%s" has timed out progressing.' % name)
                        p["lastUpdateTime"] = now
        for c in st["conditions"]:
            c.setdefault("lastUpdateTime", c["lastTransitionTime"])
        self._set_status(R.DEPLOYMENTS, d, st)

    # -- StatefulSet -----------------------------------------------------------------------------
    def statefulsets(self):
        for s in self.store.list(R.STATEFULSETS):
            if not _deleting(s):
                self._statefulset(s)

    def _revision(self, owner, template, kind_label):
        ns = owner["metadata"]["namespace"]
        h = template_hash(template)
        name = "%s-%s" % (owner["metadata"]["name"], h)
        if self.store.get(R.CONTROLLERREVISIONS, ns, name, copy_=False) is None:
            revs = [r for r in self.store.list(R.CONTROLLERREVISIONS, ns) if _owned_by(r, owner)]
            cr = {"apiVersion": "apps/v1", "kind": "ControllerRevision",
                  "metadata": {"name": name, "labels": dict(
                      (template.get("metadata") or {}).get("labels") or {},
                      **{kind_label: name}), "ownerReferences": [_ref(owner)]},
                  "data": {"spec": {"template": template}},
                  "revision": max([r.get("revision", 0) for r in revs] + [0]) + 1}
            try:
                self.reg.create(R.CONTROLLERREVISIONS, ns, cr)
            except errors.ApiError:
                pass
        return name

    def _statefulset(self, s):
        ns = s["metadata"]["namespace"]
        spec = s["spec"]
        name = s["metadata"]["name"]
        replicas = spec.get("replicas", 1)
        rev = self._revision(s, spec["template"], "controller.kubernetes.io/hash")
        pods = {}
        for p in self._pods(ns):
            if _owned_by(p, s):
                try:
                    pods[int(p["metadata"]["name"].rsplit("-", 1)[1])] = p
                except ValueError:
                    pass
        parallel = spec.get("podManagementPolicy") == "Parallel"

        def create(i):
            def patch(pspec):
                pspec.setdefault("hostname", "%s-%d" % (name, i))
                if spec.get("serviceName"):
                    pspec.setdefault("subdomain", spec["serviceName"])
            return self._create_pod(s, spec["template"], name="%s-%d" % (name, i), extra_labels={
                "controller-revision-hash": rev,
                "statefulset.kubernetes.io/pod-name": "%s-%d" % (name, i),
                "apps.kubernetes.io/pod-index": str(i)}, spec_patch=patch)

        for i in range(replicas):
            p = pods.get(i)
            if p is None:
                if create(i) is None or not parallel:
                    break
                continue
            if _deleting(p):
                if not parallel:
                    break
                continue
            if _terminal(p):
                self._delete(R.PODS, p)
                if not parallel:
                    break
                continue
            if not parallel and not (is_pod_ready(p) and p["status"].get("phase") == "Running"):
                break
        else:
            extra = sorted((i for i in pods if i >= replicas), reverse=True)
            for i in extra:
                if not _deleting(pods[i]):
                    self._delete(R.PODS, pods[i])
                if not parallel:
                    break
            if not extra and spec.get("updateStrategy", {}).get("type") != "OnDelete":
                partition = (spec["updateStrategy"].get("rollingUpdate") or {}).get(
                    "partition", 0)
                live = [pods[i] for i in range(replicas) if i in pods]
                if all(is_pod_ready(p) and not _deleting(p) for p in live):
                    for i in sorted((i for i in pods if partition <= i < replicas),
                                    reverse=True):
                        if (pods[i]["metadata"].get("labels") or {}).get(
                                "controller-revision-hash") != rev:
                            self._delete(R.PODS, pods[i])
                            break
        cur = [p for p in self._pods(ns) if _owned_by(p, s) and not _terminal(p)]
        updated = sum(1 for p in cur if (p["metadata"].get("labels") or {}).get(
            "controller-revision-hash") == rev)
        st = copy.deepcopy(s.get("status") or {})
        cur_rev = st.get("currentRevision") or rev
        if updated == len(cur) == replicas:
            cur_rev = rev
        st.update({"observedGeneration": s["metadata"].get("generation", 1),
                   "replicas": len(cur), "readyReplicas": sum(1 for p in cur if is_pod_ready(p)),
                   "availableReplicas": sum(1 for p in cur if _available(
                       p, spec.get("minReadySeconds", 0))),
                   "currentReplicas": sum(1 for p in cur if (p["metadata"].get("labels") or {})
                                          .get("controller-revision-hash") == cur_rev),
                   "updatedReplicas": updated, "currentRevision": cur_rev,
                   "updateRevision": rev, "collisionCount": 0})
        for k in ("readyReplicas", "availableReplicas", "currentReplicas", "updatedReplicas"):
            if st[k] == 0:
                del st[k]
        self._set_status(R.STATEFULSETS, s, st)

    # -- DaemonSet --------------------------------------------------------------------------------
    DS_TOLERATIONS = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists",
         "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists",
         "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
         "effect": "NoSchedule"},
    ]

    def daemonsets(self):
        for ds in self.store.list(R.DAEMONSETS):
            if not _deleting(ds):
                self._daemonset(ds)

    def _daemonset(self, ds):
        ns = ds["metadata"]["namespace"]
        spec = ds["spec"]
        rev = self._revision(ds, spec["template"], "controller-revision-hash")
        tspec = spec["template"].get("spec") or {}
        tols = list(tspec.get("tolerations") or []) + self.DS_TOLERATIONS
        pods = [p for p in self._pods(ns) if _owned_by(p, ds)]
        want_nodes = []
        for node in self.store.list(R.NODES):
            taints = (node.get("spec") or {}).get("taints") or []
            if any(t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tols, t)
                   for t in taints):
                continue
            if not node_fits_selector(tspec, node):
                continue
            want_nodes.append(node["metadata"]["name"])

        def node_of(p):
            if p["spec"].get("nodeName"):
                return p["spec"]["nodeName"]
            for term in ((((p["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
                    "requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
                    "nodeSelectorTerms") or []):
                for f in term.get("matchFields") or []:
                    if f.get("key") == "metadata.name" and f.get("values"):
                        return f["values"][0]
            return None

        by_node = {}
        for p in pods:
            if _terminal(p):
                self._delete(R.PODS, p)
                continue
            by_node.setdefault(node_of(p), []).append(p)
        for n in want_nodes:
            if not [p for p in by_node.get(n, []) if not _deleting(p)]:
                def patch(pspec, n=n):
                    pspec["tolerations"] = list(pspec.get("tolerations") or []) + [
                        t for t in self.DS_TOLERATIONS if t not in (pspec.get("tolerations") or [])]
                    aff = pspec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
                    aff["requiredDuringSchedulingIgnoredDuringExecution"] = {
                        "nodeSelectorTerms": [{"matchFields": [{
                            "key": "metadata.name", "operator": "In", "values": [n]}]}]}
                self._create_pod(ds, spec["template"], extra_labels={
                    "controller-revision-hash": rev, "pod-template-generation": str(
                        ds["metadata"].get("generation", 1))}, spec_patch=patch)
        for n, ps in by_node.items():
            if n not in want_nodes:
                for p in ps:
                    if not _deleting(p):
                        self._delete(R.PODS, p)
        live = [p for p in pods if not _terminal(p) and not _deleting(p)]
        if spec.get("updateStrategy", {}).get("type") != "OnDelete" and \
                all(is_pod_ready(p) for p in live):
            for p in live:
                if (p["metadata"].get("labels") or {}).get("controller-revision-hash") != rev:
                    self._delete(R.PODS, p)
                    break
        cur = [p for p in self._pods(ns) if _owned_by(p, ds) and not _terminal(p)]
        scheduled = [p for p in cur if node_of(p) in want_nodes]
        st = {"observedGeneration": ds["metadata"].get("generation", 1),
              "desiredNumberScheduled": len(want_nodes),
              "currentNumberScheduled": len({node_of(p) for p in scheduled}),
              "numberMisscheduled": len([p for p in cur if node_of(p) not in want_nodes]),
              "numberReady": sum(1 for p in scheduled if is_pod_ready(p)),
              "numberAvailable": sum(1 for p in scheduled if _available(
                  p, spec.get("minReadySeconds", 0))),
              "updatedNumberScheduled": sum(1 for p in scheduled if (
                  p["metadata"].get("labels") or {}).get("controller-revision-hash") == rev)}
        st["numberUnavailable"] = max(0, st["desiredNumberScheduled"] - st["numberAvailable"])
        for k in ("numberAvailable", "numberUnavailable", "updatedNumberScheduled"):
            if st[k] == 0:
                del st[k]
        self._set_status(R.DAEMONSETS, ds, st)

    # -- Job --------------------------------------------------------------------------------------
    def jobs(self):
        jobs = {j["metadata"]["uid"]: j for j in self.store.list(R.JOBS)}
        # Pods whose Job is gone keep no tracking finalizer.
        for p in self._pods():
            if JOB_TRACKING in (p["metadata"].get("finalizers") or []):
                c = controller_of(p)
                if c is None or c.get("uid") not in jobs:
                    self._remove_finalizer(R.PODS, p, JOB_TRACKING)
        for j in list(jobs.values()):
            self._job(j)

    def _job(self, j):
        ns = j["metadata"]["namespace"]
        spec = j["spec"]
        st = copy.deepcopy(j.get("status") or {})
        uid = j["metadata"]["uid"]
        pods = [p for p in self._pods(ns) if _owned_by(p, j)]
        # Count what finished, then release the pods.
        for p in pods:
            if JOB_TRACKING not in (p["metadata"].get("finalizers") or []):
                continue
            phase = (p.get("status") or {}).get("phase")
            # A pod being deleted (an eviction, a drain) counts as failed at
            # once, as the Job controller's isPodFailed() counts it: with
            # backoffLimit 0 the Job fails instead of replacing it while it
            # terminates (and then counting both).
            deleted = _deleting(p) and phase != "Succeeded"
            if phase in ("Succeeded", "Failed") or deleted:
                if phase == "Succeeded":
                    st["succeeded"] = st.get("succeeded", 0) + 1
                else:
                    st["failed"] = st.get("failed", 0) + 1
                    self.job_failed_at[uid] = time.monotonic()
                self._set_status(R.JOBS, j, st)
                j = self.store.get(R.JOBS, ns, j["metadata"]["name"], copy_=False)
                if j is None:
                    return
                st = copy.deepcopy(j.get("status") or {})
                self._remove_finalizer(R.PODS, p, JOB_TRACKING)
        if _deleting(j):
            return
        pods = [p for p in self._pods(ns) if _owned_by(p, j)]
        active = [p for p in pods if _active(p)]
        conds = {c["type"]: c for c in st.get("conditions") or []}
        finished = any(conds.get(t, {}).get("status") == "True" for t in ("Complete", "Failed"))
        if finished:
            for p in active:
                self._delete(R.PODS, p)
            self._job_ttl(j, st)
            return
        if not st.get("startTime") and not spec.get("suspend"):
            st["startTime"] = errors.rfc3339()
        if spec.get("suspend"):
            for p in active:
                self._delete(R.PODS, p)
            set_condition(st, "Suspended", "True", "JobSuspended", "Job suspended")
            st.pop("startTime", None)
            st["active"] = 0
            self._job_status(j, st, [])
            return
        if conds.get("Suspended", {}).get("status") == "True":
            set_condition(st, "Suspended", "False", "JobResumed", "Job resumed")
        completions = spec.get("completions")
        succeeded, failed = st.get("succeeded", 0), st.get("failed", 0)
        fail_reason = None
        if failed > spec.get("backoffLimit", 6):
            fail_reason = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        ads = spec.get("activeDeadlineSeconds")
        if ads is not None and st.get("startTime"):
            if (errors.now() - errors.parse_time(st["startTime"])).total_seconds() >= ads:
                fail_reason = ("DeadlineExceeded", "Job was active longer than specified deadline")
        if fail_reason:
            for p in active:
                self._delete(R.PODS, p)
            set_condition(st, "FailureTarget", "True", *fail_reason)
            set_condition(st, "Failed", "True", *fail_reason)
            self.reg.event(j, "Warning", fail_reason[0], fail_reason[1], "job-controller")
            self._job_status(j, st, [])
            return
        done = (completions is not None and succeeded >= completions) or (
            completions is None and succeeded > 0 and not active)
        if done:
            for p in active:
                self._delete(R.PODS, p)
            set_condition(st, "SuccessCriteriaMet", "True", "CompletionsReached",
                          "Reached expected number of succeeded pods")
            set_condition(st, "Complete", "True", "CompletionsReached",
                          "Reached expected number of succeeded pods")
            st["completionTime"] = errors.rfc3339()
            self.reg.event(j, "Normal", "Completed", "Job completed", "job-controller")
            self._job_status(j, st, [])
            return
        parallelism = spec.get("parallelism", 1)
        want = parallelism if completions is None else min(parallelism, completions - succeeded)
        if len(active) < want:
            delay = 0 if not failed else min(360.0, 10.0 * (2 ** (failed - 1)))
            if time.monotonic() >= self.job_failed_at.get(uid, 0) + delay:
                for _ in range(want - len(active)):
                    if self._create_pod(j, spec["template"], finalizers=[JOB_TRACKING]) is None:
                        break
        elif len(active) > want:
            for p in sorted(active, key=_deletion_rank)[:len(active) - want]:
                self._delete(R.PODS, p)
        active = [p for p in self._pods(ns) if _owned_by(p, j) and _active(p)]
        self._job_status(j, st, active)

    def _job_status(self, j, st, active):
        st["active"] = len(active)
        st["ready"] = sum(1 for p in active if is_pod_ready(p))
        st["terminating"] = sum(1 for p in self._pods(j["metadata"]["namespace"])
                                if _owned_by(p, j) and _deleting(p) and not _terminal(p))
        st.setdefault("uncountedTerminatedPods", {})
        if not st["active"]:
            del st["active"]
        cur = self.store.get(R.JOBS, j["metadata"]["namespace"], j["metadata"]["name"],
                             copy_=False)
        if cur is not None:
            self._set_status(R.JOBS, cur, st)

    def _job_ttl(self, j, st):
        ttl = j["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        end = st.get("completionTime")
        if not end:
            for c in st.get("conditions") or []:
                if c["type"] == "Failed" and c["status"] == "True":
                    end = c.get("lastTransitionTime")
        t = errors.parse_time(end)
        if t is not None and (errors.now() - t).total_seconds() >= ttl:
            self._delete(R.JOBS, j, propagationPolicy="Background")

    # -- PodDisruptionBudget ----------------------------------------------------------------------
    def pdbs(self):
        for pdb in self.store.list(R.PDBS):
            if _deleting(pdb):
                continue
            ns = pdb["metadata"]["namespace"]
            spec = pdb.get("spec") or {}
            reqs = selector_object_to_reqs(spec.get("selector"))
            pods = [p for p in self._pods(ns) if reqs is not None and
                    labels_match(reqs, p["metadata"].get("labels")) and not _terminal(p)]
            st = copy.deepcopy(pdb.get("status") or {})
            disrupted = {k: v for k, v in (st.get("disruptedPods") or {}).items()
                         if any(p["metadata"]["name"] == k and not _deleting(p) for p in pods)}
            live = [p for p in pods if not _deleting(p)]
            healthy = sum(1 for p in live if is_pod_ready(p)
                          and p["metadata"]["name"] not in disrupted)
            expected = self._expected_pods(ns, live)
            if "minAvailable" in spec:
                desired = _int_or_percent(spec["minAvailable"], expected, True)
            elif "maxUnavailable" in spec:
                desired = expected - _int_or_percent(spec["maxUnavailable"], expected, True)
            else:
                desired = expected
            allowed = max(0, healthy - desired)
            st.update({"observedGeneration": pdb["metadata"].get("generation", 1),
                       "currentHealthy": healthy, "desiredHealthy": max(0, desired),
                       "expectedPods": expected, "disruptionsAllowed": allowed})
            if disrupted:
                st["disruptedPods"] = disrupted
            else:
                st.pop("disruptedPods", None)
            if allowed > 0:
                set_condition(st, "DisruptionAllowed", "True", "SufficientPods", "")
            else:
                set_condition(st, "DisruptionAllowed", "False", "InsufficientPods", "")
            for c in st["conditions"]:
                c.setdefault("observedGeneration", st["observedGeneration"])
            self._set_status(R.PDBS, pdb, st)

    def _expected_pods(self, ns, pods):
        """How many pods the budget's controllers want (the scale of each
        distinct top-level controller), else how many pods there are."""
        seen, total = set(), 0
        for p in pods:
            c = controller_of(p)
            if c is None:
                total += 1
                continue
            if c["uid"] in seen:
                continue
            seen.add(c["uid"])
            owner = None
            if c["kind"] == "ReplicaSet":
                rs = self.store.get(R.REPLICASETS, ns, c["name"], copy_=False)
                if rs is not None:
                    top = controller_of(rs)
                    if top and top["kind"] == "Deployment":
                        if top["uid"] in seen:
                            continue
                        seen.add(top["uid"])
                        owner = self.store.get(R.DEPLOYMENTS, ns, top["name"], copy_=False)
                    else:
                        owner = rs
            elif c["kind"] == "StatefulSet":
                owner = self.store.get(R.STATEFULSETS, ns, c["name"], copy_=False)
            if owner is not None:
                total += owner["spec"].get("replicas", 1)
            else:
                total += sum(1 for q in pods if (controller_of(q) or {}).get("uid") == c["uid"])
        return total


def _pruned(o):
    """A copy without null values (semantic equality: null is unset)."""
    if isinstance(o, dict):
        return {k: _pruned(v) for k, v in o.items() if v is not None}
    if isinstance(o, list):
        return [_pruned(x) for x in o]
    return o


def _new_rs(rss, template):
    """The ReplicaSet whose pod template is the Deployment's, its
    pod-template-hash label aside (so that a rollback finds the old one)."""
    def strip(t):
        t = _pruned(t)
        (t.get("metadata") or {}).get("labels", {}).pop("pod-template-hash", None)
        return t
    want = strip(template)
    found = [r for r in rss if strip(r["spec"]["template"]) == want]
    return min(found, key=lambda r: r["metadata"]["creationTimestamp"]) if found else None


def _cond(status, ctype):
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), None)


def _component(owner):
    return {"ReplicaSet": "replicaset-controller", "Job": "job-controller",
            "StatefulSet": "statefulset-controller", "DaemonSet": "daemonset-controller"}.get(
        owner["kind"], "controller-manager")


def _deletion_rank(p):
    """Which pods a controller removes first when it has too many: not yet
    scheduled, then pending, then not ready, then the youngest."""
    st = p.get("status") or {}
    return (1 if p["spec"].get("nodeName") else 0,
            1 if st.get("phase") == "Running" else 0,
            1 if is_pod_ready(p) else 0,
            [-ord(ch) for ch in p["metadata"].get("creationTimestamp", "")])
