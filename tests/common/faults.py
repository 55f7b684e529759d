"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the moto server.

It forwards every request and, for chosen object GETs, damages the response
the ways a network or a store does:

* ``reset``: half the body, then a TCP reset (``SO_LINGER`` 0);
* ``stall``: half the body, then nothing more while the connection stays
  open, until the client gives up (closes it) or :attr:`Faults.max_stall`
  seconds pass;
* ``flip``: the whole body with one byte inverted (in the middle, moved on
  by 7 bytes each time the same key is hit): a transfer error;
* ``corrupt``: the whole body with the same byte inverted on every GET: a
  bad replica, which no retry gets past.

The choice is by request, never by a share of whatever GETs happen: the test
names the keys (:meth:`Faults.set`), and GET number ``n`` of a named key
(counted per key from 1, listings excluded, hedged GETs and retries alike) is
faulted while ``n <= attempts``. So the faults injected are exactly
``len(keys) x attempts`` (all GETs for ``corrupt``), whatever the load, the
order the requests arrive in, or the extra GETs a hedge or a slow retry adds.
:func:`every` picks every n-th name of a set of files.

:meth:`Faults.limit` adds a request-rate limit over every object GET under a
prefix: a token bucket (``rate`` per second, ``burst`` at most), and a GET
that finds it empty gets ``503 SlowDown`` without reaching moto, as S3
throttles a prefix. Throttled GETs are counted in ``done["throttled"]``.

``composite=True`` answers GCS metadata (JSON API listings and object
resources) as GCS does for a composite object: no ``md5Hash`` (and no MD5
in ``x-goog-hash``), only the ``crc32c``, with a ``componentCount``.
fake-gcs-server gives a composed object an MD5, which GCS never does, so the
proxy edits what the real server answered instead.

A GET asking Azure for the MD5 of its range (``x-ms-range-get-content-md5:
true``) without a range or with one over 4 MiB gets ``400
InvalidHeaderValue``, as Azure answers; Azurite (3.37) instead serves such a
range without any ``Content-MD5``. Every object GET's range and whether it
asked for that MD5 are kept in :attr:`Faults.ranges`.

``etags="kms"`` serves every ETag (GET, HEAD, listings) as the MD5 of the
real one: 32 hex digits that are not the body's MD5, as an SSE-KMS bucket
answers. Counts of what it did are in :attr:`Faults.done`; how long each stall
was held is in :attr:`Faults.stalls`, and how many ended because the client
closed the connection (not at :attr:`Faults.max_stall`) in
:attr:`Faults.stalls_dropped`.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.common.parts import readable

__all__ = ["FAULTS", "Faults", "every", "fault_proxy", "faulty"]

FAULTS = ("reset", "stall", "flip", "corrupt")
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")
_RANGE = re.compile(r"bytes=(\d+)-(\d+)")
_AZURE_MD5_RANGE = 4 * 1024 * 1024
"""The largest range Azure gives the MD5 of."""
_INVALID_HEADER = (b'<?xml version="1.0" encoding="utf-8"?>\n<Error><Code>InvalidHeaderValue'
                   b"</Code><Message>The value for one of the HTTP headers is not in the "
                   b"correct format.</Message></Error>")
_ETAG = re.compile(r'(&quot;|")([0-9a-f]{32})(-\d+)?(&quot;|")')


class Faults:
    """What the proxy does (set by a test) and what it did (read by it)."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.kind = ""
        """The fault to inject (one of :data:`FAULTS`), '' for none."""
        self.keys: frozenset[str] = frozenset()
        """The keys faulted (``bucket/key``)."""
        self.attempts = 1
        """GETs of each faulted key that get the fault (the first ones)."""
        self.prefix = ""
        """Only GETs of keys under this prefix (bucket/key...) are rate-limited."""
        self.max_stall = 30.0
        """A stall ends (the proxy closes the connection) after this many seconds."""
        self.etags = ""
        """``"kms"``: serve ETags that are not MD5s of the bodies."""
        self.composite = False
        """Serve GCS object metadata without an MD5, as for composite objects."""
        self.rate = 0.0
        """Object GETs per second the token bucket allows (0: no limit)."""
        self.burst = 1.0
        self._tokens = 0.0
        self._filled = 0.0
        self.gets: Counter[str] = Counter()
        """Object GETs seen, by key (throttled ones excluded)."""
        self.done: Counter[str] = Counter()
        """Faults injected, by kind (and ``throttled``)."""
        self.faulted: Counter[str] = Counter()
        """Faults injected, by key."""
        self.stalls: list[float] = []
        """Seconds each stall held its connection."""
        self.stalls_dropped = 0
        """Stalls that ended because the client closed the connection."""
        self.ranges: list[tuple[str, int, int, bool]] = []
        """Object GETs with a range: ``(key, first byte, last byte, asked
        for the range's MD5)``."""
        self.stalled_now = 0
        self.put_resets = 0
        """The next this many PUTs have their connection reset before they
        reach the store (a dropped upload): counts down."""
        self.puts = 0
        """PUTs seen (reset ones included)."""
        self.uploads = 0
        """Multipart uploads started (S3's ``POST ?uploads``)."""
        self.release = threading.Event()
        """Setting it ends every stall (at teardown)."""
        self._lock = threading.Lock()

    def dropped(self, timeout: float = 60.0) -> int:
        """:attr:`stalls_dropped` once every stall has ended. The proxy's
        thread notices a closed connection on its next poll, which a loaded
        machine can delay past the client's exit; ``timeout`` only stops a
        hang (a stall still open then counts as not dropped)."""
        deadline = time.monotonic() + timeout
        while self.stalled_now and time.monotonic() < deadline:
            time.sleep(0.02)
        with self._lock:
            return self.stalls_dropped

    def set(self, kind: str, keys: Iterable[str], *, prefix: str = "",
            attempts: int = 1) -> Faults:
        """Fault the first ``attempts`` GETs of each of ``keys`` (names under
        ``prefix``, ``bucket/...``) with ``kind``; ``corrupt`` faults every GET.
        Counts restart."""
        if kind and kind not in FAULTS:
            raise ValueError(f"kind must be one of {FAULTS}, got {kind!r}")
        base = prefix.rstrip("/") + "/" if prefix else ""
        with self._lock:
            self.kind, self.prefix = kind, prefix
            self.keys = frozenset(base + key for key in keys)
            self.attempts = 1 << 30 if kind == "corrupt" else attempts
            self.gets.clear()
            self.ranges.clear()
            self.done.clear()
            self.faulted.clear()
            self.stalls.clear()
            self.stalls_dropped = 0
        return self

    def limit(self, rate: float, *, burst: float = 0.0, prefix: str = "") -> Faults:
        """Allow ``rate`` object GETs per second under ``prefix`` (a token
        bucket holding ``burst`` at most, ``rate / 10`` by default, full at the
        start); the others get 503 SlowDown."""
        with self._lock:
            self.rate, self.prefix = rate, prefix
            self.burst = burst or max(1.0, rate / 10)
            self._tokens, self._filled = self.burst, time.monotonic()
            self.done["throttled"] = 0
        return self

    @staticmethod
    def _object_get(method: str, path: str) -> str:
        """The key (``bucket/key``) of an object GET, '' for anything else."""
        parts = urlsplit(path)
        if method != "GET" or "list-type" in parse_qs(parts.query):
            return ""
        return unquote(parts.path).lstrip("/")  # obstore escapes GCS and Azure keys

    def reset_put(self, method: str, path: str) -> bool:
        """Whether this request is a PUT whose connection is reset now."""
        if method == "POST" and "uploads" in parse_qs(urlsplit(path).query, keep_blank_values=True):
            with self._lock:
                self.uploads += 1
        if method != "PUT":
            return False
        with self._lock:
            self.puts += 1
            if self.put_resets <= 0:
                return False
            self.put_resets -= 1
            self.done["put_reset"] += 1
            return True

    def throttle(self, method: str, path: str) -> bool:
        """Whether this request gets 503 SlowDown (the bucket is empty)."""
        key = self._object_get(method, path)
        if not key or not self.rate or (self.prefix and not key.startswith(self.prefix)):
            return False
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._filled) * self.rate)
            self._filled = now
            if self._tokens >= 1:
                self._tokens -= 1
                return False
            self.done["throttled"] += 1
            return True

    def range_md5_refused(self, method: str, path: str, headers: Any) -> bool:
        """Whether this GET asks for its range's MD5 where Azure refuses it
        (no range, or one over 4 MiB); notes its range in :attr:`ranges`."""
        key = self._object_get(method, path)
        if not key:
            return False
        asked = (headers.get("x-ms-range-get-content-md5") or "").lower() == "true"
        found = _RANGE.search(headers.get("x-ms-range") or headers.get("Range") or "")
        if found:
            with self._lock:
                self.ranges.append((key, int(found.group(1)), int(found.group(2)), asked))
        return asked and (found is None or
                          int(found.group(2)) - int(found.group(1)) + 1 > _AZURE_MD5_RANGE)

    def choose(self, method: str, path: str) -> tuple[str, int]:
        """The fault for this request ('' for none), and how many times its
        key was faulted before."""
        key = self._object_get(method, path)
        if not key:
            return "", 0
        with self._lock:
            self.gets[key] += 1
            if not self.kind or key not in self.keys or self.gets[key] > self.attempts:
                return "", 0
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


def _composite(data: bytes) -> bytes:
    """A GCS JSON answer (an object, or a listing's ``items``) as for
    composite objects: ``md5Hash`` dropped, ``componentCount`` set."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    if not isinstance(doc, dict):
        return data
    for item in doc.get("items", [doc]) if doc.get("kind") != "storage#object" else [doc]:
        if isinstance(item, dict) and item.pop("md5Hash", None) is not None:
            item["componentCount"] = 2
    return json.dumps(doc).encode()


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
            if faults.reset_put(self.command, self.path):
                self._reset()
                return
            if faults.throttle(self.command, self.path):
                self.send_response(503, "Slow Down")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(_SLOW_DOWN)))
                self.end_headers()
                self.wfile.write(_SLOW_DOWN)
                return
            if faults.range_md5_refused(self.command, self.path, self.headers):
                self.send_response(400, "Value for one of the headers is invalid")
                self.send_header("Content-Type", "application/xml")
                self.send_header("x-ms-error-code", "InvalidHeaderValue")
                self.send_header("Content-Length", str(len(_INVALID_HEADER)))
                self.end_headers()
                self.wfile.write(_INVALID_HEADER)
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = faults.target.netloc
            resp = self._upstream(self.command, body, headers)
            data = resp.read()
            fault, nth = faults.choose(self.command, self.path) if resp.status in (200, 206) \
                else ("", 0)
            if faults.etags and self.command == "GET" and \
                    "list-type" in parse_qs(urlsplit(self.path).query):
                data = faults.etag(data.decode()).encode()
            if faults.composite and urlsplit(self.path).path.startswith("/storage/v1/b/"):
                data = _composite(data)
            self.send_response(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() in ("content-length", "transfer-encoding", "connection"):
                    continue
                if faults.composite and key.lower() == "x-goog-hash":
                    value = ",".join(p for p in value.split(",") if not p.strip().startswith("md5="))
                self.send_header(key, faults.etag(value) if key.lower() == "etag" else value)
            # A HEAD's length is the object's (the Azure SDK reads the size from it).
            size = str(resp.getheader("Content-Length") or 0) if self.command == "HEAD" \
                else str(len(data))
            self.send_header("Content-Length", size)
            self.end_headers()
            if self.command == "HEAD":
                return
            if fault in ("flip", "corrupt") and data:
                # flip: another byte each time a key is hit (a transfer
                # error differs between reads); corrupt: the same byte every
                # time (a bad replica, read the same way on every GET).
                mid = (len(data) // 2 + (7 * nth if fault == "flip" else 0)) % len(data)
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
                    if readable(sock, 0.02) and _client_closed(sock):
                        with faults._lock:
                            faults.stalls_dropped += 1
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


def every(files: Iterable[str], n: int) -> list[str]:
    """Every ``n``-th of ``files`` in sorted order, from the first: the keys
    to fault (``len(files) // n`` of them, rounded up)."""
    return sorted(files)[::n]


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


def azurite_behind(azurite: Any, monkeypatch: pytest.MonkeyPatch,
                   engine: str | None = None) -> Iterator[Faults]:
    """Azurite behind a fault proxy, its variables set for the test (and
    ``$UCSTAGE_ENGINE`` when ``engine``); the MD5 evidence forgotten before
    and after. For a fixture to ``yield from``."""
    from ucstage.engines import checks

    if engine is not None:
        monkeypatch.setenv("UCSTAGE_ENGINE", engine)
    checks.forget()
    with faulty(azurite.endpoint) as (url, faults):
        for k, v in azurite.env(url).items():
            monkeypatch.setenv(k, v)
        yield faults
    checks.forget()


@pytest.fixture
def fault_proxy(moto: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """The obstore engine reaching moto through the fault proxy (no faults
    until the test calls :meth:`Faults.set`)."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    from ucstage.engines import checks, pace

    # What this process learnt of the shared bucket's ETags (an earlier
    # test's copies matched their MD5s) must not decide this test's verdicts.
    checks.forget()
    pace.forget()
    with faulty(moto.endpoint) as (url, faults):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        try:
            yield faults
        finally:
            # The moto bucket is shared by every test: a test that made its
            # ETags look unlike MD5s must not leave it marked for the next.
            checks.forget()
            pace.forget()  # a rate learnt from this test's throttling
