"""`kubectl exec`: the remote command protocols between the client and the
API server, and the framing between the API server and a node.

Client side (what kubectl 1.32 speaks):
- WebSocket, subprotocol v5.channel.k8s.io (v4 accepted): binary
  messages [stream id][data] with ids 0 stdin, 1 stdout, 2 stderr, 3 error,
  4 resize; v5 adds [255][id], the client closing a stream (stdin's EOF).
  Pings are answered (kubectl drops a connection that goes 61 s without a
  pong).
- SPDY/3.1, X-Stream-Protocol-Version v4.channel.k8s.io: one stream per
  kind (header streamType: error, stdin, stdout, stderr, resize).
In both, the end is a Status on the error stream: Success, or Failure with
reason NonZeroExitCode and the exit code as a cause, which kubectl turns
into its own exit code.

Node side (kubelet.sock, after the JSON request line and answer): frames
[channel u8][length u32 big-endian][data], the same channel numbers; the
node sends channel 3 once with {"exitCode": N} or {"error": "..."}.
"""

import asyncio
import json
import struct

from .streams import SpdySession, ws_frame_head, ws_read_frame

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


async def write_frame(writer, chan, data=b""):
    writer.write(struct.pack(">BI", chan, len(data)) + data)
    await writer.drain()


async def read_frame(reader):
    head = await reader.readexactly(5)
    chan, n = struct.unpack(">BI", head)
    return chan, (await reader.readexactly(n) if n else b"")


def status_for(result, command):
    if "error" in result:
        return {"metadata": {}, "status": "Failure", "message": result["error"],
                "reason": "InternalError", "code": 500}
    code = result.get("exitCode", 0)
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": "command terminated with non-zero exit code: error executing command "
                       "%s, exit code %d" % (json.dumps(command), code),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


# -- WebSocket ---------------------------------------------------------------------

class _Ws:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.lock = asyncio.Lock()

    async def send(self, op, data):
        async with self.lock:
            self.writer.write(ws_frame_head(op, len(data)) + data)
            await self.writer.drain()

    async def recv(self):
        """The next data message (ping answered, close returns None)."""
        buf = b""
        while True:
            fin, op, data = await ws_read_frame(self.reader)
            if op == 9:
                await self.send(10, data)
                continue
            if op == 10:
                continue
            if op == 8:
                return None
            buf += data
            if fin:
                return buf


async def serve_ws(reader, writer, node_r, node_w, command, v5):
    ws = _Ws(reader, writer)

    async def from_client():
        try:
            while True:
                msg = await ws.recv()
                if msg is None:
                    break
                if not msg:
                    continue
                chan, data = msg[0], msg[1:]
                if chan == CLOSE and v5:
                    if data[:1] == bytes([STDIN]):
                        await write_frame(node_w, CLOSE)
                elif chan in (STDIN, RESIZE) and data:
                    await write_frame(node_w, chan, data)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass

    up = asyncio.ensure_future(from_client())
    result = {"error": "the node closed the stream"}
    try:
        while True:
            chan, data = await read_frame(node_r)
            if chan in (STDOUT, STDERR):
                await ws.send(2, bytes([chan]) + data)
            elif chan == ERROR:
                result = json.loads(data)
                break
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    try:
        await ws.send(2, bytes([ERROR]) + json.dumps(status_for(result, command)).encode())
        await ws.send(8, struct.pack(">H", 1000))
    except (ConnectionError, OSError):
        pass
    up.cancel()


# -- SPDY ----------------------------------------------------------------------------

async def serve_spdy(reader, writer, node_r, node_w, command, want):
    """want: the stream types the client will open (error always)."""
    streams = {}
    ready = asyncio.Event()

    async def on_stream(st):
        streams[st.header("streamType")] = st
        if set(want) <= set(streams):
            ready.set()
        if st.header("streamType") in ("stdin", "resize"):
            chan = STDIN if st.header("streamType") == "stdin" else RESIZE
            while True:
                data = await st.read()
                if not data:
                    break
                await write_frame(node_w, chan, data)
            if chan == STDIN:
                await write_frame(node_w, CLOSE)

    session = SpdySession(reader, writer, on_stream)
    runner = asyncio.ensure_future(session.run())
    try:
        await asyncio.wait_for(ready.wait(), 30)
    except asyncio.TimeoutError:
        runner.cancel()
        return
    result = {"error": "the node closed the stream"}
    try:
        while True:
            chan, data = await read_frame(node_r)
            if chan == STDOUT and "stdout" in streams:
                await streams["stdout"].write(data)
            elif chan == STDERR and "stderr" in streams:
                await streams["stderr"].write(data)
            elif chan == ERROR:
                result = json.loads(data)
                break
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    err = streams.get("error")
    if err is not None:
        st = status_for(result, command)
        if st["status"] != "Success":
            await err.write(json.dumps(st).encode())
    for s in streams.values():
        await s.close()
    await session.goaway()
    await asyncio.sleep(0.1)
    runner.cancel()
