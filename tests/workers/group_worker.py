"""A torchrun worker for tests/data/test_grouped_torchrun.py; writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 tests/workers/group_worker.py SOURCE OUT

2 DataLoader workers per rank over a grouped VolumeDataset (``group="key"``,
``require=("jpg", "json")``), two shuffled epochs: records per epoch the
samples each rank delivered, whether both members were in the cache and held
the sample's own bytes when the sample arrived, and the audit's verdict.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import IterableDataset

from ucstage import DataLoader, VolumeDataset


class Check(IterableDataset):  # type: ignore[type-arg]
    """Yields (key, members, all cached and right) per sample, as a user's decoder would."""

    def __init__(self, samples: VolumeDataset) -> None:
        self.samples = samples

    def __iter__(self) -> Iterator[tuple[str, list[str], bool]]:
        root = self.samples.cache().namespace_dir(self.samples.freeze().volume())
        for sample in self.samples:
            ok = True
            key = ""
            for suffix, local in sample.items():
                rel = os.path.relpath(local, root).replace(os.sep, "/")
                key = rel.rsplit(".", 1)[0]
                with open(local, encoding="utf-8") as fh:
                    ok = ok and fh.read() == f"{key}.{suffix}" and rel == f"{key}.{suffix}"
            yield key, sorted(sample), ok


def main(source: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    samples = VolumeDataset(source, group="key", require=("jpg", "json"), shuffle=True, seed=3)
    loader = DataLoader(Check(samples), batch_size=4, num_workers=2, collate_fn=list)
    result: dict[str, Any] = {"len": None, "epochs": []}
    for epoch in (0, 1):
        samples.set_epoch(epoch)
        got = [(key, members, bool(ok)) for batch in loader for key, members, ok in batch]
        audit = loader.audits[-1] if loader.audits else None
        result["epochs"].append({"items": got, "audit": None if audit is None else
                                 dict(vars(audit), coverage_ok=audit.coverage_ok)})
    result["len"] = len(samples)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
