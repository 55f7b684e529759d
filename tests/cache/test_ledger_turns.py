"""A process's threads take turns at the byte ledger (ucstage.cache.space.Turns):
what waits while the lock is held elsewhere is settled in one batch, every
operation sees the ledger as if it ran alone, one that fails fails alone, and
a forked child is never stuck behind its parent's turn. All on a real cache
root and a real ``flock``."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ucstage.cache import LocalCache
from ucstage.cache.space import CacheSpace, Ledger, Turns, locked_ledger
from ucstage.manifest import snapshot


@pytest.fixture
def space(tmp_path: Path) -> CacheSpace:
    return LocalCache(str(tmp_path / "cache")).space


class Counted:
    """``locked_ledger`` of a root (the real lock), counting its holds."""

    def __init__(self, root: str) -> None:
        self.root, self.holds = root, 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Ledger]:
        with locked_ledger(self.root, lambda: 0) as ledger:
            self.holds += 1
            yield ledger


def _add(n: int):
    def op(ledger: Ledger) -> int:
        ledger.write(ledger.read() + n)
        return ledger.read()
    return op


def _value(root: str) -> int:
    with locked_ledger(root, lambda: -1) as ledger:
        return ledger.read()


def test_what_waits_for_the_lock_is_settled_in_one_hold(space: CacheSpace) -> None:
    counted = Counted(space.root)
    turns = Turns(counted)
    turns.run(_add(0))  # the ledger file exists, value 0
    results: list[int] = []
    # Another holder (as another process would be) keeps the lock while 8
    # threads queue their operations.
    with locked_ledger(space.root, lambda: 0):
        threads = [threading.Thread(target=lambda: results.append(turns.run(_add(1))))
                   for _ in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(turns._queue) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)  # one thread has the turn and waits for the flock
        assert len(turns._queue) == 8
    for t in threads:
        t.join(10)
    # The thread with the turn ran all 8 under one hold: 1 + 1 holds in all.
    assert counted.holds == 2
    assert sorted(results) == list(range(1, 9))  # each saw the ledger as if alone, in order
    assert _value(space.root) == 8


def test_an_operation_that_fails_fails_alone(space: CacheSpace) -> None:
    turns = Turns(Counted(space.root))
    turns.run(_add(5))
    outcomes: dict[str, object] = {}

    def bad(ledger: Ledger) -> None:
        ledger.write(ledger.read() + 1000)
        raise OSError("disk says no")

    def call(name: str, op) -> None:
        try:
            outcomes[name] = turns.run(op)
        except OSError as exc:
            outcomes[name] = exc

    with locked_ledger(space.root, lambda: 0):
        threads = [threading.Thread(target=call, args=(name, op))
                   for name, op in (("a", _add(1)), ("bad", bad), ("b", _add(2)))]
        for t in threads:
            t.start()
            time.sleep(0.05)
    for t in threads:
        t.join(10)
    assert isinstance(outcomes["bad"], OSError) and str(outcomes["bad"]) == "disk says no"
    assert {outcomes["a"], outcomes["b"]} <= {6, 8, 1006, 1008}  # each ran, in some order
    # What the failed operation wrote before it raised stays (as a direct
    # holder's would): operations write only once they cannot fail.
    assert _value(space.root) == 1008


def test_a_forked_child_takes_its_own_turns(space: CacheSpace) -> None:
    turns = Turns(Counted(space.root))
    turns.run(_add(1))
    turns._turn.acquire()  # a parent thread in its turn at the moment of the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: never stuck behind the parent's turn
            try:
                os._exit(0 if turns.run(_add(1)) == 2 else 1)
            except BaseException:
                os._exit(2)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child waited for its parent's turn")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        turns._turn.release()
    assert _value(space.root) == 2


def test_threads_copying_at_once_leave_the_ledger_exact(tmp_path: Path) -> None:
    """Reserving and committing from 16 threads at once, batched: the ledger
    ends equal to a recount of the tree."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(400):
        (src / f"f{i:03d}.bin").write_bytes(os.urandom(1000 + i))
    cache = LocalCache(str(tmp_path / "cache"))
    m = snapshot(str(src))
    vol = m.volume()
    batches = Counted(cache.root)
    cache.space.turns = Turns(batches)
    todo = list(m.entries)
    lock = threading.Lock()

    def fetch_all() -> None:
        while True:
            with lock:
                if not todo:
                    return
                entry = todo.pop()
            cache.fetch(vol, entry)

    threads = [threading.Thread(target=fetch_all) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    total = sum(1000 + i for i in range(400))
    assert cache.status().bytes == total
    assert cache.space.recorded_bytes() == total
    assert batches.holds > 0  # the copies settled through the turns
