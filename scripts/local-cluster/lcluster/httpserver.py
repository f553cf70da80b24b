"""A small HTTP/1.1 server on asyncio streams, for the API server stand-in.

Why not a framework: the API server needs three response shapes that
frameworks make awkward at once: plain responses, chunked streams that last
as long as a watch or a `logs -f`, and connections taken over after a
`101 Switching Protocols` (SPDY/3.1 and WebSocket for port-forward). Here a
handler returns a Response, or streams with Request.stream_*, or takes the
connection with Request.upgrade.

Only HTTP/1.1 is offered in TLS (ALPN "http/1.1"): Go's client (kubectl)
then never tries HTTP/2, which upgrades cannot use anyway.
"""

import asyncio
import json
import logging
import ssl
import urllib.parse

log = logging.getLogger("http")

REASONS = {
    101: "Switching Protocols", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
    304: "Not Modified", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable", 409: "Conflict",
    410: "Gone", 413: "Request Entity Too Large", 415: "Unsupported Media Type",
    422: "Unprocessable Entity", 429: "Too Many Requests", 500: "Internal Server Error",
    501: "Not Implemented", 503: "Service Unavailable", 504: "Gateway Timeout",
}

MAX_HEAD = 1 << 20
MAX_BODY = 64 << 20


class Headers:
    """Case-insensitive, multi-valued header map (insertion order kept)."""

    def __init__(self, items=()):
        self._items = []
        for k, v in items:
            self.add(k, v)

    def add(self, name, value):
        self._items.append((name, str(value)))

    def get(self, name, default=None):
        low = name.lower()
        for k, v in self._items:
            if k.lower() == low:
                return v
        return default

    def get_all(self, name):
        low = name.lower()
        return [v for k, v in self._items if k.lower() == low]

    def __contains__(self, name):
        return self.get(name) is not None

    def items(self):
        return list(self._items)


class Response:
    def __init__(self, status=200, body=b"", content_type="application/json", headers=None):
        self.status = status
        if isinstance(body, (dict, list)):
            body = json.dumps(body, separators=(",", ":")).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.body = body
        self.headers = Headers(headers or [])
        if content_type and "content-type" not in self.headers:
            self.headers.add("Content-Type", content_type)


class Request:
    def __init__(self, conn, method, target, version, headers, body):
        self.conn = conn
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.body = body
        parsed = urllib.parse.urlsplit(target)
        self.path = urllib.parse.unquote(parsed.path)
        self.raw_query = parsed.query
        self.query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        self.streaming = False
        self.upgraded = False
        self.user = None  # set by authentication

    def arg(self, name, default=None):
        vals = self.query.get(name)
        return vals[-1] if vals else default

    def json(self):
        """The body as JSON (protobuf bodies are converted, protobuf.py)."""
        if not self.body:
            return None
        ct = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ct == "application/vnd.kubernetes.protobuf":
            from . import protobuf
            return protobuf.decode(self.body)
        return json.loads(self.body)

    # -- chunked streams (watch, logs -f) ---------------------------------
    async def stream_start(self, status=200, content_type="application/json", headers=()):
        self.streaming = True
        hdrs = [("Content-Type", content_type), ("Transfer-Encoding", "chunked"),
                ("Cache-Control", "no-cache, private")] + list(headers)
        await self.conn.write_head(status, hdrs)

    async def stream_write(self, data):
        if not data:
            return
        w = self.conn.writer
        w.write(b"%x\r\n" % len(data) + data + b"\r\n")
        await w.drain()

    async def stream_end(self):
        w = self.conn.writer
        w.write(b"0\r\n\r\n")
        await w.drain()

    def client_gone(self):
        """A future done when the client closes its side (EOF or error).
        Only for streams: the connection is not read otherwise while a
        handler runs, and HTTP/1.1 clients do not pipeline."""
        return self.conn.watch_eof()

    # -- upgrades (SPDY, WebSocket) --------------------------------------
    async def upgrade(self, headers):
        """Writes the 101 response; the caller then owns conn.reader/writer."""
        self.upgraded = True
        await self.conn.write_head(101, headers)
        return self.conn.reader, self.conn.writer


class Connection:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self._eof = None

    async def write_head(self, status, headers):
        lines = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Status"))]
        for k, v in headers:
            lines.append("%s: %s" % (k, v))
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await self.writer.drain()

    def watch_eof(self):
        if self._eof is None:
            loop = asyncio.get_running_loop()
            self._eof = loop.create_future()

            async def wait():
                try:
                    while True:
                        data = await self.reader.read(65536)
                        if not data:
                            break
                except Exception:
                    pass
                if not self._eof.done():
                    self._eof.set_result(True)
            asyncio.ensure_future(wait())
        return self._eof


class BadRequest(Exception):
    pass


async def _read_request(conn):
    try:
        head = await conn.reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise BadRequest("incomplete request head")
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise BadRequest("malformed request line")
    method, target, version = parts
    headers = Headers()
    for line in lines[1:]:
        if not line:
            continue
        if ":" not in line:
            raise BadRequest("malformed header")
        k, v = line.split(":", 1)
        headers.add(k.strip(), v.strip())
    body = b""
    te = (headers.get("Transfer-Encoding") or "").lower()
    if "chunked" in te:
        chunks = []
        total = 0
        while True:
            size_line = await conn.reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                # trailers until the empty line
                while (await conn.reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            total += size
            if total > MAX_BODY:
                raise BadRequest("body too large")
            chunks.append(await conn.reader.readexactly(size))
            await conn.reader.readexactly(2)
        body = b"".join(chunks)
    else:
        length = int(headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise BadRequest("body too large")
        if length:
            body = await conn.reader.readexactly(length)
    return Request(conn, method, target, version, headers, body)


async def _write_response(conn, req, resp):
    hdrs = resp.headers.items()
    hdrs.append(("Content-Length", str(len(resp.body))))
    keep = not (req and (req.headers.get("Connection") or "").lower() == "close")
    if not keep:
        hdrs.append(("Connection", "close"))
    await conn.write_head(resp.status, hdrs)
    if req is None or req.method != "HEAD":
        conn.writer.write(resp.body)
    await conn.writer.drain()
    return keep


class Server:
    """Serves `handler(request) -> Response | None` on host:port."""

    def __init__(self, handler, ssl_context=None):
        self.handler = handler
        self.ssl_context = ssl_context
        self.server = None

    async def start(self, host, port):
        self.server = await asyncio.start_server(self._serve, host, port, ssl=self.ssl_context,
                                                 limit=MAX_HEAD)
        return self.server.sockets[0].getsockname()[1]

    async def start_unix(self, path):
        self.server = await asyncio.start_unix_server(self._serve, path, limit=MAX_HEAD)

    async def _serve(self, reader, writer):
        conn = Connection(reader, writer)
        try:
            while True:
                try:
                    req = await _read_request(conn)
                except BadRequest as e:
                    await _write_response(conn, None, Response(400, {"error": str(e)}))
                    break
                if req is None:
                    break
                try:
                    resp = await self.handler(req)
                except Exception:
                    log.exception("handler failed: %s %s", req.method, req.target)
                    if req.streaming or req.upgraded:
                        break
                    resp = Response(500, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "message": "internal error", "reason": "InternalError",
                                          "code": 500})
                if req.upgraded:
                    break
                if req.streaming:
                    # A finished stream ends the connection only if the
                    # client stopped reading; else keep-alive continues.
                    if conn._eof is not None:
                        break
                    continue
                if resp is None:
                    break
                if not await _write_response(conn, req, resp):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("connection failed")
        finally:
            try:
                writer.close()
            except Exception:
                pass


def server_ssl_context(cert, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx
