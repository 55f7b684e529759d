"""The manifest model: what every kind of frozen listing answers
(:class:`Frozen`), the listing of files (:class:`Manifest`) and its
:func:`fingerprint`.

Every rank of a job can shard the same manifest while the volume changes
underneath. The fingerprint is the SHA-256 of the canonical listing (one
``path NUL size NUL version LF`` record per file, in listing order); it does
not depend on where the source is mounted, so ranks on different nodes agree.
The other kind, a table's row groups, is :mod:`ucstage.manifest.rowgroups`;
the files either is saved to and loaded from: :mod:`ucstage.manifest.files`.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import InvalidArgument, ManifestError
from ..volumes.entry import FileEntry
from ..volumes.listing import Listing
from ..volumes.location import Volume, is_volumes_path, resolve
from . import columns
from .arrays import numbers
from .columns import ARROW_FIELDS, BATCH_ROWS, SAMPLE_FIELD, ArrowEntries
from .groups import Grouped, Grouping, Groups, combined_fingerprint, group_paths

if TYPE_CHECKING:
    import numpy as np
    from pyarrow.ipc import RecordBatchFileReader

__all__ = ["FORMAT", "FORMAT_VERSION", "Frozen", "Manifest", "Meta", "fingerprint",
           "group_manifest", "header_value"]

FORMAT = "ucstage.manifest"
FORMAT_VERSION = 1
Meta = dict[bytes, bytes]
"""An Arrow file's schema metadata, where either kind keeps its header."""


def fingerprint(entries: Iterable[FileEntry]) -> str:
    """SHA-256 hex digest of the canonical form of a listing."""
    if isinstance(entries, ArrowEntries):
        # Through the module, so that a test's stand-in sees every full pass.
        return columns.arrow_fingerprint(entries.table.to_batches())
    digest = hashlib.sha256()
    for path, size, version in entries:
        digest.update(f"{path}\0{size}\0{version}\n".encode())
    return digest.hexdigest()


class Frozen(abc.ABC):
    """What every kind of frozen listing answers: files (:class:`Manifest`)
    or a table's row groups (:class:`~ucstage.manifest.rowgroups.RowGroupManifest`).

    Each is saved and loaded by :func:`ucstage.manifest.save` and
    :func:`ucstage.manifest.load` (one Arrow IPC file, its header in the
    schema metadata; files may also be JSON), checked by one fingerprint, and
    sharded by the slot rule one item per row.
    """

    source: str
    fingerprint: str
    path: str | None
    groups: Groups | None = None
    """Sample boundaries when files are grouped into samples; never for row groups."""
    formats: ClassVar[tuple[str, ...]]
    """What it can be saved as (``"arrow"``, ``"json"``)."""
    suffix: ClassVar[str]
    """How the name of its Arrow file ends."""
    batch_rows: ClassVar[int | None] = None
    """Rows per record batch of its Arrow file (None: one batch)."""
    marker: ClassVar[str]
    """Its format marker, as messages name it."""

    @abc.abstractmethod
    def compute_fingerprint(self) -> str:
        """The fingerprint recomputed from what it holds."""

    @abc.abstractmethod
    def header(self) -> dict[str, Any]:
        """Its fields without its rows, as its file stores them."""

    @abc.abstractmethod
    def arrow_table(self) -> Any:
        """The ``pyarrow.Table`` of its Arrow file, the header in the schema metadata."""

    @classmethod
    def marked(cls, meta: Meta) -> bool:
        """Whether an Arrow file's schema metadata carries this kind's format
        marker: by default, the key its header is kept under (:meth:`with_header`)."""
        return cls.marker.encode() in meta

    def with_header(self, table: Any) -> Any:
        """``table`` with this listing's header as one JSON value under its marker."""
        return table.replace_schema_metadata(
            {self.marker.encode(): json.dumps(self.header()).encode()})

    @classmethod
    @abc.abstractmethod
    def from_arrow(cls, path: str, reader: RecordBatchFileReader, local_path: str | None, *,
                   verify: bool) -> Frozen:
        """The listing of the Arrow file ``path`` (its name in messages) open
        in ``reader``, its header checked, and its fingerprint when ``verify``."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Rows: what the slot rule deals."""

    @abc.abstractmethod
    def sizes(self) -> Any:
        """Bytes per row (what the loader's window check sizes)."""

    @abc.abstractmethod
    def volume(self) -> Volume:
        """Where its rows are read from, resolved on this node."""

    def intact(self) -> bool:
        """Whether what it holds still hashes to its fingerprint."""
        return self.compute_fingerprint() == self.fingerprint


def header_value(meta: Meta, key: str, path: str) -> Any:
    """The JSON value of ``key`` in an Arrow file's schema metadata."""
    try:
        return json.loads(meta[key.encode()])
    except (KeyError, ValueError, RecursionError) as exc:  # json recurses once per level
        raise ManifestError(f"manifest {path} is malformed: no valid {key!r} in its header") from exc


def fails_fingerprint(path: str) -> ManifestError:
    """The error for a listing file that does not hash to its fingerprint."""
    return ManifestError(f"manifest {path} fails its fingerprint check (file edited or truncated)",
                         hint="recreate it from the source")


@dataclass(frozen=True)
class Manifest(Frozen):
    """A frozen, fingerprinted listing of a source's files."""

    formats: ClassVar[tuple[str, ...]] = ("arrow", "json")
    suffix: ClassVar[str] = ".manifest.arrow"
    marker: ClassVar[str] = FORMAT
    batch_rows: ClassVar[int | None] = BATCH_ROWS

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
    groups: Groups | None = None
    """Sample boundaries when the rows are grouped into samples
    (:func:`group_manifest`); the fingerprint then
    covers them too."""

    def compute_fingerprint(self) -> str:
        """The fingerprint recomputed from the rows (and the grouping)."""
        return combined_fingerprint(fingerprint(self.entries), self.groups)

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

    def columns(self, indices: Sequence[int] | np.ndarray) -> tuple[list[str], list[int],
                                                                   list[str]]:
        """The paths, sizes and versions at ``indices`` (:meth:`take`'s
        entries as three lists, without an object per entry)."""
        if isinstance(self.entries, ArrowEntries):
            return self.entries.columns(indices)
        rows = [self.entries[int(i)] for i in indices]
        return [e.path for e in rows], [e.size for e in rows], [e.version for e in rows]

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

    def with_listing_of(self, fresh: Manifest) -> Manifest:
        """This manifest, its :meth:`volume` the one ``fresh``'s listing
        resolved in this process, if it was listed here (``fresh``: the same
        listing before it was grouped, or saved and mapped): the source is
        not resolved a second time."""
        listed = fresh.__dict__.get("_listed")
        if listed is not None:
            object.__setattr__(self, "_listed", listed)
        return self

    def __getstate__(self) -> dict[str, Any]:
        # The listing's volume belongs to this process (see volume()).
        return {k: v for k, v in self.__dict__.items() if k != "_listed"}

    @classmethod
    def from_listing(cls, listing: Listing, filters: dict[str, Any] | None = None) -> Manifest:
        """The manifest of a fresh listing; :meth:`volume` returns the
        listing's volume in this process, named as the manifest names its source."""
        vol = listing.volume
        # A /Volumes path is kept as given (each node maps it); anything else
        # is named by where it resolved (a relative path means nothing elsewhere).
        source = vol.source if is_volumes_path(vol.source) else vol.url
        manifest = cls(
            source=source,
            entries=listing.entries,
            fingerprint=fingerprint(listing.entries),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            filters=dict(filters or {}),
            refused=list(listing.refused),
            unreadable=list(listing.unreadable),
        )
        # Remembered outside the dataclass's fields (see volume()).
        object.__setattr__(manifest, "_listed",
                           (os.getpid(), dataclasses.replace(vol, source=source)))
        return manifest

    def header(self) -> dict[str, Any]:
        """The manifest's fields without its files (both formats store them)."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "created": self.created,
            "filters": self.filters,
            "fingerprint": self.fingerprint,
            "files_count": len(self.entries),
            "bytes": self.total_bytes,
            **({"grouping": self.groups.header()} if self.groups is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        """The JSON manifest's document (docs/manifest.md)."""
        return {**self.header(), "files": [list(e) for e in self.entries]}

    def arrow_table(self) -> Any:
        """The columnar manifest's table: the header fields are the schema's
        metadata, JSON-encoded; a grouped manifest adds each row's sample number."""
        import pyarrow as pa

        header = {k: json.dumps(v, ensure_ascii=False) for k, v in self.header().items()}
        table = columns.table(self.entries).select([0, 1, 2])
        if self.groups is not None:
            table = table.append_column(pa.field(SAMPLE_FIELD[0], pa.int64(), nullable=False),
                                        pa.array(self.groups.column(), pa.int64()))
        return table.replace_schema_metadata(header)

    @classmethod
    def marked(cls, meta: Meta) -> bool:
        return meta.get(b"format") == json.dumps(FORMAT).encode()

    @classmethod
    def from_arrow(cls, path: str, reader: RecordBatchFileReader, local_path: str | None, *,
                   verify: bool) -> Manifest:
        import pyarrow as pa

        meta = reader.schema.metadata or {}
        version = header_value(meta, "format_version", path)
        if version != FORMAT_VERSION:
            raise ManifestError(f"manifest {path} has format_version {version!r}; "
                                f"this ucstage reads version {FORMAT_VERSION}")
        grouping = header_value(meta, "grouping", path) if b"grouping" in meta else None
        wanted = ARROW_FIELDS + ((SAMPLE_FIELD,) if grouping is not None else ())
        if tuple((f.name, str(f.type)) for f in reader.schema) != wanted:
            raise ManifestError(f"manifest {path} is malformed: columns {reader.schema.names}")
        expected = str(header_value(meta, "fingerprint", path))
        rows = header_value(meta, "files_count", path)
        table = reader.read_all()  # zero-copy: the columns point into the mapping
        if table.num_rows != rows or any(c.null_count for c in table.columns):
            raise ManifestError(f"manifest {path} fails its header check "
                                f"({table.num_rows} rows, header says {rows})",
                                hint="recreate it from the source")
        groups = None
        if grouping is not None:
            groups = Groups.from_column(numbers(table.column(3)), grouping, path)
            if verify and groups.digest != grouping.get("digest"):
                raise ManifestError(f"manifest {path} fails its grouping check",
                                    hint="recreate it from the source")
        if verify:
            # Through the module, so that a test's stand-in sees every full pass.
            rows_fingerprint = columns.arrow_fingerprint(_batches(local_path, reader))
            matches = combined_fingerprint(rows_fingerprint, groups) == expected
            # The check's buffers are freed; hand their pages back now rather than
            # keep them in the allocator for the life of a long training process.
            pa.default_memory_pool().release_unused()
            if not matches:
                raise fails_fingerprint(path)
        return cls(
            source=str(header_value(meta, "source", path)),
            entries=ArrowEntries(table),
            fingerprint=expected,
            created=str(header_value(meta, "created", path) or ""),
            filters=dict(header_value(meta, "filters", path) or {}),
            path=path,
            groups=groups,
        )


def _batches(local_path: str | None, reader: RecordBatchFileReader) -> Iterator[Any]:
    """The record batches, one at a time, read (not mapped) from a local file:
    verifying a large manifest then leaves none of it resident in this process."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    if local_path is None:
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
        return
    with pa.OSFile(local_path) as raw:
        streamed = ipc.open_file(raw)
        for i in range(streamed.num_record_batches):
            yield streamed.get_batch(i)


def group_manifest(manifest: Manifest, grouping: Grouping) -> tuple[Manifest, Grouped]:
    """``manifest`` grouped: its rows in sample order (incomplete samples left
    out), its :attr:`~ucstage.manifest.Manifest.groups` set and its
    fingerprint covering both; and what :func:`group_paths` found."""
    if manifest.groups is not None:
        raise InvalidArgument("this manifest is already grouped into samples")
    table = columns.table(manifest.entries).select([0, 1, 2])
    found = group_paths(table.column(0), grouping)
    rows_fingerprint = manifest.fingerprint
    if found.order is not None:
        table = table.take(found.order)
        rows_fingerprint = columns.arrow_fingerprint(table.to_batches())
    grouped = dataclasses.replace(
        manifest, entries=ArrowEntries(table), groups=found.groups, path=None,
        fingerprint=combined_fingerprint(rows_fingerprint, found.groups))
    return grouped.with_listing_of(manifest), found
