"""Persistent workers over the FUSE mount and over moto, 6 workers: after
`del loader` and after Ctrl-C no process, thread or temp file is left (the
workers, the forkserver, /dev/shm epoch records, cache part files and holds,
the temp folder), and 3 shuffled epochs deliver, slot by slot, what
`ucstage shard-plan --epoch E` prints.

Each cleanup case runs a real training script (tests/workers/persistent_worker.py)
in its own process and session, its temp folder ($TMPDIR) private to the test
and a marker in its environment, so every process it started, whoever reaped
it, can be found in /proc afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.common.backends import make_source
from tests.common.parts import REPO, pid_alive, readable, unique, wait_visible
from ucstage.data import DataLoader, VolumeDataset

from .test_persistent import BySlot, _held_or_copying, _listify

pytestmark = [pytest.mark.fuse, pytest.mark.s3]

WORKER = os.path.join(REPO, "tests", "workers", "persistent_worker.py")
WORKERS = 6
FILES = {f"d{i % 3}/f{i:03d}.bin": bytes([i % 256]) * (16 << 10) for i in range(240)}


@pytest.fixture(params=["fuse", "s3"])
def source(request: pytest.FixtureRequest, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> str:
    """FILES on the rclone FUSE mount, or in the moto bucket (obstore engine;
    the main process only lists there, through a child, so workers fork)."""
    if request.param == "s3":
        request.getfixturevalue("moto")
        monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
        return make_source("s3", str(tmp_path / "src"), FILES)
    backing, mnt = request.getfixturevalue("fuse_volume")
    key = unique("persist")
    make_source("local", os.path.join(backing, key), FILES)
    for name in FILES:
        wait_visible(os.path.join(mnt, key, name))
    return os.path.join(mnt, key)


def _marked(marker: str) -> list[int]:
    """Processes whose environment carries ``marker`` (all a script started)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if marker.encode() in fh.read() and pid_alive(int(name)):
                    found.append(int(name))
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """The script's $TMPDIR: short, because the forkserver binds a Unix socket
    in it and such a path is at most 107 bytes (pytest's tmp_path under xdist
    is longer: 'AF_UNIX path too long')."""
    tmp = Path(tempfile.mkdtemp(prefix="ucpc-", dir="/tmp"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def scripts() -> Iterator[list[subprocess.Popen[str]]]:
    """The scripts a test starts; whatever is left of their sessions is killed at teardown."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _script(tmp_path: Path, tmp: Path, src: str, mode: str,
            started: list[subprocess.Popen[str]]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    marker = f"UCSTAGE_TEST_MARK={unique('mark')}"
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": REPO,
           marker.split("=")[0]: marker.split("=")[1]}
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, WORKER, src, str(tmp_path / "cache"), mode],
                                env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
    started.append(proc)
    return proc, {"marker": marker, "tmp": str(tmp), "stderr": str(tmp_path / "stderr.txt")}


def _line(proc: subprocess.Popen[str], prefix: str, info: dict[str, Any],
          timeout: float = 120) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if readable(proc.stdout, 0.5):
            line = proc.stdout.readline()
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            if not line and proc.poll() is not None:
                break
    pytest.fail(f"no {prefix!r} line from the script; stderr:\n"
                + Path(info["stderr"]).read_text()[-3000:])


def _assert_nothing_left(tmp_path: Path, info: dict[str, Any], record_folder: str) -> None:
    # Orphaned workers notice a dead parent by polling; the bound only stops
    # a hang (processes end slowly on a loaded machine).
    deadline = time.monotonic() + 120
    while _marked(info["marker"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in _marked(info["marker"])}
    assert not left, f"processes left: {left}"
    assert not os.path.exists(record_folder), "the epoch record's folder is left"
    assert os.listdir(info["tmp"]) == [], "temp files left (forkserver socket, ...)"
    held, parts = _held_or_copying(str(tmp_path / "cache"))
    assert (held, parts) == ([], []), f"held {held}, part files {parts}"


@pytest.mark.torchrun  # a script and its 6 workers: not beside the other process-heavy tests
def test_del_loader_leaves_nothing(source: str, tmp_path: Path, short_tmp: Path,
                                   scripts: list[subprocess.Popen[str]]) -> None:
    proc, info = _script(tmp_path, short_tmp, source, "del", scripts)
    left = json.loads(_line(proc, "LEFT ", info))
    assert proc.wait(120) == 0, Path(info["stderr"]).read_text()[-3000:]
    assert left["workers"] == [] and left["threads"] == [] and not left["record_folder"], left
    # The only children a `del loader` may leave are the standard library's
    # one forkserver and its resource tracker, which the next loader reuses;
    # they end with the process (checked below, and after Ctrl-C). Workers
    # fork over both sources (the main process never ran obstore itself).
    assert all("forkserver" in cmd or "resource_tracker" in cmd
               for cmd in left["children"].values()), left["children"]
    assert not any("forkserver" in cmd for cmd in left["children"].values()), left["children"]
    _assert_nothing_left(tmp_path, info, "/nonexistent")


@pytest.mark.torchrun
def test_ctrl_c_ends_the_script_and_leaves_nothing(source: str, tmp_path: Path, short_tmp: Path,
                                                   scripts: list[subprocess.Popen[str]]) -> None:
    proc, info = _script(tmp_path, short_tmp, source, "sigint", scripts)
    ready = json.loads(_line(proc, "READY ", info))
    # Forked, or forked by the forkserver: either way the marker finds them.
    assert len(ready["workers"]) == WORKERS
    assert set(ready["workers"]) <= set(_marked(info["marker"]))
    assert os.path.isdir(ready["record_folder"])
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: the whole group
    # Not a timing assert (the machine may be loaded): the bound only stops a
    # hang (a thread that never ends). A worker left for torch's 5 s join
    # shows as a -15 exit code, checked below.
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the script did not exit after Ctrl-C; stderr:\n"
                    + Path(info["stderr"]).read_text()[-3000:])
    assert proc.returncode == 130, Path(info["stderr"]).read_text()[-3000:]
    assert proc.stdout is not None
    said = proc.stdout.read()
    assert "interrupted in epoch" in said, said
    # Every worker ended by itself on the interrupt: none had to be terminated.
    assert f"stopped {WORKERS} workers" in said and "exit codes [0, 0, 0, 0, 0, 0]" in said, said
    _assert_nothing_left(tmp_path, info, ready["record_folder"])


def _shard_plan(src: str, epoch: int) -> dict[int, list[str]]:
    """``shard-plan --epoch E --json``'s files per slot (one rank, WORKERS workers)."""
    done = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", src, "-w", "1",
                           "-k", str(WORKERS), "--shuffle", "--seed", "5", "--epoch",
                           str(epoch), "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    return {s["worker"]: s["files"] for s in json.loads(done.stdout)["slots"]}


def test_three_shuffled_epochs_deliver_what_shard_plan_prints_per_slot(
        source: str, tmp_path: Path) -> None:
    ds = VolumeDataset(source, cache_dir=str(tmp_path / "cache"), shuffle=True, seed=5)
    loader = DataLoader(BySlot(ds), batch_size=4, collate_fn=_listify, log_mlflow=False,
                        num_workers=WORKERS)
    assert loader.persistent_workers
    pids = None
    root = None
    for epoch in range(3):
        ds.set_epoch(epoch)
        got: dict[int, list[str]] = {w: [] for w in range(WORKERS)}
        for batch in loader:
            # Once: resolving the volume asks the store each time (moto: ~0.1 s).
            root = root or ds.cache().namespace_dir(ds.freeze().volume())
            for wid, path in batch:
                got[wid].append(os.path.relpath(path, root))
        assert got == _shard_plan(source, epoch), f"epoch {epoch}"
        now = [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]
        assert pids is None or now == pids  # the same worker processes every epoch
        pids = now
    assert sorted(got[0] + [p for w in range(1, WORKERS) for p in got[w]]) == sorted(FILES)


def test_resume_mid_epoch_into_live_persistent_workers(source: str, tmp_path: Path) -> None:
    """A state taken mid-epoch, loaded into loaders whose workers are alive
    (the same loader after a `break`, and one of another worker count): each
    delivers the rest of that epoch, every file once."""
    ds = VolumeDataset(source, cache_dir=str(tmp_path / "cache"), shuffle=True, seed=2)
    loader = DataLoader(BySlot(ds), batch_size=4, collate_fn=_listify, log_mlflow=False,
                        num_workers=WORKERS)
    for _ in loader:  # epoch 0 whole: the workers live on from here
        pass
    ds.set_epoch(1)
    first: list[str] = []
    for i, batch in enumerate(loader):
        first += [path for _, path in batch]
        if i == 9:
            break
    state = loader.state_dict()
    pids = [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]
    other = DataLoader(BySlot(VolumeDataset(source, cache_dir=str(tmp_path / "cache"),
                                            shuffle=True, seed=2)),
                       batch_size=4, collate_fn=_listify, log_mlflow=False, num_workers=4)
    for _ in other:  # its workers start (epoch 0) before the state is loaded
        pass
    for resumed in (loader, other):
        resumed.load_state_dict(state)
        rest = [path for batch in resumed for _, path in batch]
        got = sorted(os.path.relpath(p, tmp_path / "cache") for p in first + rest)
        assert len(got) == len(FILES) and len(set(got)) == len(FILES), "a file twice or never"
    assert [w.pid for w in loader._iterator._workers] == pids  # type: ignore[union-attr]
