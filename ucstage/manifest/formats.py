"""The two on-disk formats of a frozen listing (docs/manifest.md): an Arrow
IPC file, which every process opens memory-mapped so that a node holds one
copy of the listing in its page cache, and JSON (files only), for people and
scripts.

Either kind of :class:`~ucstage.manifest.model.Frozen` listing is written to
and read from an Arrow file here, each kind told by its header's marker;
which file, where, and which format is :mod:`ucstage.manifest.files`.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any, TypeVar, cast

from ..errors import NESTED_TOO_DEEP, ManifestError
from ..volumes.entry import FileEntry
from ..volumes.location import is_mapped
from .model import FORMAT, FORMAT_VERSION, Frozen, Manifest, fails_fingerprint, fingerprint
from .rowgroups import RowGroupManifest
from .shardsamples import ShardManifest

__all__ = ["ARROW_MAGIC", "ARROW_SUFFIX", "KINDS", "MANIFEST_SUFFIX", "arrow_bytes", "arrow_kind",
           "json_bytes", "json_text", "not_a_manifest", "parse_json", "read_arrow"]

ARROW_MAGIC = b"ARROW1"
MANIFEST_SUFFIX = ".manifest.json"
ARROW_SUFFIX = Manifest.suffix
KINDS: tuple[type[Frozen], ...] = (Manifest, RowGroupManifest, ShardManifest)
"""The kinds of frozen listing an Arrow file may hold, told apart by their header."""
K = TypeVar("K", bound=Frozen)

# How much of each end of a file is searched for the format marker before a
# ``.json`` file is parsed: a manifest written by ucstage starts with it, one
# re-serialised with sorted keys ends near it, and a large JSON data file is
# then refused without being parsed whole.
_SNIFF = 64 * 1024


def not_a_manifest(path: str, why: str) -> ManifestError:
    """The error for a SOURCE or manifest file that is not a ucstage manifest."""
    split = posixpath.split if is_mapped(path) else os.path.split
    folder, name = split(path if is_mapped(path) else os.path.abspath(path))
    if name.endswith(MANIFEST_SUFFIX):
        hint = "recreate it with `ucstage cache lazy SOURCE` or manifest.save()"
    else:
        hint = ("a .json SOURCE is read as a manifest (`ucstage cache lazy` writes one); to "
                f"stage a JSON data file, give its folder {folder} with `include` {name}")
    return ManifestError(f"{path} is not a ucstage manifest ({why})", hint=hint)


# -- Arrow IPC ----------------------------------------------------------------

def arrow_bytes(listing: Frozen) -> Any:
    """The Arrow file's bytes (a pyarrow Buffer) of either kind of listing."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    table = listing.arrow_table()
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=listing.batch_rows)
    return sink.getvalue()


def arrow_kind(path: str) -> type[Frozen] | None:
    """The kind of listing the local Arrow file ``path`` holds, by its
    header's marker (reads its footer and schema only); None for another file."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        with pa.memory_map(path) as mm:
            meta = ipc.open_file(mm).schema.metadata or {}
    except (OSError, pa.ArrowException):
        return None
    return next((kind for kind in KINDS if kind.marked(meta)), None)


def read_arrow(path: str, fh: Any, local_path: str | None, kind: type[K], *,
               verify: bool) -> K:
    """Read the Arrow listing of ``kind`` at ``path`` (its name in messages)
    from ``fh``, or memory-mapped from ``local_path`` when it is a local file."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    try:
        source: Any = (pa.memory_map(local_path) if local_path is not None
                       else pa.BufferReader(fh.read()))
        reader = ipc.open_file(source)
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"manifest {path} is not a readable Arrow file: {exc}",
                            hint="recreate it with `ucstage cache lazy SOURCE` or manifest.save()"
                            ) from exc
    if not kind.marked(reader.schema.metadata or {}):
        raise not_a_manifest(path, f"an Arrow file without the {kind.marker} header")
    return cast(K, kind.from_arrow(path, reader, local_path, verify=verify))


# -- JSON ---------------------------------------------------------------------

def json_text(manifest: Manifest) -> str:
    """The JSON manifest file's text."""
    if manifest.groups is not None:
        raise ManifestError("a manifest grouped into samples is saved in the Arrow format only",
                            hint=f"give it a name ending in {ARROW_SUFFIX}")
    # One dumps() + write is several times faster than dump()'s many small writes.
    return json.dumps(manifest.to_json(), ensure_ascii=False, separators=(",", ":"))


def json_bytes(fh: Any) -> bytes | None:
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


_BULK_BYTES = 16 * 2**20
"""A JSON manifest this large (about 300,000 files: a million take 52 MB) is decoded with the
collector paused (:func:`_collector_paused`); a smaller one gains nothing."""


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk decode, then one full
    collection. A JSON manifest of a million files is millions of strings,
    ints and lists, none in a cycle, yet every few hundred allocations start
    a collection, and the older generations' ones walk everything alive (the
    process's own listing too). The one collection at the end settles what
    the pause deferred, so the caller's next step does not pay it. Measured
    on a million entries beside a live million-entry listing: 2.3-2.5 s of
    CPU to load and check with the collector on, 1.3-1.7 s paused then
    collected (1.2 s paused alone, but 0.4 s more left to the next step)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
            gc.collect()


def parse_json(path: str, raw: bytes) -> Manifest:
    """The JSON manifest ``path`` (its name in messages) from its bytes, checked."""
    with _collector_paused() if len(raw) >= _BULK_BYTES else contextlib.nullcontext():
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise not_a_manifest(path, f"not valid JSON: {exc}") from exc
        except RecursionError as exc:  # json's decoder recurses once per level
            raise not_a_manifest(path, NESTED_TOO_DEEP) from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise not_a_manifest(path, f'no "format": "{FORMAT}"')
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
        if fingerprint(entries) != expected:
            raise fails_fingerprint(path)
        return Manifest(
            source=source,
            entries=entries,
            fingerprint=expected,
            created=str(data.get("created", "")),
            filters=dict(data.get("filters") or {}),
            path=path,
        )


