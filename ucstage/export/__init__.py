"""Delta table -> Parquet files in a volume, via Spark Connect.

``table`` holds :func:`export_table` and :func:`read_table` (source, Spark
dataframe, the steps in order); ``dest`` the destination (checks, lock,
staging, verification, the swap); ``record`` the export record
``DEST/_ucstage_export.json`` and the result type; ``options`` the output
options; ``delta`` reads table names and versions; ``spark`` finds or starts
a Spark Connect server. See docs/export.md and docs/design.md.
"""

from .dest import read_record
from .options import COMPRESSIONS, ExportOptions, suggest_files
from .record import RECORD_FORMAT, RECORD_NAME, ExportedFile, ExportRecord, ExportResult
from .table import export_table, read_table

__all__ = [
    "COMPRESSIONS",
    "RECORD_FORMAT",
    "RECORD_NAME",
    "ExportOptions",
    "ExportRecord",
    "ExportResult",
    "ExportedFile",
    "export_table",
    "read_record",
    "read_table",
    "suggest_files",
]
