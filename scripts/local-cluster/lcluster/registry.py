"""The write path of the API: create, update, patch and delete with the
API's semantics (generateName, uid, generation, status and ephemeral
container subresources, optimistic concurrency, finalizers, graceful pod
deletion, propagation policies), and the operations behind subresources
(binding, eviction, scale). Used by the HTTP handlers and, without
authorization, by the controllers.

Call-order rule: everything here runs on the event loop thread and never
awaits, so a read followed by a write cannot interleave with another write.
"""

import copy
import datetime
import json

from . import admission
from . import errors
from . import patch as patchlib
from . import resources as R
from .selectors import selector_matches

ORPHAN_BY_DEFAULT = {"Job"}  # batch/v1's legacy default propagation policy


class Registry:
    def __init__(self, store):
        self.store = store

    # -- reads -------------------------------------------------------------------
    def get(self, res, ns, name):
        obj = self.store.get(res, ns if res.namespaced else "", name)
        if obj is None:
            raise errors.not_found(res, name)
        return obj

    def namespace_obj(self, ns):
        return self.store.get(R.NAMESPACES, "", ns, copy_=False)

    # -- create ---------------------------------------------------------------------
    def create(self, res, ns, obj, dry_run=False):
        """(created object, [warnings])"""
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        self._check_kind(res, obj)
        obj = copy.deepcopy(obj)
        md = obj.setdefault("metadata", {})
        if res.namespaced:
            if md.get("namespace") and md["namespace"] != ns:
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            md["namespace"] = ns
            nso = self.namespace_obj(ns)
            if nso is None:
                raise errors.not_found(R.NAMESPACES, ns)
            if nso["metadata"].get("deletionTimestamp") and res.kind != "Event":
                raise errors.forbidden(
                    '%s "%s" is forbidden: unable to create new content in namespace %s because '
                    "it is being terminated" % (res.plural, md.get("name", ""), ns), res,
                    md.get("name"), [{"reason": "NamespaceTerminating",
                                      "message": "namespace %s is being terminated" % ns,
                                      "field": "metadata.namespace"}])
        else:
            md.pop("namespace", None)
        if md.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        if not md.get("name") and md.get("generateName"):
            for _ in range(10):
                candidate = md["generateName"] + errors.random_suffix()
                if self.store.get(res, ns if res.namespaced else "", candidate,
                                  copy_=False) is None:
                    md["name"] = candidate
                    break
        md["uid"] = errors.new_uid()
        md["creationTimestamp"] = errors.rfc3339()
        md.pop("deletionTimestamp", None)
        md.pop("deletionGracePeriodSeconds", None)
        if res.kind not in ("Event", "Secret", "ConfigMap", "ServiceAccount", "Endpoints",
                            "ControllerRevision", "Lease") and res.group != R.RBAC:
            md["generation"] = 1
        if res.has_status and res.kind not in ("Node",):
            obj.pop("status", None)
        admission.defaults(res, obj)
        admission.validate(res, obj)
        warnings = self._pod_security(res, obj, ns)
        if dry_run:
            return obj, warnings
        return self.store.create(res, obj), warnings

    def _check_kind(self, res, obj):
        kind, av = obj.get("kind"), obj.get("apiVersion")
        if kind and kind != res.kind:
            raise errors.bad_request("the API version in the data (%s) does not match the "
                                     "expected API version (%s)" % (av, res.api_version)
                                     if av and av != res.api_version else
                                     "Object kind %s does not match the expected %s" % (
                                         kind, res.kind))
        if av and av != res.api_version:
            raise errors.bad_request("the API version in the data (%s) does not match the "
                                     "expected API version (%s)" % (av, res.api_version))
        obj["kind"] = res.kind
        obj["apiVersion"] = res.api_version

    def _pod_security(self, res, obj, ns):
        if not res.namespaced:
            return []
        if res.kind not in ("Pod",) + admission.WORKLOADS_WITH_TEMPLATE:
            return []
        denied, warnings = admission.pod_security(res, obj, self.namespace_obj(ns))
        if denied:
            raise errors.forbidden(denied, res, obj["metadata"].get("name"))
        return warnings

    # -- update -------------------------------------------------------------------------
    def update(self, res, ns, name, new, subresource="", dry_run=False):
        """(updated object, [warnings])"""
        ns = ns if res.namespaced else ""
        old = self.store.get(res, ns, name)
        if old is None:
            raise errors.not_found(res, name)
        if not isinstance(new, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        new = copy.deepcopy(new)
        self._check_kind(res, new)
        md = new.setdefault("metadata", {})
        if md.get("name") and md["name"] != name:
            raise errors.bad_request("the name of the object (%s) does not match the name on "
                                     "the URL (%s)" % (md["name"], name))
        if res.namespaced and md.get("namespace") and md["namespace"] != ns:
            raise errors.bad_request("the namespace of the provided object does not match the "
                                     "namespace sent on the request")
        expect_rv = md.get("resourceVersion") or None
        if subresource == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status") or {}
            new = merged
        elif subresource == "ephemeralcontainers":
            merged = copy.deepcopy(old)
            merged["spec"]["ephemeralContainers"] = (new.get("spec") or {}).get(
                "ephemeralContainers") or []
            new = merged
        elif subresource in ("", "finalize"):
            if res.has_status and res.kind != "Namespace":
                new["status"] = copy.deepcopy(old.get("status"))
                if new["status"] is None:
                    new.pop("status")
            if res.kind == "Namespace" and subresource == "":
                new["spec"] = copy.deepcopy(old.get("spec"))
                new["status"] = copy.deepcopy(old.get("status"))
            if res.kind == "Namespace" and subresource == "finalize":
                merged = copy.deepcopy(old)
                merged["spec"] = new.get("spec") or {}
                new = merged
        md = new["metadata"]
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "generation", "name", "namespace"):
            if k in old["metadata"]:
                md[k] = old["metadata"][k]
            else:
                md.pop(k, None)
        if old["metadata"].get("deletionTimestamp") and \
                set(md.get("finalizers") or []) - set(old["metadata"].get("finalizers") or []):
            raise errors.forbidden('%s "%s" is forbidden: no new finalizers can be added if the '
                                   "object is being deleted" % (res.plural, name), res, name)
        if "generation" in md and _spec_part(new) != _spec_part(old):
            md["generation"] = old["metadata"].get("generation", 1) + 1
        admission.defaults(res, new, old)
        admission.validate(res, new, old, subresource)
        warnings = []
        if res.kind == "Pod" and subresource == "ephemeralcontainers":
            warnings = self._pod_security(res, new, ns)
        elif res.kind in admission.WORKLOADS_WITH_TEMPLATE and subresource == "":
            warnings = self._pod_security(res, new, ns)
        if dry_run:
            return new, warnings
        # (A namespace goes when the namespace controller has emptied it.)
        if md.get("deletionTimestamp") and not md.get("finalizers") and \
                res.kind != "Namespace" and \
                (res.kind != "Pod" or md.get("deletionGracePeriodSeconds") == 0):
            # The last finalizer is gone: the object goes.
            self.store.update(res, new, expect_rv)
            return self.store.delete(res, ns, name), warnings
        return self.store.update(res, new, expect_rv), warnings

    # -- patch --------------------------------------------------------------------------
    def patch(self, res, ns, name, content_type, body, subresource="", dry_run=False):
        ns = ns if res.namespaced else ""
        old = self.store.get(res, ns, name)
        if old is None:
            raise errors.not_found(res, name)
        try:
            doc = json.loads(body) if body else None
        except ValueError as e:
            raise errors.bad_request("error decoding patch: %s" % e)
        ct = (content_type or "").split(";")[0].strip()
        base = old
        if subresource == "scale":
            base = self.scale_of(res, old)
        if ct == "application/json-patch+json":
            new = patchlib.json_patch(base, doc)
        elif ct == "application/merge-patch+json":
            new = patchlib.merge_patch(base, doc)
        elif ct == "application/strategic-merge-patch+json":
            new = patchlib.strategic_merge_patch(base, doc, res.kind)
        else:
            raise errors.ApiError(415, "UnsupportedMediaType",
                                  "the body of the request was in an unknown format - accepted "
                                  "media types include: application/json-patch+json, "
                                  "application/merge-patch+json, "
                                  "application/strategic-merge-patch+json")
        if not isinstance(new, dict):
            raise errors.bad_request("the patch does not produce an object")
        if subresource == "scale":
            return self.set_scale(res, ns, name, new, dry_run)
        # A patch without a resourceVersion applies to whatever is current.
        if (doc if isinstance(doc, dict) else {}).get("metadata", {}).get(
                "resourceVersion") is None and ct != "application/json-patch+json":
            new.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self.update(res, ns, name, new, subresource, dry_run)

    # -- delete -------------------------------------------------------------------------
    def delete(self, res, ns, name, options=None, dry_run=False):
        """(object, finished) where finished says it is gone from the store."""
        ns = ns if res.namespaced else ""
        options = options or {}
        obj = self.store.get(res, ns, name)
        if obj is None:
            raise errors.not_found(res, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise errors.conflict(res, name, "Precondition failed: UID in precondition: %s, UID "
                                  "in object meta: %s" % (pre["uid"], obj["metadata"]["uid"]))
        if pre.get("resourceVersion") and pre["resourceVersion"] != \
                obj["metadata"]["resourceVersion"]:
            raise errors.conflict(res, name, "Precondition failed: ResourceVersion in "
                                  "precondition: %s, ResourceVersion in object meta: %s" % (
                                      pre["resourceVersion"], obj["metadata"]["resourceVersion"]))
        if dry_run:
            return obj, False
        md = obj["metadata"]
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        if policy is None:
            policy = "Orphan" if res.kind in ORPHAN_BY_DEFAULT else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise errors.invalid(res, res.kind, name, [(
                "propagationPolicy", "FieldValueNotSupported", "",
                'propagationPolicy: Unsupported value: "%s": supported values: "Foreground", '
                '"Background", "Orphan", "nil"' % policy)])
        finalizers = list(md.get("finalizers") or [])
        if res.kind == "Namespace":
            if not md.get("deletionTimestamp"):
                md["deletionTimestamp"] = errors.rfc3339()
                obj.setdefault("status", {})["phase"] = "Terminating"
                return self.store.update(res, obj), False
            return obj, False
        if res.kind == "Pod":
            grace = options.get("gracePeriodSeconds")
            if grace is None:
                grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
            phase = (obj.get("status") or {}).get("phase")
            graceful = obj["spec"].get("nodeName") and phase not in ("Succeeded", "Failed") \
                and grace > 0
            if graceful:
                cur = md.get("deletionGracePeriodSeconds")
                if cur is not None and cur <= grace:
                    return obj, False  # already terminating, no shorter
                md["deletionTimestamp"] = errors.rfc3339(
                    errors.now() + datetime.timedelta(seconds=grace))
                md["deletionGracePeriodSeconds"] = grace
                self._add_policy_finalizer(md, policy, finalizers)
                return self.store.update(res, obj), False
            md["deletionGracePeriodSeconds"] = 0
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if policy == "Orphan" and "orphan" not in finalizers and self._has_dependents(obj):
            finalizers.append("orphan")
        if finalizers:
            md["finalizers"] = finalizers
            if not md.get("deletionTimestamp"):
                md["deletionTimestamp"] = errors.rfc3339()
                md.setdefault("deletionGracePeriodSeconds", 0)
            return self.store.update(res, obj), False
        return self.store.delete(res, ns, name), True

    def _add_policy_finalizer(self, md, policy, finalizers):
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if finalizers:
            md["finalizers"] = finalizers

    def _has_dependents(self, owner):
        uid = owner["metadata"]["uid"]
        for res in R.RESOURCES:
            if not res.stored:
                continue
            for o in self.store.list(res):
                for ref in o["metadata"].get("ownerReferences") or []:
                    if ref.get("uid") == uid:
                        return True
        return False

    # -- subresource operations -----------------------------------------------------------
    def bind(self, ns, name, node):
        pod = self.get(R.PODS, ns, name)
        if pod["spec"].get("nodeName"):
            raise errors.conflict(R.PODS, name, "pod %s is already assigned to node \"%s\"" % (
                name, pod["spec"]["nodeName"]))
        pod["spec"]["nodeName"] = node
        set_condition(pod.setdefault("status", {}), "PodScheduled", "True")
        return self.store.update(R.PODS, pod)

    def scale_of(self, res, obj):
        st = obj.get("status") or {}
        from .selectors import selector_string
        sel = (obj.get("spec") or {}).get("selector") or {}
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: obj["metadata"][k] for k in
                             ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in obj["metadata"]},
                "spec": {"replicas": obj["spec"].get("replicas", 0)},
                "status": {"replicas": st.get("replicas", 0),
                           "selector": selector_string(sel)}}

    def set_scale(self, res, ns, name, scale, dry_run=False):
        obj = self.get(res, ns, name)
        want = (scale.get("spec") or {}).get("replicas")
        if not isinstance(want, int) or want < 0:
            raise errors.invalid(res, "Scale", name, [(
                "spec.replicas", "FieldValueInvalid", "", "spec.replicas: Invalid value: %s: must "
                "be greater than or equal to 0" % want)])
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv and rv != obj["metadata"]["resourceVersion"]:
            raise errors.conflict(res, name, "the object has been modified; please apply your "
                                  "changes to the latest version and try again")
        obj["spec"]["replicas"] = want
        obj["metadata"].pop("resourceVersion", None)
        updated, w = self.update(res, ns, name, obj, dry_run=dry_run)
        return self.scale_of(res, updated), w

    def evict(self, ns, name, eviction):
        """Deletes the pod unless a PodDisruptionBudget forbids it (429)."""
        pod = self.get(R.PODS, ns, name)
        opts = (eviction or {}).get("deleteOptions") or {}
        if pod["metadata"].get("deletionTimestamp"):
            return self.delete(R.PODS, ns, name, opts)
        phase = (pod.get("status") or {}).get("phase")
        # Pods that are not running cost no availability: no budget applies.
        if phase in ("Succeeded", "Failed", "Pending"):
            return self.delete(R.PODS, ns, name, opts)
        pdbs = [p for p in self.store.list(R.PDBS, ns)
                if selector_matches((p.get("spec") or {}).get("selector"),
                                    pod["metadata"].get("labels"))]
        if not pdbs:
            return self.delete(R.PODS, ns, name, opts)
        if len(pdbs) > 1:
            raise errors.ApiError(500, "InternalError", "This pod has more than one "
                                  "PodDisruptionBudget, which the eviction subresource does not "
                                  "support.")
        pdb = copy.deepcopy(pdbs[0])
        st = pdb.get("status") or {}
        if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            raise too_many("Cannot evict pod as it would violate the pod's disruption budget.",
                           "DisruptionBudget", "The disruption budget %s is still being processed "
                           "by the server." % pdb["metadata"]["name"])
        if not is_pod_ready(pod):
            # unhealthyPodEvictionPolicy IfHealthyBudget (the default) or
            # AlwaysAllow: an unready pod goes while the budget is met.
            if (pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or
                    st.get("currentHealthy", 0) >= st.get("desiredHealthy", 0)):
                return self.delete(R.PODS, ns, name, opts)
        if st.get("disruptionsAllowed", 0) <= 0:
            raise too_many("Cannot evict pod as it would violate the pod's disruption budget.",
                           "DisruptionBudget", "The disruption budget %s needs %d healthy pods "
                           "and has %d currently" % (pdb["metadata"]["name"],
                                                     st.get("desiredHealthy", 0),
                                                     st.get("currentHealthy", 0)))
        st["disruptionsAllowed"] = st.get("disruptionsAllowed", 0) - 1
        st.setdefault("disruptedPods", {})[name] = errors.rfc3339()
        pdb["status"] = st
        self.store.update(R.PDBS, pdb)
        return self.delete(R.PODS, ns, name, opts)

    # -- events -------------------------------------------------------------------------------
    def event(self, obj, etype, reason, message, component, host=None):
        md = obj.get("metadata") or {}
        ns = md.get("namespace") or "default"
        if self.namespace_obj(ns) is None:
            return
        uid = md.get("uid", "")
        for e in self.store.list(R.EVENTS, ns):
            io = e.get("involvedObject") or {}
            if io.get("uid") == uid and e.get("reason") == reason and \
                    e.get("message") == message:
                e = copy.deepcopy(e)
                e["count"] = e.get("count", 1) + 1
                e["lastTimestamp"] = errors.rfc3339()
                self.store.update(R.EVENTS, e)
                return
        ev = {"apiVersion": "v1", "kind": "Event",
              "metadata": {"name": "%s.%s" % (md.get("name", "x"), errors.hex_id(16)),
                           "namespace": ns},
              "involvedObject": {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"),
                                 "namespace": md.get("namespace", ""), "name": md.get("name"),
                                 "uid": uid, "resourceVersion": md.get("resourceVersion", "")},
              "reason": reason, "message": message, "type": etype, "count": 1,
              "source": {"component": component, **({"host": host} if host else {})},
              "firstTimestamp": errors.rfc3339(), "lastTimestamp": errors.rfc3339(),
              "reportingComponent": component, "reportingInstance": host or ""}
        try:
            self.create(R.EVENTS, ns, ev)
        except errors.ApiError:
            pass


def too_many(message, cause_reason, cause_message):
    return errors.ApiError(429, "TooManyRequests", message, {
        "causes": [{"reason": cause_reason, "message": cause_message}]})


def _spec_part(obj):
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def set_condition(status, ctype, value, reason=None, message=None, probe_time=False):
    """Sets a condition, keeping lastTransitionTime unless the status changes.
    Returns whether anything changed."""
    conds = status.setdefault("conditions", [])
    for c in conds:
        if c.get("type") == ctype:
            changed = c.get("status") != value
            if changed:
                c["lastTransitionTime"] = errors.rfc3339()
            if reason is not None and c.get("reason") != reason:
                c["reason"] = reason
                changed = True
            if reason is None and "reason" in c and value == "True" and ctype in (
                    "Ready", "ContainersReady", "PodScheduled", "Initialized"):
                del c["reason"]
                changed = True
            if message is not None and c.get("message") != message:
                c["message"] = message
                changed = True
            if message is None and "message" in c and value == "True" and ctype in (
                    "Ready", "ContainersReady", "PodScheduled", "Initialized"):
                del c["message"]
                changed = True
            c["status"] = value
            return changed
    c = {"type": ctype, "status": value, "lastTransitionTime": errors.rfc3339()}
    if probe_time:
        c["lastProbeTime"] = None
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message
    conds.append(c)
    return True


def is_pod_ready(pod):
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False
