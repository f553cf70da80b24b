#!/usr/bin/env python3
"""Small timed clients and a streaming server for the `links` group of
bench/run.py (bench/links.py), run inside a network namespace with
`ip netns exec`. Each client prints one JSON object on stdout.

  link_probe.py new HOST PORT COUNT
      COUNT times: a new TCP connection, one HTTP GET, the whole answer;
      the time from connect() to the answer's last byte (ms), each.
  link_probe.py idle HOST PORT COUNT IDLE_S
      One keep-alive connection: a first GET, then COUNT times: IDLE_S
      seconds of silence and a GET, timed (ms) from the request to the
      answer's last byte.
  link_probe.py small HOST PORT SECONDS GAP_MS
      GETs one after another on one keep-alive connection for SECONDS, GAP_MS
      apart, each timed (ms): the small requests beside a bulk stream.
  link_probe.py gap HOST PORT SECONDS
      Connects, reads what the server streams for SECONDS; the longest
      silence between two reads (ms) and when it began (s from the start).
  link_probe.py stream PORT
      A server on 127.0.0.1:PORT that writes 1 KiB to each connection
      every millisecond (the steady stream whose silence `gap` measures).
"""
import json
import socket
import sys
import threading
import time

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def answer(sock):
    """Reads one HTTP answer with a Content-Length body (nginx's)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed before the answer's head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed in the answer's body")
        body += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"answer: {head[:60]!r}")


def connect(host, port):
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def new(host, port, count):
    times = []
    for _ in range(count):
        t0 = time.monotonic()
        s = connect(host, port)
        s.sendall(REQUEST)
        answer(s)
        times.append((time.monotonic() - t0) * 1000)
        s.close()
        time.sleep(0.1)
    return {"ms": times}


def idle(host, port, count, idle_s):
    s = connect(host, port)
    s.sendall(REQUEST)
    answer(s)
    times = []
    for _ in range(count):
        time.sleep(idle_s)
        t0 = time.monotonic()
        s.sendall(REQUEST)
        answer(s)
        times.append((time.monotonic() - t0) * 1000)
    s.close()
    return {"ms": times}


def small(host, port, seconds, gap_ms):
    s = connect(host, port)
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        s.sendall(REQUEST)
        answer(s)
        times.append((time.monotonic() - t0) * 1000)
        time.sleep(gap_ms / 1000)
    s.close()
    return {"ms": times}


def gap(host, port, seconds):
    s = connect(host, port)
    start = last = time.monotonic()
    longest, at, total = 0.0, 0.0, 0
    s.settimeout(seconds + 30)
    while True:
        chunk = s.recv(65536)
        now = time.monotonic()
        if not chunk:
            raise RuntimeError("the stream ended early")
        total += len(chunk)
        if now - last > longest:
            longest, at = now - last, last - start
        last = now
        if now - start >= seconds:
            break
    s.close()
    return {"longest_ms": longest * 1000, "at_s": at, "bytes": total}


def stream(port):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    print("ready", flush=True)

    def feed(c):
        block = b"x" * 1024
        try:
            while True:
                c.sendall(block)
                time.sleep(0.001)
        except OSError:
            c.close()
    while True:
        c, _ = srv.accept()
        threading.Thread(target=feed, args=(c,), daemon=True).start()


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "stream":
        stream(int(args[0]))
        return
    host, port = args[0], int(args[1])
    if mode == "new":
        out = new(host, port, int(args[2]))
    elif mode == "idle":
        out = idle(host, port, int(args[2]), float(args[3]))
    elif mode == "small":
        out = small(host, port, float(args[2]), float(args[3]))
    elif mode == "gap":
        out = gap(host, port, float(args[2]))
    else:
        sys.exit(f"link_probe: unknown mode {mode}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
