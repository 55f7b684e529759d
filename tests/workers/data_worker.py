"""A torchrun worker for tests/test_data_torchrun.py; writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 tests/workers/data_worker.py shard SOURCE OUT [MANIFEST]
    torchrun --nproc_per_node=2 tests/workers/data_worker.py guard SOURCE OUT

``shard``: 2 DataLoader workers per rank over SOURCE; records which relative
paths each (rank, worker) yields, in order, for several configurations.
``guard``: ranks disagree (on the listing, num_workers, the shuffle scope); records the
RankMismatch each rank raised and exits 1.
``smallcache``: 3 shuffled epochs through the cache of ``$UCSTAGE_CACHE_DIR``
capped at ``$UCSTAGE_CACHE_MAX_BYTES`` (smaller than SOURCE); records each
epoch's (relative path, sha256 of the bytes read) and cache hit rate.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from ucstage import DataLoader, VolumeDataset
from ucstage.errors import RankMismatch


class Tagged(IterableDataset):  # type: ignore[type-arg]
    """A user-style wrapper: yields (worker id, relative path) per file."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[tuple[int, str]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        root = self.paths.cache().namespace_dir(self.paths.freeze().volume())
        for local in self.paths:
            yield worker, os.path.relpath(local, root).replace(os.sep, "/")


def by_worker(loader: DataLoader, workers: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {str(w): [] for w in range(max(1, workers))}
    for worker, rel in loader:
        out[str(int(worker))].append(rel)
    return out


def shard(source: str, manifest: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if manifest:
        # A frozen listing given to every rank: nobody lists the volume.
        frozen = VolumeDataset(manifest)
        result["manifest"] = by_worker(DataLoader(Tagged(frozen), batch_size=None,
                                                  num_workers=2), 2)
    plain = VolumeDataset(source)
    loader = DataLoader(Tagged(plain), batch_size=None, num_workers=2)
    result["plain"] = by_worker(loader, 2)
    result["len_plain"] = len(plain)  # the main process: this rank's files over 2 workers
    result["fingerprint"] = plain.fingerprint
    result["manifest_in_cache"] = os.path.exists(plain._manifest_path or "")

    shuffled = VolumeDataset(source, shuffle=True, seed=7)
    loader = DataLoader(Tagged(shuffled), batch_size=None, num_workers=2)
    for epoch in (0, 1):
        shuffled.set_epoch(epoch)
        result[f"shuffle_epoch{epoch}"] = by_worker(loader, 2)
    shuffled.set_epoch(0)
    result["shuffle_epoch0_again"] = by_worker(loader, 2)

    # Each rank its own "node" (nproc_per_node=1): the node scope keeps a rank's files.
    nodes = VolumeDataset(source, shuffle=True, seed=7, nproc_per_node=1)
    loader = DataLoader(Tagged(nodes), batch_size=None, num_workers=2)
    for epoch in (0, 1):
        nodes.set_epoch(epoch)
        result[f"nodes_epoch{epoch}"] = by_worker(loader, 2)
    result["len_nodes"] = len(nodes)

    for mode in ("pad", "drop"):
        ds = VolumeDataset(source, equal_length=mode)
        loader = DataLoader(Tagged(ds), batch_size=None, num_workers=2)
        result[mode] = by_worker(loader, 2)
        result[f"len_{mode}"] = len(ds)

    # num_workers=0: the main process reads, as worker 0 of 1.
    ds = VolumeDataset(source)
    result["main_process"] = by_worker(DataLoader(Tagged(ds), batch_size=None, num_workers=0), 0)
    return result


def guard(source: str) -> dict[str, Any]:
    rank = dist.get_rank()
    result: dict[str, Any] = {}
    # Same num_workers, different filters: the listing broadcast refuses.
    exclude = ["f00.bin"] if rank == 1 else []
    ds = VolumeDataset(source, exclude=exclude)
    try:
        list(DataLoader(ds, batch_size=None, num_workers=2))
    except RankMismatch as exc:
        result["filters"] = str(exc)
    # Each rank froze its own listing (a manifest per rank): fingerprints differ.
    ds = VolumeDataset(source, exclude=exclude)
    ds.freeze(broadcast=False)
    try:
        list(DataLoader(ds, batch_size=None, num_workers=2))
    except RankMismatch as exc:
        result["listing"] = str(exc)
    # Different num_workers: the guard refuses before any worker starts.
    ds = VolumeDataset(source)
    try:
        list(DataLoader(ds, batch_size=None, num_workers=2 if rank == 0 else 1))
    except RankMismatch as exc:
        result["workers"] = str(exc)
    # Different shuffle scopes (or nproc_per_node): refused too.
    ds = VolumeDataset(source, shuffle=True, shuffle_scope="node" if rank == 0 else "global",
                       nproc_per_node=1)
    try:
        list(DataLoader(ds, batch_size=None, num_workers=2))
    except RankMismatch as exc:
        result["scope"] = str(exc)
    return result


class Digests(IterableDataset):  # type: ignore[type-arg]
    """A decoding wrapper: reads each file, yields (relative path, sha256)."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[tuple[str, str]]:
        root = self.paths.cache().namespace_dir(self.paths.freeze().volume())
        for local in self.paths:
            with open(local, "rb") as fh:
                data = fh.read()
            yield os.path.relpath(local, root).replace(os.sep, "/"), \
                hashlib.sha256(data).hexdigest()


def smallcache(source: str) -> dict[str, Any]:
    paths = VolumeDataset(source, shuffle=True, seed=3, read_ahead=1)
    loader = DataLoader(Digests(paths), batch_size=None, num_workers=2, log_mlflow=False)
    epochs = []
    for epoch in range(3):
        paths.set_epoch(epoch)
        epochs.append([list(item) for item in loader])
        dist.barrier()  # ranks start each epoch together, as DDP keeps them
    return {"epochs": epochs, "hit_rates": [s.cache_hit_rate for s in loader.epoch_stats],
            "run": paths.run}


def main() -> int:
    mode, source, out = sys.argv[1:4]
    manifest = sys.argv[4] if len(sys.argv) > 4 else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if mode == "smallcache":
        result = smallcache(source)
    else:
        result = shard(source, manifest) if mode == "shard" else guard(source)
    result["rank"] = rank
    result["world_size"] = dist.get_world_size()
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    # Both ranks have written before either exits, so torchrun cannot kill a
    # rank that is still writing.
    dist.barrier()
    dist.destroy_process_group()
    return 1 if mode == "guard" and result.keys() & {"filters", "listing", "workers", "scope"} else 0


if __name__ == "__main__":
    sys.exit(main())
