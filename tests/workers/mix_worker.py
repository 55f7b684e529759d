"""A torchrun worker for tests/data/test_mix_torchrun.py; writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 tests/workers/mix_worker.py A B OUT

Mixes A and B at 0.5/0.5 over 200 items (seed 3), 2 DataLoader workers per
rank, persistent (the default): records, per epoch, the items (the files'
own text) each worker delivered, the rank's batches, ``len()``, the loader's
per-source counts and the audit per source. Then stops epoch 2 after 3
batches, gathers the state, and resumes it with a fresh mix and loader.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from ucstage import DataLoader, Mix, VolumeDataset


class Read(IterableDataset):  # type: ignore[type-arg]
    """The user's decoding wrapper: (worker id, the file's text) per item."""

    def __init__(self, mix: Mix) -> None:
        self.mix = mix

    def __iter__(self) -> Iterator[tuple[int, str]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        for local in self.mix:
            with open(local, encoding="utf-8") as fh:
                yield worker, fh.read()


def build(a: str, b: str) -> tuple[Mix, DataLoader]:
    mix = Mix({"a": VolumeDataset(a, read_ahead=2), "b": VolumeDataset(b, read_ahead=2)},
              weights=[0.5, 0.5], epoch_size=200, seed=3)
    return mix, DataLoader(Read(mix), batch_size=None, num_workers=2, log_mlflow=False)


def main() -> None:
    a, b, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mix, loader = build(a, b)
    result: dict[str, Any] = {"rank": rank, "epochs": []}
    for epoch in range(2):
        mix.set_epoch(epoch)
        by_worker: dict[str, list[str]] = {"0": [], "1": []}
        batches = 0
        for worker, text in loader:
            by_worker[str(int(worker))].append(text)
            batches += 1
        audit = loader.audits[-1]
        result["epochs"].append({
            "items": by_worker, "batches": batches, "len": len(mix),
            "source_items": loader.epoch_stats[-1].source_items,
            "audit_ok": audit.coverage_ok,
            "audit_sources": [[s.name, s.items, s.duplicates, s.gaps] for s in audit.sources]})
    mix.set_epoch(2)
    before: list[str] = []
    for n, (_, text) in enumerate(loader, 1):
        before.append(text)
        if n == 3 * 4:  # batch_size=None: one item per batch; 3 per worker
            break
    state = loader.state_dict(gather=True)
    _, again = build(a, b)
    again.load_state_dict(state)
    after = [text for _, text in again]
    result["resume"] = {"before": before, "after": after,
                        "audit_ok": again.audits[-1].coverage_ok if again.audits else None,
                        "resumed": again.audits[-1].resumed_files if again.audits else None}
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
