"""Delta table -> Parquet files in a volume, through Spark Connect; atomic and idempotent.

The platform's recipe, ``spark.table(name).write.mode("overwrite").parquet(dest)``,
deletes the previous export before writing the new one, redoes the work on
every job start and records nothing. :func:`export_table` does the same job as
follows:

1. **Resolve the source.** A Delta table path (local or mounted; or on
   ``s3://``, ``gs://``, ``az://``/``abfss://``, also as a ``/Volumes`` path
   mapped there by ``$UCSTAGE_VOLUMES_ROOT``), or a name under
   ``$UCSTAGE_WAREHOUSE``: delta-rs reads the table's state (version, live
   files, schema, partition values, deletion vectors, live row count) and
   Spark reads exactly those files as plain Parquet, applying the rest
   (:mod:`ucstage.export.deltaread`: files written before a column was
   added read it as null, partition values come from the log, physical
   columns under their logical names, deleted rows dropped). Otherwise the name goes to the server's catalog
   (``spark.table``), for servers that read Delta themselves; its version
   comes from ``DESCRIBE HISTORY`` where the server supports it.
   A table on an object store has its live files copied into ucstage's
   cache and held there while Spark reads them, after the skip check
   (:mod:`ucstage.export.staging`): Spark here reads only local paths.
2. **Skip** when the export record in DEST names the same table, Delta
   version and options and every file it lists is present with its size. No
   Spark session is started for that check on the delta-rs path.
   ``force=True`` re-exports.
3. **Validate** ``columns``, ``where`` and ``partition_by`` with Spark's
   analyzer before anything is written: a bad expression is an
   :class:`~ucstage.errors.InvalidArgument` and nothing changes.
4. **Write** into a staging folder beside DEST, **verify** the footers and
   row counts, and **publish**: the record goes into the staging folder,
   which is swapped in for DEST. :mod:`ucstage.export.dest` holds these
   steps, the DEST lock and the checks on DEST.

Any failure (bad ``where``, server killed mid-write, disk full, failed
verification) removes the staging folder and leaves the previous export as it
was.

DEST is a volume path (``/Volumes/...``, through ``$UCSTAGE_VOLUMES_ROOT``) or a
local folder, which must be the same path for this process and the Spark
server (true for the embedded server, and for the platform's /Volumes FUSE
mount). Object-store DESTs (``s3://``...) are refused: Spark here has no
``s3a`` and an object store has no atomic rename to publish with; export to a
mounted volume path instead. Paths containing Hadoop glob characters
(``[ ] { } * ? \\``) are refused for DEST; the source's file paths are escaped.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .. import __version__, params
from ..cache import LocalCache
from ..errors import ExportError, InvalidArgument, TableNotFound, UcstageError
from ..progress import NO_PROGRESS, Callback
from ..tables.delta import TableState, table_state
from ..tables.logpaths import shown
from ..tables.names import (
    WAREHOUSE_ENV,
    TableName,
    is_table_path,
    local_table_path,
    parse_table_name,
    warehouse_path,
)
from ..tables.record import ExportRecord
from ..tables.resolve import StoreDelta, open_store_delta
from ..tables.storedelta import has_log
from ..volumes import resolve
from ..volumes.location import is_mapped
from .deltaread import delta_dataframe, quote
from .dest import (
    check_dest_writable,
    check_replaceable,
    check_unlisted,
    dest_lock,
    footer_row_groups,
    publish,
    remove_path,
    resolve_dest,
    staging_path,
    sweep_leftovers,
    unchanged_export,
    verify_staged,
)
from .interrupt import add_note, notes, signals_deferred
from .options import ExportOptions, check_partition_by
from .result import ExportResult
from .spark import abandon, catalog_is_new, get_session, is_connection_error

__all__ = ["export_table", "read_table"]


# -- the source ---------------------------------------------------------------

@dataclass
class _Source:
    label: str
    """The table as the user named it (canonical)."""
    kind: str
    """"delta" (delta-rs reads the log, Spark reads files) or "catalog" (spark.table)."""
    location: str | None
    name: TableName | None
    state: TableState | None = None
    version: int | None = None
    store: StoreDelta | None = None
    """A table on an object store: read from its files staged in the cache."""


def _on_store(table: str) -> StoreDelta | None:
    """The Delta table at an object-store URL, or at a ``/Volumes`` path
    mapped to one, resolved (log, listing, confinement; nothing fetched);
    None for a local or mounted path."""
    if table.startswith("file://") or not is_mapped(table):
        return None
    if resolve(table, must_exist=False).is_local:  # a /Volumes path mapped to a folder
        return None
    volume = resolve(table)  # SourceNotFound, SourceUnreadable (credentials) by name
    if not has_log(volume):
        raise TableNotFound(f"table {shown(table)} not found: no Delta log at "
                            f"{shown(volume.url)}",
                            hint="check the path: a Delta table's folder holds _delta_log")
    return open_store_delta(volume, table.rstrip("/"))


def _resolve_source(table: str) -> _Source:
    if not table or not table.strip():
        raise InvalidArgument("the table is empty", hint="give catalog.schema.table or a path")
    if is_table_path(table):
        found = _on_store(table)
        if found is not None:
            label = found.store.label
            return _Source(label, "delta", found.store.volume.url, None, found.state,
                           found.state.version, found)
        path = local_table_path(table)
        state = table_state(path)
        return _Source(path, "delta", path, None, state, state.version)
    name = parse_table_name(table)
    located = warehouse_path(name)
    if located is None:
        return _Source(str(name), "catalog", None, name)
    state = table_state(located, label=str(name))
    return _Source(str(name), "delta", located, name, state, state.version)


def _check_findable(source: _Source, remote: str | None) -> None:
    """Refuse a catalog name no server could hold, before Spark starts (tens
    of seconds) only to say "not found"."""
    if source.kind == "catalog" and catalog_is_new(remote):
        raise TableNotFound(
            f"table {source.label} not found: {WAREHOUSE_ENV} is not set and no Spark server "
            "is given, so there is no catalog that could hold it",
            hint=f"set {WAREHOUSE_ENV} to the folder holding <catalog>/<schema>/<table> Delta "
                 "tables, or SPARK_REMOTE=sc://HOST:PORT to a server whose catalog has it")


def _spark_message(exc: BaseException) -> str:
    text = str(exc).strip()
    details = re.search(r'details = "([^"]*)"', text)
    if details:  # a raw gRPC error: its details say what happened
        return details.group(1)[:400]
    for marker in ("\n\nJVM stacktrace:", "\nJVM stacktrace:"):
        text = text.split(marker)[0]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(exc).__name__
    return first[:400]


def _is_analysis_error(exc: BaseException) -> bool:
    try:
        from pyspark.errors import AnalysisException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, AnalysisException)


def _dataframe(spark: Any, source: _Source) -> Any:
    if source.kind == "catalog":
        assert source.name is not None
        try:
            df = spark.table(source.name.quoted())
            df.schema  # noqa: B018 - resolve now, to report a missing table clearly
        except Exception as exc:
            if is_connection_error(exc) or not _is_analysis_error(exc):
                raise
            raise TableNotFound(
                f"table {source.label} not found by the Spark server: {_spark_message(exc)}",
                hint="set UCSTAGE_WAREHOUSE to the folder holding <catalog>/<schema>/<table> "
                     "Delta tables, or use a server whose catalog has the table",
            ) from exc
        return df
    assert source.state is not None
    return delta_dataframe(spark, source.state)


def _shape(df: Any, options: ExportOptions) -> Any:
    """Apply columns and where; let Spark's analyzer check them before any write."""
    try:
        shaped = _apply(df, options.where, options.columns)
        columns = shaped.columns
    except Exception as exc:
        if is_connection_error(exc) or not _is_analysis_error(exc):
            raise
        # The message opens with the parameter at fault, which the CLI says as its flag.
        what = _refused(df, options)
        raise InvalidArgument(f"{what} was refused by Spark: {_spark_message(exc)}",
                              hint="nothing was written; fix the expression or column names"
                              ) from exc
    check_partition_by(options.partition_by, columns)
    return shaped


def _apply(df: Any, where: str | None, columns: list[str] | None) -> Any:
    if where is not None:
        df = df.where(where)
    if columns is not None:
        df = df.select(*[quote(c) for c in columns])
    # The Connect client reuses a parent's cached schema for filters, so
    # df.columns alone may not reach the server; semanticHash() always
    # makes it analyze the plan.
    df.semanticHash()
    return df


def _refused(df: Any, options: ExportOptions) -> str:
    """Which of ``where`` and ``columns`` Spark's analyzer refused.

    Only on the error path, and only when both are given, is ``where`` analysed
    alone: one more round trip, instead of one per export.
    """
    if options.where is None:
        return "columns"
    if options.columns is None:
        return "where"
    try:
        _apply(df, options.where, None)
    except Exception as exc:
        if is_connection_error(exc) or not _is_analysis_error(exc):
            raise
        return "where"
    return "columns"


def _version_from_server(spark: Any, source: _Source) -> int | None:
    assert source.name is not None
    try:
        rows = spark.sql(f"DESCRIBE HISTORY {source.name.quoted()} LIMIT 1").collect()
        return int(rows[0]["version"]) if rows else None
    except Exception as exc:
        if is_connection_error(exc):
            raise
        return None


# -- the public functions -----------------------------------------------------

def export_table(
    table: str,
    dest: str,
    *,
    remote: str | None = None,
    columns: Sequence[str] | None = None,
    where: str | None = None,
    partition_by: Sequence[str] | str | None = None,
    files: int | None = None,
    max_records_per_file: int | None = None,
    compression: str = "zstd",
    row_group_rows: int | None = None,
    force: bool = False,
    callback: Callback = NO_PROGRESS,
    cache: LocalCache | None = None,
) -> ExportResult:
    """Export a Delta table to Parquet files in ``dest``, atomically; skip if unchanged.

    Args:
        table: ``catalog.schema.table`` (backtick-quoted parts allowed) or a Delta
            table path (anything containing ``/``, or ``file://``).
        dest: ``/Volumes/...`` or a local folder; replaced as a whole.
        remote: ``sc://HOST:PORT``; default ``$SPARK_REMOTE``, else the embedded server.
        columns: top-level columns to keep, in this order (default: all; a string is one
            column).
        where: a Spark SQL filter expression.
        partition_by: columns to partition the output folders by (a string is one column).
        files: write exactly this many files (``repartition(files)``).
        max_records_per_file: cap rows per file (Spark's ``maxRecordsPerFile``).
        compression: ``zstd``, ``snappy`` or ``none``.
        row_group_rows: at most this many rows per Parquet row group (Parquet's
            ``parquet.block.row.count.limit``; an upper bound, since the
            writer's byte limit and each file's last group end groups sooner).
            :attr:`ExportResult.row_groups` says what the footers hold.
        force: export even when the export record says the table is unchanged.
        callback: told the slow step under way through ``set_description``
            (starting the server, waiting for the lock, fetching, writing,
            verifying); an empty description when it is over. While a table on
            an object store is fetched, also ``set_size``, ``relative_update``
            and ``item_done``, as :meth:`LocalCache.warm
            <ucstage.cache.LocalCache.warm>` reports them.
        cache: where a table on an object store is staged for Spark (default
            ``LocalCache()``: ``$UCSTAGE_CACHE_DIR``, ``$UCSTAGE_CACHE_MAX_BYTES``);
            its files must all fit under the cap at once.

    Returns:
        An :class:`ExportResult`; ``skipped_unchanged`` says whether anything was written.

    Raises:
        InvalidArgument: bad options, table name, DEST, or an expression Spark refuses.
        TableNotFound, UnsupportedTable: the table cannot be read this way.
        SparkUnavailable: no server could be started or reached.
        ExportError: the write or its verification failed; DEST is unchanged.
        CacheFull, FetchFailed: a table on an object store could not be staged
            in the cache (checked against the cap before anything is fetched).
    """
    started = time.monotonic()
    # The library speaks Python: a string is one column name, never a comma
    # list (the CLI splits --columns a,b itself); the one rule of ucstage/params.py.
    options = ExportOptions(
        columns=list(params.strings(columns, "columns")) if columns is not None else None,
        where=where, partition_by=list(params.strings(partition_by, "partition_by")),
        files=files,
        max_records_per_file=max_records_per_file, compression=compression,
        row_group_rows=row_group_rows)
    options.validate()
    dest_path = resolve_dest(dest)
    check_dest_writable(dest_path)
    source = _resolve_source(table)
    _check_findable(source, remote)
    check_replaceable(dest_path, force)  # again under the lock; here to refuse before any write
    try:
        with dest_lock(dest_path, callback):
            sweep_leftovers(dest_path)
            return _export(source, dest_path, options, remote, force, callback, started,
                           cache)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the CLI's handler
        if not notes(exc):
            add_note(exc, f"nothing was written: {dest_path} is as it was")
        raise


@contextlib.contextmanager
def _staged(source: _Source, cache: LocalCache | None, callback: Callback) -> Iterator[None]:
    """While the block runs, a table on an object store is read from its
    files staged (and held) in the cache: ``source.state`` names them."""
    if source.store is None:
        yield
        return
    from .staging import staged

    try:
        with staged(source.store, cache or LocalCache(), callback) as state:
            callback.set_description("")
            source.state = state
            yield
    finally:
        source.state = source.store.state


def _export(source: _Source, dest_path: str, options: ExportOptions, remote: str | None,
            force: bool, callback: Callback, started: float,
            cache: LocalCache | None) -> ExportResult:
    # The record is checked before anything is fetched: a rerun of an
    # unchanged table on a store reads its log and listing, no data file.
    if not force and (previous := _unchanged(dest_path, source, options)) is not None:
        return _result(dest_path, previous, True, started, source)
    check_replaceable(dest_path, force)
    check_unlisted(dest_path, force)
    with _staged(source, cache, callback):
        return _write_export(source, dest_path, options, remote, force, callback, started)


def _write_export(source: _Source, dest_path: str, options: ExportOptions, remote: str | None,
                  force: bool, callback: Callback, started: float) -> ExportResult:
    spark = get_session(remote, callback=callback)
    staging = staging_path(dest_path, "staging")
    step, published = "reading the table", False
    try:
        try:
            _session_conf(spark)
            df = _shape(_dataframe(spark, source), options)
            if source.kind == "catalog":
                source.version = _version_from_server(spark, source)
                if not force and (previous := _unchanged(dest_path, source, options)) is not None:
                    return _result(dest_path, previous, True, started, source)
            schema_json = df.schema.jsonValue()
            if options.where is None and source.state is not None and \
                    source.state.num_records is not None:
                expected = source.state.num_records
            else:
                step = "counting the source rows"
                callback.set_description(step)
                expected = int(df.count())
        except UcstageError:
            raise
        except Exception as exc:
            raise _spark_failure(exc, "reading the table") from exc

        step = f"writing {expected:,} rows"
        callback.set_description(step)
        _write(df, staging, options)
        step = "verifying the written files"
        callback.set_description(step)
        written = verify_staged(staging, expected, options.files)
        record = ExportRecord(
            table=source.label, source_kind=source.kind, source_location=source.location,
            delta_version=source.version, row_count=expected, schema=schema_json,
            files=written, bytes=sum(f["bytes"] for f in written), options=options.as_dict(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            ucstage_version=__version__)
        try:
            with signals_deferred():  # the swap's two renames are never cut apart
                publish(staging, dest_path, record)
                published = True
        except OSError as exc:
            raise ExportError(f"could not publish the export into {dest_path}: {exc}") from exc
    except KeyboardInterrupt as exc:
        _stopped(exc, spark, staging, dest_path, step, published, callback)
        raise
    except BaseException:
        remove_path(staging)
        raise
    finally:
        callback.set_description("")
    return _result(dest_path, record, False, started, source)


def _stopped(exc: KeyboardInterrupt, spark: Any, staging: str, dest: str, step: str,
             published: bool, callback: Callback) -> None:
    """Undo a stopped export: first stop Spark's writing, then remove the staging folder."""
    if published:
        add_note(exc, f"stopped after the export was published: {dest} holds the new export")
        return
    callback.set_description("stopping Spark")
    stopped = abandon(spark)
    remove_path(staging)
    add_note(exc, f"the export was abandoned while {step}; {stopped}, nothing was published "
                  f"and the staging folder was removed: {dest} is as it was")


def _result(dest: str, record: ExportRecord, skipped: bool, started: float,
            source: _Source) -> ExportResult:
    warnings = []
    where = record.options.get("where")
    if where is not None and record.row_count == 0:
        total = source.state.num_records if source.state is not None else None
        of = f" of the table's {total:,}" if total else ""
        warnings.append(f"where selected 0{of} rows ({where!r}): the export holds no rows")
    return ExportResult(dest, record, skipped, time.monotonic() - started, warnings,
                        footer_row_groups(dest, record.files))


def _unchanged(dest: str, source: _Source, options: ExportOptions) -> ExportRecord | None:
    return unchanged_export(dest, table=source.label, source_kind=source.kind,
                            source_location=source.location, delta_version=source.version,
                            options=options.as_dict())


def _write(df: Any, staging: str, options: ExportOptions) -> None:
    # mode("error"): the staging name is fresh, so anything already there is a bug.
    writer_df = df.repartition(options.files) if options.files else df
    writer = writer_df.write.mode("error").option("compression", options.compression)
    if options.max_records_per_file:
        writer = writer.option("maxRecordsPerFile", options.max_records_per_file)
    if options.row_group_rows:
        # Spark hands a write's options to the Parquet writer's Hadoop settings.
        writer = writer.option("parquet.block.row.count.limit", options.row_group_rows)
    if options.partition_by:
        writer = writer.partitionBy(*options.partition_by)
    try:
        writer.parquet(staging)
    except Exception as exc:
        raise _spark_failure(exc, "writing") from exc


def _session_conf(spark: Any) -> None:
    """Session settings every export needs, on any server.

    Spark writes timestamps as INT96 by default, which pyarrow and ``datasets``
    read as naive nanoseconds; TIMESTAMP_MICROS keeps the table's microsecond,
    UTC-adjusted type.
    """
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


def _spark_failure(exc: BaseException, doing: str) -> UcstageError:
    if is_connection_error(exc):
        return ExportError(f"the Spark Connect server went away while {doing}: "
                           f"{_spark_message(exc)}",
                           hint="the previous export, if any, is unchanged; rerun the command")
    message = _spark_message(exc)
    hint = "the previous export, if any, is unchanged"
    if "No space left" in str(exc) or "No space left" in message:
        message = "no space left on the device holding DEST"
        hint += "; free space (the new export needs room beside the old one) and rerun"
    return ExportError(f"export failed while {doing}: {message}", hint=hint)


def read_table(name: str, limit: int | None = None, *, remote: str | None = None,
               callback: Callback = NO_PROGRESS) -> Any:
    """Read a (small) table into a ``pyarrow.Table`` through Spark Connect's ``toArrow()``.

    The seed's ``spark.table(name).toPandas()`` path, for tables that fit in
    memory. ``name`` resolves as in :func:`export_table`; ``limit`` caps the
    rows; ``callback`` is told when the embedded server starts.
    """
    if limit is not None and limit < 0:
        raise InvalidArgument(f"limit must be 0 or more, got {limit}")
    source = _resolve_source(name)
    _check_findable(source, remote)
    with _staged(source, None, callback):
        spark = get_session(remote, callback=callback)
        try:
            df = _dataframe(spark, source)
            if limit is not None:
                df = df.limit(limit)
            return df.toArrow()
        except UcstageError:
            raise
        except Exception as exc:
            raise _spark_failure(exc, "reading the table") from exc
