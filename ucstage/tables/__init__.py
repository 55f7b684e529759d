"""Tables: a Delta table, an export destination or a folder of Parquet files,
resolved and listed by row group, for ``data/`` (``TableDataset``),
``export/`` and the CLI.

``names`` parses table names and finds ``$UCSTAGE_WAREHOUSE``; ``delta``
reads Delta table states with delta-rs (``deltalog``, ``deletion``,
``colmap`` and ``partvalues``: deletion vectors, column mapping and typed
partition values for the reader; ``logpaths`` confines every path a log
names to the table's folder); ``record`` the export record
(``_ucstage_export.json``); ``source`` resolves a table SOURCE to its files;
``footers`` reads the Parquet footers; ``listing`` freezes the row groups
into a ``manifest`` (:class:`RowGroupManifest`). See docs/design.md and
docs/manifest.md.
"""

# What the CLI, data/ and users (docs/manifest.md) import; data/ and export/
# import the rest from its module.
from ..manifest.rowgroups import RowGroupManifest
from .row_groups import row_groups

__all__ = ["RowGroupManifest", "row_groups"]
