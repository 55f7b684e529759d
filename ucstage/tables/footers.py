"""Reading a table's Parquet footers once: every row group with its file, row
count and column-chunk byte ranges, and the schema every batch is read as.

Footers are read in threads (a footer is two small reads at the end of a
file: on a store, two round trips). A file whose footer does not parse, or
is encrypted (checked on the raw bytes first: :mod:`.encrypted`), is
:class:`~ucstage.errors.NotParquet`, named; a footer whose column chunks lie
past the file's pages is :class:`~ucstage.errors.CorruptParquet`. A footer's
chunk sizes are claims: they are read with pyarrow's slack for the writer
known to understate them (PARQUET-816). Footers whose schemas cannot be
unified (a plain Parquet folder) are :class:`~ucstage.errors.SchemaMismatch`,
naming two files that disagree. For Delta the log's schema is authoritative.
"""

from __future__ import annotations

import io
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..engines import engine
from ..engines.engine import read_ranges
from ..errors import CorruptParquet, NotParquet, SchemaMismatch
from ..volumes import FileEntry, Volume
from .encrypted import encryption
from .resolve import TableSource

__all__ = ["INT96_UNIT", "FileFooter", "arrow_schema", "chunk_ranges", "read_footers",
           "table_schema"]

FOOTER_THREADS = 16
"""Footers read at once from a remote source."""


@dataclass(frozen=True)
class FileFooter:
    """One file's parsed footer and the row groups it holds."""

    entry: FileEntry
    footer: bytes
    """The serialised footer (``PAR1`` + metadata + length + ``PAR1``)."""
    metadata: Any
    """The parsed ``pyarrow.parquet.FileMetaData``."""
    leaves: list[str]
    """The file's leaf columns (``path_in_schema``), in column order."""
    ranges: list[list[tuple[int, int]]]
    """Per row group, (offset, length) of each column chunk (:func:`chunk_ranges`)."""


def _footer_bytes(metadata: Any) -> bytes:
    buf = io.BytesIO()
    metadata.write_metadata_file(buf)
    return buf.getvalue()


_TAIL = 64 * 1024
"""Bytes read from a file's end at first: most footers fit, so one read does."""


class _Encrypted(Exception):
    """The file's footer or columns are encrypted (the reason)."""


def _footer_thrift(volume: Volume, entry: FileEntry) -> bytes:
    """The serialised ``FileMetaData`` of ``entry``, from ranged reads of its end."""
    size = entry.size
    if size < 12:
        raise ValueError(f"{size} bytes, too small for Parquet")
    n = min(size, _TAIL)
    (tail,), _ = read_ranges(volume, entry.path, [(size - n, n)])
    if tail[-4:] == b"PARE":
        raise _Encrypted("an encrypted footer, magic PARE")
    if tail[-4:] != b"PAR1":
        raise ValueError("no Parquet magic at the end")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 8 > size - 4:
        # The length field is 4 bytes of the file: never shown (it may be any file).
        raise ValueError(f"its footer length field exceeds the file's {size} bytes")
    if length + 8 > n:
        (tail,), _ = read_ranges(volume, entry.path, [(size - length - 8, length + 8)])
    return bytes(tail[-(length + 8):-8])


def _read_one(volume: Volume, entry: FileEntry, label: str) -> FileFooter:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        thrift = _footer_thrift(volume, entry)
        # Before pyarrow sees it: pyarrow aborts the process on encrypted
        # column metadata it cannot decrypt.
        why = encryption(thrift)
        if why:
            raise _Encrypted(why)
        framed = b"PAR1" + thrift + len(thrift).to_bytes(4, "little") + b"PAR1"
        metadata = pq.read_metadata(pa.BufferReader(framed))
    except _Encrypted as exc:
        raise NotParquet(f"{label}: {entry.path} is encrypted ({exc})",
                         hint="ucstage reads unencrypted Parquet only: decrypt the files "
                              "(pyarrow.parquet.encryption) into another folder") from None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError, InterruptedError)):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NotParquet(f"{label}: {entry.path} is not a Parquet file ({first})",
                         hint="a table source holds Parquet files only (names starting "
                              "with _ or . are not read)") from exc
    leaves = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    data_end = entry.size - len(thrift) - 8
    ranges = [_checked_ranges(metadata, g, entry.size, data_end, leaves,
                              f"{label}: {entry.path}")
              for g in range(metadata.num_row_groups)]
    return FileFooter(entry, _footer_bytes(metadata), metadata, leaves, ranges)


def read_footers(table: TableSource) -> list[FileFooter]:
    """Every file's footer, in the source's file order. On the object-store
    engine they are read in a child process while obstore is unused here
    (:func:`ucstage.engines.objstore.keep_clean`), so DataLoader workers forked from
    this process later still read through obstore."""
    return engine.of(table.volume).keep_clean(_read_all, table)


def _read_all(table: TableSource) -> list[FileFooter]:
    volume = table.volume
    threads = 1 if volume.is_local and len(table.files) < 8 else FOOTER_THREADS
    if threads == 1:
        return [_read_one(volume, e, table.source) for e in table.files]
    with ThreadPoolExecutor(min(threads, max(1, len(table.files)))) as pool:
        return list(pool.map(lambda e: _read_one(volume, e, table.source), table.files))


def table_schema(table: TableSource, footers: list[FileFooter]) -> Any:
    """The ``pyarrow.Schema`` every batch of the table is read as.

    Delta: the log's (partition columns included). Otherwise the footers'
    schemas unified; a column that is null-typed in some files takes the
    others' type.

    Raises:
        SchemaMismatch: two files' schemas cannot be unified.
    """
    import pyarrow as pa

    if table.schema is not None:
        return table.schema
    schemas = [arrow_schema(f.metadata).remove_metadata() for f in footers]
    if not schemas:
        return pa.schema([])
    try:
        return _with_folders(pa.unify_schemas(schemas), table.partition_values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        first = schemas[0]
        for footer, schema in zip(footers[1:], schemas[1:], strict=True):
            try:
                pa.unify_schemas([first, schema])
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                clash = _clash(first, schema)
                raise SchemaMismatch(
                    f"{table.source}: the schemas of {footers[0].entry.path} and "
                    f"{footer.entry.path} cannot be unified{clash}",
                    hint="rewrite the files with one schema, or read them as separate "
                         "sources") from exc
        raise SchemaMismatch(f"{table.source}: the files' schemas cannot be unified "
                             f"({str(exc).splitlines()[0]})") from exc


INT96_UNIT = "us"
"""The unit INT96 timestamps are read in (Spark writes them): microseconds, as
Delta's timestamp is; pyarrow's default, nanoseconds, cannot hold 9999-12-31."""


def arrow_schema(metadata: Any) -> Any:
    """The ``pyarrow.Schema`` a file's rows are read as: its footer's, with
    INT96 timestamps (at any depth) in :data:`INT96_UNIT`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = metadata.schema
    if not any(schema.column(i).physical_type == "INT96" for i in range(len(schema))):
        return schema.to_arrow_schema()
    # ParquetFile applies the unit to the schema as its reads do; given the
    # metadata it reads nothing from the (empty) source.
    return pq.ParquetFile(pa.BufferReader(b""), metadata=metadata,
                          coerce_int96_timestamp_unit=INT96_UNIT).schema_arrow


def _with_folders(schema: Any, values: list[dict[str, Any]]) -> Any:
    """``schema`` plus the ``COL=value`` folder columns the files do not hold:
    int64 when every value is a whole number, else string."""
    import pyarrow as pa

    for name in (values[0] if values else {}):
        if name in schema.names:
            continue
        seen = [v[name] for v in values if v[name] is not None]
        whole = bool(seen) and all(str(x).lstrip("-").isdigit() for x in seen)
        schema = schema.append(pa.field(name, pa.int64() if whole else pa.string()))
    return schema


def _clash(a: Any, b: Any) -> str:
    for field in a:
        if field.name in b.names:
            other = b.field(field.name)
            if other.type != field.type:
                return f" (column {field.name!r} is {field.type} in one, {other.type} in the other)"
    return ""


PARQUET_816_PAD = 100
"""Bytes pyarrow adds to each column chunk of a file from parquet-mr before
1.2.9, which left the dictionary page header out of ``total_compressed_size``
(PARQUET-816; pyarrow's ``kMaxDictHeaderSize``)."""

_NUMBERS = re.compile(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def understates_chunks(created_by: str | None) -> bool:
    """Whether the writer ``created_by`` names is a parquet-mr before 1.2.9,
    read as pyarrow reads it: case aside, the application is what precedes
    ``version``, and a version part that is missing counts as 0 (so a bare
    ``parquet-mr`` is padded too; padding a correct chunk costs 100 bytes)."""
    app, _, rest = (created_by or "").lower().partition("version")
    if app.strip() != "parquet-mr":
        return False
    m = _NUMBERS.match(rest)
    version = tuple(int(x or 0) for x in m.groups()) if m else (0, 0, 0)
    return version < (1, 2, 9)


def chunk_ranges(metadata: Any, index: int, size: int) -> list[tuple[int, int]]:
    """(offset, length) of every column chunk of row group ``index`` of a file
    of ``size`` bytes, in column order: from the dictionary page (if it comes
    first), with pyarrow's slack for a writer known to understate the length,
    so that the cached bytes hold every byte pyarrow reads of the chunk."""
    rg = metadata.row_group(index)
    pad = understates_chunks(metadata.created_by)
    out = []
    for c in range(rg.num_columns):
        col = rg.column(c)
        start = int(col.data_page_offset)
        if col.has_dictionary_page and col.dictionary_page_offset is not None \
                and 0 < col.dictionary_page_offset < start:
            start = int(col.dictionary_page_offset)
        length = int(col.total_compressed_size)
        if pad:
            length += max(0, min(PARQUET_816_PAD, size - start - length))
        out.append((start, length))
    return out


def _checked_ranges(metadata: Any, index: int, size: int, data_end: int, leaves: list[str],
                    where: str) -> list[tuple[int, int]]:
    """:func:`chunk_ranges`, each chunk's stated range checked against the
    file: a footer pointing outside the file's pages is malformed, said at
    freeze (never fetched, and retried, as a short read).

    A row group without rows is the exception at the start: its chunks hold
    no data page, so writers leave ``data_page_offset`` 0 (pyarrow's own
    writer does, for a group written empty; older writers zero every
    offset). pyarrow reads such a file: it takes the range from 0 as stated
    and decodes nothing from it. The same range is cached (a few bytes), so
    the group reads as pyarrow reads it; its end is still checked."""
    rg = metadata.row_group(index)
    out = chunk_ranges(metadata, index, size)
    first = 0 if not rg.num_rows else 4
    for c, (start, _) in enumerate(out):
        stated = int(rg.column(c).total_compressed_size)
        if start < first or stated < 0 or start + stated > data_end:
            raise CorruptParquet(
                f"{where}: row group {index}, column {leaves[c]!r}: its chunk "
                f"({stated} bytes at {start}) lies past the file's pages (bytes 4..{data_end})",
                hint="the file's footer is malformed: rewrite the file")
    return out
