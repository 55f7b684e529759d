"""ucstage.aside: one call in a short-lived forked child, its result or its
error here, and Ctrl-C ending the child at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ucstage.aside import aside
from ucstage.errors import SourceUnreadable


def _pid_and(value: int) -> tuple[int, int]:
    return os.getpid(), value * 2


def test_the_call_runs_in_another_process_and_returns_here() -> None:
    pid, doubled = aside(_pid_and, 21)
    assert doubled == 42
    assert pid != os.getpid()


def test_a_large_result_crosses_the_pipe_whole() -> None:
    blob = aside(os.urandom, 5 << 20)  # several pipe buffers' worth
    assert len(blob) == 5 << 20


def _raise_ucstage() -> None:
    raise SourceUnreadable("cannot read s3://b: no credentials", hint="set AWS_PROFILE")


def test_an_error_is_raised_here_with_its_hint() -> None:
    with pytest.raises(SourceUnreadable) as info:
        aside(_raise_ucstage)
    assert info.value.message == "cannot read s3://b: no credentials"
    assert info.value.hint == "set AWS_PROFILE"


class _Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("store said no")
        self.lock = __import__("threading").Lock()


def _raise_unpicklable() -> None:
    raise _Unpicklable()


def test_an_error_that_does_not_pickle_arrives_as_an_oserror_with_its_text() -> None:
    with pytest.raises(OSError, match="_Unpicklable: store said no"):
        aside(_raise_unpicklable)


CTRL_C = r'''
import os, sys, time
from ucstage.aside import aside

def wait(marker):
    with open(marker, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(120)

try:
    aside(wait, sys.argv[1])
except KeyboardInterrupt:
    print("interrupted")
'''


def test_ctrl_c_ends_the_child_and_the_call(tmp_path) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C, str(marker)],
                            stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(600):  # the child is running once it wrote its pid
            if marker.exists() and marker.read_text():
                break
            time.sleep(0.05)
        child = int(marker.read_text())
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.strip() == "interrupted"
    with pytest.raises(ProcessLookupError):  # reaped, not left behind
        os.kill(child, 0)
