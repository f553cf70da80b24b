#!/usr/bin/env python3
"""N concurrent keep-alive HTTP connections, one request per second each, for
D seconds: the "1,000 idle-ish connections" load of bench/run.py. Prints
{"connections", "requests", "errors"} as JSON."""
import asyncio
import json
import resource
import sys

HOST, PORT, COUNT, DURATION = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
REQUEST = f"GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
stats = {"connections": 0, "requests": 0, "errors": 0}


async def one(i, start):
    try:
        reader, writer = await asyncio.open_connection(HOST, PORT)
    except OSError:
        stats["errors"] += 1
        return
    stats["connections"] += 1
    loop = asyncio.get_running_loop()
    # Spread the requests over the second.
    await asyncio.sleep((i % 1000) / 1000)
    try:
        while loop.time() - start < DURATION:
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            stats["requests"] += 1
            await asyncio.sleep(1)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        stats["errors"] += 1
    writer.close()


async def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, COUNT * 2 + 100)), hard))
    start = asyncio.get_running_loop().time()
    await asyncio.gather(*(one(i, start) for i in range(COUNT)))
    print(json.dumps(stats))


asyncio.run(main())
