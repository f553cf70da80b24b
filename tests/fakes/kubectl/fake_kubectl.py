#!/usr/bin/env python3
"""A stand-in for kubectl with a tiny cluster in a directory, for the tests of
`siphon --target` without a cluster (tests/unit/kube, tests/unit/cli).

It answers the calls Siphon makes (get, auth can-i, create -f -, patch,
delete, logs, port-forward, config view) from $FAKE_KUBE_STATE/cluster.json,
and runs an agent "pod" as a real process: `siphon-agent targetless` on
127.0.0.1 (the binary in $FAKE_KUBE_AGENT) with the token of the pod's Secret,
whose stdout is the pod's log. port-forward relays to that agent's port.

cluster.json holds {"pods": {"NS/NAME": Pod}, "deployments": {...},
"namespaces": {"NAME": Namespace}, "nodes": {...}, "secrets": {...},
"jobs": {...}, "forbidden": ["create jobs.batch", ...],
"bad_images": ["IMAGE", ...], "exiting_images": ["IMAGE", ...]}.

Faults for the transport tests (environment):
  FAKE_PF_CUT_AFTER_BYTES=N  the first port-forward exits ("lost connection
                             to pod") after relaying N bytes agent->client;
  FAKE_PF_STALL_AFTER_BYTES=N  the first one stops relaying (and stays).
Every call is appended to $FAKE_KUBE_STATE/calls.log.
"""

import base64
import fcntl
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

STATE = os.environ.get("FAKE_KUBE_STATE", "/tmp/fake-kube")
CLUSTER = os.path.join(STATE, "cluster.json")
RESOURCES = {
    "pod": "pods", "pods": "pods", "po": "pods",
    "deployment": "deployments", "deployments": "deployments", "deployments.apps": "deployments",
    "deploy": "deployments",
    "namespace": "namespaces", "namespaces": "namespaces", "ns": "namespaces",
    "node": "nodes", "nodes": "nodes",
    "secret": "secrets", "secrets": "secrets",
    "job": "jobs", "jobs": "jobs", "jobs.batch": "jobs",
    "events": "events", "statefulsets.apps": "statefulsets", "replicasets.apps": "replicasets",
    "daemonsets.apps": "daemonsets",
}
CLUSTER_SCOPED = {"namespaces", "nodes"}


class Lock:
    def __enter__(self):
        os.makedirs(STATE, exist_ok=True)
        self.f = open(os.path.join(STATE, "lock"), "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *a):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def load():
    with open(CLUSTER) as f:
        return json.load(f)


def save(c):
    tmp = CLUSTER + ".tmp"
    with open(tmp, "w") as f:
        json.dump(c, f, indent=1)
    os.replace(tmp, CLUSTER)


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def err(msg, code=1):
    sys.stderr.write(msg + "\n")
    sys.exit(code)


def key(ns, name, res):
    return name if res in CLUSTER_SCOPED else f"{ns}/{name}"


def parse_args(argv):
    opts = {"ns": None, "o": None, "l": None, "A": False, "stdin": False, "patch": None,
            "subresource": None, "tail": None, "c": None, "field": None, "address": None}
    words = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a.startswith("--kubeconfig=") or a.startswith("--context="):
            pass
        elif a in ("-n", "--namespace"):
            opts["ns"] = nxt
            i += 1
        elif a == "-o":
            opts["o"] = nxt
            i += 1
        elif a == "-l":
            opts["l"] = nxt
            i += 1
        elif a == "-c":
            opts["c"] = nxt
            i += 1
        elif a in ("-A", "--all-namespaces"):
            opts["A"] = True
        elif a == "-f":
            opts["stdin"] = nxt == "-"
            i += 1
        elif a == "-p":
            opts["patch"] = nxt
            i += 1
        elif a == "--field-selector":
            opts["field"] = nxt
            i += 1
        elif a == "--address":
            opts["address"] = nxt
            i += 1
        elif a.startswith("--subresource="):
            opts["subresource"] = a.split("=", 1)[1]
        elif a.startswith("--tail="):
            opts["tail"] = int(a.split("=", 1)[1])
        elif a.startswith("--"):
            pass
        else:
            words.append(a)
        i += 1
    return words, opts


def matches(labels, selector):
    if not selector:
        return True
    for part in selector.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            if labels.get(k) != v:
                return False
        elif part.startswith("!"):
            if part[1:] in labels:
                return False
        elif part not in labels:
            return False
    return True


def forbidden(c, verb, res, ns):
    for f in c.get("forbidden", []):
        if f == f"{verb} {res}":
            return True
    return False


def jsonpath(obj, expr):
    if expr == "{.metadata.uid}":
        return obj["metadata"].get("uid", "")
    if expr == "{.items[*].metadata.name}":
        return " ".join(i["metadata"]["name"] for i in obj.get("items", []))
    return ""


def out(obj, fmt):
    if fmt == "json":
        print(json.dumps(obj))
    elif fmt == "name":
        kind = obj.get("kind", "").lower()
        print(f"{kind}/{obj['metadata']['name']}")
    elif fmt and fmt.startswith("jsonpath="):
        sys.stdout.write(jsonpath(obj, fmt[len("jsonpath="):]))
    else:
        print(obj["metadata"]["name"])


def cmd_get(c, words, o):
    res = RESOURCES.get(words[0].split("/")[0], words[0])
    if res == "events":
        return
    if "/" in words[0]:
        words = [words[0].split("/")[0], words[0].split("/")[1]] + words[1:]
    ns = o["ns"] or "default"
    verb = "get" if len(words) > 1 else "list"
    if forbidden(c, verb, res, ns):
        err(f'Error from server (Forbidden): {res} is forbidden: User "tester" cannot {verb} '
            f'resource "{res}" in the namespace "{ns}"')
    objs = c.get(res, {})
    if len(words) > 1:
        name = words[1]
        obj = objs.get(key(ns, name, res))
        if obj is None:
            err(f'Error from server (NotFound): {res} "{name}" not found')
        out(obj, o["o"])
        return
    items = []
    for k, v in objs.items():
        if res not in CLUSTER_SCOPED and not o["A"] and v["metadata"].get("namespace") != ns:
            continue
        if not matches(v["metadata"].get("labels", {}), o["l"]):
            continue
        items.append(v)
    out({"kind": "List", "apiVersion": "v1", "items": items}, o["o"] or "json")


def start_agent(c, ns, pod_name, token, image, idle="60s"):
    """Runs the agent of a pod: siphon-agent targetless on 127.0.0.1."""
    log = os.path.join(STATE, f"log-{ns}-{pod_name}")
    tokfile = os.path.join(STATE, f"token-{ns}-{pod_name}")
    with open(tokfile, "w") as f:
        f.write(token)
    args = [os.environ["FAKE_KUBE_AGENT"], "targetless", "--listen", "127.0.0.1:0",
            "--token-file", tokfile, "--idle-timeout", idle,
            "--session-grace", os.environ.get("FAKE_AGENT_SESSION_GRACE", "20s"),
            "--fs-mode", "ro"]
    if image in c.get("exiting_images", []):
        args = [os.environ["FAKE_KUBE_AGENT"], "no-such-mode"]
    with open(log, "w") as lf:
        p = subprocess.Popen(args, stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)
    with open(os.path.join(STATE, f"pid-{ns}-{pod_name}"), "w") as f:
        f.write(str(p.pid))
    return p.pid


def running_status(name, image, exited=False):
    if exited:
        return {"name": name, "image": image, "ready": False, "restartCount": 0,
                "state": {"terminated": {"reason": "Error", "exitCode": 2}}}
    return {"name": name, "image": image, "ready": True, "restartCount": 0,
            "containerID": f"containerd://{uuid.uuid4().hex}", "state": {"running": {}}}


def make_agent_pod(c, ns, name, labels, annotations, spec, owner=None):
    container = spec["containers"][0]
    image = container["image"]
    secret_name = next(v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v)
    secret = c["secrets"][f"{ns}/{secret_name}"]
    pod = {"kind": "Pod", "apiVersion": "v1",
           "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4()),
                        "labels": labels, "annotations": annotations,
                        "creationTimestamp": now()},
           "spec": spec, "status": {"phase": "Pending", "conditions": []}}
    if owner:
        pod["metadata"]["labels"]["job-name"] = owner
    if image in c.get("bad_images", []):
        pod["status"]["containerStatuses"] = [{
            "name": container["name"], "image": image, "ready": False,
            "state": {"waiting": {"reason": "ErrImagePull",
                                  "message": f'failed to pull and unpack image "{image}": not found'}}}]
    else:
        args = container.get("args", [])
        idle = args[args.index("--idle-timeout") + 1] if "--idle-timeout" in args else "60s"
        start_agent(c, ns, name, base64.b64decode(secret["data"]["token"]).decode(), image, idle)
        exited = image in c.get("exiting_images", [])
        pod["status"]["phase"] = "Failed" if exited else "Running"
        pod["status"]["containerStatuses"] = [running_status(container["name"], image, exited)]
        if not exited:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    c["pods"][f"{ns}/{name}"] = pod
    return pod


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z" not in f.read()
    except OSError:
        return False


def refresh(c):
    """An agent pod whose process ended has Succeeded, as the kubelet says."""
    for key_, p in c["pods"].items():
        ns, name = key_.split("/", 1)
        path = os.path.join(STATE, f"pid-{ns}-{name}")
        if not os.path.exists(path) or p["status"].get("phase") != "Running":
            continue
        with open(path) as f:
            pid = int(f.read() or 0)
        if pid and not alive(pid):
            p["status"]["phase"] = "Succeeded"
            p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
            for st in p["status"].get("containerStatuses", []):
                st["ready"] = False
                st["state"] = {"terminated": {"reason": "Completed", "exitCode": 0}}


def cmd_create(c, o):
    obj = json.loads(sys.stdin.read())
    kind = obj["kind"]
    if kind == "List":
        # SelfSubjectAccessReviews (what `auth can-i` sends), one answer a
        # line as `-o jsonpath={.status.allowed}{"\n"}` prints them.
        for item in obj["items"]:
            a = item["spec"]["resourceAttributes"]
            res = a["resource"] + (f".{a['group']}" if a.get("group") else "") + \
                (f"/{a['subresource']}" if a.get("subresource") else "")
            print("false" if forbidden(c, a["verb"], res, a.get("namespace")) else "true")
        return
    res = {"Secret": "secrets", "Job": "jobs", "Pod": "pods"}[kind]
    ns = obj["metadata"].get("namespace") or o["ns"] or "default"
    if forbidden(c, "create", res if res != "jobs" else "jobs.batch", ns):
        err(f'Error from server (Forbidden): error when creating "STDIN": {res} is forbidden: '
            f'User "tester" cannot create resource "{res}" in the namespace "{ns}"')
    level = c["namespaces"].get(ns, {}).get("metadata", {}).get("labels", {}).get(
        "pod-security.kubernetes.io/enforce", "privileged")
    if kind == "Pod" and level != "privileged":
        err(f'Error from server (Forbidden): error when creating "STDIN": pods "{obj["metadata"]["name"]}" '
            f'is forbidden: violates PodSecurity "{level}:latest": unrestricted capabilities')
    if kind == "Secret":
        # As the API server: stringData is written into data (base64).
        for k, v in obj.pop("stringData", {}).items():
            obj.setdefault("data", {})[k] = base64.b64encode(v.encode()).decode()
    obj["metadata"]["uid"] = str(uuid.uuid4())
    obj["metadata"]["creationTimestamp"] = now()
    obj["metadata"]["namespace"] = ns
    c.setdefault(res, {})[f"{ns}/{obj['metadata']['name']}"] = obj
    if kind == "Job":
        t = obj["spec"]["template"]
        make_agent_pod(c, ns, obj["metadata"]["name"] + "-x1y2z", dict(t["metadata"]["labels"]),
                       dict(t["metadata"].get("annotations", {})), t["spec"],
                       owner=obj["metadata"]["name"])
    elif kind == "Pod":
        make_agent_pod(c, ns, obj["metadata"]["name"], obj["metadata"]["labels"],
                       obj["metadata"].get("annotations", {}), obj["spec"])
    out(obj, o["o"])


def cmd_patch(c, words, o):
    res = RESOURCES[words[0]]
    ns = o["ns"] or "default"
    obj = c[res].get(f"{ns}/{words[1]}")
    if obj is None:
        err(f'Error from server (NotFound): {res} "{words[1]}" not found')
    patch = json.loads(o["patch"])
    if o["subresource"] == "ephemeralcontainers":
        if forbidden(c, "patch", "pods/ephemeralcontainers", ns):
            err('Error from server (Forbidden): pods "x" is forbidden: cannot patch '
                'resource "pods/ephemeralcontainers"')
        for e in patch["spec"]["ephemeralContainers"]:
            obj["spec"].setdefault("ephemeralContainers", []).append(e)
            token_ref = e["env"][0]["valueFrom"]["secretKeyRef"]["name"]
            token = base64.b64decode(c["secrets"][f"{ns}/{token_ref}"]["data"]["token"]).decode()
            start_agent(c, ns, obj["metadata"]["name"] + "-" + e["name"], token, e["image"])
            obj["status"].setdefault("ephemeralContainerStatuses", []).append(
                running_status(e["name"], e["image"]))
        return
    obj["metadata"].update(patch.get("metadata", {}))


def kill_agent(ns, pod):
    try:
        with open(os.path.join(STATE, f"pid-{ns}-{pod}")) as f:
            os.kill(int(f.read()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


def cmd_delete(c, words, o):
    res = RESOURCES[words[0]]
    ns = o["ns"] or "default"
    if forbidden(c, "delete", res, ns):
        err(f'Error from server (Forbidden): {res} is forbidden')
    k = f"{ns}/{words[1]}"
    c.get(res, {}).pop(k, None)
    if res == "jobs":
        for pk, p in list(c["pods"].items()):
            if p["metadata"].get("labels", {}).get("job-name") == words[1]:
                kill_agent(ns, p["metadata"]["name"])
                del c["pods"][pk]
    if res == "pods":
        kill_agent(ns, words[1])
    print(f"{res} \"{words[1]}\" deleted")


def agent_port(ns, pod, container):
    # The ephemeral agent's log is kept under POD-CONTAINER.
    for name in (f"log-{ns}-{pod}-{container}", f"log-{ns}-{pod}"):
        path = os.path.join(STATE, name)
        if os.path.exists(path):
            with open(path) as f:
                m = re.search(r"listen=127\.0\.0\.1:(\d+)", f.read())
            if m:
                return int(m.group(1)), path
            return None, path
    return None, None


def cmd_logs(words, o):
    pod = words[0]
    ns = o["ns"] or "default"
    _, path = agent_port(ns, pod, o["c"] or "")
    if path is None:
        err(f'Error from server (NotFound): pods "{pod}" not found')
    with open(path) as f:
        lines = f.read().splitlines()
    if o["tail"]:
        lines = lines[-o["tail"]:]
    print("\n".join(lines))


def cmd_port_forward(c, words, o):
    ns = o["ns"] or "default"
    pod = words[0].split("/", 1)[1]
    remote = int(words[1].lstrip(":"))
    p = c["pods"].get(f"{ns}/{pod}")
    if p is None:
        err(f'error: pods "{pod}" not found')
    container = ""
    for e in p["spec"].get("ephemeralContainers", []):
        container = e["name"]
    port, _ = agent_port(ns, pod, container)
    if port is None:
        err("error: unable to forward port because pod is not running")
    with Lock():
        count_path = os.path.join(STATE, "port-forwards")
        n = int(open(count_path).read()) if os.path.exists(count_path) else 0
        with open(count_path, "w") as f:
            f.write(str(n + 1))
    cut = int(os.environ.get("FAKE_PF_CUT_AFTER_BYTES", "0")) if n == 0 else 0
    stall = int(os.environ.get("FAKE_PF_STALL_AFTER_BYTES", "0")) if n == 0 else 0
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    print(f"Forwarding from 127.0.0.1:{ls.getsockname()[1]} -> {remote}", flush=True)
    relayed = [0]
    stalled = threading.Event()

    def pump(a, b, count):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    b.shutdown(socket.SHUT_WR)
                    return
                if count and stall and relayed[0] + len(data) > stall:
                    stalled.set()
                    while True:
                        time.sleep(3600)
                if count and cut and relayed[0] + len(data) > cut:
                    b.sendall(data[: cut - relayed[0]])
                    sys.stderr.write("E1207 portforward.go:413] an error occurred forwarding "
                                     f"{remote}: lost connection to pod\n")
                    sys.stderr.flush()
                    os._exit(1)
                b.sendall(data)
                if count:
                    relayed[0] += len(data)
        except OSError:
            pass

    while True:
        conn, _ = ls.accept()
        print(f"Handling connection for {remote}", flush=True)
        up = socket.create_connection(("127.0.0.1", port))
        threading.Thread(target=pump, args=(conn, up, False), daemon=True).start()
        threading.Thread(target=pump, args=(up, conn, True), daemon=True).start()


def main():
    argv = sys.argv[1:]
    os.makedirs(STATE, exist_ok=True)
    with open(os.path.join(STATE, "calls.log"), "a") as f:
        f.write(" ".join(argv) + "\n")
    words, o = parse_args(argv)
    if not words:
        err("error: no command")
    verb = words[0]
    if verb == "port-forward":
        with Lock():
            c = load()
        cmd_port_forward(c, words[1:], o)
        return
    if verb == "auth":
        res = words[3] + (f"/{o['subresource']}" if o["subresource"] else "")
        with Lock():
            c = load()
        if forbidden(c, words[2], res, o["ns"]):
            print("no")
            sys.exit(1)
        print("yes")
        return
    if verb == "config":
        print("default", end="")
        return
    if verb == "logs":
        cmd_logs(words[1:], o)
        return
    with Lock():
        c = load()
        if verb == "get":
            refresh(c)
            cmd_get(c, words[1:], o)
        elif verb == "create":
            cmd_create(c, o)
            save(c)
        elif verb == "patch":
            cmd_patch(c, words[1:], o)
            save(c)
        elif verb == "delete":
            cmd_delete(c, words[1:], o)
            save(c)
        else:
            err(f"error: unknown command \"{verb}\" for \"kubectl\"")


if __name__ == "__main__":
    main()
