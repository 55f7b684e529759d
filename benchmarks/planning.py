"""Planning at scale: freezing, one slot, resuming, shuffle scopes, grouped samples.

Beside benchmarks/shard_plan.py's step-by-step plan of 1M files.

    python -m benchmarks.planning VARIANT [OPTIONS] [--json]

Variants:

* ``manifest``: a 1M-file manifest: one slot, a whole plan and freezing, each
  a fresh process (``--slot-only``: one slot from the shell);
* ``resume``: the re-split of a saved epoch, the state's size, the audit's cost;
* ``shuffle_scope``: node against global shuffle scope, the forecast and planning;
* ``grouped``: grouped samples against the same files ungrouped (``warm`` or ``plan``).

``python -m benchmarks.planning VARIANT --help`` describes each in full.
ucstage is imported inside the functions that use it (before anything is
timed), so a commit that lacks one variant's names still runs the others.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from benchmarks.files import write_files
from benchmarks.pairs import Comparison, alternate, pairs_argument
from benchmarks.report import Report, json_argument, params_of, suite
from benchmarks.timing import median_seconds as timed
from benchmarks.timing import run_command, time_call

SUITE = "planning"


# --- manifest -----------------------------------------------------------------

WORKER = """
import resource, sys, time
t = time.perf_counter()
from ucstage.manifest import load
from ucstage.sharding import Layout, ReadOrder, Slot, slot_array
m = load(sys.argv[1], verify=False, expect_fingerprint=sys.argv[2])
rows = m.take(slot_array(ReadOrder(len(m), shuffle=True), Layout(128, 8), Slot(5, 3)))
print(len(rows), time.perf_counter() - t)
"""

FREEZE = """
import sys, time
from ucstage.manifest import Manifest, fingerprint, save
from ucstage.volumes import FileEntry
n = int(sys.argv[1])
entries = [FileEntry(f"d{i % 1000}/f{i:08d}.jpg", 1000 + i % 5000, f"{1764403200 + i}.0")
           for i in range(n)]
t = time.perf_counter()
save(Manifest("/bench", entries, fingerprint(entries)), sys.argv[2])
print(time.perf_counter() - t)
"""


def _process(cmd: list[str]) -> tuple[float, float, str]:
    """Wall time, peak RSS (MiB) of this one child, its last stdout line."""
    done = run_command(cmd)
    return done.timing.wall_s, done.timing.peak_rss_mib, done.last_line


def _rss_anon_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def sampled(cmd: list[str]) -> dict[str, float]:
    """One fresh run of ``cmd``: wall and CPU seconds, peak RSS and peak
    RssAnon (MiB; sampled every millisecond by a thread while this one waits)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon_kib(proc.pid))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
    return {"seconds": wall, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": usage.ru_maxrss / 1024, "peak_rss_anon_mib": peak[0] / 1024,
            "exit_code": proc.returncode}


def median_run(cmd: list[str], repeat: int) -> dict[str, float]:
    """The median of each figure over ``repeat`` fresh runs of ``cmd``."""
    runs = [sampled(cmd) for _ in range(repeat)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def manifest_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/ucstage-bench-manifest")
    ap.add_argument("--repeat", type=int, default=1,
                    help="fresh runs per shard-plan figure (the median is reported)")
    ap.add_argument("--slot-only", action="store_true",
                    help="only `shard-plan ARROW -w 128 -k 8 --slot 5:3` (the manifest is "
                         "written if missing)")
    json_argument(ap)


def run_manifest(a: argparse.Namespace) -> int:
    """A 1M-file manifest: one slot, a whole plan, freezing (issue 15's targets).

        python -m benchmarks.planning manifest [--files 1000000] [--dir /tmp/ucstage-bench-manifest] [--json]
        python -m benchmarks.planning manifest --slot-only --repeat 5   # issue 21: one slot from the shell

    Each figure is one fresh subprocess (time, CPU and peak RSS of the whole
    process, from its rusage; peak RssAnon, the process's own memory without the
    shared mapped manifest and libraries, sampled from /proc/PID/status every
    millisecond); the listing is synthetic (no files are created). ``--repeat``
    runs each shard-plan figure that many times and reports the median.
    """
    os.makedirs(a.dir, exist_ok=True)
    arrow = os.path.join(a.dir, "m.manifest.arrow")
    js = os.path.join(a.dir, "m.manifest.json")
    py = sys.executable
    rows: list[dict[str, Any]] = []
    lines: list[str] = []

    def record(name: str, wall: float, peak: float, text: str, **more: Any) -> None:
        rows.append({"name": name, "seconds": wall, "peak_rss_mib": peak, **more})
        lines.append(text)

    def shard_plan(path: str, extra: list[str]) -> None:
        label = f"shard-plan {os.path.basename(path)} -w 128 -k 8 {' '.join(extra)}".strip()
        m = median_run([py, "-m", "ucstage", "shard-plan", path, "-w", "128", "-k", "8", *extra],
                       a.repeat)
        wall, peak = m.pop("seconds"), m.pop("peak_rss_mib")
        record(label, wall, peak, f"{label}: {wall:.2f} s ({m['cpu_seconds']:.2f} s CPU), "
               f"{peak:.0f} MiB peak RSS, {m['peak_rss_anon_mib']:.0f} MiB peak RssAnon"
               + (f" (median of {a.repeat})" if a.repeat > 1 else ""), **m)

    if a.slot_only:
        if not os.path.exists(arrow):
            _process([py, "-c", FREEZE, str(a.files), arrow])
        shard_plan(arrow, ["--slot", "5:3"])
        Report(SUITE, params_of(a), rows).emit(a.json, "\n".join(lines))
        return 0
    for path in (js, arrow):
        wall, peak, inner = _process([py, "-c", FREEZE, str(a.files), path])
        record(f"freeze {os.path.basename(path)}", float(inner), peak,
               f"freeze {os.path.basename(path)}: {float(inner):.2f} s beyond the listing "
               f"(process peak {peak:.0f} MiB)", process_seconds=wall)
    from ucstage.manifest import load

    fp = load(arrow, verify=False).fingerprint
    base_wall, base_peak, _ = _process([py, "-c", "import ucstage.manifest, pyarrow.ipc, numpy"])
    record("baseline imports", base_wall, base_peak,
           f"baseline: python + ucstage.manifest + pyarrow + numpy imports: {base_wall:.2f} s, "
           f"{base_peak:.0f} MiB")
    wall, peak, inner = _process([py, "-c", WORKER, arrow, fp])
    record("worker slot 5:3", wall, peak,
           f"worker slot 5:3 of {a.files:,} (header check, shuffled): {wall:.2f} s, "
           f"{peak:.0f} MiB peak ({inner})")
    for path in (js, arrow):
        for extra in ([], ["--slot", "5:3"], ["--shuffle", "--slot", "5:3"]):
            shard_plan(path, extra)
    Report(SUITE, params_of(a), rows).emit(a.json, "\n".join(lines))
    return 0


# --- resume -------------------------------------------------------------------

def resplit(n: int) -> dict[str, float]:
    from ucstage.resume import LoaderState
    from ucstage.sharding import Layout, ReadOrder, Segment, resume_slots
    from ucstage.sharding.resplit import EpochOrder

    order = EpochOrder(n, shuffle=True, seed=1, epoch=0)
    saved = Segment(Layout(16, 4), tuple(n // 200 + s for s in range(64)))
    return {
        "resplit_s": timed(lambda: resume_slots(order, [saved], Layout(24, 3))),
        "continue_s": timed(lambda: resume_slots(order, [saved], Layout(16, 4))),
        "state_bytes": len(json.dumps(LoaderState(
            "0" * 64, ReadOrder(n, shuffle=True, seed=1, epoch=0, shuffle_scope="global"),
            (saved,)).to_dict())),
    }


def audit_cost(n: int) -> dict[str, float]:
    counts = np.ones(n, dtype=np.uint16)
    counts[::1000] = 2

    def payload() -> tuple[bytes, dict[int, int]]:
        extra = np.flatnonzero(counts > 1)
        return (np.packbits(counts > 0).tobytes(),
                {int(i): int(counts[i]) - 1 for i in extra})

    made = payload()

    def count() -> None:
        total = np.zeros(n, dtype=np.int64)
        for _ in range(8):
            total += np.unpackbits(np.frombuffer(made[0], dtype=np.uint8), count=n)
            for i, extra in made[1].items():
                total[i] += extra

    return {"payload_s": timed(payload), "count8_s": timed(count),
            "payload_bytes": len(made[0])}


def loader_cost(files: int) -> dict[str, float]:
    from torch.utils.data import IterableDataset

    from ucstage.data import DataLoader, VolumeDataset

    class Read(IterableDataset):  # type: ignore[type-arg]
        def __init__(self, paths: VolumeDataset) -> None:
            self.paths = paths

        def __iter__(self) -> Iterator[int]:
            for p in self.paths:
                with open(p, "rb") as fh:
                    yield len(fh.read())

    with tempfile.TemporaryDirectory(prefix="ucstage-bench-resume-") as work:
        root = os.path.join(work, "src")
        write_files(root, files, 64, spread=0, vary=False, name="f{i:06d}.bin")
        paths = VolumeDataset(root, cache_dir=os.path.join(work, "cache"), read_ahead=0)
        loaders = {on: DataLoader(Read(paths), batch_size=8, num_workers=0, audit=on,
                                  log_mlflow=False) for on in (True, False)}
        sum(len(b) for b in loaders[False])  # warm the cache

        def epoch(on: bool) -> Callable[[], float]:
            return lambda: time_call(lambda: sum(len(b) for b in loaders[on]))[1].wall_s

        times = alternate({"on": epoch(True), "off": epoch(False)}, 3)
    c = Comparison(times["off"], times["on"])
    return {"audit_on_s": c.b_median, "audit_off_s": c.a_median,
            "on_over_off": c.median_pair_ratio}


def resume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--loader-files", type=int, default=4000)
    json_argument(parser)


def run_resume(args: argparse.Namespace) -> int:
    """What resuming and auditing an epoch cost (docs/benchmarks.md, "Resume and
    the audit").

        python -m benchmarks.planning resume [--files 1000000] [--loader-files 4000] [--json]

    * The re-split rule at scale: ``resume_slots`` for a shuffled epoch of
      ``--files`` files saved on 16 x 4 slots, resumed on 24 x 3 (a re-split) and
      on 16 x 4 (each slot continues); each process of the new job computes this
      once when its iteration starts. Median of 3.
    * The state's size in JSON for that job.
    * The audit's epoch-end work on one rank for ``--files`` files: the payload
      (bitmap and duplicates) and the count over 8 such payloads. Median of 3.
    * The loader with and without the audit: a ucstage DataLoader (num_workers=0,
      batch 8) over ``--loader-files`` small local files, warm cache, alternating
      audit on and off, median of 3 pairs (seconds per epoch).

    Prints a Markdown section.
    """
    r, a, lo = resplit(args.files), audit_cost(args.files), loader_cost(args.loader_files)
    per_batch = (lo["audit_on_s"] - lo["audit_off_s"]) / (args.loader_files / 8) * 1e6
    lines = [
        f"| {args.files:,} files, saved on 16 x 4 | median of 3 |",
        "|---|---|",
        f"| re-split onto 24 x 3 (`resume_slots`) | {r['resplit_s']:.3f} s |",
        f"| continue on 16 x 4 | {r['continue_s']:.3f} s |",
        f"| state, JSON | {r['state_bytes']:,} bytes |",
        f"| audit payload per rank (bitmap) | {a['payload_bytes']:,} bytes, "
        f"{a['payload_s'] * 1000:.1f} ms to build |",
        f"| audit count over 8 ranks' payloads | {a['count8_s'] * 1000:.1f} ms |",
        "",
        f"| DataLoader epoch, {args.loader_files:,} files, batch 8, num_workers=0 "
        "| seconds (median of 3 alternating pairs) |",
        "|---|---|",
        f"| audit on | {lo['audit_on_s']:.3f} |",
        f"| audit off | {lo['audit_off_s']:.3f} |",
        f"| difference per batch | {per_batch:.0f} µs |",
    ]
    results = [{"name": "resplit", **r}, {"name": "audit", **a}, {"name": "loader", **lo}]
    Report(SUITE, params_of(args), results,
           {"audit_us_per_batch": per_batch}).emit(args.json, "\n".join(lines))
    return 0


# --- shuffle_scope ------------------------------------------------------------

def issue_forecast(lines: list[str]) -> list[dict[str, Any]]:
    from ucstage.sharding import Layout, ReadOrder, forecast

    sizes = np.full(4000, 1000, dtype=np.int64)
    lines.append("Forecast, 4,000 files, -w 16 -k 4, 8 ranks per node, seed 1, 3 epochs:")
    lines.append("| scope | epoch | node 0 reads not read before | node 0 has needed "
                 "| job fetches |")
    lines.append("|---|---:|---:|---:|---:|")
    rows = []
    for scope in ("global", "node"):
        f = forecast(sizes, Layout(16, 4, 8), ReadOrder(len(sizes), shuffle=True, seed=1,
                                                        shuffle_scope=scope), epochs=3)
        needed = 0
        for row in (r for r in f.rows if r.node == 0):
            needed += row.new_files
            fetches = f.epoch_new(row.epoch)[0]
            lines.append(f"| {scope} | {row.epoch} | {row.new_files / row.files:.0%} | "
                         f"{needed / 4000:.0%} of the files | {fetches:,} |")
            rows.append({"name": f"forecast {scope} epoch {row.epoch}",
                         "node0_new_share": row.new_files / row.files,
                         "node0_needed_share": needed / 4000, "job_fetches": fetches})
    return rows


def shuffle_scope_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--files", type=int, default=1_000_000)
    pairs_argument(ap)
    json_argument(ap)


def run_shuffle_scope(args: argparse.Namespace) -> int:
    """Node vs global shuffle scope: the network forecast and what each scope costs to plan.

    1. The forecast on the issue's setup (4,000 files, -w 16 -k 4, 8 ranks per
       node, seed 1, 3 epochs): per epoch, the share of node 0's reads that it did
       not read before, and the share of the dataset node 0 has needed.
    2. Planning 1,000,000 files over 128 x 8 slots (16 nodes of 8 ranks), and one
       slot, under each scope: alternating global and node, median of the pairs.

        python -m benchmarks.planning shuffle_scope [--files 1000000] [--pairs 3] [--json]
    """
    from ucstage.sharding import Layout, ReadOrder, Slot, shard_plan, slot_array

    lines: list[str] = []
    results = issue_forecast(lines)
    sizes = np.arange(args.files, dtype=np.int64) % 100_000
    runs: dict[str, Callable[[str], object]] = {
        "plan 128x8, shuffled": lambda scope: shard_plan(
            sizes, Layout(128, 8, 8),
            ReadOrder(len(sizes), shuffle=True, seed=1, epoch=2, shuffle_scope=scope)),
        "one slot (rank 77, worker 5)": lambda scope: slot_array(
            ReadOrder(args.files, shuffle=True, seed=1, epoch=2, shuffle_scope=scope),
            Layout(128, 8, 8), Slot(77, 5)).tolist(),
    }
    lines += [f"\n{args.files:,} files, 128 ranks x 8 workers, 16 nodes; median of "
              f"{args.pairs} alternating pairs, seconds:",
              "| step | global | node | node/global |", "|---|---:|---:|---:|"]

    def side(fn: Callable[[str], object], scope: str) -> Callable[[], float]:
        return lambda: time_call(lambda: fn(scope))[1].wall_s

    for label, fn in runs.items():
        times = alternate({scope: side(fn, scope) for scope in ("global", "node")}, args.pairs)
        c = Comparison(times["global"], times["node"])
        lines.append(f"| {label} | {c.a_median:.4g} | {c.b_median:.4g} | {c.ratio:.2f} |")
        results.append({"name": label, "global_s": c.a_median, "node_s": c.b_median,
                        "node_over_global": c.ratio, "pair_ratios": c.pair_ratios})
    Report(SUITE, params_of(args), results).emit(args.json, "\n".join(lines))
    return 0


# --- grouped ------------------------------------------------------------------

def _read_all(paths: Any) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as fh:
            total += len(fh.read())
    return total


def grouped_second_epoch(make: Any, expect: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the second epoch over a fresh dataset (the first
    warms the stamp memo); CPU is this process's, all threads."""
    ds = make()
    seconds = cpu = 0.0
    for _ in range(2):
        start, start_cpu = time.perf_counter(), time.process_time()
        total = 0
        for item in ds:
            total += _read_all(item.values()) if isinstance(item, dict) else _read_all((item,))
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if total != expect:
            raise RuntimeError(f"read {total} bytes, expected {expect}")
    return seconds, cpu


def grouped_warm(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    from ucstage import LocalCache, VolumeDataset
    from ucstage.volumes import list_files

    size = args.size_kib * 1024
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-grouped-", dir=args.dir) as work:
        data, cache_dir = os.path.join(work, "data"), os.path.join(work, "cache")
        payload = os.urandom(size)
        for i in range(args.samples):
            folder = os.path.join(data, f"part{i % 8}")
            os.makedirs(folder, exist_ok=True)
            for suffix in ("jpg", "json"):
                with open(os.path.join(folder, f"{i:07d}.{suffix}"), "wb") as fh:
                    fh.write(payload)
        listing = list_files(data)
        if LocalCache(cache_dir).warm(listing.volume, listing.entries).failed:
            raise RuntimeError("warm failed")
        expect = 2 * args.samples * size
        found = alternate(
            {"ungrouped": lambda: grouped_second_epoch(lambda: VolumeDataset(data, cache_dir=cache_dir),
                                               expect),
             "grouped": lambda: grouped_second_epoch(lambda: VolumeDataset(data, cache_dir=cache_dir,
                                                                   group="key"), expect)},
            args.pairs, lambda r, side, s: print(f"pair {r + 1}: {side} {s[0]:.3f} s wall, "
                                                 f"{s[1]:.3f} s CPU", file=sys.stderr))
    pairs = {what: Comparison([t[i] for t in found["ungrouped"]], [t[i] for t in found["grouped"]])
             for i, what in enumerate(("wall", "CPU"))}
    rows = [{"name": f"warm epoch ({what})", "ungrouped_s": c.a_median, "grouped_s": c.b_median,
             "ratio": c.median_pair_ratio, "pair_ratios": c.pair_ratios, "target": 1.1}
            for what, c in pairs.items()]
    return rows, "\n".join(
        f"{args.samples:,} samples x 2 files x {args.size_kib} KiB, warm cache, second epoch, "
        f"{args.pairs} alternating pairs, {what}: ungrouped {c.a_median:.3f} s, grouped "
        f"{c.b_median:.3f} s, grouped / ungrouped {c.median_pair_ratio:.2f}x "
        f"(pairs {', '.join(f'{x:.2f}x' for x in c.pair_ratios)})" for what, c in pairs.items())


def grouped_plan(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    import ucstage
    from ucstage.manifest import Manifest, fingerprint, save
    from ucstage.volumes import FileEntry

    n = args.files
    entries = [FileEntry(f"part-{i // 2000:05d}/sample-{i // 2:08d}.{'jpg' if i % 2 == 0 else 'json'}",
                         100_000 + (i * 7919) % 50_000, str(1_700_000_000.0 + i))
               for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-grouped-", dir=args.dir) as work:
        path = os.path.join(work, "m.manifest.arrow")
        save(Manifest("/Volumes/main/ml/train", entries, fingerprint(entries)), path)
        del entries
        base = [sys.executable, "-m", "ucstage", "shard-plan", path, "-w", "128", "-k", "8"]
        # The child runs the ucstage this process imported (ab_compare picks which).
        home = os.path.dirname(os.path.dirname(os.path.abspath(ucstage.__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (home, os.environ.get("PYTHONPATH", "")) if p)}

        def side(extra: list[str]) -> Any:
            return run_command(base + extra, env=env).timing

        found = alternate({"ungrouped": lambda: side([]),
                           "grouped": lambda: side(["--group", "key"])}, args.pairs,
                          lambda r, s, t: print(f"pair {r + 1}: {s} {t.wall_s:.2f} s wall, "
                                                f"{t.cpu_s:.2f} s CPU", file=sys.stderr))
    wall = Comparison([t.wall_s for t in found["ungrouped"]], [t.wall_s for t in found["grouped"]])
    cpu = Comparison([t.cpu_s for t in found["ungrouped"]], [t.cpu_s for t in found["grouped"]])
    rows = [{"name": f"shard-plan {n:,} files -w 128 -k 8 ({what})", "ungrouped_s": c.a_median,
             "grouped_s": c.b_median, "ratio": c.median_pair_ratio,
             "pair_ratios": c.pair_ratios, "target": 1.5}
            for what, c in (("wall", wall), ("CPU", cpu))]
    return rows, "\n".join(
        f"shard-plan of a {n:,}-file Arrow manifest, 128 x 8 slots, {args.pairs} alternating "
        f"pairs, {what}: ungrouped {c.a_median:.2f} s, grouped {c.b_median:.2f} s, grouped / "
        f"ungrouped {c.median_pair_ratio:.2f}x (pairs {', '.join(f'{x:.2f}x' for x in c.pair_ratios)})"
        for what, c in (("wall", wall), ("CPU (user + sys)", cpu)))


def grouped_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mode", choices=["warm", "plan"])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=16)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="where to write (default: /tmp)")
    pairs_argument(parser)
    json_argument(parser)


def run_grouped(args: argparse.Namespace) -> int:
    """Grouped samples (issue 23) against the same files ungrouped.

    ``warm``: SAMPLES samples of a ``.jpg`` and a ``.json`` (SIZE_KIB each) in a
    local folder, warmed into a ucstage cache; alternating PAIRS times, the
    second epoch (in this process, ``num_workers=0``) of a fresh
    ``VolumeDataset`` that reads every file's bytes: ungrouped (one item per
    file) and ``group="key"`` (one item per sample, both members read).
    Target: grouped <= 1.1x ungrouped.

    ``plan``: a columnar manifest of FILES files (half ``.jpg``, half ``.json``,
    two per sample), then alternating PAIRS times ``ucstage shard-plan MANIFEST
    -w 128 -k 8`` (the human plan) with and without ``--group key``, each a fresh process
    (wall time from its rusage). Target: grouped <= 1.5x ungrouped.

        python -m benchmarks.planning grouped warm --pairs 5 [--json]
        python -m benchmarks.planning grouped plan --files 1000000 --pairs 3 [--json]
    """
    rows, text = grouped_warm(args) if args.mode == "warm" else grouped_plan(args)
    Report(SUITE, params_of(args), rows).emit(args.json, text)
    return 0


VARIANTS = {"manifest": (manifest_arguments, run_manifest),
            "resume": (resume_arguments, run_resume),
            "shuffle_scope": (shuffle_scope_arguments, run_shuffle_scope),
            "grouped": (grouped_arguments, run_grouped)}


def main(argv: list[str] | None = None) -> int:
    return suite(SUITE, __doc__ or "", VARIANTS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
