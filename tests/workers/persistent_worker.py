"""A training script over a persistent ucstage DataLoader (6 workers), for
tests/data/test_persistent_cleanup.py: how it ends, and what it leaves.

    python tests/workers/persistent_worker.py SOURCE CACHE MODE

``del``: two epochs run whole, a third is given up after 3 batches (a
``break``), then ``del loader``; prints ``LEFT {json}``: the worker processes
still running, this process's other children, the Python threads started
since before the loader, and whether the epoch record's folder is still
there, each as soon as all are gone (or after 120 s: a bound that only stops
a hang, since processes end slowly on a loaded machine); exits 0.

``sigint``: epochs until Ctrl-C; prints ``READY {json}`` (this process's
children, the epoch record's folder) once the second epoch is under way; on
``KeyboardInterrupt`` stops the loader's workers, prints one line saying
where it stopped and how the workers ended, and exits 130, as a training
script's ``except KeyboardInterrupt`` would.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from typing import Any

from tests.common.parts import pid_alive
from ucstage import DataLoader, VolumeDataset

WORKERS = 6


def _keep(batch: list[str]) -> list[str]:
    return batch


def children(pid: int) -> list[int]:
    """This process's live children (every thread's), from /proc."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found += [int(p) for p in fh.read().split()]
        except FileNotFoundError:
            pass
    return sorted(p for p in set(found) if pid_alive(p))


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except FileNotFoundError:
        return ""


def worker_pids(loader: DataLoader) -> list[int]:
    return [w.pid for w in loader._iterator._workers]  # type: ignore[union-attr]


def main() -> int:
    source, cache, mode = sys.argv[1:4]
    # A capped cache: only then are the paths a reader hands out held (cache/leases.py).
    ds = VolumeDataset(source, cache_dir=cache, shuffle=True, seed=3, read_ahead=16,
                       max_bytes=64 << 20)
    ds.freeze()  # the listing: its process-wide request pool (objstore.py) is not the loader's
    threads = set(threading.enumerate())
    loader = DataLoader(ds, batch_size=4, num_workers=WORKERS, collate_fn=_keep)
    assert loader.persistent_workers
    epoch, batches = 0, 0
    if mode == "del":
        for epoch in range(2):
            ds.set_epoch(epoch)
            for _ in loader:
                pass
        ds.set_epoch(2)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        pids, folder = worker_pids(loader), loader._channel.folder
        del loader
        gc.collect()
        deadline = time.monotonic() + 120

        def left() -> dict[str, Any]:
            others = [p for p in children(os.getpid()) if p not in pids]
            return {"workers": [p for p in pids if pid_alive(p)],
                    "children": {str(p): cmdline(p) for p in others},
                    "threads": sorted(t.name for t in set(threading.enumerate()) - threads),
                    "record_folder": bool(folder and os.path.exists(folder))}

        while time.monotonic() < deadline:
            now = left()
            if not (now["workers"] or now["threads"] or now["record_folder"]):
                break
            time.sleep(0.02)
        print("LEFT " + json.dumps(left()), flush=True)
        return 0
    try:
        while True:
            ds.set_epoch(epoch)
            for batches, _ in enumerate(loader, 1):
                if epoch == 1 and batches == 3:
                    print("READY " + json.dumps(
                        {"pid": os.getpid(), "workers": worker_pids(loader),
                         "children": children(os.getpid()),
                         "record_folder": loader._channel.folder}), flush=True)
                time.sleep(0.005)  # the model's step
            epoch += 1
    except KeyboardInterrupt:
        # What torch does when the loader is collected at exit, done here to
        # say how it went: each worker's exit code (0: it ended by itself; a
        # worker torch had to terminate after its 5 s join shows -15).
        start = time.monotonic()
        workers = loader._iterator._workers  # type: ignore[union-attr]
        loader._iterator._shutdown_workers()  # type: ignore[union-attr]
        codes = [w.exitcode for w in workers]
        print(f"interrupted in epoch {epoch} after {batches} batches; stopped "
              f"{len(workers)} workers in {time.monotonic() - start:.2f} s, exit codes "
              f"{json.dumps(codes)}", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
