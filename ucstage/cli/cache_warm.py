"""``ucstage cache warm``: parses, calls :func:`ucstage.cache.warm.warm_slice`
(after :func:`~ucstage.cache.warm.rank_slice` chose the ranks' files) and
renders; the JSON shape is docs/json-cache.md#warm."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console

from .. import cloudfs
from ..cache.local import LocalCache
from ..cache.reports import RankSlice, WarmReport
from ..cache.warm import rank_slice, share_text, warm_ranks, warm_slice
from ..engines import objstore
from ..errors import InvalidArgument
from ..manifest.groups import Grouping
from ..manifest.model import group_manifest
from ..planning import check_unit, scope_of
from ..sharding.rule import Layout, ReadOrder
from ..shown import shown
from ..units import SIZE_HELP, format_rate
from ..volumes.entry import FileEntry
from .args import (
    NPROC_HELP,
    Seconds,
    column_list,
    given,
    group_option,
    shuffle_scope_option,
    size_flag,
    warm_options,
)
from .bars import Counting, progress_bar
from .output import (
    CONTEXT,
    counted,
    emit,
    err,
    escape,
    fail_found,
    format_bytes,
    json_option,
    listing,
    read_source,
    source_options,
    table_source,
)

EXAMPLES = 10
FILE_ONLY = ("include", "exclude", "include_hidden", "group")
"""What a warm of files takes and a warm of a table's row groups does not."""
ROW_GROUP_ONLY = ("columns", "version", "filter")


class JobsType(click.ParamType):
    """``--jobs``: ``auto`` or a number of copies in flight, 1 to 256."""

    name = "N|auto"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int | str:
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            n = int(value)
            if 1 <= n <= 256:
                return n
        elif isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        self.fail(f"{value!r} is not 'auto' or a number from 1 to 256", param, ctx)


@click.command("warm", context_settings=CONTEXT)
@source_options
@click.option("-j", "--jobs", type=JobsType(), default="auto", show_default=True,
              help="Copies in flight: 'auto' ramps them up while throughput rises and "
                   "backs off on errors or falling throughput (up to 256 requests for "
                   "s3://, gs://, az:// on the obstore engine, 64 threads for mounts and "
                   "folders) and reports the value it settled on; a number N (1-256) "
                   "is used as given.")
@click.option("--max-bytes", metavar="SIZE", default=None,
              help="Byte cap for the whole cache; files are evicted, least recently used "
                   "first, then files a training job consumed (of any source; the summary "
                   "says which; files a running job holds stay). Default "
                   f"$UCSTAGE_CACHE_MAX_BYTES, else no cap; {SIZE_HELP}.")
@click.option("--rank", type=int, default=None, help="Warm only the files this rank reads.")
@click.option("--node-rank", type=int, default=None,
              help="Warm the files of every rank on node N (ranks N*P .. N*P+P-1).")
@click.option("--nproc-per-node", type=int, default=None, metavar="P",
              help=NPROC_HELP + " Needed by --node-rank.")
@click.option("-w", "--world-size", type=int, default=None, help="Number of ranks.")
@click.option("-k", "--num-workers", type=int, default=None,
              help="DataLoader workers per rank (0 = the main process reads).")
@click.option("--shuffle", is_flag=True,
              help="The job shuffles: under the node scope, warm the whole share of the "
                   "ranks' node (the same files every epoch); under --shuffle-scope global, "
                   "the ranks' files of --epoch's permutation.")
@click.option("--seed", type=int, default=None,
              help="Shuffle seed (with --shuffle; default 0).")
@click.option("--epoch", type=int, default=None,
              help="Epoch of the permutation (with --shuffle --shuffle-scope global; "
                   "default 0). Ignored under the node scope, whose share serves every epoch.")
@shuffle_scope_option
@click.option("--no-hedge", is_flag=True,
              help="Do not hedge late GETs on the object-store engine (a second request "
                   "when a response is late against the store's running latency); the "
                   "deadline still bounds every request. Same as UCSTAGE_HEDGE=0.")
@click.option("--deadline", type=Seconds(min=0, min_open=True), default=None,
              metavar="SECONDS",
              help="Seconds one object-store request may take at most before it is dropped "
                   "and retried. Default $UCSTAGE_REQUEST_DEADLINE, else 30.")
@group_option
@warm_options
@json_option
def warm(source: str | None, manifest_path: str | None, include: tuple[str, ...],
         exclude: tuple[str, ...], include_hidden: bool, jobs: int | str, max_bytes: str | None,
         rank: int | None, node_rank: int | None, nproc_per_node: int | None,
         world_size: int | None, num_workers: int | None, shuffle: bool, seed: int | None,
         epoch: int | None, shuffle_scope: str | None, no_hedge: bool, deadline: float | None,
         group: str | None, unit: str, columns: str | None, version: int | None,
         filter: str | None, as_json: bool) -> None:
    """Copy SOURCE's files into the local cache now, in parallel; files already
    cached and unchanged are skipped, so a rerun resumes.

    With --rank (or --node-rank), warm only the files those ranks' DataLoader
    workers read under the slot rule, the same files `shard-plan` prints. With
    --shuffle under the default node scope, that is the whole share of their
    node, which serves every epoch (the whole source when the job is one node,
    i.e. without --nproc-per-node); it is checked against --max-bytes and the
    free disk before anything is copied.
    With --unit row-group, SOURCE is a table and the unit is its row group:
    each row group's column chunks (of --columns) become one cache entry, the
    ones TableDataset reads, dealt by the same rule. With --filter only the
    row groups that can hold a matching row, with the filter's columns, as
    TableDataset(filter=...) reads them.
    Exits 1 when files fail after retries (they are listed) or do not fit.
    Off a terminal, a progress line is printed every 10 s. Ctrl-C (or SIGTERM)
    stops within about 2 s: copies in flight finish or are removed, and the
    files already copied stay cached (a rerun resumes).

    \b
    Examples:
      ucstage cache warm /Volumes/main/ml/train/images
      ucstage cache warm s3://bucket/train --max-bytes 200G
      ucstage cache warm manifest.json --node-rank 1 --nproc-per-node 8 -w 16 -k 6
      ucstage cache warm manifest.json --node-rank 1 --nproc-per-node 8 -w 16 -k 6 --shuffle
      ucstage cache warm main.ml.events --unit row-group --rank 0 -w 8 -k 2 --shuffle
    """
    check_unit(unit, given(FILE_ONLY + ROW_GROUP_ONLY), FILE_ONLY, ROW_GROUP_ONLY)
    ranks = warm_ranks(rank, node_rank, world_size=world_size, num_workers=num_workers,
                       nproc_per_node=nproc_per_node)
    if (seed is not None or epoch is not None) and not shuffle:
        # Without --shuffle the slice is in listing order: a seed or epoch
        # would change nothing, and silently ignoring it would suggest otherwise.
        raise InvalidArgument("--seed/--epoch only matter with --shuffle",
                              hint="add --shuffle, or drop --seed/--epoch")
    scope = scope_of(shuffle_scope, shuffle)
    if ranks is None and shuffle:
        # Order does not matter when warming everything.
        raise InvalidArgument("--shuffle/--seed/--epoch choose a rank's slice; they need "
                              "--rank or --node-rank")
    if shuffle and scope == "node" and epoch is not None:
        err.print("note: --epoch is ignored under the node shuffle scope: the node's share "
                  "is the same every epoch, so it is warmed whole", markup=False)
    cap = size_flag(max_bytes, "--max-bytes")
    # The copies start obstore's runtime here anyway and no worker forks from
    # this process: resolving and listing run here too, not in a child each.
    objstore.run_here()
    # Before listing: a bad setting fails fast. The network options are the
    # cache's parameters (the environment stays the library's default).
    cache = LocalCache(max_bytes=cap, hedge=False if no_hedge else None,
                       request_deadline=deadline)
    refused: Sequence[tuple[str, str]] = ()
    unreadable: Sequence[tuple[str, str]] = ()
    noun = "row group" if unit == "row-group" else "file"
    groups = None
    if unit == "row-group":
        volume, entries, refused = _table_entries(source, manifest_path, columns, version,
                                                  filter)
    else:
        with listing(source):
            m = read_source(source, manifest_path, include, exclude, include_hidden)
            if group is not None:
                m = group_manifest(m, Grouping(group))[0]
        volume, entries = m.volume(), list(m.entries)
        refused, unreadable, groups = m.refused, m.unreadable, m.groups
    slice_: RankSlice | None = None
    if ranks is not None:
        assert world_size is not None and num_workers is not None
        items = len(entries) if groups is None else groups.count  # samples with --group
        entries, slice_ = rank_slice(
            entries, ranks, Layout(world_size, num_workers, nproc_per_node),
            ReadOrder(items, shuffle, seed or 0, epoch or 0, None, scope), groups)
        if slice_.nodes is not None:
            err.print(f"warming {share_text(slice_.nodes, slice_.layout)}: "
                      f"{counted(len(entries), noun)} "
                      f"({format_bytes(sum(e.size for e in entries))}), the same {noun}s "
                      "every epoch", markup=False)
    callback: Counting | None = None
    try:
        with progress_bar(not as_json, "warming") as callback:
            report = warm_slice(cache, volume, entries, slice_, jobs=jobs, callback=callback)
    except KeyboardInterrupt:
        err.print(_stopped(callback, entries), markup=False)
        raise
    data = report.to_json(rank_slice=slice_, refused=refused, unreadable=unreadable)
    emit(data, as_json, lambda console: _warm_summary(console, report, ranks, cache.max_bytes,
                                                      slice_, noun))
    if report.failed:
        names = ", ".join(p for p, _ in report.failed[:3])
        fail_found(f"{len(report.failed):,} of {counted(report.files, 'file')} failed: "
                   f"{names}" + (" …" if len(report.failed) > 3 else ""), _failed_hint(report))


def _table_entries(source: str | None, manifest_path: str | None, columns: str | None,
                   version: int | None, filter: str | None
                   ) -> tuple[Any, list[Any], Sequence[tuple[str, str]]]:
    """(volume, one cache entry per row group, the folder's refused entries)
    of a table: its row groups' column chunks, the entries TableDataset reads
    (``tables.entries``)."""
    from ..tables.entries import group_entries

    wanted = column_list(columns)
    manifest = table_source(source, manifest_path, version, filter)
    manifest.check_columns(wanted)
    return manifest.volume(), group_entries(manifest, wanted), manifest.refused


def _stopped(callback: Counting | None, entries: Sequence[FileEntry]) -> str:
    """What an interrupted warm did: ``stopped: 120 of 2,000 files copied ...``."""
    done = callback.statuses if callback is not None else {}
    copied, cached, failed = (done.get(k, 0) for k in ("fetched", "cached", "failed"))
    left = len(entries) - copied - cached - failed
    now = callback.bytes_done if callback is not None else 0
    return (f"stopped: {copied:,} of {counted(len(entries), 'file')} copied"
            + (f", {cached:,} already cached" if cached else "")
            + (f", {failed:,} failed" if failed else "")
            + f", {left:,} not copied; {format_bytes(now)} of "
              f"{format_bytes(sum(e.size for e in entries))} now cached; rerun to copy the rest")


def _warm_summary(console: Console, report: WarmReport, ranks: list[int] | None,
                  cap: int | None, rank_slice: RankSlice | None = None,
                  noun: str = "file") -> None:
    rate = (f", {format_rate(report.fetched_bytes / report.seconds)}"
            if report.fetched_bytes and report.seconds else "")
    who = f" for ranks {ranks[0]}..{ranks[-1]}" if ranks and len(ranks) > 1 else (
        f" for rank {ranks[0]}" if ranks else "")
    if rank_slice is not None and rank_slice.nodes is not None:
        who = (" for " + share_text(rank_slice.nodes, rank_slice.layout)
               + ", which serves every epoch")
    if report.failed:  # a failed file is not warmed
        done = report.fetched + report.already_cached
        done_bytes = report.fetched_bytes + report.already_cached_bytes
        what = (f"{done:,} of {counted(report.files, noun)} ({format_bytes(done_bytes)} of "
                f"{format_bytes(report.bytes)})")
    else:
        what = f"{counted(report.files, noun)} ({format_bytes(report.bytes)})"
    console.print(
        f"[bold]Warmed[/] {what}{who} in "
        f"{report.seconds:.1f} s: fetched {report.fetched:,} "
        f"({format_bytes(report.fetched_bytes)}{rate}), already cached "
        f"{report.already_cached:,}, failed {len(report.failed):,}")
    console.print(f"cache folder: {shown(report.namespace)}", markup=False)
    if report.fetched:
        how = "settled on by --jobs auto" if report.jobs_auto else "--jobs"
        console.print(f"engine: {report.engine}, "
                      f"{counted(report.jobs, 'copy in flight', 'copies in flight')} ({how})",
                      markup=False)
    _network_summary(console, report)
    # The one place failed files are listed for people (the progress display
    # only counts them), so each shows once.
    for path, reason in report.failed[:EXAMPLES]:
        console.print(f"  [red]failed[/] {escape(path)}: {escape(reason)}", markup=True)
    if len(report.failed) > EXAMPLES:
        console.print(f"  … and {len(report.failed) - EXAMPLES:,} more (--json lists all)")
    if report.evicted:
        under = f" to stay under the cap of {format_bytes(cap)}" if cap else ""
        console.print(f"[yellow]evicted[/] {counted(report.evicted_files, 'cached file')} "
                      f"({format_bytes(report.evicted_bytes)}){escape(under)}:", markup=True)
        for e in report.evicted:
            mine = " (this source)" if e.namespace == os.path.basename(report.namespace) else ""
            console.print(f"  {shown(e.source or e.namespace)}{mine}: {counted(e.files, 'file')} "
                          f"({format_bytes(e.bytes)})", markup=False)


def _network_summary(console: Console, report: WarmReport) -> None:
    """What the network did to the copies, when it did anything: late
    requests hedged, requests past the deadline, checksum mismatches, and a
    store whose ETags give no checksum."""
    counts = [f"{n:,} {text}" for n, text in (
        (report.hedged, "late requests hedged"), (report.timeouts, "requests past the deadline"),
        (report.mismatches, "checksum mismatches retried")) if n]
    if counts:
        console.print(f"network: {', '.join(counts)}", markup=False)
    checks = report.check_counts()
    if checks["size"] and not checks["md5"] and not checks["crc32c"] and not checks["page_crc"]:
        cloud = cloudfs.parse(report.source)
        why = ("its ETags are not MD5s (SSE-KMS?)" if report.etags_not_md5
               # GCS and Azure give every object's bytes a checksum (Azure's
               # per range when it keeps none); only a replaced one has none listed.
               else "the objects changed since they were listed (list them again to "
                    "check their stored checksums)" if cloud is not None
               else "no plain-MD5 ETags (multipart uploads)")
        console.print(f"checked: by size only, {why}", markup=False)


def _failed_hint(report: WarmReport) -> str:
    """Suggest a rerun only for failures a rerun can fix (transient errors)."""
    retryable = len(report.retryable)
    if retryable == len(report.failed):
        return "rerun to retry just those; the rest are cached"
    if retryable:
        return (f"rerun to retry the {retryable:,} that failed on transient errors; the "
                "others (missing, unreadable or not a file) fail again until the source "
                "is fixed; the rest are cached")
    return ("they are missing, unreadable or not regular files at the source, so a rerun "
            "fails the same way until the source is fixed; the rest are cached")
