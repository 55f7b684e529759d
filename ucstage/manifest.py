"""A frozen listing: the files, sizes and versions of a source at one moment.

Every rank of a job can shard the same manifest while the volume changes
underneath. Two on-disk formats (docs/manifest.md): a columnar Arrow IPC file
(``*.manifest.arrow``), which every process opens memory-mapped so that a node
holds one copy of the listing in its page cache, and JSON, for people and
scripts::

    {"format": "ucstage.manifest", "format_version": 1,
     "source": "/Volumes/main/ml/train", "created": "2026-11-29T08:00:00+00:00",
     "filters": {"include": [], "exclude": [], "include_hidden": false},
     "fingerprint": "<sha256 hex>", "files_count": 2, "bytes": 300,
     "files": [["a.jpg", 100, "1764403200.0"], ["b.jpg", 200, "..."]]}

The fingerprint is the SHA-256 of the canonical listing (one
``path NUL size NUL version LF`` record per file, in listing order); it does
not depend on where the source is mounted, so ranks on different nodes agree.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import posixpath
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, overload

from .atomic import write_atomic
from .errors import EmptySource, InvalidArgument, ManifestError
from .volumes import FileEntry, Listing, Volume, list_files, resolve

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ARROW_SUFFIX", "FORMAT", "FORMATS", "MANIFEST_SUFFIX", "ArrowEntries", "Manifest",
           "fingerprint", "is_manifest_file", "load", "save", "snapshot"]

FORMAT = "ucstage.manifest"
FORMAT_VERSION = 1
FORMATS = ("arrow", "json")
"""What :func:`save` writes: the columnar Arrow IPC file, or JSON."""

ARROW_MAGIC = b"ARROW1"
BATCH_ROWS = 65536
"""Rows per record batch of an Arrow manifest: verifying streams one batch at
a time, so a process that checks a large manifest never holds all of it."""
HASH_ROWS = 8192


def fingerprint(entries: Iterable[FileEntry]) -> str:
    """SHA-256 hex digest of the canonical form of a listing."""
    if isinstance(entries, ArrowEntries):
        return _arrow_fingerprint(entries.table.to_batches())
    digest = hashlib.sha256()
    for path, size, version in entries:
        digest.update(f"{path}\0{size}\0{version}\n".encode())
    return digest.hexdigest()


def _arrow_fingerprint(batches: Iterable[Any]) -> str:
    """:func:`fingerprint` of Arrow record batches, computed in Arrow: each
    batch's canonical records are joined in C and hashed as one buffer."""
    import pyarrow as pa
    import pyarrow.compute as pc

    digest = hashlib.sha256()
    lf = pa.scalar("\n", pa.large_string())
    # Hashed in slices of HASH_ROWS: the joined records of one slice are the
    # only large buffer alive, so a full check of a huge manifest stays small.
    slices = (b.slice(at, HASH_ROWS) for b in batches for at in range(0, b.num_rows, HASH_ROWS))
    for batch in slices:
        path, size, version = (batch.column(i) for i in range(3))
        joined = pc.binary_join_element_wise(
            pc.cast(path, pa.large_string()), pc.cast(size, pa.large_string()),
            pc.cast(version, pa.large_string()), pa.scalar("\0", pa.large_string()))
        records = pc.binary_join_element_wise(joined, lf, pa.scalar("", pa.large_string()))
        offsets = records.buffers()[1]
        data = records.buffers()[2]
        import numpy as np

        first, last = np.frombuffer(offsets, dtype=np.int64)[[records.offset,
                                                                records.offset + len(records)]]
        digest.update(memoryview(data)[int(first):int(last)])
    return digest.hexdigest()


ARROW_FIELDS = (("path", "large_string"), ("size", "int64"), ("version", "large_string"))


def _schema(metadata: dict[str, str] | None = None) -> Any:
    import pyarrow as pa

    return pa.schema([pa.field(name, getattr(pa, kind)(), nullable=False)
                      for name, kind in ARROW_FIELDS], metadata=metadata)


def _table(entries: Sequence[FileEntry]) -> Any:
    """The Arrow table of ``entries`` (the same table if they already are Arrow)."""
    import pyarrow as pa

    if isinstance(entries, ArrowEntries):
        return entries.table
    return pa.Table.from_arrays(
        [pa.array([e[0] for e in entries], pa.large_string()),
         pa.array([e[1] for e in entries], pa.int64()),
         pa.array([e[2] for e in entries], pa.large_string())], schema=_schema())


_new_entry = functools.partial(tuple.__new__, FileEntry)
"""``FileEntry`` from a (path, size, version) tuple, without the NamedTuple's
Python-level ``__new__`` (a third of what making a row cost)."""


class ArrowEntries(Sequence[FileEntry]):
    """The files of a columnar manifest: a sequence of :class:`FileEntry` over
    Arrow columns (usually memory-mapped), made one row at a time on access.

    ``len()`` costs nothing; :meth:`take` makes only the rows asked for;
    :meth:`sizes` is the size column as a numpy array.
    """

    def __init__(self, table: Any) -> None:
        self.table = table
        lengths = [len(c) for c in table.column(0).chunks]
        self._starts = [0]
        for length in lengths:
            self._starts.append(self._starts[-1] + length)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def _row(self, index: int) -> FileEntry:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("manifest entry index out of range")
        return self.take([index])[0]

    @overload
    def __getitem__(self, index: int) -> FileEntry: ...

    @overload
    def __getitem__(self, index: slice) -> list[FileEntry]: ...

    def __getitem__(self, index: int | slice) -> FileEntry | list[FileEntry]:
        if isinstance(index, slice):
            return self.take(range(len(self))[index])
        return self._row(index)

    def __iter__(self) -> Iterator[FileEntry]:
        for batch in self.table.to_batches(max_chunksize=BATCH_ROWS):
            yield from map(FileEntry, batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                           batch.column(2).to_pylist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrowEntries):
            return bool(self.table.equals(other.table))
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ArrowEntries({len(self)} files)"

    def take(self, indices: Sequence[int] | np.ndarray) -> list[FileEntry]:
        """The entries at ``indices`` (any order, repeats allowed), made in one go."""
        paths, versions = self._strings(0, indices), self._strings(2, indices)
        sizes = self._ints(1, indices)
        return list(map(_new_entry, zip(paths, sizes, versions, strict=True)))

    def paths(self, indices: Sequence[int] | np.ndarray | None = None) -> list[str]:
        """The relative paths at ``indices`` (None: every path, in listing order)."""
        if indices is None:
            return self.table.column(0).to_pylist()  # type: ignore[no-any-return]
        return self._strings(0, indices)

    def _locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunk, row within the chunk) of each of ``indices``, checked."""
        import numpy as np

        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError("manifest entry index out of range")
        starts = np.asarray(self._starts, dtype=np.int64)
        chunk = np.searchsorted(starts, idx, side="right") - 1
        return chunk, idx - starts[chunk]

    # Rows are read straight from the column buffers with numpy: only the pages
    # holding the asked-for rows are touched, and no Arrow compute kernel (tens
    # of MiB of library pages per process) is loaded.
    def _ints(self, column: int, indices: Sequence[int] | np.ndarray) -> list[int]:
        import numpy as np

        chunk, row = self._locate(indices)
        out = np.empty(len(row), dtype=np.int64)
        for c in np.unique(chunk).tolist():
            where = chunk == c
            array = self.table.column(column).chunk(c)
            values = np.frombuffer(array.buffers()[1], dtype=np.int64)
            out[where] = values[row[where] + array.offset]
        return out.tolist()  # type: ignore[no-any-return]

    def _strings(self, column: int, indices: Sequence[int] | np.ndarray) -> list[str]:
        import numpy as np

        chunk, row = self._locate(indices)
        out: list[str] = [""] * len(row)
        for c in np.unique(chunk).tolist():
            where = np.flatnonzero(chunk == c)
            array = self.table.column(column).chunk(c)
            _, offsets_buf, data_buf = array.buffers()
            offsets = np.frombuffer(offsets_buf, dtype=np.int64)
            data = memoryview(data_buf)
            local = row[where] + array.offset
            begins, ends = offsets[local].tolist(), offsets[local + 1].tolist()
            for slot, begin, end in zip(where.tolist(), begins, ends, strict=True):
                out[slot] = str(data[begin:end], "utf-8")
        return out

    def sizes(self) -> np.ndarray:
        """Every file's size, in listing order (int64; no per-file Python objects)."""
        import numpy as np

        chunks = [c.to_numpy() for c in self.table.column(1).chunks]
        if len(chunks) == 1:
            return chunks[0]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Manifest:
    """A frozen, fingerprinted listing of a source."""

    source: str
    """Where the files live: a ``/Volumes/...`` path (re-resolved on each node)
    or an absolute path or URL."""
    entries: Sequence[FileEntry]
    """The files in listing order: a list, or for a columnar manifest an
    :class:`ArrowEntries` that makes a :class:`FileEntry` per access."""
    fingerprint: str
    created: str = ""
    filters: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    """The manifest file this was loaded from, if any."""
    refused: Sequence[tuple[str, str]] = ()
    """(path, reason) of unsafe entries left out of a fresh listing."""
    unreadable: Sequence[tuple[str, str]] = ()
    """(folder, reason) of folders a fresh listing skipped because they could
    not be read (only with ``skip_unreadable``); paths relative to the source."""

    @property
    def total_bytes(self) -> int:
        if isinstance(self.entries, ArrowEntries):
            return int(self.entries.sizes().sum())
        return sum(e.size for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def sizes(self) -> Sequence[int] | np.ndarray:
        """Every file's size in listing order: a numpy array for a columnar
        manifest (no per-file Python objects), else a list."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.sizes()
        return [e.size for e in self.entries]

    def take(self, indices: Sequence[int] | np.ndarray) -> list[FileEntry]:
        """The entries at ``indices``, making only those rows."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.take(indices)
        return [self.entries[int(i)] for i in indices]

    def paths(self, indices: Sequence[int] | np.ndarray | None = None) -> list[str]:
        """The relative paths at ``indices`` (None: every path, in listing order)."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.paths(indices)
        if indices is None:
            return [e.path for e in self.entries]
        return [self.entries[int(i)].path for i in indices]

    def volume(self) -> Volume:
        """Resolve the source for reading (on this node, with this node's env).

        A manifest made by a fresh listing in this process returns the volume
        that listing resolved moments ago: resolving again would ask the store
        (a HEAD and a LIST for an object-store prefix) once more on every
        command. A copy in another process (pickled, forked, loaded from a
        file) resolves afresh."""
        fresh = self.__dict__.get("_listed")
        if fresh is not None and fresh[0] == os.getpid():
            return fresh[1]  # type: ignore[no-any-return]
        return resolve(self.source)

    def __getstate__(self) -> dict[str, Any]:
        # The listing's volume belongs to this process (see volume()).
        return {k: v for k, v in self.__dict__.items() if k != "_listed"}

    @classmethod
    def from_listing(cls, listing: Listing, filters: dict[str, Any] | None = None) -> Manifest:
        vol = listing.volume
        source = vol.source if vol.source.startswith("/Volumes") else vol.url
        return cls(
            source=source,
            entries=listing.entries,
            fingerprint=fingerprint(listing.entries),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            filters=dict(filters or {}),
            refused=list(listing.refused),
            unreadable=list(listing.unreadable),
        )

    def _header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "created": self.created,
            "filters": self.filters,
            "fingerprint": self.fingerprint,
            "files_count": len(self.entries),
            "bytes": self.total_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        return {**self._header(), "files": [list(e) for e in self.entries]}


def _format_for(path: str, format: str | None) -> str:
    """The format :func:`save` writes: ``format`` if given, else by name
    (``.arrow`` is columnar, anything else JSON)."""
    if format is None:
        return "arrow" if path.lower().endswith(".arrow") else "json"
    if format not in FORMATS:
        raise InvalidArgument(f"format must be one of {FORMATS}, got {format!r}")
    if format == "arrow" and path.lower().endswith(".json"):
        raise InvalidArgument(f"{path}: a .json name is read as a JSON manifest; give an "
                              f"Arrow manifest a name ending in {ARROW_SUFFIX}")
    return format


def _arrow_bytes(manifest: Manifest) -> Any:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    header = {k: json.dumps(v, ensure_ascii=False) for k, v in manifest._header().items()}
    table = _table(manifest.entries)
    table = table.replace_schema_metadata(header)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    return sink.getvalue()


def save(manifest: Manifest, path: str | os.PathLike[str], *, format: str | None = None) -> str:
    """Write a manifest atomically and durably (:mod:`ucstage.atomic`); return its path.

    ``format`` is ``"arrow"`` (the columnar Arrow IPC file) or ``"json"``;
    by default a name ending in ``.arrow`` (``train.manifest.arrow``) is
    written columnar and any other name (``train.manifest.json``) as JSON.
    """
    path = os.fspath(path)
    kind = _format_for(path, format)
    if os.path.isdir(path):
        raise InvalidArgument(f"{path} is a folder; give the manifest a file name, "
                              f"e.g. {os.path.join(path, 'train' + ARROW_SUFFIX)}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise InvalidArgument(f"cannot write manifest {path}: {folder} is not a folder") from exc
    if kind == "arrow":
        write_atomic(path, memoryview(_arrow_bytes(manifest)))  # type: ignore[arg-type]
        return path
    # One dumps() + write is several times faster than dump()'s many small writes.
    write_atomic(path, json.dumps(manifest.to_json(), ensure_ascii=False, separators=(",", ":")))
    return path


MANIFEST_SUFFIX = ".manifest.json"
ARROW_SUFFIX = ".manifest.arrow"

# How much of each end of a file is searched for the format marker before a
# ``.json`` file is parsed: a manifest written by ucstage starts with it, one
# re-serialised with sorted keys ends near it, and a large JSON data file is
# then refused without being parsed whole.
_SNIFF = 64 * 1024


def _mapped(path: str) -> bool:
    """Whether ``path`` is read through :func:`ucstage.volumes.resolve` (a URL or
    a ``/Volumes`` path) rather than opened as written."""
    return ("://" in path or path.startswith("dbfs:")
            or path == "/Volumes" or path.startswith("/Volumes/"))


def is_manifest_file(path: str) -> bool:
    """True when the SOURCE ``path`` is read as a ucstage manifest.

    The rule (docs/manifest.md): a name ending in ``.json`` or ``.manifest.arrow``
    always is, wherever it lives (local, ``/Volumes``, URL), so a JSON file
    that is not a manifest is refused by :func:`load`, never staged as a
    one-file dataset; any other local file is when it starts like a manifest
    (JSON with the format marker, or an Arrow file whose schema carries it).
    """
    lower = path.lower()
    if lower.endswith(".json") or lower.endswith(ARROW_SUFFIX):
        return _mapped(path) or not os.path.isdir(path)
    if _mapped(path) or not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.startswith(ARROW_MAGIC):
        return _arrow_marked(path)
    return head.lstrip().startswith(b"{") and FORMAT.encode() in head


def _arrow_marked(path: str) -> bool:
    """Whether the local Arrow file ``path`` carries the manifest's format marker
    (reads its footer and schema only)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        with pa.memory_map(path) as mm:
            meta = ipc.open_file(mm).schema.metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return meta.get(b"format") == json.dumps(FORMAT).encode()


def _not_a_manifest(path: str, why: str) -> ManifestError:
    split = posixpath.split if _mapped(path) else os.path.split
    folder, name = split(path if _mapped(path) else os.path.abspath(path))
    if name.endswith(MANIFEST_SUFFIX):
        hint = "recreate it with `ucstage cache lazy SOURCE` or manifest.save()"
    else:
        hint = ("a .json SOURCE is read as a manifest (`ucstage cache lazy` writes one); to "
                f"stage a JSON data file, give its folder {folder} with `include` {name}")
    return ManifestError(f"{path} is not a ucstage manifest ({why})", hint=hint)


def _open(path: str) -> tuple[Any, bool]:
    """An open binary file for the manifest ``path`` and whether it is local.
    URLs and ``/Volumes`` paths are opened where they resolve to."""
    if _mapped(path):
        volume = resolve(path)  # a missing file: SourceNotFound says where it looked
        where = volume.full_path(volume.file) if volume.file else volume.root
        if volume.is_local:
            return open(where, "rb"), True
        return volume.fs.open(where, "rb"), False
    return open(path, "rb"), True


def _local_name(path: str) -> str:
    if _mapped(path):
        volume = resolve(path)
        return volume.full_path(volume.file) if volume.file else volume.root
    return path


def _read(fh: Any) -> bytes | None:
    """The JSON manifest's bytes; None when a large file lacks the format
    marker near either end (a data file: refused without reading it whole)."""
    size = fh.seek(0, os.SEEK_END)
    if size > 2 * _SNIFF:
        fh.seek(0)
        head = fh.read(_SNIFF)
        fh.seek(size - _SNIFF)
        if FORMAT.encode() not in head and FORMAT.encode() not in fh.read(_SNIFF):
            return None
    fh.seek(0)
    return bytes(fh.read())


def load(path: str | os.PathLike[str], *, verify: bool = True,
         expect_fingerprint: str | None = None, expect_size: int | None = None) -> Manifest:
    """Load a manifest (columnar or JSON) and check it.

    ``path`` is a local file, or a ``/Volumes`` path or URL read where
    :func:`ucstage.volumes.resolve` maps it. A local columnar manifest is
    memory-mapped: its rows are read from the page cache when accessed, so
    every process of a node shares one copy.

    Args:
        verify: recompute the fingerprint from the files (the whole manifest is
            read once, one record batch at a time). ``False`` checks only the
            header of a columnar manifest: format, row count, and
            ``expect_fingerprint`` / ``expect_size`` (the file's byte size) when
            given. For workers of a process that verified the same file; a JSON
            manifest is always verified.

    Raises:
        SourceNotFound: a ``/Volumes`` path or URL that does not exist (the
            message says where it was looked up).
        ManifestError: the file is missing, not a ucstage manifest (not JSON,
            or no ``"format": "ucstage.manifest"``), malformed, its files
            do not hash to its fingerprint, or it does not match what was expected.
    """
    path = os.fspath(path)
    try:
        if expect_size is not None and not _mapped(path) and os.path.getsize(path) != expect_size:
            raise ManifestError(
                f"manifest {path} is {os.path.getsize(path):,} bytes, expected {expect_size:,} "
                "(replaced or truncated since it was frozen)",
                hint="freeze the listing again; every process must read the same manifest")
        fh, local = _open(path)
        with fh:
            magic = fh.read(len(ARROW_MAGIC))
            if magic == ARROW_MAGIC:
                fh.seek(0)
                result = _load_arrow(path, fh, local, verify=verify)
            else:
                raw = _read(fh)
                if raw is None:
                    raise _not_a_manifest(path, f'no "format": "{FORMAT}"')
                result = _load_json(path, raw)
    except FileNotFoundError as exc:
        raise ManifestError(f"manifest {path} does not exist") from exc
    except OSError as exc:
        raise _not_a_manifest(path, f"cannot be read: {exc}") from exc
    if expect_fingerprint is not None and result.fingerprint != expect_fingerprint:
        raise ManifestError(
            f"manifest {path} holds fingerprint {result.fingerprint[:12]}, expected "
            f"{expect_fingerprint[:12]} (replaced since it was frozen)",
            hint="freeze the listing again; every process must read the same manifest")
    return result


def _header_value(meta: dict[bytes, bytes], key: str, path: str) -> Any:
    try:
        return json.loads(meta[key.encode()])
    except (KeyError, ValueError) as exc:
        raise ManifestError(f"manifest {path} is malformed: no valid {key!r} in its header") from exc


def _load_arrow(path: str, fh: Any, local: bool, *, verify: bool,
                expect_size: int | None = None) -> Manifest:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        source: Any = pa.memory_map(_local_name(path)) if local else pa.BufferReader(fh.read())
        reader = ipc.open_file(source)
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"manifest {path} is not a readable Arrow file: {exc}",
                            hint="recreate it with `ucstage cache lazy SOURCE` or manifest.save()"
                            ) from exc
    meta = reader.schema.metadata or {}
    if meta.get(b"format") != json.dumps(FORMAT).encode():
        raise _not_a_manifest(path, "an Arrow file without the ucstage.manifest header")
    version = _header_value(meta, "format_version", path)
    if version != FORMAT_VERSION:
        raise ManifestError(f"manifest {path} has format_version {version!r}; "
                            f"this ucstage reads version {FORMAT_VERSION}")
    if tuple((f.name, str(f.type)) for f in reader.schema) != ARROW_FIELDS:
        raise ManifestError(f"manifest {path} is malformed: columns {reader.schema.names}")
    expected = str(_header_value(meta, "fingerprint", path))
    rows = _header_value(meta, "files_count", path)
    table = reader.read_all()  # zero-copy: the columns point into the mapping
    if table.num_rows != rows or any(c.null_count for c in table.columns):
        raise ManifestError(f"manifest {path} fails its header check "
                            f"({table.num_rows} rows, header says {rows})",
                            hint="recreate it from the source")
    if verify:
        matches = _arrow_fingerprint(_batches(path, local, reader)) == expected
        # The check's buffers are freed; hand their pages back now rather than
        # keep them in the allocator for the life of a long training process.
        pa.default_memory_pool().release_unused()
        if not matches:
            raise ManifestError(
                f"manifest {path} fails its fingerprint check (file edited or truncated)",
                hint="recreate it from the source",
            )
    return Manifest(
        source=str(_header_value(meta, "source", path)),
        entries=ArrowEntries(table),
        fingerprint=expected,
        created=str(_header_value(meta, "created", path) or ""),
        filters=dict(_header_value(meta, "filters", path) or {}),
        path=path,
    )


def _batches(path: str, local: bool, reader: Any) -> Iterator[Any]:
    """The record batches, one at a time, read (not mapped) from a local file:
    verifying a large manifest then leaves none of it resident in this process."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    if not local:
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
        return
    with pa.OSFile(_local_name(path)) as raw:
        streamed = ipc.open_file(raw)
        for i in range(streamed.num_record_batches):
            yield streamed.get_batch(i)


def _load_json(path: str, raw: bytes) -> Manifest:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_a_manifest(path, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _not_a_manifest(path, f'no "format": "{FORMAT}"')
    if data.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"manifest {path} has format_version {data.get('format_version')!r}; "
            f"this ucstage reads version {FORMAT_VERSION}"
        )
    try:
        entries = [FileEntry(p, s, v) for p, s, v in data["files"]]
        if not all(type(p) is str and type(s) is int and type(v) is str for p, s, v in entries):
            raise TypeError("every file must be [path, size, version]")
        source = str(data["source"])
        expected = str(data["fingerprint"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"manifest {path} is malformed: {exc!r}") from exc
    actual = fingerprint(entries)
    if actual != expected:
        raise ManifestError(
            f"manifest {path} fails its fingerprint check (file edited or truncated)",
            hint="recreate it from the source",
        )
    return Manifest(
        source=source,
        entries=entries,
        fingerprint=expected,
        created=str(data.get("created", "")),
        filters=dict(data.get("filters") or {}),
        path=path,
    )


def snapshot(
    source: str | None = None,
    *,
    manifest: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    include_hidden: bool = False,
    allow_empty: bool = False,
    skip_unreadable: bool = False,
) -> Manifest:
    """The one way commands get their file list: a saved manifest, or a fresh listing.

    ``source`` may itself be a manifest file (:func:`is_manifest_file`).
    Filters and ``skip_unreadable`` apply to fresh listings only (see
    :func:`ucstage.volumes.list_files`); a manifest is used as frozen.

    Raises:
        EmptySource: nothing is left to read (unless ``allow_empty``).
        UnreadableFolders: folders inside the source cannot be read (unless
            ``skip_unreadable``, which records them in ``Manifest.unreadable``).
    """
    if manifest is None and source is not None and is_manifest_file(source):
        manifest = source
    if manifest is not None:
        result = load(manifest)
    else:
        if source is None:
            raise ManifestError("give a `source` or a `manifest` file")
        filters = {"include": list(include), "exclude": list(exclude),
                   "include_hidden": include_hidden}
        listing = list_files(source, include=include, exclude=exclude,
                             include_hidden=include_hidden, skip_unreadable=skip_unreadable)
        result = Manifest.from_listing(listing, filters)
        # Remembered outside the dataclass's fields (see Manifest.volume), as
        # resolve(result.source) would name it (no lookup: must_exist=False).
        named = resolve(result.source, must_exist=False).source
        object.__setattr__(result, "_listed",
                           (os.getpid(), dataclasses.replace(listing.volume, source=named)))
    if not result.entries and not allow_empty:
        where = result.path or result.source
        raise EmptySource(
            f"{where} has no files to read",
            hint="names starting with _ or . are skipped unless include_hidden; "
                 "check `include`/`exclude`",
        )
    return result
