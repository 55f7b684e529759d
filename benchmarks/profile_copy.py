#!/usr/bin/env python
"""Profile ucstage's per-file copy work from a local folder (or a FUSE mount).

Copies FILES files one at a time through ``Fetcher.fetch_retrying`` (the
call each of ``cache warm``'s threads makes per file) into a fresh cache,
under cProfile, and prints the user and system CPU per file and the top of
the profile. Run it under ``strace -f -c`` (or ``-T``) to count and time the
system calls per file.

    python -m benchmarks.profile_copy --files 2000 --size-kib 4 [--json]
    python -m benchmarks.profile_copy --source /path/to/mounted/folder

It calls a private method, so it profiles the tree it runs in; it is not for
benchmarks.ab_compare.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import resource
import shutil
import sys
import tempfile

from benchmarks.files import write_files
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from ucstage import LocalCache
from ucstage.cache.inflight import Inflight
from ucstage.cache.space import Evicted
from ucstage.volumes import list_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=4)
    parser.add_argument("--source", default=None, help="copy this folder instead of new files")
    parser.add_argument("--top", type=int, default=25)
    json_argument(parser)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ucstage-profile-copy-")
    try:
        source = args.source
        if source is None:
            source = os.path.join(work, "source")
            write_files(source, args.files, args.size_kib * 1024, vary=False)
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
        user_us = (after.ru_utime - before.ru_utime) / n * 1e6
        sys_us = (after.ru_stime - before.ru_stime) / n * 1e6
        stats = io.StringIO()
        pstats.Stats(profile, stream=stats).sort_stats("tottime").print_stats(args.top)
        text = (f"{n} files: user {user_us:.0f} µs, system {sys_us:.0f} µs per file "
                f"(under cProfile)\n{stats.getvalue()}")
        Report(benchmark_name(__file__), params_of(args), [],
               {"files": n, "user_us_per_file": user_us, "sys_us_per_file": sys_us}).emit(
            args.json, text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
