"""Entry points: `python3 -m lcluster apiserver ...`, `... node ...`, and the
script's helpers (`nodes`, `node-lost`, `node-back`)."""

import argparse
import asyncio
import logging
import os
import signal
import sys


def _logging(verbose):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)


async def run_apiserver(args):
    from . import apiserver, auth, bootstrap, controllers, httpserver, store
    from . import resources
    st = store.Store()
    if args.data and os.path.exists(args.data):
        st.load(args.data, resources.BY_KEY)
    tokens = auth.load_tokens(args.tokens)
    api = apiserver.ApiServer(st, tokens, "")
    api.stream_idle_timeout = args.stream_idle_timeout
    bootstrap.load(api.registry)
    srv = httpserver.Server(api.handle, httpserver.server_ssl_context(args.cert, args.key))
    port = await srv.start(args.host, args.port)
    api.address = "%s:%d" % (args.host, port)
    cm = controllers.ControllerManager(st, api.registry)
    task = asyncio.ensure_future(cm.run())
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.replace(tmp, args.port_file)
    logging.getLogger("apiserver").info("serving on https://%s", api.address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.data:
        async def saver():
            # The objects survive a restart of the API server (not of the
            # cluster: `down` removes the file).
            while True:
                await asyncio.sleep(1)
                if st.rv != getattr(st, "saved_rv", None):
                    st.save(args.data)
        saving = asyncio.ensure_future(saver())
    await stop.wait()
    task.cancel()
    if args.data:
        saving.cancel()
        st.save(args.data)


async def run_nodes(args):
    """Prints "NAME READY|NOTREADY UNSCHEDULABLE?" per node (for the script)."""
    from .client import ApiClient
    with open(args.token_file) as f:
        api = ApiClient(args.server, args.ca, f.read().strip())
    lst = await api.get("/api/v1/nodes")
    for n in lst.get("items") or []:
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in (n.get("status") or {}).get("conditions") or [])
        print(n["metadata"]["name"], "Ready" if ready else "NotReady",
              "SchedulingDisabled" if (n.get("spec") or {}).get("unschedulable") else "")


UNREACHABLE = "node.kubernetes.io/unreachable"


async def run_node_lost(args):
    """What the node lifecycle controller writes once a node stopped
    posting its status for its grace period (40 s): the node's conditions
    Unknown, its pods not Ready, the unreachable taints (NoSchedule, and
    NoExecute for the taint manager)."""
    from . import errors
    from .client import ApiClient
    with open(args.token_file) as f:
        api = ApiClient(args.server, args.ca, f.read().strip())
    path = "/api/v1/nodes/" + args.name
    now = errors.rfc3339()
    node = await api.get(path)
    for c in (node.get("status") or {}).get("conditions") or []:
        c.update({"status": "Unknown", "reason": "NodeStatusUnknown",
                  "message": "Kubelet stopped posting node status.", "lastTransitionTime": now})
    await api.request("PUT", path + "/status", node)
    node = await api.get(path)
    taints = [t for t in (node["spec"].get("taints") or []) if t.get("key") != UNREACHABLE]
    taints += [{"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now},
               {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}]
    node["spec"]["taints"] = taints
    await api.request("PUT", path, node)
    pods = await api.get("/api/v1/pods?fieldSelector=spec.nodeName%3D" + args.name)
    for p in pods.get("items") or []:
        st = p.get("status") or {}
        if st.get("phase") in ("Succeeded", "Failed"):
            continue
        for c in st.get("conditions") or []:
            if c["type"] in ("Ready", "ContainersReady") and c.get("status") != "False":
                c.update({"status": "False", "lastTransitionTime": now})
        try:
            await api.request("PUT", "/api/v1/namespaces/%s/pods/%s/status" % (
                p["metadata"]["namespace"], p["metadata"]["name"]), p)
        except Exception as e:  # deleted meanwhile
            print("pod %s: %s" % (p["metadata"]["name"], e), file=sys.stderr)


async def run_node_back(args):
    """The node lifecycle controller's side of a node that answers again:
    the unreachable taints go (the node agent itself reports Ready)."""
    from .client import ApiClient
    with open(args.token_file) as f:
        api = ApiClient(args.server, args.ca, f.read().strip())
    path = "/api/v1/nodes/" + args.name
    node = await api.get(path)
    node["spec"]["taints"] = [t for t in node["spec"].get("taints") or []
                              if t.get("key") != UNREACHABLE]
    if not node["spec"]["taints"]:
        del node["spec"]["taints"]
    await api.request("PUT", path, node)


async def run_node(args):
    from . import node
    n = node.Node(args)
    await n.run()


def main(argv=None):
    p = argparse.ArgumentParser(prog="lcluster")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("apiserver")
    a.add_argument("--host", default="127.0.0.1")
    a.add_argument("--port", type=int, default=0)
    a.add_argument("--port-file")
    a.add_argument("--tokens", required=True)
    a.add_argument("--cert", required=True)
    a.add_argument("--key", required=True)
    a.add_argument("--data", help="file the objects are kept in across restarts")
    a.add_argument("--stream-idle-timeout", type=float, default=4 * 3600.0,
                   help="seconds a port-forward session may stay idle (the kubelet's 4 h)")
    a.add_argument("-v", "--verbose", action="store_true")
    n = sub.add_parser("node")
    n.add_argument("--name", required=True)
    n.add_argument("--dir", required=True, help="the node's directory")
    n.add_argument("--server", required=True, help="https://HOST:PORT of the API server")
    n.add_argument("--ca", required=True)
    n.add_argument("--token-file", required=True)
    n.add_argument("--pod-cidr", required=True, help="e.g. 10.244.1.0/24")
    n.add_argument("--cluster-cidr", required=True, help="e.g. 10.244.0.0/16")
    n.add_argument("--bridge", required=True)
    n.add_argument("--containerd-socket", required=True)
    n.add_argument("--cgroup-parent", required=True)
    n.add_argument("-v", "--verbose", action="store_true")
    q = sub.add_parser("nodes")
    q.add_argument("--server", required=True)
    q.add_argument("--ca", required=True)
    q.add_argument("--token-file", required=True)
    q.add_argument("-v", "--verbose", action="store_true")
    for cmd in ("node-lost", "node-back"):
        q = sub.add_parser(cmd)
        q.add_argument("--name", required=True)
        q.add_argument("--server", required=True)
        q.add_argument("--ca", required=True)
        q.add_argument("--token-file", required=True)
        q.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    _logging(args.verbose)
    if args.cmd == "apiserver":
        asyncio.run(run_apiserver(args))
    elif args.cmd == "nodes":
        asyncio.run(run_nodes(args))
    elif args.cmd == "node-lost":
        asyncio.run(run_node_lost(args))
    elif args.cmd == "node-back":
        asyncio.run(run_node_back(args))
    else:
        asyncio.run(run_node(args))


if __name__ == "__main__":
    main()
