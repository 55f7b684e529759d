"""Spark Connect sessions: a server the user names, or an embedded local one.

Which server (first match wins):

1. the ``remote`` argument, ``sc://HOST:PORT``;
2. ``$SPARK_REMOTE``, Spark's own variable;
3. an embedded server that ucstage starts on this machine
   (:class:`~ucstage.export.embedded.EmbeddedServer`: 127.0.0.1 only, a fresh
   token that only this process knows, its own temp folder).

The embedded server is started once per process, reused by every call, and
stopped at interpreter exit. Settings that only take effect at server start
are passed there: no ``_SUCCESS`` markers, no ``.crc`` side files, no web UI.
An export stopped by Ctrl-C calls :func:`abandon`, which stops that server
(or interrupts the job on a server the user named) so that nothing writes
into the staging folder once it is removed.

Client retries are bounded (a handful of attempts over about two seconds
instead of pyspark's default of about ten minutes), so a dead or unreachable
server fails in seconds with :class:`~ucstage.errors.SparkUnavailable`.

pyspark is imported only inside functions: ``import ucstage`` and
``ucstage --help`` stay fast without it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import threading
import warnings
from typing import Any

from ..errors import MissingDependency, SparkUnavailable
from ..progress import NO_PROGRESS, Callback
from .embedded import (
    JAVA_HINT,
    SERVER_CONF,
    EmbeddedServer,
    java_executable,
    spark_home,
    token_for,
)

__all__ = [
    "JAVA_HINT",
    "REMOTE_ENV",
    "SERVER_CONF",
    "EmbeddedServer",
    "abandon",
    "catalog_is_new",
    "embedded_server",
    "get_session",
    "is_connection_error",
    "java_executable",
    "spark_home",
    "stop_embedded",
]

REMOTE_ENV = "SPARK_REMOTE"

# Bounded client retries: ~2 s in total, instead of pyspark's ~10 minutes.
RETRY_POLICY: dict[str, Any] = {
    "max_retries": 4,
    "initial_backoff": 100,
    "max_backoff": 1000,
    "backoff_multiplier": 2.0,
}
ABANDON_SECONDS = 2.0
"""How long an abandoned embedded server may take to stop before it is killed."""


_lock = threading.Lock()
_embedded: EmbeddedServer | None = None
_sessions: dict[str, Any] = {}


def _connect(url: str) -> Any:
    """A new Spark Connect session on ``url`` with bounded client retries.

    An embedded server this process started is reached with its token, over
    gRPC's local-connection credentials (pyspark's own local mode does the
    same); the token never appears in ``url``.
    """
    spark_home()
    try:
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession
    except ImportError as exc:
        raise MissingDependency(
            f"pyspark's Spark Connect client cannot be imported: {exc}",
            hint="pip install 'pyspark[connect]>=4' 'pandas<3'",
        ) from exc
    token = token_for(url)
    try:
        if token is None:
            session = SparkSession.builder.remote(url).create()
        else:
            # pyspark sends a token over local credentials only to "localhost".
            builder = DefaultChannelBuilder(url.replace("//127.0.0.1:", "//localhost:", 1))
            builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
            session = SparkSession.builder.channelBuilder(builder).create()
    except Exception as exc:
        raise SparkUnavailable(f"bad Spark Connect URL {url!r}: {exc}",
                               hint="use sc://HOST:PORT, e.g. sc://127.0.0.1:15002") from exc
    session.client.set_retry_policies([DefaultPolicy(**RETRY_POLICY)])
    return session


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` says the server is gone or unreachable (not a query error)."""
    text = f"{type(exc).__name__} {exc}"
    markers = ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed",
               "RetriesExceeded", "Connection reset", "DEADLINE_EXCEEDED", "CANCELLED")
    return any(m in text for m in markers)


def _check(session: Any, url: str) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyspark's RETRIES_EXCEEDED UserWarning
            session.version  # noqa: B018 - one cheap round trip
    except Exception as exc:
        _close(session)  # no release RPCs to a dead server at exit
        details = re.search(r'details = "([^"]*)"', str(exc))
        reason = details.group(1) if details else str(exc).strip().splitlines()[0]
        raise SparkUnavailable(
            f"cannot reach the Spark Connect server at {url}: {reason[:200]}",
            hint="check that the server runs and the URL is right, or unset SPARK_REMOTE "
                 "to use the embedded server",
        ) from exc


def catalog_is_new(remote: str | None = None) -> bool:
    """Whether a session for ``remote`` would be a new embedded server's,
    whose catalog (a fresh folder of its own) holds no table yet: asking it
    for a table by name would start Spark only to say "not found"."""
    if remote or os.environ.get(REMOTE_ENV):
        return False
    with _lock:
        return _embedded is None or not _embedded.running


def get_session(remote: str | None = None, *, callback: Callback = NO_PROGRESS) -> Any:
    """A Spark Connect session, reused within the process.

    Args:
        remote: ``sc://HOST:PORT``; default ``$SPARK_REMOTE``, else the embedded server.
        callback: told through ``set_description`` while the embedded server starts.

    Raises:
        SparkUnavailable: no Java for the embedded server, or the server cannot be reached.
        MissingDependency: pyspark is not installed.
    """
    global _embedded
    url = remote or os.environ.get(REMOTE_ENV) or ""
    with _lock:
        if not url:
            if _embedded is None or not _embedded.running:
                _embedded = EmbeddedServer().start(callback=callback)
                atexit.register(stop_embedded)
            url = _embedded.url
        if not url.startswith("sc://"):
            raise SparkUnavailable(f"{url!r} is not a Spark Connect URL",
                                   hint="use sc://HOST:PORT, e.g. sc://127.0.0.1:15002")
        session = _sessions.get(url)
        if session is None:
            session = _connect(url)
            _check(session, url)
            _sessions[url] = session
            # Run before pyspark's own exit hook, registered by the client just
            # made (atexit runs the last registered first): once ucstage has
            # closed the client, that hook sends nothing to the server.
            atexit.unregister(stop_embedded)
            atexit.register(stop_embedded)
        return session


def _reachable(url: str) -> bool:
    from urllib.parse import urlparse

    try:
        parsed = urlparse(url.replace("sc://", "http://", 1))
        with socket.create_connection((parsed.hostname or "localhost", parsed.port or 15002),
                                      timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


def embedded_server() -> EmbeddedServer | None:
    """The embedded server this process started, if any (for tests and benchmarks)."""
    return _embedded


STOP_SECONDS = 5.0
"""How long closing one session may take at teardown before ucstage gives up on it."""


def stop_embedded() -> None:
    """Close cached sessions and stop the embedded server, if this process started one.

    Every step is bounded. pyspark's ``SparkSession.stop()`` sends a
    ReleaseSession call that was seen to deadlock inside grpc (the call
    starts a thread whose start collects an old call object that needs the
    channel lock the caller holds), and waits up to ten minutes on a server
    that does not answer. So the embedded server is stopped first (SIGTERM,
    SIGKILL after 20 s) and its session only closed, never released; any
    other session is stopped in a daemon thread that is given
    :data:`STOP_SECONDS`; and a step that does not end in time is named in
    a warning and left behind.
    """
    global _embedded
    with _lock:
        server, _embedded = _embedded, None
        sessions = list(_sessions.items())
        _sessions.clear()
    if server is not None:
        # First: its clients' close then fails fast instead of waiting (up to
        # 10 s in pyspark) for replies a frozen or busy server may never send.
        server.stop()
    with warnings.catch_warnings():
        # pyspark's RETRIES_EXCEEDED UserWarning; set here, in this thread:
        # catch_warnings in a thread that may never end would never restore.
        warnings.filterwarnings("ignore", category=UserWarning, module="pyspark")
        for url, session in sessions:
            if (server is not None and url == server.url) or not _reachable(url):
                # Nothing to release on a server that is gone.
                _close(session, url)
            elif not _bounded(lambda s=session: s.stop(),
                              f"the Spark Connect server at {url} to release this session"):
                _mark_closed(session)


def _bounded(step: Any, what: str, timeout: float | None = None) -> bool:
    """Run ``step()`` in a daemon thread for at most ``timeout`` seconds.

    True when it ended (its exceptions are swallowed: teardown is best
    effort); False, with a warning naming ``what`` it waited for, when it
    did not. A stuck step is left in its daemon thread, which does not keep
    the process from exiting.
    """
    limit = STOP_SECONDS if timeout is None else timeout

    def run() -> None:
        with contextlib.suppress(Exception):
            step()

    thread = threading.Thread(target=run, name="ucstage-spark-stop", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        warnings.warn(f"ucstage: gave up after {limit:g} s waiting for {what}; "
                      f"going on without it", RuntimeWarning, stacklevel=3)
        return False
    return True


def abandon(session: Any) -> str:
    """Make ``session``'s server stop working for this process, fast; say what was done.

    For the embedded server that is stopping it (SIGTERM, SIGKILL after
    :data:`ABANDON_SECONDS`): a running write then cannot add files to a
    folder the caller removes next. On a server the user named, every
    operation of the session is interrupted instead (``interruptAll``).
    Called when an export is stopped by Ctrl-C or SIGTERM; never raises.
    """
    global _embedded
    with _lock:
        server = _embedded
        embedded = server is not None and _sessions.get(server.url) is session
        if embedded:
            assert server is not None
            _embedded = None
            _sessions.pop(server.url, None)
    if embedded:
        assert server is not None
        server.stop(timeout=ABANDON_SECONDS)
        _close(session, server.url)
        return "the embedded Spark server was stopped"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session.interruptAll()
    except Exception:
        return "the Spark server could not be told to stop its job"
    return "the Spark job was interrupted"


def _close(session: Any, url: str = "the Spark Connect server") -> None:
    """Close the client of a server that is gone or going, without release calls to it."""
    if not _bounded(lambda: session.client.close(), f"the gRPC channel to {url} to close"):
        _mark_closed(session)


def _mark_closed(session: Any) -> None:
    """Make pyspark's exit hook skip a client whose close did not end.

    That hook sends an RPC on any client not marked closed (``_closed``, a
    private attribute of pyspark 4's client that it checks for this), which
    would wait on the same stuck channel at interpreter exit.
    """
    with contextlib.suppress(Exception):
        session.client._closed = True
