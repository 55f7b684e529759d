"""Table names and Delta table states, where export has always imported them.

They live in :mod:`ucstage.tables` now (``TableDataset`` reads them too);
this module re-exports them for code that imports ``ucstage.export.delta``.
"""

from ..tables.delta import TableState, table_state
from ..tables.names import (
    WAREHOUSE_ENV,
    TableName,
    is_table_path,
    local_table_path,
    parse_table_name,
    warehouse_path,
)

__all__ = [
    "WAREHOUSE_ENV",
    "TableName",
    "TableState",
    "is_table_path",
    "local_table_path",
    "parse_table_name",
    "table_state",
    "warehouse_path",
]
