"""A batch that crosses a process carries its own rows only: batches cut from
a shuffled window are zero-copy slices of it, and a DataLoader worker pickled
the whole window with each (issue 29: a 50 KB batch was 7.9-30 MB)."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from tests.common.tables import table
from ucstage import DataLoader, LocalCache, TableDataset


def test_a_batch_from_a_worker_pickles_to_about_its_rows(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    for i in range(2):
        pq.write_table(table(i * 20_000, 20_000, width=8), folder / f"p{i}.parquet",
                       row_group_size=10_000)
    ds = TableDataset(str(folder), batch_rows=1000, format="arrow", shuffle=True,
                      cache=LocalCache(tmp_path / "cache"))
    seen: Counter[int] = Counter()
    sizes = []
    for batch in DataLoader(ds, batch_size=None, num_workers=2):
        seen.update(batch.column("id").to_pylist())
        # What arrived is what the worker sent: its buffers and its pickle.
        sizes.append((batch.num_rows, batch.nbytes, batch.get_total_buffer_size(),
                      len(pickle.dumps(batch))))
    assert seen == Counter(range(40_000))
    assert {rows for rows, *_ in sizes} == {1000}
    for rows, data, held, pickled in sizes:
        assert held <= 1.2 * data, (rows, data, held)
        assert pickled <= 1.2 * data, (rows, data, pickled)
