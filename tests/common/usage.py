"""Sampling a cache's usage from another process while a job runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.common.parts import REPO

_SAMPLER = r"""
import json, os, sys, time
from ucstage.cache import LocalCache
root, stop, out = sys.argv[1:4]
space = LocalCache(root).space
peak = samples = 0
while not os.path.exists(stop):
    # Under the ledger lock (renames happen under it): every byte on disk,
    # copies in flight included, counted once.
    found = space.tally(space.namespace_dirs())
    peak = max(peak, found.bytes + found.partial_bytes)
    samples += 1
    time.sleep(0.002)
with open(out, "w") as fh:
    json.dump({"peak": peak, "samples": samples}, fh)
"""


class Usage:
    """What the sampler saw: the peak bytes on disk and how many samples it took."""

    peak = 0
    samples = 0


@contextmanager
def sampled_usage(root: str, scratch: str) -> Iterator[Usage]:
    """Sample the bytes under the cache ``root`` from another process for the
    duration of the block; the result is filled in when the block ends."""
    stop, out = os.path.join(scratch, "stop-sampling"), os.path.join(scratch, "usage.json")
    proc = subprocess.Popen([sys.executable, "-c", _SAMPLER, root, stop, out],
                            env=dict(os.environ, PYTHONPATH=REPO))
    result = Usage()
    try:
        yield result
    finally:
        with open(stop, "w"):
            pass
        proc.wait(60)
    deadline = time.monotonic() + 10
    while not os.path.exists(out):
        assert time.monotonic() < deadline, "the usage sampler wrote nothing"
        time.sleep(0.01)
    with open(out, encoding="utf-8") as fh:
        found = json.load(fh)
    result.peak, result.samples = found["peak"], found["samples"]
