"""Tables: a Delta table, an export destination or a folder of Parquet files,
resolved and listed by row group, for ``data/`` (``TableDataset``),
``export/`` and the CLI.

:mod:`.names` parses table names and finds ``$UCSTAGE_WAREHOUSE``;
:mod:`.delta` reads Delta table states with delta-rs (:mod:`.deltalog`,
:mod:`.deletion`, :mod:`.colmap` and :mod:`.partvalues`: deletion vectors,
column mapping and typed partition values for the reader; :mod:`.logpaths`
confines every path a log names to the table's folder; :mod:`.storedelta`
a table on an object store); :mod:`.record` the export record
(``_ucstage_export.json``); :mod:`.resolve` resolves a table SOURCE to its
files; :mod:`.footers` reads the Parquet footers; :mod:`.row_groups` freezes
the row groups into a manifest (:class:`RowGroupManifest`). See docs/design.md and
docs/manifest.md.
"""

# What the CLI, data/ and users (docs/manifest.md) import; data/ and export/
# import the rest from its module.
from ..manifest.rowgroups import RowGroupManifest
from .row_groups import row_groups

__all__ = ["RowGroupManifest", "row_groups"]
