"""``--unit row-group``: the slot rule over a table's row groups, from the shell.

``ucstage shard-plan SOURCE --unit row-group``: the row groups, rows and bytes
each slot of a table reads, and the batches each rank yields
(:func:`ucstage.tables.slots.plan_row_groups`). ``ucstage cache warm SOURCE
--unit row-group``: the table's row-group cache entries
(:func:`ucstage.tables.entries.group_entries`), which the warm deals by the
same rule as files."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape

from ..errors import InvalidArgument
from ..sharding import Layout, ReadOrder
from .args import column_list
from .output import counted, emit, fail_found, format_bytes, table, truncated_rows

F = TypeVar("F", bound=Callable[..., Any])

UNITS = ("file", "row-group")
ROW_GROUP_ONLY = ("batch_rows", "equal_length", "columns", "version")
"""Options that mean something only with ``--unit row-group``."""
FILE_ONLY = ("include", "exclude", "include_hidden", "batch_size", "slot", "resume", "epochs",
             "max_bytes", "group")
"""Options of the file plan that a row-group plan does not take."""


UNIT_HELP = ("What the slot rule deals: files, or the row groups of a table SOURCE (a "
             "Parquet folder, an export destination, a Delta table path or "
             "catalog.schema.table), as TableDataset reads it.")


def table_options(func: F, *, columns_help: str) -> F:
    """``--unit``, ``--columns`` and ``--version``."""
    options = [
        click.option("--unit", type=click.Choice(UNITS), default="file", show_default=True,
                     help=UNIT_HELP),
        click.option("--columns", metavar="A,B,...", default=None, help=columns_help),
        click.option("--version", "version", type=int, default=None, metavar="N",
                     help="With --unit row-group: this Delta table version (default: "
                          "the latest)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def warm_options(func: F) -> F:
    """What ``cache warm`` takes for a table: ``--unit``, ``--columns``, ``--version``."""
    return table_options(func, columns_help="With --unit row-group: warm only these "
                         "columns' chunks (pass the same columns to TableDataset).")


def row_group_options(func: F) -> F:
    """``--unit``, and what a row-group plan takes: ``--batch-rows``,
    ``--equal-length``, ``--columns``, ``--version``."""
    func = table_options(func, columns_help="With --unit row-group: count only these "
                         "columns' bytes.")
    options = [
        click.option("--batch-rows", type=int, default=None, metavar="N",
                     help="With --unit row-group: rows per batch, as TableDataset's "
                          "batch_rows (default: one row group per batch); counts each "
                          "rank's batches for the batch check."),
        click.option("--equal-length", type=click.Choice(["pad", "drop"]), default=None,
                     help="With --unit row-group and --batch-rows: every slot yields the "
                          "same number of batches, as TableDataset(equal_length=...) does."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


WARM_FILE_ONLY = ("include", "exclude", "include_hidden", "group")


def check_unit_options(unit: str, file_only: Sequence[str] = FILE_ONLY,
                       row_group_only: Sequence[str] = ROW_GROUP_ONLY) -> None:
    """Refuse the options that do not go with ``unit``: one line, exit 2."""
    ctx = click.get_current_context()

    def given(name: str) -> bool:
        if ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT):
            return False
        return ctx.params.get(name) not in (None, (), False)

    flag = {"include_hidden": "--all", "max_bytes": "--max-bytes"}
    if unit == "file":
        wrong = [n for n in row_group_only if given(n)]
        if wrong:
            names = " and ".join("--" + n.replace("_", "-") for n in wrong)
            raise InvalidArgument(f"{names} only apply to --unit row-group",
                                  hint="add --unit row-group, or leave them out")
        return
    wrong = [n for n in file_only if given(n)]
    if wrong:
        names = " and ".join(flag.get(n, "--" + n.replace("_", "-")) for n in wrong)
        hint = "use --batch-rows for rows per batch" if "batch_size" in wrong else \
            "a table is read whole by row group: give --columns to choose columns"
        raise InvalidArgument(f"{names} do not apply to --unit row-group", hint=hint)


def _manifest(source: str | None, manifest_path: str | None, version: int | None) -> Any:
    """The row groups of a table SOURCE, or of a saved ``.rowgroups.arrow``."""
    from ..tables import RowGroupManifest, row_groups

    if (source is None) == (manifest_path is None):
        raise click.UsageError("give a table SOURCE or --manifest FILE.rowgroups.arrow")
    if manifest_path is not None:
        if version is not None:
            raise InvalidArgument("--version chooses a Delta version to list; a frozen "
                                  "row-group manifest already has one")
        return RowGroupManifest.load(manifest_path)
    assert source is not None
    return row_groups(source, version=version)


def table_entries(source: str | None, manifest_path: str | None, columns: str | None,
                  version: int | None) -> tuple[Any, list[Any]]:
    """(volume, one cache entry per row group) of a table, for ``cache warm``."""
    from ..tables.entries import group_entries

    wanted = column_list(columns)
    manifest = _manifest(source, manifest_path, version)
    manifest.check_columns(wanted)
    return manifest.volume(), group_entries(manifest, wanted)


def row_group_plan(source: str | None, manifest_path: str | None, *, layout: Layout,
                   shuffle: bool, seed: int, epoch: int, scope: str, batch_rows: int | None,
                   equal_length: str | None, columns: str | None, version: int | None,
                   as_json: bool) -> None:
    """Plan, print, and exit 1 when the plan has a problem."""
    from ..tables.slots import plan_row_groups

    if batch_rows is not None and batch_rows < 1:
        raise InvalidArgument(f"--batch-rows must be at least 1, got {batch_rows}")
    if equal_length is not None and batch_rows is None:
        raise InvalidArgument("--equal-length counts batches, so it needs --batch-rows")
    wanted = column_list(columns)
    manifest = _manifest(source, manifest_path, version)
    order = ReadOrder(manifest.row_groups, shuffle, seed, epoch, None, scope)
    p = plan_row_groups(manifest, layout, order, columns=wanted, batch_rows=batch_rows,
                        equal_length=equal_length)
    emit(p.to_json() if as_json else {}, as_json, lambda console: _render(console, p))
    if p.problems:
        fail_found("; ".join(p.problems))


def _spread(values: dict[str, float], fmt: Callable[[float], str]) -> str:
    return f"min {fmt(values['min'])} / mean {fmt(values['mean'])} / max {fmt(values['max'])}"


def _render(console: Console, p: Any) -> None:
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
    workers = plan.layout.num_workers
    spec = f"{workers} on every rank" if isinstance(workers, int) else \
        ",".join(str(k) for k in workers)
    summary.add_row("ranks x workers",
                    f"{plan.layout.world_size:,} x {spec} = {counted(plan.layout.slots, 'slot')}")
    if plan.layout.nproc_per_node is not None:
        summary.add_row("nodes", f"{plan.layout.nodes:,} x "
                                 f"{counted(plan.layout.nproc_per_node, 'rank')} per node")
    order = "listing order" if not plan.order.shuffle else \
        f"shuffled (seed {plan.order.seed}, epoch {plan.order.epoch}, " \
        f"scope {plan.order.shuffle_scope})"
    summary.add_row("read order", order)
    summary.add_row("row groups per slot",
                    _spread(doc["row_groups_per_slot"], lambda v: f"{v:,.1f}".rstrip("0")
                            .rstrip(".")))
    summary.add_row("rows per slot", _spread(doc["rows_per_slot"], lambda v: f"{v:,.0f}"))
    summary.add_row("bytes per slot", _spread(doc["bytes_per_slot"], format_bytes))
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
