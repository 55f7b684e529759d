"""``ucstage bench``: read throughput direct, through a cold and a warm cache, across workers."""

from __future__ import annotations

import click
from rich.console import Console

from ..bench.driver import run
from ..bench.plot import plot
from ..bench.report import BenchReport, Recommendation
from ..bench.sampling import ALL, DEFAULT_SAMPLE_BYTES, DEFAULT_SAMPLE_FILES, NOISY_SECONDS, WITHIN
from ..bench.settings import check_options
from ..errors import InvalidArgument
from ..planning import scope_of
from ..units import SIZE_HELP, format_bytes, format_rate, parse_size
from .args import Seconds, nproc_option, parse_modes, parse_workers, shuffle_scope_option
from .bars import progress_bar
from .output import (
    CONTEXT,
    counted,
    emit,
    err,
    escape,
    json_option,
    read_source,
    source_options,
    table,
)

_VERDICT = {
    "volume": "the volume is the bottleneck: a warm local cache reads {x:.1f}x faster. "
              "Warm the cache before training (`ucstage cache warm SOURCE`) or read through "
              "VolumeDataset's cache.",
    "local": "the volume keeps up: a warm cache is only {x:.2f}x faster than reading it "
             "directly. If training is slow, look at decoding, batch size or the model, not "
             "at storage.",
}

_MODE_TEXT = {
    "loader": "through VolumeDataset and the DataLoader",
    "cold": "through a cold cache (the first epoch)",
    "direct": "reading the source directly",
    "warm": "from a warm cache",
}


def _sample_text(report: BenchReport) -> str:
    files, listed = report.sample_files, report.listed_files
    size = format_bytes(report.sample_bytes)
    if report.sampled_by == "all":
        return f"all {counted(listed, 'file')}, {size}"
    head = f"sampled {files:,} of {counted(listed, 'file')}, {size}"
    if report.sampled_by != "default":
        return f"{head}  [dim](deterministic sample by {report.sampled_by}, seed {report.seed})[/]"
    stride = (f"1 in ~{listed / files:,.0f} files, evenly spaced from a seeded offset "
              f"(seed {report.seed})" if files < listed else "every file")
    return (f"{head}\n  [dim]the default sample: {stride}, at most "
            f"{DEFAULT_SAMPLE_FILES} files or {format_bytes(DEFAULT_SAMPLE_BYTES)}; "
            "choose with --files N, --sample-bytes SIZE or --files all[/]")


def _workers_text(k: int) -> str:
    if k == 0:
        return "[bold]num_workers=0[/] (the main process reads)"
    return f"[bold]{k}[/] DataLoader worker{'s' if k != 1 else ''} (num_workers={k})"


def _render(console: Console, report: BenchReport) -> None:
    console.print(f"[bold]Bench[/] {report.source}: {_sample_text(report)}")
    rec = report.recommendation
    t = table("mode", "workers", "files", "size", "s", "files/s", "rate", "p50", "p95", "p99 ms")
    for r in report.results:
        mark = "" if r.complete else "[yellow]*[/]"
        best = rec.by_mode.get(r.mode) == r.workers
        rate = format_rate(r.mb_per_s * 1e6) + ("[yellow]†[/]" if r.page_cached else "")
        t.add_row(
            r.mode, f"[bold]{r.workers}[/]" if best else str(r.workers), f"{r.files}{mark}",
            format_bytes(r.bytes), f"{r.seconds:.2f}", f"{r.files_per_s:.1f}",
            f"[bold]{rate}[/]" if best else rate,
            f"{r.p50_ms:.1f}", f"{r.p95_ms:.1f}", f"{r.p99_ms:.1f}",
        )
    console.print(t)
    if any(not r.complete for r in report.results):
        console.print("[yellow]*[/] [dim]cut short by --max-seconds: rates are over the files "
                      "read in time[/]")
    if any(r.page_cached for r in report.results):
        console.print("[yellow]†[/] [dim]read from the OS page cache (memory), not from the "
                      "source: faster than the source's disk or network can deliver[/]")
    if "loader" in report.modes:
        console.print("[dim]loader latencies are per file, inside a DataLoader worker "
                      "(wait for the fetched path + read)[/]")
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    console.print()
    if rec.workers is None or rec.mode is None or rec.best_mb_per_s is None:
        console.print("[yellow]![/] nothing was measured; raise --max-seconds")
        return
    others = ", ".join(f"{m} {k}" for m, k in rec.by_mode.items() if m != rec.mode)
    console.print(
        f"[green]→[/] use {_workers_text(rec.workers)}: the fewest within {WITHIN:.0%} "
        f"of the best rate {_MODE_TEXT[rec.mode]}, {format_rate(rec.best_mb_per_s * 1e6)} at "
        f"{rec.best_workers}" + (f"  [dim](per mode: {others})[/]" if others else ""))
    if report.local_disk and (rec.cold_vs_direct is not None or rec.warm_vs_direct is not None):
        # Local disk against local disk: a ratio here would mislead (the notes say why).
        console.print(f"  [dim]no cache-vs-direct verdict: the source is on a local disk "
                      f"({escape(report.local_disk)})[/]")
        return
    _render_verdicts(console, rec)


def _render_verdicts(console: Console, rec: Recommendation) -> None:
    if rec.cold_vs_direct is not None:
        line = f"  cold cache vs direct: {rec.cold_vs_direct:.2f}x"
        if rec.cold_vs_direct < 1 and rec.caching == "later_epochs":
            line += ("; caching will not help the first epoch (copying costs more than it "
                     "saves), but every later epoch reads the warm cache")
        elif rec.cold_vs_direct < 1 and rec.caching == "no_help":
            line += "; the cold cache is slower than direct reads: caching will not help this source"
        elif rec.cold_vs_direct < 1:
            line += "; the cold cache is slower than direct reads: the first epoch pays for the copy"
        console.print(line)
    if rec.warm_vs_direct is not None:
        if rec.bottleneck:
            verdict = _VERDICT[rec.bottleneck].format(x=rec.warm_vs_direct)
        elif rec.direct_page_cache:
            verdict = ("the best direct run read from the OS page cache, so it says nothing "
                       "about the volume: no verdict on the bottleneck")
        else:
            verdict = (f"direct runs took under {NOISY_SECONDS:g} s, too short to say "
                       "whether the volume is the bottleneck; bench more files")
        console.print(f"  warm cache vs direct: {rec.warm_vs_direct:.2f}x; {verdict}")


class _Files(click.ParamType):
    """--files N or --files all."""

    name = "N|all"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or value == ALL:
            return value  # type: ignore[return-value]
        try:
            return int(str(value))
        except ValueError:
            self.fail(f"takes a number of files or 'all', got {value!r}", param, ctx)


@click.command("bench", context_settings=CONTEXT)
@source_options
@click.option("-f", "--files", "files", type=_Files(), default=None, metavar="N|all",
              help="Bench a deterministic sample of N files (same files on every run), or "
                   "'all' to read every listed file. Default: every k-th file from a seeded "
                   "offset, at most 500 files or 2 GiB, whichever is smaller.")
@click.option("--sample-bytes", metavar="SIZE", default=None,
              help=f"Bench a deterministic sample of about SIZE bytes, e.g. 2G; {SIZE_HELP}.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Changes which files the sample takes.")
@click.option("-k", "--workers", "--num-workers", "workers", default="1,2,4,6,8", show_default=True, metavar="K,K,...",
              help="Concurrent readers to try (DataLoader num_workers with --loader; 0, the "
                   "main process reading, runs in loader mode only).")
@click.option("-m", "--modes", default="direct,cold,warm", show_default=True,
              metavar="MODE,...",
              help="direct: read from the source; cold: through a fresh private cache; "
                   "warm: through that cache again; loader: VolumeDataset + DataLoader.")
@click.option("--loader", is_flag=True, help="Also bench the VolumeDataset + DataLoader path.")
@click.option("-b", "--batch-size", type=int, default=32, show_default=True,
              help="DataLoader batch size for --loader.")
@click.option("--shuffle", is_flag=True,
              help="The loader mode reads the sample as VolumeDataset(shuffle=True) does "
                   "(seeded by --seed).")
@shuffle_scope_option
@nproc_option
@click.option("--max-seconds", type=Seconds(), default=None, metavar="S",
              help="Bound the whole run; each run gets an equal share of the time left, "
                   "and runs cut short are marked.")
@click.option("--scratch-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Where the private cold/warm cache is made (default: the temp folder). "
                   "It is removed at the end.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              metavar="FILE.png", help="Write a chart of MiB/s against workers, one line per "
                                       "mode (needs matplotlib: pip install 'ucstage[plot]').")
@json_option
def command(
    source: str | None, manifest_path: str | None, include: tuple[str, ...],
    exclude: tuple[str, ...], include_hidden: bool, files: int | str | None,
    sample_bytes: str | None, seed: int, workers: str, modes: str, loader: bool,
    batch_size: int, shuffle: bool, shuffle_scope: str | None, nproc_per_node: int | None,
    max_seconds: float | None, scratch_dir: str | None,
    plot_path: str | None, as_json: bool,
) -> None:
    """Measure read throughput from SOURCE directly, through a cold cache and
    through a warm cache, for each worker count, and say how many DataLoader
    workers to use.

    By default it reads a sample spread over the whole listing: every k-th
    file from a seeded offset, at most 500 files or 2 GiB, whichever is
    smaller (--files N, --sample-bytes SIZE or --files all to choose). The
    cold and warm modes use a private cache in a temporary folder, never your
    cache; it is removed at the end, on error and on Ctrl-C.

    \b
    Examples:
      ucstage bench /Volumes/main/ml/train/images --files 500
      ucstage bench s3://bucket/data --sample-bytes 2G --workers 1,4,8,16 --plot bench.png
      ucstage bench data/ --loader --batch-size 64 --max-seconds 120 --json
    """
    worker_counts = parse_workers(workers)
    mode_list = parse_modes(modes + (",loader" if loader else ""))
    size = parse_size(sample_bytes) if sample_bytes is not None else None
    # The library's own check, before listing: a bad value must not wait for
    # the listing of a large volume to be refused. Its messages name
    # parameters; the error mapper says them as this command's flags.
    scope = scope_of(shuffle_scope, shuffle)
    check_options(files=files, sample_bytes=size, workers=worker_counts,
                  modes=mode_list, batch_size=batch_size, max_seconds=max_seconds,
                  shuffle_scope=scope, nproc_per_node=nproc_per_node)
    if (shuffle or nproc_per_node is not None) and "loader" not in mode_list:
        raise InvalidArgument("--shuffle/--shuffle-scope/--nproc-per-node set the loader "
                              "mode's dataset; they need --loader")
    if plot_path is not None:
        _check_plot(plot_path)
    manifest = read_source(source, manifest_path, include, exclude, include_hidden)
    with progress_bar(err.is_terminal, transient=True) as callback:
        report = run(manifest, files=files, sample_bytes=size, seed=seed,
                     workers=worker_counts, modes=mode_list, batch_size=batch_size,
                     max_seconds=max_seconds, scratch_dir=scratch_dir, callback=callback,
                     shuffle=shuffle, shuffle_scope=scope, nproc_per_node=nproc_per_node)
    chart = plot(report, plot_path) if plot_path is not None else None
    emit(report.to_json(plot=chart), as_json, lambda c: _render(c, report))
    if plot_path is not None and not as_json:
        err.print(f"[dim]chart written to {plot_path}[/]")


def _check_plot(path: str) -> None:
    """Fail before measuring, not after, when the chart cannot be written."""
    from ..bench.plot import check_destination

    check_destination(path)
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        from ..errors import MissingDependency

        raise MissingDependency("--plot needs matplotlib",
                                hint="pip install 'ucstage[plot]'") from exc
