"""A TCP proxy that adds a fixed one-way delay in each direction.

Used by scripts/remote-volume.sh inside its own network namespace when the
kernel has no ``sch_netem`` (tc netem), as on the project's build machines.
Each direction is a pipeline, not stop-and-wait: a chunk read at time t is
written at t + delay, while later chunks keep arriving, so the link keeps its
bandwidth and every request/response pays the round trip, like netem's delay.

    python delay_proxy.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS [MARK]

With MARK (a file path), the proxy notes when a client's first object GET
arrives, for a benchmark of a command's start-up (benchmarks/fixedcost.py):
once ``MARK.armed`` exists, the first request that reads an object (a
``GET`` that is not a listing) removes it and writes ``time.monotonic()``
(system-wide on Linux, so comparable with the benchmark's own clock) to MARK.

With ``DELAY_PROXY_COUNT`` set to a file path, the proxy keeps in that file
the bytes the target has sent back so far (responses: headers and bodies),
as 20 decimal digits rewritten in place as they arrive: what a client
fetched from the store, for a benchmark to read before and after a run
(benchmarks/tablefilter.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

CHUNK = 256 * 1024
QUEUE = 256  # chunks in flight per direction: bounds memory, not throughput


MARK: str | None = None
COUNT_FD: int | None = None
_counted = 0


def _count(n: int) -> None:
    """Add ``n`` response bytes to the count file (one ``pwrite``: the
    proxy is one thread, and a reader sees a whole number or the previous)."""
    global _counted
    if COUNT_FD is None or not n:
        return
    _counted += n
    os.pwrite(COUNT_FD, b"%020d" % _counted, 0)


def _note_get(data: bytes, now: float) -> None:
    """Write when the first object GET arrived to MARK, if MARK.armed exists."""
    if MARK is None or not data.startswith(b"GET ") or b"list-type=" in data.split(b"\r\n", 1)[0]:
        return
    try:
        os.unlink(MARK + ".armed")  # atomic: only the first GET after arming wins
    except FileNotFoundError:
        return
    with open(MARK + ".tmp", "w") as fh:
        fh.write(repr(now))
    os.replace(MARK + ".tmp", MARK)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float,
                requests: bool = False) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE)

    async def receive() -> None:
        while True:
            data = await reader.read(CHUNK)
            if requests and MARK is not None:
                _note_get(data, time.monotonic())
            if not requests:
                _count(len(data))
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    with contextlib.suppress(ConnectionError, OSError):  # a peer went away: end quietly
        await asyncio.gather(receive(), send())


async def _handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                  host: str, port: int, delay: float) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(host, port)
    except OSError:
        client_w.close()
        return
    try:
        await asyncio.gather(_pump(client_r, server_w, delay, requests=True),
                             _pump(server_r, client_w, delay))
    finally:
        for w in (client_w, server_w):
            w.close()


async def main(listen_host: str, listen_port: int, host: str, port: int, delay_ms: float) -> None:
    delay = delay_ms / 1000.0
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, host, port, delay), listen_host, listen_port,
        limit=CHUNK, backlog=512)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    lh, lp, th, tp, ms = sys.argv[1:6]
    MARK = sys.argv[6] if len(sys.argv) > 6 else None
    if os.environ.get("DELAY_PROXY_COUNT"):
        COUNT_FD = os.open(os.environ["DELAY_PROXY_COUNT"], os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                           0o644)
        _count(0)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(lh, int(lp), th, int(tp), float(ms)))
