"""``ucstage shard-plan --resume STATE``: what a resumed epoch reads, per slot."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from ..errors import InvalidArgument
from ..manifest import Manifest
from ..resume import LoaderState, load_state
from ..sharding import Segment, effective_workers, resume_slots
from .output import emit, err, format_bytes, table, truncated_rows

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
    state.check_fits(fingerprint=manifest.fingerprint, files=len(manifest.entries),
                     seed=state.seed, shuffle=state.shuffle, equal_length=state.equal_length,
                     shuffle_scope=state.shuffle_scope)
    k = num_workers[0]
    layout = Segment(world_size, k, (0,) * (world_size * effective_workers(k)), nproc_per_node)
    chain, rest = resume_slots(state.order, state.segments, layout)
    continued = len(chain) == len(state.segments)
    import numpy as np

    sizes = np.asarray(manifest.sizes(), dtype=np.int64)
    slots = []
    for s, files in enumerate(rest):
        if files is None:
            raise InvalidArgument(f"the state does not say what slot {s // effective_workers(k)}"
                                  f":{s % effective_workers(k)} delivered",
                                  hint="merge every rank's state with ucstage.merge_states")
        slots.append((s // effective_workers(k), s % effective_workers(k), files,
                      int(sizes.take(files).sum()) if len(files) else 0))
    if slot is not None:
        picked = [x for x in slots if (x[0], x[1]) == slot]
        if not picked:
            raise InvalidArgument(f"no slot {slot[0]}:{slot[1]}: ranks are 0..{world_size - 1}, "
                                  f"workers 0..{effective_workers(k) - 1}")
        slots = picked
    doc = _json(manifest, state, slots, world_size, k, continued, batch_size)
    if slot is not None:
        doc = doc["slots"][0]
    emit(doc, as_json, lambda c: _render(c, manifest, state, doc, slot is not None))


def _json(manifest: Manifest, state: LoaderState, slots: list[Any], world_size: int,
          k: int, continued: bool, batch_size: int | None) -> dict[str, Any]:
    remaining = sum(len(f) for _, _, f, _ in slots)
    ranks: dict[int, dict[str, Any]] = {}
    for rank, _, files, nbytes in slots:
        r = ranks.setdefault(rank, {"rank": rank, "files": 0, "bytes": 0,
                                    "batches": 0 if batch_size else None})
        r["files"] += len(files)
        r["bytes"] += nbytes
        if batch_size:
            r["batches"] += -(-len(files) // batch_size)
    return {
        "source": manifest.source,
        "fingerprint": manifest.fingerprint,
        "files": len(manifest.entries),
        "epoch": state.epoch,
        "shuffle": state.shuffle,
        "seed": state.seed,
        "shuffle_scope": state.shuffle_scope,
        "equal_length": state.equal_length,
        "saved_layout": {"world_size": state.last.world_size,
                         "num_workers": state.last.num_workers,
                         "nproc_per_node": state.last.nproc_per_node},
        "world_size": world_size,
        "num_workers": k,
        "mode": "continue" if continued else "resplit",
        "resumed_files": state.delivered,
        "remaining_files": remaining,
        "batch_size": batch_size,
        "ranks": list(ranks.values()),
        "slots": [{"rank": rank, "worker": worker,
                   "files": [e.path for e in manifest.take(files)], "bytes": nbytes}
                  for rank, worker, files, nbytes in slots],
    }


def _render(console: Console, manifest: Manifest, state: LoaderState, doc: dict[str, Any],
            one_slot: bool) -> None:
    if one_slot:
        err.print(f"slot {doc['rank']}:{doc['worker']}: {len(doc['files']):,} files left, "
                  f"{format_bytes(doc['bytes'])}")
        for path in doc["files"]:
            console.print(path, markup=False)
        return
    how = ("every slot continues where it stopped" if doc["mode"] == "continue" else
           f"the rest is re-split over {doc['world_size']:,} x "
           f"{max(1, doc['num_workers'])} slots by the slot rule")
    order = f"shuffled (seed {state.seed})" if state.shuffle else "listing order"
    console.print(f"[bold]Resumed epoch {state.epoch}[/] of "
                  f"{escape(manifest.path or manifest.source)}  "
                  f"[dim]fingerprint {manifest.fingerprint[:12]}, {order}[/]")
    console.print(f"{doc['resumed_files']:,} files delivered before the restart (saved on "
                  f"{state.last.world_size} x {state.last.num_workers}); "
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
