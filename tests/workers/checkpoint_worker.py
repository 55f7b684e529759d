"""A torchrun worker for the checkpoint tests (tests/checkpoint/).

    torchrun --nproc_per_node=2 checkpoint_worker.py save SOURCE DEST OUT K [ROWS]
    torchrun --nproc_per_node=2 checkpoint_worker.py save-then-stall SOURCE PARENT OUT K
    torchrun --nproc_per_node=1 checkpoint_worker.py load SOURCE DEST OUT [ROWS]

``save``: every rank trains K batches (DDP, Adam) over a shuffled
VolumeDataset, then ``dcp.async_save``s the model, the optimizer, a
row-sharded DTensor of ROWS x 1024 float32 (``big``: 4 KiB a row) and the
loader's gathered state into DEST with ucstage's Writer, and trains 3 more
steps while it uploads; rank 0 writes OUT/expected.pt (the model and
optimizer saved) and each rank OUT/rank<r>.json (the items delivered). DEST
and PARENT may be object-store URLs (``s3://...``).
``save-then-stall``: saves PARENT/step-1 whole, then PARENT/step-2
with rank 1's upload stalled halfway: it writes OUT/stalled (its pid) and
sleeps for the test to kill it. ``load``: one rank loads DEST (resharded),
writes OUT/loaded.pt and finishes the epoch from the loaded loader state,
writing OUT/load.json with the items, the audit and which blocks of ``big``
differ from what the save generated.

``big`` is made of blocks of :data:`BLOCK` rows, each generated from its
own seed, so a rank makes only its own rows and the load compares what it
read with the blocks made again: no copy of a checkpoint of hundreds of MB
is written for the test to compare with.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.resume import Decode
from ucstage import DataLoader, VolumeDataset
from ucstage.checkpoint import Reader, Writer
from ucstage.checkpoint.upload import Destination, FolderDestination, Landed, ObjectDestination
from ucstage.engines import objput

COLS = 1024
BLOCK = 256
"""Rows of ``big`` generated from one seed (1 MiB)."""
SMALL_ROWS = 2 * BLOCK
"""``big``'s rows when no ROWS is given (2 MiB): the kill -9 tests."""


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))


def big_rows(first_block: int, blocks: int) -> torch.Tensor:
    """Blocks ``first_block`` .. ``first_block + blocks - 1`` of ``big``, as the save made them."""
    out = torch.empty(blocks * BLOCK, COLS)
    for i in range(blocks):
        g = torch.Generator().manual_seed(10_000 + first_block + i)
        torch.randn(BLOCK, COLS, generator=g, out=out[i * BLOCK:(i + 1) * BLOCK])
    return out


def step(net: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 256, generator=g)
    opt.zero_grad()
    net(x).pow(2).mean().backward()
    opt.step()


class Stalled(FolderDestination):
    """Writes half of each file, says so, and waits to be killed."""

    def __init__(self, root: str, out: str) -> None:
        super().__init__(root)
        self.out = out

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        with open(local_path, "rb") as src, open(os.path.join(self.root, name), "wb") as dst:
            data = src.read()
            dst.write(data[:len(data) // 2])
            dst.flush()
        with open(os.path.join(self.out, "stalled"), "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(120)
        raise AssertionError("not killed")


class StalledObject(ObjectDestination):
    """PUTs half of each file to its key, says so, and waits to be killed."""

    def __init__(self, dest: ObjectDestination, out: str) -> None:
        super().__init__(dest.at)
        self.out = out

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        with open(local_path, "rb") as src:
            data = src.read()
        objput.put_bytes(self.at.kind, self.at.bucket, self.at._at(name), data[:len(data) // 2])
        with open(os.path.join(self.out, "stalled"), "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(120)
        raise AssertionError("not killed")


class StallingWriter(Writer):
    def __init__(self, path: str, out: str, **kw: Any) -> None:
        super().__init__(path, **kw)
        self.out = out

    def destination(self) -> Destination:
        dest = super().destination()
        if self.rank == 1:
            if isinstance(dest, ObjectDestination):
                return StalledObject(dest, self.out)
            return Stalled(self.checkpoint_id, self.out)
        return dest


def train_and_state(source: str, k: int, rows: int = SMALL_ROWS) -> tuple[
        nn.Module, torch.optim.Optimizer, dict[str, Any], list[str], Any]:
    rank, world = dist.get_rank(), dist.get_world_size()
    net = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    paths = VolumeDataset(source, shuffle=True, seed=0, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=1)
    it = iter(loader)
    items: list[str] = []
    for i in range(k):
        items += next(it)
        step(net, opt, 100 * rank + i)
    mesh = init_device_mesh("cpu", (world,))
    blocks = rows // BLOCK // world  # each rank makes only its own rows
    big = DTensor.from_local(big_rows(rank * blocks, blocks), mesh, [Shard(0)], run_check=False)
    model_sd, optim_sd = get_state_dict(net, opt)
    state = {"model": model_sd, "optim": optim_sd, "big": big,
             "loader": json.dumps(loader.state_dict(gather=True)), "step": k}
    return net, opt, state, items, it


def save(source: str, dest: str, out: str, k: int, rows: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net, opt, state, items, _it = train_and_state(source, k, rows)
    if rank == 0:
        torch.save({"model": copy.deepcopy(state["model"]),
                    "optim": copy.deepcopy(state["optim"])}, os.path.join(out, "expected.pt"))
    ckpt_group = dist.new_group(backend="gloo")  # the save's collectives, apart from DDP's
    fut = dcp.async_save(state, storage_writer=Writer(dest), process_group=ckpt_group)
    for i in range(3):  # training goes on while the save uploads
        step(net, opt, 1000 + i)
    fut.result()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"items": items}, fh)
    dist.barrier()
    dist.destroy_process_group()


def save_then_stall(source: str, parent: str, out: str, k: int) -> None:
    dist.init_process_group("gloo")
    _, _, state, _, _it = train_and_state(source, k)
    dcp.save(state, storage_writer=Writer(f"{parent}/step-1"))
    dist.barrier()
    dcp.save(state, storage_writer=StallingWriter(f"{parent}/step-2", out))
    raise AssertionError("step-2 was saved: rank 1 should have been killed")


def load(source: str, dest: str, out: str, rows: int) -> None:
    dist.init_process_group("gloo")
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    model_sd, optim_sd = get_state_dict(net, opt)
    state = {"model": model_sd, "optim": optim_sd, "big": torch.zeros(rows, COLS), "loader": "",
             "step": 0}
    dcp.load(state, storage_reader=Reader(dest))
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.save({"model": state["model"], "optim": state["optim"], "step": state["step"],
                "net": net.state_dict()}, os.path.join(out, "loaded.pt"))
    # Compared block by block with the blocks made again (one block in memory at a time).
    big = state.pop("big")
    blocks = rows // BLOCK
    differ = [b for b in range(blocks)
              if not torch.equal(big[b * BLOCK:(b + 1) * BLOCK], big_rows(b, 1))]
    del big
    paths = VolumeDataset(source, shuffle=True, seed=0, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=1)
    loader.load_state_dict(json.loads(state["loader"]))
    items: list[str] = []
    for batch in loader:
        items += batch
    audits = [dict(vars(a), coverage_ok=a.coverage_ok) for a in loader.audits]
    with open(os.path.join(out, "load.json"), "w") as fh:
        json.dump({"items": items, "audits": audits,
                   "big": {"blocks": blocks, "differ": differ}}, fh)
    dist.destroy_process_group()


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "save":
        save(args[0], args[1], args[2], int(args[3]), int(args[4]) if args[4:] else SMALL_ROWS)
    elif mode == "save-then-stall":
        save_then_stall(args[0], args[1], args[2], int(args[3]))
    elif mode == "load":
        load(args[0], args[1], args[2], int(args[3]) if args[3:] else SMALL_ROWS)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
