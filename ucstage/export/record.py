"""The export record, ``DEST/_ucstage_export.json``, and the result of one export.

The record says what DEST holds and where it came from: table, Delta
version, rows, schema, files and options. The next export compares it with
the table to decide whether there is anything to do. (It is not a
*manifest*: in ucstage that word means the frozen listing of a source,
:mod:`ucstage.manifest`.) Its fields are documented in docs/export.md; the
file's bytes are part of that contract, so :meth:`ExportRecord.to_json`
keeps the key order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from .options import suggest_files

__all__ = ["RECORD_FORMAT", "RECORD_NAME", "ExportRecord", "ExportResult", "ExportedFile"]

RECORD_NAME = "_ucstage_export.json"
"""The record's file name in DEST; the leading ``_`` keeps Parquet globs off it."""
RECORD_FORMAT = "ucstage-export/1"


class ExportedFile(TypedDict):
    """One Parquet file of an export."""

    path: str
    """Relative POSIX path inside DEST (``COL=value/`` folders under partition_by)."""
    bytes: int
    rows: int


@dataclass(frozen=True)
class ExportRecord:
    """What an export wrote into DEST; the contents of ``_ucstage_export.json``."""

    table: str
    """The table as the user named it (canonical form), or its path."""
    source_kind: str
    """``delta`` (read with delta-rs) or ``catalog`` (the server's ``spark.table``)."""
    source_location: str | None
    """The table's folder for ``delta``; None for ``catalog``."""
    delta_version: int | None
    """None when the server could not say; such an export is never skipped."""
    row_count: int
    schema: dict[str, Any]
    """Spark's JSON schema of the exported columns."""
    files: list[ExportedFile]
    """Sorted by path."""
    bytes: int
    options: dict[str, Any]
    """:meth:`ExportOptions.as_dict <ucstage.export.ExportOptions.as_dict>` of the export."""
    created_at: str
    """ISO 8601, UTC, whole seconds."""
    ucstage_version: str

    def to_json(self) -> dict[str, Any]:
        """The record as the file holds it, keys in the documented order."""
        return {
            "format": RECORD_FORMAT,
            "table": self.table,
            "source": {"kind": self.source_kind, "location": self.source_location},
            "delta_version": self.delta_version,
            "row_count": self.row_count,
            "schema": self.schema,
            "files": [dict(f) for f in self.files],
            "bytes": self.bytes,
            "options": self.options,
            "created_at": self.created_at,
            "ucstage_version": self.ucstage_version,
        }

    def dumps(self) -> str:
        """The file's text: two-space indent, UTF-8 as is, one trailing newline."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, data: Any) -> ExportRecord:
        """Read a parsed ``_ucstage_export.json``.

        Raises:
            ValueError: not a record of this format, or a field of the wrong type.
        """
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a {RECORD_FORMAT} record")
        source = _field(data, "source", dict)
        files = _field(data, "files", list)
        for entry in files:
            if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                    and _is_int(entry.get("bytes")) and _is_int(entry.get("rows"))):
                raise ValueError(f"bad file entry {entry!r}")
        version = data.get("delta_version")
        location = source.get("location")
        if not (version is None or _is_int(version)) or not (
                location is None or isinstance(location, str)):
            raise ValueError("bad delta_version or source location")
        return cls(
            table=_field(data, "table", str),
            source_kind=_field(source, "kind", str),
            source_location=location,
            delta_version=version,
            row_count=_field(data, "row_count", int),
            schema=_field(data, "schema", dict),
            files=[ExportedFile(path=f["path"], bytes=f["bytes"], rows=f["rows"])
                   for f in files],
            bytes=_field(data, "bytes", int),
            options=_field(data, "options", dict),
            created_at=_field(data, "created_at", str),
            ucstage_version=_field(data, "ucstage_version", str),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key} is not a {kind.__name__}")
    return value


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
        :func:`~ucstage.export.suggest_files` proposes for that job, and
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
