"""Delta table -> Parquet files in a volume, via Spark Connect.

``table`` holds :func:`export_table` and :func:`read_table`, ``delta``
reads table names and versions, ``spark`` finds or starts a Spark Connect
server. See docs/export.md and docs/design.md.
"""

from .table import (
    COMPRESSIONS,
    MANIFEST_NAME,
    ExportOptions,
    ExportResult,
    export_table,
    read_manifest,
    read_table,
    suggest_files,
)

__all__ = [
    "COMPRESSIONS",
    "MANIFEST_NAME",
    "ExportOptions",
    "ExportResult",
    "export_table",
    "read_manifest",
    "read_table",
    "suggest_files",
]
