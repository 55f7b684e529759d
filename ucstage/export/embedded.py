"""The embedded Spark Connect server: one ``spark-submit`` child on 127.0.0.1.

pyspark's own ``SparkConnectServer`` is started with ``spark-submit`` on a
free port bound to 127.0.0.1 (``remote("local")`` is not used: it binds
15002 on every interface and its client ignores any other port).

**Only its starter may use it.** The port is reachable by every user of the
machine, and a query runs with the rights of the user who started the
server. So each server requires a fresh random token
(``spark.connect.authenticate.token``, handed over in the child's
environment as ``SPARK_CONNECT_AUTHENTICATE_TOKEN``, as pyspark's own local
mode does, so it is never on a command line). The token lives only in this
process's memory (:func:`token_for`) and the child's environment; it is never
printed, logged or written to a file.

**Its folder.** A server ucstage makes a folder for,
``$TMPDIR/ucstage-spark-<pid>-<random>/``, keeps everything there: the log,
its working folder (``spark-warehouse``, ``metastore_db``), Spark's local
folders (``SPARK_LOCAL_DIRS``) and the JVM's temp files
(``java.io.tmpdir``). ``server.lock`` in it is ``flock``-ed by the starter,
and the child inherits that open file, so the lock is held while either of
them lives. :meth:`EmbeddedServer.stop` removes the folder; a folder left by
a ``kill -9`` is removed by the next :meth:`EmbeddedServer.start`
(:func:`sweep_stale_servers`), once no live process holds its lock. A folder
without a lock file yet belongs to the process named in its name, and is
left alone while that process lives.

The child also gets ``PR_SET_PDEATHSIG`` so it dies with the process that
started it even after a ``kill -9`` (Linux delivers that signal when the
*thread* that started the server ends: start it from a long-lived thread, as
the CLI and ordinary scripts do from the main thread).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field

from ..errors import MissingDependency, SparkUnavailable
from ..ports import free_port, port_open
from ..progress import NO_PROGRESS, Callback

__all__ = [
    "FOLDER_PREFIX",
    "JAVA_HINT",
    "LOCK_NAME",
    "SERVER_CONF",
    "TOKEN_ENV",
    "EmbeddedServer",
    "java_executable",
    "spark_home",
    "sweep_stale_servers",
    "token_for",
]

JAVA_HINT = ("install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set "
             "JAVA_HOME; or set SPARK_REMOTE=sc://HOST:PORT to use a running Spark Connect "
             "server")
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
"""The variable the server (and pyspark's client) read the token from."""
FOLDER_PREFIX = "ucstage-spark-"
LOCK_NAME = "server.lock"
KILL_WAIT_SECONDS = 5.0
"""How long a SIGKILLed server may take to be reaped before ucstage stops waiting."""
_FOLDER = re.compile(re.escape(FOLDER_PREFIX) + r"(\d+)-[A-Za-z0-9_]+")

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

_tokens: dict[str, str] = {}
_tokens_lock = threading.Lock()


def token_for(url: str) -> str | None:
    """The token of the embedded server this process runs at ``url``, if any."""
    with _tokens_lock:
        return _tokens.get(url)


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


def _java_option(name: str, value: str) -> str:
    # spark-submit splits --driver-java-options on spaces, honouring double quotes.
    quoted = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'-D{name}="{quoted}"'


@dataclass
class EmbeddedServer:
    """A local Spark Connect server on 127.0.0.1, started with ``spark-submit``.

    Only clients holding its token get in: connect through
    :func:`ucstage.export.spark.get_session` with :attr:`url` (it finds the
    token of a server this process started).

    Args:
        port: the port to bind (default: a free one).
        conf: extra ``--conf`` settings on top of :data:`SERVER_CONF`.
        master: the Spark master, ``local[*]`` by default.
        log_dir: where the server's log and temp files go (default: a fresh
            folder ``$TMPDIR/ucstage-spark-<pid>-<random>``, removed by
            :meth:`stop`, or by a later start if this process is killed).
    """

    port: int = 0
    conf: dict[str, str] = field(default_factory=dict)
    master: str = "local[*]"
    log_dir: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    startup_seconds: float | None = None
    _own_dir: bool = False
    _token: str = field(default="", repr=False)
    _lock_fd: int | None = field(default=None, repr=False)

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
        if self.log_dir is not None:
            # The JVM's own temp files (native libraries, artifacts) go into
            # the server's folder, so removing it leaves nothing in /tmp.
            cmd += ["--driver-java-options",
                    _java_option("java.io.tmpdir", os.path.join(self.log_dir, "tmp"))]
        for key, value in {**SERVER_CONF, **self.conf}.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, "spark-internal"]

    def start(self, timeout: float = 180.0, callback: Callback = NO_PROGRESS) -> EmbeddedServer:
        """Start the server and wait until its port accepts connections.

        Stale folders of killed servers are removed first. ``callback.set_description``
        says that it is starting, and gets an empty description once the port
        is open or the start failed. Interrupted (Ctrl-C), it stops the child
        and removes the folder it made before re-raising.

        Raises:
            SparkUnavailable: no Java, or the server exited or did not open its
                port within ``timeout`` seconds (the message quotes its log,
                which stays until the next start).
        """
        java = java_executable()
        if java is None:
            raise SparkUnavailable("no Java runtime found: the embedded Spark Connect server "
                                   "needs Java 17", hint=JAVA_HINT)
        home = spark_home()
        if not self.port:
            self.port = free_port()
        if self.log_dir is None:
            sweep_stale_servers()
            self.log_dir = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
            self._own_dir = True
            self._lock_fd = _hold_lock(self.log_dir)
        for sub in ("tmp", "local"):
            os.makedirs(os.path.join(self.log_dir, sub), exist_ok=True)
        self._token = secrets.token_urlsafe(32)
        env = dict(os.environ)
        env.update({"SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_CONNECT_MODE": "0", "PYSPARK_PYTHON": sys.executable,
                    "SPARK_LOCAL_DIRS": os.path.join(self.log_dir, "local"),
                    TOKEN_ENV: self._token})
        env.pop("SPARK_REMOTE", None)
        if "JAVA_HOME" not in env:
            env["JAVA_HOME"] = os.path.dirname(os.path.dirname(os.path.realpath(java)))
        callback.set_description(
            f"starting the embedded Spark Connect server on 127.0.0.1:{self.port} "
            "(SPARK_REMOTE=sc://HOST:PORT uses a running one)")
        started = time.monotonic()
        try:
            self._launch(env, started, timeout)
        except SparkUnavailable:
            self._kill()  # the folder, with the log the message points to, stays
            raise
        except BaseException:
            self.stop(timeout=2.0)
            raise
        finally:
            callback.set_description("")
        with _tokens_lock:
            _tokens[self.url] = self._token
        self.startup_seconds = time.monotonic() - started
        return self

    def _launch(self, env: dict[str, str], started: float, timeout: float) -> None:
        assert self.log_dir is not None
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it
        try:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self.log_dir, preexec_fn=_die_with_parent,
                pass_fds=() if self._lock_fd is None else (self._lock_fd,))
        finally:
            log.close()
        while not port_open(self.port):
            if self.proc.poll() is not None:
                raise SparkUnavailable(
                    f"the embedded Spark Connect server exited with code "
                    f"{self.proc.returncode} before it opened port {self.port}: "
                    f"{self._log_tail()}", hint=f"full log: {self.log_path}")
            if time.monotonic() - started > timeout:
                raise SparkUnavailable(
                    f"the embedded Spark Connect server did not open port {self.port} "
                    f"within {timeout:.0f} s", hint=f"see its log: {self.log_path}")
            time.sleep(0.05)

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

    def _kill(self, timeout: float = 20.0) -> None:
        """End the child: SIGTERM, then SIGKILL after ``timeout`` seconds; forget its token."""
        with _tokens_lock:
            _tokens.pop(self.url, None)
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            # A stopped JVM (SIGSTOP, a debugger, a frozen cgroup) only acts
            # on SIGTERM once it runs again; it is ours, so let it.
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(KILL_WAIT_SECONDS)
                except subprocess.TimeoutExpired:
                    warnings.warn(
                        f"ucstage: gave up after {KILL_WAIT_SECONDS:g} s waiting for the "
                        f"embedded Spark server (pid {proc.pid}) to exit after SIGKILL",
                        RuntimeWarning, stacklevel=3)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout`` seconds.

        The folder ucstage made for it (log, working folder, Spark's and the
        JVM's temp files) is removed with it.
        """
        self._kill(timeout)
        if self._own_dir and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _hold_lock(folder: str) -> int:
    """Create ``folder/server.lock`` already locked, and return its descriptor.

    The file is locked under a temporary name and then renamed into place, so
    a sweeper never finds it unlocked while its folder is in use.
    """
    temp = os.path.join(folder, f".{LOCK_NAME}.new")
    fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temp, os.path.join(folder, LOCK_NAME))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_servers(folder: str | None = None) -> list[str]:
    """Remove the server folders of killed processes; return the paths removed.

    Looks in ``folder`` (default: :func:`tempfile.gettempdir`) at this user's
    ``ucstage-spark-<pid>-*`` folders. One is stale when its ``server.lock``
    can be locked (neither its starter nor its server lives), or, having no
    lock file, when process ``<pid>`` is gone. A running export's folder is
    never touched.
    """
    folder = folder or tempfile.gettempdir()
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        match = _FOLDER.fullmatch(name)
        if not match:
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        if _remove_if_stale(path, int(match.group(1))):
            removed.append(path)
    return removed


def _remove_if_stale(path: str, pid: int) -> bool:
    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if _pid_alive(pid):
            return False  # being set up, or kept by a live process
        shutil.rmtree(path, ignore_errors=True)
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
