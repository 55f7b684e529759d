"""``ucstage checkpoint``: list, verify and prune the checkpoints
``ucstage.checkpoint.Writer`` saves. Each subcommand parses, calls one
library function (:mod:`ucstage.checkpoint.retention`,
:mod:`ucstage.checkpoint.folder`) and renders. None imports torch, but
``verify`` of a plain torch checkpoint (its ``.metadata`` is torch's pickle)."""

from __future__ import annotations

import time

import click
from rich.console import Console

from ..checkpoint.folder import Checkpoint, verify
from ..checkpoint.retention import (
    STALE_SECONDS,
    UnfinishedUpload,
    list_checkpoints,
    prune,
    unfinished_uploads,
)
from .bars import progress_bar
from .output import (
    CONTEXT,
    Group,
    counted,
    emit,
    escape,
    fail_found,
    format_bytes,
    json_option,
    table,
)


def _age(seconds: float) -> str:
    """``42 s``, ``5 min``, ``3.2 h``, ``4.0 d``: how long ago, in one unit."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _rows(console: Console, found: list[Checkpoint], now: float) -> None:
    t = table("checkpoint", "state", "ranks", "files", "size", "age")
    for c in found:
        state = "[yellow]incomplete[/]" if not c.complete else \
            "complete (plain torch)" if c.saved_by == "torch" else "complete"
        t.add_row(escape(c.name), state, str(c.ranks), f"{len(c.files):,}",
                  format_bytes(c.bytes), _age(max(0.0, now - c.saved_at)))
    console.print(t)


def _uploads(console: Console, uploads: list[UnfinishedUpload], now: float) -> None:
    stale = sum(u.stale(now) for u in uploads)
    if uploads:
        console.print(f"{counted(len(uploads), 'unfinished multipart upload')} "
                      f"({stale:,} idle for {_age(STALE_SECONDS)} or more: a killed save's; "
                      "`ucstage checkpoint prune` or the next save aborts them)")


@click.group("checkpoint", cls=Group, context_settings=CONTEXT)
def command() -> None:
    """List, verify and prune the torch.distributed.checkpoint folders that
    ucstage.checkpoint.Writer saves (a local folder, a /Volumes/... path, or
    an s3://, gs://, az:// prefix).
    A checkpoint is complete once its .metadata is written (last); one
    without it is incomplete and never loaded. See docs/training.md.

    \b
    Example:
      ucstage checkpoint list /Volumes/main/ml/ckpt
    """


@command.command("list", context_settings=CONTEXT)
@click.argument("path")
@json_option
def list_command(path: str, as_json: bool) -> None:
    """The checkpoints in PATH (or PATH itself when it is one), oldest first:
    complete or incomplete, ranks, files, size and age; on S3, also the
    multipart uploads under PATH never finished (a killed save's).

    \b
    Example:
      ucstage checkpoint list /Volumes/main/ml/ckpt --json
    """
    found = list_checkpoints(path)
    uploads = unfinished_uploads(path)
    now = time.time()
    data = {"path": path, "checkpoints": [c.to_json(now) for c in found],
            "unfinished_uploads": [u.to_json(now) for u in uploads]}

    def human(console: Console) -> None:
        if not found:
            console.print(f"no checkpoints in {escape(path)}")
        else:
            _rows(console, found, now)
            incomplete = sum(not c.complete for c in found)
            complete = len(found) - incomplete
            console.print(f"{counted(complete, 'complete checkpoint')}, {incomplete:,} "
                          "incomplete (never loaded)" if incomplete
                          else counted(complete, "complete checkpoint"))
        _uploads(console, uploads, now)

    emit(data, as_json, human)


@command.command("verify", context_settings=CONTEXT)
@click.argument("path")
@json_option
def verify_command(path: str, as_json: bool) -> None:
    """Check every file of the checkpoint PATH against the record its save
    wrote: present, of its size, its bytes of its checksum (each file is
    read whole). Exit 1 when any is not, or when PATH is incomplete.
    A plain torch checkpoint (no record) is checked against its .metadata:
    each file present and long enough for the byte ranges it indexes (no
    checksums were recorded, so its bytes are not checked).

    \b
    Example:
      ucstage checkpoint verify /Volumes/main/ml/ckpt/step-000200
    """
    with progress_bar(not as_json, "verify") as bar:
        report = verify(path, bar)
    data = report.to_json()

    def human(console: Console) -> None:
        ckpt = report.checkpoint
        state = "complete" if ckpt.complete else "incomplete"
        console.print(f"[bold]{escape(ckpt.path)}[/]: {state}, {counted(ckpt.ranks, 'rank')}, "
                      f"{counted(len(report.files), 'file')} checked, "
                      f"{sum(c.status == 'ok' for c in report.files):,} ok")
        for c in report.files:
            if c.status == "missing":
                console.print(f"  [red]missing[/] {escape(c.name)} (rank {c.rank})")
            elif c.status == "size":
                console.print(f"  [red]size[/] {escape(c.name)} (rank {c.rank}): "
                              f"{c.size or 0:,} bytes, recorded {c.expected_size:,}")
            elif c.status == "short":
                console.print(f"  [red]short[/] {escape(c.name)} (rank {c.rank}): "
                              f"{c.size or 0:,} bytes, its .metadata indexes "
                              f"{c.expected_size:,}")
            elif c.status == "checksum":
                console.print(f"  [red]checksum[/] {escape(c.name)} (rank {c.rank}): its bytes "
                              "differ from the record's checksum")
        if ckpt.saved_by == "torch":
            console.print("  a plain torch checkpoint (no .ucstage-checkpoint.json): each file "
                          "its .metadata indexes was checked present and long enough for its "
                          "byte ranges; its bytes were not checked (no checksums recorded)")

    emit(data, as_json, human)
    if not report.ok:
        fail_found(f"checkpoint {path} does not verify: {report.problem}",
                   "load an earlier complete checkpoint (`ucstage checkpoint list` shows them)")


@command.command("prune", context_settings=CONTEXT)
@click.argument("path")
@click.option("--keep", type=click.IntRange(min=1), required=True, metavar="N",
              help="Keep the N newest complete checkpoints (1 or more); remove the older "
                   "complete ones. Incomplete checkpoints are never removed.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@json_option
def prune_command(path: str, keep: int, dry_run: bool, as_json: bool) -> None:
    """Remove the complete checkpoints in PATH older than its N newest complete
    ones (by when each was published). The newest complete one is always
    kept; incomplete ones are never removed (a job may be writing them).
    On S3, also abort the multipart uploads under PATH idle for an hour (a
    rank killed mid-upload left them; S3 bills their parts).

    \b
    Examples:
      ucstage checkpoint prune /Volumes/main/ml/ckpt --keep 3 --dry-run
      ucstage checkpoint prune /Volumes/main/ml/ckpt --keep 3
    """
    report = prune(path, keep, dry_run=dry_run)
    now = time.time()

    def human(console: Console) -> None:
        verb = "would remove" if dry_run else "removed"
        for c in report.removed:
            console.print(f"{verb} {escape(c.name)} ({format_bytes(c.bytes)}, "
                          f"{_age(max(0.0, now - c.saved_at))} old)")
        for where, names in report.left.items():
            console.print(f"  left in {escape(where)}: {escape(', '.join(names))} "
                          "(not written by ucstage)")
        for u in report.aborted:
            console.print(f"{'would abort' if dry_run else 'aborted'} the unfinished upload of "
                          f"{escape(u.path)} (idle {_age(max(0.0, now - u.last_active))})")
        console.print(f"{verb} {counted(len(report.removed), 'checkpoint')} "
                      f"({format_bytes(sum(c.bytes for c in report.removed))}); kept "
                      f"{len(report.kept):,} complete and {len(report.incomplete):,} incomplete")

    emit(report.to_json(now), as_json, human)
