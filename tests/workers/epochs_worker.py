"""A torchrun worker for tests/data/test_node_scope_s3.py: one "node" of a
multi-node job, reading SOURCE shuffled for several epochs.

    torchrun --nnodes=2 --node-rank=N --nproc-per-node=2 ... \\
        tests/workers/epochs_worker.py SOURCE OUT SCOPE EPOCHS

Each rank writes OUT/rank<r>.json: the relative paths it read in each epoch.
``nproc_per_node`` is not passed: VolumeDataset takes it from $LOCAL_WORLD_SIZE,
which torchrun sets, as it does in training.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from ucstage import DataLoader, VolumeDataset


def main() -> int:
    source, out, scope, epochs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = VolumeDataset(source, shuffle=True, seed=11, shuffle_scope=scope)
    loader = DataLoader(ds, batch_size=None, num_workers=1)
    read: list[list[str]] = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        root = ds.cache().namespace_dir(ds.freeze().volume())
        read.append([os.path.relpath(p, root) for p in loader])
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump({"rank": rank, "node": int(os.environ["GROUP_RANK"]),
                   "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]), "epochs": read}, fh)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
