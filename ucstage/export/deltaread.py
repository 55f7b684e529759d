"""A Delta table's version read by Spark as plain Parquet, with what the log
says about its files applied in the query: export's reader (Spark here has
no Delta jars; docs/design.md, "Delta without Maven").

delta-rs resolves the version (:func:`ucstage.tables.delta.table_state`):
its live files, schema, partition values and deletion vectors. Spark is
handed exactly those files and a read schema, then:

* **Column mapping** (``name`` and ``id``): the read schema names each
  column as the files do (:func:`ucstage.tables.colmap.physical_field`:
  physical names, nested struct fields too; in ``id`` mode Parquet field
  ids, which Spark matches with ``spark.sql.parquet.fieldId.read.enabled``),
  and each column is selected under its logical name, cast to its logical
  type (a struct cast renames the fields, by position). A physical column a
  file lacks (added later) reads as null; a dropped one is never asked for.
* **Partition values** come from the log, never from folder names: a
  column-mapped table's files sit under random prefixes, not ``COL=value``
  folders, and so may any table's. A table of the files (Spark's name for
  each, a file number, its partition values in their types), one row per
  file, is broadcast and joined on ``_metadata.file_path``.
* **Deletion vectors**: each deleted row, as one long ``file number << 40 |
  row index``, is dropped by a left anti join on the row's
  ``_metadata.row_index`` (Spark 3.5 and later). The vectors are read by
  the rule ``TableDataset`` uses (:func:`ucstage.tables.deletion.deleted`:
  magic, size, checksum and cardinality checked).

So the DataFrame holds the rows delta-kernel reads, and
``TableState.num_records`` (the log's counts minus the vectors'
cardinalities) is what the written files must add up to.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import ExportError
from ..tables import colmap, partvalues
from ..tables.deletion import deleted
from ..tables.delta import TableState
from ..tables.logpaths import shown
from .dest import HADOOP_GLOB_CHARS

__all__ = ["FILE_SHIFT", "delta_dataframe", "hadoop_escape", "quote"]

FILE_SHIFT = 40
"""A deleted row's key is ``file number << FILE_SHIFT | row index``: files
hold fewer than 2**40 rows, tables fewer than 2**23 files."""

_PATH, _FILE, _ROW, _GONE = ("__ucstage_file_path", "__ucstage_file", "__ucstage_row_index",
                             "__ucstage_deleted")
_FIELD_ID = b"PARQUET:field_id"
"""pyarrow's metadata key for a Parquet field id."""


def quote(column: str) -> str:
    """``column`` as a Spark column reference to that exact name."""
    return "`" + column.replace("`", "``") + "`"


def hadoop_escape(path: str) -> str:
    """``path`` as a Spark input path naming exactly that file.

    Hadoop expands glob characters in input paths; a backslash makes them literal.
    """
    return "".join("\\" + c if c in HADOOP_GLOB_CHARS else c for c in path)


def _spark_type(t: Any) -> Any:
    """Arrow type ``t`` as Spark's, every nested field nullable (what Spark
    reads a file source as, and what a cast may target from it), struct
    fields keeping their Parquet field ids as ``parquet.field.id``."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import ArrayType, MapType, StructType

    if pa.types.is_struct(t):
        return StructType([_spark_field(c) for c in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ArrayType(_spark_type(t.value_type), True)
    if pa.types.is_map(t):
        return MapType(_spark_type(t.key_type), _spark_type(t.item_type), True)
    return from_arrow_type(t)


def _spark_field(field: Any) -> Any:
    from pyspark.sql.types import StructField

    raw = (field.metadata or {}).get(_FIELD_ID)
    meta = {"parquet.field.id": int(raw)} if raw is not None else None
    return StructField(field.name, _spark_type(field.type), True, meta)


def delta_dataframe(spark: Any, state: TableState) -> Any:
    """Table version ``state`` as a Spark DataFrame of its live rows, in its
    logical schema (partition columns in the schema's order).

    Raises:
        ExportError: Spark does not list one of the files it was given.
        MissingDataFiles, UnreadableDeltaLog: a deletion vector that is gone
            or does not match its descriptor.
    """
    from pyspark.sql.connect import functions as F
    from pyspark.sql.types import StructType

    schema = state.arrow_schema
    if not state.files:
        return spark.createDataFrame([], StructType([_spark_field(f) for f in schema]))
    how = colmap.mode(schema)
    parts = state.partition_columns
    physical = {f.name: colmap.physical_field(f, how) for f in schema if f.name not in parts}
    if how == "id":
        # Without it Spark matches columns by name, and id mode's files may name them anything.
        spark.conf.set("spark.sql.parquet.fieldId.read.enabled", "true")
    # No basePath: partition columns come from the log, not from folder names.
    df = spark.read.schema(StructType([_spark_field(f) for f in physical.values()])) \
        .parquet(*[hadoop_escape(f) for f in state.files])
    gone = _deleted(state)
    if parts or gone is not None:
        files = _files_table(state, df.inputFiles())
        df = df.select("*", F.col("_metadata.file_path").alias(_PATH),
                       F.col("_metadata.row_index").alias(_ROW))
        # One row per file (two names each): always small, so broadcast.
        df = df.join(spark.createDataFrame(files).hint("broadcast"), on=_PATH)
        if gone is not None:
            # No hint: Spark broadcasts the deleted rows while they are
            # small (its threshold, against the exact size of this local
            # table) and shuffles both sides when they are not, which costs
            # a pass over the table but no executor has to hold millions of
            # keys; per-file filters (row_index IN (...)) would make a plan
            # as big as the vectors.
            key = F.shiftleft(F.col(_FILE).cast("long"), FILE_SHIFT) + F.col(_ROW)
            df = df.join(spark.createDataFrame(gone), key == F.col(_GONE), "left_anti")
    columns = []
    for i, field in enumerate(schema):
        source = F.col(f"__ucstage_part_{i}") if field.name in parts \
            else F.col(quote(physical[field.name].name))
        columns.append(source.cast(_spark_type(field.type)).alias(field.name))
    return df.select(*columns)


def _files_table(state: TableState, listed: list[str]) -> Any:
    """The files' table: each file under both names Spark may give it in
    ``_metadata.file_path`` (``listed``, ``inputFiles()``: ``file:///x``; the
    column says ``file:/x``, both percent-encoded), its number in
    ``state.files`` and its partition values, typed
    (``__ucstage_part_<i>``, ``i`` the column's place in the schema)."""
    import pyarrow as pa

    names: dict[str, list[str]] = {}
    for name in listed:
        parts = urlsplit(name)
        # The name itself, and the form without the empty authority.
        names.setdefault(os.path.normpath(unquote(parts.path)), []).extend(
            [name, f"{parts.scheme}:{parts.path}"])
    keys: list[str] = []
    numbers: list[int] = []
    for i, path in enumerate(state.files):
        forms = names.get(os.path.normpath(path))
        if not forms:
            raise ExportError(f"Spark does not list data file {shown(path)} it was given",
                              hint="nothing was written; report this as a bug")
        for form in dict.fromkeys(forms):
            keys.append(form)
            numbers.append(i)
    columns = {_PATH: pa.array(keys, pa.string()), _FILE: pa.array(numbers, pa.int32())}
    index = pa.array(numbers, pa.int64())
    for i, field in enumerate(state.arrow_schema):
        if field.name in state.partition_columns:
            texts = [values[field.name] for values in state.partition_values]
            columns[f"__ucstage_part_{i}"] = partvalues.from_text(texts, field.type).take(index)
    return pa.table(columns)


def _deleted(state: TableState) -> Any:
    """Every deleted row of the version as a one-column table of keys
    (``file number << FILE_SHIFT | row index``), or None: no vector deletes any."""
    import numpy as np
    import pyarrow as pa

    keys = []
    for i, vector in enumerate(state.deletion_vectors):
        if vector is None or not vector["cardinality"]:
            continue
        what = os.path.relpath(state.files[i], state.path)
        rows = np.asarray(deleted(vector, what).to_array(), dtype=np.int64)
        keys.append(rows | np.int64(i << FILE_SHIFT))
    if not keys:
        return None
    return pa.table({_GONE: pa.array(np.concatenate(keys), pa.int64())})
