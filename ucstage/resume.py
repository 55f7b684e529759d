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
from typing import Any

from .errors import InvalidArgument, ResumeMismatch
from .sharding import EQUAL_LENGTH_MODES, EpochOrder, Segment

__all__ = ["FORMAT", "LoaderState", "load_state", "merge_states"]

FORMAT = "ucstage-loader-state"
VERSION = 1


@dataclass(frozen=True)
class LoaderState:
    """A parsed loader state (the dict form is what ``state_dict()`` returns)."""

    fingerprint: str
    files: int
    seed: int
    epoch: int
    shuffle: bool
    shuffle_scope: str
    equal_length: str | None
    segments: tuple[Segment, ...]
    rank: int | None = None
    """The rank that saved it, or None for a merged (global) state."""
    finished: bool = False
    """The epoch was delivered to its end when the state was saved."""

    @property
    def last(self) -> Segment:
        return self.segments[-1]

    @property
    def order(self) -> EpochOrder:
        return EpochOrder(self.files, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch,
                          equal_length=self.equal_length, shuffle_scope=self.shuffle_scope)

    @property
    def complete(self) -> bool:
        """Every slot's count is known (a merged state, or a one-slot job)."""
        return all(d is not None for seg in self.segments for d in seg.delivered)

    @property
    def delivered(self) -> int:
        """Files delivered in this epoch so far (known counts, padding included)."""
        return sum(d or 0 for seg in self.segments for d in seg.delivered)

    def to_dict(self) -> dict[str, Any]:
        last = self.last
        return {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": self.fingerprint,
            "files": self.files,
            "seed": self.seed,
            "epoch": self.epoch,
            "shuffle": self.shuffle,
            "shuffle_scope": self.shuffle_scope,
            "equal_length": self.equal_length,
            "world_size": last.world_size,
            "nproc_per_node": last.nproc_per_node,
            "num_workers": last.num_workers,
            "rank": self.rank,
            "finished": self.finished,
            "segments": [{"world_size": s.world_size, "num_workers": s.num_workers,
                          "nproc_per_node": s.nproc_per_node, "delivered": list(s.delivered)}
                         for s in self.segments],
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
        if doc.get("version") != VERSION:
            raise InvalidArgument(f"state has version {doc.get('version')!r}; this ucstage "
                                  f"reads version {VERSION}")
        try:
            segments = tuple(
                Segment(_int(s["world_size"]), _int(s["num_workers"]),
                        tuple(None if d is None else _int(d) for d in s["delivered"]),
                        None if s.get("nproc_per_node") is None else _int(s["nproc_per_node"]))
                for s in doc["segments"])
            state = cls(
                fingerprint=str(doc["fingerprint"]), files=_int(doc["files"]),
                seed=_int(doc["seed"]), epoch=_int(doc["epoch"]),
                shuffle=bool(doc["shuffle"]), shuffle_scope=str(doc.get("shuffle_scope", "global")),
                equal_length=doc.get("equal_length"), segments=segments,
                rank=None if doc.get("rank") is None else _int(doc["rank"]),
                finished=bool(doc.get("finished", False)))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"state is malformed: {exc!r}") from exc
        if not segments:
            raise InvalidArgument("state is malformed: it has no segment")
        if state.equal_length is not None and state.equal_length not in EQUAL_LENGTH_MODES:
            raise InvalidArgument(f"state has equal_length {state.equal_length!r}")
        for seg in segments:
            if seg.world_size < 1 or seg.num_workers < 0 or len(seg.delivered) != seg.slots \
                    or any(d is not None and d < 0 for d in seg.delivered):
                raise InvalidArgument(
                    f"state is malformed: a segment of world_size {seg.world_size} x "
                    f"num_workers {seg.num_workers} lists {len(seg.delivered)} counts")
        return state

    def check_fits(self, *, fingerprint: str, files: int, seed: int, shuffle: bool,
                   equal_length: str | None, shuffle_scope: str = "global") -> None:
        """Refuse to resume another listing or read order (never restart silently).

        Raises:
            ResumeMismatch: naming what differs.
        """
        wrong = []
        if fingerprint != self.fingerprint or files != self.files:
            wrong.append(f"listing {self.fingerprint[:12]} ({self.files} files) in the state, "
                         f"{fingerprint[:12]} ({files} files) here")
        if seed != self.seed:
            wrong.append(f"seed {self.seed} in the state, {seed} here")
        if shuffle != self.shuffle:
            wrong.append(f"shuffle {self.shuffle} in the state, {shuffle} here")
        if self.shuffle and shuffle_scope != self.shuffle_scope:
            wrong.append(f"shuffle_scope {self.shuffle_scope!r} in the state, "
                         f"{shuffle_scope!r} here")
        if equal_length != self.equal_length:
            wrong.append(f"equal_length {self.equal_length!r} in the state, {equal_length!r} here")
        if wrong:
            raise ResumeMismatch(
                "cannot resume epoch " f"{self.epoch} from this state: " + "; ".join(wrong),
                hint="resume with the listing (a manifest) and the options the state was "
                     "saved with, or start without the state")


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
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
                       finished=first.finished)
        if same != first or len(other.segments) != len(first.segments) \
                or other.segments[:-1] != first.segments[:-1] \
                or _layout(other.last) != _layout(first.last):
            raise InvalidArgument(
                f"states are of different runs or epochs (rank {first.rank}: epoch "
                f"{first.epoch}, {first.last.world_size} x {first.last.num_workers}; rank "
                f"{other.rank}: epoch {other.epoch}, {other.last.world_size} x "
                f"{other.last.num_workers})",
                hint="merge the states saved at one step of one run")
    last = first.last
    k = max(1, last.num_workers)
    counts: list[int | None] = [None] * last.slots
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
    merged = replace(first, rank=None, finished=all(p.finished for p in parsed),
                     segments=(*first.segments[:-1], replace(last, delivered=tuple(counts))))
    return merged.to_dict()


def _layout(seg: Segment) -> tuple[int, int, int | None]:
    return seg.world_size, seg.num_workers, seg.nproc_per_node


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
    if isinstance(doc, list):
        doc = merge_states(doc)
    return LoaderState.from_dict(doc)
