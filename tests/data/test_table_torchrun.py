"""TableDataset under torchrun: 2 ranks on gloo x 2 DataLoader workers each,
reading a Parquet folder on the rclone FUSE mount. Every row of the table is
delivered exactly once per epoch; a run stopped mid-epoch resumes on another
layout (1 rank x 3 workers, in this process) with every row once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.common.parts import REPO, free_port, unique, wait_synced

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

WORKER = os.path.join(REPO, "tests", "workers", "table_worker.py")
SIZES = [700, 333, 512, 90, 1201, 64]  # rows per file; 6 files, 100-row groups: 32 groups
ROWS = sum(SIZES)


def make_table(fuse_volume: tuple[str, str]) -> str:
    backing, mnt = fuse_volume
    key = unique("table")
    os.makedirs(os.path.join(backing, key))
    start = 0
    for i, n in enumerate(SIZES):
        ids = np.arange(start, start + n, dtype=np.int64)
        t = pa.table({"id": ids, "v": pa.FixedSizeListArray.from_arrays(
            pa.array(np.repeat(ids, 3).astype(np.float32)), 3), "s": [str(x) for x in ids]})
        pq.write_table(t, os.path.join(backing, key, f"part-{i}.parquet"), row_group_size=100)
        start += n
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    return os.path.join(mnt, key)


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", WORKER, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def run_ranks(fuse_volume: tuple[str, str], tmp_path: Any, mode: str, *extra: str
              ) -> tuple[str, list[dict[str, Any]]]:
    """A fresh table on the mount, torchrun of ``mode`` over it: (source, each rank's result)."""
    source = make_table(fuse_volume)
    out = str(tmp_path / "out")
    os.makedirs(out)
    proc = torchrun(mode, source, out, *extra)
    assert proc.returncode == 0, proc.stderr[:6000]
    return source, results(out)


def once(ids: Any) -> bool:
    """Every row of the table exactly once."""
    got = Counter(ids)
    return sorted(got) == list(range(ROWS)) and set(got.values()) == {1}


def results(out: str) -> list[dict[str, Any]]:
    found = []
    for rank in (0, 1):
        with open(os.path.join(out, f"rank{rank}.json"), encoding="utf-8") as fh:
            found.append(json.load(fh))
    return found


def test_every_row_once_per_epoch_on_two_ranks_two_workers(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, ranks = run_ranks(fuse_volume, tmp_path, "epochs")
    orders = []
    for epoch in range(2):
        assert once(i for r in ranks for i in r["epochs"][epoch]["ids"]), epoch
        for r in ranks:
            e = r["epochs"][epoch]
            assert e["persistent"]  # the loader's default applies to TableDataset too
            assert e["batches"] == e["len"]  # len(loader): this rank's batches
            assert e["audit"] == {"files": 32, "duplicates": 0, "gaps": 0, "ok": True}
        orders.append([i for r in ranks for i in r["epochs"][epoch]["ids"]])
    assert orders[0] != orders[1]  # another epoch, another order
    # Rows are shuffled within windows, not only row groups: a batch mixes row groups.
    first = ranks[0]["epochs"][0]["ids"][:37]
    assert len({i // 100 for i in first}) > 1


def test_stopped_run_resumes_on_another_layout_with_every_row_once(fuse_volume, tmp_path,
                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from ucstage import DataLoader, TableDataset

    source, ranks = run_ranks(fuse_volume, tmp_path, "stop", "5")
    before = [i for r in ranks for i in r["ids"]]
    assert len(before) == 2 * 5 * 37
    state = ranks[0]["state"]
    assert state == ranks[1]["state"] and state["version"] == 2 and state["unit"] == "row-group"
    assert state["partial"]  # batches of 37 rows end inside row groups
    ds = TableDataset(source, columns=["id", "v"], batch_rows=37, shuffle=True, seed=3,
                      shuffle_window=3, format="torch")
    loader = DataLoader(ds, batch_size=None, num_workers=3)
    loader.load_state_dict(state)
    after = [int(i) for b in loader for i in b["id"].tolist()]
    assert once(before + after)
    audit = loader.audits[-1]
    assert (audit.files, audit.duplicates, audit.gaps, audit.coverage_ok) == (32, 0, 0, True)


def test_each_node_caches_its_share_not_the_table(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two nodes (two cache folders) under the node shuffle scope: each holds
    the row groups its node reads, every epoch the same, <= 0.6x the table."""
    _, ranks = run_ranks(fuse_volume, tmp_path, "nodes")
    for epoch in range(2):
        assert once(i for r in ranks for i in r["ids"][epoch])
    table_bytes = ranks[0]["table_bytes"]
    for r in ranks:
        assert 0 < r["cached"] <= 0.6 * table_bytes, (r["cached"], table_bytes)
    assert ranks[0]["cached"] + ranks[1]["cached"] == table_bytes  # each row group once


def test_a_filter_s_rows_once_on_two_ranks_two_workers(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """filter= under torchrun: every matching row once (and no other), the
    batches len() promised, the audit over the kept row groups only."""
    _, ranks = run_ranks(fuse_volume, tmp_path, "filtered")
    want = [i for i in range(ROWS) if 150 <= i < 2500 and i != 777]
    got = Counter(i for r in ranks for i in r["ids"])
    assert sorted(got) == want and set(got.values()) == {1}
    kept = ranks[0]["row_groups"]
    assert kept == ranks[1]["row_groups"] and kept < 32  # the groups of ids < 150 or >= 2500
    for r in ranks:
        assert r["batches"] == r["len"]
        assert r["audit"] == {"files": kept, "duplicates": 0, "gaps": 0, "ok": True}
