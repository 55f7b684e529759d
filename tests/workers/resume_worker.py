"""A torchrun worker for tests/data/test_resume_torchrun.py; writes OUT/rank<r>.json.

    torchrun --nproc_per_node=2 resume_worker.py first SOURCE OUT K
    torchrun --nproc_per_node=N resume_worker.py resume SOURCE OUT STATE WORKERS
    torchrun --nproc_per_node=2 resume_worker.py refuse SOURCE OUT STATE

``first``: 2 workers per rank, batch 4, shuffled; stops after K batches and
saves its own state and the gathered (global) one. ``resume``: loads the
global state on another layout and finishes the epoch, then runs the next.
``refuse``: rank 1 has another seed, so the resume must fail on both ranks;
then an epoch where rank 1 stops reading without closing its iterator, so the
audit of rank 0 must time out and move on.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.resume import Decode
from ucstage import DataLoader, VolumeDataset
from ucstage.errors import ResumeMismatch


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def audits(loader: DataLoader) -> list[dict[str, Any]]:
    return [dict(vars(a), coverage_ok=a.coverage_ok) for a in loader.audits]


def first(source: str, k: int) -> dict[str, Any]:
    paths = VolumeDataset(source, shuffle=True, seed=3, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=2)
    items: list[str] = []
    iterator = iter(loader)
    for _ in range(k):
        items += next(iterator)
    state, merged = loader.state_dict(), loader.state_dict(gather=True)
    del iterator  # leaves the epoch early: the audit is skipped, with a warning
    return {"items": items, "state": state, "merged": merged, "audits": audits(loader)}


def resume(source: str, state_file: str, workers: int) -> dict[str, Any]:
    with open(state_file, encoding="utf-8") as fh:
        state = json.load(fh)
    paths = VolumeDataset(source, shuffle=True, seed=3, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=workers)
    loader.load_state_dict(state)
    result: dict[str, Any] = {"epochs": {}}
    for epoch in range(paths.epoch, paths.epoch + 2):
        paths.set_epoch(epoch)
        items: list[str] = []
        for batch in loader:
            items += batch
        result["epochs"][str(epoch)] = items
    result["audits"] = audits(loader)
    return result


def refuse(source: str, out: str, state_file: str) -> dict[str, Any]:
    with open(state_file, encoding="utf-8") as fh:
        state = json.load(fh)
    rank = dist.get_rank()
    result: dict[str, Any] = {}
    paths = VolumeDataset(source, shuffle=True, seed=3 if rank == 0 else 4, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=2)
    loader.load_state_dict(state)
    try:
        next(iter(loader))
    except ResumeMismatch as exc:
        result["refused"] = str(exc)
    # Rank 1 stops reading and keeps its iterator open: rank 0's audit waits
    # audit_timeout seconds, warns and goes on.
    paths = VolumeDataset(source, read_ahead=1)
    loader = DataLoader(Decode(paths), batch_size=4, num_workers=1, audit_timeout=3)
    iterator = iter(loader)
    next(iterator)
    audited = os.path.join(out, "rank0-audited")
    if rank == 0:
        result["rest"] = sum(1 for _ in iterator)  # ends after the audit gave up
        open(audited, "w").close()
    else:
        deadline = time.monotonic() + 120
        while not os.path.exists(audited):  # the iterator stays open until then
            assert time.monotonic() < deadline, "rank 0 never finished its epoch"
            time.sleep(0.05)
    result["audits"] = audits(loader)
    return result


def main() -> int:
    mode, source, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    caught = Warnings()
    logging.getLogger("ucstage").addHandler(caught)
    if mode == "first":
        result = first(source, int(sys.argv[4]))
    elif mode == "resume":
        result = resume(source, sys.argv[4], int(sys.argv[5]))
    else:
        result = refuse(source, out, sys.argv[4])
    result["warnings"] = caught.messages
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
