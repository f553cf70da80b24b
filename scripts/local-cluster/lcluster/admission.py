"""What happens to an object between the request and the store: defaults,
validation (422 Invalid with the API's field paths), and Pod Security
admission (the Pod Security Standards' baseline and restricted levels,
enforced from a namespace's pod-security.kubernetes.io/enforce label and
warned about from its warn label)."""

import base64
import copy
import re

from . import errors
from . import resources as R

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

WORKLOADS_WITH_TEMPLATE = ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job")


# -- defaults -------------------------------------------------------------------

def _image_pull_policy(image):
    ref = image.split("@")[0]
    last = ref.rsplit("/", 1)[-1]
    if "@" in image:
        return "IfNotPresent"
    if ":" not in last or last.endswith(":latest"):
        return "Always"
    return "IfNotPresent"


def _default_probe(p):
    if not p:
        return
    p.setdefault("timeoutSeconds", 1)
    p.setdefault("periodSeconds", 10)
    p.setdefault("successThreshold", 1)
    p.setdefault("failureThreshold", 3)
    if "httpGet" in p:
        p["httpGet"].setdefault("scheme", "HTTP")
        p["httpGet"].setdefault("path", "/")


def _default_container(c, ephemeral=False):
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if c.get("image"):
        c.setdefault("imagePullPolicy", _image_pull_policy(c["image"]))
    if not ephemeral:
        c.setdefault("resources", {})
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")
    for e in c.get("env") or []:
        fr = (e.get("valueFrom") or {}).get("fieldRef")
        if fr is not None:
            fr.setdefault("apiVersion", "v1")
    for k in ("readinessProbe", "livenessProbe", "startupProbe"):
        _default_probe(c.get(k))


def default_pod_spec(spec, top_level):
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    for c in spec.get("containers") or []:
        _default_container(c)
    for c in spec.get("initContainers") or []:
        _default_container(c)
    for c in spec.get("ephemeralContainers") or []:
        _default_container(c, ephemeral=True)
    for v in spec.get("volumes") or []:
        if "secret" in v:
            v["secret"].setdefault("defaultMode", 0o644)
        if "configMap" in v:
            v["configMap"].setdefault("defaultMode", 0o644)
        if "hostPath" in v:
            v["hostPath"].setdefault("type", "")
        if "downwardAPI" in v:
            v["downwardAPI"].setdefault("defaultMode", 0o644)
        if "projected" in v:
            v["projected"].setdefault("defaultMode", 0o644)
    if top_level:
        # The DefaultTolerationSeconds admission plugin's two tolerations.
        tols = spec.setdefault("tolerations", [])
        # A toleration with that key or none, of NoExecute or every
        # effect, already covers the taint (whatever its tolerationSeconds).
        for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(t.get("key") in (None, "", key) and t.get("effect") in (None, "", "NoExecute")
                       for t in tols):
                tols.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300})


def _qos(spec):
    reqs, lims = [], []
    for c in spec.get("containers") or []:
        r = c.get("resources") or {}
        reqs.append(r.get("requests") or {})
        lims.append(r.get("limits") or {})
    if all(not r and not l for r, l in zip(reqs, lims)):
        return "BestEffort"
    guaranteed = True
    for r, l in zip(reqs, lims):
        for res in ("cpu", "memory"):
            if res not in l or (res in r and r[res] != l[res]):
                guaranteed = False
    return "Guaranteed" if guaranteed else "Burstable"


def defaults(res, obj, old=None):
    kind = res.kind
    md = obj.setdefault("metadata", {})
    if kind == "Pod":
        spec = obj.setdefault("spec", {})
        default_pod_spec(spec, top_level=True)
        if old is None:
            st = obj.setdefault("status", {})
            st.setdefault("phase", "Pending")
            st.setdefault("qosClass", _qos(spec))
    elif kind in WORKLOADS_WITH_TEMPLATE:
        spec = obj.setdefault("spec", {})
        tmpl = spec.setdefault("template", {})
        tmpl.setdefault("metadata", {})
        default_pod_spec(tmpl.setdefault("spec", {}), top_level=False)
        if kind == "Deployment":
            spec.setdefault("replicas", 1)
            strat = spec.setdefault("strategy", {})
            strat.setdefault("type", "RollingUpdate")
            if strat["type"] == "RollingUpdate":
                ru = strat.setdefault("rollingUpdate", {})
                ru.setdefault("maxUnavailable", "25%")
                ru.setdefault("maxSurge", "25%")
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
        elif kind == "ReplicaSet":
            spec.setdefault("replicas", 1)
        elif kind == "StatefulSet":
            spec.setdefault("replicas", 1)
            spec.setdefault("podManagementPolicy", "OrderedReady")
            us = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
            if us.get("type") == "RollingUpdate":
                us.setdefault("rollingUpdate", {}).setdefault("partition", 0)
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("persistentVolumeClaimRetentionPolicy",
                            {"whenDeleted": "Retain", "whenScaled": "Retain"})
        elif kind == "DaemonSet":
            us = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
            if us.get("type") == "RollingUpdate":
                ru = us.setdefault("rollingUpdate", {})
                ru.setdefault("maxUnavailable", 1)
                ru.setdefault("maxSurge", 0)
            spec.setdefault("revisionHistoryLimit", 10)
        elif kind == "Job":
            if "completions" not in spec and "parallelism" not in spec:
                spec["completions"] = 1
            spec.setdefault("parallelism", 1)
            spec.setdefault("backoffLimit", 6)
            spec.setdefault("completionMode", "NonIndexed")
            spec.setdefault("suspend", False)
            spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
            if old is None and not spec.get("manualSelector"):
                uid = md["uid"]
                labels = tmpl["metadata"].setdefault("labels", {})
                labels["controller-uid"] = uid
                labels["batch.kubernetes.io/controller-uid"] = uid
                labels["job-name"] = md["name"]
                labels["batch.kubernetes.io/job-name"] = md["name"]
                spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
                md.setdefault("labels", {}).setdefault("controller-uid", uid)
                md["labels"].setdefault("batch.kubernetes.io/controller-uid", uid)
                md["labels"].setdefault("job-name", md["name"])
                md["labels"].setdefault("batch.kubernetes.io/job-name", md["name"])
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")
        md.setdefault("labels", {})["kubernetes.io/metadata.name"] = md.get("name", "")
    elif kind == "Secret":
        obj.setdefault("type", "Opaque")
        sd = obj.pop("stringData", None)
        if sd:
            data = obj.setdefault("data", {})
            for k, v in sd.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
    elif kind == "Service":
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            p.setdefault("targetPort", p.get("port"))
    elif kind == "PodDisruptionBudget":
        obj.setdefault("spec", {})
    return obj


# -- validation -----------------------------------------------------------------

def _req(field):
    return (field, "FieldValueRequired", "", "%s: Required value" % field)


def _bad(field, value, detail):
    return (field, "FieldValueInvalid", detail, "%s: Invalid value: %s: %s" % (
        field, _fmt(value), detail))


def _unsupported(field, value, allowed):
    return (field, "FieldValueNotSupported", "",
            "%s: Unsupported value: %s: supported values: %s" % (
                field, _fmt(value), ", ".join('"%s"' % a for a in allowed)))


def _forbidden(field, detail):
    return (field, "FieldValueForbidden", detail, "%s: Forbidden: %s" % (field, detail))


def _dup(field, value):
    return (field, "FieldValueDuplicate", "", "%s: Duplicate value: %s" % (field, _fmt(value)))


def _notfound(field, value):
    return (field, "FieldValueNotFound", "", "%s: Not found: %s" % (field, _fmt(value)))


def _fmt(v):
    """A value as the API's messages show it (Go's %#v)."""
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        if all(isinstance(x, str) for x in v.values()):
            return "map[string]string{%s}" % ", ".join(
                '"%s":"%s"' % kv for kv in sorted(v.items()))
        return "map[string]interface {}{%s}" % ", ".join(
            '"%s":%s' % (k, _fmt(x)) for k, x in sorted(v.items()))
    if isinstance(v, list):
        return "[]string{%s}" % ", ".join(_fmt(x) for x in v)
    if v is None:
        return "null"
    return str(v)


def _validate_meta(res, md, causes):
    name = md.get("name")
    if not name:
        causes.append(_req("metadata.name"))
    else:
        pat = DNS_LABEL if res.kind in ("Namespace", "Service") else DNS_SUBDOMAIN
        limit = 63 if pat is DNS_LABEL else 253
        if res.group == R.RBAC:
            pat, limit = re.compile(r"^[^/%]+$"), 1000
        if not pat.match(name) or len(name) > limit:
            detail = ("a lowercase RFC 1123 label must consist of lower case alphanumeric "
                      "characters or '-', and must start and end with an alphanumeric character"
                      if pat is DNS_LABEL else
                      "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                      "characters, '-' or '.', and must start and end with an alphanumeric "
                      "character")
            causes.append(_bad("metadata.name", name, detail))
    for k, v in (md.get("labels") or {}).items():
        key_name = k.rsplit("/", 1)[-1]
        if not LABEL_NAME.match(key_name) or len(key_name) > 63:
            causes.append(_bad("metadata.labels", k, "name part must consist of alphanumeric "
                               "characters, '-', '_' or '.'"))
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            causes.append(_bad("metadata.labels", v, "a valid label must be an empty string or "
                               "consist of alphanumeric characters, '-', '_' or '.', and must "
                               "start and end with an alphanumeric character"))


def _validate_containers(lst, field, causes, names, ephemeral=False, volumes=()):
    for i, c in enumerate(lst or []):
        f = "%s[%d]" % (field, i)
        n = c.get("name")
        if not n:
            causes.append(_req(f + ".name"))
        elif not DNS_LABEL.match(n):
            causes.append(_bad(f + ".name", n, "a lowercase RFC 1123 label must consist of lower "
                               "case alphanumeric characters or '-'"))
        elif n in names:
            causes.append(_dup(f + ".name", n))
        else:
            names.add(n)
        if not c.get("image"):
            causes.append(_req(f + ".image"))
        for j, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") not in volumes:
                causes.append(_notfound("%s.volumeMounts[%d].name" % (f, j), m.get("name")))
            if not m.get("mountPath"):
                causes.append(_req("%s.volumeMounts[%d].mountPath" % (f, j)))
        if ephemeral:
            for k in ("ports", "readinessProbe", "livenessProbe", "startupProbe", "lifecycle"):
                if c.get(k):
                    causes.append(_forbidden(f + "." + k, "cannot be set for an Ephemeral "
                                             "Container"))
            if (c.get("resources") or {}):
                causes.append(_forbidden(f + ".resources", "cannot be set for an Ephemeral "
                                         "Container"))
        for j, p in enumerate(c.get("ports") or []):
            cp = p.get("containerPort")
            if not isinstance(cp, int) or not 0 < cp < 65536:
                causes.append(_bad("%s.ports[%d].containerPort" % (f, j), cp,
                                   "must be between 1 and 65535, inclusive"))


def validate_pod_spec(spec, field, causes, allowed_restart=("Always", "OnFailure", "Never")):
    vols = set()
    for i, v in enumerate(spec.get("volumes") or []):
        n = v.get("name")
        if not n:
            causes.append(_req("%s.volumes[%d].name" % (field, i)))
        elif n in vols:
            causes.append(_dup("%s.volumes[%d].name" % (field, i), n))
        vols.add(n)
    if not spec.get("containers"):
        causes.append(_req(field + ".containers"))
    names = set()
    _validate_containers(spec.get("initContainers"), field + ".initContainers", causes, names,
                         volumes=vols)
    _validate_containers(spec.get("containers"), field + ".containers", causes, names,
                         volumes=vols)
    _validate_containers(spec.get("ephemeralContainers"), field + ".ephemeralContainers",
                         causes, names, ephemeral=True, volumes=vols)
    rp = spec.get("restartPolicy")
    if rp not in allowed_restart:
        if rp is None:
            causes.append((field + ".restartPolicy", "FieldValueRequired", "",
                           '%s.restartPolicy: Required value: valid values: %s' % (
                               field, ", ".join('"%s"' % a for a in allowed_restart))))
        else:
            causes.append(_unsupported(field + ".restartPolicy", rp, allowed_restart))
    tgps = spec.get("terminationGracePeriodSeconds")
    if tgps is not None and (not isinstance(tgps, int) or tgps < 0):
        causes.append(_bad(field + ".terminationGracePeriodSeconds", tgps,
                           "must be greater than or equal to 0"))


def _selector_matches_template(spec, causes):
    from .selectors import selector_matches
    sel = spec.get("selector")
    if sel is None:
        causes.append(_req("spec.selector"))
        return
    if not (sel.get("matchLabels") or sel.get("matchExpressions")):
        causes.append(_bad("spec.selector", sel, "empty selector is invalid for deployment"))
        return
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selector_matches(sel, labels):
        causes.append(_bad("spec.template.metadata.labels", labels,
                           "`selector` does not match template `labels`"))


def validate(res, obj, old=None, subresource=""):
    """Raises 422 Invalid with every problem found."""
    causes = []
    md = obj.get("metadata") or {}
    _validate_meta(res, md, causes)
    kind = res.kind
    spec = obj.get("spec") or {}
    if kind == "Pod":
        validate_pod_spec(spec, "spec", causes)
        if old is not None:
            _validate_pod_update(obj, old, causes, subresource)
    elif kind in WORKLOADS_WITH_TEMPLATE:
        tspec = (spec.get("template") or {}).get("spec") or {}
        if kind == "Job":
            validate_pod_spec(tspec, "spec.template.spec", causes,
                              allowed_restart=("OnFailure", "Never"))
            for f in ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds",
                      "ttlSecondsAfterFinished"):
                v = spec.get(f)
                if v is not None and (not isinstance(v, int) or v < 0 or
                                      (f == "activeDeadlineSeconds" and v == 0)):
                    causes.append(_bad("spec." + f, v, "must be greater than or equal to 0"))
            if old is not None:
                if spec.get("template") != old["spec"].get("template"):
                    causes.append(_bad("spec.template", "", "field is immutable"))
                if spec.get("completions") != old["spec"].get("completions"):
                    causes.append(_bad("spec.completions", spec.get("completions"),
                                       "field is immutable"))
        else:
            validate_pod_spec(tspec, "spec.template.spec", causes, allowed_restart=("Always",))
            _selector_matches_template(spec, causes)
            if old is not None and spec.get("selector") != old["spec"].get("selector"):
                causes.append(_bad("spec.selector", spec.get("selector"), "field is immutable"))
            r = spec.get("replicas")
            if r is not None and (not isinstance(r, int) or r < 0):
                causes.append(_bad("spec.replicas", r, "must be greater than or equal to 0"))
    elif kind == "PodDisruptionBudget":
        if "minAvailable" in spec and "maxUnavailable" in spec:
            causes.append(_bad("spec", spec, "minAvailable and maxUnavailable cannot be both set"))
    elif kind in ("RoleBinding", "ClusterRoleBinding"):
        ref = obj.get("roleRef") or {}
        if not ref.get("name"):
            causes.append(_req("roleRef.name"))
        if ref.get("kind") not in ("Role", "ClusterRole") or (
                kind == "ClusterRoleBinding" and ref.get("kind") != "ClusterRole"):
            causes.append(_unsupported("roleRef.kind", ref.get("kind"),
                                       ["ClusterRole"] if kind == "ClusterRoleBinding"
                                       else ["Role", "ClusterRole"]))
        if old is not None and ref != old.get("roleRef"):
            causes.append(_bad("roleRef", ref, "cannot change roleRef"))
    elif kind == "Secret":
        for k, v in (obj.get("data") or {}).items():
            try:
                base64.b64decode(v, validate=True)
            except Exception:
                causes.append(_bad("data[%s]" % k, "<secret contents redacted>",
                                   "illegal base64 data"))
    if causes:
        raise errors.invalid(res, kind, md.get("name", ""), causes)


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def _validate_pod_update(new, old, causes, subresource):
    ns, os_ = copy.deepcopy(new.get("spec") or {}), copy.deepcopy(old.get("spec") or {})
    if subresource == "ephemeralcontainers":
        olds = {c["name"]: c for c in os_.get("ephemeralContainers") or []}
        news = {c["name"]: c for c in ns.get("ephemeralContainers") or []}
        for name, c in olds.items():
            if name not in news:
                causes.append(_forbidden("spec.ephemeralContainers",
                                         'existing ephemeral containers "%s" may not be removed'
                                         % name))
            elif news[name] != c:
                causes.append(_forbidden("spec.ephemeralContainers",
                                         'existing ephemeral containers "%s" may not be changed'
                                         % name))
        ns.pop("ephemeralContainers", None)
        os_.pop("ephemeralContainers", None)
        if ns != os_:
            causes.append(_forbidden("spec", "only ephemeralContainers may be changed through the "
                                     "ephemeralcontainers subresource"))
        return
    if ns.get("ephemeralContainers") != os_.get("ephemeralContainers"):
        causes.append(_forbidden("spec.ephemeralContainers", "ephemeral containers may only be "
                                 "changed through the ephemeralcontainers subresource"))
        return
    for lst in ("containers", "initContainers"):
        for c in ns.get(lst) or []:
            c.pop("image", None)
        for c in os_.get(lst) or []:
            c.pop("image", None)
    for f in _POD_MUTABLE:
        ns.pop(f, None)
        os_.pop(f, None)
    if ns != os_:
        causes.append(_forbidden("spec", "pod updates may not change fields other than "
                                 "`spec.containers[*].image`,`spec.initContainers[*].image`,"
                                 "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions "
                                 "to existing tolerations),`spec.terminationGracePeriodSeconds` "
                                 "(allow it to be set to 1 if it was previously negative)"))


# -- Pod Security admission ---------------------------------------------------------

LEVELS = ("privileged", "baseline", "restricted")
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
VOLUME_SOURCES = ("hostPath", "emptyDir", "secret", "configMap", "projected", "downwardAPI",
                  "persistentVolumeClaim", "nfs", "iscsi", "glusterfs", "rbd", "cephfs",
                  "flexVolume", "cinder", "flocker", "fc", "azureFile", "azureDisk",
                  "vsphereVolume", "quobyte", "photonPersistentDisk", "portworxVolume",
                  "scaleIO", "storageos", "gcePersistentDisk", "awsElasticBlockStore",
                  "gitRepo", "csi", "ephemeral", "image")


def _containers(spec):
    for lst in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(lst) or []:
            yield c


def _quoted(items):
    return ", ".join('"%s"' % i for i in items)


def _plural(word, items):
    return word if len(items) == 1 else word + "s"


def pod_security_violations(spec, level, pod_meta=None):
    """[message] of the checks `spec` fails at `level`, in the order and
    wording of the Pod Security Standards' checks."""
    if level not in ("baseline", "restricted"):
        return []
    out = []
    psc = spec.get("securityContext") or {}
    # baseline
    hn = [k + "=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if hn:
        out.append("host namespaces (%s)" % ", ".join(hn))
    priv = [c["name"] for c in _containers(spec) if (c.get("securityContext") or {}).get(
        "privileged")]
    if priv:
        out.append("privileged (%s %s must not set securityContext.privileged=true)" % (
            _plural("container", priv), _quoted(priv)))
    caps_bad = {}
    for c in _containers(spec):
        add = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        bad = sorted({a for a in add if a.replace("CAP_", "") not in BASELINE_CAPS})
        if bad:
            caps_bad[c["name"]] = bad
    if caps_bad:
        parts = ['container "%s" must not include %s in securityContext.capabilities.add' % (
            n, _quoted(b)) for n, b in caps_bad.items()]
        out.append("non-default capabilities (%s)" % "; ".join(parts))
    hp = [v["name"] for v in spec.get("volumes") or [] if "hostPath" in v]
    if hp:
        out.append("hostPath volumes (%s %s)" % (_plural("volume", hp), _quoted(hp)))
    hports = []
    for c in _containers(spec):
        for p in c.get("ports") or []:
            if p.get("hostPort"):
                hports.append((c["name"], p["hostPort"]))
    if hports:
        out.append("hostPort (%s)" % "; ".join('container "%s" uses hostPort %d' % h
                                               for h in hports))
    aa = []
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        aa.append('pod must not set appArmorProfile.type to "Unconfined"')
    for c in _containers(spec):
        if ((c.get("securityContext") or {}).get("appArmorProfile") or {}).get(
                "type") == "Unconfined":
            aa.append('container "%s" must not set appArmorProfile.type to "Unconfined"'
                      % c["name"])
    for k, v in ((pod_meta or {}).get("annotations") or {}).items():
        if k.startswith("container.apparmor.security.beta.kubernetes.io/") and v == "unconfined":
            aa.append('container "%s" must not set annotation %s to "unconfined"' % (
                k.split("/", 1)[1], k))
    if aa:
        out.append("forbidden AppArmor profile (%s)" % "; ".join(aa))
    sel = []
    for who, sc in [("pod", psc)] + [('container "%s"' % c["name"], c.get("securityContext") or {})
                                     for c in _containers(spec)]:
        so = sc.get("seLinuxOptions") or {}
        if so.get("user") or so.get("role") or (so.get("type") and so["type"] not in (
                "container_t", "container_init_t", "container_kvm_t", "container_engine_t")):
            sel.append(who)
    if sel:
        out.append("seLinuxOptions (%s set forbidden securityContext.seLinuxOptions)"
                   % " and ".join(sel))
    pm = [c["name"] for c in _containers(spec)
          if (c.get("securityContext") or {}).get("procMount") not in (None, "Default")]
    if pm:
        out.append("procMount (%s %s must not set securityContext.procMount to \"Unmasked\")" % (
            _plural("container", pm), _quoted(pm)))
    unconf = []
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        unconf.append("pod")
    for c in _containers(spec):
        if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get(
                "type") == "Unconfined":
            unconf.append('container "%s"' % c["name"])
    if unconf:
        out.append('seccompProfile (%s must not set securityContext.seccompProfile.type to '
                   '"Unconfined")' % " and ".join(unconf))
    bad_sysctls = [s.get("name") for s in psc.get("sysctls") or [] if s.get("name") not in
                   SAFE_SYSCTLS]
    if bad_sysctls:
        out.append("forbidden sysctls (%s)" % ", ".join(bad_sysctls))
    if level == "baseline":
        return out
    # restricted
    rv = []
    for v in spec.get("volumes") or []:
        src = next((k for k in v if k in VOLUME_SOURCES), None)
        if src and src not in RESTRICTED_VOLUMES:
            rv.append((v["name"], src))
    if rv:
        out.append("restricted volume types (%s)" % ", ".join(
            'volume "%s" uses restricted volume type "%s"' % r for r in rv))
    ape = [c["name"] for c in _containers(spec)
           if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if ape:
        out.append("allowPrivilegeEscalation != false (%s %s must set "
                   "securityContext.allowPrivilegeEscalation=false)" % (
                       _plural("container", ape), _quoted(ape)))
    caps = []
    for c in _containers(spec):
        cp = (c.get("securityContext") or {}).get("capabilities") or {}
        drops = [d.replace("CAP_", "") for d in cp.get("drop") or []]
        if "ALL" not in drops:
            caps.append('container "%s" must set securityContext.capabilities.drop=["ALL"]'
                        % c["name"])
        adds = sorted({a for a in cp.get("add") or [] if a.replace("CAP_", "") !=
                       "NET_BIND_SERVICE"})
        if adds:
            caps.append('container "%s" must not include %s in securityContext.capabilities.add'
                        % (c["name"], _quoted(adds)))
    if caps:
        out.append("unrestricted capabilities (%s)" % "; ".join(caps))
    pod_nonroot = psc.get("runAsNonRoot")
    nr = []
    for c in _containers(spec):
        v = (c.get("securityContext") or {}).get("runAsNonRoot")
        if v is False or (v is None and pod_nonroot is not True):
            nr.append(c["name"])
    if pod_nonroot is False or nr:
        if pod_nonroot is False:
            out.append("runAsNonRoot != true (pod must not set securityContext.runAsNonRoot="
                       "false)")
        else:
            out.append("runAsNonRoot != true (pod or %s %s must set "
                       "securityContext.runAsNonRoot=true)" % (_plural("container", nr),
                                                               _quoted(nr)))
    root = []
    if psc.get("runAsUser") == 0:
        root.append("pod")
    for c in _containers(spec):
        if (c.get("securityContext") or {}).get("runAsUser") == 0:
            root.append('container "%s"' % c["name"])
    if root:
        out.append("runAsUser=0 (%s must not set runAsUser=0)" % " and ".join(root))
    pod_sc = (psc.get("seccompProfile") or {}).get("type")
    missing = []
    for c in _containers(spec):
        t = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if t is None and pod_sc in ("RuntimeDefault", "Localhost"):
            continue
        if t not in ("RuntimeDefault", "Localhost") and t != "Unconfined":
            missing.append(c["name"])
    if missing:
        out.append('seccompProfile (pod or %s %s must set securityContext.seccompProfile.type '
                   'to "RuntimeDefault" or "Localhost")' % (_plural("container", missing),
                                                           _quoted(missing)))
    return out


def namespace_levels(ns_obj):
    labels = ((ns_obj or {}).get("metadata") or {}).get("labels") or {}

    def lvl(mode):
        v = labels.get("pod-security.kubernetes.io/" + mode, "privileged")
        return v if v in LEVELS else "privileged"
    return lvl("enforce"), lvl("warn"), lvl("audit")


def pod_security(res, obj, ns_obj, subresource=""):
    """(forbidden message or None, [warning]) for a pod or a workload."""
    enforce, warn, _ = namespace_levels(ns_obj)
    kind = res.kind
    warnings = []
    if kind == "Pod":
        spec = obj.get("spec") or {}
        bad = pod_security_violations(spec, enforce, obj.get("metadata"))
        if bad:
            return ('%s "%s" is forbidden: violates PodSecurity "%s:latest": %s' % (
                "pods", obj["metadata"].get("name", ""), enforce, ", ".join(bad))), []
        wbad = pod_security_violations(spec, warn, obj.get("metadata"))
        if wbad and warn != enforce:
            warnings.append('would violate PodSecurity "%s:latest": %s' % (warn, ", ".join(wbad)))
        return None, warnings
    if kind in WORKLOADS_WITH_TEMPLATE:
        tmpl = (obj.get("spec") or {}).get("template") or {}
        for level in sorted({enforce, warn}, key=LEVELS.index, reverse=True):
            bad = pod_security_violations(tmpl.get("spec") or {}, level, tmpl.get("metadata"))
            if bad:
                warnings.append('would violate PodSecurity "%s:latest": %s' % (level,
                                                                               ", ".join(bad)))
                break
    return None, warnings
