"""Delta table -> Parquet files in a volume, via Spark Connect.

``table`` holds :func:`export_table` and :func:`read_table` (source, Spark
dataframe, the steps in order); ``deltaread`` a Delta table state as
Spark's DataFrame of its live rows; ``staging`` a table on an object store
copied into the cache and held there while Spark reads it; ``dest`` the destination (checks, lock,
staging, verification, the swap); ``record`` the result type; ``options``
the output options; ``spark`` finds or starts a Spark Connect server. The
export record ``DEST/_ucstage_export.json``, table names and Delta states are
:mod:`ucstage.tables`'. See docs/export.md and docs/design.md.
"""

from .dest import read_record
from .exporter import export_table, read_table

__all__ = ["export_table", "read_record", "read_table"]
