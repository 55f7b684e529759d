"""Checkpoint every N steps, get killed, resume on another number of GPUs.

The loader's state goes into the checkpoint with the model's. It is small
JSON data (no file list): per slot, how many files the training loop has
been handed. ``state_dict(gather=True)`` merges every rank's state, so one
checkpoint written by rank 0 resumes on any layout: relaunched with another
``--nproc-per-node`` (or ``--num-workers``), the files the interrupted epoch
had not delivered yet are re-split over the new ranks, and each file of the
epoch is delivered once across the interruption.

    python docs/examples/train_resume.py --make-sample /tmp/texts          # 203 small files
    torchrun --nproc-per-node=2 docs/examples/train_resume.py /tmp/texts --ckpt /tmp/ckpt \\
        --save-every 5 --kill-after 5            # dies (SIGKILL) right after step 5's save
    torchrun --nproc-per-node=3 docs/examples/train_resume.py /tmp/texts --ckpt /tmp/ckpt \\
        --num-workers 1                          # finishes epoch 0 on 3 ranks, then epoch 1

Rank 0 prints one JSON line per epoch (batches, and the exactly-once audit:
files delivered, duplicates, gaps, files delivered before the restart).
Needs torch only; any folder of files will do.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import IterableDataset

from ucstage import DataLoader, VolumeDataset


class Bytes(IterableDataset):  # type: ignore[type-arg]
    """The decoding wrapper: one sample per path (a resumable loader needs one
    item per file, pulling the next path only when asked for the next item)."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[torch.Tensor]:
        for path in self.paths:
            with open(path, "rb") as fh:
                data = fh.read(64).ljust(64, b"\0")
            yield torch.frombuffer(bytearray(data), dtype=torch.uint8).float() / 255


def make_sample(folder: str, count: int = 203) -> None:
    for i in range(count):
        path = os.path.join(folder, f"part{i % 4}", f"doc{i:04d}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"document {i}: " + "lorem ipsum " * (i % 7 + 1))


def save(path: str, checkpoint: dict[str, Any]) -> None:
    """Write the checkpoint all-or-nothing: a kill mid-write keeps the old one."""
    tmp = f"{path}.tmp"
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def train(args: argparse.Namespace) -> None:
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    net: nn.Module = nn.Linear(64, 1)
    if distributed:
        net = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    # equal_length="pad": every rank gets the same number of batches, also in
    # a resumed epoch, so DDP never waits for a rank with one more.
    paths = VolumeDataset(args.source, shuffle=True, seed=0, equal_length="pad")
    loader = DataLoader(Bytes(paths), batch_size=args.batch_size,
                        num_workers=args.num_workers)
    ckpt = os.path.join(args.ckpt, "checkpoint.pt")
    step = 0
    if os.path.exists(ckpt):
        checkpoint = torch.load(ckpt, weights_only=False)
        net.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])  # sets paths.epoch too
        step = checkpoint["step"]
        if rank == 0:
            print(f"resumed at step {step}, epoch {paths.epoch}", file=sys.stderr)
    for epoch in range(paths.epoch, args.epochs):
        paths.set_epoch(epoch)
        batches = 0
        for x in loader:
            optimizer.zero_grad()
            loss = (net(x).squeeze(1) - x.mean(dim=1)).pow(2).mean()
            loss.backward()
            optimizer.step()
            step += 1
            batches += 1
            if step % args.save_every == 0:
                # A collective: every rank calls it; rank 0 writes the checkpoint.
                state = loader.state_dict(gather=True)
                if rank == 0:
                    os.makedirs(args.ckpt, exist_ok=True)
                    save(ckpt, {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                                "loader": state, "step": step})
                if distributed:
                    dist.barrier()  # the checkpoint is on disk before anyone goes on
            if step == args.kill_after:
                os.kill(os.getpid(), signal.SIGKILL)  # a preemption, right after the save
        if rank == 0:
            audit = loader.audits[-1] if loader.audits else None
            print(json.dumps({"epoch": epoch, "batches": batches,
                              "audit": None if audit is None else
                              dict(vars(audit), coverage_ok=audit.coverage_ok)}), flush=True)
    if distributed:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="folder, /Volumes/... path, URL or manifest")
    parser.add_argument("--ckpt", default="/tmp/ucstage-ckpt", help="checkpoint folder")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--kill-after", type=int, default=0,
                        help="kill this process after that many steps (a preemption)")
    parser.add_argument("--make-sample", metavar="DIR", help="write sample files to DIR and exit")
    args = parser.parse_args()
    if args.make_sample:
        make_sample(args.make_sample)
        print(f"wrote sample files to {args.make_sample}", file=sys.stderr)
        return 0
    if not args.source:
        parser.error("give a SOURCE (or --make-sample DIR)")
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
