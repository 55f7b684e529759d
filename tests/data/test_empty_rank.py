"""A loader whose rank reads nothing warns, instead of running no step in silence."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ucstage.data import DataLoader, TableDataset, VolumeDataset


def test_too_few_files_for_equal_length_drop_warns(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_text(str(i))
    ds = VolumeDataset(str(src), equal_length="drop", cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(ds, batch_size=None, num_workers=4, log_mlflow=False)
    with pytest.warns(UserWarning, match=r'reads nothing this epoch .* 3 items \(equal_length="drop"'):
        assert list(loader) == []


def test_one_row_group_for_two_slots_with_drop_warns(tmp_path: Path) -> None:
    src = tmp_path / "table"
    src.mkdir()
    pq.write_table(pa.table({"id": list(range(100))}), src / "part-0.parquet")
    ds = TableDataset(str(src), batch_rows=10, equal_length="drop",
                      cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(ds, batch_size=None, num_workers=2, log_mlflow=False)
    with pytest.warns(UserWarning, match="reads nothing this epoch from a listing of 1 items"):
        assert list(loader) == []


def test_a_rank_with_items_does_not_warn(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}").write_text(str(i))
    ds = VolumeDataset(str(src), cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(ds, batch_size=None, num_workers=0, log_mlflow=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*reads nothing.*")
        assert len(list(loader)) == 4
