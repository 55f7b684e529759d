"""Stopping a warm: Ctrl-C and SIGTERM on real slow and hung FUSE mounts.

Issue 10, item 8. The copies go through an rclone mount with ``--bwlimit``
(slow) or with its daemon stopped by SIGSTOP (hung: every read blocks in the
kernel until it is continued). No test measures time: each checks what was
copied, what was left on disk, the ledger and the exit code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.common.parts import rclone_mount
from ucstage.cache import LocalCache
from ucstage.cache.paths import PART_SUFFIX
from ucstage.manifest import snapshot
from ucstage.progress import Callback

KB = 1024
FILES, SIZE, JOBS = 64, 256 * KB, 4
# 16 MiB at 512 KiB/s: rclone's token bucket lets the first few MiB through
# at once, and the rest takes well over 20 s, so a warm is still copying when
# the signal comes, however slowly this machine started it.
BWLIMIT = "512k"


def _write(backing: Path, n: int = FILES, size: int = SIZE) -> dict[str, bytes]:
    files = {f"d{i % 4}/f{i:03d}.bin": os.urandom(size) for i in range(n)}
    for rel, data in files.items():
        (backing / rel).parent.mkdir(parents=True, exist_ok=True)
        (backing / rel).write_bytes(data)
    return files


def _cached(cache_dir: Path) -> dict[str, int]:
    """relative path -> size of every cached file (temp files excluded)."""
    found = {}
    for ns in cache_dir.iterdir() if cache_dir.is_dir() else []:
        if ns.name.startswith(".") or not ns.is_dir():
            continue
        for p in ns.rglob("*"):
            if p.is_file() and not p.name.endswith(PART_SUFFIX):
                found[str(p.relative_to(ns))] = p.stat().st_size
    return found


def _partials(cache_dir: Path) -> list[str]:
    return [str(p) for p in cache_dir.rglob(f"*{PART_SUFFIX}")] if cache_dir.is_dir() else []


def _ledger(cache_dir: Path) -> int:
    return int((cache_dir / ".ucstage" / "usage").read_text().strip() or 0)


def _poll(what: str, ok, proc: subprocess.Popen | None = None,  # type: ignore[no-untyped-def,type-arg]
          timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended before {what}: {proc.returncode}\n{out}\n{err}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _rclone_pid(backing: Path, mnt: Path) -> int:
    """The rclone daemon serving exactly this mount (found by its arguments)."""
    want = ["rclone", "mount", str(backing), str(mnt)]
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv[:4]]
        if len(args) == 4 and os.path.basename(args[0]) == want[0] and args[1:] == want[1:]:
            return int(entry.name)
    raise AssertionError(f"no rclone daemon for {mnt}")


@contextlib.contextmanager
def _hung(backing: Path, mnt: Path) -> Iterator[None]:
    """Stop the mount's daemon (SIGSTOP): every new request to it blocks until
    the block ends (SIGCONT)."""
    pid = _rclone_pid(backing, mnt)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _blocked_on_fuse(pid: int) -> bool:
    """Whether the process's main thread waits for an answer from a FUSE daemon."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() == "request_wait_answer"
    except OSError:
        return False


def _warm(mnt: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:  # type: ignore[type-arg]
    return subprocess.Popen(
        [sys.executable, "-m", "ucstage", "cache", "warm", str(mnt), "--jobs", str(JOBS),
         *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:  # type: ignore[type-arg]
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.fuse
@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_signal_stops_warm_on_a_slow_mount(tmp_path: Path, sig: int, code: int,
                                           word: str) -> None:
    """Queued copies are cancelled and none starts after the signal; the
    summary says what was done; nothing partial stays; the ledger is right."""
    backing, mnt, cache_dir = tmp_path / "backing", tmp_path / "mnt", tmp_path / "cache"
    files = _write(backing)
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(cache_dir)}
    with rclone_mount(str(backing), str(mnt), "--bwlimit", BWLIMIT):
        # Under a cap every copy reserves its bytes: the ledger must get back
        # those of the copies the stop abandons.
        proc = _warm(mnt, env, "--max-bytes", "1G")
        _poll("two files were cached", lambda: len(_cached(cache_dir)) >= 2, proc)
        at_signal = len(_cached(cache_dir))
        proc.send_signal(sig)
        out, err = _finish(proc)
        assert proc.returncode == code, out + err
        cached = _cached(cache_dir)
        # No copy starts after the signal: at most the ones in flight then finish.
        assert at_signal <= len(cached) <= at_signal + JOBS + 1 < FILES, (at_signal, len(cached))
        assert f"stopped: {len(cached)} of {FILES} files copied" in err, err
        assert f"{FILES - len(cached)} not copied" in err and word in err
        assert "Traceback" not in err and out == ""
        assert _partials(cache_dir) == []
        assert _ledger(cache_dir) == sum(cached.values())
        for rel in cached:
            ns = next(p for p in cache_dir.iterdir() if not p.name.startswith("."))
            assert (ns / rel).read_bytes() == files[rel], rel
        # The process is gone with its threads, and the cache does not change after it.
        assert _cached(cache_dir) == cached
        rerun = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", str(mnt),
                                "--json", "--include", "f00*"], env=env, capture_output=True,
                               text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr  # resumes over what the stop left


@pytest.mark.fuse
def test_sigterm_stops_warm_on_a_hung_mount(tmp_path: Path) -> None:
    """Copies blocked in reads of a hung mount are abandoned, not waited for:
    while the mount still hangs, the warm says what it did and removes their
    temp files. (The process itself can only end once the mount answers the
    reads already sent to it: the kernel lets nothing interrupt those.)"""
    backing, mnt, cache_dir = tmp_path / "backing", tmp_path / "mnt", tmp_path / "cache"
    _write(backing)
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(cache_dir)}
    log = tmp_path / "stderr.log"
    with rclone_mount(str(backing), str(mnt), "--bwlimit", BWLIMIT), open(log, "w") as errfile:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ucstage", "cache", "warm", str(mnt), "--jobs", str(JOBS),
             "--max-bytes", "1G"], env=env, stdout=subprocess.DEVNULL, stderr=errfile)
        try:
            _poll("a copy in flight", lambda: bool(_partials(cache_dir)), proc)
            with _hung(backing, mnt):
                before = len(_cached(cache_dir))
                proc.send_signal(signal.SIGTERM)
                _poll("the stop to be reported while the mount hangs",
                      lambda: "terminated" in log.read_text(), timeout=30)
                assert _partials(cache_dir) == []
                cached = _cached(cache_dir)
            assert proc.wait(timeout=60) == 143
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = log.read_text()
    assert f"stopped: {len(cached)} of {FILES} files copied" in err, err
    assert before <= len(cached) < FILES and _cached(cache_dir) == cached
    assert _partials(cache_dir) == []
    assert _ledger(cache_dir) == sum(cached.values())


@pytest.mark.fuse
@pytest.mark.parametrize("command", ["lazy", "warm"])
def test_ctrl_c_stops_the_listing(tmp_path: Path, command: str) -> None:
    """Ctrl-C while the listing waits on the mount stops it as soon as the
    mount answers, says so, and writes nothing."""
    backing, mnt, cache_dir = tmp_path / "backing", tmp_path / "mnt", tmp_path / "cache"
    _write(backing, n=8, size=KB)
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(cache_dir)}
    with rclone_mount(str(backing), str(mnt)):
        proc = subprocess.Popen([sys.executable, "-m", "ucstage", "cache", command, str(mnt)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            with _hung(backing, mnt):
                # The signal arrives while the listing is blocked in the
                # kernel; it is handled once the mount answers (SIGCONT).
                _poll("the listing to wait on the mount", lambda: _blocked_on_fuse(proc.pid),
                      proc)
                proc.send_signal(signal.SIGINT)
            out, err = _finish(proc, timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, out + err
    assert f"stopped while listing {mnt}: nothing written or copied" in err, err
    assert "interrupted" in err and "Traceback" not in err
    assert list(cache_dir.glob("*.manifest.*")) == [] and _cached(cache_dir) == {}


class _SignalAfter(Callback):
    """Sends this process a real SIGINT from another thread once ``n`` files are
    done, while the calling thread waits for the warm's copies."""

    def __init__(self, n: int) -> None:
        self.n, self.done, self.sent = n, 0, threading.Event()

    def item_done(self, name: str, status: str, error: str = "") -> None:
        self.done += 1
        if self.done == self.n and not self.sent.is_set():
            self.sent.set()
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT)).start()


@pytest.mark.fuse
def test_keyboard_interrupt_stops_the_library_warm(tmp_path: Path) -> None:
    """LocalCache.warm: KeyboardInterrupt in the waiting thread stops it; no
    copy is committed after it returns, and its threads go away."""
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    _write(backing)
    cache_dir = tmp_path / "cache"
    with rclone_mount(str(backing), str(mnt), "--bwlimit", BWLIMIT):
        m = snapshot(str(mnt))
        cache = LocalCache(cache_dir, max_bytes=1 << 30)
        callback = _SignalAfter(2)
        with pytest.raises(KeyboardInterrupt):
            cache.warm(m.volume(), m.entries, jobs=JOBS, callback=callback)
        at_return = _cached(cache_dir)
        assert callback.sent.is_set() and 2 <= len(at_return) < FILES
        assert _partials(cache_dir) == []  # abandoned copies were removed before it returned
        _poll("the warm's threads to end", lambda: not any(
            t.name.startswith("ucstage-warm") for t in threading.enumerate()))
        assert _cached(cache_dir) == at_return  # nothing was committed after the return
        assert _partials(cache_dir) == []
        assert cache.space.recorded_bytes() == sum(at_return.values())


@pytest.mark.fuse
def test_fetch_with_a_run_can_be_stopped_and_abandoned(tmp_path: Path) -> None:
    """LocalCache.fetch(inflight=): what a dataset's read-ahead stops its copies with.
    A copy blocked in a read of a hung mount is given up at once by abandon();
    its thread then leaves the cache alone; a stopped run copies nothing more."""
    from ucstage.cache import Inflight
    from ucstage.cache.inflight import Stopped

    backing, mnt, cache_dir = tmp_path / "backing", tmp_path / "mnt", tmp_path / "cache"
    _write(backing, n=4)
    with rclone_mount(str(backing), str(mnt), "--bwlimit", BWLIMIT):
        m = snapshot(str(mnt))
        vol, entries = m.volume(), list(m.entries)
        cache = LocalCache(cache_dir, max_bytes=1 << 30)
        inflight = Inflight()
        first = cache.fetch(vol, entries[0], inflight=inflight)  # an ordinary fetch until stopped
        outcome: list[BaseException | str] = []

        def fetch_second() -> None:
            try:
                outcome.append(cache.fetch(vol, entries[1], inflight=inflight))
            except BaseException as exc:
                outcome.append(exc)

        with _hung(backing, mnt):
            thread = threading.Thread(target=fetch_second, daemon=True)
            thread.start()
            # Copying, not only created: a temp file exists a moment before its
            # copy is registered, and a copy still reserving is not abandoned
            # (it sees the stop and removes its own temp file).
            _poll("a copy in flight", lambda: inflight.copying_now == 1)
            assert _partials(cache_dir)
            inflight.stop()
            assert cache.abandon(inflight) == 1
            assert _partials(cache_dir) == []  # while the read still hangs
            assert cache.space.recorded_bytes() == SIZE  # the first file only
        thread.join(60)
        assert not thread.is_alive() and isinstance(outcome[0], Stopped)
        assert _cached(cache_dir) == {entries[0].path: SIZE} and _partials(cache_dir) == []
        assert cache.space.recorded_bytes() == SIZE
        assert cache.fetch(vol, entries[0], inflight=inflight) == first  # cached: still handed out
        with pytest.raises(Stopped):
            cache.fetch(vol, entries[2], inflight=inflight)  # stopped: no new copy
        assert _cached(cache_dir) == {entries[0].path: SIZE}
