"""Loader states for resuming an epoch: their format, checks and merging.

A state is small JSON data (docs/training.md, "Checkpoint and resume"): what
decides the epoch's read order (fingerprint, file count, seed, epoch,
shuffle and its scope, equal_length) and, per *segment* of the epoch (a
stretch run with one layout), how many files each slot delivered to the
training loop. It never lists files: the slot rule recomputes them
(:func:`ucstage.sharding.resume_slots`).

Torch-free on purpose: ``ucstage shard-plan --resume`` reads states too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

from .errors import NESTED_TOO_DEEP, InvalidArgument, ResumeMismatch
from .sharding import Layout, ReadOrder, Segment, resume_slots

__all__ = ["FORMAT", "LoaderState", "ResumePlan", "SlotRest", "load_state", "merge_states",
           "resume_plan"]

FORMAT = "ucstage-loader-state"
VERSION = 2
"""Version 2 added ``unit`` (``"file"``, ``"row-group"`` or ``"sample-block"``)
and ``partial`` (rows delivered of row groups begun but not finished, or
samples of a shard's blocks); version 1 states (files, nothing partial) still load."""
READS = (1, 2)
UNITS = ("file", "row-group", "sample-block")


@dataclass(frozen=True)
class LoaderState:
    """A parsed loader state (the dict form is what ``state_dict()`` returns)."""

    fingerprint: str
    order: ReadOrder
    """What decides the epoch's read order: files, shuffle, seed, epoch, scope, equal_length."""
    segments: tuple[Segment, ...]
    rank: int | None = None
    """The rank that saved it, or None for a merged (global) state."""
    finished: bool = False
    """The epoch was delivered to its end when the state was saved."""
    unit: str = "file"
    """What the read order orders: ``"file"`` (VolumeDataset), ``"row-group"``
    (TableDataset, whose segments count row groups delivered whole) or
    ``"sample-block"`` (ShardDataset: blocks of a shard's samples, the same way)."""
    partial: tuple[tuple[int, int], ...] = ()
    """(row group, rows delivered) of row groups begun but not delivered whole
    (TableDataset; samples of blocks for ShardDataset): a resume skips exactly those."""

    @property
    def last(self) -> Segment:
        return self.segments[-1]

    @property
    def complete(self) -> bool:
        """Every slot's count is known (a merged state, or a one-slot job)."""
        return all(d is not None for seg in self.segments for d in seg.delivered)

    @property
    def delivered(self) -> int:
        """Files delivered in this epoch so far (known counts, padding included)."""
        return sum(d or 0 for seg in self.segments for d in seg.delivered)

    def to_dict(self) -> dict[str, Any]:
        order, last = self.order, self.last.layout
        return {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "files": order.n,
            "seed": order.seed,
            "epoch": order.epoch,
            "shuffle": order.shuffle,
            "shuffle_scope": order.shuffle_scope,
            "equal_length": order.equal_length,
            "world_size": last.world_size,
            "nproc_per_node": last.nproc_per_node,
            "num_workers": last.num_workers,
            "rank": self.rank,
            "finished": self.finished,
            "segments": [{"world_size": s.layout.world_size, "num_workers": s.layout.num_workers,
                          "nproc_per_node": s.layout.nproc_per_node,
                          "delivered": list(s.delivered)}
                         for s in self.segments],
            "unit": self.unit,
            "partial": [list(p) for p in self.partial],
        }

    @classmethod
    def from_dict(cls, doc: Any) -> LoaderState:
        """Parse and check a state dict.

        Raises:
            InvalidArgument: not a ucstage loader state, or malformed.
        """
        if isinstance(doc, LoaderState):
            return doc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise InvalidArgument("state is not a ucstage loader state (no "
                                  f"\"format\": \"{FORMAT}\")",
                                  hint="pass what DataLoader.state_dict() returned")
        if doc.get("version") not in READS:
            raise InvalidArgument(f"state has version {doc.get('version')!r}; this ucstage "
                                  f"reads versions {', '.join(map(str, READS))}")
        try:
            return _parse(cls, doc)
        except KeyError as exc:
            raise InvalidArgument(f"state is malformed: it has no {exc.args[0]!r}",
                                  hint=_TAMPERED) from exc

    def check_partial(self, rows: Sequence[int] | np.ndarray) -> None:
        """Refuse a ``partial`` row count that its row group does not have
        (``rows``: rows per row group of the listing ``check_fits`` accepted).

        Raises:
            ResumeMismatch: naming the row group and both counts.
        """
        for group, done in self.partial:
            if done > int(rows[group]):
                raise ResumeMismatch(
                    f"the state's \"partial\" says {done} rows of row group {group} were "
                    f"delivered, but it has {int(rows[group])}", hint=_TAMPERED)

    def check_fits(self, fingerprint: str, order: ReadOrder) -> None:
        """Refuse to resume another listing (``fingerprint``, ``order.n``) or read
        order (never restart silently); ``order.epoch`` is not compared.

        Raises:
            ResumeMismatch: naming what differs.
        """
        saved = self.order
        wrong = []
        if fingerprint != self.fingerprint or order.n != saved.n:
            wrong.append(f"listing {self.fingerprint[:12]} ({saved.n} files) in the state, "
                         f"{fingerprint[:12]} ({order.n} files) here")
        if order.seed != saved.seed:
            wrong.append(f"seed {saved.seed} in the state, {order.seed} here")
        if order.shuffle != saved.shuffle:
            wrong.append(f"shuffle {saved.shuffle} in the state, {order.shuffle} here")
        if saved.shuffle and order.shuffle_scope != saved.shuffle_scope:
            wrong.append(f"shuffle_scope {saved.shuffle_scope!r} in the state, "
                         f"{order.shuffle_scope!r} here")
        if order.equal_length != saved.equal_length:
            wrong.append(f"equal_length {saved.equal_length!r} in the state, "
                         f"{order.equal_length!r} here")
        if wrong:
            raise ResumeMismatch(
                "cannot resume epoch " f"{saved.epoch} from this state: " + "; ".join(wrong),
                hint="resume with the listing (a manifest) and the options the state was "
                     "saved with, or start without the state")


_TAMPERED = "pass the state as DataLoader.state_dict() returned it (and merge_states merged it)"


def _parse(cls: type[LoaderState], doc: dict[str, Any]) -> LoaderState:
    """Every field of a state dict checked, each refusal naming its field: the
    one place a state's values are validated (what the slot rule and the
    trackers then trust)."""
    if not isinstance(doc["segments"], list) or not doc["segments"]:
        raise _malformed("segments", "must be a list of at least one segment",
                         doc["segments"])
    segments = tuple(_segment(seg, f"segments[{i}]") for i, seg in enumerate(doc["segments"]))
    order = _order(doc)
    unit = doc.get("unit", "file")
    if unit not in UNITS:
        raise _malformed("unit", f"must be one of {', '.join(map(repr, UNITS))}", unit)
    partial = _partial(doc.get("partial", []), order.n, unit)
    rank = doc.get("rank")
    if rank is not None:
        rank = _int(rank, "rank")
        world = segments[-1].layout.world_size
        if rank >= world:
            raise _malformed("rank", f"must be below the last segment's world_size {world}",
                             rank)
    fingerprint = doc["fingerprint"]
    if not isinstance(fingerprint, str) or not fingerprint:
        raise _malformed("fingerprint", "must be the listing's fingerprint (text)", fingerprint)
    return cls(fingerprint=fingerprint, order=order, segments=segments, rank=rank,
               finished=_bool(doc.get("finished", False), "finished"), unit=unit,
               partial=partial)


def _malformed(field: str, rule: str, value: Any) -> InvalidArgument:
    return InvalidArgument(f"state is malformed: \"{field}\" {rule}, got {value!r}",
                           hint=_TAMPERED)


def _order(doc: Any) -> ReadOrder:
    """A state's read order (its values checked by ReadOrder)."""
    equal_length = doc.get("equal_length")
    if equal_length is not None and not isinstance(equal_length, str):
        raise _malformed("equal_length", "must be null, \"pad\" or \"drop\"", equal_length)
    scope = doc.get("shuffle_scope", "global")
    if not isinstance(scope, str):
        raise _malformed("shuffle_scope", "must be \"global\" or \"node\"", scope)
    try:
        # No scope: a state saved before the node scope existed, which was global.
        return ReadOrder(_int(doc["files"], "files"), shuffle=_bool(doc["shuffle"], "shuffle"),
                         seed=_int(doc["seed"], "seed", minimum=None),
                         epoch=_int(doc["epoch"], "epoch"), equal_length=equal_length,
                         shuffle_scope=scope)
    except InvalidArgument as exc:
        if exc.message.startswith("state is malformed"):
            raise
        raise InvalidArgument(f"state is malformed: {exc.message}", hint=_TAMPERED) from exc


def _segment(doc: Any, where: str) -> Segment:
    """One segment of a state's ``segments`` list, checked."""
    if not isinstance(doc, dict):
        raise _malformed(where, "must be an object", doc)
    world = _int(doc["world_size"], f"{where}.world_size", minimum=1)
    k = _int(doc["num_workers"], f"{where}.num_workers")
    nproc = doc.get("nproc_per_node")
    nproc = None if nproc is None else _int(nproc, f"{where}.nproc_per_node", minimum=1)
    counts = doc["delivered"]
    if not isinstance(counts, list) or len(counts) != world * max(1, k):
        raise _malformed(f"{where}.delivered", f"must list one count per slot of world_size "
                                               f"{world} x num_workers {k}", counts)
    delivered = tuple(None if d is None else _int(d, f"{where}.delivered[{j}]")
                      for j, d in enumerate(counts))
    try:
        return Segment(Layout(world, k, nproc), delivered)
    except InvalidArgument as exc:
        raise InvalidArgument(f"state is malformed: {where}: {exc.message}",
                              hint=_TAMPERED) from exc


def _partial(doc: Any, groups: int, unit: str) -> tuple[tuple[int, int], ...]:
    """``partial``: (row group, rows delivered) pairs, each group once, within the listing."""
    if not isinstance(doc, list):
        raise _malformed("partial", "must be a list of [row group, rows] pairs", doc)
    if doc and unit == "file":
        raise _malformed("partial", "must be empty for unit \"file\"", doc)
    pairs = []
    for j, pair in enumerate(doc):
        if not isinstance(pair, list) or len(pair) != 2:
            raise _malformed(f"partial[{j}]", "must be a [row group, rows] pair", pair)
        group = _int(pair[0], f"partial[{j}][0] (row group)")
        if group >= groups:
            raise _malformed(f"partial[{j}][0] (row group)",
                             f"must be below the {groups} row groups of \"files\"", group)
        pairs.append((group, _int(pair[1], f"partial[{j}][1] (rows)", minimum=1)))
    if len({g for g, _ in pairs}) < len(pairs):
        raise _malformed("partial", "must name each row group once", doc)
    return tuple(sorted(pairs))


def _int(value: Any, field: str, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(field, "must be a whole number", value)
    if minimum is not None and value < minimum:
        raise _malformed(field, f"must be {minimum} or more", value)
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _malformed(field, "must be true or false", value)
    return value


def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The global state of a run from the states its ranks saved.

    Every rank of the new run passes the result to ``load_state_dict``,
    whatever its layout. Each slot's count comes from the state of the rank
    that ran it.

    Raises:
        InvalidArgument: the states are of different runs or epochs, two
            states disagree on a slot, or a rank's state is missing.
    """
    parsed = [LoaderState.from_dict(s) for s in states]
    if not parsed:
        raise InvalidArgument("states is empty: pass the state of every rank")
    first = parsed[0]
    for other in parsed[1:]:
        same = replace(other, segments=first.segments, rank=first.rank,
                       finished=first.finished, partial=first.partial)
        if same != first or len(other.segments) != len(first.segments) \
                or other.segments[:-1] != first.segments[:-1] \
                or other.last.layout != first.last.layout:
            one, two = first.last.layout, other.last.layout
            raise InvalidArgument(
                f"states are of different runs or epochs (rank {first.rank}: epoch "
                f"{first.order.epoch}, {one.world_size} x {one.num_workers}; rank "
                f"{other.rank}: epoch {other.order.epoch}, {two.world_size} x "
                f"{two.num_workers})",
                hint="merge the states saved at one step of one run")
    last = first.last
    k = last.layout.workers
    counts: list[int | None] = [None] * last.layout.slots
    for state in parsed:
        for s, d in enumerate(state.last.delivered):
            if d is None:
                continue
            if counts[s] is not None and counts[s] != d:
                raise InvalidArgument(f"states disagree on slot {s // k}:{s % k} "
                                      f"({counts[s]} and {d} files delivered)")
            counts[s] = d
    missing = sorted({s // k for s, d in enumerate(counts) if d is None})
    if missing:
        raise InvalidArgument(
            f"no state for rank{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing[:10]))}", hint="pass the state of every rank")
    partial: dict[int, int] = {}
    for state in parsed:  # each rank's row groups begun; the most delivered wins
        for g, n in state.partial:
            partial[g] = max(partial.get(g, 0), n)
    merged = replace(first, rank=None, finished=all(p.finished for p in parsed),
                     segments=(*first.segments[:-1], replace(last, delivered=tuple(counts))),
                     partial=tuple(sorted(partial.items())))
    return merged.to_dict()


def load_state(path: str | os.PathLike[str]) -> LoaderState:
    """Read a state saved as JSON (one state, or a list of per-rank states to merge)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError as exc:
        raise InvalidArgument(f"resume state {os.fspath(path)} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"resume state {os.fspath(path)} is not readable JSON: {exc}") \
            from exc
    except RecursionError as exc:  # json's decoder recurses once per level
        raise InvalidArgument(f"resume state {os.fspath(path)} is {NESTED_TOO_DEEP}") from exc
    if isinstance(doc, list):
        doc = merge_states(doc)
    return LoaderState.from_dict(doc)


@dataclass(frozen=True)
class SlotRest:
    """What one slot of the new layout still reads of a resumed epoch."""

    rank: int
    worker: int
    files: np.ndarray
    """Listing rows, in the order the slot reads them."""
    bytes: int


@dataclass(frozen=True)
class ResumePlan:
    """A resumed epoch on a new layout (:func:`resume_plan`), slot by slot."""

    state: LoaderState
    layout: Layout
    continued: bool
    """Same layout as the state's: every slot continues where it stopped
    (else what is left is re-split over the new slots)."""
    slots: list[SlotRest]
    """Every slot of ``layout``, in slot order."""

    @property
    def remaining_files(self) -> int:
        return sum(len(s.files) for s in self.slots)

    def slot(self, rank: int, worker: int) -> SlotRest:
        """Slot ``rank:worker``'s rest.

        Raises:
            InvalidArgument: no such slot in the layout.
        """
        for s in self.slots:
            if (s.rank, s.worker) == (rank, worker):
                return s
        raise InvalidArgument(f"no slot {rank}:{worker}: ranks are 0..{self.layout.world_size - 1}, "
                              f"workers 0..{self.layout.workers - 1}")

    def rank_totals(self, batch_size: int | None = None) -> list[dict[str, Any]]:
        """Per rank with a slot listed: files, bytes and (with ``batch_size``) the
        batches a DataLoader makes of them (each worker batches its own files)."""
        ranks: dict[int, dict[str, Any]] = {}
        for s in self.slots:
            r = ranks.setdefault(s.rank, {"rank": s.rank, "files": 0, "bytes": 0,
                                          "batches": 0 if batch_size else None})
            r["files"] += len(s.files)
            r["bytes"] += s.bytes
            if batch_size:
                r["batches"] += -(-len(s.files) // batch_size)
        return list(ranks.values())


def resume_plan(state: LoaderState, layout: Layout, *, fingerprint: str,
                sizes: Sequence[int] | np.ndarray) -> ResumePlan:
    """What every slot of ``layout`` reads to finish the state's epoch over the
    listing of ``fingerprint`` with file ``sizes`` (``shard-plan --resume``).

    Raises:
        ResumeMismatch: the state is of another listing.
        InvalidArgument: the state does not hold every slot's count (a single
            rank's state: merge them first).
    """
    import numpy as np

    state.check_fits(fingerprint, replace(state.order, n=len(sizes)))
    chain, rest = resume_slots(state.order, state.segments, layout)
    size_arr = np.asarray(sizes, dtype=np.int64)
    slots = []
    for s, files in enumerate(rest):
        slot = layout.slot_at(s)
        if files is None:
            raise InvalidArgument(f"the state does not say what slot {slot} delivered",
                                  hint="merge every rank's state with ucstage.merge_states")
        slots.append(SlotRest(slot.rank, slot.worker, files,
                              int(size_arr.take(files).sum()) if len(files) else 0))
    return ResumePlan(state, layout, len(chain) == len(state.segments), slots)
