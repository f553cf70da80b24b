"""The streaming protocols of port-forward: SPDY/3.1 (the framing of the
SPDY draft 3 specification, header blocks compressed with zlib and its
fixed dictionary), WebSocket (RFC 6455, server side) carrying that same
SPDY byte stream (the "SPDY/3.1+portforward.k8s.io" subprotocol kubectl
1.31+ tries first), and the port-forward protocol on top: per forwarded
connection the client opens an "error" stream then a "data" stream, both
with headers streamType, port and requestID.

Flow control: SPDY/3.1 defines windows, but the peers Kubernetes uses
(spdystream) neither send WINDOW_UPDATE frames nor honour them; neither do
we. Pings from the client are echoed.
"""

import asyncio
import base64
import hashlib
import logging
import ssl
import struct
import time
import zlib

log = logging.getLogger("streams")

# The SPDY/3 header compression dictionary: the spec's list of
# length-prefixed words, then its tail of status lines, dates and types.
_WORDS = ("options head post put delete trace accept accept-charset accept-encoding "
          "accept-language accept-ranges age allow authorization cache-control connection "
          "content-base content-encoding content-language content-length content-location "
          "content-md5 content-range content-type date etag expect expires from host if-match "
          "if-modified-since if-none-match if-range if-unmodified-since last-modified location "
          "max-forwards pragma proxy-authenticate proxy-authorization range referer retry-after "
          "server te trailer transfer-encoding upgrade user-agent vary via warning "
          "www-authenticate method get status").split() + [
              "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive",
              "origin"]
_TAIL = ("100101201202205206300302303304305306307402405406407408409410411412413414415416417502"
         "504505203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad "
         "Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not "
         "Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec "
         "00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,"
         "image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,public"
         "privatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
SPDY_DICT = b"".join(struct.pack(">I", len(w)) + w.encode() for w in _WORDS) + _TAIL.encode()
assert len(SPDY_DICT) == 1423

SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = \
    1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
MAX_DATA = 32 * 1024


class ProtocolError(Exception):
    pass


class SpdyStream:
    def __init__(self, session, sid, headers):
        self.session = session
        self.id = sid
        self.headers = headers
        self._in = asyncio.Queue()
        self.remote_closed = False
        self.local_closed = False

    def header(self, name):
        return self.headers.get(name.lower(), "")

    async def read(self):
        """The next bytes the peer sent; b"" once it finished (FIN or reset)."""
        if self.remote_closed and self._in.empty():
            return b""
        data = await self._in.get()
        return data

    def _feed(self, data, fin):
        if self.remote_closed:
            return
        if data:
            self._in.put_nowait(data)
        if fin:
            self.remote_closed = True
            self._in.put_nowait(b"")

    async def write(self, data):
        if self.local_closed:
            return
        for i in range(0, len(data), MAX_DATA):
            await self.session.send_data(self.id, data[i:i + MAX_DATA], 0)

    async def close(self):
        """Half-closes: FIN with an empty data frame."""
        if self.local_closed:
            return
        self.local_closed = True
        await self.session.send_data(self.id, b"", FLAG_FIN)

    def _reset(self):
        self.local_closed = True
        self._feed(b"", True)


class SpdySession:
    """Server side of a SPDY/3.1 connection over (reader, writer), where
    reader has readexactly() and writer has write()/drain()/close().
    on_stream(stream) is called (as a task) for each stream the peer opens,
    after the SYN_REPLY is sent."""

    def __init__(self, reader, writer, on_stream, idle_timeout=None):
        self.reader = reader
        self.writer = writer
        self.on_stream = on_stream
        # Like the kubelet's streamingConnectionIdleTimeout: a session
        # with no data either way for this long is closed.
        self.idle_timeout = idle_timeout
        self.last_activity = time.monotonic()
        self.streams = {}
        self._inflate = zlib.decompressobj(zdict=SPDY_DICT)
        self._deflate = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, 15, 8,
                                         zlib.Z_DEFAULT_STRATEGY, SPDY_DICT)
        self._wlock = asyncio.Lock()
        self.closed = False
        self.tasks = set()

    async def _send(self, frame):
        async with self._wlock:
            if self.closed:
                return
            self.writer.write(frame)
            await self.writer.drain()

    async def send_control(self, ftype, flags, payload):
        head = struct.pack(">HHI", 0x8000 | 3, ftype, (flags << 24) | len(payload))
        await self._send(head + payload)

    async def send_data(self, sid, data, flags):
        self.last_activity = time.monotonic()
        head = struct.pack(">II", sid & 0x7FFFFFFF, (flags << 24) | len(data))
        await self._send(head + data)

    def _encode_headers(self, headers):
        raw = struct.pack(">I", len(headers))
        for k, v in headers.items():
            kb, vb = k.lower().encode(), v.encode()
            raw += struct.pack(">I", len(kb)) + kb + struct.pack(">I", len(vb)) + vb
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def _decode_headers(self, block):
        raw = self._inflate.decompress(block)
        if len(raw) < 4:
            raise ProtocolError("short header block")
        n = struct.unpack(">I", raw[:4])[0]
        pos = 4
        out = {}
        for _ in range(n):
            ln = struct.unpack(">I", raw[pos:pos + 4])[0]
            name = raw[pos + 4:pos + 4 + ln].decode()
            pos += 4 + ln
            lv = struct.unpack(">I", raw[pos:pos + 4])[0]
            value = raw[pos + 4:pos + 4 + lv].decode()
            pos += 4 + lv
            # Several values of one header are NUL-separated; the first is
            # all port-forward needs.
            out[name.lower()] = value.split("\x00")[0]
        return out

    async def _watchdog(self):
        while not self.closed:
            left = self.last_activity + self.idle_timeout - time.monotonic()
            if left <= 0:
                log.info("spdy session idle for %ss: closing it", self.idle_timeout)
                await self.goaway()
                self.closed = True
                try:
                    self.writer.close()
                except Exception:
                    pass
                return
            await asyncio.sleep(min(left, 1.0))

    async def run(self):
        watchdog = asyncio.ensure_future(self._watchdog()) if self.idle_timeout else None
        try:
            while True:
                head = await self.reader.readexactly(8)
                w1, w2 = struct.unpack(">II", head)
                # Data and new streams are activity; pings are not (kubectl
                # pings an idle port-forward to keep it open).
                if not w1 & 0x80000000 or (w1 & 0xFFFF) == SYN_STREAM:
                    self.last_activity = time.monotonic()
                flags, length = w2 >> 24, w2 & 0xFFFFFF
                payload = await self.reader.readexactly(length) if length else b""
                if w1 & 0x80000000:
                    ftype = w1 & 0xFFFF
                    await self._control(ftype, flags, payload)
                else:
                    st = self.streams.get(w1 & 0x7FFFFFFF)
                    if st is not None:
                        st._feed(payload, bool(flags & FLAG_FIN))
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, zlib.error,
                ssl.SSLError, OSError) as e:
            if not isinstance(e, asyncio.IncompleteReadError) and not self.closed:
                log.info("spdy session ends: %s", e)
        finally:
            if watchdog:
                watchdog.cancel()
            self.closed = True
            for st in list(self.streams.values()):
                st._reset()
            for t in list(self.tasks):
                t.cancel()
            try:
                self.writer.close()
            except Exception:
                pass

    async def _control(self, ftype, flags, p):
        if ftype == SYN_STREAM:
            sid = struct.unpack(">I", p[:4])[0] & 0x7FFFFFFF
            headers = self._decode_headers(p[10:])
            st = SpdyStream(self, sid, headers)
            self.streams[sid] = st
            await self.send_control(SYN_REPLY, 0, struct.pack(">I", sid) + self._encode_headers({}))
            if flags & FLAG_FIN:
                st._feed(b"", True)
            t = asyncio.ensure_future(self.on_stream(st))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        elif ftype == RST_STREAM:
            sid = struct.unpack(">I", p[:4])[0] & 0x7FFFFFFF
            st = self.streams.pop(sid, None)
            if st:
                st._reset()
        elif ftype == PING:
            await self.send_control(PING, 0, p)
        elif ftype == GOAWAY:
            raise ProtocolError("peer went away")
        elif ftype == HEADERS:
            self._decode_headers(p[4:])  # keeps the zlib context in step
        elif ftype in (SETTINGS, WINDOW_UPDATE, SYN_REPLY):
            if ftype == SYN_REPLY:
                self._decode_headers(p[4:])
        else:
            log.info("ignoring SPDY control frame type %d", ftype)

    async def goaway(self):
        try:
            await self.send_control(GOAWAY, 0, struct.pack(">II", 0, 0))
        except Exception:
            pass


# -- WebSocket (RFC 6455), server side -------------------------------------------

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def ws_accept(key):
    return base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()


def ws_frame_head(op, n):
    """The header of a final, unmasked frame (a server's) of opcode `op`
    carrying `n` bytes."""
    if n < 126:
        return struct.pack(">BB", 0x80 | op, n)
    if n < 65536:
        return struct.pack(">BBH", 0x80 | op, 126, n)
    return struct.pack(">BBQ", 0x80 | op, 127, n)


async def ws_read_frame(reader):
    """One frame from `reader`: (fin, opcode, payload unmasked)."""
    b0, b1 = await reader.readexactly(2)
    ln = b1 & 0x7F
    if ln == 126:
        ln = struct.unpack(">H", await reader.readexactly(2))[0]
    elif ln == 127:
        ln = struct.unpack(">Q", await reader.readexactly(8))[0]
    mask = await reader.readexactly(4) if b1 & 0x80 else None
    data = await reader.readexactly(ln) if ln else b""
    if mask:
        data = _unmask(data, mask)
    return bool(b0 & 0x80), b0 & 0x0F, data


class WebSocketStream:
    """A byte stream over WebSocket binary messages: readexactly() reads the
    concatenated payloads, write() sends one binary message per call."""

    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False
        self._wlock = asyncio.Lock()

    async def _next_frame(self):
        _, op, data = await ws_read_frame(self.reader)
        return op, data

    async def _fill(self):
        while True:
            op, data = await self._next_frame()
            if op in (0, 1, 2):
                self.buf += data
                return
            if op == 8:
                await self._frame(8, data[:2] if len(data) >= 2 else b"")
                self.eof = True
                raise asyncio.IncompleteReadError(b"", None)
            if op == 9:
                await self._frame(10, data)

    async def readexactly(self, n):
        while len(self.buf) < n:
            if self.eof:
                raise asyncio.IncompleteReadError(bytes(self.buf), n)
            await self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def _frame(self, op, data):
        async with self._wlock:
            self.writer.write(ws_frame_head(op, len(data)) + data)
            await self.writer.drain()

    def write(self, data):
        # SpdySession calls write() then drain(); keep the order by queueing
        # the frame through a task chained on the lock.
        self._pending = asyncio.ensure_future(self._frame(2, bytes(data)))

    async def drain(self):
        await self._pending

    def close(self):
        try:
            self.writer.write(struct.pack(">BBH", 0x88, 2, 1000))
            self.writer.close()
        except Exception:
            pass


def _unmask(data, mask):
    n = len(data)
    m = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")


# -- port-forward ----------------------------------------------------------------

class PortForwardError(Exception):
    pass


async def serve_portforward(reader, writer, dial, describe, idle_timeout=None):
    """Runs port-forward over an upgraded connection. dial(port) returns
    (reader, writer) of a connection to the port inside the pod, or raises
    PortForwardError; describe is "pod NAME, uid UID" for error messages."""
    pairs = {}

    async def on_stream(st):
        rid = st.header("requestID") or str(st.id)
        kind = st.header("streamType")
        pair = pairs.setdefault(rid, {})
        pair[kind] = st
        if kind == "error":
            return
        if kind != "data":
            await st.close()
            return
        for _ in range(300):
            if "error" in pair:
                break
            await asyncio.sleep(0.1)
        err = pair.get("error")
        try:
            await _forward(st, err, dial, describe)
        finally:
            pairs.pop(rid, None)

    session = SpdySession(reader, writer, on_stream, idle_timeout)
    await session.run()


async def _forward(data, err, dial, describe):
    try:
        port = int(data.header("port"))
    except ValueError:
        port = 0
    try:
        if not 0 < port < 65536:
            raise PortForwardError("invalid port %r" % data.header("port"))
        pr, pw = await dial(port)
    except PortForwardError as e:
        msg = "error forwarding port %d to %s: %s" % (port, describe, e)
        if err is not None:
            await err.write(msg.encode())
            await err.close()
        await data.close()
        return

    async def up():
        # client -> pod
        try:
            while True:
                chunk = await data.read()
                if not chunk:
                    break
                pw.write(chunk)
                await pw.drain()
            if pw.can_write_eof():
                pw.write_eof()
        except (ConnectionError, OSError):
            pass

    up_task = asyncio.ensure_future(up())
    try:
        while True:
            chunk = await pr.read(65536)
            if not chunk:
                break
            await data.write(chunk)
    except (ConnectionError, OSError):
        pass
    finally:
        await data.close()
        if err is not None:
            await err.close()
        up_task.cancel()
        try:
            pw.close()
        except Exception:
            pass
