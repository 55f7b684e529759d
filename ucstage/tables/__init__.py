"""Tables: a Delta table, an export destination or a folder of Parquet files,
resolved and listed by row group, for ``data/`` (``TableDataset``),
``export/`` and the CLI.

``names`` parses table names and finds ``$UCSTAGE_WAREHOUSE``; ``delta``
reads Delta table states with delta-rs (``deltalog``, ``deletion``,
``colmap`` and ``partvalues``: deletion vectors, column mapping and typed
partition values for the reader); ``record`` the export record
(``_ucstage_export.json``); ``source`` resolves a table SOURCE to its files;
``footers`` reads the Parquet footers; ``listing`` freezes the row groups
into a ``manifest`` (:class:`RowGroupManifest`). See docs/design.md and
docs/manifest.md.
"""

from ..manifest.rowgroups import RowGroupManifest, is_row_group_manifest
from .delta import TableState, table_state
from .listing import row_groups
from .names import WAREHOUSE_ENV, TableName, is_table_path, parse_table_name, warehouse_path
from .record import RECORD_NAME, ExportRecord, load_record
from .source import TableSource, resolve_table

__all__ = [
    "RECORD_NAME",
    "WAREHOUSE_ENV",
    "ExportRecord",
    "RowGroupManifest",
    "TableName",
    "TableSource",
    "TableState",
    "is_row_group_manifest",
    "is_table_path",
    "load_record",
    "parse_table_name",
    "resolve_table",
    "row_groups",
    "table_state",
    "warehouse_path",
]
