"""A small CPU training loop over a table read by row group through ucstage.

``TableDataset`` shards a Delta table (or a Parquet export of one) by row
group over ranks and DataLoader workers, caches only the column chunks each
node reads, and yields batches of ``batch_rows`` rows; ``format="torch"``
makes each batch a dict of tensors. ``equal_length="drop"`` gives every rank
the same number of batches, which DDP needs. The model learns ``label`` from
``id`` (the demo's table has ``label = id % 3`` with label 2 deleted).

    # after scripts/demo.sh: the table's Parquet export (6 files, 6 row groups)
    python docs/examples/train_table.py /Volumes/main/ml/train/events --epochs 2
    torchrun --nproc_per_node=2 docs/examples/train_table.py /Volumes/main/ml/train/events
    # the Delta table itself: one row group, so one slot (-k 0: no workers)
    python docs/examples/train_table.py main.ml.events --num-workers 0

The slots must not outnumber the row groups (the loader warns when a rank
would read nothing): `ucstage shard-plan SOURCE --unit row-group` shows them,
and `ucstage export --row-group-rows N` makes more.

Needs torch (and deltalake for a Delta table).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

from ucstage import DataLoader, TableDataset


def features(ids: torch.Tensor) -> torch.Tensor:
    """One-hot of ``id % 3``: what the demo's label depends on."""
    return nn.functional.one_hot(ids % 3, 3).float()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a Delta table (catalog.schema.table or a path) "
                                       "or a folder of Parquet files")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-rows", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2)
    args = parser.parse_args()

    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0

    table = TableDataset(args.source, columns=["id", "label"], batch_rows=args.batch_rows,
                         format="torch", shuffle=True, seed=0, equal_length="drop")
    loader = DataLoader(table, batch_size=None, num_workers=args.num_workers)
    model = nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for epoch in range(args.epochs):
        table.set_epoch(epoch)
        rows, total = 0, 0.0
        for batch in loader:
            logits = model(features(batch["id"]))
            loss = nn.functional.cross_entropy(logits, batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows += len(batch["id"])
            total += loss.item() * len(batch["id"])
        print(f"rank {rank} epoch {epoch}: {rows} rows, mean loss {total / max(rows, 1):.3f}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
