"""``ucstage cache``: warm, lazy, status, verify, clear, prune.

Each subcommand parses, calls one :class:`ucstage.cache.LocalCache` method
and renders; JSON shapes are documented in docs/json-cache.md.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click
from rich.console import Console
from rich.markup import escape

from .. import manifest as manifest_mod
from ..cache.layout import CACHE_DIR_ENV, user_root
from ..cache.local import (
    DEFAULT_LEASE_SECONDS,
    MAX_BYTES_ENV,
    WARM_FEWER,
    LocalCache,
    rank_entries,
)
from ..cache.reports import RankSlice, VerifyReport, WarmReport
from ..errors import CacheFull, InvalidArgument, SourceNotFound
from ..manifest import Manifest
from ..sharding import node_ranks
from ..units import SIZE_HELP, format_rate
from ..volumes import VOLUMES_ROOT_ENV, FileEntry, Volume, resolve
from .args import size_flag
from .output import (
    SKIP_UNREADABLE_META,
    Group,
    emit,
    err,
    fail_found,
    format_bytes,
    json_option,
    read_source,
    source_options,
    table,
)
from .progress import Counting, progress_bar
from .scope import NPROC_HELP, scope_of, shuffle_scope_option

CONTEXT = {"help_option_names": ["-h", "--help"]}
EXAMPLES = 10


def _is_volumes(source: str) -> bool:
    return source == "/Volumes" or source.startswith("/Volumes/")


@contextmanager
def _listing(source: str | None) -> Iterator[None]:
    """Say what was done when Ctrl-C or SIGTERM stops a listing (nothing yet)."""
    try:
        yield
    except KeyboardInterrupt:
        what = f"listing {source}" if source is not None else "reading the manifest"
        err.print(f"stopped while {what}: nothing written or copied", markup=False)
        raise


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


def _n(count: int, noun: str, plural: str = "") -> str:
    """``1 file``, ``2 files``: a count with its noun in the right number."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def _ranks(rank: int | None, node_rank: int | None, nproc_per_node: int | None,
           world_size: int | None, num_workers: int | None) -> list[int] | None:
    """Which ranks this warm covers, or None for the whole source."""
    if rank is None and node_rank is None:
        if world_size is not None or num_workers is not None or nproc_per_node is not None:
            raise InvalidArgument("--world-size/--num-workers/--nproc-per-node need --rank "
                                  "or --node-rank")
        return None
    if rank is not None and node_rank is not None:
        raise InvalidArgument("give --rank or --node-rank, not both")
    if world_size is None or num_workers is None:
        raise InvalidArgument("--rank and --node-rank need --world-size and --num-workers",
                              hint="e.g. --rank 3 --world-size 8 --num-workers 6")
    if rank is not None:
        return [rank]
    if nproc_per_node is None:
        raise InvalidArgument("--node-rank needs --nproc-per-node P (ranks per node)")
    assert node_rank is not None
    return node_ranks(node_rank, nproc_per_node, world_size)


@click.group("cache", cls=Group, context_settings=CONTEXT)
def command() -> None:
    """Copy a volume into this node's local cache, lazily or up front, and manage it.

    The cache lives in $UCSTAGE_CACHE_DIR (default /tmp/ucstage-<uid>), one
    folder per source, mirroring the source's paths. See docs/cache.md.

    \b
    Example:
      ucstage cache warm /Volumes/main/ml/train/images --jobs 16
    """


@command.command("warm", context_settings=CONTEXT)
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
@json_option
def warm(source: str | None, manifest_path: str | None, include: tuple[str, ...],
         exclude: tuple[str, ...], include_hidden: bool, jobs: int | str, max_bytes: str | None,
         rank: int | None, node_rank: int | None, nproc_per_node: int | None,
         world_size: int | None, num_workers: int | None, shuffle: bool, seed: int | None,
         epoch: int | None, shuffle_scope: str | None, as_json: bool) -> None:
    """Copy SOURCE's files into the local cache now, in parallel; files already
    cached and unchanged are skipped, so a rerun resumes.

    With --rank (or --node-rank), warm only the files those ranks' DataLoader
    workers read under the slot rule, the same files `shard-plan` prints. With
    --shuffle under the default node scope, that is the whole share of their
    node, which serves every epoch (the whole source when the job is one node,
    i.e. without --nproc-per-node); it is checked against --max-bytes and the
    free disk before anything is copied.
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
    """
    ranks = _ranks(rank, node_rank, nproc_per_node, world_size, num_workers)
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
    share = shuffle and scope == "node"
    if share and epoch is not None:
        err.print("note: --epoch is ignored under the node shuffle scope: the node's share "
                  "is the same every epoch, so it is warmed whole", markup=False)
    cap = size_flag(max_bytes, "--max-bytes")
    cache = LocalCache(max_bytes=cap)  # before listing: a bad setting fails fast
    with _listing(source):
        m = read_source(source, manifest_path, include, exclude, include_hidden)
    volume = m.volume()
    entries = list(m.entries)
    rank_slice: RankSlice | None = None
    if ranks is not None:
        assert world_size is not None and num_workers is not None
        entries = rank_entries(entries, ranks=ranks, world_size=world_size,
                               num_workers=num_workers, shuffle=shuffle, seed=seed or 0,
                               epoch=epoch or 0, shuffle_scope=scope,
                               nproc_per_node=nproc_per_node)
        per_node = nproc_per_node or world_size
        nodes = sorted({r // per_node for r in ranks}) if share else None
        rank_slice = RankSlice(ranks, world_size, num_workers, shuffle, seed or 0, epoch or 0,
                               scope, nproc_per_node, nodes)
        if nodes is not None:
            err.print(f"warming {_share_text(nodes, per_node, world_size)}: "
                      f"{_n(len(entries), 'file')} ({format_bytes(sum(e.size for e in entries))}"
                      "), the same files every epoch", markup=False)
    callback: Counting | None = None
    try:
        with progress_bar(not as_json, "warming") as callback:
            report = cache.warm(volume, entries, jobs=jobs, callback=callback)
    except CacheFull as exc:
        if exc.hint.endswith(WARM_FEWER):
            exc.hint += " (--include, --rank)"  # the flags that choose fewer files
        if rank_slice is not None and rank_slice.nodes is not None:
            # Nothing was copied when the up-front check refuses: say what did not fit.
            exc.message = (f"{_share_text(rank_slice.nodes, nproc_per_node or world_size or 1, world_size or 1)}"
                           f" does not fit: {exc.message}")
            exc.hint = ("the node reads these files every epoch; give it a cache that holds "
                        "them (raise --max-bytes, a larger disk) or run on more nodes; "
                        "--shuffle-scope global needs one epoch's slice but fetches again "
                        "every epoch")
        raise
    except KeyboardInterrupt:
        err.print(_stopped(callback, entries), markup=False)
        raise
    data = report.to_json(rank_slice=rank_slice, refused=m.refused, unreadable=m.unreadable)
    emit(data, as_json, lambda console: _warm_summary(console, report, ranks, cache.max_bytes,
                                                      rank_slice))
    if report.failed:
        names = ", ".join(p for p, _ in report.failed[:3])
        fail_found(f"{len(report.failed):,} of {_n(report.files, 'file')} failed: "
                   f"{names}" + (" …" if len(report.failed) > 3 else ""), _failed_hint(report))


def _share_text(nodes: list[int], per_node: int, world_size: int) -> str:
    """``node 1's whole share (ranks 8..15)``."""
    if per_node >= world_size:
        return "the whole share of the job's one node (every file)"
    ranks = ", ".join(f"{n * per_node}..{(n + 1) * per_node - 1}" for n in nodes)
    which = f"node {nodes[0]}'s" if len(nodes) == 1 else \
        "nodes " + ", ".join(str(n) for n in nodes) + "'"
    return f"{which} whole share (ranks {ranks})"


def _stopped(callback: Counting | None, entries: Sequence[FileEntry]) -> str:
    """What an interrupted warm did: ``stopped: 120 of 2,000 files copied ...``."""
    done = callback.statuses if callback is not None else {}
    copied, cached, failed = (done.get(k, 0) for k in ("fetched", "cached", "failed"))
    left = len(entries) - copied - cached - failed
    now = callback.bytes_done if callback is not None else 0
    return (f"stopped: {copied:,} of {_n(len(entries), 'file')} copied"
            + (f", {cached:,} already cached" if cached else "")
            + (f", {failed:,} failed" if failed else "")
            + f", {left:,} not copied; {format_bytes(now)} of "
              f"{format_bytes(sum(e.size for e in entries))} now cached; rerun to copy the rest")


def _warm_summary(console: Console, report: WarmReport, ranks: list[int] | None,
                  cap: int | None, rank_slice: RankSlice | None = None) -> None:
    rate = (f", {format_rate(report.fetched_bytes / report.seconds)}"
            if report.fetched_bytes and report.seconds else "")
    who = f" for ranks {ranks[0]}..{ranks[-1]}" if ranks and len(ranks) > 1 else (
        f" for rank {ranks[0]}" if ranks else "")
    if rank_slice is not None and rank_slice.nodes is not None:
        who = (" for " + _share_text(rank_slice.nodes,
                                     rank_slice.nproc_per_node or rank_slice.world_size,
                                     rank_slice.world_size)
               + ", which serves every epoch")
    console.print(
        f"[bold]Warmed[/] {_n(report.files, 'file')} ({format_bytes(report.bytes)}){who} in "
        f"{report.seconds:.1f} s: fetched {report.fetched:,} "
        f"({format_bytes(report.fetched_bytes)}{rate}), already cached "
        f"{report.already_cached:,}, failed {len(report.failed):,}")
    console.print(f"cache folder: {report.namespace}", markup=False)
    if report.fetched:
        how = "settled on by --jobs auto" if report.jobs_auto else "--jobs"
        console.print(f"engine: {report.engine}, {report.jobs} copies in flight ({how})",
                      markup=False)
    # The one place failed files are listed for people (the progress display
    # only counts them), so each shows once.
    for path, reason in report.failed[:EXAMPLES]:
        console.print(f"  [red]failed[/] {escape(path)}: {escape(reason)}", markup=True)
    if len(report.failed) > EXAMPLES:
        console.print(f"  … and {len(report.failed) - EXAMPLES:,} more (--json lists all)")
    if report.evicted:
        under = f" to stay under the cap of {format_bytes(cap)}" if cap else ""
        console.print(f"[yellow]evicted[/] {_n(report.evicted_files, 'cached file')} "
                      f"({format_bytes(report.evicted_bytes)}){escape(under)}:", markup=True)
        for e in report.evicted:
            mine = " (this source)" if e.namespace == os.path.basename(report.namespace) else ""
            console.print(f"  {e.source or e.namespace}{mine}: {_n(e.files, 'file')} "
                          f"({format_bytes(e.bytes)})", markup=False)


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


@command.command("lazy", context_settings=CONTEXT)
@source_options
@click.option("-o", "--output", metavar="FILE", default=None,
              help="Where to write the manifest (default <cache>/<namespace>.manifest.arrow, "
                   "or .manifest.json with --format json). Written columnar (Arrow) "
                   "whatever its name, unless --format json or a name ending in .json "
                   "asks for JSON.")
@click.option("--format", "fmt", type=click.Choice(["arrow", "json"]), default=None,
              help="Manifest format: arrow (columnar, memory-mapped by every process; the "
                   "default, also with -o) or json (for people and scripts; also chosen "
                   "by an -o name ending in .json).")
@json_option
def lazy(source: str | None, manifest_path: str | None, include: tuple[str, ...],
         exclude: tuple[str, ...], include_hidden: bool, output: str | None, fmt: str | None,
         as_json: bool) -> None:
    """Freeze SOURCE's listing into a manifest and prepare its cache folder
    without copying anything; training code then fetches each file on first
    read. Prints how to use it, with every environment variable the training
    job needs to find the same files and the same cache.

    \b
    Example:
      ucstage cache lazy /Volumes/main/ml/train/images
    """
    cache = LocalCache()  # before listing: a bad setting fails fast
    with _listing(source):
        m = read_source(source, manifest_path, include, exclude, include_hidden)
    volume = m.volume()
    ns_dir = cache.prepare(volume)
    # Columnar by default: every DataLoader process of the job maps one copy.
    # Only --format json or an -o name ending in .json asks for JSON (the
    # library's save() goes by the name alone, .arrow or not).
    if fmt is None:
        fmt = "json" if output and output.lower().endswith(".json") else "arrow"
    default = f"{ns_dir}{'.manifest.json' if fmt == 'json' else manifest_mod.ARROW_SUFFIX}"
    path = os.path.abspath(manifest_mod.save(m, output or default, format=fmt))
    env = _job_env(m, cache)
    data = {"source": m.source, "manifest": path, "fingerprint": m.fingerprint,
            "files": len(m.entries), "bytes": m.total_bytes, "cache_dir": cache.root,
            "namespace": ns_dir, "env": env}

    def human(console: Console) -> None:
        console.print(f"[bold]Manifest[/] {escape(path)}: {_n(len(m.entries), 'file')} "
                      f"({format_bytes(m.total_bytes)}), fingerprint {m.fingerprint[:12]}")
        console.print(f"cache folder: {ns_dir} (files are copied there on first read)",
                      markup=False)
        console.print("\nIn the training job (same node, same user):", markup=False)
        for name, value in env.items():
            console.print(f"  export {name}={shlex.quote(value)}", markup=False)
        if "://" in volume.url and not volume.url.startswith("file://"):
            scheme = volume.url.split("://", 1)[0]
            console.print(f"  # and the credentials and endpoint settings this shell uses "
                          f"for {scheme}://", markup=False)
        console.print("  from ucstage import VolumeDataset\n"
                      f"  paths = VolumeDataset({data['manifest']!r})"
                      "   # local paths; each file is copied on first read",
                      markup=False)

    emit(data, as_json, human)


def _job_env(m: Manifest, cache: LocalCache) -> dict[str, str]:
    """The variables a training job needs to read ``m`` through ``cache``: the
    ones this process used that differ from the defaults."""
    env = {}
    root = os.environ.get(VOLUMES_ROOT_ENV, "")
    if _is_volumes(m.source) and root:
        env[VOLUMES_ROOT_ENV] = root  # the manifest names /Volumes/...; this maps it
    if cache.root != user_root():
        env[CACHE_DIR_ENV] = cache.root
    if os.environ.get(MAX_BYTES_ENV, "").strip():
        env[MAX_BYTES_ENV] = os.environ[MAX_BYTES_ENV].strip()
    return env


def _volumes_opt(cache: LocalCache, source: str | None) -> list[Volume] | None:
    """The cached volumes SOURCE names, or None for every source.

    Found as the cache recorded them (:meth:`LocalCache.find`): a source that
    is gone still names its namespace (clearing the cache of a deleted volume
    works), and a ``/Volumes/...`` path is found whatever
    $UCSTAGE_VOLUMES_ROOT says now. One that neither exists nor has anything
    cached is most likely a typo and is refused.
    """
    if source is None:
        return None
    if manifest_mod.is_manifest_file(source):
        source = manifest_mod.load(source).source
    found = cache.find(source)
    if found:
        return found
    try:
        return [resolve(source)]
    except SourceNotFound as exc:
        raise SourceNotFound(f"nothing cached for {source} (and {source} does not exist)",
                             hint="`ucstage cache status` lists the cached sources") from exc


@command.command("status", context_settings=CONTEXT)
@click.argument("source", required=False, metavar="[SOURCE]")
@json_option
def status(source: str | None, as_json: bool) -> None:
    """Entries and bytes cached per source (one, or all), the cap and free disk,
    and the hits, misses and evictions of the last training run.

    \b
    Example:
      ucstage cache status
    """
    cache = LocalCache()
    st = cache.status(_volumes_opt(cache, source))
    data = st.to_json()

    def human(console: Console) -> None:
        cap = format_bytes(st.max_bytes) if st.max_bytes else "none"
        scope = f" ({escape(source)} only)" if source is not None else ""
        console.print(f"[bold]Cache[/] {escape(st.root)}{scope}: {_n(st.entries, 'file')}, "
                      f"{format_bytes(st.bytes)}; cap {cap}; {format_bytes(st.free_bytes)} "
                      "free on disk")
        if st.namespaces:
            t = table("source", "files", "bytes", "partial")
            t.columns[0].overflow = "fold"  # a path is more use whole than cut
            for n in st.namespaces:
                t.add_row(escape(n.source or "?"), f"{n.entries:,}", format_bytes(n.bytes),
                          str(n.partial_files))
            console.print(t)
            for n in st.namespaces:
                console.print(f"  {n.source or '?'} -> {n.path}", markup=False)
        run = st.last_run
        if run is not None:
            rate = f"{run.hit_rate:.0%}" if run.hit_rate is not None else "-"
            console.print(
                f"Last run {run.run} ({data['last_run']['updated']}): "
                f"{run.hits:,} hits ({format_bytes(run.hit_bytes)}), "
                f"{run.misses:,} misses ({format_bytes(run.miss_bytes)}), hit rate {rate}; "
                f"{run.evictions:,} evictions ({format_bytes(run.evicted_bytes)}); "
                f"waited {run.wait_s:.1f} s for room", markup=False)

    emit(data, as_json, human)


def _optional_source(cmd: click.Command) -> click.Command:
    """Show SOURCE as optional in the usage line (the shared options say SOURCE)."""
    for param in cmd.params:
        if isinstance(param, click.Argument) and param.name == "source":
            param.metavar = "[SOURCE]"
    return cmd


def _verify_failure(report: VerifyReport, from_manifest: bool, source: str | None) -> str:
    """The closing error line of verify: what was found, what was done, what to run."""
    stale, corrupt, removed = len(report.stale), len(report.corrupt), len(report.removed)
    parts = []
    if stale:
        parts.append(f"{_n(stale, 'cached file')} {'is' if stale == 1 else 'are'} stale "
                     "(the source changed)")
    if corrupt:
        kept = corrupt - removed
        parts.append(f"{_n(corrupt, 'cached file')} {'was' if corrupt == 1 else 'were'} corrupt"
                     + (" and removed" if not kept else f" ({removed:,} removed)"))
    target = source if source is not None and not from_manifest else "SOURCE"
    if stale and from_manifest:
        todo = (f"the manifest predates the change: `ucstage cache warm {target}` "
                "(listing the source afresh) refreshes them")
    else:
        todo = f"`ucstage cache warm {target}` refetches them"
    return "; ".join(parts) + "; " + todo


@_optional_source
@command.command("verify", context_settings=CONTEXT)
@source_options
@click.option("--checksum", is_flag=True,
              help="Also compare every cached file's bytes with the source (reads both).")
@json_option
def verify(source: str | None, manifest_path: str | None, include: tuple[str, ...],
           exclude: tuple[str, ...], include_hidden: bool, checksum: bool,
           as_json: bool) -> None:
    """Check cached files against SOURCE (or every cached source): exit 1 and
    list them when any are stale (the source changed) or corrupt. Corrupt
    copies are deleted, so they are never served again; `cache warm` then
    copies them afresh.

    \b
    Examples:
      ucstage cache verify /Volumes/main/ml/train/images --checksum
      ucstage cache verify
    """
    cache = LocalCache()
    found = (cache.find(source) if source is not None and manifest_path is None
             and not manifest_mod.is_manifest_file(source) else [])
    if source is None and manifest_path is None:
        ctx = click.get_current_context()
        if ctx.meta.get(SKIP_UNREADABLE_META):
            # Skipping would make verify pass over folders it never looked at.
            raise click.UsageError("--skip-unreadable needs a SOURCE: without one, verify "
                                   "re-lists every cached source in full")
        report = cache.verify(checksum=checksum)  # every cached source
    elif found:
        # Check what the cache holds for SOURCE against where it was cached
        # from: a /Volumes path may map elsewhere now.
        report = VerifyReport([], checksum)
        for volume in found:
            m = read_source(volume.url, None, include, exclude, include_hidden)
            label = volume.source if _is_volumes(volume.source) else m.source
            checked = cache.verify(dataclasses.replace(m.volume(), source=label), m.entries,
                                   checksum=checksum)
            report.sources.extend(checked.sources)
    else:
        m = read_source(source, manifest_path, include, exclude, include_hidden)
        report = cache.verify(m.volume(), m.entries, checksum=checksum)
    data = report.to_json()

    def human(console: Console) -> None:
        for r in report.sources:
            console.print(f"[bold]{escape(r.source)}[/]: {r.checked:,} checked, {r.ok:,} ok, "
                          f"{r.missing:,} not cached, {len(r.stale):,} stale, "
                          f"{len(r.corrupt):,} corrupt")
            removed = set(r.removed)
            for kind, found in (("stale", r.stale), ("corrupt", r.corrupt)):
                for path, reason in found[:EXAMPLES]:
                    note = "; removed" if kind == "corrupt" and path in removed else ""
                    console.print(f"  [red]{kind}[/] {escape(path)}: {escape(reason)}{note}",
                                  markup=True)
                if len(found) > EXAMPLES:
                    console.print(f"  … {len(found) - EXAMPLES:,} more (--json lists all)")
        if not report.sources:
            console.print("nothing cached")

    emit(data, as_json, human)
    if not report.clean:
        from_manifest = manifest_path is not None or (
            source is not None and manifest_mod.is_manifest_file(source))
        fail_found(_verify_failure(report, from_manifest, source))


@command.command("clear", context_settings=CONTEXT)
@click.argument("source", required=False, metavar="[SOURCE]")
@click.option("-y", "--yes", is_flag=True,
              help="Clear every source without asking. Without SOURCE, clear asks first "
                   "when run on a terminal; a script (stdin not a terminal) is never asked.")
@json_option
def clear(source: str | None, yes: bool, as_json: bool) -> None:
    """Delete the cached files of SOURCE, or of every source (asking first on a
    terminal), with their lock files. Processes that already opened a file
    keep reading it.

    \b
    Examples:
      ucstage cache clear s3://bucket/train
      ucstage cache clear --yes
    """
    cache = LocalCache()
    if source is None and not yes and sys.stdin.isatty() and not _confirm_clear_all(cache):
        emit({"namespaces": [], "files": 0, "bytes": 0}, as_json,
             lambda c: c.print("nothing removed", markup=False))
        return
    r = cache.clear(_volumes_opt(cache, source))
    data = r.to_json()
    emit(data, as_json, lambda c: c.print(
        f"removed {_n(r.files, 'file')} ({format_bytes(r.bytes)}) from "
        f"{_n(len(r.namespaces), 'cached source')}", markup=False))


def _confirm_clear_all(cache: LocalCache) -> bool:
    """Ask on the terminal before clearing every source; True to go ahead.
    An empty cache needs no question."""
    st = cache.status()
    if not st.namespaces:
        return True
    try:
        answer = err.input(
            f"Remove {_n(st.entries, 'cached file')} ({format_bytes(st.bytes)}) of "
            f"{_n(len(st.namespaces), 'source')} from {st.root}? [y/N] ", markup=False)
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


@command.command("prune", context_settings=CONTEXT)
@click.option("--max-bytes", metavar="SIZE", required=True,
              help="Evict files (least recently used first; files a training job consumed, "
                   "most recently consumed first) until the cache holds at most SIZE; "
                   f"{SIZE_HELP}.")
@click.option("--lease", "lease", type=click.FloatRange(0), default=DEFAULT_LEASE_SECONDS,
              show_default=True,
              metavar="SECONDS", help="Keep files handed to a reader within this many seconds.")
@json_option
def prune(max_bytes: str, lease: float, as_json: bool) -> None:
    """Evict files down to a byte cap (the cap's eviction order, docs/cache.md).
    Files handed to a reader within --lease seconds, and files a running
    training job holds, stay; exits 1 if they keep the cache above SIZE.

    \b
    Example:
      ucstage cache prune --max-bytes 20G
    """
    cap = size_flag(max_bytes, "--max-bytes")
    assert cap is not None  # the option is required
    r = LocalCache(lease_seconds=lease).prune(cap)
    data = r.to_json()

    def human(console: Console) -> None:
        console.print(f"removed {_n(r.files_removed, 'file')} ({format_bytes(r.bytes_removed)}); "
                      f"cache holds {format_bytes(r.bytes_after)} (cap {format_bytes(cap)})")

    emit(data, as_json, human)
    if r.bytes_after > cap:
        fail_found(
            f"{format_bytes(r.bytes_after)} remain above {format_bytes(cap)}: "
            f"{format_bytes(r.bytes_in_use)} were handed to readers in the last {lease:g} s "
            "or are held by a running training job (a freshly copied file counts as just "
            "used)",
            "`--lease 0` evicts them anyway, if no job is reading from the cache now")
