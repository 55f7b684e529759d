"""VolumeDataset and DataLoader in one process: laziness, pickling, read-ahead,
equal length, DataLoader defaults, MLflow metrics in a sqlite tracking store."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import IterableDataset, get_worker_info

from ucstage import manifest as mf
from ucstage.cache.local import Bound
from ucstage.data import DataLoader, VolumeDataset
from ucstage.errors import InvalidArgument
from ucstage.sharding import Layout, ReadOrder, Slot, slot_array
from ucstage.volumes import FileEntry


def write_files(root: str, n: int, size: int = 64) -> list[str]:
    names = [f"d{i % 3}/f{i:03d}.bin" for i in range(n)]
    for i, name in enumerate(names):
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(bytes([i % 256]) * size)
    return sorted(names)


def rel(ds: VolumeDataset, local: str) -> str:
    root = ds.cache().namespace_dir(ds.freeze().volume())
    return os.path.relpath(local, root).replace(os.sep, "/")


def test_building_lists_nothing_and_iterating_lists_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "later")
    ds = VolumeDataset(src, include=["*.bin"])  # the folder does not exist yet
    assert ds.fingerprint is None
    names = write_files(src, 5)
    with open(os.path.join(src, "notes.txt"), "w") as fh:
        fh.write("x")
    got = [rel(ds, p) for p in ds]
    assert got == names  # listing order, one process = one slot
    frozen = ds.fingerprint
    write_files(src, 8)  # the volume grows; the frozen listing does not
    assert [rel(ds, p) for p in ds] == names and ds.fingerprint == frozen
    for path in ds:
        with open(path, "rb") as fh:
            data = fh.read()
        assert len(data) == 64


def test_pickle_is_small_for_100k_files_and_round_trips(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "vol"
    src.mkdir()
    entries = [FileEntry(f"shard{i // 1000:03d}/img{i:06d}.jpg", 1000 + i, "1764403200.0")
               for i in range(100_000)]
    big = mf.Manifest(source=str(src), entries=entries, fingerprint=mf.fingerprint(entries))
    path = mf.save(big, str(tmp_path / "train.manifest.json"))

    unfrozen = VolumeDataset(str(src), include=["*.jpg"], shuffle=True, seed=3)
    from_file = VolumeDataset(path, shuffle=True, seed=3)
    from_file.freeze()
    in_memory = VolumeDataset(big, shuffle=True, seed=3)
    for ds in (unfrozen, from_file, in_memory):
        blob = pickle.dumps(ds)
        assert len(blob) < 2048, (ds, len(blob))
    # The in-memory manifest was frozen into the cache, not pickled.
    copy = pickle.loads(pickle.dumps(in_memory))
    assert copy.fingerprint == big.fingerprint
    assert copy._manifest_path and os.path.exists(copy._manifest_path)
    copy.set_epoch(2)
    in_memory.set_epoch(2)
    slot = {"rank": 1, "world_size": 4, "num_workers": 3, "worker": 2}
    assert copy.slot_entries(**slot) == in_memory.slot_entries(**slot)
    assert len(copy.slot_entries(**slot)) == len(range(5, 100_000, 12))


def test_read_ahead_fetches_the_next_files_of_the_slot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "vol")
    write_files(src, 10)
    ds = VolumeDataset(src, read_ahead=3)
    entries = ds.slot_entries(rank=0, world_size=1, num_workers=0, worker=0)
    cache, volume = ds.cache(), ds.freeze().volume()
    it = iter(ds)
    first = next(it)
    assert first == cache.lookup(volume, entries[0])
    # Without asking for more, the next 3 files arrive in the cache...
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(cache.lookup(volume, e) for e in entries[1:4]):
            break
        time.sleep(0.02)
    assert all(cache.lookup(volume, e) for e in entries[1:4])
    # ...and no further: the window is 3 files deep.
    assert cache.lookup(volume, entries[4]) is None
    assert len([first, *it]) == 10

    sync = VolumeDataset(str(tmp_path / "vol"), read_ahead=0, cache_dir=str(tmp_path / "c2"))
    it = iter(sync)
    next(it)
    assert sync.cache().lookup(volume, entries[1]) is None


@settings(deadline=None)  # no per-example clock: the machine may be loaded
@given(n=st.integers(0, 200), world=st.integers(1, 5), k=st.integers(0, 4),
       seed=st.integers(0, 3), shuffle=st.booleans())
def test_equal_length_gives_every_slot_the_same_count(n, world, k, seed, shuffle) -> None:  # type: ignore[no-untyped-def]
    slots = [(r, w) for r in range(world) for w in range(max(1, k))]
    layout = Layout(world, k)

    def files(mode: str | None) -> list[list[int]]:
        order = ReadOrder(n, shuffle, seed, equal_length=mode)
        return [slot_array(order, layout, Slot(r, w)).tolist() for r, w in slots]

    pad, drop, plain = files("pad"), files("drop"), files(None)
    s = len(slots)
    if n:
        assert {len(f) for f in pad} == {-(-n // s)}
        assert sorted({i for f in pad for i in f}) == list(range(n))
    assert {len(f) for f in drop} <= {n // s}
    flat = [i for f in drop for i in f]
    assert len(flat) == len(set(flat)) == (n // s) * s
    # Both are the shard plan's slots, trimmed or extended.
    for p, d, q in zip(pad, drop, plain, strict=True):
        assert p[:len(q)] == q and d == q[:len(d)]


@pytest.mark.filterwarnings("ignore:ucstage DataLoader")
def test_dataloader_defaults_and_drop_in_arguments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "vol")
    names = write_files(src, 7)
    ds = VolumeDataset(src)
    default = DataLoader(ds)
    assert (default.num_workers, default.prefetch_factor) == (6, 4)
    main = DataLoader(ds, batch_size=None, num_workers=0)
    assert main.prefetch_factor is None
    positional = DataLoader(ds, 2, None, None, None, 0)  # num_workers given positionally
    assert (positional.batch_size, positional.num_workers) == (2, 0)
    assert sorted(rel(ds, p) for p in main) == names
    batches = list(DataLoader(ds, batch_size=3, num_workers=2, prefetch_factor=1))
    # An IterableDataset batches per worker: 4 + 3 files -> 2 + 1 batches.
    assert sorted(len(b) for b in batches) == [1, 3, 3]
    assert sorted(rel(ds, p) for b in batches for p in b) == names
    with pytest.raises(InvalidArgument):
        VolumeDataset(src, equal_length="sometimes")


def test_wrapper_dataset_is_found_and_frozen_before_workers_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from torch.utils.data import IterableDataset

    class Sizes(IterableDataset):  # type: ignore[type-arg]
        def __init__(self, paths: VolumeDataset) -> None:
            self.paths = paths

        def __iter__(self):  # type: ignore[no-untyped-def]
            for p in self.paths:
                yield os.path.getsize(p)

    src = str(tmp_path / "vol")
    write_files(src, 6, size=10)
    paths = VolumeDataset(src)
    loader = DataLoader(Sizes(paths), batch_size=None, num_workers=2)
    assert loader.volume_dataset is paths
    assert sorted(loader) == [10] * 6
    assert paths.fingerprint is not None  # frozen in the main process, once


def test_spawned_workers_unpickle_the_frozen_dataset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "vol")
    names = write_files(src, 9)
    ds = VolumeDataset(src, shuffle=True, seed=5)
    ds.freeze()
    write_files(src, 12)  # new files after the freeze: workers must not see them
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    got = list(loader)
    assert sorted(rel(ds, p) for p in got) == names


MLFLOW_SCRIPT = r"""
import json, os, sys
import mlflow
from mlflow.tracking import MlflowClient
from ucstage import DataLoader, VolumeDataset

src, out = sys.argv[1], sys.argv[2]
paths = VolumeDataset(src, shuffle=True)
loader = DataLoader(paths, batch_size=2, num_workers=2, mlflow_flush_every=4)
idle = DataLoader(paths, batch_size=2, num_workers=0)
list(idle)  # no active run: nothing logged, stats still kept
cold_rate = idle.epoch_stats[0].cache_hit_rate
mlflow.set_experiment("ucstage-test")
coarse = DataLoader(paths, batch_size=2, num_workers=0, mlflow_prefix="coarse",
                    mlflow_step_every=4)
with mlflow.start_run() as run:
    for epoch in range(2):
        paths.set_epoch(epoch)
        for batch in loader:
            pass
        list(coarse)
    loader.flush_metrics()  # metrics are written in the background
    coarse.flush_metrics()
client = MlflowClient()
names = sorted(n for n in client.get_run(run.info.run_id).data.metrics if n.startswith("ucstage/"))
coarse_steps = [m.step for m in client.get_metric_history(run.info.run_id, "coarse/batch_wait_ms")]
history = {n: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, n)]
           for n in names}
json.dump({"names": names, "coarse_steps": sorted(coarse_steps), "history": history, "idle_stats": len(idle.epoch_stats),
           "stats": [s.batches for s in loader.epoch_stats], "cold_rate": cold_rate,
           "runs": len(client.search_runs([run.info.experiment_id]))}, open(out, "w"))
"""


def test_mlflow_metrics_land_in_a_sqlite_tracking_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    src = str(tmp_path / "vol")
    write_files(src, 12)
    script = tmp_path / "run.py"
    script.write_text(MLFLOW_SCRIPT)
    out = str(tmp_path / "out.json")
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db",
               PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, str(script), src, out], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as fh:
        got = json.load(fh)
    prefix = "ucstage/"
    assert got["names"] == sorted(prefix + n for n in (
        "batch_wait_ms", "epoch_batches", "epoch_batches_per_s", "epoch_cache_evictions",
        "epoch_cache_hit_rate", "epoch_cache_wait_s", "epoch_stall_share",
        "epoch_checked_md5", "epoch_checked_crc32c", "epoch_checked_page_crc",
        "epoch_checked_size", "epoch_check_mismatches",
        "epoch_wait_max_ms", "epoch_wait_p50_ms", "epoch_wait_p95_ms",
        # the exactly-once audit (tests/data/test_resume.py tests it further)
        "epoch_files", "epoch_coverage_ok", "epoch_duplicates", "epoch_gaps"))
    assert [v for _, v in got["history"]["ucstage/epoch_files"]] == [12, 12]
    assert [v for _, v in got["history"]["ucstage/epoch_coverage_ok"]] == [1, 1]
    # The idle loader cached every file first: both epochs hit every read.
    assert sorted(got["history"]["ucstage/epoch_cache_hit_rate"]) == [[0, 1.0], [1, 1.0]]
    assert got["cold_rate"] == 0.0  # a cold first epoch (recorded without a run)
    # 12 files, 2 workers x 6 files, batch 2 -> 6 batches per epoch, 2 epochs.
    waits = got["history"]["ucstage/batch_wait_ms"]
    assert sorted(step for step, _ in waits) == list(range(12))
    assert all(value >= 0 for _, value in waits)
    for name in got["names"]:
        if name != "ucstage/batch_wait_ms":
            assert sorted(step for step, _ in got["history"][name]) == [0, 1], name
    assert sorted(v for _, v in got["history"]["ucstage/epoch_batches"]) == [6, 6]
    share = [v for _, v in got["history"]["ucstage/epoch_stall_share"]]
    assert all(0 <= v <= 1 for v in share)
    assert got["stats"] == [6, 6] and got["idle_stats"] == 1 and got["runs"] == 1
    # mlflow_step_every=4: one mean wait per 4 batches, at steps 3, 7, 11.
    assert got["coarse_steps"] == [3, 7, 11]


def test_importing_the_library_and_cli_leaves_torch_and_mlflow_alone() -> None:
    code = ("import sys, ucstage; from ucstage.cli import main; "
            "bad = [m for m in ('torch', 'mlflow') if m in sys.modules]; print(bad)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stderr
    code = ("import sys; from ucstage import DataLoader, VolumeDataset; "
            "print('mlflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "False", proc.stderr


# ---------------------------------------------------------------- len()


class _Counted(IterableDataset):  # type: ignore[type-arg]
    """A user's wrapper: yields (len(paths) in this process, worker id) per file."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        worker = info.id if info is not None else 0
        for _ in self.paths:
            yield len(self.paths), worker


def test_len_needs_the_frozen_listing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "vol")
    write_files(src, 7)
    ds = VolumeDataset(src)
    with pytest.raises(TypeError, match=r"needs the frozen listing: call freeze\(\) first"):
        len(ds)
    assert ds  # truthy before freezing: `ds or default` never calls len()
    assert len(list(ds)) == 7  # list() asks for a length hint, and takes the TypeError as none
    assert len(ds) == 7  # one process, one slot: frozen by the first iteration
    fresh = VolumeDataset(src)
    fresh.freeze()
    assert len(fresh) == 7


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", [False, "pad", "drop"])
def test_len_is_the_slot_in_a_worker_and_the_rank_in_the_main_process(tmp_path, workers,
                                                                       mode) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "vol")
    write_files(src, 7)
    ds = VolumeDataset(src, equal_length=mode)
    loader = DataLoader(_Counted(ds), batch_size=None, num_workers=workers)
    got = list(loader)
    per_worker: dict[int, list[int]] = {}
    for length, worker in got:
        per_worker.setdefault(int(worker), []).append(int(length))
    for worker, lengths in per_worker.items():
        # Inside a worker, len() is that worker's slot: exactly what it yields.
        assert set(lengths) == {len(lengths)}, (worker, lengths)
    # In the main process, len() is the rank's files over the loader's workers.
    expected = {(False, 0): 7, (False, 2): 7, ("pad", 0): 7, ("pad", 2): 8, ("drop", 0): 7,
                ("drop", 2): 6}[(mode, workers)]
    assert len(ds) == len(got) == expected
    assert len(loader) == expected  # torch asks the wrapper, which asks the VolumeDataset


@pytest.mark.filterwarnings("ignore:ucstage DataLoader")
def test_len_follows_the_loader_that_uses_the_dataset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = str(tmp_path / "vol")
    write_files(src, 7)
    ds = VolumeDataset(src, equal_length="pad")
    ds.freeze()
    assert ds.num_workers == 6 and len(ds) == 6 * 2  # the default: 6 slots of ceil(7/6)
    DataLoader(ds, num_workers=0)
    assert len(ds) == 7
    DataLoader(ds, num_workers=3)
    assert len(ds) == 9  # 3 slots of ceil(7/3)


# ---------------------------------------------------------------- stopping read-ahead


def _read_ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ucstage-read-ahead")]


def _cache_files(root: str) -> tuple[list[str], list[str]]:
    """(cached data files, temp files) under a cache root, its control folder left out."""
    data, temp = [], []
    for _folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".ucstage"]
        for name in files:
            (temp if name.endswith(".ucstage-part") else data).append(name)
    return data, temp


@pytest.fixture
def slow_volume(tmp_path):  # type: ignore[no-untyped-def]
    """24 files of 1 MiB behind a FUSE mount limited to 512 KiB/s (after a 4 MiB burst)."""
    from tests.common.parts import rclone_mount

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    write_files(str(backing), 24, size=1024 * 1024)
    with rclone_mount(str(backing), str(mnt), "--bwlimit", "512k"):
        yield str(mnt)


def _settled(cache: str) -> tuple[list[str], list[str]]:
    """The cache's files once every read-ahead thread has ended (polled, with a deadline)."""
    deadline = time.monotonic() + 120
    while _read_ahead_threads():
        assert time.monotonic() < deadline, f"read-ahead threads never ended: {_read_ahead_threads()}"
        time.sleep(0.05)
    return _cache_files(cache)


@pytest.mark.fuse
@pytest.mark.parametrize("how", ["close", "break", "interrupt"])
def test_read_ahead_stops_when_the_iterator_is_dropped(slow_volume, tmp_path, how) -> None:  # type: ignore[no-untyped-def]
    cache = str(tmp_path / f"cache-{how}")
    ds = VolumeDataset(slow_volume, read_ahead=4, cache_dir=cache)
    if how == "break":
        for i, _ in enumerate(DataLoader(ds, batch_size=None, num_workers=0)):
            if i == 1:
                break
    else:
        it = iter(ds)
        next(it), next(it)
        if how == "close":
            it.close()
        else:
            with pytest.raises(KeyboardInterrupt):
                it.throw(KeyboardInterrupt)
    # What the cache holds the moment the iterator is gone is final: no copy
    # of it completes later, and none is left half-written.
    at_close, temp = _cache_files(cache)
    assert temp == []
    assert 2 <= len(at_close) < 24  # it stopped: the rest of the slot was never fetched
    assert _settled(cache) == (at_close, [])



def test_skip_unreadable_lists_around_an_unreadable_folder(walking_store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """VolumeDataset never loses a folder silently: it raises, or with
    skip_unreadable lists the rest and says so."""
    from ucstage.errors import UnreadableFolders

    with pytest.raises(UnreadableFolders):
        VolumeDataset(walking_store, cache_dir=str(tmp_path / "c")).freeze()
    ds = VolumeDataset(walking_store, cache_dir=str(tmp_path / "c"), skip_unreadable=True)
    assert len(ds.freeze()) == 2
    assert [os.path.basename(p) for p in ds] == ["1.jpg", "2.jpg"]


# ---------------------------------------------------------------- the warm-hit path


def test_a_warm_epoch_hands_no_file_to_a_thread(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Over a warm cache every path comes from a lookup in the consumer's
    thread: no fetch, no read-ahead thread started."""
    src = str(tmp_path / "vol")
    write_files(src, 20)
    ds = VolumeDataset(src, read_ahead=4, cache_dir=str(tmp_path / "cache"))
    first = list(ds)  # cold: fetched through the read-ahead threads
    _settled(str(tmp_path / "cache"))
    calls: list[tuple[str, str]] = []
    # Every read goes through the cache bound to the volume (LocalCache.at).
    lookup, lookup_run, fetch = Bound.lookup, Bound.lookup_run, Bound.fetch
    lookup_rows = Bound.lookup_rows

    def traced_lookup(bound, entry, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("lookup", threading.current_thread().name))
        return lookup(bound, entry, **kwargs)

    def traced_lookup_run(bound, entries, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("lookup", threading.current_thread().name))
        return lookup_run(bound, entries, **kwargs)

    def traced_lookup_rows(bound, *columns, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("lookup", threading.current_thread().name))
        return lookup_rows(bound, *columns, **kwargs)

    def traced_fetch(bound, entry, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(("fetch", threading.current_thread().name))
        return fetch(bound, entry, **kwargs)

    monkeypatch.setattr(Bound, "lookup", traced_lookup)
    monkeypatch.setattr(Bound, "fetch", traced_fetch)
    monkeypatch.setattr(Bound, "lookup_run", traced_lookup_run)
    monkeypatch.setattr(Bound, "lookup_rows", traced_lookup_rows)
    started: list[str] = []
    it = iter(ds)
    for _ in it:
        started.extend(_read_ahead_threads())
    assert list(ds) == first
    assert calls and set(calls) == {("lookup", threading.current_thread().name)}
    assert started == []


@given(hits=st.lists(st.booleans(), max_size=40), depth=st.integers(1, 5),
       failing=st.sets(st.integers(0, 39), max_size=3))
@settings(max_examples=60, deadline=None)
def test_read_ahead_mixes_hits_and_misses_in_order(hits, depth, failing) -> None:  # type: ignore[no-untyped-def]
    """Hits from the consumer's lookups and misses fetched by the threads come
    back in slot order, errors in their turn, and no fetch runs beyond the window."""
    from ucstage.data.slotread import ReadAhead

    entries = [FileEntry(f"f{i}", i, "v") for i in range(len(hits))]
    asked = [0]
    beyond: list[tuple[int, int]] = []

    def lookup(entry: FileEntry) -> str | None:
        return f"hit:{entry.size}" if hits[entry.size] else None

    def fetch(entry: FileEntry) -> str:
        if entry.size > asked[0] + depth:
            beyond.append((entry.size, asked[0]))
        if entry.size in failing:
            raise OSError(f"boom {entry.size}")
        return f"fetched:{entry.size}"

    ahead = ReadAhead(fetch, entries, depth, lookup=lookup)
    paths = iter(ahead)
    try:
        for i, hit in enumerate(hits):
            if not hit and i in failing:
                with pytest.raises(OSError, match=f"boom {i}$"):
                    next(paths)
                break  # the first error ends the iteration, as it ends the dataset's
            assert next(paths) == (f"hit:{i}" if hit else f"fetched:{i}")
            asked[0] = i + 1  # the consumer asks for the next one
        else:
            assert list(paths) == []
    finally:
        ahead.close()
    assert beyond == []
    assert ahead.alive == 0
    stopped_at = min((i for i in failing if i < len(hits) and not hits[i]), default=len(hits))
    if all(hits[:stopped_at + depth + 1]):
        assert ahead._threads == []  # no miss came into the window: no thread started
