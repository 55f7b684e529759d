"""Delta table -> Parquet files in a volume, through Spark Connect; atomic and idempotent.

The platform's recipe, ``spark.table(name).write.mode("overwrite").parquet(dest)``,
deletes the previous export before writing the new one, redoes the work on
every job start and records nothing. :func:`export_table` does the same job as
follows:

1. **Resolve the source.** A Delta table path, or a name under
   ``$UCSTAGE_WAREHOUSE``: delta-rs reads the snapshot (version, live files,
   schema, row count) and Spark reads exactly those files, with the table's
   schema (so partition columns keep their types and files written before a
   schema change read as nulls) and ``basePath`` (so partition columns
   survive). Otherwise the name goes to the server's catalog (``spark.table``),
   for servers that read Delta themselves; its version comes from
   ``DESCRIBE HISTORY`` where the server supports it.
2. **Skip** when ``DEST/_ucstage_export.json`` records the same table, Delta
   version and options and every file it lists is present with its size. No
   Spark session is started for that check on the delta-rs path. ``force=True``
   re-exports.
3. **Validate** ``columns``, ``where`` and ``partition_by`` with Spark's
   analyzer before anything is written: a bad expression is an
   :class:`~ucstage.errors.InvalidArgument` and nothing changes.
4. **Write** into a staging folder beside DEST (same filesystem, a name that
   starts with ``.`` so loaders and listings skip it).
5. **Verify**: every Parquet file's footer opens with pyarrow, the row counts in
   the footers add up to the source's (from the Delta log's statistics, or a
   Spark ``count()`` when ``where`` is given or statistics are missing), and
   ``files=N`` produced exactly N files.
6. **Publish**: write the manifest into the staging folder, rename DEST aside,
   rename the staging folder to DEST, delete the old export. Both renames are
   within one folder, so readers see the old export or the new one.

Exports into one DEST are serialised on a machine by an ``flock`` on
``.<name>.ucstage.lock`` beside it, so the second of two concurrent exports
finds the first one's result and skips. A DEST that holds anything but a
Parquet export (files other than Parquet, Spark markers, the manifest;
folders other than ``COL=value``) is refused rather than replaced.

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

import fcntl
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import __version__
from ..errors import ExportError, InvalidArgument, TableNotFound, UcstageError
from ..sharding import slot_count
from ..volumes import resolve
from .delta import (
    DeltaSnapshot,
    TableName,
    is_table_path,
    local_table_path,
    parse_table_name,
    snapshot,
    warehouse_path,
)
from .spark import StatusCallback, get_session, is_connection_error

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

MANIFEST_NAME = "_ucstage_export.json"
MANIFEST_FORMAT = "ucstage-export/1"
COMPRESSIONS = ("zstd", "snappy", "none")
_GLOB_CHARS = set("[]{}*?\\")


def _noop(_message: str | None) -> None:
    return None


@dataclass(frozen=True)
class ExportOptions:
    """What shapes the output; two exports with equal options and table version are equal."""

    columns: list[str] | None = None
    where: str | None = None
    partition_by: list[str] = field(default_factory=list)
    files: int | None = None
    max_records_per_file: int | None = None
    compression: str = "zstd"

    def validate(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise InvalidArgument(f"compression must be one of {', '.join(COMPRESSIONS)} "
                                  f"(--compression), got {self.compression!r}")
        if self.files is not None and self.max_records_per_file is not None:
            raise InvalidArgument("files and max_records_per_file exclude each other "
                                  "(--files, --max-records-per-file)",
                                  hint="files=N (--files N) writes exactly N files; "
                                       "choose one")
        if self.files is not None and self.files < 1:
            raise InvalidArgument(f"files must be at least 1 (--files), got {self.files}")
        if self.max_records_per_file is not None and self.max_records_per_file < 1:
            raise InvalidArgument("max_records_per_file must be at least 1 "
                                  f"(--max-records-per-file), got {self.max_records_per_file}")
        if self.files is not None and self.partition_by:
            raise InvalidArgument(
                "files counts the files of one folder and cannot be combined with "
                "partition_by (--files, --partition-by)",
                hint="use max_records_per_file (--max-records-per-file) with partition_by")
        if self.columns is not None and not self.columns:
            raise InvalidArgument("columns is empty (--columns)")
        if self.where is not None and not self.where.strip():
            raise InvalidArgument("where is empty (--where)")
        if self.columns is not None and self.partition_by:
            # The same checks as after Spark's analysis, made before Spark starts
            # (Spark matches column names without regard to case).
            chosen = {c.lower() for c in self.columns}
            missing = [c for c in self.partition_by if c.lower() not in chosen]
            if missing:
                raise InvalidArgument(
                    f"partition_by column(s) {', '.join(missing)} not in the output "
                    "(--partition-by)", hint=f"columns are: {', '.join(self.columns)}")
            if len(self.partition_by) >= len(self.columns):
                raise InvalidArgument("partition_by cannot use every column (--partition-by): "
                                      "the files would be empty")

    def as_dict(self) -> dict[str, Any]:
        return {"columns": self.columns, "where": self.where, "partition_by": self.partition_by,
                "files": self.files, "max_records_per_file": self.max_records_per_file,
                "compression": self.compression}


@dataclass
class ExportResult:
    """What :func:`export_table` did."""

    dest: str
    """The export folder (resolved local path)."""
    manifest: dict[str, Any]
    """The manifest now in DEST (see docs/export.md for its fields)."""
    skipped_unchanged: bool
    """True when nothing was written because table version and options matched."""
    seconds: float

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest["files"])

    @property
    def row_count(self) -> int:
        return int(self.manifest["row_count"])

    def to_json(self) -> dict[str, Any]:
        """The manifest plus ``skipped_unchanged`` and ``seconds`` (the ``--json`` output)."""
        return {**self.manifest, "skipped_unchanged": self.skipped_unchanged,
                "seconds": round(self.seconds, 3)}


def suggest_files(files: int | None, world_size: int, num_workers: int | Sequence[int]) -> int:
    """The smallest multiple of the slot count that is at least ``files``.

    With a multiple of :func:`ucstage.sharding.slot_count`, every (rank,
    worker) slot reads the same number of files.
    """
    slots = slot_count(world_size, num_workers)
    wanted = max(files or 1, 1)
    return -(-wanted // slots) * slots


# -- the source ---------------------------------------------------------------

@dataclass
class _Source:
    label: str
    """The table as the user named it (canonical)."""
    kind: str
    """"delta" (delta-rs snapshot, Spark reads files) or "catalog" (spark.table)."""
    location: str | None
    name: TableName | None
    snap: DeltaSnapshot | None = None
    version: int | None = None


def _resolve_source(table: str) -> _Source:
    if not table or not table.strip():
        raise InvalidArgument("the table is empty", hint="give catalog.schema.table or a path")
    if is_table_path(table):
        path = local_table_path(table)
        snap = snapshot(path)
        return _Source(path, "delta", path, None, snap, snap.version)
    name = parse_table_name(table)
    located = warehouse_path(name)
    if located is None:
        return _Source(str(name), "catalog", None, name)
    snap = snapshot(located, label=str(name))
    return _Source(str(name), "delta", located, name, snap, snap.version)


def _hadoop_escape(path: str) -> str:
    # Hadoop expands glob characters in input paths; a backslash makes them literal.
    return "".join("\\" + c if c in _GLOB_CHARS else c for c in path)


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


def _quote(column: str) -> str:
    return "`" + column.replace("`", "``") + "`"


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
    from pyspark.sql.pandas.types import from_arrow_schema

    assert source.snap is not None and source.location is not None
    snap = source.snap
    schema = from_arrow_schema(snap.arrow_schema)
    if not snap.files:
        return spark.createDataFrame([], schema)
    # basePath is taken literally; only the input paths are globbed by Hadoop.
    reader = spark.read.schema(schema).option("basePath", source.location)
    df = reader.parquet(*[_hadoop_escape(f) for f in snap.files])
    names = [f.name for f in schema.fields]
    if df.columns != names:
        df = df.select(*[_quote(n) for n in names])
    return df


def _shape(df: Any, options: ExportOptions) -> Any:
    """Apply columns and where; let Spark's analyzer check them before any write."""
    try:
        if options.where is not None:
            df = df.where(options.where)
        if options.columns is not None:
            df = df.select(*[_quote(c) for c in options.columns])
        # The Connect client reuses a parent's cached schema for filters, so
        # df.columns alone may not reach the server; semanticHash() always
        # makes it analyze the plan.
        df.semanticHash()
        columns = df.columns
    except Exception as exc:
        if is_connection_error(exc) or not _is_analysis_error(exc):
            raise
        what = "where (--where)" if options.where is not None else "columns (--columns)"
        if options.where is not None and options.columns is not None:
            what = "where or columns (--where, --columns)"
        raise InvalidArgument(f"Spark refused {what}: {_spark_message(exc)}",
                              hint="nothing was written; fix the expression or column names"
                              ) from exc
    missing = [c for c in options.partition_by if c not in columns]
    if missing:
        raise InvalidArgument(f"partition_by column(s) {', '.join(missing)} not in the output "
                              "(--partition-by)",
                              hint=f"columns are: {', '.join(columns)}")
    if options.partition_by and len(options.partition_by) >= len(columns):
        raise InvalidArgument("partition_by cannot use every column (--partition-by): "
                              "the files would be empty")
    return df


def _version_from_server(spark: Any, source: _Source) -> int | None:
    assert source.name is not None
    try:
        rows = spark.sql(f"DESCRIBE HISTORY {source.name.quoted()} LIMIT 1").collect()
        return int(rows[0]["version"]) if rows else None
    except Exception as exc:
        if is_connection_error(exc):
            raise
        return None


# -- the destination ----------------------------------------------------------

def _resolve_dest(dest: str) -> str:
    volume = resolve(dest, must_exist=False)
    if not volume.is_local:
        raise InvalidArgument(
            f"cannot export to {volume.url}: export writes only to local or mounted paths",
            hint="Spark here has no s3a, and an object store has no atomic rename: export to "
                 "the volume's mount (/Volumes/... on the platform) or a local folder",
        )
    path = volume.root.rstrip(os.sep) or volume.root
    bad = sorted(_GLOB_CHARS & set(path))
    if bad:
        raise InvalidArgument(
            f"DEST {path} contains {' '.join(bad)}, which Hadoop reads as glob characters",
            hint="choose a folder name without [ ] { } * ? \\")
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"DEST {path} exists and is not a folder")
    if path in ("/", os.path.expanduser("~")):
        raise InvalidArgument(f"refusing to export into {path}: it would be replaced")
    return path


def _check_dest_writable(dest: str) -> None:
    """Refuse, before anything is written, a DEST whose folder cannot be made or written.

    The export writes its staging folder and lock file beside DEST and creates
    the missing folders above it, so the nearest existing folder above DEST
    must be a folder this process can write in.
    """
    parent = os.path.dirname(dest) or os.curdir
    while not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.path.isdir(parent):
        raise InvalidArgument(f"DEST {dest} cannot be created: {parent} is not a folder",
                              hint="choose a DEST whose parent is a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidArgument(f"DEST {dest} cannot be written: no write permission in {parent}",
                              hint="choose a DEST in a folder you can write to")


def read_manifest(dest: str) -> dict[str, Any] | None:
    """The manifest of the export in ``dest``, or None if there is none or it is unreadable."""
    path = os.path.join(_resolve_dest(dest), MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None


def _unchanged(dest: str, source: _Source, options: ExportOptions) -> dict[str, Any] | None:
    if source.version is None:
        return None
    manifest = read_manifest(dest)
    if manifest is None:
        return None
    src = manifest.get("source", {})
    if (manifest.get("table") != source.label or src.get("kind") != source.kind
            or src.get("location") != source.location
            or manifest.get("delta_version") != source.version
            or manifest.get("options") != options.as_dict()):
        return None
    for entry in manifest.get("files", []):
        try:
            if os.path.getsize(os.path.join(dest, entry["path"])) != entry["bytes"]:
                return None
        except (OSError, KeyError, TypeError):
            return None
    return manifest


_SPARK_OUTPUT = re.compile(r"(.*\.parquet|_SUCCESS|\..*\.crc|_committed_.*|_started_.*|"
                           + re.escape(MANIFEST_NAME) + ")")


def _check_replaceable(dest: str) -> None:
    """Refuse to replace a folder that is not a previous export.

    An export replaces DEST as a whole, so a DEST holding anything but Parquet
    files, Spark's markers and ``COL=value`` folders (say, a mistyped home
    folder) is refused. A Spark export made without ucstage passes.
    """
    if not os.path.isdir(dest):
        return
    for folder, dirs, names in os.walk(dest):
        sub = os.path.basename(folder)
        if folder != dest and "=" not in sub and not sub.startswith("_temporary"):
            raise InvalidArgument(
                f"DEST {dest} holds a folder {os.path.relpath(folder, dest)!r} that is not part "
                "of a Parquet export; refusing to replace it", hint="choose another DEST")
        for name in names:
            if not _SPARK_OUTPUT.fullmatch(name):
                raise InvalidArgument(
                    f"DEST {dest} holds {os.path.relpath(os.path.join(folder, name), dest)!r}, "
                    "which is not part of a Parquet export; refusing to replace it",
                    hint="choose another DEST, or move that file away")
        dirs.sort()


@contextmanager
def _dest_lock(dest: str, report: StatusCallback) -> Iterator[None]:
    """One export into ``dest`` at a time on this machine (``flock`` on a file beside it).

    A second ``ucstage export`` of the same table (say, one per rank on a node)
    waits, then finds the export unchanged and skips. flock is not reliable
    across machines on network or FUSE mounts: start the export on one node.

    The lock file exists only while an export runs: the holder unlinks it
    before releasing the lock, and whoever then gets the lock on the unlinked
    file sees that the path no longer names the file it locked and starts over
    (see :func:`_acquire`). Folders created above DEST are removed again when
    the export wrote nothing (a refused ``where``, say).
    """
    parent, base = os.path.split(dest)
    lock_path = os.path.join(parent, f".{base}.ucstage.lock")
    created = _missing_folders(parent)
    fd = _acquire(parent, lock_path, dest, report)
    try:
        yield
    finally:
        with suppress(OSError):
            os.unlink(lock_path)  # while holding the lock: see the docstring
        os.close(fd)
        if not os.path.lexists(dest):
            for folder in created:  # deepest first; one in use by another export stays
                try:
                    os.rmdir(folder)
                except OSError:
                    break


def _missing_folders(path: str) -> list[str]:
    """The folders of ``path`` that do not exist yet, deepest first."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    return missing


def _acquire(parent: str, lock_path: str, dest: str, report: StatusCallback) -> int:
    """Open and ``flock`` the lock file; return its descriptor once the lock is ours.

    The lock counts only if ``lock_path`` still names the file locked: a
    previous holder unlinks it before releasing, so a waiter can get the lock
    on a file no one else will open again. It then closes it and retries with
    the file now at the path.
    """
    waiting = False
    try:
        for _attempt in range(1000):
            try:
                os.makedirs(parent, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # a finishing export removed a folder it had made
                continue
            except OSError as exc:
                raise ExportError(f"cannot create the lock file {lock_path}: {exc}") from exc
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not waiting:
                        report(f"waiting for another export into {dest}")
                        waiting = True
                    fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    named = os.stat(lock_path)
                except FileNotFoundError:
                    named = None
            except BaseException:
                os.close(fd)
                raise
            if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                return fd
            os.close(fd)
        raise ExportError(f"could not lock {lock_path}: it kept being replaced")
    finally:
        if waiting:
            report(None)


def _staging_name(dest: str, kind: str) -> str:
    parent, base = os.path.split(dest)
    return os.path.join(parent, f".{base}.ucstage-{kind}-{uuid.uuid4().hex[:12]}")


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def _verify(staging: str, expected_rows: int, options: ExportOptions) -> list[dict[str, Any]]:
    """Open every file's footer; check rows and file count. Returns the files, sorted."""
    import pyarrow.parquet as pq

    files: list[dict[str, Any]] = []
    for folder, dirs, names in os.walk(staging):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, staging).replace(os.sep, "/")
            if name.startswith(("_", ".")):
                # _SUCCESS, .crc and committer markers from servers not started by ucstage.
                os.unlink(full)
                continue
            if not name.endswith(".parquet"):
                raise ExportError(f"unexpected file {rel} in the Spark output")
            try:
                rows = pq.ParquetFile(full).metadata.num_rows
            except Exception as exc:
                raise ExportError(f"written file {rel} is not readable Parquet: {exc}") from exc
            files.append({"path": rel, "bytes": os.path.getsize(full), "rows": int(rows)})
    files.sort(key=lambda f: f["path"])
    total = sum(f["rows"] for f in files)
    if total != expected_rows:
        raise ExportError(f"verification failed: the files hold {total:,} rows, the source "
                          f"has {expected_rows:,}")
    if options.files is not None and len(files) != options.files:
        raise ExportError(
            f"Spark wrote {len(files)} files, not the {options.files} asked for "
            f"({expected_rows:,} rows: some of the {options.files} slices were empty)",
            hint="ask for fewer files than rows")
    return files


def _publish(staging: str, dest: str) -> None:
    """Swap ``staging`` in for ``dest``: rename the old export aside, rename, delete old."""
    old = None
    if os.path.lexists(dest):
        old = _staging_name(dest, "old")
        os.rename(dest, old)
    try:
        os.rename(staging, dest)
    except BaseException:
        if old is not None:
            os.rename(old, dest)
        raise
    if old is not None:
        _remove(old)


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    force: bool = False,
    status: StatusCallback | None = None,
) -> ExportResult:
    """Export a Delta table to Parquet files in ``dest``, atomically; skip if unchanged.

    Args:
        table: ``catalog.schema.table`` (backtick-quoted parts allowed) or a Delta
            table path (anything containing ``/``, or ``file://``).
        dest: ``/Volumes/...`` or a local folder; replaced as a whole.
        remote: ``sc://HOST:PORT``; default ``$SPARK_REMOTE``, else the embedded server.
        columns: top-level columns to keep, in this order (default: all).
        where: a Spark SQL filter expression.
        partition_by: columns to partition the output folders by.
        files: write exactly this many files (``repartition(files)``).
        max_records_per_file: cap rows per file (Spark's ``maxRecordsPerFile``).
        compression: ``zstd``, ``snappy`` or ``none``.
        force: export even when the manifest says the table is unchanged.
        status: called with a one-line status during slow steps, None when done.

    Returns:
        An :class:`ExportResult`; ``skipped_unchanged`` says whether anything was written.

    Raises:
        InvalidArgument: bad options, table name, DEST, or an expression Spark refuses.
        TableNotFound, UnsupportedTable: the table cannot be read this way.
        SparkUnavailable: no server could be started or reached.
        ExportError: the write or its verification failed; DEST is unchanged.
    """
    started = time.monotonic()
    report = status or _noop
    if isinstance(partition_by, str):
        partition_by = [c.strip() for c in partition_by.split(",") if c.strip()]
    options = ExportOptions(
        columns=list(columns) if columns is not None else None, where=where,
        partition_by=list(partition_by or []), files=files,
        max_records_per_file=max_records_per_file, compression=compression)
    options.validate()
    dest_path = _resolve_dest(dest)
    _check_dest_writable(dest_path)
    source = _resolve_source(table)
    _check_replaceable(dest_path)  # again under the lock; here to refuse before any write
    with _dest_lock(dest_path, report):
        return _export(source, dest_path, options, remote, force, report, started)


def _export(source: _Source, dest_path: str, options: ExportOptions, remote: str | None,
            force: bool, report: StatusCallback, started: float) -> ExportResult:
    if not force and (previous := _unchanged(dest_path, source, options)) is not None:
        return ExportResult(dest_path, previous, True, time.monotonic() - started)
    _check_replaceable(dest_path)

    spark = get_session(remote, status=report)
    try:
        _session_conf(spark)
        df = _shape(_dataframe(spark, source), options)
        if source.kind == "catalog":
            source.version = _version_from_server(spark, source)
            if not force and (previous := _unchanged(dest_path, source, options)) is not None:
                return ExportResult(dest_path, previous, True, time.monotonic() - started)
        schema_json = df.schema.jsonValue()
        if options.where is None and source.snap is not None and \
                source.snap.num_records is not None:
            expected = source.snap.num_records
        else:
            report("counting the source rows")
            expected = int(df.count())
    except UcstageError:
        raise
    except Exception as exc:
        raise _spark_failure(exc, "reading the table", remote) from exc

    staging = _staging_name(dest_path, "staging")
    try:
        report(f"writing {expected:,} rows")
        writer_df = df.repartition(options.files) if options.files else df
        writer = writer_df.write.mode("error").option("compression", options.compression)
        if options.max_records_per_file:
            writer = writer.option("maxRecordsPerFile", options.max_records_per_file)
        if options.partition_by:
            writer = writer.partitionBy(*options.partition_by)
        try:
            writer.parquet(staging)
        except Exception as exc:
            raise _spark_failure(exc, "writing", remote) from exc
        report("verifying the written files")
        written = _verify(staging, expected, options)
        manifest = {
            "format": MANIFEST_FORMAT,
            "table": source.label,
            "source": {"kind": source.kind, "location": source.location},
            "delta_version": source.version,
            "row_count": expected,
            "schema": schema_json,
            "files": written,
            "bytes": sum(f["bytes"] for f in written),
            "options": options.as_dict(),
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "ucstage_version": __version__,
        }
        try:
            _write_json(os.path.join(staging, MANIFEST_NAME), manifest)
            _publish(staging, dest_path)
        except OSError as exc:
            raise ExportError(f"could not publish the export into {dest_path}: {exc}") from exc
    except BaseException:
        _remove(staging)
        raise
    finally:
        report(None)
    return ExportResult(dest_path, manifest, False, time.monotonic() - started)


def _session_conf(spark: Any) -> None:
    """Session settings every export needs, on any server.

    Spark writes timestamps as INT96 by default, which pyarrow and ``datasets``
    read as naive nanoseconds; TIMESTAMP_MICROS keeps the table's microsecond,
    UTC-adjusted type.
    """
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


def _spark_failure(exc: BaseException, doing: str, remote: str | None) -> UcstageError:
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
               status: StatusCallback | None = None) -> Any:
    """Read a (small) table into a ``pyarrow.Table`` through Spark Connect's ``toArrow()``.

    The seed's ``spark.table(name).toPandas()`` path, for tables that fit in
    memory. ``name`` resolves as in :func:`export_table`; ``limit`` caps the rows.
    """
    if limit is not None and limit < 0:
        raise InvalidArgument(f"limit must be 0 or more, got {limit}")
    source = _resolve_source(name)
    spark = get_session(remote, status=status)
    try:
        df = _dataframe(spark, source)
        if limit is not None:
            df = df.limit(limit)
        return df.toArrow()
    except UcstageError:
        raise
    except Exception as exc:
        raise _spark_failure(exc, "reading the table", remote) from exc
