"""Delta table -> Parquet files in a volume, via Spark Connect.

:mod:`.exporter` holds :func:`export_table` and :func:`read_table` (source,
Spark dataframe, the steps in order); :mod:`.deltaread` a Delta table state
as Spark's DataFrame of its live rows; :mod:`.staging` a table on an object
store copied into the cache and held there while Spark reads it; :mod:`.dest`
the destination (checks, lock, staging, verification, the swap);
:mod:`.interrupt` what a Ctrl-C may not cut in half; :mod:`.result` the
result type; :mod:`.options` the output options; :mod:`.spark` finds or
starts a Spark Connect server (:mod:`.embedded` the one it starts itself). The
export record ``DEST/_ucstage_export.json``, table names and Delta states are
:mod:`ucstage.tables`'. See docs/export.md and docs/design.md.
"""

from .dest import read_record
from .exporter import export_table, read_table

__all__ = ["export_table", "read_record", "read_table"]
