"""``ucstage shard-plan --resume STATE``: what a resumed epoch reads, per slot."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from ..errors import InvalidArgument
from ..manifest import Manifest
from ..resume import LoaderState, ResumePlan, SlotRest, load_state
from ..resume import resume_plan as plan_resume
from ..sharding import Layout
from .output import counted, emit, err, format_bytes, table, truncated_rows

EXAMPLES = 3


def resume_plan(manifest: Manifest, state_path: str, *, world_size: int, num_workers: list[int],
                slot: tuple[int, int] | None, batch_size: int | None, as_json: bool,
                nproc_per_node: int | None = None) -> None:
    """Print (or emit as JSON) the remaining files of every slot of the new layout
    (``nproc_per_node`` ranks per node; None: the job is one node)."""
    if len(num_workers) != 1:
        raise InvalidArgument("--resume takes one num_workers for every rank",
                              hint="a resumed epoch is planned for one layout, e.g. -k 2")
    state = load_state(state_path)
    layout = Layout(world_size, num_workers[0], nproc_per_node)
    rest = plan_resume(state, layout, fingerprint=manifest.fingerprint, sizes=manifest.sizes())
    doc = _json(manifest, rest, batch_size, rest.slots if slot is None else [rest.slot(*slot)])
    if slot is not None:
        doc = doc["slots"][0]
    emit(doc, as_json, lambda c: _render(c, manifest, state, doc, slot is not None))


def _json(manifest: Manifest, rest: ResumePlan, batch_size: int | None,
          slots: list[SlotRest]) -> dict[str, Any]:
    state = rest.state
    order, saved = state.order, state.last.layout
    return {
        "source": manifest.source,
        "fingerprint": manifest.fingerprint,
        "files": len(manifest.entries),
        "epoch": order.epoch,
        "shuffle": order.shuffle,
        "seed": order.seed,
        "shuffle_scope": order.shuffle_scope,
        "equal_length": order.equal_length,
        "saved_layout": {"world_size": saved.world_size,
                         "num_workers": saved.num_workers,
                         "nproc_per_node": saved.nproc_per_node},
        "world_size": rest.layout.world_size,
        "num_workers": rest.layout.num_workers,
        "mode": "continue" if rest.continued else "resplit",
        "resumed_files": state.delivered,
        "remaining_files": sum(len(s.files) for s in slots),
        "batch_size": batch_size,
        "ranks": ResumePlan(state, rest.layout, rest.continued, slots).rank_totals(batch_size),
        "slots": [{"rank": s.rank, "worker": s.worker,
                   "files": [e.path for e in manifest.take(s.files)], "bytes": s.bytes}
                  for s in slots],
    }


def _render(console: Console, manifest: Manifest, state: LoaderState, doc: dict[str, Any],
            one_slot: bool) -> None:
    if one_slot:
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
        first = ", ".join(s["files"][:EXAMPLES]) + (" …" if len(s["files"]) > EXAMPLES else "")
        slots.add_row(str(s["rank"]), str(s["worker"]), f"{len(s['files']):,}",
                      format_bytes(s["bytes"]), escape(first))
    console.print(slots)
