"""The result of one export; the record itself (``_ucstage_export.json``)
lives in :mod:`ucstage.tables.record`, re-exported here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tables.record import RECORD_FORMAT, RECORD_NAME, ExportedFile, ExportRecord
from .options import suggest_files

__all__ = ["RECORD_FORMAT", "RECORD_NAME", "ExportRecord", "ExportResult", "ExportedFile"]


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

    @property
    def files(self) -> list[ExportedFile]:
        return [f.copy() for f in self.record.files]

    @property
    def row_count(self) -> int:
        return self.record.row_count

    def to_json(self, world_size: int | None = None,
                num_workers: int | Sequence[int] | None = None) -> dict[str, Any]:
        """The documented JSON document of an export (``ucstage export --json``).

        The record's fields, then ``skipped_unchanged``, ``seconds``, ``dest``
        and ``warnings``; with ``world_size`` and ``num_workers`` (one int for
        every rank, or one per rank) also ``suggested_files``, the file count
        :func:`~ucstage.export.suggest_files` proposes for that job.
        """
        data = {**self.record.to_json(), "skipped_unchanged": self.skipped_unchanged,
                "seconds": round(self.seconds, 3), "dest": self.dest,
                "warnings": list(self.warnings)}
        if world_size is not None and num_workers is not None:
            data["suggested_files"] = suggest_files(len(self.record.files), world_size,
                                                    num_workers)
        return data
