"""The result of one export; the record itself (``_ucstage_export.json``)
lives in :mod:`ucstage.tables.record`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tables.record import ExportedFile, ExportRecord
from .options import suggest_files

__all__ = ["ExportResult"]


@dataclass
class ExportResult:
    """What :func:`~ucstage.export.export_table` did."""

    dest: str
    """The export folder (resolved local path)."""
    record: ExportRecord
    """The record now in DEST."""
    skipped_unchanged: bool
    """True when nothing was written because table version and options matched."""
    seconds: float
    warnings: list[str] = field(default_factory=list)
    """What a person should know although the export succeeded, one sentence each
    (``where`` selected no rows). Messages name the parameters, as errors do."""
    row_groups: list[list[int]] = field(default_factory=list)
    """The rows of each row group the footers hold, one list per file of
    :attr:`record`'s ``files``, in that order."""

    @property
    def files(self) -> list[ExportedFile]:
        return [f.copy() for f in self.record.files]

    @property
    def row_count(self) -> int:
        return self.record.row_count

    def to_json(self, world_size: int | None = None,
                num_workers: int | Sequence[int] | None = None) -> dict[str, Any]:
        """The documented JSON document of an export (``ucstage export --json``).

        The record's fields, then ``skipped_unchanged``, ``seconds``, ``dest``,
        ``warnings`` and ``row_groups`` (what the footers hold); with
        ``world_size`` and ``num_workers`` (one int for every rank, or one per
        rank) also ``suggested_files``, the file count
        :func:`~ucstage.export.options.suggest_files` proposes for that job, and
        ``row_group_slots``, the slots its row groups fill.
        """
        data = {**self.record.to_json(), "skipped_unchanged": self.skipped_unchanged,
                "seconds": round(self.seconds, 3), "dest": self.dest,
                "warnings": list(self.warnings), "row_groups": self.row_group_summary()}
        if world_size is not None and num_workers is not None:
            data["suggested_files"] = suggest_files(len(self.record.files), world_size,
                                                    num_workers)
            data["row_group_slots"] = self.row_group_slots(world_size, num_workers)
        return data

    def row_group_summary(self) -> dict[str, Any]:
        """``count`` row groups, ``rows_min`` .. ``rows_max`` rows in each
        (0 when there are none), and ``per_file``: the count in each file."""
        rows = [r for groups in self.row_groups for r in groups]
        return {"count": len(rows), "rows_min": min(rows, default=0),
                "rows_max": max(rows, default=0),
                "per_file": [len(groups) for groups in self.row_groups]}

    def row_group_slots(self, world_size: int,
                        num_workers: int | Sequence[int]) -> dict[str, Any]:
        """The loader slots the row groups fill, by the slot rule with row
        groups as its unit (listing order, no shuffle): ``slots`` in all,
        ``filled`` (reading at least one row group), and the least and most
        ``row_groups`` and ``rows`` a filled slot reads."""
        from ..sharding import Layout, ReadOrder, shard_plan

        rows = [r for groups in self.row_groups for r in groups]
        layout = Layout(world_size, num_workers)
        # The plan weighs each unit by the number given: rows, here.
        planned = shard_plan(rows, layout, ReadOrder(len(rows)))
        counts = [s.count for s in planned.slots]
        weights = [s.bytes for s in planned.slots]
        return {"slots": layout.slots, "filled": len(planned.slots),
                "row_groups": [min(counts, default=0), max(counts, default=0)],
                "rows": [min(weights, default=0), max(weights, default=0)]}
