"""The embedded Spark Connect server: only its starter gets in, and its folder goes away."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from tests.common.spark import Warehouse, exported_table
from ucstage.export import export_table
from ucstage.export.embedded import (
    FOLDER_PREFIX,
    LOCK_NAME,
    TOKEN_ENV,
    EmbeddedServer,
    sweep_stale_servers,
)
from ucstage.export.spark import embedded_server

pytestmark = pytest.mark.spark


# -- item 20: a token that only this process knows ---------------------------------

def _client(url: str, token: str | None = None) -> Any:
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession

    if token is None:
        session = SparkSession.builder.remote(url).create()
    else:
        builder = DefaultChannelBuilder(url.replace("127.0.0.1", "localhost"))
        builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
        session = SparkSession.builder.channelBuilder(builder).create()
    session.client.set_retry_policies([DefaultPolicy(max_retries=0)])
    return session


@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_a_client_without_the_token_is_refused(spark_session: Any, warehouse: Warehouse,
                                               tmp_path: Any,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    server = embedded_server()
    assert server is not None and server.running
    monkeypatch.delenv(TOKEN_ENV, raising=False)  # pyspark's client would send this one
    for token in (None, "not-the-token"):
        intruder = _client(server.url, token)
        try:
            with pytest.raises(Exception, match="UNAUTHENTICATED") as info:
                intruder.range(3).collect()
        finally:
            intruder.client.close()
        assert "authentication token" in str(info.value)
    # The export itself, through the same server, works.
    dest = str(tmp_path / "events")
    assert export_table("main.ml.events", dest).row_count == 1600
    assert exported_table(dest).num_rows == 1600


def test_the_token_is_never_shown(spark_session: Any, capfd: pytest.CaptureFixture[str]) -> None:
    server = embedded_server()
    assert server is not None and server.proc is not None
    token = server._token
    assert len(token) >= 32
    assert token not in repr(server)
    assert token not in os.environ.get(TOKEN_ENV, "")  # only in the server's environment
    with open(f"/proc/{server.proc.pid}/cmdline", "rb") as f:
        assert token.encode() not in f.read()  # `ps` shows the command line to every user
    with open(server.log_path, "rb") as f:
        assert token.encode() not in f.read()
    out, err = capfd.readouterr()
    assert token not in out and token not in err


# -- item 19: folders of killed servers ---------------------------------------------

def _holder(path: str) -> subprocess.Popen[str]:
    """A live process holding an flock on ``path`` until its stdin closes."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_folders_no_live_process_holds(tmp_path: Any) -> None:
    def folder(name: str, lock: bool) -> str:
        path = tmp_path / name
        (path / "tmp").mkdir(parents=True)
        (path / "spark-connect-server.log").write_text("log")
        if lock:
            (path / LOCK_NAME).write_text("")
        return str(path)

    dead = _dead_pid()
    unlocked = folder(f"{FOLDER_PREFIX}{dead}-aaaa", lock=True)       # killed: lock free
    no_lock_dead = folder(f"{FOLDER_PREFIX}{dead}-bbbb", lock=False)  # killed while starting
    held = folder(f"{FOLDER_PREFIX}{dead}-cccc", lock=True)           # its server still runs
    starting = folder(f"{FOLDER_PREFIX}{os.getpid()}-dddd", lock=False)  # being set up
    other = folder("ucstage-spark-notapid", lock=True)                # not ours to judge
    holder = _holder(os.path.join(held, LOCK_NAME))
    try:
        removed = sweep_stale_servers(str(tmp_path))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
    assert sorted(removed) == sorted([unlocked, no_lock_dead])
    assert not os.path.exists(unlocked) and not os.path.exists(no_lock_dead)
    assert os.path.isdir(held) and os.path.isdir(starting) and os.path.isdir(other)
    # Once its holder is gone, the held one is stale too.
    assert sweep_stale_servers(str(tmp_path)) == [held]


def test_a_running_servers_folder_survives_another_start(spark_session: Any) -> None:
    server = embedded_server()
    assert server is not None and server.log_dir is not None
    assert os.path.basename(server.log_dir).startswith(f"{FOLDER_PREFIX}{os.getpid()}-")
    # Its lock is held by this process and the server: no sweep may take it.
    fd = os.open(os.path.join(server.log_dir, LOCK_NAME), os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert server.log_dir not in sweep_stale_servers(os.path.dirname(server.log_dir))
    assert os.path.isdir(server.log_dir)


def test_stop_leaves_nothing_in_tmp(spark_session: Any, tmp_path: Any,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Spark's local folders and the JVM's temp files go into the server's folder.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    server = EmbeddedServer().start()
    try:
        assert server.log_dir is not None and server.log_dir.startswith(str(tmpdir))
        session = _client(server.url, server._token)
        try:
            assert session.range(1000).repartition(4).count() == 1000  # a shuffle: local dirs
        finally:
            session.client.close()
        assert os.listdir(tmpdir) == [os.path.basename(server.log_dir)]
    finally:
        server.stop()
    assert os.listdir(tmpdir) == []
