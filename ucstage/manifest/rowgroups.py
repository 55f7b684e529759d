"""The row-group manifest: a table's row groups frozen, columnar, with a
fingerprint; the second kind of :class:`~ucstage.manifest.model.Frozen`
listing, saved and loaded as the first (:mod:`ucstage.manifest.files`).

One row per row group, in file order then row-group order: its file, its
index in the file, its rows and the byte range of each column chunk. The
header names the source, its kind, the Delta version, the files (path, size,
change marker, partition values), each file's leaf columns and the schema
batches are read as; each file's footer is kept (on the file's first row
group) so a reader parses no footer from the source again. Format:
docs/manifest.md, "Row-group manifests".
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import InvalidArgument, UnknownColumn
from ..volumes.entry import FileEntry
from ..volumes.location import Volume, resolved
from .arrays import binary, int_array, numbers, read_marked
from .model import Frozen, fails_fingerprint

if TYPE_CHECKING:
    from pyarrow.ipc import RecordBatchFileReader

__all__ = ["FORMAT", "SUFFIX", "RowGroupManifest", "is_row_group_manifest"]

FORMAT = "ucstage-rowgroups/1"
SUFFIX = ".rowgroups.arrow"
_KEY = b"ucstage-rowgroups"


@dataclass(frozen=True, eq=False)
class RowGroupManifest(Frozen):
    """A table's row groups, frozen (see the module docstring).

    Arrays are numpy, one value per row group (``file``, ``index``,
    ``rows``) or per column chunk (``chunk_*``; row group ``i``'s chunks are
    ``chunk_start[i]:chunk_start[i + 1]``).
    """

    source: str
    kind: str
    table_version: int | None
    volume_url: str
    files: list[FileEntry]
    partition_values: list[dict[str, Any]]
    leaves: list[list[str]]
    schema: Any
    """The ``pyarrow.Schema`` every batch is read as."""
    file: Any
    index: Any
    rows_per_group: Any
    chunk_start: Any
    chunk_column: Any
    chunk_offset: Any
    chunk_length: Any
    footers: dict[int, bytes]
    """Each file's serialised footer, by file number (files with row groups)."""
    fingerprint: str = ""
    path: str | None = field(default=None, compare=False)
    deletion_vectors: list[dict[str, Any] | None] = field(default_factory=list)
    """Per file, its Delta deletion vector's descriptor (``tables/deletion.py``) or
    None; ``rows_per_group`` then counts live rows. Empty: no file has one."""
    refused: Sequence[tuple[str, str]] = ()
    """(path, reason) of entries a fresh listing of the folder refused (a link
    out of it...), for the warnings; not stored (as ``Manifest.refused``)."""
    filter: dict[str, Any] | None = None
    """The row filter the listing was made with (``tables/filters.py``:
    ``text``, ``columns``, ``expression``) and what it pruned (``pruned``:
    files, row groups and bytes, each ``[kept, total]``), or None. With a
    filter, only row groups holding a matching row are listed, and
    ``rows_per_group`` counts their matching rows."""
    formats: ClassVar[tuple[str, ...]] = ("arrow",)
    suffix: ClassVar[str] = SUFFIX
    marker: ClassVar[str] = _KEY.decode()

    # -- what shard-plan and the dataset count ------------------------------

    @property
    def row_groups(self) -> int:
        return len(self.rows_per_group)

    def __len__(self) -> int:
        """Row groups (what the slot rule deals)."""
        return self.row_groups

    def sizes(self) -> Any:
        """Bytes per row group, every column (what the loader's window check sizes)."""
        return self.group_bytes()

    @property
    def entries(self) -> list[FileEntry]:
        """One entry per row group, named ``<file>#row-group-<index>`` (for messages)."""
        sizes = self.sizes()
        return [FileEntry(f"{self.files[int(f)].path}#row-group-{int(i)}", int(n),
                          self.files[int(f)].version)
                for f, i, n in zip(self.file, self.index, sizes, strict=True)]

    @property
    def rows(self) -> int:
        return int(self.rows_per_group.sum())

    @property
    def bytes(self) -> int:
        """Compressed bytes of every column chunk (the data the row groups hold)."""
        return int(self.chunk_length.sum())

    @property
    def columns(self) -> list[str]:
        return list(self.schema.names)

    @property
    def filter_columns(self) -> list[str]:
        """The columns the listing's row filter reads (none without one)."""
        return list(self.filter["columns"]) if self.filter else []

    def fetched_columns(self, columns: Sequence[str] | None) -> list[str] | None:
        """What a reader of ``columns`` (None: all) fetches: those and the
        filter's columns, which every row is tested on."""
        if columns is None:
            return None
        return [*columns, *(c for c in self.filter_columns if c not in columns)]

    def check_columns(self, columns: Sequence[str] | None) -> list[str]:
        """``columns`` checked against the schema (None: every column).

        Raises:
            UnknownColumn: naming the columns that are not there.
            InvalidArgument: a column listed twice.
        """
        if columns is None:
            return self.columns
        if isinstance(columns, str):
            columns = [columns]
        twice = sorted({c for c in columns if list(columns).count(c) > 1})
        if twice:
            raise InvalidArgument(f"columns names {', '.join(map(repr, twice))} twice",
                                  hint="list each column once")
        missing = [c for c in columns if c not in self.schema.names]
        if missing:
            raise UnknownColumn(f"{self.source} has no column{'s' if len(missing) > 1 else ''} "
                                f"{', '.join(map(repr, missing))}",
                                hint=f"its columns: {', '.join(self.schema.names)}")
        return list(columns)

    def group_bytes(self, columns: Sequence[str] | None = None) -> Any:
        """Bytes each row group's chunks of ``columns`` take (int64 array)."""
        import numpy as np

        keep = self._chunk_mask(columns)
        lengths = np.where(keep, self.chunk_length, 0)
        sums = np.add.reduceat(lengths, self.chunk_start[:-1]) if len(lengths) else \
            np.zeros(self.row_groups, dtype=np.int64)
        # reduceat gives the next chunk's value for an empty range: no chunks, no bytes
        empty = self.chunk_start[:-1] == self.chunk_start[1:]
        return np.where(empty, 0, sums).astype(np.int64)

    def ranges(self, group: int, columns: Sequence[str] | None = None) -> list[tuple[int, int]]:
        """(offset, length) in its file of each chunk of ``columns`` of row group ``group``."""
        lo, hi = int(self.chunk_start[group]), int(self.chunk_start[group + 1])
        keep = self._chunk_mask(columns)[lo:hi]
        return [(int(o), int(n)) for o, n, k in
                zip(self.chunk_offset[lo:hi], self.chunk_length[lo:hi], keep, strict=True) if k]

    def file_columns(self, file: int, columns: Sequence[str] | None) -> list[str]:
        """The top-level ``columns`` that file ``file`` holds (in its own order)."""
        present = list(dict.fromkeys(leaf.split(".")[0] for leaf in self.leaves[file]))
        return present if columns is None else [c for c in present if c in set(columns)]

    @functools.cached_property
    def _leaf_tops(self) -> list[Any]:
        import numpy as np

        return [np.array([leaf.split(".")[0] for leaf in names], dtype=object)
                for names in self.leaves]

    def _chunk_mask(self, columns: Sequence[str] | None) -> Any:
        import numpy as np

        if columns is None:
            return np.ones(len(self.chunk_length), dtype=bool)
        return _masks(self, tuple(columns))

    def metadata(self, file: int) -> Any:
        """File ``file``'s parsed ``FileMetaData`` (from the kept footer)."""
        return _parsed(self, file)

    def volume(self) -> Volume:
        return resolved(self.volume_url)

    def __reduce__(self) -> tuple[Any, ...]:
        # The schema travels in its IPC form: pickling a pyarrow schema renames
        # a fixed-size list's child field (element -> item), which would
        # change the fingerprint on the receiving rank.
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["schema"] = self.schema.serialize().to_pybytes()
        return (_rebuild, (values,))

    # -- the file -------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The header its file stores (docs/manifest.md), the fingerprint last."""
        return {
            "format": FORMAT,
            "source": self.source,
            "kind": self.kind,
            "table_version": self.table_version,
            "volume": self.volume_url,
            "files": [{"path": e.path, "size": e.size, "version": e.version,
                       "partition": _jsonable(p),
                       **({"deletion_vector": dv} if dv is not None else {})}
                      for e, p, dv in zip(self.files, self.partition_values,
                                          self.deletion_vectors or [None] * len(self.files),
                                          strict=True)],
            "leaves": self.leaves,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            **({"filter": self.filter} if self.filter else {}),
            "fingerprint": self.fingerprint,
        }

    def compute_fingerprint(self) -> str:
        described = {k: v for k, v in self.header().items() if k != "fingerprint"}
        h = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
        for arr in (self.file, self.index, self.rows_per_group, self.chunk_start,
                    self.chunk_column, self.chunk_offset, self.chunk_length):
            h.update(arr.astype("<i8").tobytes())
        for k in sorted(self.footers):
            h.update(k.to_bytes(8, "little") + hashlib.sha256(self.footers[k]).digest())
        return h.hexdigest()

    def arrow_table(self) -> Any:
        """One row per row group; the header is one JSON value under ``_KEY``."""
        import pyarrow as pa

        offsets = int_array(self.chunk_start, pa.int32())
        footer = [self.footers.get(int(f)) if i == 0 else None
                  for f, i in zip(self.file, self.index, strict=True)]
        table = pa.table({
            "file": int_array(self.file, pa.int32()),
            "row_group": int_array(self.index, pa.int32()),
            "rows": int_array(self.rows_per_group, pa.int64()),
            "chunk_column": pa.ListArray.from_arrays(offsets, int_array(self.chunk_column,
                                                                    pa.int32())),
            "chunk_offset": pa.ListArray.from_arrays(offsets, int_array(self.chunk_offset,
                                                                    pa.int64())),
            "chunk_length": pa.ListArray.from_arrays(offsets, int_array(self.chunk_length,
                                                                    pa.int64())),
            "footer": binary(footer),
        })
        return self.with_header(table)

    @classmethod
    def from_arrow(cls, path: str, reader: RecordBatchFileReader, local_path: str | None, *,
                   verify: bool) -> RowGroupManifest:
        import numpy as np
        import pyarrow as pa

        table, meta = read_marked(path, reader, _KEY, FORMAT)

        def flat(name: str) -> Any:
            return numbers(table.column(name).combine_chunks().values)

        lists = table.column("chunk_length").combine_chunks()
        files = meta["files"]
        footers = {int(f): bytes(b) for f, b in zip(table.column("file").to_pylist(),
                                                    table.column("footer").to_pylist(),
                                                    strict=True) if b is not None}
        manifest = cls(
            source=meta["source"], kind=meta["kind"], table_version=meta["table_version"],
            volume_url=meta["volume"],
            files=[FileEntry(f["path"], int(f["size"]), str(f["version"])) for f in files],
            partition_values=[dict(f["partition"]) for f in files],
            leaves=[list(x) for x in meta["leaves"]],
            schema=pa.ipc.read_schema(pa.py_buffer(base64.b64decode(meta["schema"]))),
            file=numbers(table.column("file")).astype(np.int32),
            index=numbers(table.column("row_group")).astype(np.int32),
            rows_per_group=numbers(table.column("rows")).astype(np.int64),
            chunk_start=numbers(lists.offsets).astype(np.int64),
            chunk_column=flat("chunk_column").astype(np.int32),
            chunk_offset=flat("chunk_offset").astype(np.int64),
            chunk_length=flat("chunk_length").astype(np.int64),
            footers=footers, fingerprint=str(meta["fingerprint"]), path=path,
            deletion_vectors=[f.get("deletion_vector") for f in files]
            if any("deletion_vector" in f for f in files) else [],
            filter=meta.get("filter"))
        if verify and not manifest.intact():
            raise fails_fingerprint(path)
        return manifest


def _rebuild(values: dict[str, Any]) -> RowGroupManifest:
    import pyarrow as pa

    values = dict(values, schema=pa.ipc.read_schema(pa.py_buffer(values["schema"])))
    return RowGroupManifest(**values)


def is_row_group_manifest(path: str) -> bool:
    return path.endswith(SUFFIX)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if v is None or isinstance(v, (str, int, float, bool)) else str(v))
            for k, v in values.items()}


_PARSED: dict[tuple[int, int], Any] = {}


def _parsed(manifest: RowGroupManifest, file: int) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = (id(manifest), file)
    found = _PARSED.get(key)
    if found is None or found[0] is not manifest:
        if len(_PARSED) > 4096:
            _PARSED.clear()
        found = (manifest, pq.read_metadata(pa.BufferReader(manifest.footers[file])))
        _PARSED[key] = found
    return found[1]


_MASKS: dict[tuple[int, tuple[str, ...]], Any] = {}


def _masks(manifest: RowGroupManifest, columns: tuple[str, ...]) -> Any:
    import numpy as np

    key = (id(manifest), columns)
    found = _MASKS.get(key)
    if found is None or found[0] is not manifest:
        wanted = set(columns)
        per_file = [np.array([t in wanted for t in tops], dtype=bool)
                    for tops in manifest._leaf_tops]
        mask = np.zeros(len(manifest.chunk_length), dtype=bool)
        for g in range(manifest.row_groups):
            lo, hi = int(manifest.chunk_start[g]), int(manifest.chunk_start[g + 1])
            cols = manifest.chunk_column[lo:hi]
            mask[lo:hi] = per_file[int(manifest.file[g])][cols]
        if len(_MASKS) > 256:
            _MASKS.clear()
        found = (manifest, mask)
        _MASKS[key] = found
    return found[1]
