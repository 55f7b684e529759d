"""A torchrun worker for tests/data/test_table_torchrun.py; writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 tests/workers/table_worker.py epochs SOURCE OUT
    torchrun --nproc_per_node=2 tests/workers/table_worker.py stop SOURCE OUT BATCHES
    torchrun --nproc_per_node=2 tests/workers/table_worker.py rows SOURCE OUT

``epochs``: 2 shuffled epochs of a TableDataset through ``ucstage.DataLoader``
(2 workers per rank, persistent by default); records the ids each rank got
per epoch, ``len(loader)``, the batches it counted and the audit.
``nodes``: two simulated nodes (``nproc_per_node=1``), each rank caching in
its own folder; records the ids per epoch and the bytes each cache holds.
``rows``: one shuffled epoch of every column (2 workers per rank); records
each row as JSON (keys sorted), ``len(loader)`` and the batches counted.
``stop``: epoch 0 until BATCHES batches, then the merged state
(``state_dict(gather=True)``) and the ids delivered so far.
``filtered``: one shuffled epoch of the rows :data:`FILTER` matches (its
``s`` column fetched, not asked for); the ids, batches, ``len`` and the audit.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch.distributed as dist

from ucstage import DataLoader, TableDataset


def ids_of(batch: Any) -> list[int]:
    return [int(i) for i in batch["id"].tolist()]


def dataset(source: str) -> TableDataset:
    return TableDataset(source, columns=["id", "v"], batch_rows=37, shuffle=True, seed=3,
                        shuffle_window=3, format="torch")


def epochs(source: str) -> dict[str, Any]:
    ds = dataset(source)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    out: dict[str, Any] = {"epochs": []}
    for epoch in range(2):
        ds.set_epoch(epoch)
        got: list[int] = []
        batches = 0
        for batch in loader:
            got += ids_of(batch)
            batches += 1
        audit = loader.audits[-1] if loader.audits else None
        out["epochs"].append({"ids": got, "batches": batches, "len": len(loader),
                              "persistent": bool(loader.persistent_workers),
                              "audit": None if audit is None else
                              {"files": audit.files, "duplicates": audit.duplicates,
                               "gaps": audit.gaps, "ok": audit.coverage_ok}})
    return out


def rows(source: str) -> dict[str, Any]:
    ds = TableDataset(source, batch_rows=5, shuffle=True, seed=3, shuffle_window=2)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got: list[str] = []
    batches = 0
    for batch in loader:
        got += [json.dumps(r, sort_keys=True, default=str) for r in batch.to_pylist()]
        batches += 1
    return {"rows": got, "batches": batches, "len": len(loader)}


def stop(source: str, batches: int) -> dict[str, Any]:
    ds = dataset(source)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got: list[int] = []
    it = iter(loader)
    for _ in range(batches):
        got += ids_of(next(it))
    state = loader.state_dict(gather=True)
    del it
    return {"ids": got, "state": state}


def nodes(source: str, out: str) -> dict[str, Any]:
    """Two simulated nodes (one rank each, each its own cache folder)."""
    rank = dist.get_rank()
    cache_dir = os.path.join(out, f"cache{rank}")
    ds = TableDataset(source, columns=["id", "v", "s"], batch_rows=50, shuffle=True,
                      nproc_per_node=1, cache_dir=cache_dir)
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        got.append([int(i) for b in loader for i in b.column("id").to_pylist()])
    cached = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache_dir)
                 for f in fs if ".ucstage-ranges" in d)
    return {"ids": got, "cached": cached, "table_bytes": ds.freeze().bytes}


FILTER = "id >= 150 and id < 2500 and s <> '777'"


def filtered(source: str) -> dict[str, Any]:
    ds = TableDataset(source, columns=["id"], filter=FILTER, batch_rows=37, shuffle=True,
                      seed=3, shuffle_window=3, format="torch")
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got, batches = [], 0
    for batch in loader:
        assert list(batch) == ["id"]
        got += ids_of(batch)
        batches += 1
    audit = loader.audits[-1]
    return {"ids": got, "batches": batches, "len": len(loader),
            "row_groups": ds.freeze().row_groups,
            "audit": {"files": audit.files, "duplicates": audit.duplicates,
                      "gaps": audit.gaps, "ok": audit.coverage_ok}}


def main() -> None:
    mode, source, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "nodes":
        result = nodes(source, out)
    elif mode == "filtered":
        result = filtered(source)
    elif mode == "rows":
        result = rows(source)
    else:
        result = epochs(source) if mode == "epochs" else stop(source, int(sys.argv[4]))
    result["rank"] = rank
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
