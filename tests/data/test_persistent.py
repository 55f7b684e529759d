"""Persistent DataLoader workers (the default): every epoch's parameters reach
them through the loader's per-epoch record (ucstage/data/channel.py), a
`break` lets go of their holds and copies, and `del loader` leaves nothing."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import IterableDataset, get_worker_info

from tests.common.backends import make_source
from tests.common.parts import pid_alive
from ucstage.cache import paths
from ucstage.cache.leases import take_exclusive
from ucstage.data import DataLoader, VolumeDataset
from ucstage.data.channel import ChannelLink, StaleEpochRecord
from ucstage.sharding import Layout, ReadOrder, Slot, slot_array

from .test_data import rel, write_files

K = 3


class BySlot(IterableDataset):  # type: ignore[type-arg]
    """Yields (worker id, local path): which slot delivered what."""

    def __init__(self, vds: VolumeDataset) -> None:
        self.vds = vds

    def __iter__(self) -> Any:
        info = get_worker_info()
        wid = info.id if info is not None else 0
        for path in self.vds:
            yield wid, path


def _listify(batch: list[Any]) -> list[Any]:
    return batch


def _loader(ds: VolumeDataset, **kw: Any) -> DataLoader:
    kw.setdefault("num_workers", K)
    return DataLoader(BySlot(ds), batch_size=4, collate_fn=_listify, log_mlflow=False, **kw)


def _by_slot(ds: VolumeDataset, batches: Any) -> dict[int, list[str]]:
    got: dict[int, list[str]] = {w: [] for w in range(K)}
    for batch in batches:
        for wid, path in batch:
            got[wid].append(rel(ds, path))
    return got


def test_persistent_by_default_and_explicit_false_wins(tmp_path: Path) -> None:
    write_files(str(tmp_path / "src"), 6)
    ds = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"))
    assert DataLoader(ds, log_mlflow=False, num_workers=2).persistent_workers is True
    assert DataLoader(ds, log_mlflow=False, num_workers=2,
                      persistent_workers=False).persistent_workers is False
    assert DataLoader(ds, log_mlflow=False, num_workers=0).persistent_workers is False


@pytest.mark.parametrize("equal_length", [False, "drop"])
def test_three_shuffled_epochs_deliver_each_slots_shard_plan(tmp_path: Path,
                                                             equal_length: Any) -> None:
    n = 41
    write_files(str(tmp_path / "src"), n)
    ds = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"), shuffle=True,
                       seed=7, equal_length=equal_length)
    loader = _loader(ds)
    assert loader.persistent_workers
    entries = ds.freeze().entries
    seen_workers = None
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        got = _by_slot(ds, loader)
        order = ReadOrder(n, shuffle=True, seed=7, epoch=epoch, equal_length=equal_length or None)
        want = {w: [entries[i].path for i in slot_array(order, Layout(1, K), Slot(0, w))]
                for w in range(K)}
        assert got == want, f"epoch {epoch}"
        audit = loader.audits[-1]  # the end-of-epoch audit counts this epoch's files
        assert audit.epoch == epoch
        assert (audit.duplicates, audit.gaps) == (audit.expected_duplicates,
                                                  audit.expected_gaps)
        assert audit.files == sum(len(v) for v in want.values())
        workers = loader._iterator._workers  # type: ignore[union-attr]
        pids = [w.pid for w in workers]
        assert seen_workers is None or pids == seen_workers  # the same processes
        seen_workers = pids
    # Another equal_length, set between epochs, reaches the same workers too.
    ds.equal_length = None if equal_length else "drop"
    assert sum(len(v) for v in _by_slot(ds, loader).values()) == (n if equal_length else n - n % K)


def test_resume_mid_epoch_with_persistent_workers(tmp_path: Path) -> None:
    n = 60
    write_files(str(tmp_path / "src"), n)
    ds = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"), shuffle=True,
                       seed=1)
    loader = _loader(ds)
    for _ in loader:  # epoch 0 runs whole: the workers are persistent from here on
        pass
    ds.set_epoch(1)
    first: list[str] = []
    it = iter(loader)
    for _ in range(5):
        first += [rel(ds, p) for _, p in next(it)]
    state = loader.state_dict()
    del it
    # A new loader over a new dataset (another worker count: another layout).
    ds2 = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"),
                        shuffle=True, seed=1)
    loader2 = DataLoader(BySlot(ds2), batch_size=4, collate_fn=_listify, log_mlflow=False,
                         num_workers=2)
    for _ in loader2:  # its workers start (epoch 0) before the state is loaded
        pass
    loader2.load_state_dict(state)
    assert ds2.epoch == 1
    rest = [rel(ds2, p) for batch in loader2 for _, p in batch]
    assert sorted(first + rest) == sorted(e.path for e in ds.freeze().entries)
    assert len(first) + len(rest) == n


def _held_or_copying(cache_root: str) -> tuple[list[str], list[str]]:
    held, parts = [], []
    for folder, _, names in os.walk(cache_root):
        if paths.CONTROL in folder.split(os.sep):
            continue
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(paths.PART_SUFFIX):
                parts.append(path)
                continue
            fd = take_exclusive(path)
            if fd is None:
                held.append(path)
            elif fd >= 0:
                os.close(fd)
    return held, parts


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_break_mid_epoch_lets_go_of_holds_and_copies_while_the_loader_idles(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = 300
    files = {f"d{i % 3}/f{i:03d}.bin": bytes([i % 256]) * (16 << 10) for i in range(n)}
    if kind == "s3":  # over moto: copies are still in flight when the loop breaks
        request.getfixturevalue("moto")
        monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    src = make_source(kind, str(tmp_path / "src"), files)
    cache = str(tmp_path / "cache")
    # A capped cache: only then are the paths a reader hands out held (cache/leases.py).
    ds = VolumeDataset(src, cache_dir=cache, read_ahead=8, max_bytes=64 << 20)
    loader = _loader(ds, num_workers=2, prefetch_factor=1)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    # Nothing else happens to the loader now: without the break reaching the
    # idle workers (the record's "stopped" mark), their holds stay until the
    # next epoch. The bound only stops a hang; how soon is not asserted, the
    # machine may be loaded.
    deadline = time.monotonic() + 120
    while True:
        held, parts = _held_or_copying(cache)
        if not held and not parts:
            break
        assert time.monotonic() < deadline, f"held {len(held)}, copying {len(parts)}"
        time.sleep(0.02)
    # The workers stay for the next epoch, which delivers everything.
    assert loader._iterator is not None
    assert sum(len(v) for v in _by_slot(ds, loader).values()) == n


def test_del_loader_leaves_no_process_thread_or_file(tmp_path: Path) -> None:
    write_files(str(tmp_path / "src"), 30)
    ds = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"))
    threads = set(threading.enumerate())
    loader = _loader(ds)
    for _ in range(2):
        for _ in loader:
            pass
    folder = loader._channel.folder
    assert folder is not None and os.path.isdir(folder)
    pids = [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]
    del loader
    deadline = time.monotonic() + 120  # only stops a hang: processes end slowly under load
    while time.monotonic() < deadline and (
            [p for p in pids if pid_alive(p)] or set(threading.enumerate()) - threads):
        time.sleep(0.05)
    assert not [p for p in pids if pid_alive(p)]
    assert not set(threading.enumerate()) - threads
    assert not os.path.exists(folder)


def test_a_stale_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text('{"gen": 3}')
    link = ChannelLink(str(path), 4)
    with pytest.raises(StaleEpochRecord, match="expected epoch record 4, found 3"):
        link.read()
    assert ChannelLink(str(path), 3).read()["gen"] == 3
    # A worker started for one epoch only may iterate its dataset again.
    path.write_text('{"gen": 3, "persistent": false}')
    fresh = ChannelLink(str(path), 3)
    assert fresh.read()["gen"] == 3 and fresh.read()["gen"] == 3


class Twice(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, vds: VolumeDataset) -> None:
        self.vds = vds

    def __iter__(self) -> Any:
        yield from self.vds
        yield from self.vds


class WithEnv(IterableDataset):  # type: ignore[type-arg]
    def __init__(self, vds: VolumeDataset) -> None:
        self.vds = vds

    def __iter__(self) -> Any:
        for path in self.vds:
            yield path, os.environ.get("UCSTAGE_TEST_EPOCH_MARK")


def test_persistent_workers_get_the_environment_of_each_epochs_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_files(str(tmp_path / "src"), 12)
    ds = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(WithEnv(ds), batch_size=None, num_workers=2, log_mlflow=False)
    monkeypatch.setenv("UCSTAGE_TEST_EPOCH_MARK", "one")
    assert {mark for _, mark in loader} == {"one"}
    monkeypatch.setenv("UCSTAGE_TEST_EPOCH_MARK", "two")
    assert {mark for _, mark in loader} == {"two"}
    monkeypatch.delenv("UCSTAGE_TEST_EPOCH_MARK")
    assert {mark for _, mark in loader} == {None}


def test_a_second_iteration_in_a_persistent_worker_is_refused_loudly(tmp_path: Path) -> None:
    write_files(str(tmp_path / "src"), 6)
    ds = VolumeDataset(str(tmp_path / "src"), cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(Twice(ds), batch_size=None, num_workers=2, log_mlflow=False,
                        audit=False)
    with pytest.raises(StaleEpochRecord, match="expected epoch record"):
        list(loader)
    # Workers started for one epoch only may do it (nothing can be stale there).
    again = DataLoader(Twice(ds), batch_size=None, num_workers=2, log_mlflow=False,
                       audit=False, persistent_workers=False)
    assert len(list(again)) == 12
