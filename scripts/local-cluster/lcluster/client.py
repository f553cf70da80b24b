"""The node agents' client of the API server: HTTPS with a bearer token, one
connection per request (they are few), and watches read as the API sends
them (chunked, one JSON event per line)."""

import asyncio
import json
import ssl
import urllib.parse


class ApiFailure(Exception):
    def __init__(self, status, body):
        super().__init__("%s: %s" % (status, (body or {}).get("message", body)))
        self.status = status
        self.body = body or {}


class ApiClient:
    def __init__(self, server, ca, token):
        u = urllib.parse.urlsplit(server)
        self.host = u.hostname
        self.port = u.port or 443
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.set_alpn_protocols(["http/1.1"])

    async def _open(self):
        return await asyncio.open_connection(self.host, self.port, ssl=self.ctx,
                                             server_hostname=self.host, limit=16 << 20)

    def _head(self, method, path, body, content_type):
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s:%d" % (self.host, self.port),
                 "Authorization: Bearer " + self.token, "Accept: application/json",
                 "User-Agent: siphon-local-cluster-node", "Connection: close"]
        if body is not None:
            lines.append("Content-Type: " + content_type)
            lines.append("Content-Length: %d" % len(body))
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def _response_head(self, r):
        status_line = await r.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2:
            raise ConnectionError("bad response from the API server")
        status = int(parts[1])
        headers = {}
        while True:
            line = await r.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return status, headers

    async def _body(self, r, headers):
        if "chunked" in headers.get("transfer-encoding", ""):
            out = b""
            while True:
                size = int((await r.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await r.readline()
                    return out
                out += await r.readexactly(size)
                await r.readexactly(2)
        n = int(headers.get("content-length", "0"))
        return await r.readexactly(n) if n else b""

    async def request(self, method, path, obj=None, content_type="application/json",
                      timeout=30):
        body = None if obj is None else (obj if isinstance(obj, bytes) else
                                         json.dumps(obj).encode())
        r, w = await self._open()
        try:
            w.write(self._head(method, path, body, content_type) + (body or b""))
            await w.drain()
            status, headers = await asyncio.wait_for(self._response_head(r), timeout)
            data = await asyncio.wait_for(self._body(r, headers), timeout)
        finally:
            w.close()
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"message": data.decode(errors="replace")}
        if status >= 300:
            raise ApiFailure(status, parsed)
        return parsed

    async def get(self, path):
        return await self.request("GET", path)

    async def watch(self, path):
        """Yields (type, object) until the server ends the watch."""
        r, w = await self._open()
        try:
            w.write(self._head("GET", path, None, None))
            await w.drain()
            status, headers = await self._response_head(r)
            if status != 200:
                raise ApiFailure(status, json.loads(await self._body(r, headers) or b"{}"))
            buf = b""
            while True:
                size = int((await r.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                buf += await r.readexactly(size)
                await r.readexactly(2)
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        ev = json.loads(line)
                        yield ev.get("type"), ev.get("object")
        finally:
            w.close()
