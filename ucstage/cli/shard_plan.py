"""``ucstage shard-plan``: which files each (rank, worker) slot reads."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape

from ..cache.local import MAX_BYTES_ENV
from ..errors import InvalidArgument
from ..manifest import Manifest
from ..sharding import (
    SHUFFLE_SCOPES,
    Forecast,
    Layout,
    ReadOrder,
    ShardPlan,
    Slot,
    SlotPlan,
    forecast,
    slot_plan,
)
from ..sharding import (
    shard_plan as plan_shards,
)
from ..units import SIZE_HELP
from .args import num_workers_list, size_flag
from .forecast_view import forecast_json, render_forecast
from .group_plan import ItemNames, group_option, grouped, item_sizes, members_json, render_members
from .mix_plan import REFUSED, mix_options, refused, run_mix_plan
from .output import (
    CONTEXT,
    counted,
    emit,
    err,
    fail_found,
    format_bytes,
    json_option,
    read_source,
    source_options,
    table,
    truncated_rows,
)
from .resume_plan import resume_plan
from .row_groups import check_unit_options, row_group_options, row_group_plan
from .scope import nproc_option, scope_of, shuffle_scope_option

EXAMPLES = 5
PRINT_LINES = 64
"""Files per print of `--slot`'s list."""


def _parse_slot(value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        rank, worker = (int(v) for v in value.split(":"))
    except ValueError as exc:
        raise InvalidArgument(f"--slot must be RANK:WORKER, e.g. 0:3, got {value!r}") from exc
    return rank, worker


def plan_json(manifest: Manifest, p: ShardPlan) -> dict[str, Any]:
    """The documented JSON contract (docs/json.md#shard-plan)."""
    paths: Any = manifest.paths() if manifest.groups is None else ItemNames(manifest)
    doc = p.to_json(paths, source=manifest.source, fingerprint=manifest.fingerprint)
    grouping = members_json(manifest, p)
    return doc if grouping is None else {**doc, "grouping": grouping}


def _workers_text(p: ShardPlan) -> str:
    if isinstance(p.layout.num_workers, int):
        return f"{p.layout.num_workers} on every rank"
    return ",".join(str(k) for k in p.layout.num_workers)


def _slot_range(first: tuple[int, int], last: tuple[int, int]) -> str:
    return (f"{first[0]}:{first[1]}" if first == last
            else f"{first[0]}:{first[1]} .. {last[0]}:{last[1]}")


def _order_text(p: ShardPlan) -> str:
    if not p.order.shuffle:
        return "listing order"
    if p.layout.nodes == 1:
        return f"shuffled (seed {p.order.seed}, epoch {p.order.epoch}; one node)"
    if p.order.shuffle_scope == "node":
        return (f"shuffled within each node (seed {p.order.seed}, epoch {p.order.epoch}): "
                "each node keeps its files every epoch")
    return (f"shuffled over the whole job (seed {p.order.seed}, epoch {p.order.epoch}): "
            "nodes get other files every epoch")


def _render(console: Console, manifest: Manifest, p: ShardPlan) -> None:
    order = _order_text(p)
    n = "file" if manifest.groups is None else "sample"  # --group key deals samples
    fps, bps = p.files_per_slot(), p.bytes_per_slot()
    console.print(f"[bold]Shard plan[/] for {escape(manifest.path or manifest.source)}  "
                  f"[dim]fingerprint {manifest.fingerprint[:12]}[/]")
    summary = table("", "", numeric=False)
    summary.show_header = False
    summary.add_row(f"{n}s", f"{p.order.n:,} ({format_bytes(p.total_bytes)})")
    summary.add_row("ranks x workers",
                    f"{p.layout.world_size:,} x {_workers_text(p)} = {counted(p.layout.slots, 'slot')}")
    if p.layout.nproc_per_node is not None:
        summary.add_row("nodes", f"{p.layout.nodes:,} x {counted(p.layout.nproc_per_node, 'rank')} per node")
    summary.add_row("read order", order)
    summary.add_row(f"{n}s per slot",
                    f"min {fps.min:,.0f} / mean {fps.mean:,.1f} / max {fps.max:,.0f}")
    summary.add_row("bytes per slot", f"min {format_bytes(bps.min)} / mean "
                    f"{format_bytes(bps.mean)} / max {format_bytes(bps.max)}")
    summary.add_row("imbalance", f"{p.imbalance:.2f}x (largest slot's bytes / mean)")
    console.print(summary)
    console.print()
    cols = ["rank", "workers", f"{n}s", "bytes"] + (["batches"] if p.batch_size else [])
    ranks = table(*cols)
    rows, cut = truncated_rows(p.ranks)
    for r in rows:
        if r is None:
            ranks.add_row(f"… {cut} more", *[""] * (len(cols) - 1))
            continue
        cells = [str(r.rank), str(r.num_workers), f"{r.files:,}", format_bytes(r.bytes)]
        if p.batch_size:
            cells.append(f"{r.batches:,}")
        ranks.add_row(*cells)
    console.print(ranks)
    if p.empty.ranks:
        console.print(f"[dim]{counted(p.empty.ranks, 'rank')} read no {n} and "
                      f"{'is' if p.empty.ranks == 1 else 'are'} not listed[/]")
    if p.layout.nodes > 1:
        console.print()
        nodes = table("node", "ranks", f"{n}s", "bytes")
        node_rows, node_cut = truncated_rows(p.nodes)
        for nd in node_rows:
            if nd is None:
                nodes.add_row(f"… {node_cut} more", "", "", "")
                continue
            nodes.add_row(str(nd.node), f"{nd.first_rank}..{nd.last_rank}", f"{nd.files:,}",
                          format_bytes(nd.bytes))
        console.print(nodes)
        if len(p.nodes) < p.layout.nodes:
            console.print(f"[dim]{counted(p.layout.nodes - len(p.nodes), 'node')} read no {n} and "
                          f"{'is' if p.layout.nodes - len(p.nodes) == 1 else 'are'} not listed[/]")
    console.print()
    paths = ItemNames(manifest)
    if p.consistent and not p.empty.count:
        console.print(f"[green]✓[/] every {n} is read exactly once")
    elif not p.consistent:
        console.print(
            f"[red]✗[/] ranks disagree on num_workers ({_workers_text(p)}): "
            f"[bold]{len(p.duplicated):,}[/] {n}s are read twice or more, "
            f"[bold]{len(p.skipped):,}[/] are never read"
        )
        for label, indices in (("read twice+", p.duplicated), ("never read", p.skipped)):
            for i in indices[:EXAMPLES]:
                readers = " and ".join(f"{r}:{w}" for r, w in p.readers(i))
                by = f"  [dim](by rank:worker {readers})[/]" if readers else ""
                console.print(f"  {label:<11} {escape(paths[i])}{by}")
            if len(indices) > EXAMPLES:
                console.print(f"  {'':<11} [dim]… and {len(indices) - EXAMPLES:,} more (--json lists all)[/]")
        console.print("  fix: pass the same num_workers to the DataLoader on every rank")
    if p.empty.count:
        _render_empty(console, p, n)
    if p.batch_size and not p.batches_equal:
        counts = sorted({r.batches for r in p.ranks if r.batches is not None}
                        | ({0} if p.empty.ranks else set()))
        console.print(
            f"[yellow]![/] ranks get different batch counts ({counts[0]}..{counts[-1]} at batch "
            f"size {p.batch_size}): DDP hangs at the end of the epoch waiting for the rank "
            "with more batches. Make the file count a multiple of the slot count, or use "
            'VolumeDataset(equal_length="pad").'
        )


def _render_empty(console: Console, p: ShardPlan, n: str = "file") -> None:
    e = p.empty
    whole = f"; {counted(e.ranks, 'rank')} get{'s' * (e.ranks == 1)} no {n} at all" if e.ranks else ""
    if p.consistent:
        console.print(f"[yellow]![/] every {n} is read once, but [bold]{e.count:,}[/] of "
                      f"{counted(p.layout.slots, 'slot')} read nothing (more slots than the "
                      f"{counted(p.order.n, n)}){whole}")
    else:
        console.print(f"[yellow]![/] [bold]{e.count:,}[/] of {counted(p.layout.slots, 'slot')} "
                      f"read nothing{whole}")
    for (first, last), size in list(zip(e.ranges, e.range_sizes, strict=True))[:EXAMPLES]:
        console.print(f"  {'no ' + n + 's':<11} {_slot_range(first, last)}  [dim]({counted(size, 'slot')}, "
                      "rank:worker)[/]")
    hidden = e.range_count - min(len(e.ranges), EXAMPLES)
    if hidden:
        console.print(f"  {'':<11} [dim]… and {hidden:,} more ranges (--json lists the first "
                      f"{len(e.ranges)})[/]")
    if p.consistent:
        console.print(f"  fix: use at most {counted(p.order.n, 'slot')} (world size x num_workers), or "
                      f'VolumeDataset(equal_length="pad"), which re-reads {n}s until every '
                      "slot has one")


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
@mix_options
@json_option
def shard_plan(
    source: str | None, manifest_path: str | None, include: tuple[str, ...],
    exclude: tuple[str, ...], include_hidden: bool, world_size: int, num_workers: str,
    shuffle: bool, seed: int, epoch: int, shuffle_scope: str | None,
    nproc_per_node: int | None, epochs: int | None, max_bytes: str | None,
    batch_size: int | None, slot: str | None, resume: str | None, group: str | None,
    unit: str, batch_rows: int | None, equal_length: str | None, columns: str | None,
    version: int | None, more_sources: tuple[str, ...], weights: str | None,
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
      ucstage shard-plan data/a data/b -w 2 -k 4 --weights 0.7,0.3 --epoch-size 1000
    """
    if more_sources or weights is not None or repeat is not None or epoch_size is not None:
        ctx = click.get_current_context()
        refused([n for n in REFUSED if ctx.get_parameter_source(n) not in
                 (None, ParameterSource.DEFAULT)])
        run_mix_plan([s for s in (source, *more_sources) if s is not None], include=include,
                     exclude=exclude, include_hidden=include_hidden,
                     layout=Layout(world_size, num_workers_list(num_workers), nproc_per_node),
                     seed=seed, epoch=epoch, weights=weights, repeat=repeat,
                     epoch_size=epoch_size, as_json=as_json)
        return
    check_unit_options(unit)
    if unit == "row-group":
        _check_shuffle_options(shuffle)
        row_group_plan(source, manifest_path,
                       layout=Layout(world_size, num_workers_list(num_workers), nproc_per_node),
                       shuffle=shuffle, seed=seed, epoch=epoch,
                       scope=scope_of(shuffle_scope, shuffle), batch_rows=batch_rows,
                       equal_length=equal_length, columns=columns, version=version,
                       as_json=as_json)
        return
    wanted = _parse_slot(slot)
    if resume is not None:
        _check_resume_options(shuffle)
    _check_shuffle_options(shuffle)
    scope = scope_of(shuffle_scope, shuffle)
    if wanted is not None and epochs is not None:
        raise InvalidArgument("--epochs forecasts the whole job; it does not combine with --slot")
    if max_bytes is not None and epochs is None:
        raise InvalidArgument("--max-bytes checks the forecast's node shares; it needs --epochs")
    cap = _cap(max_bytes) if epochs is not None else None
    workers = num_workers_list(num_workers)
    if group is not None and resume is not None:
        raise InvalidArgument("--resume plans a file listing's state; it does not combine "
                              "with --group yet")
    manifest = grouped(read_source(source, manifest_path, include, exclude, include_hidden),
                       group)
    if resume is not None:
        # What a resumed epoch reads (cli/resume_plan.py); exit 2 for a state
        # that does not fit this listing.
        resume_plan(manifest, resume, world_size=world_size, num_workers=workers, slot=wanted,
                    batch_size=batch_size, as_json=as_json, nproc_per_node=nproc_per_node)
        return
    sizes = item_sizes(manifest)  # numpy for a columnar manifest; per sample with --group
    layout = Layout(world_size, workers, nproc_per_node)
    order = ReadOrder(len(sizes), shuffle, seed, epoch, None, scope)
    if wanted is not None:
        _print_slot(manifest, slot_plan(sizes, layout, order, Slot(*wanted)), as_json)
        return
    p = plan_shards(sizes, layout, order, batch_size=batch_size)
    forecasts: dict[str, Forecast] = {}
    if epochs is not None:
        # Both scopes, the chosen one first: the forecast shows what the other costs.
        for name in sorted(SHUFFLE_SCOPES, key=lambda x: x != scope):
            forecasts[name] = forecast(sizes, layout, replace(order, shuffle_scope=name),
                                       epochs=epochs)
    # The JSON names every file; the human plan names a few, so it never builds the list.
    data: dict[str, Any] = {}
    if as_json:
        data = plan_json(manifest, p)
        if forecasts:
            data["forecast"] = forecast_json(forecasts, scope, cap)

    def human(console: Console) -> None:
        _render(console, manifest, p)
        render_members(console, members_json(manifest, p))
        if forecasts:
            render_forecast(console, forecasts, scope, cap)

    emit(data, as_json, human)
    chosen = forecasts.get(scope)
    if p.ok and (chosen is None or chosen.fits(cap)):
        return
    problems = p.problems
    if chosen is not None and not chosen.fits(cap):
        problems.append(f"{len(chosen.over(cap)):,} node shares exceed --max-bytes "
                        f"{format_bytes(cap or 0)}")
    fail_found("; ".join(problems))


def _check_shuffle_options(shuffle: bool) -> None:
    """--seed and --epoch choose the permutation: without --shuffle they change nothing,
    and a plan that silently ignores them is not the plan the user meant to check."""
    ctx = click.get_current_context()
    given = [f"--{name}" for name in ("seed", "epoch")
             if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
    if given and not shuffle:
        raise InvalidArgument("--seed/--epoch only matter with --shuffle",
                              hint=f"add --shuffle, or leave {' and '.join(given)} out")


def _check_resume_options(shuffle: bool) -> None:
    """The state decides the read order: a --shuffle/--seed/--epoch beside it would
    plan another epoch than the one being resumed."""
    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in ("seed", "epoch", "shuffle_scope", "epochs")
             if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
    if shuffle or given:
        raise InvalidArgument("--resume takes shuffle, its scope, seed and epoch from the state",
                              hint=f"leave {' and '.join(['--shuffle'] * shuffle + given)} out")


def _print_slot(manifest: Manifest, s: SlotPlan, as_json: bool) -> None:
    rows = s.indices if manifest.groups is None else manifest.groups.rows(s.indices)
    files = manifest.take(rows)  # only this slot's rows (its samples' members with --group)
    data = {"rank": s.rank, "worker": s.worker, "node": s.node,
            "files": [e.path for e in files], "bytes": s.bytes}

    def human(console: Console) -> None:
        err.print(f"slot {s.rank}:{s.worker}: {len(files):,} files, {format_bytes(s.bytes)}")
        # A print of joined lines renders as one print per line did (no markup,
        # soft wrap, and rich's per-line rules: emoji codes and tabs never span
        # a newline), without rich's fixed cost per call (977 calls were a
        # fifth of a 1M-file `--slot` run). Still in small pieces, so that a
        # reader that leaves (`| head`) stops the output early, as before.
        for at in range(0, len(files), PRINT_LINES):
            console.print("\n".join(e.path for e in files[at:at + PRINT_LINES]), markup=False)

    emit(data, as_json, human)


def _cap(max_bytes: str | None) -> int | None:
    """--max-bytes, else $UCSTAGE_CACHE_MAX_BYTES, else None (not checked)."""
    if max_bytes is not None:
        return size_flag(max_bytes, "--max-bytes")
    return size_flag(os.environ.get(MAX_BYTES_ENV) or None, f"${MAX_BYTES_ENV}")
