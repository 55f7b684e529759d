"""The export record, ``DEST/_ucstage_export.json``: written by ``ucstage export``,
read by export (to skip an unchanged table) and by ``TableDataset`` (the
files, rows and table version of an export destination).

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
import os
from dataclasses import dataclass
from typing import Any, TypedDict

__all__ = ["RECORD_FORMAT", "RECORD_NAME", "ExportRecord", "ExportedFile", "load_record"]

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
    """:meth:`ExportOptions.as_dict <ucstage.export.options.ExportOptions.as_dict>` of the export."""
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




def load_record(folder: str) -> ExportRecord | None:
    """The record in local ``folder``, or None if there is none or it is unreadable."""
    try:
        with open(os.path.join(folder, RECORD_NAME), encoding="utf-8") as f:
            return ExportRecord.from_json(json.load(f))
    except (OSError, ValueError):
        return None
