"""The two on-disk formats of a manifest (docs/manifest.md): a columnar Arrow
IPC file (``*.manifest.arrow``), which every process opens memory-mapped so
that a node holds one copy of the listing in its page cache, and JSON, for
people and scripts.

Each format is written from and read into a :class:`~ucstage.manifest.model.Manifest`
here; which file, where, and which format is :mod:`ucstage.manifest.files`.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Iterator
from typing import Any

from ..errors import ManifestError
from ..volumes.entry import FileEntry
from ..volumes.location import is_mapped
from . import columns
from .columns import ARROW_FIELDS, BATCH_ROWS, ArrowEntries
from .groups import Groups, combined_fingerprint
from .model import FORMAT, FORMAT_VERSION, Manifest, fingerprint

__all__ = ["ARROW_MAGIC", "ARROW_SUFFIX", "MANIFEST_SUFFIX", "arrow_bytes", "arrow_marked",
           "json_bytes", "json_text", "not_a_manifest", "parse_json", "read_arrow"]

ARROW_MAGIC = b"ARROW1"
SAMPLE_FIELD = ("sample", "int64")
"""The fourth column of a grouped manifest (docs/manifest.md)."""
MANIFEST_SUFFIX = ".manifest.json"
ARROW_SUFFIX = ".manifest.arrow"

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

def arrow_bytes(manifest: Manifest) -> Any:
    """The columnar manifest file's bytes (a pyarrow Buffer); the header
    fields are the schema's metadata, JSON-encoded."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    header = {k: json.dumps(v, ensure_ascii=False) for k, v in manifest.header().items()}
    table = columns.table(manifest.entries).select([0, 1, 2])
    if manifest.groups is not None:  # a grouped manifest: each row's sample number
        table = table.append_column(pa.field(SAMPLE_FIELD[0], pa.int64(), nullable=False),
                                    pa.array(manifest.groups.column(), pa.int64()))
    table = table.replace_schema_metadata(header)
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=BATCH_ROWS)
    return sink.getvalue()


def arrow_marked(path: str) -> bool:
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


def _header_value(meta: dict[bytes, bytes], key: str, path: str) -> Any:
    try:
        return json.loads(meta[key.encode()])
    except (KeyError, ValueError) as exc:
        raise ManifestError(f"manifest {path} is malformed: no valid {key!r} in its header") from exc


def read_arrow(path: str, fh: Any, local_path: str | None, *, verify: bool) -> Manifest:
    """Read the columnar manifest ``path`` (its name in messages) from ``fh``,
    or memory-mapped from ``local_path`` when it is a local file."""
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
    meta = reader.schema.metadata or {}
    if meta.get(b"format") != json.dumps(FORMAT).encode():
        raise not_a_manifest(path, "an Arrow file without the ucstage.manifest header")
    version = _header_value(meta, "format_version", path)
    if version != FORMAT_VERSION:
        raise ManifestError(f"manifest {path} has format_version {version!r}; "
                            f"this ucstage reads version {FORMAT_VERSION}")
    grouping = _header_value(meta, "grouping", path) if b"grouping" in meta else None
    wanted = ARROW_FIELDS + ((SAMPLE_FIELD,) if grouping is not None else ())
    if tuple((f.name, str(f.type)) for f in reader.schema) != wanted:
        raise ManifestError(f"manifest {path} is malformed: columns {reader.schema.names}")
    expected = str(_header_value(meta, "fingerprint", path))
    rows = _header_value(meta, "files_count", path)
    table = reader.read_all()  # zero-copy: the columns point into the mapping
    if table.num_rows != rows or any(c.null_count for c in table.columns):
        raise ManifestError(f"manifest {path} fails its header check "
                            f"({table.num_rows} rows, header says {rows})",
                            hint="recreate it from the source")
    groups = None
    if grouping is not None:
        groups = Groups.from_column(_int_column(table.column(3)), grouping, path)
        if verify and groups.digest != grouping.get("digest"):
            raise ManifestError(f"manifest {path} fails its grouping check",
                                hint="recreate it from the source")
    if verify:
        rows = columns.arrow_fingerprint(_batches(local_path, reader))
        matches = combined_fingerprint(rows, groups) == expected
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
        groups=groups,
    )


def _int_column(column: Any) -> Any:
    """An int64 Arrow column as one numpy array (from its buffers)."""
    import numpy as np

    chunks = [np.frombuffer(c.buffers()[1], dtype=np.int64)[c.offset:c.offset + len(c)]
              for c in column.chunks if len(c)]
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)


def _batches(local_path: str | None, reader: Any) -> Iterator[Any]:
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


def parse_json(path: str, raw: bytes) -> Manifest:
    """The JSON manifest ``path`` (its name in messages) from its bytes, checked."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise not_a_manifest(path, f"not valid JSON: {exc}") from exc
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


