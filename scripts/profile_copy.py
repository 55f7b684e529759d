#!/usr/bin/env python
"""Profile ucstage's per-file copy work from a local folder (or a FUSE mount).

Copies FILES files one at a time through ``Fetcher.fetch_retrying`` (the
call each of ``cache warm``'s threads makes per file) into a fresh cache,
under cProfile, and prints the user and system CPU per file and the top of
the profile. Run it under ``strace -f -c`` (or ``-T``) to count and time the
system calls per file.

    .venv/bin/python scripts/profile_copy.py --files 2000 --size-kib 4
    .venv/bin/python scripts/profile_copy.py --source /path/to/mounted/folder
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import shutil
import sys
import tempfile

from ucstage import LocalCache, list_files
from ucstage.cache.inflight import Inflight
from ucstage.cache.space import Evicted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=4)
    parser.add_argument("--source", default=None, help="copy this folder instead of new files")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="ucstage-profile-copy-")
    try:
        source = args.source
        if source is None:
            source = os.path.join(work, "source")
            payload = os.urandom(args.size_kib * 1024)
            for i in range(args.files):
                folder = os.path.join(source, f"part{i % 8}")
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, f"f{i:05d}.bin"), "wb") as fh:
                    fh.write(payload)
        listing = list_files(source)
        cache = LocalCache(os.path.join(work, "cache"))
        cache.prepare(listing.volume)
        inflight, evicted = Inflight(), Evicted()
        profile = cProfile.Profile()
        before = resource.getrusage(resource.RUSAGE_SELF)
        profile.enable()
        for entry in listing.entries:
            cache._fetcher.fetch_retrying(listing.volume, entry, inflight, evicted)
        profile.disable()
        after = resource.getrusage(resource.RUSAGE_SELF)
        n = len(listing.entries)
        print(f"{n} files: user {(after.ru_utime - before.ru_utime) / n * 1e6:.0f} µs, "
              f"system {(after.ru_stime - before.ru_stime) / n * 1e6:.0f} µs per file "
              "(under cProfile)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
