"""TableDataset(equal_length="drop") says once what it drops (issue 30 item
4: 4,000 rows gave 2,688 per epoch without a word)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ucstage.data import DataLoader, TableDataset
from ucstage.tables.rowplan import drop_note


def _folder(tmp_path: Path, rows: int) -> str:
    (tmp_path / "t").mkdir()
    pq.write_table(pa.table({"id": list(range(rows))}), tmp_path / "t" / "a.parquet",
                   row_group_size=100)
    return str(tmp_path / "t")


def test_drop_says_once_what_it_drops_and_what_drops_less(tmp_path: Path) -> None:
    ds = TableDataset(_folder(tmp_path, 330), batch_rows=60, columns=["id"],
                      equal_length="drop")
    loader = DataLoader(ds, batch_size=None, num_workers=0, log_mlflow=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for epoch in range(2):
            ds.set_epoch(epoch)
            assert sum(len(b) for b in loader) == 300
    notes = [str(w.message) for w in seen if "equal_length" in str(w.message)]
    assert notes == [
        'equal_length="drop" keeps 300 of 330 rows per epoch (9% dropped): the one slot '
        "yields 5 batches of 60 rows, as many as the slot with the fewest rows (330). "
        'equal_length="pad" drops nothing (short slots re-read rows); batch_rows=55 would '
        "drop 0%; fewer slots (ranks x num_workers) even them out"]


def test_a_small_loss_is_not_worth_a_word() -> None:
    assert drop_note([667] * 6, 64) is None  # 4% dropped
    assert drop_note([], 64) is None and drop_note([0, 0], 8) is None
    # Imbalance, not the batch size: a smaller batch_rows would not help, so none is named.
    note = drop_note([4000, 2000], 1000)
    assert note is not None and "(33% dropped)" in note and "batch_rows=" not in note
