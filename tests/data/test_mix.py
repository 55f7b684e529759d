"""ucstage.Mix through the ucstage DataLoader, on local folders (each file holds
its own source and name): the issue's 100 + 50 files at 0.5/0.5 over 200
items, reproducible per seed, a new interleaving per epoch; ranks given
explicitly (RankedDataset) for the per-slot counts and a resume mid-epoch on
other layouts; the audit and the MLflow counts per source; persistent
workers; bad input."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np
import pytest

from tests.common.resume import Decode, Ranked, RankedDataset
from ucstage import merge_states
from ucstage.cache import LocalCache
from ucstage.data import DataLoader, Mix, VolumeDataset
from ucstage.errors import CacheFull, EmptySource, InvalidArgument, ResumeMismatch


def make_source(root: str, label: str, n: int) -> str:
    folder = os.path.join(root, label)
    for i in range(n):
        path = os.path.join(folder, f"d{i % 3}", f"{label}{i:03d}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"{label}{i:03d}")
    return folder


@pytest.fixture
def sources(tmp_path) -> tuple[str, str, str]:  # type: ignore[no-untyped-def]
    return (make_source(str(tmp_path), "a", 100), make_source(str(tmp_path), "b", 50),
            str(tmp_path / "cache"))


class RankedMix(Ranked, Mix):
    """A Mix that is rank ``rank`` of ``world`` without a process group."""


def mix_of(sources: tuple[str, str, str], *, rank: int = 0, world: int = 1,
           **options: Any) -> Mix:
    a, b, cache = sources
    parts = {name: RankedDataset(path, rank=rank, world=world, cache_dir=cache, read_ahead=1)
             for name, path in (("a", a), ("b", b))}
    options.setdefault("weights", [0.5, 0.5])
    options.setdefault("epoch_size", 200)
    return RankedMix(parts, rank=rank, world=world, **options)


def run(mix: Mix, *, workers: int = 2, epochs: int = 1, state: dict[str, Any] | None = None,
        stop_after: int | None = None, **loader: Any) -> tuple[list[list[str]], Any]:
    """Epochs of the mix through a loader: (items per epoch, the loader), with
    the loader's state after the last epoch's items in ``loader.saved``."""
    dl = DataLoader(Decode(mix), batch_size=4, num_workers=workers, log_mlflow=False, **loader)
    if state is not None:
        dl.load_state_dict(state)
    got = []
    for _ in range(epochs):
        items: list[str] = []
        for n, batch in enumerate(dl, 1):
            items += batch
            if stop_after is not None and n == stop_after:
                break
        got.append(items)
        dl.saved = dl.state_dict()  # type: ignore[attr-defined]
        mix.set_epoch(mix.epoch + 1)
    return got, dl


def test_half_and_half_of_100_and_50_over_200_items(sources) -> None:  # type: ignore[no-untyped-def]
    mix = mix_of(sources, seed=4)
    (first, second), dl = run(mix, epochs=2)
    for epoch in (first, second):
        by_source = Counter(item[0] for item in epoch)
        assert by_source == {"a": 100, "b": 100}
        # a: one pass, every file once; b: two passes, every file twice.
        assert set(Counter(i for i in epoch if i[0] == "a").values()) == {1}
        assert Counter(i for i in epoch if i[0] == "b") == {f"b{i:03d}": 2 for i in range(50)}
    assert first != second  # a new interleaving (and new permutations) per epoch
    assert mix.counts == {"a": 100, "b": 100}
    assert [s.source_items for s in dl.epoch_stats] == [{"a": 100, "b": 100}] * 2
    assert [a.coverage_ok for a in dl.audits] == [True, True]
    assert [(s.name, s.items, s.duplicates, s.gaps, s.passes) for s in dl.audits[1].sources] == [
        ("a", 100, 0, 0, (1, 1)), ("b", 100, 0, 0, (2, 3))]
    # Reproducible per seed (a fresh mix and loader), another seed mixes otherwise.
    (again,), _ = run(mix_of(sources, seed=4))
    (other,), _ = run(mix_of(sources, seed=5))
    assert again == first and other != first


def test_each_slot_reads_within_one_of_each_share_and_len_counts_it(sources) -> None:  # type: ignore[no-untyped-def]
    seen: Counter[str] = Counter()
    for rank in range(2):
        mix = mix_of(sources, rank=rank, world=2, seed=1)
        (items,), dl = run(mix, workers=3)
        seen.update(items)
        per = Counter(i[0] for i in items)
        # 6 slots: 100 / 6 = 16.7 of each source per slot, 3 slots per rank.
        assert 48 <= per["a"] <= 51 and 48 <= per["b"] <= 51, per
        assert len(mix) == len(items) and mix.lengths == dict(per)
        assert dl.epoch_stats[0].source_items == dict(per)
    assert Counter(i[0] for i in seen.elements()) == {"a": 100, "b": 100}


def test_equal_length_gives_every_rank_the_same_batches(sources) -> None:  # type: ignore[no-untyped-def]
    batches = []
    for rank in range(2):
        mix = mix_of(sources, rank=rank, world=2, epoch_size=201, equal_length="pad")
        dl = DataLoader(Decode(mix), batch_size=4, num_workers=3, log_mlflow=False)
        batches.append(sum(1 for _ in dl))
        assert len(mix) == 3 * 34  # ceil(201 / 6) per slot
    assert batches[0] == batches[1]


def test_repeat_reads_a_tenth_and_two_and_a_half(sources) -> None:  # type: ignore[no-untyped-def]
    mix = mix_of(sources, weights=None, epoch_size=None, repeat=[0.1, 2.5])
    epochs, _ = run(mix, workers=0, epochs=10)
    a_seen = [i for epoch in epochs for i in epoch if i[0] == "a"]
    assert all(Counter(i[0] for i in e) == {"a": 10, "b": 125} for e in epochs)
    assert sorted(a_seen) == [f"a{i:03d}" for i in range(100)]  # disjoint windows: all once


@pytest.mark.parametrize("layout", [(3, 1), (1, 0), (2, 3)])
def test_resume_mid_epoch_on_another_layout_finishes_the_epoch(sources, layout) -> None:  # type: ignore[no-untyped-def]
    whole = Counter()
    for rank in range(2):
        (items,), _ = run(mix_of(sources, rank=rank, world=2, seed=9), workers=2)
        whole.update(items)
    before, states = [], []
    for rank in range(2):
        (items,), dl = run(mix_of(sources, rank=rank, world=2, seed=9), workers=2,
                           stop_after=5)
        assert len(items) == 20
        before += items
        states.append(dl.saved)
    merged = merge_states(states)
    world, workers = layout
    after = []
    for rank in range(world):
        (items,), dl = run(mix_of(sources, rank=rank, world=world, seed=9), workers=workers,
                           state=merged)
        after += items
    assert Counter(before + after) == whole
    with pytest.raises(ResumeMismatch):  # another mix (its weights) refuses the state
        run(mix_of(sources, rank=0, world=world, seed=9, weights=[0.6, 0.4]),
            workers=workers, state=merged)


def test_a_wrapped_mix_is_found_and_its_sources_are_not(sources) -> None:  # type: ignore[no-untyped-def]
    mix = mix_of(sources)
    dl = DataLoader(Decode(mix), batch_size=4, num_workers=2, log_mlflow=False)
    assert dl.volume_dataset is mix and dl.persistent_workers


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"weights": [0, 0]}, "weights must sum to a positive number"),
    ({"weights": None, "epoch_size": None, "repeat": [1, -1]}, "repeat must be 0 or more"),
    ({"repeat": [1, 1]}, "pass weights or repeat, not both"),
    ({"weights": {"c": 1}}, "unknown sources"),
])
def test_bad_input_is_refused_when_built(sources, kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match=message):
        mix_of(sources, **kwargs)


def test_issue_28_edge_cases_are_clear_up_front_or_accepted(sources, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b, cache = sources
    parts = [VolumeDataset(a, cache_dir=cache), VolumeDataset(b, cache_dir=cache)]
    # An epoch too large to hold a count per position: refused when built.
    with pytest.raises(InvalidArgument, match="more than the 1,000,000,000 a mix allows"):
        Mix(parts, weights=[1, 1], epoch_size=10**12)
    # A weight so small the default epoch explodes: InvalidArgument, not OverflowError.
    tiny = Mix(parts, weights=[1e-300, 1])
    with pytest.raises(InvalidArgument, match="about 10\\^302 items"):
        tiny.freeze()
    # numpy's numbers are numbers.
    mix = Mix(parts, weights=[np.int64(1), np.float32(0.5)], epoch_size=np.int64(30))
    assert mix.counts == {"0": 20, "1": 10}
    assert sum(1 for _ in mix) == 30
    # Keys 1 and "1" stay two sources, with two labels.
    named = Mix({1: parts[0], "1": parts[1]}, weights={1: 3, "1": 1}, epoch_size=40)
    assert named.counts == {1: 30, "1": 10}
    assert named.names == ["1", "'1'"]
    assert Counter(os.path.basename(p)[0] for p in named) == {"a": 30, "b": 10}
    (_,), dl = run(named, workers=0)
    assert dl.epoch_stats[0].source_items == {"1": 30, "'1'": 10}
    # A source weighted 0 with nothing to read is not read, so it is allowed.
    empty = tmp_path / "empty"
    empty.mkdir()
    for weights in ([1, 0], {"0": 1}):
        unread = Mix([parts[0], VolumeDataset(str(empty), cache_dir=cache)], weights=weights)
        assert unread.counts == {"0": 100, "1": 0}
        assert sum(1 for _ in unread) == 100
    (items,), dl = run(Mix([VolumeDataset(str(empty), cache_dir=cache), parts[1]],
                           repeat=[0, 1]), workers=2)
    assert len(items) == 50 and dl.audits[0].coverage_ok
    with pytest.raises(EmptySource):  # weighted: it must have items
        Mix([parts[0], VolumeDataset(str(empty), cache_dir=cache)], weights=[1, 1]).freeze()


def test_only_sharded_datasets_mix(sources) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument, match="got list"):
        Mix([VolumeDataset(sources[0]), ["x"]])
    mix = mix_of(sources)
    with pytest.raises(InvalidArgument, match="got RankedMix"):
        Mix([mix])


def test_a_mix_reads_through_a_capped_cache(sources, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = LocalCache(str(tmp_path / "capped"), max_bytes=4000)  # 150 files of 4 bytes
    parts = [VolumeDataset(path, cache=cache, read_ahead=1) for path in sources[:2]]
    mix = Mix(parts, weights=[1, 1], epoch_size=60)
    (items,), dl = run(mix, workers=2)
    assert Counter(i[0] for i in items) == {"a": 30, "b": 30}
    assert dl.audits[0].coverage_ok
    tiny = LocalCache(str(tmp_path / "tiny"), max_bytes=6)  # a window that can never fit
    with pytest.raises(CacheFull):
        run(Mix([VolumeDataset(path, cache=tiny) for path in sources[:2]]), workers=2)


def test_a_table_mixes_with_a_volume_by_row_group(sources, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ucstage.data import TableDataset

    folder = tmp_path / "table"
    folder.mkdir()
    ids = pa.table({"id": pa.array(range(120), pa.int64())})
    pq.write_table(ids, folder / "part-0.parquet", row_group_size=10)  # 12 row groups
    table = TableDataset(str(folder), cache_dir=sources[2])
    files = VolumeDataset(sources[1], cache_dir=sources[2])  # b: 50 files
    mix = Mix({"t": table, "b": files}, weights=[0.5, 0.5], epoch_size=48, seed=2)
    dl = DataLoader(mix, batch_size=None, num_workers=2, log_mlflow=False)
    epochs = []
    for epoch in range(2):
        mix.set_epoch(epoch)
        epochs.append(list(dl))
    for got in epochs:
        batches = [x for x in got if isinstance(x, pa.RecordBatch)]
        paths = [x for x in got if isinstance(x, str)]
        assert len(batches) == 24 and len(paths) == 24  # 24 row groups: two passes of 12
        rows = Counter(v for batch in batches for v in batch.column("id").to_pylist())
        assert rows == {i: 2 for i in range(120)}
        assert len(set(paths)) == 24
    assert [a.coverage_ok for a in dl.audits] == [True, True]
    assert [(s.name, s.items, s.duplicates) for s in dl.audits[0].sources] == [
        ("t", 24, 0), ("b", 24, 0)]
    # b's 50 files in windows of 24: epoch 1 reads files epoch 0 did not.
    assert not set(p for p in epochs[0] if isinstance(p, str)) & \
        set(p for p in epochs[1] if isinstance(p, str))


MLFLOW_MIX = r"""
import json, sys
import mlflow
from mlflow.tracking import MlflowClient
from ucstage import DataLoader, Mix, VolumeDataset

a, b, out = sys.argv[1:4]
mix = Mix({"a": VolumeDataset(a), "b": VolumeDataset(b)}, weights=[3, 1], epoch_size=80)
loader = DataLoader(mix, batch_size=4, num_workers=2, collate_fn=list)
mlflow.set_experiment("ucstage-mix")
with mlflow.start_run() as run:
    for epoch in range(2):
        mix.set_epoch(epoch)
        for batch in loader:
            pass
    loader.flush_metrics()
client = MlflowClient()
json.dump({n: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, n)]
           for n in ("ucstage/epoch_items_a", "ucstage/epoch_items_b")}, open(out, "w"))
"""


def test_mlflow_counts_each_source_per_epoch(sources, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(MLFLOW_MIX)
    out = tmp_path / "out.json"
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db",
               PYTHONPATH=os.getcwd(), UCSTAGE_CACHE_DIR=sources[2])
    proc = subprocess.run([sys.executable, str(script), sources[0], sources[1], str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert sorted(got["ucstage/epoch_items_a"]) == [[0, 60.0], [1, 60.0]]
    assert sorted(got["ucstage/epoch_items_b"]) == [[0, 20.0], [1, 20.0]]


def test_persistent_workers_leave_an_epoch_early_and_read_the_next_whole(sources) -> None:  # type: ignore[no-untyped-def]
    mix = mix_of(sources, seed=6)
    dl = DataLoader(Decode(mix), batch_size=4, num_workers=2, log_mlflow=False)
    assert dl.persistent_workers
    for n, _ in enumerate(dl, 1):
        if n == 3:
            break  # epoch 0 given up: the workers close its iterators
    workers = dl._iterator._workers  # type: ignore[union-attr]
    mix.set_epoch(1)
    whole = list(item for batch in dl for item in batch)
    assert dl._iterator._workers == workers  # type: ignore[union-attr]  # the same processes
    assert Counter(i[0] for i in whole) == {"a": 100, "b": 100}
    again = mix_of(sources, seed=6)
    again.set_epoch(1)
    dl2 = DataLoader(Decode(again), batch_size=4, num_workers=2, log_mlflow=False)
    assert list(item for batch in dl2 for item in batch) == whole  # epoch 1 as set


def test_spawned_workers_unpickle_the_mix(sources) -> None:  # type: ignore[no-untyped-def]
    a, b, cache = sources
    mix = Mix([VolumeDataset(a, cache_dir=cache), VolumeDataset(b, cache_dir=cache)],
              repeat=[0.5, 1], seed=3)
    mix.freeze()
    dl = DataLoader(mix, batch_size=None, num_workers=2, multiprocessing_context="spawn",
                    log_mlflow=False)
    got = Counter(os.path.basename(p)[0] for p in dl)
    assert got == {"a": 50, "b": 50}


def test_a_grouped_source_mixes_by_sample(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i in range(30):
        (pairs / f"{i:03d}.jpg").write_bytes(b"j" * (i + 1))
        (pairs / f"{i:03d}.json").write_text(str(i))
    plain = make_source(str(tmp_path), "plain", 20)
    grouped = VolumeDataset(str(pairs), group="key", cache_dir=str(tmp_path / "cache"))
    files = VolumeDataset(plain, cache_dir=str(tmp_path / "cache"))
    mix = Mix([grouped, files], weights=[0.5, 0.5], epoch_size=40)
    assert mix.shares.sizes == (30, 20)  # samples, not member files
    items = list(DataLoader(mix, batch_size=None, num_workers=2, log_mlflow=False))
    samples = [x for x in items if isinstance(x, dict)]
    assert len(samples) == 20 and len(items) == 40
    for sample in samples:  # whole, cached, the members of one key
        assert sorted(sample) == ["jpg", "json"]
        assert os.path.exists(sample["jpg"]) and os.path.exists(sample["json"])
        assert sample["jpg"].rsplit(".", 1)[0] == sample["json"].rsplit(".", 1)[0]
    assert len({s["jpg"] for s in samples}) == 20  # each sample once within the pass
