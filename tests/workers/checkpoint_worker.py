"""A torchrun worker for tests/checkpoint/test_checkpoint_torchrun.py.

    torchrun --nproc_per_node=2 checkpoint_worker.py save SOURCE DEST OUT K
    torchrun --nproc_per_node=2 checkpoint_worker.py save-then-stall SOURCE PARENT OUT K
    torchrun --nproc_per_node=1 checkpoint_worker.py load SOURCE DEST OUT

``save``: every rank trains K batches (DDP, Adam) over a shuffled
VolumeDataset, then ``dcp.async_save``s the model, the optimizer, a
row-sharded DTensor and the loader's gathered state into DEST with
ucstage's Writer, and trains 3 more steps while it uploads; rank 0 writes
OUT/expected.pt (what was saved) and each rank OUT/rank<r>.json (the items
delivered). DEST and PARENT may be object-store URLs (``s3://...``).
``save-then-stall``: saves PARENT/step-1 whole, then PARENT/step-2
with rank 1's upload stalled halfway: it writes OUT/stalled (its pid) and
sleeps for the test to kill it. ``load``: one rank loads DEST (resharded),
writes OUT/loaded.pt and finishes the epoch from the loaded loader state,
writing OUT/load.json with the items and the audit.
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
from torch.distributed.tensor import Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.resume import Decode
from ucstage import DataLoader, VolumeDataset
from ucstage.checkpoint import Reader, Writer
from ucstage.checkpoint.upload import Destination, FolderDestination, Landed, ObjectDestination
from ucstage.engines import objput

EMB = (1000, 256)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))


def full_emb() -> torch.Tensor:
    return torch.arange(EMB[0] * EMB[1], dtype=torch.float32).reshape(EMB) / 7


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


def train_and_state(source: str, k: int) -> tuple[nn.Module, torch.optim.Optimizer,
                                                  dict[str, Any], list[str], Any]:
    rank = dist.get_rank()
    net = nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    paths = VolumeDataset(source, shuffle=True, seed=0, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=1)
    it = iter(loader)
    items: list[str] = []
    for i in range(k):
        items += next(it)
        step(net, opt, 100 * rank + i)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    emb = distribute_tensor(full_emb(), mesh, [Shard(0)])
    model_sd, optim_sd = get_state_dict(net, opt)
    state = {"model": model_sd, "optim": optim_sd, "emb": emb,
             "loader": json.dumps(loader.state_dict(gather=True)), "step": k}
    return net, opt, state, items, it


def save(source: str, dest: str, out: str, k: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net, opt, state, items, _it = train_and_state(source, k)
    if rank == 0:
        torch.save({"model": copy.deepcopy(state["model"]), "optim": copy.deepcopy(state["optim"]),
                    "emb": full_emb()}, os.path.join(out, "expected.pt"))
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


def load(source: str, dest: str, out: str) -> None:
    dist.init_process_group("gloo")
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    model_sd, optim_sd = get_state_dict(net, opt)
    state = {"model": model_sd, "optim": optim_sd, "emb": torch.zeros(EMB), "loader": "",
             "step": 0}
    dcp.load(state, storage_reader=Reader(dest))
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.save({"model": state["model"], "optim": state["optim"], "emb": state["emb"],
                "step": state["step"], "net": net.state_dict()}, os.path.join(out, "loaded.pt"))
    paths = VolumeDataset(source, shuffle=True, seed=0, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=1)
    loader.load_state_dict(json.loads(state["loader"]))
    items: list[str] = []
    for batch in loader:
        items += batch
    audits = [dict(vars(a), coverage_ok=a.coverage_ok) for a in loader.audits]
    with open(os.path.join(out, "load.json"), "w") as fh:
        json.dump({"items": items, "audits": audits}, fh)
    dist.destroy_process_group()


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "save":
        save(args[0], args[1], args[2], int(args[3]))
    elif mode == "save-then-stall":
        save_then_stall(args[0], args[1], args[2], int(args[3]))
    elif mode == "load":
        load(args[0], args[1], args[2])
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
