"""A torchrun worker for tests/data/test_shards_torchrun.py; writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 tests/workers/shard_worker.py SOURCE OUT

Two shuffled epochs of a ShardDataset through ``ucstage.DataLoader`` (2
workers per rank); records, per epoch, each sample this rank got as a
string naming it and the SHA-256 of its bytes, ``len(loader)``'s dataset
length and the audit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

import torch.distributed as dist

from ucstage import DataLoader, ShardDataset


def named(sample: Any) -> str:
    """A tar sample: shard/key and its members' digest; a JSON value: its id."""
    if isinstance(sample, dict) and "__key__" in sample:
        digest = hashlib.sha256()
        for suffix in sorted(k for k in sample if not k.startswith("__")):
            digest.update(suffix.encode() + b"\0" + sample[suffix] + b"\0")
        return f"{sample['__shard__']}/{sample['__key__']} {digest.hexdigest()}"
    return f"jsonl {sample['id']} {sample['text']}"


def collate(batch: list[Any]) -> list[str]:
    return [named(s) for s in batch]


def main(source: str, out: str) -> None:
    dist.init_process_group("gloo")
    ds = ShardDataset(source, block_samples=16, shuffle=True, seed=2, shuffle_buffer=48,
                      cache_dir=os.path.join(out, "cache"))
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate)
    result: dict[str, Any] = {"epochs": []}
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = [name for batch in loader for name in batch]
        audit = loader.audits[-1]
        result["epochs"].append({"samples": got, "len": len(ds),
                                 "audit": [audit.files, audit.duplicates, audit.gaps,
                                           audit.coverage_ok]})
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
