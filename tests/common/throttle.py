"""An HTTP proxy in front of the moto server that throttles chosen objects as
S3 does under load (503 SlowDown), or refuses listings as a bucket policy
does (403 AccessDenied), for the tests of both engines."""

from __future__ import annotations

import http.client
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")
_ACCESS_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                  b"<Message>Access Denied</Message></Error>")


class Throttle:
    """GETs of a key whose name starts with ``flaky`` get 503 SlowDown twice,
    then pass; ``broken`` ones always get it. ``gets`` counts GETs per name."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target)
        self.gets: Counter[str] = Counter()
        self.held = 0
        """GETs of ``hang*`` names waiting now."""
        self.release = threading.Event()
        """GETs of ``hang*`` names wait until this is set (a hung store)."""
        self.ranges: list[str] = []
        """The Range header of every forwarded GET that had one."""
        self.if_match: list[str] = []
        """The If-Match header of every forwarded GET that had one."""
        self.listings: list[str] = []
        """The prefix of every forwarded listing request (ListObjectsV2)."""
        self.deny_prefix = ""
        """Listings of keys under this prefix get 403 AccessDenied, as a bucket
        policy answers (set by a test; empty: none)."""
        self._lock = threading.Lock()

    def denied(self, path: str) -> bool:
        query = parse_qs(urlsplit(path).query)
        return bool(self.deny_prefix) and "list-type" in query \
            and query.get("prefix", [""])[0].startswith(self.deny_prefix)

    def refuse(self, path: str) -> bool:
        name = urlsplit(path).path.rsplit("/", 1)[-1]
        if not name.startswith(("flaky", "broken")):
            return False
        with self._lock:
            self.gets[name] += 1
            return name.startswith("broken") or self.gets[name] <= 2


def _handler(throttle: Throttle) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _error(self, status: int, reason: str, body: bytes) -> None:
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            if self.command == "GET" and throttle.denied(self.path):
                self._error(403, "Forbidden", _ACCESS_DENIED)
                return
            if self.command == "GET" and throttle.refuse(self.path):
                self._error(503, "Slow Down", _SLOW_DOWN)
                return
            if self.command == "GET" and \
                    urlsplit(self.path).path.rsplit("/", 1)[-1].startswith("hang"):
                with throttle._lock:
                    throttle.held += 1
                throttle.release.wait(60)
                with throttle._lock:
                    throttle.held -= 1
            if self.command == "GET" and "list-type" in parse_qs(urlsplit(self.path).query):
                with throttle._lock:
                    throttle.listings.append(
                        parse_qs(urlsplit(self.path).query).get("prefix", [""])[0])
            if self.command == "GET" and self.headers.get("Range"):
                with throttle._lock:
                    throttle.ranges.append(self.headers["Range"])
            if self.command == "GET" and self.headers.get("If-Match"):
                with throttle._lock:
                    throttle.if_match.append(self.headers["If-Match"])
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            conn = http.client.HTTPConnection(throttle.target.hostname, throttle.target.port,
                                              timeout=30)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = throttle.target.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


@contextmanager
def throttled(endpoint: str) -> Iterator[tuple[str, Throttle]]:
    """A throttling proxy on 127.0.0.1 in front of ``endpoint``: yields its URL
    and its :class:`Throttle`."""
    throttle = Throttle(endpoint)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(throttle))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", throttle
    finally:
        throttle.release.set()
        server.shutdown()
        server.server_close()
