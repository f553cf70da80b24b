"""The objects a fresh cluster starts with: the system namespaces, the
cluster-admin role bound to system:masters, and the restricted user's
read-only role (it may get, list and watch everything and change nothing,
so every write it tries is a 403 until a Role grants it more)."""

from . import resources as R

RESTRICTED_USER = "siphon-restricted"

OBJECTS = [
    (R.NAMESPACES, {"metadata": {"name": n}})
    for n in ("default", "kube-system", "kube-public", "kube-node-lease")
] + [
    (R.CLUSTERROLES, {"metadata": {"name": "cluster-admin"},
                      "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                                {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
    (R.CLUSTERROLEBINDINGS, {"metadata": {"name": "cluster-admin"},
                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                         "kind": "ClusterRole", "name": "cluster-admin"},
                             "subjects": [{"apiGroup": "rbac.authorization.k8s.io",
                                           "kind": "Group", "name": "system:masters"}]}),
    (R.CLUSTERROLES, {"metadata": {"name": "local-cluster:read-only"},
                      "rules": [{"apiGroups": ["*"], "resources": ["*"],
                                 "verbs": ["get", "list", "watch"]}]}),
    (R.CLUSTERROLEBINDINGS, {"metadata": {"name": "local-cluster:restricted-read-only"},
                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                         "kind": "ClusterRole", "name": "local-cluster:read-only"},
                             "subjects": [{"apiGroup": "rbac.authorization.k8s.io",
                                           "kind": "User", "name": RESTRICTED_USER}]}),
]


def load(registry):
    for res, obj in OBJECTS:
        if registry.store.get(res, "", obj["metadata"]["name"], copy_=False) is None:
            registry.create(res, "", dict(obj))
