"""``shard-plan``'s results for people: the tables of each of its modes
(:mod:`ucstage.planning`); the verdicts are the library's (``ShardPlan.ok``,
``Forecast.fits``, ``RowGroupPlan.problems``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

from ..planning import FilePlan, ResumeFiles, SlotFiles, disk_free
from ..sharding.mixing import MixPlan
from ..sharding.plan import ShardPlan
from ..shown import shown
from .output import counted, err, escape, format_bytes, table, truncated_rows

if TYPE_CHECKING:
    from ..tables.slots import RowGroupPlan

__all__ = ["FIRST_FILES", "order_text", "render_files", "render_mix", "render_resume", "render_row_groups", "render_slot", "spread_text",
           "workers_text"]

EXAMPLES = 5
"""Files named per problem."""
FIRST_FILES = 3
"""Files named per slot of a resumed epoch."""
PRINT_LINES = 64
"""Files per print of `--slot`'s list."""


def workers_text(p: ShardPlan) -> str:
    if isinstance(p.layout.num_workers, int):
        return f"{p.layout.num_workers} on every rank"
    return ",".join(str(k) for k in p.layout.num_workers)


def _slot_range(first: tuple[int, int], last: tuple[int, int]) -> str:
    return (f"{first[0]}:{first[1]}" if first == last
            else f"{first[0]}:{first[1]} .. {last[0]}:{last[1]}")


def order_text(p: ShardPlan) -> str:
    if not p.order.shuffle:
        return "listing order"
    if p.layout.nodes == 1:
        return f"shuffled (seed {p.order.seed}, epoch {p.order.epoch}; one node)"
    if p.order.shuffle_scope == "node":
        return (f"shuffled within each node (seed {p.order.seed}, epoch {p.order.epoch}): each node keeps "
                "its files every epoch")
    return (f"shuffled over the whole job (seed {p.order.seed}, epoch {p.order.epoch}): nodes get other "
            "files every epoch")


def render_files(console: Console, fp: FilePlan) -> None:
    """The plan of every slot, its members with --group and its forecast with --epochs."""
    manifest, p = fp.manifest, fp.plan
    order = order_text(p)
    n = "file" if manifest.groups is None else "sample"  # --group key deals samples
    fps, bps = p.files_per_slot(), p.bytes_per_slot()
    console.print(f"[bold]Shard plan[/] for {escape(manifest.path or manifest.source)}  "
                  f"[dim]fingerprint {manifest.fingerprint[:12]}[/]")
    summary = table("", "", numeric=False)
    summary.show_header = False
    summary.add_row(f"{n}s", f"{p.order.n:,} ({format_bytes(p.total_bytes)})")
    summary.add_row("ranks x workers",
                    f"{p.layout.world_size:,} x {workers_text(p)} = {counted(p.layout.slots, 'slot')}")
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
    paths = fp.names
    if p.consistent and not p.empty.count:
        console.print(f"[green]✓[/] every {n} is read exactly once")
    elif not p.consistent:
        console.print(
            f"[red]✗[/] ranks disagree on num_workers ({workers_text(p)}): "
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
    _render_members(console, fp.grouping())
    if fp.forecasts:
        _render_forecast(console, fp)


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


def _render_members(console: Console, doc: dict[str, Any] | None) -> None:
    if doc is None:
        return
    spread = doc["members_per_slot"]
    console.print(f"grouped by {doc['by']}: {doc['samples']:,} samples of "
                  f"{doc['members']:,} files; member files per slot min {spread['min']:,} / "
                  f"mean {spread['mean']:,.1f} / max {spread['max']:,}")


def _render_forecast(console: Console, fp: FilePlan) -> None:
    forecasts, scope, cap = fp.forecasts, fp.scope, fp.cap
    f = forecasts[scope]
    other_name = next(name for name in forecasts if name != scope)
    other = forecasts[other_name]
    console.print()
    console.print(f"[bold]Network forecast[/] over {len(f.epochs)} epochs "
                  f"({f.epochs[0]}..{f.epochs[-1]}): files a node reads that it did not read "
                  "in an earlier epoch")
    cols = ["epoch", "node", "reads", f"new ({scope})", "new bytes", f"new ({other_name})",
            "new bytes "]
    t = table(*cols)
    rows, cut = truncated_rows(list(zip(f.rows, other.rows, strict=True)))
    for pair in rows:
        if pair is None:
            t.add_row(f"… {cut} more", *[""] * (len(cols) - 1))
            continue
        mine, theirs = pair
        t.add_row(str(mine.epoch), str(mine.node), f"{mine.files:,}", f"{mine.new_files:,}",
                  format_bytes(mine.new_bytes), f"{theirs.new_files:,}",
                  format_bytes(theirs.new_bytes))
    console.print(t)
    later = [e for e in f.epochs[1:]]
    for name, g in ((scope, f), (other_name, other)):
        after = sum(g.epoch_new(e)[0] for e in later)
        after_bytes = sum(g.epoch_new(e)[1] for e in later)
        tail = (f"; after epoch {f.epochs[0]}: {after:,} files ({format_bytes(after_bytes)})"
                if later else "")
        console.print(f"  {name + ' scope:':<14} the job fetches {g.new_files:,} files "
                      f"({format_bytes(g.new_bytes)}){tail}")
    if f.node_count > 1 and f.epochs and scope == "node":
        console.print("  [green]✓[/] under the node scope each node reads the same files "
                      "every epoch: its cache serves every epoch after the first")
    shares = [(i, b) for i, b in enumerate(f.share_bytes)]
    biggest = max(shares, key=lambda x: x[1]) if shares else (0, 0)
    console.print(f"  cache a node needs for every epoch: up to "
                  f"{format_bytes(biggest[1])} (node {biggest[0]}, {f.share_files[biggest[0]]:,} "
                  "files)")
    over = f.over(cap)
    if over:
        names = ", ".join(str(i) for i in over[:8]) + (" …" if len(over) > 8 else "")
        console.print(f"  [red]✗[/] node shares over the cap of {format_bytes(cap or 0)} "
                      f"(nodes {names}): those nodes evict and fetch again every epoch; "
                      "raise the cap or add nodes")
    elif cap is not None:
        console.print(f"  [green]✓[/] every node's share fits under the cap of "
                      f"{format_bytes(cap)}")
    root, free = disk_free()
    if biggest[1] > free:
        console.print(f"  [yellow]![/] the largest share does not fit in the "
                      f"{format_bytes(free)} free here ({escape(root)}); if this machine is "
                      "one of the job's nodes, give its cache a larger disk")


def render_slot(console: Console, sf: SlotFiles) -> None:
    """One slot's files, one per line (a summary line on stderr)."""
    s, files = sf.slot, sf.files
    err.print(f"slot {s.rank}:{s.worker}: {len(files):,} files, {format_bytes(s.bytes)}")
    # A print of joined lines renders as one print per line did (no markup,
    # soft wrap, and rich's per-line rules: emoji codes and tabs never span
    # a newline), without rich's fixed cost per call (977 calls were a
    # fifth of a 1M-file `--slot` run). Still in small pieces, so that a
    # reader that leaves (`| head`) stops the output early, as before.
    for at in range(0, len(files), PRINT_LINES):
        console.print("\n".join(e.path for e in files[at:at + PRINT_LINES]), markup=False)


def render_resume(console: Console, rf: ResumeFiles) -> None:
    """The rest of a resumed epoch, or one slot's files."""
    manifest, state, doc = rf.manifest, rf.rest.state, rf.to_json()
    if rf.one_slot:
        err.print(f"slot {doc['rank']}:{doc['worker']}: {counted(len(doc['files']), 'file')} left, "
                  f"{format_bytes(doc['bytes'])}")
        for path in doc["files"]:
            console.print(path, markup=False)
        return
    how = ("every slot continues where it stopped" if doc["mode"] == "continue" else
           f"the rest is re-split over {doc['world_size']:,} x "
           f"{counted(max(1, doc['num_workers']), 'slot')} by the slot rule")
    order = f"shuffled (seed {state.order.seed})" if state.order.shuffle else "listing order"
    console.print(f"[bold]Resumed epoch {state.order.epoch}[/] of "
                  f"{escape(manifest.path or manifest.source)}  "
                  f"[dim]fingerprint {manifest.fingerprint[:12]}, {order}[/]")
    console.print(f"{counted(doc['resumed_files'], 'file')} delivered before the restart (saved on "
                  f"{state.last.layout.world_size} x {state.last.layout.num_workers}); "
                  f"{doc['remaining_files']:,} left: {how}")
    slots = table("rank", "worker", "files left", "bytes", "first files")
    rows, cut = truncated_rows(doc["slots"])
    for s in rows:
        if s is None:
            slots.add_row(f"… {cut} more", "", "", "", "")
            continue
        first = ", ".join(s["files"][:FIRST_FILES]) + (" …" if len(s["files"]) > FIRST_FILES else "")
        slots.add_row(str(s["rank"]), str(s["worker"]), f"{len(s['files']):,}",
                      format_bytes(s["bytes"]), escape(first))
    console.print(slots)


def spread_text(values: dict[str, float], fmt: Callable[[float], str]) -> str:
    return f"min {fmt(values['min'])} / mean {fmt(values['mean'])} / max {fmt(values['max'])}"


def pruned_text(pruned: dict[str, list[int]] | None) -> str:
    """What a row filter kept of a table: ``kept 1 of 2 files, 4 of 16 row groups
    (in the files read), 10 KB of 48 KB``."""
    if not pruned:
        return "kept what can match"
    files, groups, size = pruned["files"], pruned["row_groups"], pruned["bytes"]
    return (f"kept {files[0]:,} of {counted(files[1], 'file')}, {groups[0]:,} of "
            f"{counted(groups[1], 'row group')} (in the files read), "
            f"{format_bytes(size[0])} of {format_bytes(size[1])}")


def render_row_groups(console: Console, p: RowGroupPlan) -> None:
    m, plan = p.manifest, p.plan
    doc = p.to_json()["summary"]
    version = f", version {m.table_version}" if m.table_version is not None else ""
    console.print(f"[bold]Row-group plan[/] for {escape(m.source)} [dim]({m.kind}{version}; "
                  f"fingerprint {m.fingerprint[:12]})[/]")
    summary = table("", "", numeric=False)
    summary.show_header = False
    summary.add_row("rows", f"{m.rows:,} in {counted(m.row_groups, 'row group')} of "
                            f"{counted(len(m.files), 'file')} ({format_bytes(plan.total_bytes)})")
    if p.columns != m.columns:
        summary.add_row("columns", ", ".join(p.columns))
    if m.filter:
        summary.add_row("filter", escape(shown(m.filter["text"])) + ": "
                        + pruned_text(m.filter.get("pruned")))
    workers = plan.layout.num_workers
    spec = f"{workers} on every rank" if isinstance(workers, int) else \
        ",".join(str(k) for k in workers)
    summary.add_row("ranks x workers",
                    f"{plan.layout.world_size:,} x {spec} = {counted(plan.layout.slots, 'slot')}")
    if plan.layout.nproc_per_node is not None:
        summary.add_row("nodes", f"{plan.layout.nodes:,} x {counted(plan.layout.nproc_per_node, 'rank')} "
                                 "per node")
    order = "listing order" if not plan.order.shuffle else \
        f"shuffled (seed {plan.order.seed}, epoch {plan.order.epoch}, scope {plan.order.shuffle_scope})"
    summary.add_row("read order", order)
    summary.add_row("row groups per slot",
                    spread_text(doc["row_groups_per_slot"], lambda v: f"{v:,.1f}".rstrip("0")
                            .rstrip(".")))
    summary.add_row("rows per slot", spread_text(doc["rows_per_slot"], lambda v: f"{v:,.0f}"))
    summary.add_row("bytes per slot", spread_text(doc["bytes_per_slot"], format_bytes))
    batches = (f"{p.batch_rows:,} rows" if p.batch_rows else "one row group")
    if p.equal is not None:
        batches += (f"; equal_length={p.equal_length}: "
                    f"{counted(p.equal, 'batch', 'batches')} per slot")
    summary.add_row("batches", batches)
    console.print(summary)
    console.print()
    ranks = table("rank", "workers", "row groups", "rows", "bytes", "batches")
    rows, cut = truncated_rows(p.ranks)
    for r in rows:
        if r is None:
            ranks.add_row(f"… {cut} more", "", "", "", "", "")
            continue
        ranks.add_row(str(r.rank), str(r.num_workers), f"{r.row_groups:,}", f"{r.rows:,}",
                      format_bytes(r.bytes), f"{r.batches:,}")
    console.print(ranks)
    if plan.empty.ranks:
        console.print(f"[dim]{counted(plan.empty.ranks, 'rank')} read no row group and "
                      f"{'is' if plan.empty.ranks == 1 else 'are'} not listed[/]")
    console.print()
    if plan.consistent and not plan.empty.count:
        console.print("[green]✓[/] every row group is read exactly once")
    elif not plan.consistent:
        console.print(f"[red]✗[/] ranks disagree on num_workers: {len(plan.duplicated):,} "
                      f"row groups are read twice or more, {len(plan.skipped):,} never")
    if plan.empty.count:
        console.print(f"[yellow]![/] {plan.empty.count:,} of {counted(plan.layout.slots, 'slot')} "
                      f"read no row group (more slots than the {counted(m.row_groups, 'row group')}): "
                      "use fewer slots, or export with more row groups (ucstage export "
                      "--row-group-rows N)")
    if p.empty_epoch:
        # Equal, but equally nothing: never a green check.
        console.print("[yellow]![/] every rank yields 0 batches: the epoch is empty (each "
                      "slot holds fewer rows than a batch); use a smaller --batch-rows, "
                      "fewer slots, or --equal-length pad")
    elif p.batches_equal:
        counts = {r.batches for r in p.ranks}
        if counts:
            console.print(f"[green]✓[/] every rank yields {counted(counts.pop(), 'batch', 'batches')}")
    else:
        spread = p.batch_counts
        console.print(
            f"[yellow]![/] ranks yield different batch counts ({spread[0]:,}..{spread[-1]:,}): "
            "DDP hangs at the end of the epoch waiting for the rank with more batches. "
            "Use --batch-rows N with --equal-length drop (or pad), as "
            "TableDataset(batch_rows=N, equal_length=...) reads.")


def render_mix(console: Console, p: MixPlan) -> None:
    doc = p.to_json()
    console.print(f"[bold]Mix plan[/]: {counted(len(p.names), 'source')}, "
                  f"{counted(p.shares.epoch_size, 'item')} per epoch (seed {p.seed}, epoch "
                  f"{p.epoch}), {counted(p.layout.world_size, 'rank')} x "
                  f"{p.layout.num_workers} workers = {counted(p.layout.slots, 'slot')}")
    sources = table("source", "items", "per epoch", "passes per epoch", "passes this epoch")
    for src in doc["sources"]:
        passes = src["passes"]
        span = "none" if not passes else (f"{passes[0]}" if passes[0] == passes[1]
                                          else f"{passes[0]}..{passes[1]}")
        sources.add_row(escape(src["source"]), f"{src['items']:,}", f"{src['per_epoch']:,}",
                        f"{src['passes_per_epoch']:.3g}", span)
    console.print(sources)
    console.print()
    labels = [f"#{i}" for i in range(len(p.names))]
    slots = table("slot", *labels, "total")
    rows, cut = truncated_rows(list(p.slots))
    for row in rows:
        if row is None:
            slots.add_row(f"… {cut} more", *[""] * (len(labels) + 1))
            continue
        slot, counts = row
        slots.add_row(str(slot), *(f"{c:,}" for c in counts), f"{sum(counts):,}")
    console.print(slots)
    console.print("[dim]" + "; ".join(f"#{i} = {escape(n)}" for i, n in enumerate(p.names))
                  + "[/]")
    totals = sorted({sum(c) for _, c in p.slots})
    if len(totals) > 1:
        console.print(f"[yellow]![/] slots read {totals[0]:,}..{totals[-1]:,} items: pass "
                      'Mix(equal_length="pad") for equal batch counts under DDP')
