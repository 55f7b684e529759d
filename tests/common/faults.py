"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the moto server.

It forwards every request and, for a chosen share of object GETs, damages the
response mid-body the ways a network does:

* ``reset``: half the body, then a TCP reset (``SO_LINGER`` 0);
* ``stall``: half the body, then nothing more while the connection stays
  open, until the client gives up (closes it) or :attr:`Faults.max_stall`
  seconds pass;
* ``flip``: the whole body with one byte inverted (in the middle, moved on
  by 7 bytes each time the same key is hit).

The choice is deterministic: GET number ``n`` (counted from 1, listings
excluded) is faulted when ``floor(n * share)`` steps up, so N GETs get
``floor(N * share)`` faults whatever the order the requests arrive in. A key
is faulted at most :attr:`Faults.per_key` times (a fault due on a key hit
enough goes to the next GET), so no file can fail every retry: the tests
stay bounded and never flaky.

``etags="kms"`` serves every ETag (GET, HEAD, listings) as the MD5 of the
real one: 32 hex digits that are not the body's MD5, as an SSE-KMS bucket
answers. Counts of what it did are in :attr:`Faults.done`; how long each stall
was held before the client closed it is in :attr:`Faults.stalls`.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

__all__ = ["FAULTS", "Faults", "fault_proxy", "faulty"]

FAULTS = ("reset", "stall", "flip")
_ETAG = re.compile(r'(&quot;|")([0-9a-f]{32})(-\d+)?(&quot;|")')


class Faults:
    """What the proxy does (set by a test) and what it did (read by it)."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.kind = ""
        """The fault to inject (one of :data:`FAULTS`), '' for none."""
        self.share = 0.0
        """The share of object GETs faulted."""
        self.per_key = 1
        """Faults of one key at most."""
        self.prefix = ""
        """Only GETs of keys under this prefix (bucket/key...) count; '' for all."""
        self.max_stall = 30.0
        """A stall ends (the proxy closes the connection) after this many seconds."""
        self.etags = ""
        """``"kms"``: serve ETags that are not MD5s of the bodies."""
        self.gets = 0
        """Object GETs seen (counted toward the share)."""
        self._owed = 0
        self.done: Counter[str] = Counter()
        """Faults injected, by kind."""
        self.faulted: Counter[str] = Counter()
        """Faults injected, by key."""
        self.stalls: list[float] = []
        """Seconds each stall held its connection before the client closed it."""
        self.stalled_now = 0
        self.release = threading.Event()
        """Setting it ends every stall (at teardown)."""
        self._lock = threading.Lock()

    def set(self, kind: str, share: float, *, prefix: str = "", per_key: int = 1) -> Faults:
        """Fault ``share`` of the GETs under ``prefix`` with ``kind``; counts restart."""
        if kind and kind not in FAULTS:
            raise ValueError(f"kind must be one of {FAULTS}, got {kind!r}")
        with self._lock:
            self.kind, self.share, self.prefix, self.per_key = kind, share, prefix, per_key
            self.gets = 0
            self._owed = 0
            self.done.clear()
            self.faulted.clear()
            self.stalls.clear()
        return self

    def choose(self, method: str, path: str) -> tuple[str, int]:
        """The fault for this request ('' for none), and how many times its
        key was faulted before."""
        parts = urlsplit(path)
        if method != "GET" or "list-type" in parse_qs(parts.query) or not self.kind:
            return "", 0
        key = unquote(parts.path).lstrip("/")  # obstore escapes GCS and Azure keys
        if self.prefix and not key.startswith(self.prefix):
            return "", 0
        with self._lock:
            self.gets += 1
            n = self.gets
            if int(n * self.share) != int((n - 1) * self.share):
                self._owed += 1
            if not self._owed or self.faulted[key] >= self.per_key:
                return "", 0  # a fault due on a key hit enough goes to the next GET
            self._owed -= 1
            self.faulted[key] += 1
            self.done[self.kind] += 1
            return self.kind, self.faulted[key] - 1

    def etag(self, value: str) -> str:
        """An ETag as served: unchanged, or (``kms``) not an MD5 of the body."""
        if self.etags != "kms":
            return value

        def swap(m: re.Match[str]) -> str:
            fake = hashlib.md5(m.group(2).encode()).hexdigest()
            return f"{m.group(1)}{fake}{m.group(3) or ''}{m.group(4)}"

        return _ETAG.sub(swap, value)


def _client_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _handler(faults: Faults) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, *args: object) -> None:
            pass

        def _upstream(self, method: str, body: bytes | None,
                      headers: dict[str, str]) -> http.client.HTTPResponse:
            # One connection to moto per client connection, kept while it lives.
            for attempt in (1, 2):
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(
                        faults.target.hostname or "127.0.0.1", faults.target.port, timeout=30)
                try:
                    self.upstream.request(method, self.path, body=body, headers=headers)
                    return self.upstream.getresponse()
                except (http.client.HTTPException, OSError):
                    self.upstream.close()
                    self.upstream = None
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = faults.target.netloc
            resp = self._upstream(self.command, body, headers)
            data = resp.read()
            fault, nth = faults.choose(self.command, self.path) if resp.status in (200, 206) \
                else ("", 0)
            if faults.etags and self.command == "GET" and \
                    "list-type" in parse_qs(urlsplit(self.path).query):
                data = faults.etag(data.decode()).encode()
            self.send_response(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() in ("content-length", "transfer-encoding", "connection"):
                    continue
                self.send_header(key, faults.etag(value) if key.lower() == "etag" else value)
            # A HEAD's length is the object's (the Azure SDK reads the size from it).
            size = str(resp.getheader("Content-Length") or 0) if self.command == "HEAD" \
                else str(len(data))
            self.send_header("Content-Length", size)
            self.end_headers()
            if self.command == "HEAD":
                return
            if fault == "flip" and data:
                # Another byte each time a key is hit: random corruption,
                # unlike an ETag that is not an MD5, differs between reads.
                mid = (len(data) // 2 + 7 * nth) % len(data)
                data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:]
            if fault in ("reset", "stall"):
                self.wfile.write(data[:len(data) // 2])
                self.wfile.flush()
                if fault == "stall":
                    self._stall()
                self._reset()
                return
            self.wfile.write(data)

        def _stall(self) -> None:
            sock = self.connection
            start = time.monotonic()
            with faults._lock:
                faults.stalled_now += 1
            try:
                while time.monotonic() - start < faults.max_stall and not faults.release.is_set():
                    readable, _, _ = select.select([sock], [], [], 0.02)
                    if readable and _client_closed(sock):
                        break
            finally:
                with faults._lock:
                    faults.stalled_now -= 1
                    faults.stalls.append(time.monotonic() - start)

        def _reset(self) -> None:
            self.close_connection = True
            sock = self.connection
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            except OSError:
                pass

        def finish(self) -> None:
            if self.upstream is not None:
                self.upstream.close()
            with suppress(OSError):
                super().finish()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a warm opens dozens of connections at once


@contextmanager
def faulty(endpoint: str) -> Iterator[tuple[str, Faults]]:
    """A fault proxy on 127.0.0.1 in front of ``endpoint``: yields its URL and
    its :class:`Faults` (no faults until :meth:`Faults.set`)."""
    faults = Faults(endpoint)
    server = _Server(("127.0.0.1", 0), _handler(faults))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", faults
    finally:
        faults.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def fault_proxy(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """The obstore engine reaching moto through the fault proxy (no faults
    until the test calls :meth:`Faults.set`)."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    from ucstage.cache import integrity

    with faulty(moto.endpoint) as (url, faults):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        try:
            yield faults
        finally:
            # The moto bucket is shared by every test: a test that made its
            # ETags look unlike MD5s must not leave it marked for the next.
            integrity.forget()
