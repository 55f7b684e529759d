"""``ucstage shard-plan``: which files each (rank, worker) slot reads.

Parses the options into a :class:`ucstage.planning.PlanRequest` (which checks
the rules between them), plans, and renders the result (cli/plan_render.py);
exit 1 when the plan has a problem."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from ..cache.local import MAX_BYTES_ENV
from ..errors import InvalidArgument
from ..planning import PlanRequest
from ..units import SIZE_HELP, format_bytes
from .args import (
    column_list,
    float_list,
    given,
    group_option,
    nproc_option,
    num_workers_list,
    row_group_options,
    shuffle_scope_option,
    size_flag,
)
from .output import (
    CONTEXT,
    emit,
    fail_found,
    json_option,
    read_source,
    shard_source,
    source_options,
    table_source,
)
from .plan_render import render_files, render_mix, render_resume, render_row_groups, render_slot
from .sample_render import render_samples

RENDERS: dict[str, Callable[[Console, Any], None]] = {
    "mix": render_mix, "row-group": render_row_groups, "sample": render_samples,
    "resume": render_resume, "slot": render_slot, "files": render_files}
"""The people's view of each mode's result."""


def _mix_options(command: Any) -> Any:
    """A mix's arguments: more SOURCEs, --weights, --repeat, --epoch-size."""
    options = [
        click.argument("more_sources", nargs=-1, metavar="[SOURCE2 ...]"),
        click.option("--weights", metavar="W1,W2,...", default=None,
                     help="Mix the SOURCEs by weight (each >= 0, sum > 0, normalised): print "
                          "per slot the items from each source and the passes each source "
                          "makes."),
        click.option("--repeat", metavar="R1,R2,...", default=None,
                     help="Mix the SOURCEs, each read R times its size per epoch (2.5, 0.1), "
                          "instead of --weights."),
        click.option("--epoch-size", type=int, default=None, metavar="N",
                     help="With --weights: items per mixed epoch (default: the largest "
                          "source's items / its weight, rounded up)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _parse_slot(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        rank, worker = (int(v) for v in value.split(":"))
    except ValueError as exc:
        raise InvalidArgument(f"--slot must be RANK:WORKER, e.g. 0:3, got {value!r}") from exc
    return rank, worker


def _floats(text: str | None, flag: str, example: str) -> tuple[float, ...] | None:
    return None if text is None else tuple(float_list(text, flag, example=example))


@click.command("shard-plan", context_settings=CONTEXT)
@source_options
@click.option("-w", "--world-size", type=int, required=True, help="Number of ranks (processes).")
@click.option("-k", "--num-workers", required=True, metavar="K|K0,K1,...",
              help="DataLoader workers per rank (0 = the main process reads). A comma list of "
                   "one value per rank simulates ranks that disagree.")
@click.option("--shuffle", is_flag=True, help="Plan the seeded per-epoch permutation.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Shuffle seed (needs --shuffle).")
@click.option("--epoch", type=int, default=0, show_default=True,
              help="Epoch: changes the permutation (needs --shuffle).")
@shuffle_scope_option
@nproc_option
@click.option("--epochs", type=click.IntRange(min=1), default=None, metavar="E",
              help="Also forecast the network over E epochs from --epoch: per epoch and "
                   "node, the files and bytes the node reads that it did not read in an "
                   "earlier epoch, for both shuffle scopes.")
@click.option("--max-bytes", metavar="SIZE", default=None,
              help="With --epochs: each node's cache cap, to check that the node's share "
                   f"fits. Default ${MAX_BYTES_ENV}, else not checked; {SIZE_HELP}.")
@click.option("-b", "--batch-size", type=int, default=None,
              help="Also count batches per rank, and warn when ranks get different counts.")
@click.option("--slot", "slot", metavar="RANK:WORKER", default=None,
              help="Print only this slot's files, one per line, in read order.")
@click.option("--resume", "resume", metavar="STATE.json", default=None,
              help="Plan the rest of an interrupted epoch from a saved loader state "
                   "(DataLoader.state_dict(), merged; or a JSON list of per-rank states): "
                   "the files each slot of -w x -k still reads. Shuffle, seed and epoch "
                   "come from the state.")
@group_option
@row_group_options
@_mix_options
@json_option
def shard_plan(
    source: str | None, manifest_path: str | None, include: tuple[str, ...],
    exclude: tuple[str, ...], include_hidden: bool, world_size: int, num_workers: str,
    shuffle: bool, seed: int, epoch: int, shuffle_scope: str | None,
    nproc_per_node: int | None, epochs: int | None, max_bytes: str | None,
    batch_size: int | None, slot: str | None, resume: str | None, group: str | None,
    unit: str, batch_rows: int | None, equal_length: str | None, columns: str | None,
    version: int | None, filter: str | None, format: str | None, block_samples: int | None,
    more_sources: tuple[str, ...], weights: str | None,
    repeat: str | None, epoch_size: int | None, as_json: bool,
) -> None:
    """Show which files each (rank, DataLoader worker) slot reads, and what a
    num_workers mismatch between ranks duplicates or skips.

    Slot s = rank * K + worker reads files s, s + W*K, s + 2*W*K, ... of the
    listing (or of its seeded permutation; with --shuffle and --nproc-per-node,
    under the default node scope, of the node's own files, dealt over the
    node's slots). Exits 1 when files would be read twice or never, when some
    slots would read no file (more slots than files), when ranks would get
    different batch counts, or when a node's share exceeds --max-bytes.

    With --unit row-group, SOURCE is a table (a Parquet folder, an export
    destination, a Delta table) and the slot rule deals its row groups, as
    TableDataset does: rows, row groups and bytes per slot, and each rank's
    rows and batches (--batch-rows, --equal-length).

    With --unit sample, SOURCE holds shard files (WebDataset tar, JSON Lines,
    text lines): each is fetched into the cache and indexed as ShardDataset
    does, and the plan prints each slot's shards and sample ranges.

    With --group key the plan deals samples (files sharing a name up to its
    first dot), as VolumeDataset(group="key") does. With several SOURCEs and
    --weights or --repeat it is a ucstage.Mix's: each source's share and
    passes, and per slot the items from each.

    \b
    Examples:
      ucstage shard-plan /Volumes/main/ml/train --world-size 8 --num-workers 6
      ucstage shard-plan data/ -w 4 -k 6,6,4,6 --batch-size 32
      ucstage shard-plan manifest.json -w 2 -k 2 --slot 1:0
      ucstage shard-plan data/ -w 16 -k 4 --nproc-per-node 8 --shuffle --epochs 3
      ucstage shard-plan manifest.json -w 3 -k 1 --resume state.json
      ucstage shard-plan /Volumes/main/ml/train/events --unit row-group -w 2 -k 4 --batch-rows 4096
      ucstage shard-plan events/ --unit row-group -w 2 -k 4 --filter "day >= '2024-06-01'"
      ucstage shard-plan data/a data/b -w 2 -k 4 --weights 0.7,0.3 --epoch-size 1000
      ucstage shard-plan s3://bucket/shards --unit sample -w 8 -k 8 --shuffle
    """
    chosen = set(given(("seed", "epoch", "unit")))  # a default is not a choice
    columns_list = column_list(columns)
    request = PlanRequest(
        sources=tuple(s for s in (source, *more_sources) if s is not None),
        manifest_path=manifest_path, include=include, exclude=exclude,
        include_hidden=include_hidden, world_size=world_size,
        num_workers=tuple(num_workers_list(num_workers)), nproc_per_node=nproc_per_node,
        shuffle=shuffle, seed=seed if "seed" in chosen else None,
        epoch=epoch if "epoch" in chosen else None, shuffle_scope=shuffle_scope,
        epochs=epochs, max_bytes=size_flag(max_bytes, "--max-bytes"), batch_size=batch_size,
        slot=_parse_slot(slot), resume=resume, group=group,
        unit=unit if "unit" in chosen else None, batch_rows=batch_rows,
        equal_length=equal_length,
        columns=None if columns_list is None else tuple(columns_list), version=version,
        filter=filter,
        weights=_floats(weights, "--weights", "0.7,0.3"),
        repeat=_floats(repeat, "--repeat", "2.5,0.1"), epoch_size=epoch_size,
        format=format, block_samples=block_samples)
    mode = request.mode
    result: Any = request.plan(read_files=read_source, read_table=table_source,
                               read_samples=shard_source)
    # The JSON names every file; the human view names a few, so it never builds the list.
    data = result.to_json() if as_json else {}
    emit(data, as_json, lambda console: RENDERS[mode](console, result))
    problems = _problems(mode, result)
    if problems:
        fail_found("; ".join(problems))


def _problems(mode: str, result: Any) -> list[str]:
    """What is wrong with the plan, in words (exit 1 when any)."""
    if mode in ("row-group", "sample"):
        return result.problems
    if mode != "files":
        return []
    problems: list[str] = result.plan.problems
    if not result.fits:
        problems.append(f"{len(result.forecast.over(result.cap)):,} node shares exceed "
                        f"--max-bytes {format_bytes(result.cap or 0)}")
    return problems
