"""Request bodies in Kubernetes' protobuf encoding, which `kubectl create
<generator>` sends for built-in kinds (there is no fallback to JSON in the
client). The envelope is the magic "k8s\\0" and a runtime.Unknown
{typeMeta{apiVersion, kind}, raw}; raw is the object in the wire format of
the API's generated.proto.

Only the kinds and fields those generators fill are described below (their
field numbers are the API's); anything else is refused with a 415 that
says to send JSON. Go's encoder writes every non-pointer field, zero or
not: a zero scalar or an empty message is "unset" here, except for the
fields marked "p" (pointers in the Go types), where presence is meaning.
"""

import base64
import datetime

from . import errors

MAGIC = b"k8s\x00"

# Each message: field number -> (json name, type[, flags]). Types: "s"
# string, "b" bytes, "i" int, "bool", "t" Time, "ios" IntOrString, "q"
# Quantity, a message name, "m:s" map<string,string>, "m:b"
# map<string,bytes>, "m:q" map<string,Quantity>. Flags: "r" repeated, "p"
# pointer (present means set, zero or not), "drop" (read and ignored).
SCHEMA = {
    "ObjectMeta": {1: ("name", "s"), 2: ("generateName", "s"), 3: ("namespace", "s"),
                   5: ("uid", "s"), 6: ("resourceVersion", "s"), 7: ("generation", "i"),
                   8: ("creationTimestamp", "t"), 9: ("deletionTimestamp", "t"),
                   10: ("deletionGracePeriodSeconds", "i", "p"), 11: ("labels", "m:s"),
                   12: ("annotations", "m:s"), 13: ("ownerReferences", "OwnerReference", "r"),
                   14: ("finalizers", "s", "r"), 4: ("selfLink", "s", "drop"),
                   17: ("managedFields", "s", "drop")},
    "OwnerReference": {1: ("kind", "s"), 3: ("name", "s"), 4: ("uid", "s"),
                       5: ("apiVersion", "s"), 6: ("controller", "bool", "p"),
                       7: ("blockOwnerDeletion", "bool", "p")},
    "LabelSelector": {1: ("matchLabels", "m:s"),
                      2: ("matchExpressions", "LabelSelectorRequirement", "r")},
    "LabelSelectorRequirement": {1: ("key", "s"), 2: ("operator", "s"), 3: ("values", "s", "r")},
    "Namespace": {1: ("metadata", "ObjectMeta"), 2: ("spec", "NamespaceSpec"),
                  3: ("status", "s", "drop")},
    "NamespaceSpec": {1: ("finalizers", "s", "r")},
    "Secret": {1: ("metadata", "ObjectMeta"), 2: ("data", "m:b"), 3: ("type", "s"),
               4: ("stringData", "m:s"), 5: ("immutable", "bool", "p")},
    "ConfigMap": {1: ("metadata", "ObjectMeta"), 2: ("data", "m:s"), 3: ("binaryData", "m:b"),
                  4: ("immutable", "bool", "p")},
    "ServiceAccount": {1: ("metadata", "ObjectMeta"),
                       3: ("imagePullSecrets", "LocalObjectReference", "r"),
                       4: ("automountServiceAccountToken", "bool", "p")},
    "LocalObjectReference": {1: ("name", "s")},
    "PodTemplateSpec": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PodSpec")},
    "PodSpec": {2: ("containers", "Container", "r"), 3: ("restartPolicy", "s"),
                4: ("terminationGracePeriodSeconds", "i", "p"),
                5: ("activeDeadlineSeconds", "i", "p"), 6: ("dnsPolicy", "s"),
                7: ("nodeSelector", "m:s"), 8: ("serviceAccountName", "s"),
                9: ("serviceAccount", "s"), 10: ("nodeName", "s"), 11: ("hostNetwork", "bool"),
                12: ("hostPID", "bool"), 13: ("hostIPC", "bool"),
                15: ("imagePullSecrets", "LocalObjectReference", "r"), 16: ("hostname", "s"),
                17: ("subdomain", "s"), 19: ("schedulerName", "s"),
                20: ("initContainers", "Container", "r"),
                21: ("automountServiceAccountToken", "bool", "p"),
                24: ("priorityClassName", "s"), 25: ("priority", "i", "p"),
                27: ("shareProcessNamespace", "bool", "p"), 30: ("enableServiceLinks", "bool", "p"),
                14: ("securityContext", "Empty")},
    "Empty": {},
    "Container": {1: ("name", "s"), 2: ("image", "s"), 3: ("command", "s", "r"),
                  4: ("args", "s", "r"), 5: ("workingDir", "s"),
                  6: ("ports", "ContainerPort", "r"), 7: ("env", "EnvVar", "r"),
                  8: ("resources", "ResourceRequirements"),
                  9: ("volumeMounts", "VolumeMount", "r"), 13: ("terminationMessagePath", "s"),
                  14: ("imagePullPolicy", "s"), 16: ("stdin", "bool"), 17: ("stdinOnce", "bool"),
                  18: ("tty", "bool"), 20: ("terminationMessagePolicy", "s")},
    "ContainerPort": {1: ("name", "s"), 2: ("hostPort", "i"), 3: ("containerPort", "i"),
                      4: ("protocol", "s"), 5: ("hostIP", "s")},
    "EnvVar": {1: ("name", "s"), 2: ("value", "s")},
    "ResourceRequirements": {1: ("limits", "m:q"), 2: ("requests", "m:q")},
    "VolumeMount": {1: ("name", "s"), 2: ("readOnly", "bool"), 3: ("mountPath", "s"),
                    4: ("subPath", "s")},
    "Deployment": {1: ("metadata", "ObjectMeta"), 2: ("spec", "DeploymentSpec"),
                   3: ("status", "s", "drop")},
    "DeploymentSpec": {1: ("replicas", "i", "p"), 2: ("selector", "LabelSelector"),
                       3: ("template", "PodTemplateSpec"), 4: ("strategy", "DeploymentStrategy"),
                       5: ("minReadySeconds", "i"), 6: ("revisionHistoryLimit", "i", "p"),
                       7: ("paused", "bool"), 9: ("progressDeadlineSeconds", "i", "p")},
    "DeploymentStrategy": {1: ("type", "s"), 2: ("rollingUpdate", "RollingUpdateDeployment")},
    "RollingUpdateDeployment": {1: ("maxUnavailable", "ios"), 2: ("maxSurge", "ios")},
    "Job": {1: ("metadata", "ObjectMeta"), 2: ("spec", "JobSpec"), 3: ("status", "s", "drop")},
    "JobSpec": {1: ("parallelism", "i", "p"), 2: ("completions", "i", "p"),
                3: ("activeDeadlineSeconds", "i", "p"), 4: ("selector", "LabelSelector"),
                5: ("manualSelector", "bool", "p"), 6: ("template", "PodTemplateSpec"),
                7: ("backoffLimit", "i", "p"), 8: ("ttlSecondsAfterFinished", "i", "p"),
                9: ("completionMode", "s", "p"), 10: ("suspend", "bool", "p")},
    "Role": {1: ("metadata", "ObjectMeta"), 2: ("rules", "PolicyRule", "r")},
    "ClusterRole": {1: ("metadata", "ObjectMeta"), 2: ("rules", "PolicyRule", "r"),
                    3: ("aggregationRule", "AggregationRule")},
    "AggregationRule": {1: ("clusterRoleSelectors", "LabelSelector", "r")},
    "PolicyRule": {1: ("verbs", "s", "r"), 2: ("apiGroups", "s", "r"),
                   3: ("resources", "s", "r"), 4: ("resourceNames", "s", "r"),
                   5: ("nonResourceURLs", "s", "r")},
    "RoleBinding": {1: ("metadata", "ObjectMeta"), 2: ("subjects", "Subject", "r"),
                    3: ("roleRef", "RoleRef")},
    "Subject": {1: ("kind", "s"), 2: ("apiGroup", "s"), 3: ("name", "s"), 4: ("namespace", "s")},
    "RoleRef": {1: ("apiGroup", "s"), 2: ("kind", "s"), 3: ("name", "s")},
    "PodDisruptionBudget": {1: ("metadata", "ObjectMeta"), 2: ("spec", "PDBSpec"),
                            3: ("status", "s", "drop")},
    "PDBSpec": {1: ("minAvailable", "ios", "p"), 2: ("selector", "LabelSelector"),
                3: ("maxUnavailable", "ios", "p"), 4: ("unhealthyPodEvictionPolicy", "s", "p")},
    "SelfSubjectAccessReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SSARSpec"),
                                3: ("status", "s", "drop")},
    "SSARSpec": {1: ("resourceAttributes", "ResourceAttributes"),
                 2: ("nonResourceAttributes", "NonResourceAttributes")},
    "SubjectAccessReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SARSpec"),
                            3: ("status", "s", "drop")},
    "SARSpec": {1: ("resourceAttributes", "ResourceAttributes"),
                2: ("nonResourceAttributes", "NonResourceAttributes"), 3: ("user", "s"),
                4: ("groups", "s", "r"), 5: ("extra", "s", "drop"), 6: ("uid", "s")},
    "ResourceAttributes": {1: ("namespace", "s"), 2: ("verb", "s"), 3: ("group", "s"),
                           4: ("version", "s"), 5: ("resource", "s"), 6: ("subresource", "s"),
                           7: ("name", "s"), 8: ("fieldSelector", "s", "drop"),
                           9: ("labelSelector", "s", "drop")},
    "NonResourceAttributes": {1: ("path", "s"), 2: ("verb", "s")},
    "SelfSubjectRulesReview": {1: ("metadata", "ObjectMeta"), 2: ("spec", "SSRRSpec"),
                               3: ("status", "s", "drop")},
    "SSRRSpec": {1: ("namespace", "s")},
    "SelfSubjectReview": {1: ("metadata", "ObjectMeta"), 2: ("status", "s", "drop")},
}

KINDS = {("v1", "Namespace"): "Namespace", ("v1", "Secret"): "Secret",
         ("v1", "ConfigMap"): "ConfigMap", ("v1", "ServiceAccount"): "ServiceAccount",
         ("apps/v1", "Deployment"): "Deployment", ("batch/v1", "Job"): "Job",
         ("rbac.authorization.k8s.io/v1", "Role"): "Role",
         ("rbac.authorization.k8s.io/v1", "ClusterRole"): "ClusterRole",
         ("rbac.authorization.k8s.io/v1", "RoleBinding"): "RoleBinding",
         ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "RoleBinding",
         ("policy/v1", "PodDisruptionBudget"): "PodDisruptionBudget",
         ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): "SelfSubjectAccessReview",
         ("authorization.k8s.io/v1", "LocalSubjectAccessReview"): "SubjectAccessReview",
         ("authorization.k8s.io/v1", "SubjectAccessReview"): "SubjectAccessReview",
         ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): "SelfSubjectRulesReview",
         ("authentication.k8s.io/v1", "SelfSubjectReview"): "SelfSubjectReview"}


class Unsupported(Exception):
    pass


def _varint(buf, pos):
    n = shift = 0
    while True:
        if pos >= len(buf):
            raise Unsupported("truncated varint")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def _fields(buf):
    """(number, wire type, value) of each field: ints for varints, bytes
    for length-delimited fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _varint(buf, pos)
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            v = bytes(buf[pos:pos + ln])
            pos += ln
        elif wt == 1:
            v = int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wt == 5:
            v = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise Unsupported("wire type %d" % wt)
        yield num, wt, v


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _decode(msg, buf):
    schema = SCHEMA[msg]
    out = {}
    for num, wt, v in _fields(buf):
        f = schema.get(num)
        if f is None:
            raise Unsupported("field %d of %s" % (num, msg))
        name, typ = f[0], f[1]
        flags = f[2:] if len(f) > 2 else ()
        if "drop" in flags:
            continue
        val, present = _value(typ, v, "p" in flags)
        if "r" in flags:
            out.setdefault(name, []).append(val)
        elif typ.startswith("m:"):
            k, mv = val
            out.setdefault(name, {})[k] = mv
        elif present:
            out[name] = val
    return out


def _value(typ, v, pointer):
    """(value, whether it counts as set)"""
    if typ == "s":
        s = v.decode()
        return s, bool(s) or pointer
    if typ == "b":
        return base64.b64encode(v).decode(), True
    if typ == "i":
        n = _signed(v)
        return n, n != 0 or pointer
    if typ == "bool":
        return bool(v), bool(v) or pointer
    if typ == "t":
        f = {n: val for n, _, val in _fields(v)}
        if not f.get(1):
            return None, False
        t = datetime.datetime.fromtimestamp(_signed(f[1]), datetime.timezone.utc)
        return t.strftime("%Y-%m-%dT%H:%M:%SZ"), True
    if typ == "q":
        f = {n: val for n, _, val in _fields(v)}
        return f.get(1, b"0").decode(), True
    if typ == "ios":
        f = {n: val for n, _, val in _fields(v)}
        if f.get(1, 0) == 1:
            return f.get(3, b"").decode(), True
        return _signed(f.get(2, 0)), True
    if typ.startswith("m:"):
        f = {n: val for n, _, val in _fields(v)}
        key = f.get(1, b"").decode()
        raw = f.get(2, b"")
        if typ == "m:s":
            return (key, raw.decode()), True
        if typ == "m:b":
            return (key, base64.b64encode(raw).decode()), True
        if typ == "m:q":
            return (key, _value("q", raw, True)[0]), True
    if typ in SCHEMA:
        d = _decode(typ, v)
        return d, bool(d) or pointer
    raise Unsupported("type %s" % typ)


def decode(body):
    """The JSON form of a protobuf request body."""
    if not body.startswith(MAGIC):
        raise errors.ApiError(415, "UnsupportedMediaType", "the protobuf body lacks the k8s "
                              "envelope")
    env = {n: v for n, _, v in _fields(body[len(MAGIC):])}
    tm = {n: v for n, _, v in _fields(env.get(1, b""))}
    api_version, kind = tm.get(1, b"").decode(), tm.get(2, b"").decode()
    msg = KINDS.get((api_version, kind))
    if msg is None:
        raise errors.ApiError(415, "UnsupportedMediaType", "the local cluster decodes protobuf "
                              "bodies only for the kinds `kubectl create` makes of Namespace, "
                              "Secret, ConfigMap, ServiceAccount, Deployment, Job, RBAC, "
                              "PodDisruptionBudget and the access reviews; send %s %s as JSON (kubectl apply -f)" % (
                                  api_version, kind))
    try:
        obj = _decode(msg, env.get(2, b""))
    except Unsupported as e:
        raise errors.ApiError(415, "UnsupportedMediaType", "the local cluster cannot decode %s "
                              "of %s %s from protobuf; send it as JSON (kubectl apply -f)" % (
                                  e, api_version, kind))
    obj["apiVersion"] = api_version
    obj["kind"] = kind
    return obj
