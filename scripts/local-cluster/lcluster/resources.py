"""The resources this API server serves: what discovery says about each, and
what the handlers need (scope, status subresource, list kind)."""

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
CREATE_ONLY = ["create"]


class Resource:
    def __init__(self, group, version, kind, plural, namespaced=True, short=(), categories=(),
                 subresources=None, verbs=ALL_VERBS, singular=None, stored=True):
        self.group = group
        self.version = version
        self.kind = kind
        self.plural = plural
        self.singular = singular or kind.lower()
        self.namespaced = namespaced
        self.short = list(short)
        self.categories = list(categories)
        # name -> (group, version, kind, verbs)
        self.subresources = subresources or {}
        self.verbs = list(verbs)
        self.stored = stored  # False: create-only review objects, never kept

    @property
    def api_version(self):
        return self.version if not self.group else "%s/%s" % (self.group, self.version)

    @property
    def list_kind(self):
        return self.kind + "List"

    @property
    def key(self):
        return "%s/%s" % (self.group, self.plural)

    @property
    def has_status(self):
        return "status" in self.subresources

    def __repr__(self):
        return "<Resource %s>" % self.key


def _sub(group, version, kind, verbs):
    return (group, version, kind, verbs)


def _status(res_group, res_version, kind):
    return _sub(res_group, res_version, kind, ["get", "patch", "update"])


def _scale():
    return _sub("autoscaling", "v1", "Scale", ["get", "patch", "update"])


RESOURCES = []


def _add(*a, **kw):
    r = Resource(*a, **kw)
    RESOURCES.append(r)
    return r


# core/v1
NAMESPACES = _add("", "v1", "Namespace", "namespaces", namespaced=False, short=["ns"],
                  subresources={"status": _status("", "v1", "Namespace"),
                                "finalize": _sub("", "v1", "Namespace", ["update"])},
                  verbs=["create", "delete", "get", "list", "patch", "update", "watch"])
NODES = _add("", "v1", "Node", "nodes", namespaced=False, short=["no"],
             subresources={"status": _status("", "v1", "Node")})
PODS = _add("", "v1", "Pod", "pods", short=["po"], categories=["all"], subresources={
    "status": _status("", "v1", "Pod"),
    "log": _sub("", "v1", "Pod", ["get"]),
    "portforward": _sub("", "v1", "PodPortForwardOptions", ["create", "get"]),
    "exec": _sub("", "v1", "PodExecOptions", ["create", "get"]),
    "attach": _sub("", "v1", "PodAttachOptions", ["create", "get"]),
    "eviction": _sub("policy", "v1", "Eviction", ["create"]),
    "binding": _sub("", "v1", "Binding", ["create"]),
    "ephemeralcontainers": _sub("", "v1", "Pod", ["get", "patch", "update"]),
})
SECRETS = _add("", "v1", "Secret", "secrets")
CONFIGMAPS = _add("", "v1", "ConfigMap", "configmaps", short=["cm"])
EVENTS = _add("", "v1", "Event", "events", short=["ev"])
SERVICEACCOUNTS = _add("", "v1", "ServiceAccount", "serviceaccounts", short=["sa"])
SERVICES = _add("", "v1", "Service", "services", short=["svc"], categories=["all"],
                subresources={"status": _status("", "v1", "Service")},
                verbs=["create", "delete", "deletecollection", "get", "list", "patch", "update",
                       "watch"])
ENDPOINTS = _add("", "v1", "Endpoints", "endpoints", short=["ep"])

# apps/v1
DEPLOYMENTS = _add("apps", "v1", "Deployment", "deployments", short=["deploy"],
                   categories=["all"], subresources={"status": _status("apps", "v1", "Deployment"),
                                                     "scale": _scale()})
REPLICASETS = _add("apps", "v1", "ReplicaSet", "replicasets", short=["rs"], categories=["all"],
                   subresources={"status": _status("apps", "v1", "ReplicaSet"),
                                 "scale": _scale()})
STATEFULSETS = _add("apps", "v1", "StatefulSet", "statefulsets", short=["sts"],
                    categories=["all"],
                    subresources={"status": _status("apps", "v1", "StatefulSet"),
                                  "scale": _scale()})
DAEMONSETS = _add("apps", "v1", "DaemonSet", "daemonsets", short=["ds"], categories=["all"],
                  subresources={"status": _status("apps", "v1", "DaemonSet")})
CONTROLLERREVISIONS = _add("apps", "v1", "ControllerRevision", "controllerrevisions")

# batch/v1
JOBS = _add("batch", "v1", "Job", "jobs", categories=["all"],
            subresources={"status": _status("batch", "v1", "Job")})

# policy/v1
PDBS = _add("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", short=["pdb"],
            subresources={"status": _status("policy", "v1", "PodDisruptionBudget")})

# rbac.authorization.k8s.io/v1
RBAC = "rbac.authorization.k8s.io"
ROLES = _add(RBAC, "v1", "Role", "roles")
ROLEBINDINGS = _add(RBAC, "v1", "RoleBinding", "rolebindings")
CLUSTERROLES = _add(RBAC, "v1", "ClusterRole", "clusterroles", namespaced=False)
CLUSTERROLEBINDINGS = _add(RBAC, "v1", "ClusterRoleBinding", "clusterrolebindings",
                           namespaced=False)

# Reviews: created, answered, never stored.
AUTHZ = "authorization.k8s.io"
SSAR = _add(AUTHZ, "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews", namespaced=False,
            verbs=CREATE_ONLY, stored=False)
SAR = _add(AUTHZ, "v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False,
           verbs=CREATE_ONLY, stored=False)
LSAR = _add(AUTHZ, "v1", "LocalSubjectAccessReview", "localsubjectaccessreviews",
            verbs=CREATE_ONLY, stored=False)
SSRR = _add(AUTHZ, "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews", namespaced=False,
            verbs=CREATE_ONLY, stored=False)
SSR = _add("authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews",
           namespaced=False, verbs=CREATE_ONLY, stored=False)

# coordination.k8s.io/v1
LEASES = _add("coordination.k8s.io", "v1", "Lease", "leases")

BY_KEY = {r.key: r for r in RESOURCES}


def lookup(group, version, plural):
    r = BY_KEY.get("%s/%s" % (group, plural))
    if r is None or r.version != version:
        return None
    return r


def by_kind(api_version, kind):
    group, _, version = api_version.rpartition("/")
    for r in RESOURCES:
        if r.group == group and r.version == version and r.kind == kind:
            return r
    return None


def groups():
    """[(group, version)] in discovery order, core first."""
    seen = []
    for r in RESOURCES:
        gv = (r.group, r.version)
        if gv not in seen:
            seen.append(gv)
    return seen
