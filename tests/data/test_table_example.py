"""The table example (docs/examples/train_table.py) trains over a Parquet folder and a Delta table."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

from tests.common.parts import REPO

EXAMPLE = os.path.join(REPO, "docs", "examples", "train_table.py")


def _rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "text": [f"event {i}" for i in ids],
                     "label": [i % 3 for i in ids]})


def _run(tmp_path: Path, *args: str) -> list[tuple[int, int, float]]:
    env = {**os.environ, "PYTHONPATH": REPO, "UCSTAGE_CACHE_DIR": str(tmp_path / "cache"),
           "UCSTAGE_WAREHOUSE": str(tmp_path / "warehouse"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, EXAMPLE, *args], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "reads nothing" not in out.stderr
    found = re.findall(r"rank 0 epoch (\d+): (\d+) rows, mean loss ([\d.]+)", out.stdout)
    return [(int(e), int(n), float(loss)) for e, n, loss in found]


def test_trains_over_a_parquet_folder_and_the_loss_falls(tmp_path: Path) -> None:
    folder = tmp_path / "events"
    folder.mkdir()
    for i in range(6):  # 6 files of 100 rows: 6 row groups for 2 workers
        pq.write_table(_rows(i * 100, 100), folder / f"part-{i}.parquet")
    epochs = _run(tmp_path, str(folder), "--epochs", "3", "--batch-rows", "20")
    assert [e for e, _, _ in epochs] == [0, 1, 2]
    # equal_length="drop": each of 2 slots reads 3 row groups, 15 batches of 20
    assert all(n == 600 for _, n, _ in epochs)
    assert epochs[-1][2] < epochs[0][2]


def test_trains_over_a_delta_table_by_name(tmp_path: Path) -> None:
    path = tmp_path / "warehouse" / "main" / "ml" / "events"
    write_deltalake(str(path), _rows(0, 300), mode="overwrite")
    epochs = _run(tmp_path, "main.ml.events", "--num-workers", "0", "--epochs", "1",
                  "--batch-rows", "50")
    assert epochs == [(0, 300, epochs[0][2])]
