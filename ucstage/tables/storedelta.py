"""Delta tables on object stores (``s3://``, ``gs://``, ``az://``,
``abfss://``...): the log read by deltalake with the engines' settings, the
files read through the engines and the cache like a Parquet folder's.

* deltalake opens the table at its URL with ``storage_options`` derived from
  the same environment the engines read (:func:`ucstage.engines.objstore.delta_location`).
* The table's folder is listed once, after deltalake read the version (so
  every file of that version is in the listing), through the engine: each
  file carries the change marker (ETag, generation) and checksum the cache
  stamps and checks its copies with. The log's own files read here (commits
  and checkpoints, for the deletion vectors deltalake does not give) are read
  from that listing, each pinned to its listed version.
* Every path the log names is confined to the table's prefix
  (:class:`ucstage.tables.logpaths.StoreFolder`) before anything is read.
* Deletion-vector files are fetched through the cache (its cap, checksums,
  hedging) at freeze and inlined into the manifest
  (:func:`ucstage.tables.deletion.inlined`): readers never fetch them again.

Store reads run as the engine keeps this process clean
(:meth:`ucstage.engines.engine.Engine.keep_clean`), so DataLoader workers
forked later still read through obstore.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

from ..engines import engine, objstore
from ..engines.engine import read_ranges
from ..errors import MissingDataFiles, UnsupportedTable
from ..manifest.arrays import native_copy
from ..volumes import FileEntry, Volume, list_files
from ..volumes.listing import Listing
from ..volumes.location import Fetch
from . import deletion
from .logpaths import StoreFolder, shown

__all__ = ["StoreLog", "has_log", "inline_vectors"]

LOG = "_delta_log"


def has_log(volume: Volume) -> bool:
    """Whether the folder of ``volume`` (on an object store) holds a
    ``_delta_log`` (one request or two; no listing of the table)."""
    if volume.is_local or volume.file:
        return False
    try:
        info = volume.fs.info(volume.full_path(LOG))
    except FileNotFoundError:
        return False
    return info.get("type") == "directory"


class StoreLog:
    """A Delta table on an object store as :func:`ucstage.tables.delta.table_state`
    reads it (a ``StoreTable``): deltalake's URL and options, the table's
    folder, and its ``_delta_log`` read from the table's listing.

    Raises (building it):
        UnsupportedTable: a store deltalake is not given settings for here
            (an fsspec URL other than s3, gs and az).
    """

    def __init__(self, volume: Volume, label: str) -> None:
        self.volume = volume
        self.label = label
        try:
            self.url, self.options = objstore.delta_location(volume)
        except KeyError:
            raise UnsupportedTable(
                f"table {label}: Delta tables are read from local or mounted folders and "
                f"from s3://, gs:// and az:// (abfss://...), not {shown(volume.url)}",
                hint="copy the table to one of those") from None
        self.folder = StoreFolder(volume.url, label)
        self._listing: Listing | None = None
        self._listed: dict[str, FileEntry] = {}

    @property
    def listing(self) -> Listing:
        """Every file of the table's folder (``_delta_log`` too), listed once."""
        if self._listing is None:
            self._listing = list_files(self.volume, include_hidden=True)
            self._listed = {e.path: e for e in self._listing.entries}
        return self._listing

    def entry(self, rel: str) -> FileEntry | None:
        """The listed entry of the table's file at ``rel``, or None."""
        self.listing  # noqa: B018  (lists on first use)
        return self._listed.get(rel)

    def names(self) -> list[str]:
        start = LOG + "/"
        return [e.path[len(start):] for e in self.listing.entries
                if e.path.startswith(start) and "/" not in e.path[len(start):]]

    def path(self, name: str) -> str:
        return f"{self.folder.root}/{LOG}/{name}"

    def read(self, path: str) -> bytes:
        rel = self.folder.relative(path)
        found = self.entry(rel)
        if found is None:
            raise FileNotFoundError(2, "not in the table's listing", path)
        if not found.size:
            return b""
        (data,), _ = read_ranges(self.volume, rel, [(0, found.size)], version=found.version)
        return bytes(data)

    def parquet(self, path: str) -> Any:
        import pyarrow as pa

        return pa.BufferReader(native_copy(self.read(path)))  # see arrays.native

    def keep_clean(self, fn: Any, *args: Any) -> Any:
        return engine.of(self.volume).keep_clean(fn, *args)


def _fetch(fetch: Fetch, volume: Volume, entries: list[FileEntry]) -> list[str]:
    return [fetch(volume, e) for e in entries]


def inline_vectors(store: StoreLog, files: list[str], vectors: list[dict[str, Any] | None],
                   fetch: Fetch | None) -> list[dict[str, Any] | None]:
    """``vectors`` (each data file's, ``files`` their paths in the table) with
    every file-stored vector inlined: its file fetched by ``fetch`` (a
    dataset's cache) or, without one, read straight from the store into a
    temporary file, and checked (:func:`ucstage.tables.deletion.inlined`:
    each vector carries its own CRC-32, so either way a flipped byte is caught).

    Raises:
        MissingDataFiles: a vector's file is not in the table's listing.
        UnreadableDeltaLog: a vector's file does not match its descriptor.
        FetchFailed, CacheFull: ``fetch`` (the cache) could not copy it.
    """
    stored = [i for i, v in enumerate(vectors) if v is not None and "file" in v]
    if not stored:
        return vectors
    wanted: dict[str, FileEntry] = {}
    for i in stored:
        url = vectors[i]["file"]  # type: ignore[index]
        found = store.entry(store.folder.relative(url))
        if found is None:
            raise MissingDataFiles(f"the deletion vector of {files[i]} is missing: {shown(url)}",
                                   hint="the table was vacuumed or copied incompletely")
        wanted[found.path] = found
    entries = sorted(wanted.values())
    with tempfile.TemporaryDirectory(prefix="ucstage-dv-") as scratch:
        if fetch is None:
            fetch = functools.partial(_read_to, scratch)
        local = dict(zip((e.path for e in entries),
                         store.keep_clean(_fetch, fetch, store.volume, entries), strict=True))
        out = list(vectors)
        for i in stored:
            v = vectors[i]
            assert v is not None
            out[i] = deletion.inlined(v, local[store.folder.relative(v["file"])], files[i])
    return out


def _read_to(scratch: str, volume: Volume, entry: FileEntry) -> str:
    """``entry`` read from the store into ``scratch`` (no cache was given),
    the read conditional on the listed version."""
    path = os.path.join(scratch, f"{len(os.listdir(scratch))}.bin")
    (data,), _ = read_ranges(volume, entry.path, [(0, entry.size)], version=entry.version) \
        if entry.size else ((b"",), None)
    with open(path, "wb") as fh:
        fh.write(data)
    return path
