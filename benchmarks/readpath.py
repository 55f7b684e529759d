"""The read path of one item: which ucstage functions the first item of an epoch runs.

    python -m benchmarks.readpath [--files 8] [--verbose] [--json]

A ``VolumeDataset`` over a local folder (``read_ahead=0``, iterated in this
process: ``num_workers=0``) gives its first item twice, each traced with
``sys.setprofile``: on a *miss* (``iter(ds)`` and ``next()`` of the first
epoch, which copies the file into the cache) and on a *hit* (the same in the
next epoch, the file now cached). For each it counts the distinct ucstage
functions called (by module and qualified name), the modules they live in,
and the calls to functions named ``lookup*``. Nothing is timed: the counts
are the fan-out of one read, which docs/design.md names module by module
("The read path of one item") and tests/data/test_read_path.py bounds.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from benchmarks.report import Report, benchmark_name, json_argument, params_of


@dataclass(frozen=True)
class Trace:
    """What one traced call ran of ucstage."""

    functions: frozenset[tuple[str, str]]
    """(module, qualified name) of each distinct function called."""
    lookups: int
    """Calls to functions named ``lookup*``."""

    @property
    def modules(self) -> dict[str, int]:
        """Functions called per module."""
        return dict(sorted(collections.Counter(m for m, _ in self.functions).items()))

    def summary(self) -> dict[str, Any]:
        return {"functions": len(self.functions), "modules": len(self.modules),
                "lookups": self.lookups, "per_module": self.modules}


def trace(call: Callable[[], Any]) -> tuple[Any, Trace]:
    """``call()``'s result, and the ucstage functions it ran."""
    seen: set[tuple[str, str]] = set()
    lookups = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal lookups
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module == "ucstage" or module.startswith("ucstage."):
            code = frame.f_code
            seen.add((module, getattr(code, "co_qualname", code.co_name)))
            if code.co_name.startswith("lookup"):
                lookups += 1

    sys.setprofile(profile)
    try:
        out = call()
    finally:
        sys.setprofile(None)
    return out, Trace(frozenset(seen), lookups)


def first_items(folder: str, files: int = 8) -> dict[str, Trace]:
    """Trace the first item of a miss epoch and of the hit epoch after it,
    over ``files`` files of 4 KiB written under ``folder``."""
    from ucstage import VolumeDataset

    src = os.path.join(folder, "src")
    os.makedirs(src)
    for i in range(files):
        with open(os.path.join(src, f"f{i}.bin"), "wb") as fh:
            fh.write(os.urandom(4096))
    ds = VolumeDataset(src, cache_dir=os.path.join(folder, "cache"), read_ahead=0)
    ds.freeze()
    found: dict[str, Trace] = {}
    for name in ("miss", "hit"):
        it: Iterator[Any] | None = None

        def first() -> Any:
            nonlocal it
            it = iter(ds)
            return next(it)

        _, found[name] = trace(first)
        assert it is not None
        for _ in it:  # the rest of the epoch: the next one is all hits
            pass
        ds.set_epoch(0)
    return found


def markdown(traces: dict[str, Trace], verbose: bool) -> str:
    lines = []
    for name, t in traces.items():
        lines.append(f"{name}: {len(t.functions)} functions in {len(t.modules)} modules, "
                     f"{t.lookups} lookup* calls")
        for module, count in t.modules.items():
            lines.append(f"  {count:3d} {module}")
            if verbose:
                lines.extend(f"        {q}" for m, q in sorted(t.functions) if m == module)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.readpath",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--files", type=int, default=8, help="files in the source folder")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="list the functions of each path")
    json_argument(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ucstage-readpath-") as folder:
        traces = first_items(folder, args.files)
    rows = [{"name": name, **t.summary(),
             **({"calls": sorted(f"{m}.{q}" for m, q in t.functions)} if args.verbose else {})}
            for name, t in traces.items()]
    summary = {f"{name}_{what}": t.summary()[what] for name, t in traces.items()
               for what in ("functions", "modules")}
    Report(benchmark_name(__file__), params_of(args), rows, summary).emit(
        args.json, markdown(traces, args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
