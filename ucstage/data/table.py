""":class:`TableDataset`: a table streamed by row group, sharded by the slot rule.

The unit of sharding is the row group: the table's footers are read once
(rank 0 in a job) into a row-group manifest (:mod:`ucstage.tables`), frozen
under the cache root and broadcast; every slot reads its row groups by the
same slot rule as :class:`~ucstage.data.dataset.VolumeDataset`
(``slot_array``, node-stable shuffle, the rank guard). Each row group's
column chunks of the chosen ``columns`` are one cache entry of their own
(ranged reads; :mod:`ucstage.data.tableslot`), fetched ``read_ahead`` row
groups ahead. Rows come out in windows (:mod:`ucstage.tables.rowplan`) cut
into batches of ``batch_rows``; checkpoint state is exact to the row
(:mod:`ucstage.data.tableslot`).

Usage and every argument: docs/training.md, "Tables".
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import params
from ..errors import InvalidArgument
from ..manifest import load
from ..manifest.rowgroups import RowGroupManifest, is_row_group_manifest
from ..sharding import DEFAULT_SHUFFLE_SCOPE
from ..shown import shown
from ..tables import row_groups
from ..tables.filters import row_filter
from ..tables.rowplan import drop_note, equal_batches
from ..volumes.listing import skip_messages
from .frozen import Freezable, Request
from .sharded import ShardedDataset, rule_order
from .tableslot import (
    FORMATS,
    TableTracker,
    UnitCounts,
    check_fill_null,
    check_format,
    group_items,
    slot_batches,
    slot_totals,
)

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..volumes import Volume
    from .channel import LoopView
    from .slotread import Share

__all__ = ["TableDataset"]

_log = logging.getLogger("ucstage")

DEFAULT_WINDOW = 4
DEFAULT_READ_AHEAD = 2


class TableDataset(UnitCounts, Freezable, ShardedDataset):
    """A Delta table, an export or a folder of Parquet files, streamed by row group.

    Args:
        source: a folder of Parquet files (local, ``/Volumes/...``, an fsspec
            or object-store URL), an export destination, a Delta table path
            (with ``_delta_log``) or ``catalog.schema.table`` under
            ``$UCSTAGE_WAREHOUSE``, or a row-group manifest file.
        columns: the columns to read (default: all); only their column
            chunks are fetched.
        filter: only the rows it matches: a ``pyarrow.compute.Expression`` or
            a string such as ``"label >= 3 and split = 'train'"``. Row groups
            that cannot hold a match (partition values, statistics) are left
            out when frozen, and the filter's columns are read then to count
            the matching rows (what ``len()`` counts); its columns are fetched
            with ``columns`` and left out of the batches.
        version: the Delta version (default: the latest).
        batch_rows: rows per batch (default: about one row group per batch).
        format: ``"arrow"`` (``pyarrow.RecordBatch``), ``"torch"`` (a dict of
            tensors; numeric and fixed-size-list columns) or ``"numpy"``.
        fill_null: the value nulls become (needed by ``"torch"`` for a column
            with nulls): a number, bool or str that every chosen column can
            hold (checked when the row groups are frozen).
        shuffle, seed, shuffle_scope, nproc_per_node: as for ``VolumeDataset``,
            over row groups; with ``shuffle`` rows are also shuffled within
            windows of ``shuffle_window`` row groups.
        shuffle_window: row groups per shuffle window (B).
        read_ahead: row groups fetched ahead of the consumer per slot.
        equal_length: ``"pad"`` (or True) or ``"drop"``: every slot yields
            the same number of batches of ``batch_rows`` (needs it).
        cache, cache_dir, max_bytes: the local cache, as for ``VolumeDataset``
            (``max_bytes`` in bytes or a size string such as ``"500M"``).
    """

    state_unit = "row-group"
    tracker_kind = TableTracker

    def __init__(self, source: str | os.PathLike[str], *, columns: Sequence[str] | None = None,
                 version: int | None = None, batch_rows: int | None = None,
                 format: str = "arrow", fill_null: Any = None, shuffle: bool = False,
                 seed: int = 0, shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
                 shuffle_window: int = DEFAULT_WINDOW, nproc_per_node: int | None = None,
                 read_ahead: int = DEFAULT_READ_AHEAD, equal_length: bool | str | None = False,
                 cache: LocalCache | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 max_bytes: int | str | None = None, filter: Any = None) -> None:
        # Types and shapes checked here, by the one rule of each (ucstage/params.py).
        read_ahead = params.whole(read_ahead, "read_ahead")
        if batch_rows is not None:
            batch_rows = params.whole(batch_rows, "batch_rows", minimum=1)
        shuffle_window = params.whole(shuffle_window, "shuffle_window", minimum=1)
        if version is not None:
            version = params.whole(version, "version")
        self._use_cache(cache, cache_dir, max_bytes)
        check_fill_null(fill_null)
        if format not in FORMATS:
            raise InvalidArgument(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
        super().__init__(rule_order(shuffle, seed, shuffle_scope, equal_length), nproc_per_node)
        equal_batches([], batch_rows, self.equal_length)  # needs batch_rows
        self._drop_said = ""  # the drop note this process gave (once, not every epoch)
        self.shuffle_window, self.read_ahead = int(shuffle_window), int(read_ahead)
        self.columns = None if columns is None else list(params.strings(columns, "columns"))
        self.version, self.batch_rows = version, batch_rows
        self.format, self.fill_null = format, fill_null
        self._source = os.fspath(source)
        self._filter = row_filter(filter)  # a bad string fails here, at its character
        self._manifest: RowGroupManifest | None = None
        self._manifest_path: str | None = None
        self._fingerprint: str | None = None
        if is_row_group_manifest(self._source) and os.path.isfile(self._source):
            self._adopt(load(self._source, kind=RowGroupManifest))

    # -- the frozen row groups -------------------------------------------------

    _kind = RowGroupManifest
    _changed = "the row groups of {source} changed since they were frozen"
    _freeze_hint = ("freeze them once (ucstage.manifest.save(ucstage.tables.row_groups(...), "
                    "path)) and pass that file to every rank")

    def _list(self) -> RowGroupManifest:
        manifest = row_groups(self._source, version=self.version, filter=self._filter,
                              fetch=self.cache().fetch)
        # What shard-plan and cache warm print, once per listing (on the rank that lists).
        for line in skip_messages(manifest.source, manifest.refused):
            _log.warning("%s", line)
        return manifest

    def _checked(self, manifest: RowGroupManifest) -> None:
        frozen = manifest.filter["text"] if manifest.filter else None
        if self._filter is not None and frozen != self._filter.text:
            # A frozen listing's rows are its filter's: another would be silently ignored.
            raise InvalidArgument(f"{self._source} was frozen " + (
                f"with filter {shown(frozen)!r}" if frozen else "without a filter")
                + f", not {shown(self._filter.text)!r}",
                hint="pass the table itself with filter=..., or the same filter")
        columns = manifest.check_columns(self.columns)
        check_format(manifest.schema, columns, self.format, self.fill_null)

    def _request(self) -> Request:
        return (("source", self._source), ("version", self.version),
                ("filter", None if self._filter is None else self._filter.text))

    def _get_volume(self) -> Volume:
        return self.freeze().volume()

    _len_needs = "the frozen row groups"

    def __repr__(self) -> str:
        where = "" if self._filter is None else f", filter={self._filter.text!r}"
        return self._repr(f"columns={self.columns}{where}, shuffle={self.shuffle}, "
                          f"seed={self.seed}")

    # -- iteration ---------------------------------------------------------------

    def iter_rows(self, rows: Any, rank: int, *, sharers: int = 1) -> Iterator[Any]:
        """Row groups ``rows``, in order, each one batch of its rows: what a
        :class:`~ucstage.Mix` reads of this table (its item is a row group;
        its read-ahead is a fixed count, so ``sharers`` changes nothing)."""
        return group_items(self, rows, rank)

    def _slot_items(self, tracker: TableTracker, share: Share,  # type: ignore[override]
                    loop: LoopView | None) -> Iterator[Any]:
        count = None
        if self.equal_length is not None:
            totals, _ = slot_totals(self, tracker.layout, tracker)
            count = equal_batches(totals, self.batch_rows, self.equal_length)
            if self.equal_length == "drop" and (tracker.rank, tracker.worker) == (0, 0):
                # One slot of the whole job says it (each process warns once per text).
                note = drop_note(totals, self.batch_rows or 0)
                if note is not None and note != self._drop_said:
                    self._drop_said = note
                    warnings.warn(note, stacklevel=3)
        return slot_batches(self, self.freeze(), tracker, tracker.rank, count)
