"""``ucstage shard-plan SRC1 SRC2 --weights``: what each slot reads of a mix."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from ..errors import InvalidArgument
from ..sharding import Layout
from ..sharding.mixing import MixPlan, mix_plan, mix_shares
from .args import float_list
from .output import counted, emit, read_source, table, truncated_rows

__all__ = ["run_mix_plan"]

REFUSED = ("manifest_path", "shuffle", "shuffle_scope", "epochs", "max_bytes", "batch_size",
           "slot", "resume", "group", "unit", "batch_rows", "equal_length", "columns", "version")
"""shard-plan options a mix plan does not take (each source's read order is the mix's)."""


def run_mix_plan(sources: Sequence[str], *, include: Sequence[str], exclude: Sequence[str],
                 include_hidden: bool, layout: Layout, seed: int, epoch: int,
                 weights: str | None, repeat: str | None, epoch_size: int | None,
                 as_json: bool) -> None:
    """List every source, plan the mix, print it."""
    if not layout.uniform:
        raise InvalidArgument("--num-workers takes one value for every rank in a mix plan",
                              hint="see what a mismatch does with one SOURCE")
    ws = float_list(weights, "--weights", example="0.7,0.3") if weights is not None else None
    rs = float_list(repeat, "--repeat", example="2.5,0.1") if repeat is not None else None
    manifests = [read_source(s, None, include, exclude, include_hidden) for s in sources]
    shares = mix_shares([len(m) for m in manifests], ws, rs, epoch_size)
    p = mix_plan(list(sources), shares, layout, seed=seed, epoch=epoch)
    emit(p.to_json() if as_json else {}, as_json, lambda console: _render(console, p))


def refused(given: Sequence[str]) -> None:
    """One clear error for options that plan one source only."""
    if given:
        flags = " and ".join("--" + ("manifest" if g == "manifest_path" else g.replace("_", "-"))
                             for g in given)
        raise InvalidArgument(f"{flags} plan one source; a mix (several SOURCEs, --weights, "
                              "--repeat or --epoch-size) does not take them",
                              hint="give each manifest as a SOURCE; the mix deals its own order")


def _render(console: Console, p: MixPlan) -> None:
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


def mix_options(command: Any) -> Any:
    """shard-plan's mix arguments: more SOURCEs, --weights, --repeat, --epoch-size."""
    for option in reversed(_MIX_OPTIONS):
        command = option(command)
    return command


_MIX_OPTIONS = [
    click.argument("more_sources", nargs=-1, metavar="[SOURCE2 ...]"),
    click.option("--weights", metavar="W1,W2,...", default=None,
                 help="Mix the SOURCEs by weight (each >= 0, sum > 0, normalised): print per "
                      "slot the items from each source and the passes each source makes."),
    click.option("--repeat", metavar="R1,R2,...", default=None,
                 help="Mix the SOURCEs, each read R times its size per epoch (2.5, 0.1), "
                      "instead of --weights."),
    click.option("--epoch-size", type=int, default=None, metavar="N",
                 help="With --weights: items per mixed epoch (default: the largest source's "
                      "items / its weight, rounded up)."),
]
