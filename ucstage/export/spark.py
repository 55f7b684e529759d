"""Spark Connect sessions: a server the user names, or an embedded local one.

Which server (first match wins):

1. the ``remote`` argument, ``sc://HOST:PORT``;
2. ``$SPARK_REMOTE``, Spark's own variable;
3. an embedded server that ucstage starts on this machine.

The embedded server is pyspark's own ``SparkConnectServer`` started with
``spark-submit`` on a free port bound to 127.0.0.1 (``remote("local")`` is not
used: it binds 15002 on every interface and its client ignores any other
port). It is started once per process, reused by every call, and stopped at
interpreter exit; the child also gets ``PR_SET_PDEATHSIG`` so it dies with the
process that started it even after a ``kill -9`` (Linux delivers that signal
when the *thread* that started the server ends: start it from a long-lived
thread, as the CLI and ordinary scripts do from the main thread). Settings that only take
effect at server start are passed there: no ``_SUCCESS`` markers, no ``.crc``
side files, no web UI.

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
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import MissingDependency, SparkUnavailable
from ..ports import free_port, port_open
from ..progress import NO_PROGRESS, Callback

__all__ = [
    "REMOTE_ENV",
    "EmbeddedServer",
    "get_session",
    "is_connection_error",
    "java_executable",
    "spark_home",
    "stop_embedded",
]

REMOTE_ENV = "SPARK_REMOTE"
JAVA_HINT = ("install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set "
             "JAVA_HOME; or set SPARK_REMOTE=sc://HOST:PORT to use a running Spark Connect "
             "server")

# Settings given to spark-submit when the embedded server starts. The
# spark.hadoop.* ones must be here: tried on a running server, they take effect
# only at start, not when set on a session. Without _SUCCESS markers (the
# committer flag), .crc side files (the raw local filesystem) and Parquet
# summary files, the output holds only Parquet files. The rest: no web UI or
# console bar, 8 shuffle partitions for a one-machine server, and microsecond
# timestamps (also set per session, for servers ucstage did not start).
# docs/export.md ("Spark Connect server") says the same for users.
SERVER_CONF: dict[str, str] = {
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.parquet.enable.summary-metadata": "false",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}

# Bounded client retries: ~2 s in total, instead of pyspark's ~10 minutes.
RETRY_POLICY: dict[str, Any] = {
    "max_retries": 4,
    "initial_backoff": 100,
    "max_backoff": 1000,
    "backoff_multiplier": 2.0,
}


def spark_home() -> str:
    """The pyspark package folder, which carries ``bin/spark-submit`` and the jars."""
    try:
        import pyspark
    except ImportError as exc:
        raise MissingDependency(
            "export needs pyspark with Spark Connect support",
            hint="pip install 'ucstage[spark]'  (pyspark[connect]>=4, pandas<3, deltalake)",
        ) from exc
    return os.path.dirname(os.path.abspath(pyspark.__file__))


def java_executable() -> str | None:
    """``$JAVA_HOME/bin/java`` if set and present, else ``java`` on PATH, else None."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    # Linux only: SIGTERM the server when the process that started it dies.
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass
class EmbeddedServer:
    """A local Spark Connect server on 127.0.0.1, started with ``spark-submit``.

    Args:
        port: the port to bind (default: a free one).
        conf: extra ``--conf`` settings on top of :data:`SERVER_CONF`.
        master: the Spark master, ``local[*]`` by default.
        log_dir: where the server's log goes (default: a fresh temp folder).
    """

    port: int = 0
    conf: dict[str, str] = field(default_factory=dict)
    master: str = "local[*]"
    log_dir: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    startup_seconds: float | None = None
    _own_dir: bool = False

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> str:
        assert self.log_dir is not None
        return os.path.join(self.log_dir, "spark-connect-server.log")

    def command(self) -> list[str]:
        home = spark_home()
        cmd = [os.path.join(home, "bin", "spark-submit"), "--master", self.master,
               "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--conf", f"spark.connect.grpc.binding.port={self.port}",
               "--conf", "spark.connect.grpc.binding.address=127.0.0.1"]
        for key, value in {**SERVER_CONF, **self.conf}.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, "spark-internal"]

    def start(self, timeout: float = 180.0, callback: Callback = NO_PROGRESS) -> EmbeddedServer:
        """Start the server and wait until its port accepts connections.

        ``callback.set_description`` says that it is starting, and gets an
        empty description once the port is open or the start failed.

        Raises:
            SparkUnavailable: no Java, or the server exited or did not open its
                port within ``timeout`` seconds (the message quotes its log).
        """
        java = java_executable()
        if java is None:
            raise SparkUnavailable("no Java runtime found: the embedded Spark Connect server "
                                   "needs Java 17", hint=JAVA_HINT)
        home = spark_home()
        if not self.port:
            self.port = free_port()
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="ucstage-spark-")
            self._own_dir = True
        os.makedirs(self.log_dir, exist_ok=True)
        env = dict(os.environ)
        env.update({"SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_CONNECT_MODE": "0", "PYSPARK_PYTHON": sys.executable})
        env.pop("SPARK_REMOTE", None)
        if "JAVA_HOME" not in env:
            env["JAVA_HOME"] = os.path.dirname(os.path.dirname(os.path.realpath(java)))
        callback.set_description(
            f"starting the embedded Spark Connect server on 127.0.0.1:{self.port} "
            "(about 6 s; SPARK_REMOTE=sc://HOST:PORT uses a running one)")
        started = time.monotonic()
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.log_dir,
                                         preexec_fn=_die_with_parent)
        finally:
            log.close()
        try:
            while not port_open(self.port):
                if self.proc.poll() is not None:
                    raise SparkUnavailable(
                        f"the embedded Spark Connect server exited with code "
                        f"{self.proc.returncode} before it opened port {self.port}: "
                        f"{self._log_tail()}", hint=f"full log: {self.log_path}")
                if time.monotonic() - started > timeout:
                    self.stop()
                    raise SparkUnavailable(
                        f"the embedded Spark Connect server did not open port {self.port} "
                        f"within {timeout:.0f} s", hint=f"see its log: {self.log_path}")
                time.sleep(0.05)
        finally:
            callback.set_description("")
        self.startup_seconds = time.monotonic() - started
        return self

    def _log_tail(self, lines: int = 3) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                tail = [ln.strip() for ln in f.readlines() if ln.strip()][-lines:]
        except OSError:
            return "(no log)"
        return " | ".join(tail) or "(empty log)"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout`` seconds.

        The temp folder ucstage made for the log (also the server's working
        folder: ``spark-warehouse``, ``metastore_db``) is removed with it.
        """
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._own_dir and self.log_dir and proc is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)


_lock = threading.Lock()
_embedded: EmbeddedServer | None = None
_sessions: dict[str, Any] = {}


def _connect(url: str) -> Any:
    """A new Spark Connect session on ``url`` with bounded client retries."""
    spark_home()
    try:
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession
    except ImportError as exc:
        raise MissingDependency(
            f"pyspark's Spark Connect client cannot be imported: {exc}",
            hint="pip install 'pyspark[connect]>=4' 'pandas<3'",
        ) from exc
    try:
        session = SparkSession.builder.remote(url).create()
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
        with contextlib.suppress(Exception):
            session.client.close()  # no release RPCs to a dead server at exit
        details = re.search(r'details = "([^"]*)"', str(exc))
        reason = details.group(1) if details else str(exc).strip().splitlines()[0]
        raise SparkUnavailable(
            f"cannot reach the Spark Connect server at {url}: {reason[:200]}",
            hint="check that the server runs and the URL is right, or unset SPARK_REMOTE "
                 "to use the embedded server",
        ) from exc


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


def stop_embedded() -> None:
    """Close cached sessions and stop the embedded server, if this process started one."""
    global _embedded
    with _lock:
        for url, session in _sessions.items():
            if not _reachable(url):
                # Stopping would only retry against a dead server; closing the
                # channel also keeps pyspark's exit hook from trying.
                with contextlib.suppress(Exception):
                    session.client.close()
                continue
            with contextlib.suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                session.stop()
        _sessions.clear()
        server, _embedded = _embedded, None
    if server is not None:
        server.stop()
