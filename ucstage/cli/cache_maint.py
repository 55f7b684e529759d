"""``ucstage cache status``, ``verify``, ``clear`` and ``prune``: each parses,
calls one library function (a :class:`ucstage.cache.LocalCache` method, or
:func:`ucstage.cache.warm.verify_source`) and renders; the JSON shapes are
docs/json-cache.md's."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from ..cache.local import DEFAULT_LEASE_SECONDS, LocalCache
from ..cache.reports import SourceCheck, VerifyReport
from ..cache.warm import cached_volumes, unusable_status, verify_source
from ..errors import CacheUnusable
from ..shown import shown
from ..units import SIZE_HELP
from .args import Seconds, size_flag
from .output import (
    CONTEXT,
    counted,
    emit,
    err,
    escape,
    fail_found,
    format_bytes,
    json_option,
    print_error,
    refuse_filters_of_frozen,
    skip_unreadable_given,
    source_of,
    source_options,
    table,
    warn_skipped,
)

EXAMPLES = 10


@click.command("status", context_settings=CONTEXT)
@click.argument("source", required=False, metavar="[SOURCE]")
@json_option
def status(source: str | None, as_json: bool) -> None:
    """Entries and bytes cached per source (one, or all), the cap and free disk,
    and the hits, misses and evictions of the last training run.

    \b
    Example:
      ucstage cache status
    """
    problem: CacheUnusable | None = None
    try:
        cache = LocalCache()
    except CacheUnusable as exc:
        # Say what the root holds anyway (read without writing), then why it is unusable.
        problem, st = exc, unusable_status(exc, source)
    else:
        st = cache.status(cached_volumes(cache, source))
    data = st.to_json()

    def human(console: Console) -> None:
        cap = format_bytes(st.max_bytes) if st.max_bytes else "none"
        scope = f" ({escape(source)} only)" if source is not None else ""
        console.print(f"[bold]Cache[/] {escape(st.root)}{scope}: {counted(st.entries, 'file')}, "
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
                console.print(f"  {shown(n.source or '?')} -> {shown(n.path)}", markup=False)
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
    if problem is not None:
        print_error(problem.message, problem.hint)
        sys.exit(problem.exit_code)


def _optional_source(cmd: click.Command) -> click.Command:
    """Show SOURCE as optional in the usage line (the shared options say SOURCE)."""
    for param in cmd.params:
        if isinstance(param, click.Argument) and param.name == "source":
            param.metavar = "[SOURCE]"
    return cmd


def _verify_failure(report: VerifyReport, from_manifest: bool, source: str | None) -> tuple[str, str]:
    """The closing error line of verify (what was found, what was done, what
    to run) and its hint."""
    stale, corrupt, removed = len(report.stale), len(report.corrupt), len(report.removed)
    parts = []
    if stale:
        parts.append(f"{counted(stale, 'cached file')} {'is' if stale == 1 else 'are'} stale "
                     "(the source changed)")
    if corrupt:
        kept = corrupt - removed
        were = "was" if corrupt == 1 else "were"
        parts.append(f"{counted(corrupt, 'cached file')} {were} corrupt"
                     + (" and removed" if not kept else f" ({removed:,} removed)"))
    target = source if source is not None and not from_manifest else "SOURCE"
    todo = ""
    if stale and from_manifest:
        todo = (f"the manifest predates the change: `ucstage cache warm {target}` "
                "(listing the source afresh) refreshes them")
    elif stale or corrupt:
        todo = f"`ucstage cache warm {target}` refetches them"
    hint = ""
    gone = report.vanished
    if gone:
        parts.append(f"{counted(len(gone), 'cached source')} no longer "
                     f"{'exists' if len(gone) == 1 else 'exist'}: {', '.join(gone)}")
        shown = gone[0] if len(gone) == 1 else "SOURCE"
        hint = (f"if it is gone for good, `ucstage cache clear {shown}` removes its copies; "
                "if it is only unreachable (a mount, a network), reach it and verify again")
    return "; ".join(parts) + ("; " + todo if todo else ""), hint


def _verify_line(r: SourceCheck) -> str:
    """One source's counts, whole files and row-group copies apart."""
    if r.vanished:
        return f"[bold]{escape(r.source)}[/]: [yellow]gone[/] ({escape(r.vanished)})"
    line = f"[bold]{escape(r.source)}[/]: {counted(r.checked, 'file')} checked, {r.ok:,} ok, " \
           f"{r.missing:,} not cached"
    if r.ranges_checked:
        line += f"; {counted(r.ranges_checked, 'row-group copy', 'row-group copies')} " \
                f"checked, {r.ranges_ok:,} ok"
    return line + f"; {len(r.stale):,} stale, {len(r.corrupt):,} corrupt"


@_optional_source
@click.command("verify", context_settings=CONTEXT)
@source_options
@click.option("--checksum", is_flag=True,
              help="Also compare every cached file's bytes with the source (reads both).")
@click.option("--fix", is_flag=True,
              help="Delete orphans: cached files whose source file is gone (a manifest "
                   "frozen before the deletion could still read them).")
@json_option
def verify(source: str | None, manifest_path: str | None, include: tuple[str, ...],
           exclude: tuple[str, ...], include_hidden: bool, checksum: bool, fix: bool,
           as_json: bool) -> None:
    """Check cached files against SOURCE (or every cached source): exit 1 and
    list them when any are stale (the source changed) or corrupt, or when a
    cached source no longer exists. Corrupt copies are deleted, so they are
    never served again; `cache warm` then copies them afresh. Orphans (cached
    files whose source file is gone) are listed; --fix deletes them.

    \b
    Examples:
      ucstage cache verify /Volumes/main/ml/train/images --checksum
      ucstage cache verify --fix
    """
    cache = LocalCache()
    opened = None if source is None and manifest_path is None else source_of(source, manifest_path)
    skip_unreadable = skip_unreadable_given()
    if opened is None and skip_unreadable:
        # Skipping would make verify pass over folders it never looked at.
        raise click.UsageError("--skip-unreadable needs a SOURCE: without one, verify "
                               "re-lists every cached source in full")
    if opened is not None:
        refuse_filters_of_frozen(opened, include, exclude, include_hidden, skip_unreadable)
    report = verify_source(cache, opened, checksum=checksum, include=include,
                           exclude=exclude, include_hidden=include_hidden,
                           skip_unreadable=skip_unreadable, listed=warn_skipped, fix=fix)
    data = report.to_json()

    def human(console: Console) -> None:
        for r in report.sources:
            console.print(_verify_line(r))
            removed = set(r.removed)
            for kind, found in (("stale", r.stale), ("corrupt", r.corrupt)):
                for path, reason in found[:EXAMPLES]:
                    note = "; removed" if kind == "corrupt" and path in removed else ""
                    console.print(f"  [red]{kind}[/] {escape(path)}: {escape(reason)}{note}",
                                  markup=True)
                if len(found) > EXAMPLES:
                    console.print(f"  … {len(found) - EXAMPLES:,} more (--json lists all)")
            if r.orphans:
                done = len(r.orphans_removed)
                what = f"{done:,} removed" if fix else "`ucstage cache verify --fix` removes them"
                console.print(f"  [yellow]{counted(len(r.orphans), 'orphan')}[/] (cached, "
                              f"the source file is gone; {what}): "
                              + escape(", ".join(r.orphans[:EXAMPLES]))
                              + (" …" if len(r.orphans) > EXAMPLES else ""))
        if not report.sources:
            console.print("nothing cached")

    emit(data, as_json, human)
    if not report.clean:
        from_manifest = opened is not None and opened.frozen
        fail_found(*_verify_failure(report, from_manifest, source))


@click.command("clear", context_settings=CONTEXT)
@click.argument("source", required=False, metavar="[SOURCE]")
@click.option("-y", "--yes", is_flag=True,
              help="Clear every source without asking. Without SOURCE, clear asks first "
                   "on a terminal, and a script (stdin not a terminal) must pass --yes: an "
                   "empty $VARIABLE as SOURCE must not clear everything.")
@json_option
def clear(source: str | None, yes: bool, as_json: bool) -> None:
    """Delete the cached files of SOURCE, or of every source (--yes, or asking
    first on a terminal), with their lock files. Processes that already
    opened a file keep reading it.

    \b
    Examples:
      ucstage cache clear s3://bucket/train
      ucstage cache clear --yes
    """
    if source is not None and yes:
        raise click.UsageError("--yes clears every source: give it or SOURCE, not both")
    cache = LocalCache()
    if source is None and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("no SOURCE given: pass --yes to clear every cached source "
                                   "(a script is never asked)")
        if not _confirm_clear_all(cache):
            emit({"namespaces": [], "files": 0, "bytes": 0}, as_json,
                 lambda c: c.print("nothing removed", markup=False))
            return
    r = cache.clear(cached_volumes(cache, source))
    data = r.to_json()
    emit(data, as_json, lambda c: c.print(
        f"removed {counted(r.files, 'file')} ({format_bytes(r.bytes)}) from "
        f"{counted(len(r.namespaces), 'cached source')}", markup=False))


def _confirm_clear_all(cache: LocalCache) -> bool:
    """Ask on the terminal before clearing every source; True to go ahead.
    An empty cache needs no question."""
    st = cache.status()
    if not st.namespaces:
        return True
    try:
        answer = err.input(
            f"Remove {counted(st.entries, 'cached file')} ({format_bytes(st.bytes)}) of "
            f"{counted(len(st.namespaces), 'source')} from {shown(st.root)}? [y/N] ", markup=False)
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


@click.command("prune", context_settings=CONTEXT)
@click.option("--max-bytes", metavar="SIZE", required=True,
              help="Evict files (least recently used first; files a training job consumed, "
                   "most recently consumed first) until the cache holds at most SIZE; "
                   f"{SIZE_HELP}.")
@click.option("--lease", "lease", type=Seconds(0), default=DEFAULT_LEASE_SECONDS,
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
        console.print(f"removed {counted(r.files_removed, 'file')} ({format_bytes(r.bytes_removed)}); "
                      f"cache holds {format_bytes(r.bytes_after)} (cap {format_bytes(cap)})")

    emit(data, as_json, human)
    if r.bytes_after > cap:
        fail_found(
            f"{format_bytes(r.bytes_after)} remain above {format_bytes(cap)}: "
            f"{format_bytes(r.bytes_in_use)} were handed to readers in the last {lease:g} s "
            "or are held by a running training job (a freshly copied file counts as just "
            "used)",
            "`--lease 0` evicts them anyway, if no job is reading from the cache now")
