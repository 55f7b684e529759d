"""Tearing Spark Connect down never waits without a bound (issue: an export hung at its end).

pyspark's ``SparkSession.stop()`` sends ReleaseSession, which was seen to
deadlock inside grpc at the end of ``ucstage export`` and otherwise waits up
to ten minutes for a server that does not answer. Each test runs a real
Python process with a real Spark Connect server, freezes that server with
SIGSTOP (it accepts connections, through the kernel, and answers nothing:
the worst case for a release call), and checks that the process still ends,
says what it gave up on, and leaves no server behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.common.parts import pid_alive, require
from tests.common.spark import java_ok
from ucstage.export.spark import STOP_SECONDS

pytestmark = pytest.mark.spark

HANG_BOUND = 240.0
"""A hang detector, not a speed limit: far above a loaded machine's server start
(about 6 s quiet) plus teardown, far below pyspark's ten-minute release deadline."""


def _run(script: str, tmp_path: object) -> subprocess.CompletedProcess[str]:
    require(*java_ok())
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("SPARK_REMOTE", None)
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                              capture_output=True, text=True, timeout=HANG_BOUND)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the process did not end within {HANG_BOUND:g} s; "
                             f"stderr: {exc.stderr!r}") from exc


def _pid(out: str, name: str) -> int:
    for line in out.splitlines():
        if line.startswith(f"{name}="):
            return int(line.split("=", 1)[1])
    raise AssertionError(f"no {name}= line in {out!r}")


def test_a_frozen_embedded_server_is_stopped_without_a_release_call(tmp_path: object) -> None:
    """The embedded server's session is closed, not released: it is killed next anyway."""
    done = _run("""
        import os, signal, warnings
        from ucstage.export import spark
        session = spark.get_session()
        server = spark.embedded_server()
        session.range(3).count()
        print(f"server={server.proc.pid}", flush=True)
        os.kill(server.proc.pid, signal.SIGSTOP)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            spark.stop_embedded()
        print(f"warnings={len(seen)}", flush=True)
        for w in seen:
            print("warning:", w.message, flush=True)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "warnings=0" in done.stdout, done.stdout
    assert not pid_alive(_pid(done.stdout, "server"))


def test_exit_with_the_embedded_server_frozen_ends(tmp_path: object) -> None:
    """What a user's ``ucstage export`` does at its end: nothing but the exit hooks."""
    done = _run("""
        import os, signal
        from ucstage.export import spark
        session = spark.get_session()
        session.range(3).count()
        server = spark.embedded_server()
        print(f"server={server.proc.pid}", flush=True)
        os.kill(server.proc.pid, signal.SIGSTOP)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not pid_alive(_pid(done.stdout, "server"))


def test_a_user_named_server_that_does_not_answer_is_given_up_by_name(tmp_path: object) -> None:
    """A server the user named is asked to release the session, for a bounded time."""
    done = _run("""
        import os, signal, time
        from ucstage.export import spark
        from ucstage.export.embedded import EmbeddedServer
        server = EmbeddedServer().start()   # stands for a server the user runs
        try:
            session = spark.get_session(server.url)
            session.range(3).count()
            print(f"url={server.url}", flush=True)
            os.kill(server.proc.pid, signal.SIGSTOP)
            start = time.monotonic()
            spark.stop_embedded()
            print(f"took={time.monotonic() - start:.1f}", flush=True)
        finally:
            server.stop(timeout=5)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    url = next(line.split("=", 1)[1] for line in done.stdout.splitlines()
               if line.startswith("url="))
    # The warning names what was waited for and for how long.
    assert f"gave up after {STOP_SECONDS:g} s waiting for the Spark Connect server at {url} " \
           "to release this session" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
