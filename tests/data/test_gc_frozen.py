"""Forked DataLoader workers start with the parent's objects frozen out of the
collector's walks (data/workerstart.py ``gc_frozen_for_fork``), and the parent
collects as before once they are started."""

from __future__ import annotations

import gc
from pathlib import Path

import torch.utils.data as tud

from ucstage.data import DataLoader, VolumeDataset


def _source(tmp_path: Path) -> str:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(8):
        (src / f"f{i}").write_text(str(i))
    return str(src)


class Frozen(tud.IterableDataset):  # type: ignore[type-arg]
    """Yields, in each worker, how many objects its collector holds frozen."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self):  # type: ignore[no-untyped-def]
        for _ in self.paths:
            yield gc.get_freeze_count()


def test_forked_workers_inherit_frozen_objects_and_the_parent_unfreezes(tmp_path: Path) -> None:
    ds = VolumeDataset(_source(tmp_path), cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(Frozen(ds), batch_size=None, num_workers=2, log_mlflow=False,
                        multiprocessing_context="fork")
    assert gc.get_freeze_count() == 0
    for epoch in range(2):  # the second epoch reuses the persistent workers
        ds.set_epoch(epoch)
        counts = list(loader)
        assert len(counts) == 8
        # Every worker started with the parent's objects frozen (thousands:
        # torch, pyarrow, ucstage); the parent itself holds none frozen.
        assert min(counts) > 1000
        assert gc.get_freeze_count() == 0


def test_spawned_workers_get_nothing_frozen(tmp_path: Path) -> None:
    ds = VolumeDataset(_source(tmp_path), cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(Frozen(ds), batch_size=None, num_workers=1, log_mlflow=False,
                        multiprocessing_context="spawn")
    assert list(loader) == [0] * 8
    assert gc.get_freeze_count() == 0


def _is_frozen(obj: object) -> bool:
    """Whether the collector holds ``obj`` in its permanent generation
    (``gc.get_objects`` walks the other generations only)."""
    return gc.is_tracked(obj) and not any(o is obj for o in gc.get_objects())


def test_a_script_that_froze_objects_itself_keeps_them_frozen(tmp_path: Path) -> None:
    ds = VolumeDataset(_source(tmp_path), cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(Frozen(ds), batch_size=None, num_workers=1, log_mlflow=False,
                        multiprocessing_context="fork")
    # The script's own objects, frozen by the script. A count of frozen
    # objects would also move as unrelated frozen objects are freed.
    mine = [{"weights": [1.0, 2.0]} for _ in range(3)]
    gc.freeze()
    try:
        assert all(_is_frozen(o) for o in mine)
        later = [{"made": "after the script's freeze"}]
        counts = list(loader)
        assert len(counts) == 8
        assert all(_is_frozen(o) for o in mine)  # not unfrozen by the loader
        assert min(counts) > 0  # the worker inherited the script's frozen objects
        assert not _is_frozen(later)  # nor did it freeze the script's other objects
    finally:
        gc.unfreeze()
    assert not any(_is_frozen(o) for o in mine)  # the check itself can say "no"
