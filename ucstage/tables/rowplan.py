"""The rows one slot delivers, in order: row groups by the slot rule, rows
within shuffle windows, equal-length batch counts. Pure arithmetic on the
row-group manifest (no I/O), so the dataset, the audit and ``shard-plan``
compute the same thing.

**Rows in a window.** A slot reads its row groups in windows of ``window``
consecutive positions of its run. Without ``shuffle`` the window is one row
group read in file order. With ``shuffle`` each row group's rows are first
permuted by a seed of (seed, epoch, row group) — the same in whatever slot
it lands — and the window's rows are then interleaved by a seed of (seed,
epoch, slot key, window): a uniform permutation of the window's rows, in
which every row group's rows still come out in its own permuted order. So
"rows of row group ``g`` delivered" is always a prefix of that order, and a
resume, on any layout, skips exactly that many rows of ``g`` (the state's
``partial``), replaying the interrupted window exactly on the same layout.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument

__all__ = ["DROP_WARN_SHARE", "EQUAL_MODES", "WindowPlan", "drop_note", "equal_batches",
           "row_permutation", "slot_rows", "windows"]

EQUAL_MODES = ("pad", "drop")
DROP_WARN_SHARE = 0.05
"""``equal_length="drop"`` dropping more than this share of the rows is worth a word."""


def row_permutation(rows: int, seed: int, epoch: int, group: int) -> Any:
    """The order row group ``group``'s rows are read in with ``shuffle`` (int64)."""
    import numpy as np

    return np.random.default_rng([seed, epoch, group, 0x7AB1E]).permutation(rows)


@dataclass(frozen=True)
class WindowPlan:
    """One window of a slot: its row groups and the rows it still delivers, in order.

    Without shuffle the window is one row group read in file order, and its
    per-row arrays are made only when asked for: a reader takes ``count``
    rows from stored row ``skipped`` on (no per-row work per window)."""

    groups: Any
    """Row-group indices of the window (int64), in run order."""
    first: int
    """The window's first position in the run."""
    count: int
    """Rows the window delivers."""
    skipped: int = 0
    """In file order: the stored rows of the one row group delivered before."""
    shuffled: tuple[Any, Any] | None = None
    """With shuffle: (:attr:`label`, :attr:`row`)."""

    @functools.cached_property
    def label(self) -> Any:
        """Per delivered row, in delivery order: its row group's number in ``groups``."""
        import numpy as np

        return self.shuffled[0] if self.shuffled is not None else \
            np.zeros(self.count, dtype=np.int64)

    @functools.cached_property
    def row(self) -> Any:
        """Per delivered row: its row index in that row group (as stored in the file)."""
        import numpy as np

        return self.shuffled[1] if self.shuffled is not None else \
            np.arange(self.skipped, self.skipped + self.count, dtype=np.int64)


def windows(run: Any, start: int, rows: Any, skip: Mapping[int, int], *, window: int,
            shuffle: bool, seed: int, epoch: int, slot_key: Sequence[int]
            ) -> Iterator[WindowPlan]:
    """The windows of a slot's ``run`` (row-group indices) from position ``start``.

    ``rows``: rows per row group (the manifest's ``rows_per_group``);
    ``skip``: rows of a row group already delivered (a resume's ``partial``);
    positions before ``start`` are delivered. Without ``shuffle`` a window
    is one row group.
    """
    import numpy as np

    size = window if shuffle else 1
    first = (start // size) * size
    for lo in range(first, len(run), size):
        groups = np.asarray(run[lo:lo + size], dtype=np.int64)
        sizes = rows[groups].astype(np.int64)
        done = np.array([sizes[i] if lo + i < start else min(int(skip.get(int(g), 0)),
                                                              int(sizes[i]))
                         for i, g in enumerate(groups)], dtype=np.int64)
        if not shuffle:
            # One row group in file order: its rows from the skip on, with no
            # per-row array (they were most of the main thread's CPU of a warm epoch).
            skipped = int(done[0]) if len(groups) else 0
            yield WindowPlan(groups, lo, int(sizes.sum()) - skipped, skipped)
            continue
        label = np.repeat(np.arange(len(groups), dtype=np.int64), sizes)
        if len(label) > 1:
            rng = np.random.default_rng([seed, epoch, *slot_key, lo, 0x5107])
            label = label[rng.permutation(len(label))]
        # occ: the k-th row of its row group in delivery order (a window holds
        # few row groups: their numbers sort as int16, by radix)
        order = np.argsort(label.astype(np.int16) if len(groups) < 2**15 else label,
                           kind="stable")
        occ = np.empty(len(label), dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        occ[order] = np.arange(len(label), dtype=np.int64) - np.repeat(offsets[:-1], sizes)
        keep = occ >= done[label]
        label, occ = label[keep], occ[keep]
        # each row group's permutation, one after another: a row's stored index
        # is its group's permutation at its occ (one gather, not a pass per group)
        perms = [row_permutation(int(n), seed, epoch, int(g))
                 for g, n in zip(groups, sizes, strict=True)]
        flat = np.concatenate(perms) if perms else np.zeros(0, dtype=np.int64)
        row = flat[offsets[:-1][label] + occ]
        yield WindowPlan(groups, lo, len(label), shuffled=(label, row))


def slot_rows(run: Any, start: int, rows: Any, skip: Mapping[int, int]) -> int:
    """Rows a slot still delivers: its run from ``start``, less what ``skip`` says."""
    import numpy as np

    rest = np.asarray(run[start:], dtype=np.int64)
    total = int(rows[rest].sum()) if len(rest) else 0
    return total - sum(min(int(skip.get(int(g), 0)), int(rows[g])) for g in rest
                       if int(g) in skip)


def equal_batches(slot_totals: Sequence[int], batch_rows: int | None,
                  mode: str | None) -> int | None:
    """Batches of ``batch_rows`` every slot yields with ``equal_length`` (None
    without): ``"drop"`` the fewest full batches any slot has, ``"pad"`` the
    most any slot needs (short slots re-read their own rows from the start).

    Raises:
        InvalidArgument: ``equal_length`` without ``batch_rows``; ``"pad"`` with
            a slot that has no rows to re-read.
    """
    if mode is None:
        return None
    if not batch_rows:
        raise InvalidArgument("equal_length counts batches, so it needs batch_rows",
                              hint="pass batch_rows=N (rows per batch)")
    if not slot_totals:
        return 0
    if mode == "drop":
        return min(slot_totals) // batch_rows
    if any(t == 0 for t in slot_totals) and max(slot_totals):
        raise InvalidArgument(
            f'equal_length="pad" needs rows in every slot: {sum(1 for t in slot_totals if not t)}'
            f" of {len(slot_totals)} slots have none",
            hint='use fewer slots (ranks x workers) than row groups, or equal_length="drop"')
    return -(-max(slot_totals) // batch_rows)


def _kept(slot_totals: Sequence[int], batch_rows: int) -> int:
    return len(slot_totals) * (min(slot_totals) // batch_rows) * batch_rows


def drop_note(slot_totals: Sequence[int], batch_rows: int) -> str | None:
    """What ``equal_length="drop"`` costs, in words, when it drops more than
    :data:`DROP_WARN_SHARE` of the rows (None otherwise): the share dropped,
    and what would drop less. Every slot yields as many full batches as the
    slot with the fewest rows, so the loss is the slots' imbalance plus each
    slot's last partial batch; a smaller ``batch_rows`` helps only the second."""
    total = sum(slot_totals)
    if not total or not batch_rows:
        return None
    kept = _kept(slot_totals, batch_rows)
    share = 1 - kept / total
    if share <= DROP_WARN_SHARE:
        return None
    best = 1 - _kept(slot_totals, 1) / total  # no partial batch at all
    smaller = ""
    # The largest batch_rows that recovers at least half of what partial batches lose.
    for b in range(batch_rows - 1, 0, -1):
        if 1 - _kept(slot_totals, b) / total <= best + (share - best) / 2:
            if share - (1 - _kept(slot_totals, b) / total) > DROP_WARN_SHARE / 2:
                smaller = (f"; batch_rows={b} would drop "
                           f"{1 - _kept(slot_totals, b) / total:.0%}")
            break
    n = len(slot_totals)
    slots = "the one slot" if n == 1 else f"every one of the {n:,} slots"
    return (f'equal_length="drop" keeps {kept:,} of {total:,} rows per epoch ({share:.0%} '
            f"dropped): {slots} yields "
            f"{min(slot_totals) // batch_rows:,} batches of {batch_rows:,} rows, as many as the "
            f"slot with the fewest rows ({min(slot_totals):,}). equal_length=\"pad\" drops "
            "nothing (short slots re-read rows)" + smaller
            + "; fewer slots (ranks x num_workers) even them out")
