"""The `handover` group of bench/run.py: the pause a handover causes
(docs/CONTINUITY.md, "Handover"), beside the pause of a transport cut and
resume, in the same run (bench/README.md, "Handover").

  client ns ── pod ns (nginx :80, a port 8092 nobody serves)
                  │ (sk_lookup steal of 80 and 8092)
  node ns: siphon-agent --handover-socket (then a new one --take-over),
           siphon steal 80 -> nginx :8080, 8092 -> a 1 KiB/ms stream server

Each repetition, for each event (a handover; a cut: `ss -K` of the CLI's
connection to the agent; none): a stolen stream read from the client
namespace for 6 s, and small GETs 5 ms apart on a stolen keep-alive
connection beside it; the event 2.5 s in. Reported: the stream's longest
silence, and the requests' p99 and worst, per event.
"""
import json
import os
import re
import subprocess
import threading
import time

from links import pct  # the same percentile as the links group

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "link_probe.py")
PY = "/usr/bin/python3"
STREAM_PORT = 18093  # the stream server, in the node namespace
SECONDS = 6
EVENT_AT = 2.5


class Handover:
    def __init__(self, bench, log, sh, summary):
        self.b = bench
        self.log = log
        self.sh = sh
        self.summary = summary

    def start_agent(self, socket, take_over=False):
        b = self.b
        argv = [b.agent_bin, "--listen", "127.0.0.1:0", "--token-file", b.token_file,
                "--first-client-timeout", "0", "--log-level", "info", "--handover-socket", socket]
        if take_over:
            # The old agent's listener: the same address.
            argv[2] = self.endpoint
            argv += ["--take-over", socket]
        argv += ["targeted", "--pid", b.pod_pid()]
        p = b.procs.start(argv, netns=b.node, stdout=subprocess.PIPE,
                          stderr=open(os.path.join(b.tmp, "handover-agents.log"), "a"), text=True)
        line = p.stdout.readline()
        m = re.search(r"listen=(\S+)", line)
        if not m:
            raise RuntimeError(f"agent: no ready line ({line!r}); see handover-agents.log")
        return p, m.group(1)

    def run(self):
        b = self.b
        socket = os.path.join(b.tmp, "handover.sock")
        stream = b.procs.start([PY, PROBE, "stream", STREAM_PORT], netns=b.node,
                               stdout=subprocess.PIPE, text=True)
        if stream.stdout.readline().strip() != "ready":
            raise RuntimeError("the stream server did not start")
        agent, self.endpoint = self.start_agent(socket)
        steal = b.start_cli(self.endpoint, "handover-steal", r"stealing port 8092",
                            "steal", "--port", 80, "--to", "127.0.0.1:8080",
                            "--port", 8092, "--to", f"127.0.0.1:{STREAM_PORT}")[0]
        silence = {"handover": [], "cut": [], "none": []}
        p99 = {"handover": [], "cut": [], "none": []}
        worst = {"handover": [], "cut": [], "none": []}
        took = []
        try:
            for rep in range(b.reps):
                for event in ("handover", "cut", "none"):
                    result = {}

                    def read_stream():
                        result["gap"] = self.probe("gap", b.pod_ip, 8092, SECONDS)

                    def requests():
                        result["small"] = self.probe("small", b.pod_ip, 80, SECONDS, 5)

                    threads = [threading.Thread(target=read_stream),
                               threading.Thread(target=requests)]
                    for t in threads:
                        t.start()
                    time.sleep(EVENT_AT)
                    if event == "handover":
                        t0 = time.monotonic()
                        old = agent
                        agent, _ = self.start_agent(socket, take_over=True)
                        old.wait(timeout=30)
                        if old.returncode != 0:
                            raise RuntimeError(f"the old agent exited {old.returncode}")
                        took.append((time.monotonic() - t0) * 1000)
                    elif event == "cut":
                        port = self.endpoint.rsplit(":", 1)[1]
                        self.sh("ss", "-K", "-t", "state", "established", "dst", "127.0.0.1",
                                "dport", "=", f":{port}", netns=b.node)
                    for t in threads:
                        t.join(timeout=SECONDS + 60)
                    if "gap" not in result or "small" not in result:
                        raise RuntimeError(f"{event}: a probe failed (see the log above)")
                    silence[event].append(result["gap"]["longest_ms"])
                    p99[event].append(pct(result["small"]["ms"], 0.99))
                    worst[event].append(max(result["small"]["ms"]))
                    self.log(f"handover rep {rep + 1}/{b.reps} {event}: silence "
                             f"{silence[event][-1]:.1f} ms, requests p99 {p99[event][-1]:.1f} "
                             f"ms, worst {worst[event][-1]:.1f} ms")
        finally:
            b.procs.stop(steal)
            b.procs.stop(agent)
            b.procs.stop(stream)
        b.record("handover: a stolen stream's longest silence", "ms",
                 {"siphon": self.summary(silence["handover"]),
                  "baseline": self.summary(silence["cut"]), "none": self.summary(silence["none"])},
                 {"baseline": None},
                 {"note": "siphon: across a handover (new agent started to old agent gone: "
                          f"median {sorted(took)[len(took) // 2]:.0f} ms); baseline: across ss -K "
                          "of the CLI's connection and its resume; untouched: median "
                          f"{sorted(silence['none'])[len(silence['none']) // 2]:.1f} ms"})
        b.record("handover: small requests beside it, p99", "ms",
                 {"siphon": self.summary(p99["handover"]), "baseline": self.summary(p99["cut"]),
                  "none": self.summary(p99["none"])},
                 {"baseline": None},
                 {"note": "GETs 5 ms apart on one stolen keep-alive connection for 6 s; "
                          "baseline: across a cut; untouched: median "
                          f"{sorted(p99['none'])[len(p99['none']) // 2]:.2f} ms; worst "
                          f"request: handover {max(worst['handover']):.1f}, cut "
                          f"{max(worst['cut']):.1f}, none {max(worst['none']):.1f} ms"})

    def probe(self, *args):
        r = self.sh(PY, PROBE, *args, netns=self.b.client, timeout=SECONDS + 60)
        return json.loads(r.stdout)
