"""Training through a cache smaller than the dataset: a dataset 4x the cap,
3 epochs, read through a decoding wrapper, in order and shuffled, in the main
process and in 2 DataLoader workers, with `cache warm` of another source
running beside it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.utils.data as tud

from tests.common.parts import REPO, wait_visible
from tests.common.usage import sampled_usage
from ucstage import DataLoader, VolumeDataset
from ucstage.cache import LocalCache, runstats
from ucstage.cache.leases import Reader
from ucstage.errors import CacheFull

N_FILES = 400
SIZE = 4096
CAP = N_FILES * SIZE // 4


def make_source(root: Path, n: int = N_FILES, size: int = SIZE) -> dict[str, str]:
    """n files of distinct bytes; returns relative path -> sha256."""
    root.mkdir(parents=True)
    digests = {}
    for i in range(n):
        data = hashlib.sha256(b"%d" % i).digest() * (size // 32)
        name = f"d{i % 4}/f{i:04d}.bin"
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return digests


class Decode(tud.IterableDataset):  # type: ignore[type-arg]
    """The usual wrapper: open each path the VolumeDataset yields, decode it
    (here: hash its bytes) and yield the sample."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[tuple[str, str]]:
        root = self.paths.cache().namespace_dir(self.paths.freeze().volume())
        for path in self.paths:
            with open(path, "rb") as fh:
                data = fh.read()
            yield os.path.relpath(path, root), hashlib.sha256(data).hexdigest()


def run_epochs(tmp_path: Path, *, num_workers: int, shuffle: bool,
               warm_beside: bool = False) -> tuple[LocalCache, DataLoader]:
    """3 epochs through a cache a quarter of the dataset, usage sampled from
    another process; every epoch must be complete, byte for byte, within the cap.
    ``warm_beside``: `cache warm` of another source runs during epoch 2."""
    digests = make_source(tmp_path / "src")
    cache = LocalCache(tmp_path / "cache", max_bytes=CAP)
    paths = VolumeDataset(str(tmp_path / "src"), cache=cache, shuffle=shuffle, seed=7,
                          read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=None, num_workers=num_workers,
                        log_mlflow=False)
    if warm_beside:
        make_source(tmp_path / "side", n=20, size=SIZE)  # a fifth of the cap: warm accepts it
    env = dict(os.environ, PYTHONPATH=REPO, UCSTAGE_CACHE_DIR=str(cache.root))
    warm = None
    with sampled_usage(str(cache.root), str(tmp_path)) as usage:
        for epoch in range(3):
            paths.set_epoch(epoch)
            if warm_beside and epoch == 1:
                warm = subprocess.Popen(
                    [sys.executable, "-m", "ucstage", "cache", "warm", str(tmp_path / "side"),
                     "--max-bytes", str(CAP), "--json"], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            seen = list(loader)
            # Every epoch completes, and every byte read equals the source.
            assert sorted(name for name, _ in seen) == sorted(digests)
            assert all(digests[name] == digest for name, digest in seen)
        if warm is not None:
            _, err = warm.communicate(timeout=120)
            assert warm.returncode == 0, err
    assert usage.samples > 10 and 0 < usage.peak <= CAP, (usage.peak, usage.samples)
    return cache, loader


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_three_epochs_through_a_cache_a_quarter_of_the_dataset(
        tmp_path: Path, num_workers: int, shuffle: bool) -> None:
    cache, loader = run_epochs(tmp_path, num_workers=num_workers, shuffle=shuffle)
    rates = [s.cache_hit_rate for s in loader.epoch_stats]
    assert rates[0] == 0.0
    # From epoch 2 on, the resident set hits about cap / dataset of the reads.
    assert all(r is not None and r >= 0.8 * CAP / (N_FILES * SIZE) for r in rates[1:]), rates
    last = cache.status().last_run
    assert last is not None and last.hits + last.misses == 3 * N_FILES
    assert last.evictions > 0


def test_cache_warm_beside_training_keeps_both_whole_and_under_the_cap(tmp_path: Path) -> None:
    cache, _ = run_epochs(tmp_path, num_workers=2, shuffle=True, warm_beside=True)
    assert cache.status().bytes <= CAP


def test_a_file_larger_than_the_cap_fails_at_once(tmp_path: Path) -> None:
    make_source(tmp_path / "src", n=3, size=SIZE)
    (tmp_path / "src" / "big.bin").write_bytes(b"x" * (2 * SIZE))
    cache = LocalCache(tmp_path / "cache", max_bytes=SIZE + 100, wait_seconds=3600)
    paths = VolumeDataset(str(tmp_path / "src"), cache=cache, read_ahead=0)
    with pytest.raises(CacheFull, match=r"big.bin is 8.0 KiB, larger than the whole cache cap"):
        next(iter(paths))
    loader = DataLoader(paths, batch_size=None, num_workers=2, log_mlflow=False)
    with pytest.raises(CacheFull, match="larger than the whole cache cap"):
        iter(loader)  # in the main process, before a worker starts


def test_a_window_that_can_never_fit_names_the_cap_it_needs(tmp_path: Path) -> None:
    make_source(tmp_path / "src", n=40, size=SIZE)
    cache = LocalCache(tmp_path / "cache", max_bytes=10 * SIZE, wait_seconds=3600)
    paths = VolumeDataset(str(tmp_path / "src"), cache=cache, read_ahead=4)
    loader = DataLoader(paths, batch_size=None, num_workers=2, log_mlflow=False)
    # 2 workers x (4 read-ahead + the current file + 2 of slack + the 4 batches
    # of one file prefetched and the one the loop has) x 4 KiB = 96 KiB.
    with pytest.raises(CacheFull, match=r"2 readers x 12 files held each .*5 in batches "
                                        r"the loop has not moved past.*fits 5 files per") as info:
        iter(loader)
    assert "raise max_bytes to at least 96.0 KiB" in info.value.hint
    assert "prefetch_factor" in info.value.hint
    small = DataLoader(VolumeDataset(str(tmp_path / "src"), cache=cache, read_ahead=0),
                       batch_size=None, num_workers=2, prefetch_factor=1, log_mlflow=False)
    assert len(list(small)) == 40  # 2 x (1 + 2 + 2) x 4 KiB fits under 40 KiB


def test_a_cap_full_of_held_files_makes_the_loader_wait_and_report_it(tmp_path: Path) -> None:
    """Another reader holds most of the cap: the loader waits for it to move
    on instead of failing, and the epoch's stats (what MLflow gets as
    epoch_cache_wait_s) show the wait."""
    digests = make_source(tmp_path / "src", n=12, size=SIZE)
    cache = LocalCache(tmp_path / "cache", max_bytes=6 * SIZE, lease_seconds=0,
                       wait_seconds=120)
    paths = VolumeDataset(str(tmp_path / "src"), cache=cache, read_ahead=0)
    volume = paths.freeze().volume()
    other = Reader()
    fetch = other.fetcher(cache.at(volume), lambda e: cache.fetch(volume, e))
    for entry in paths.freeze().entries[6:11]:
        fetch(entry)  # 5 of the 6 files the cap holds
    loader = DataLoader(Decode(paths), batch_size=None, num_workers=0, log_mlflow=False)
    seen: list[tuple[str, str]] = []
    thread = threading.Thread(target=lambda: seen.extend(loader), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while runstats.read_run(str(cache.root), paths.run).waits == 0:
        assert thread.is_alive() and time.monotonic() < deadline, "the loader never waited"
        time.sleep(0.01)
    other.close()  # the other reader moves on
    thread.join(60)
    assert sorted(name for name, _ in seen) == sorted(digests)
    assert all(digests[name] == digest for name, digest in seen)
    stats = loader.epoch_stats[0]
    assert stats.cache_wait_s > 0 and stats.complete


class Opened(tud.IterableDataset):  # type: ignore[type-arg]
    """The README's pattern inverted: the dataset yields the paths as they
    are, and the training loop (in the main process) opens each path of each
    batch."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[str]:
        yield from self.paths


def _open_batch(batch: object, root: str) -> list[tuple[str, str | None]]:
    """(relative path, sha256 of its bytes, or None when it vanished) per path."""
    out = []
    for path in [batch] if isinstance(batch, str) else list(batch):  # type: ignore[call-overload]
        try:
            with open(path, "rb") as fh:
                digest: str | None = hashlib.sha256(fh.read()).hexdigest()
        except FileNotFoundError:
            digest = None
        out.append((os.path.relpath(path, root), digest))
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_every_delivered_path_opens_until_the_loop_moves_past_its_batch(
        fuse_volume: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        batch_size: int, num_workers: int) -> None:
    """Shuffled, through an rclone mount, a cap a quarter of the dataset (set by
    UCSTAGE_CACHE_MAX_BYTES alone with workers): every path of every batch
    still opens with its bytes when the loop reaches it, two epochs running."""
    backing, mnt = fuse_volume
    name = f"cap-{batch_size}-{num_workers}"
    digests = make_source(Path(backing) / name)
    if num_workers:
        monkeypatch.setenv("UCSTAGE_CACHE_MAX_BYTES", str(CAP))
        cache = LocalCache(tmp_path / "cache")
    else:
        cache = LocalCache(tmp_path / "cache", max_bytes=CAP)
    assert cache.max_bytes == CAP
    wait_visible(os.path.join(mnt, name), timeout=60)
    paths = VolumeDataset(os.path.join(mnt, name), cache=cache, shuffle=True, seed=3)
    loader = DataLoader(Opened(paths), batch_size=batch_size, num_workers=num_workers,
                        log_mlflow=False, volume_dataset=paths)
    root = cache.namespace_dir(paths.freeze().volume())
    for epoch in range(2):
        paths.set_epoch(epoch)
        seen = [item for batch in loader for item in _open_batch(batch, root)]
        vanished = [rel for rel, digest in seen if digest is None]
        assert not vanished, f"epoch {epoch}: {len(vanished)} of {len(seen)} paths vanished"
        assert sorted(rel for rel, _ in seen) == sorted(digests)
        assert all(digests[rel] == digest for rel, digest in seen)
    last = cache.status().last_run
    assert last is not None and last.evictions > 0  # the cap was at work


def test_plain_iteration_through_a_cap_opens_every_path(
        fuse_volume: tuple[str, str], tmp_path: Path) -> None:
    backing, mnt = fuse_volume
    digests = make_source(Path(backing) / "cap-plain")
    cache = LocalCache(tmp_path / "cache", max_bytes=CAP)
    wait_visible(os.path.join(mnt, "cap-plain"), timeout=60)
    paths = VolumeDataset(os.path.join(mnt, "cap-plain"), cache=cache, shuffle=True)
    root = cache.namespace_dir(paths.freeze().volume())
    seen = [item for path in paths for item in _open_batch(path, root)]
    assert [rel for rel, digest in seen if digest is None] == []
    assert sorted(seen) == sorted(digests.items())


def test_batches_in_flight_that_cannot_fit_fail_before_the_first_batch(tmp_path: Path) -> None:
    make_source(tmp_path / "src")
    cache = LocalCache(tmp_path / "cache", max_bytes=CAP, wait_seconds=3600)
    paths = VolumeDataset(str(tmp_path / "src"), cache=cache)
    loader = DataLoader(Opened(paths), batch_size=32, num_workers=2, log_mlflow=False,
                        volume_dataset=paths)
    # 2 workers x (1 read-ahead + the current file + 2 of slack + 5 batches of
    # 32: 4 prefetched and the loop's) x 4 KiB = 1.3 MiB, over a 400 KiB cap.
    with pytest.raises(CacheFull, match=r"2 readers x 164 files held each .*160 in batches "
                                        r"the loop has not moved past.*fits 50 files") as info:
        iter(loader)
    assert "batch_size or prefetch_factor" in info.value.hint
    assert cache.status().entries == 0  # refused before anything was copied


def test_the_loops_board_says_what_is_past_per_slot_and_epoch() -> None:
    """The board the loader writes and the views workers read (data/channel.py):
    counts per slot, a later epoch makes an earlier one's view read 'all past',
    the epoch's end too; the in-memory board does not travel to workers."""
    import pickle

    from ucstage.data import channel

    board = channel.Board(2, shared=True, in_loop=5)
    try:
        board.start(1, [0, 3])  # slot 1 resumed at 3
        mine = board.link().view(1, 1)  # as a worker maps it
        assert mine is not None and mine.in_loop == 5
        assert (mine.past(), board.link().view(0, 1).past()) == (3, 0)  # type: ignore[union-attr]
        board.publish(1, 9)
        board.publish(1, 4)  # never backwards
        assert mine.past() == 9
        early = board.link().view(0, 2)  # a view of the next epoch, before it starts
        assert early is not None and early.past() == 0
        board.start(2, [0, 0])
        assert mine.past() == channel.PAST_ALL and early.past() == 0
        board.finish()
        assert early.past() == channel.PAST_ALL
    finally:
        board.close()
    assert not os.path.exists(board.path)
    assert pickle.loads(pickle.dumps(channel.Board(1, shared=False, in_loop=1))) is None
