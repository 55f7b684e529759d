"""``shard-plan --unit sample`` for people: each slot's shards and sample
ranges (:class:`ucstage.sampleplan.SamplePlan`; its verdict is the plan's
``problems``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from .output import counted, escape, table, truncated_rows
from .plan_render import FIRST_FILES, order_text, spread_text, workers_text

if TYPE_CHECKING:
    from ..sampleplan import SamplePlan

__all__ = ["render_samples"]


def render_samples(console: Console, p: SamplePlan) -> None:
    """Each slot's shards and sample ranges (the first few of a slot's ranges)."""
    m, plan = p.manifest, p.plan
    doc = p.to_json()["summary"]
    console.print(f"[bold]Sample plan[/] for {escape(m.source)} "
                  f"[dim](fingerprint {m.fingerprint[:12]})[/]")
    summary = table("", "", numeric=False)
    summary.show_header = False
    summary.add_row("samples", f"{m.samples:,} in {counted(len(m.files), 'shard')}, "
                               f"{counted(len(m), 'block')} of at most {m.block_samples:,}")
    summary.add_row("ranks x workers", f"{plan.layout.world_size:,} x {workers_text(plan)} = "
                                       f"{counted(plan.layout.slots, 'slot')}")
    if plan.layout.nproc_per_node is not None:
        summary.add_row("nodes", f"{plan.layout.nodes:,} x "
                                 f"{counted(plan.layout.nproc_per_node, 'rank')} per node")
    summary.add_row("read order", order_text(plan).replace("files", "shards"))
    summary.add_row("samples per slot", spread_text(doc["samples_per_slot"], lambda v: f"{v:,.0f}"))
    summary.add_row("shards per slot", spread_text(doc["shards_per_slot"],
                                               lambda v: f"{v:,.1f}".rstrip("0").rstrip(".")))
    if p.equal is not None:
        summary.add_row("equal length", f"{p.equal_length}: {counted(p.equal, 'sample')} "
                                        "per slot")
    console.print(summary)
    console.print()
    slots = table("slot", "node", "samples", "shards", escape("sample ranges (shard[first:stop])"),
                  numeric=False)
    rows, cut = truncated_rows(list(zip(plan.slots, p.slot_samples, p.slot_shards,
                                        strict=True)))
    for row in rows:
        if row is None:
            slots.add_row(f"… {cut} more", "", "", "", "")
            continue
        s, n, k = row
        ranges = p.ranges(s)
        text = ", ".join(f"{escape(m.files[r.shard].path)}[{r.first}:{r.stop}]"
                         for r in ranges[:FIRST_FILES])
        if len(ranges) > FIRST_FILES:
            text += f", … {len(ranges) - FIRST_FILES:,} more"
        slots.add_row(f"{s.rank}:{s.worker}", str(s.node), f"{n:,}", f"{k:,}", text)
    console.print(slots)
    console.print()
    if plan.consistent and not plan.empty.count:
        console.print("[green]✓[/] every sample is read exactly once")
    elif not plan.consistent:
        console.print(f"[red]✗[/] ranks disagree on num_workers: {len(plan.duplicated):,} "
                      f"blocks are read twice or more, {len(plan.skipped):,} never")
    if plan.empty.count:
        console.print(f"[yellow]![/] {plan.empty.count:,} of {counted(plan.layout.slots, 'slot')} "
                      f"read no sample (more slots than the {counted(len(m), 'block')}): "
                      "use fewer slots, or a smaller --block-samples")
