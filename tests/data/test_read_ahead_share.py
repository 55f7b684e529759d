"""``read_ahead="auto"`` (the default): each reader of a node takes a share of
the copies in flight ``cache warm --jobs auto`` would use, tuned as it runs and
cut to fit a byte cap; and the loader starts the forkserver when it is made."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from tests.common.backends import make_source
from tests.common.parts import wait_visible
from ucstage import DataLoader, LocalCache, VolumeDataset
from ucstage.cache import tuning
from ucstage.data import slotread
from ucstage.data.slotread import AUTO, ReadAhead, Share, node_share
from ucstage.errors import InvalidArgument
from ucstage.volumes import FileEntry

KB = 1024


def _folder(tmp_path, n: int, size: int) -> str:  # type: ignore[no-untyped-def]
    src = tmp_path / "vol"
    src.mkdir()
    for i in range(n):
        (src / f"f{i:03}.bin").write_bytes(bytes([i % 251]) * size)
    return str(src)


def test_auto_is_the_default_and_bad_values_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = _folder(tmp_path, 2, KB)
    assert VolumeDataset(src).read_ahead == AUTO
    for bad in (-1, "eight", 2.5, True):
        with pytest.raises(InvalidArgument, match="read_ahead"):
            VolumeDataset(src, read_ahead=bad)  # type: ignore[arg-type]


def test_each_reader_takes_its_share_of_the_first_guess_and_the_ceiling(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ds = VolumeDataset(_folder(tmp_path, 2, KB), cache_dir=str(tmp_path / "cache"))
    volume = ds._get_volume()
    local = tuning.FIRST_GUESS[tuning.LOCAL]
    assert node_share(AUTO, volume, 1) == Share(local, tuning.THREAD_CEILING, True)
    four = node_share(AUTO, volume, 4)
    assert four == Share(-(-local // 4), tuning.THREAD_CEILING // 4, True)
    assert node_share(AUTO, volume, 1000) == Share(1, 1, True)  # never below one
    assert node_share(AUTO, volume, 4, cap_depth=1) == Share(1, 1, True)
    assert node_share(3, volume, 4) == Share(3, 3, False)  # a fixed N is used as given
    assert node_share(AUTO, None, 4) == Share(4, 4, False)  # nothing to size it by


def test_under_a_cap_the_share_is_cut_to_fit_and_the_epoch_reads_every_file(
        tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    src = _folder(tmp_path, 40, 64 * KB)
    cache = LocalCache(str(tmp_path / "cache"), max_bytes=2048 * KB)
    ds = VolumeDataset(src, cache=cache)
    share = slotread.check_loader_window(ds, cache, 0)
    # One reader, 64 KiB files: 32 fit; read-ahead takes at most a sixteenth of them.
    assert share == Share(2, 2, True)
    # A loop holding 28 files leaves room for 1 (32 - 28 - the current - 2 of slack).
    assert slotread.check_loader_window(ds, cache, 0, in_loop=28) == Share(1, 1, True)
    names = [os.path.basename(p) for p in ds]
    assert sorted(names) == [f"f{i:03}.bin" for i in range(40)]
    # Two ranks per node with 2 workers each: 4 readers, 8 files each fit.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert slotread.check_loader_window(ds, cache, 2) == Share(1, 1, True)


def test_the_tuned_limit_bounds_the_copies_in_flight() -> None:
    """The threads never copy more at once than the job's limit allows."""
    entries = [FileEntry(f"f{i}", 10, "v") for i in range(60)]
    lock = threading.Lock()
    running, most = [0], [0]
    release = threading.Event()

    def fetch(entry: FileEntry) -> str:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(0.002)
        with lock:
            running[0] -= 1
        return entry.path

    jobs = tuning.Jobs(3, ceiling=8)  # fixed: the limit stays 3
    ahead = ReadAhead(fetch, entries, 8, jobs=jobs)
    try:
        assert list(ahead) == [e.path for e in entries]
    finally:
        ahead.close()
    assert 1 <= most[0] <= 3
    assert ahead.alive == 0


SCRIPT = textwrap.dedent("""
    import multiprocessing.forkserver as fs, sys
    from ucstage import DataLoader, VolumeDataset

    if __name__ == "__main__":
        # Read once here without workers: obstore now runs in this process,
        # so forked workers could not use it (listing alone would not do that).
        assert len(list(VolumeDataset(sys.argv[1], cache_dir=sys.argv[2] + "-here"))) == 6
        ds = VolumeDataset(sys.argv[1], cache_dir=sys.argv[2])
        loader = DataLoader(ds, batch_size=None, num_workers=2, log_mlflow=False)
        early = fs._forkserver._forkserver_pid is not None
        listed = ds.fingerprint is not None
        got = sorted(p.rsplit("/", 1)[-1] for p in loader)
        print(early, listed, loader.multiprocessing_context.get_start_method(), len(got))
""")


def test_the_loader_starts_the_forkserver_when_it_is_made_without_listing(
        moto, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Once the main process has read through obstore, the loader's workers
    will start from a forkserver: it starts when the loader is made."""
    src = make_source("s3", "", {f"f{i}.bin": os.urandom(2 * KB) for i in range(6)})
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "UCSTAGE_ENGINE": "obstore",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(script), src, str(tmp_path / "cache")], env=env,
                         capture_output=True, text=True, check=True, timeout=300).stdout
    # Started at DataLoader(), before any listing; the epoch then used it.
    assert out.split() == ["True", "False", "forkserver", "6"]


@pytest.mark.parametrize(("num_workers", "shuffle"), [(0, False), (0, True), (2, True)],
                         ids=["0-workers", "0-workers-shuffled", "2-workers-shuffled"])
def test_auto_read_ahead_leaves_a_small_cache_room_to_keep_files(
        fuse_volume, tmp_path, num_workers: int, shuffle: bool) -> None:  # type: ignore[no-untyped-def]
    """200 files of 100 kB through an rclone mount, a cap a quarter of them,
    the default read-ahead, 3 epochs: from epoch 2 on the cache serves at
    least 0.8 x (cap / dataset) of the reads (the hit rate is a count of
    hits over files read, not a timing)."""
    backing, mnt = fuse_volume
    name = f"share-{num_workers}-{shuffle}"
    src = os.path.join(backing, name)
    os.makedirs(src)
    n, size = 200, 100_000
    for i in range(n):
        with open(os.path.join(src, f"f{i:03}.bin"), "wb") as fh:
            fh.write(i.to_bytes(2, "big") * (size // 2))
    cap = n * size // 4
    wait_visible(os.path.join(mnt, name), timeout=60)
    cache = LocalCache(str(tmp_path / "cache"), max_bytes=cap)
    ds = VolumeDataset(os.path.join(mnt, name), cache=cache, shuffle=shuffle, seed=5)
    assert ds.read_ahead == AUTO
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, log_mlflow=False)
    for epoch in range(3):
        ds.set_epoch(epoch)
        assert sum(1 for _ in loader) == n
    rates = [s.cache_hit_rate for s in loader.epoch_stats]
    assert rates[0] == 0.0
    assert all(r is not None and r >= 0.8 * 0.25 for r in rates[1:]), rates
