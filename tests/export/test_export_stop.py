"""Stopping ``ucstage export``: Ctrl-C, SIGTERM and ``kill -9`` of a real process mid-write.

Each test runs ``python -m ucstage export`` as a user would, with its own
$TMPDIR so that its embedded Spark server's folder is the only one there,
waits (polling) until Spark writes into the staging folder, then signals it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from typing import Any

import pytest

from tests.common.parts import pid_alive
from tests.common.spark import (
    BIG_ROWS,
    beside_dest,
    dest_listing,
    export_process,
    exported_table,
    server_folders,
    server_pids,
    wait_writing,
)
from ucstage.export import export_table, read_record
from ucstage.export.embedded import LOCK_NAME
from ucstage.export.interrupt import signals_deferred

pytestmark = pytest.mark.spark




def _wait(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s")
        time.sleep(0.05)


@pytest.mark.parametrize(("signum", "code", "word"), [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "terminated"),
])
def test_signal_mid_write_stops_spark_and_keeps_dest(
        spark_session: Any, big_table: str, tmp_path: Any, signum: int, code: int,
        word: str) -> None:
    dest = str(tmp_path / "vol" / "big")
    export_table(big_table, dest, files=2)  # the previous export
    before = dest_listing(dest)
    tmpdir = str(tmp_path / "tmp")

    proc = export_process(big_table, dest, tmpdir, "--files", "3")
    try:
        wait_writing(proc, dest)
        [folder] = server_folders(tmpdir)
        pids = server_pids(folder)
        assert pids, "no Spark server works in its folder"
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    # It says what it did, then how it stopped; off a terminal each step was a line.
    assert "export: writing 3,000,000 rows" in err
    assert "stopped: the export was abandoned while writing 3,000,000 rows; the embedded " \
           "Spark server was stopped, nothing was published" in err, err
    assert err.rstrip().endswith(word)
    assert dest_listing(dest) == before
    assert read_record(dest) is not None and read_record(dest).options["files"] == 2  # type: ignore[union-attr]
    assert beside_dest(dest) == []  # no staging folder, no lock file
    assert server_folders(tmpdir) == []
    assert [p for p in pids if pid_alive(p)] == []


def test_kill_9_leftovers_are_removed_by_the_next_export(
        spark_session: Any, big_table: str, tmp_path: Any) -> None:
    dest = str(tmp_path / "vol" / "big")
    tmpdir = str(tmp_path / "tmp")
    proc = export_process(big_table, dest, tmpdir)
    try:
        wait_writing(proc, dest)
        [folder] = server_folders(tmpdir)
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # What a kill -9 leaves: the staging folder and lock beside DEST, the server's folder.
    assert any(".ucstage-staging-" in n for n in beside_dest(dest))
    assert ".big.ucstage.lock" in beside_dest(dest)
    # The server dies with its parent (PR_SET_PDEATHSIG), and then holds its lock no more.
    _wait(lambda: not _locked(os.path.join(folder, LOCK_NAME)), "the killed server's lock "
          "was not released")

    again = export_process(big_table, dest, tmpdir)
    _out, err = again.communicate(timeout=600)
    assert again.returncode == 0, err
    assert not os.path.exists(folder)
    assert server_folders(tmpdir) == []
    assert beside_dest(dest) == []
    assert exported_table(dest).num_rows == BIG_ROWS


def _locked(path: str) -> bool:
    """True while some process holds an flock on ``path``."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# -- the swap is never cut in half ----------------------------------------------

def test_signals_deferred_delivers_after_the_block() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), signals_deferred():
        signal.raise_signal(signal.SIGINT)
        steps.append("first rename")
        steps.append("second rename")
    assert steps == ["first rename", "second rename"]
    # The handlers are back: Ctrl-C raises at once again.
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        steps.append("not reached")
    assert steps == ["first rename", "second rename"]


def test_signals_deferred_keeps_the_callers_handler() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with signals_deferred():
            signal.raise_signal(signal.SIGTERM)
            assert seen == []
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_signals_deferred_off_the_main_thread_changes_nothing() -> None:
    handler = signal.getsignal(signal.SIGINT)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with signals_deferred():
                assert signal.getsignal(signal.SIGINT) is handler
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert errors == []
