"""Writer and Reader in one process (no process group): the publish rule,
the checks of what landed and of what is read, keep=N, the scratch folder,
and the errors for what is not a loadable checkpoint."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from tests.common.parts import wait_until
from ucstage.checkpoint import Reader, Writer, digests, latest
from ucstage.checkpoint.folder import METADATA, RECORD, inspect, read_record
from ucstage.checkpoint.retention import list_checkpoints
from ucstage.checkpoint.upload import FolderDestination, Landed
from ucstage.checkpoint.writer import STALE_SECONDS
from ucstage.errors import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointIncomplete,
    InvalidArgument,
    SourceNotFound,
)


def state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g),
            "loader": '{"format": "ucstage-loader-state"}', "step": seed}


def empty() -> dict[str, Any]:
    return {"w": torch.zeros(64, 64), "b": torch.zeros(64), "loader": "", "step": -1}


def save(path: str, seed: int = 0, **kw: Any) -> None:
    dcp.save(state(seed), storage_writer=Writer(path, **kw))


def load(path: str) -> dict[str, Any]:
    target = empty()
    dcp.load(target, storage_reader=Reader(path))
    return target


def scratch_base() -> str:
    return os.path.join(os.environ["UCSTAGE_CACHE_DIR"], ".ucstage", "checkpoints")


def test_a_save_publishes_files_record_and_metadata_and_loads_equal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "step-1")
    save(path, thread_count=2)
    assert sorted(os.listdir(path)) == sorted(["__0_0.distcp", "__0_1.distcp", RECORD, METADATA])
    record = read_record(path)
    assert record is not None and record.world_size == 1
    for f in record.files:
        assert os.path.getsize(os.path.join(path, f.name)) == f.size
        assert f.checksum.startswith("crc32c:")
        # Every item's range has its checksum, and the ranges tile the file.
        spans = sorted((o, n) for o, n, _ in record.ranges[f.name])
        assert spans[0][0] == 0 and sum(n for _, n in spans) == f.size
    loaded = load(path)
    for key, value in state().items():
        assert torch.equal(loaded[key], value) if isinstance(value, torch.Tensor) \
            else loaded[key] == value
    # The scratch folder is private, and empty once the save is done.
    st = os.lstat(scratch_base())
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert os.listdir(scratch_base()) == []


class Gate(FolderDestination):
    """A folder whose puts wait for the test to open the gate."""

    opened = threading.Event()
    started = threading.Event()

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        Gate.started.set()
        assert Gate.opened.wait(60)
        return super().put(local_path, name, kind)


class GatedWriter(Writer):
    def destination(self) -> FolderDestination:
        return Gate(self.checkpoint_id)


def test_async_save_returns_while_the_upload_runs_and_publishes_when_done(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "step-1")
    Gate.opened.clear()
    Gate.started.clear()
    live = state()
    fut = dcp.async_save(live, storage_writer=GatedWriter(path))
    try:
        assert Gate.started.wait(60)  # the upload has begun in torch's thread...
        assert not fut.done()  # ...the call returned, and nothing is published yet
        assert not os.path.exists(os.path.join(path, METADATA))
        assert inspect(path) is None  # no file has landed yet: not even incomplete
        live["w"].add_(1)  # training goes on: the save holds its own copy
    finally:
        Gate.opened.set()
    fut.result(timeout=120)
    assert torch.equal(load(path)["w"], state()["w"])


class Lossy(FolderDestination):
    """A folder that lands other bytes than it is given (a bad disk, a flaky mount)."""

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        landed = super().put(local_path, name, kind)
        with open(os.path.join(self.root, name), "r+b") as fh:
            fh.seek(landed.size // 2)
            byte = fh.read(1)
            fh.seek(landed.size // 2)
            fh.write(bytes([byte[0] ^ 0xFF]))
        size, checksum, _ = digests.of_file(os.path.join(self.root, name), kind)
        return Landed(size, checksum)


class LossyWriter(Writer):
    def destination(self) -> FolderDestination:
        return Lossy(self.checkpoint_id)


def test_a_copy_that_lands_other_bytes_is_refused_and_nothing_is_published(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "step-1")
    with pytest.raises(CheckpointException, match=r"holds .* bytes \(crc32c:.*\), not the .* written"):
        dcp.save(state(), storage_writer=LossyWriter(path))
    assert not os.path.exists(os.path.join(path, METADATA))
    with pytest.raises(CheckpointIncomplete):
        Reader(path)


def test_a_complete_checkpoint_is_never_written_over(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "step-1")
    save(path)
    with pytest.raises(CheckpointError, match="already exists and is complete"):
        Writer(path)
    with pytest.raises(CheckpointError, match="already exists and is complete"):
        dcp.save(state(), storage_writer=Writer(str(tmp_path / "other")), checkpoint_id=path)
    assert torch.equal(load(path)["w"], state()["w"])


def test_what_is_not_a_loadable_checkpoint_gets_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SourceNotFound, match=r"checkpoint .*nowhere does not exist"):
        Reader(str(tmp_path / "nowhere"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    with pytest.raises(CheckpointError, match=r"notes is not a checkpoint: it holds no "
                                              r"\.metadata and no \.distcp files"):
        Reader(str(tmp_path / "notes"))
    with pytest.raises(InvalidArgument, match="cannot keep checkpoints at memory://"):
        Writer("memory://bucket/ckpt/step-1")
    with pytest.raises(InvalidArgument, match="keep must be 1 or more"):
        Writer(str(tmp_path / "x"), keep=0)


def test_a_missing_or_changed_file_is_named_before_anything_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "step-1")
    save(path, thread_count=2)
    damaged = str(tmp_path / "damaged")
    shutil.copytree(path, damaged)
    os.unlink(os.path.join(damaged, "__0_1.distcp"))
    with pytest.raises(CheckpointCorrupt, match=r"damaged is missing __0_1\.distcp \(rank 0's file"):
        Reader(damaged)
    # A flipped byte keeps the size: the range read fails its checksum.
    flipped = str(tmp_path / "flipped")
    shutil.copytree(path, flipped)
    record = read_record(flipped)
    assert record is not None
    name = record.files[0].name
    offset, length, _ = max(record.ranges[name], key=lambda r: r[1])
    with open(os.path.join(flipped, name), "r+b") as fh:
        fh.seek(offset + length // 2)
        byte = fh.read(1)
        fh.seek(offset + length // 2)
        fh.write(bytes([byte[0] ^ 1]))
    reader = Reader(flipped)  # sizes agree
    with pytest.raises(CheckpointException, match=f"of {name} fail their checksum"):
        dcp.load(empty(), storage_reader=reader)


def test_keep_removes_older_complete_checkpoints_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    parent = tmp_path / "ckpt"
    for i in (1, 2):
        save(str(parent / f"step-{i}"), seed=i)
    # A save another job is still writing (or a dead one): never removed.
    (parent / "step-0").mkdir()
    (parent / "step-0" / "__0_0.distcp").write_bytes(b"partial")
    os.utime(parent / "step-0" / "__0_0.distcp", (time.time() - 3600,) * 2)
    (parent / "notes").mkdir()  # not a checkpoint: not touched
    save(str(parent / "step-3"), seed=3, keep=2)
    assert sorted(os.listdir(parent)) == ["notes", "step-0", "step-2", "step-3"]
    found = {c.name: c.complete for c in list_checkpoints(str(parent))}
    assert found == {"step-0": False, "step-2": True, "step-3": True}
    save(str(parent / "step-4"), seed=4, keep=1)
    assert sorted(os.listdir(parent)) == ["notes", "step-0", "step-4"]
    assert torch.equal(load(str(parent / "step-4"))["w"], state(4)["w"])


def test_scratch_is_never_reached_through_a_link(tmp_path) -> None:  # type: ignore[no-untyped-def]
    save(str(tmp_path / "step-1"))
    base = scratch_base()
    os.rmdir(base)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, base)
    with pytest.raises(CheckpointException, match="is not a private folder of yours"):
        save(str(tmp_path / "step-2"))
    assert os.listdir(elsewhere) == []
    assert not os.path.exists(tmp_path / "step-2" / METADATA)


def test_latest_is_the_newest_complete_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    parent = tmp_path / "ckpt"
    parent.mkdir()
    assert latest(str(parent)) is None
    save(str(parent / "step-2"), seed=2)
    save(str(parent / "step-10"), seed=10)  # sorts before step-2 by name: time decides
    (parent / "step-11").mkdir()
    (parent / "step-11" / "__0_0.distcp").write_bytes(b"partial")  # newer, incomplete
    assert latest(str(parent)) == str(parent / "step-10")
    assert load(latest(str(parent)) or "")["step"] == 10
    with pytest.raises(SourceNotFound):
        latest(str(tmp_path / "nowhere"))


def test_scratch_of_a_dead_process_is_swept_once_stale(tmp_path) -> None:  # type: ignore[no-untyped-def]
    save(str(tmp_path / "step-1"))
    base = scratch_base()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    fresh, stale, alive = (os.path.join(base, f"{pid}-{tag}") for pid, tag in
                           ((dead, "fresh"), (dead, "stale"), (os.getppid(), "alive")))
    for folder in (fresh, stale, alive):
        os.mkdir(folder, 0o700)
    old = time.time() - 2 * STALE_SECONDS
    os.utime(stale, (old, old))
    os.utime(alive, (old, old))
    save(str(tmp_path / "step-2"))
    # A dead pid may be a live save in another container sharing the cache:
    # only a stale folder of a dead pid goes.
    assert sorted(os.listdir(base)) == sorted(os.path.basename(f) for f in (fresh, alive))


INTERRUPTED = """
import os, sys, torch, torch.distributed.checkpoint as dcp
from ucstage.checkpoint import Writer
from ucstage.checkpoint.upload import FolderDestination

class Marked(FolderDestination):
    def put(self, local_path, name, kind):
        open(sys.argv[2], "a").close()
        return super().put(local_path, name, kind)

class MarkedWriter(Writer):
    def destination(self):
        return Marked(self.checkpoint_id)

state = {f"t{i}": torch.randn(8 * 1024 * 1024) for i in range(8)}
dcp.save(state, storage_writer=MarkedWriter(sys.argv[1], thread_count=8, upload_threads=2))
"""


def test_ctrl_c_mid_upload_publishes_nothing_and_leaves_no_scratch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, marker = str(tmp_path / "step-1"), tmp_path / "uploading"
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, path, str(marker)],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: marker.exists() or proc.poll() is not None, "the upload to start",
                   timeout=240)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    assert not os.path.exists(os.path.join(path, METADATA))
    # Uploads start while torch writes, so a Ctrl-C may land before the
    # folder exists at all: nothing there, or an incomplete checkpoint.
    found = inspect(path)
    assert found is None or not found.complete
    assert os.listdir(scratch_base()) == []
    with pytest.raises(CheckpointIncomplete):
        Reader(path)


class _CountingFile:
    """A file object that counts the bytes read through it."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.count = 0

    def seek(self, *args: Any) -> int:
        return int(self.file.seek(*args))

    def read(self, *args: Any) -> bytes:
        data = self.file.read(*args)
        self.count += len(data)
        return bytes(data)


class CountingReader(Reader):
    read_bytes = 0

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        counting = _CountingFile(file)
        view = super()._slice_file(counting, sinfo)
        CountingReader.read_bytes += counting.count
        return view


def test_a_load_reads_only_the_ranges_it_asks_for(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "step-1")
    save(path)  # one file holding w (16 KiB), b and the small values
    record = read_record(path)
    assert record is not None
    (f,) = record.files
    CountingReader.read_bytes = 0
    target = {"b": torch.zeros(64)}  # only b: the rest of the file is not read
    dcp.load(target, storage_reader=CountingReader(path))
    assert torch.equal(target["b"], state()["b"])
    sizes = sorted(n for _, n, _ in record.ranges[f.name])
    assert CountingReader.read_bytes in sizes and CountingReader.read_bytes < f.size // 4


def test_a_link_planted_at_a_files_name_is_not_written_through(tmp_path) -> None:  # type: ignore[no-untyped-def]
    victim = tmp_path / "victim"
    victim.write_bytes(b"a neighbour's file")
    dest = tmp_path / "ckpt" / "step-1"
    dest.mkdir(parents=True)
    os.symlink(victim, dest / "__0_0.distcp")
    with pytest.raises((OSError, CheckpointException)) as info:
        dcp.save({"t": torch.ones(1000)}, storage_writer=Writer(str(dest)))
    assert "__0_0.distcp in " in str(info.value)
    assert "is a symbolic link: the save does not write through it" in str(info.value)
    assert victim.read_bytes() == b"a neighbour's file"
    assert not (dest / METADATA).exists()


def test_an_upload_waiting_on_a_stalled_writer_gives_up_naming_the_file(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """torch's writer wrote part of a file and then nothing (a hung local
    disk): the upload waiting for the next bytes gives up after STALL_S and
    says which file and byte it waited for, instead of holding the save."""
    from ucstage.checkpoint import tee

    monkeypatch.setattr(tee, "STALL_S", 0.3)
    growing = tee.Growing(str(tmp_path / "__0_0.distcp"), "crc32c")
    growing._publish(4096)
    with pytest.raises(tee.WriteFailed) as info:
        growing.wait(8192)
    assert str(info.value) == ("__0_0.distcp was not written: torch wrote no byte of it for "
                               "0.3 s (waited for byte 8,192; it holds 4,096)")
    assert growing.wait(4096) == 4096  # what it holds is still served at once
