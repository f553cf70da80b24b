"""Authentication (bearer tokens from a file, the format of kube-apiserver's
--token-auth-file: token,user,uid,"group1,group2") and authorization: the
group system:masters may do anything, nodes (group system:nodes) act as a
kubelet may, everyone else gets what the RBAC objects in the store grant
(Role, ClusterRole, RoleBinding, ClusterRoleBinding, evaluated as the RBAC
reference describes; aggregation rules and escalation checks are not
implemented)."""

import csv

from . import resources as R

AUTHENTICATED = "system:authenticated"

# What every authenticated user may do (the API's default bindings
# system:discovery, system:basic-user, system:public-info-viewer).
DISCOVERY_PATHS = ("/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz")
SELF_REVIEWS = {("authorization.k8s.io", "selfsubjectaccessreviews"),
                ("authorization.k8s.io", "selfsubjectrulesreviews"),
                ("authentication.k8s.io", "selfsubjectreviews")}


class User:
    def __init__(self, name, uid="", groups=()):
        self.name = name
        self.uid = uid
        self.groups = list(groups)
        if AUTHENTICATED not in self.groups:
            self.groups.append(AUTHENTICATED)

    def info(self):
        d = {"username": self.name, "groups": self.groups}
        if self.uid:
            d["uid"] = self.uid
        return d


def load_tokens(path):
    tokens = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[0].startswith("#"):
                continue
            token, name = row[0], row[1]
            uid = row[2] if len(row) > 2 else ""
            groups = [g for g in (row[3].split(",") if len(row) > 3 else []) if g]
            tokens[token] = User(name, uid, groups)
    return tokens


class Attributes:
    def __init__(self, verb, group="", resource="", subresource="", namespace="", name="",
                 path=None):
        self.verb = verb
        self.group = group
        self.resource = resource
        self.subresource = subresource
        self.namespace = namespace
        self.name = name
        self.path = path  # non-resource request when set

    @property
    def resource_request(self):
        return self.path is None


class Authorizer:
    def __init__(self, store):
        self.store = store

    def authorize(self, user, a):
        """(allowed, reason)"""
        if "system:masters" in user.groups:
            return True, "allowed: member of system:masters"
        if "system:nodes" in user.groups:
            return True, "allowed: a node"
        if not a.resource_request:
            if a.verb == "get" and any(a.path == p or a.path.startswith(p + "/")
                                       for p in DISCOVERY_PATHS):
                return True, "allowed by the discovery role"
        elif (a.group, a.resource) in SELF_REVIEWS and a.verb == "create":
            return True, "allowed by the basic-user role"
        for binding, role_kind, role_name, rules in self._rules_for(user, a.namespace):
            for rule in rules:
                if _rule_allows(rule, a):
                    return True, 'RBAC: allowed by %s "%s" of %s "%s" to %s' % (
                        binding["kind"], binding["metadata"]["name"], role_kind, role_name,
                        _subject_desc(user, binding))
        return False, ""

    def rules(self, user, namespace):
        """Every rule that applies to user in namespace (SelfSubjectRulesReview)."""
        if "system:masters" in user.groups:
            return [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}], \
                [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
        res_rules, non_res = [], [{"verbs": ["get"], "nonResourceURLs": [p, p + "/*"]}
                                  for p in DISCOVERY_PATHS]
        res_rules.append({"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
                          "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]})
        for _, _, _, rules in self._rules_for(user, namespace):
            for r in rules:
                (non_res if r.get("nonResourceURLs") else res_rules).append(r)
        return res_rules, non_res

    def _rules_for(self, user, namespace):
        for b in self.store.list(R.CLUSTERROLEBINDINGS):
            if _subjects_match(b, user):
                role = self.store.get(R.CLUSTERROLES, "", b["roleRef"]["name"], copy_=False)
                if role:
                    yield b, "ClusterRole", role["metadata"]["name"], role.get("rules") or []
        if namespace:
            for b in self.store.list(R.ROLEBINDINGS, namespace):
                if not _subjects_match(b, user):
                    continue
                ref = b.get("roleRef") or {}
                if ref.get("kind") == "ClusterRole":
                    role = self.store.get(R.CLUSTERROLES, "", ref.get("name"), copy_=False)
                else:
                    role = self.store.get(R.ROLES, namespace, ref.get("name"), copy_=False)
                if role:
                    yield b, ref.get("kind"), ref.get("name"), role.get("rules") or []


def _subjects_match(binding, user):
    for s in binding.get("subjects") or []:
        kind = s.get("kind")
        if kind == "User" and s.get("name") == user.name:
            return True
        if kind == "Group" and s.get("name") in user.groups:
            return True
        if kind == "ServiceAccount" and user.name == "system:serviceaccount:%s:%s" % (
                s.get("namespace", ""), s.get("name")):
            return True
    return False


def _subject_desc(user, binding):
    for s in binding.get("subjects") or []:
        if s.get("kind") == "User" and s.get("name") == user.name:
            return 'User "%s"' % user.name
        if s.get("kind") == "Group" and s.get("name") in user.groups:
            return 'Group "%s"' % s.get("name")
    return 'User "%s"' % user.name


def _rule_allows(rule, a):
    verbs = rule.get("verbs") or []
    if "*" not in verbs and a.verb not in verbs:
        return False
    if not a.resource_request:
        for u in rule.get("nonResourceURLs") or []:
            if u == "*" or u == a.path or (u.endswith("*") and a.path.startswith(u[:-1])):
                return True
        return False
    groups = rule.get("apiGroups")
    if groups is None or ("*" not in groups and a.group not in groups):
        return False
    combined = a.resource + ("/" + a.subresource if a.subresource else "")
    ok = False
    for r in rule.get("resources") or []:
        if r == "*" or r == combined:
            ok = True
        elif a.subresource and r == "*/" + a.subresource:
            ok = True
        elif a.subresource and r == a.resource + "/*":
            ok = True
        if ok:
            break
    if not ok:
        return False
    names = rule.get("resourceNames") or []
    if names and a.name not in names:
        return False
    return True


def forbidden_message(user, a, res_plural_group=None):
    """The API's message for a denied request."""
    if not a.resource_request:
        return 'forbidden: User "%s" cannot %s path "%s"' % (user.name, a.verb, a.path)
    qual = a.resource if not a.group else "%s.%s" % (a.resource, a.group)
    head = '%s "%s"' % (qual, a.name) if a.name else qual
    combined = a.resource + ("/" + a.subresource if a.subresource else "")
    scope = ('in the namespace "%s"' % a.namespace) if a.namespace else "at the cluster scope"
    return '%s is forbidden: User "%s" cannot %s resource "%s" in API group "%s" %s' % (
        head, user.name, a.verb, combined, a.group, scope)
