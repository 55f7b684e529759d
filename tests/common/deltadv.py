"""Delta tables with deletion vectors, written by the Delta protocol's byte
layout (deltalake 1.x writes the feature, never the vectors): Parquet files
by pyarrow, the log's JSON actions, deletion-vector files (version byte,
then per vector its big-endian size, the RoaringBitmapArray, its big-endian
CRC-32) and inline vectors in Z85. The encoder here is the tests' own, so
ucstage's decoder is checked against an independent reader (delta-kernel),
never against itself; benchmarks/tables.py (``delta_dv``) writes its
vectors with it too."""

from __future__ import annotations

import json
import os
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
MAGIC = 1681511377
PROTOCOL = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                         "readerFeatures": ["deletionVectors"],
                         "writerFeatures": ["deletionVectors"]}}
"""The protocol action a table with deletion vectors commits."""
SCHEMA = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "s", "type": "string", "nullable": True, "metadata": {}}]}


def z85(data: bytes) -> str:
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        digits = []
        for _ in range(5):
            v, d = divmod(v, 85)
            digits.append(_Z85[d])
        out.append("".join(reversed(digits)))
    return "".join(out)


def bitmap(rows: list[int]) -> bytes:
    """A RoaringBitmapArray: the magic, little-endian, then the 64-bit portable format."""
    return struct.pack("<I", MAGIC) + BitMap64(rows).serialize()


def frame(blocks: list[bytes]) -> tuple[bytes, list[int]]:
    """A deletion-vector file holding ``blocks`` (bitmaps): the version byte, then
    each block between its big-endian size and its big-endian CRC-32; and
    each block's offset in the file (a descriptor's ``offset``)."""
    framed, offsets = b"\x01", list[int]()
    for block in blocks:
        offsets.append(len(framed))
        framed += struct.pack(">I", len(block)) + block + struct.pack(">I", zlib.crc32(block))
    return framed, offsets


@dataclass
class DvTable:
    """A table being written: call :meth:`file` per data file, then :meth:`commit`."""

    root: str
    actions: list[dict[str, Any]] = field(default_factory=list)
    version: int = 0
    ids: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        os.makedirs(os.path.join(self.root, "_delta_log"), exist_ok=True)
        self.actions += [
            PROTOCOL,
            {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet",
                                                              "options": {}},
                          "schemaString": json.dumps(SCHEMA), "partitionColumns": [],
                          "configuration": {"delta.enableDeletionVectors": "true"},
                          "createdTime": 0}}]

    def data(self, name: str, start: int, n: int, row_group_rows: int) -> None:
        """Data file ``name``: ids ``start .. start + n - 1``."""
        ids = list(range(start, start + n))
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                                 "s": [f"r{i}" for i in ids]}),
                       os.path.join(self.root, name), row_group_size=row_group_rows)
        self.ids[name] = ids

    def vector(self, rows: list[int], storage: str, *, prefix: str = "",
               where: str | None = None, before: list[int] | None = None) -> dict[str, Any]:
        """A descriptor deleting ``rows``: inline (``i``), in a UUID-named file
        (``u``, under ``prefix``) or at an absolute path (``p``: in folder
        ``where``). ``before``: a vector written first in the same file, so
        this one sits past offset 1."""
        data = bitmap(rows)
        desc: dict[str, Any] = {"storageType": storage, "sizeInBytes": len(data),
                                "cardinality": len(rows)}
        if storage == "i":
            return {**desc, "pathOrInlineDv": z85(data)}
        framed, offsets = frame(([bitmap(before)] if before else []) + [data])
        u = uuid.uuid4()
        folder = os.path.join(self.root, prefix) if storage == "u" else str(where)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"deletion_vector_{u}.bin")
        with open(path, "wb") as f:
            f.write(framed)
        text = prefix + z85(u.bytes) if storage == "u" else "file://" + path
        return {**desc, "pathOrInlineDv": text, "offset": offsets[-1]}

    def add(self, name: str, vector: dict[str, Any] | None) -> None:
        add = {"path": name, "partitionValues": {},
               "size": os.path.getsize(os.path.join(self.root, name)), "modificationTime": 0,
               "dataChange": True, "stats": json.dumps({"numRecords": len(self.ids[name])})}
        if vector is not None:
            add["deletionVector"] = vector
        self.actions.append({"add": add})

    def remove(self, name: str, vector: dict[str, Any] | None) -> None:
        remove: dict[str, Any] = {"path": name, "deletionTimestamp": 0, "dataChange": True}
        if vector is not None:
            remove["deletionVector"] = vector
        self.actions.append({"remove": remove})

    def commit(self) -> None:
        path = os.path.join(self.root, "_delta_log", f"{self.version:020d}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(json.dumps(a) + "\n" for a in self.actions))
        self.actions, self.version = [], self.version + 1


def recheckpoint(log: Path, version: int, kind: str) -> None:
    """deltalake's classic checkpoint at ``version`` rewritten as ``kind``:
    two parts (multi-part), or a v2 checkpoint (a UUID-named JSON top file
    whose adds are in a sidecar under ``_sidecars``)."""
    import pyarrow.compute as pc

    classic = log / f"{version:020d}.checkpoint.parquet"
    cp = pq.read_table(classic)
    os.remove(classic)
    os.remove(log / "_last_checkpoint")  # a hint only; readers list the folder
    if kind == "multi-part":
        half = cp.num_rows // 2
        pq.write_table(cp.slice(0, half), log / f"{version:020d}.checkpoint.{1:010d}.{2:010d}.parquet")
        pq.write_table(cp.slice(half), log / f"{version:020d}.checkpoint.{2:010d}.{2:010d}.parquet")
        return
    (log / "_sidecars").mkdir()
    side = f"{uuid.uuid4()}.parquet"
    pq.write_table(cp.filter(pc.is_valid(cp.column("add"))).select(["add"]),
                   log / "_sidecars" / side)
    rows = cp.to_pylist()
    protocol = {k: v for k, v in next(r["protocol"] for r in rows if r["protocol"]).items()
                if v is not None}
    protocol["readerFeatures"] = protocol["writerFeatures"] = ["deletionVectors",
                                                               "v2Checkpoint"]
    meta = {k: v for k, v in next(r["metaData"] for r in rows if r["metaData"]).items()
            if v is not None}
    meta["format"]["options"] = dict(meta["format"]["options"] or [])
    meta["configuration"] = dict(meta["configuration"] or [])
    actions = [{"checkpointMetadata": {"version": version}}, {"protocol": protocol},
               {"metaData": meta},
               {"sidecar": {"path": side, "modificationTime": 0,
                            "sizeInBytes": os.path.getsize(log / "_sidecars" / side)}}]
    (log / f"{version:020d}.checkpoint.{uuid.uuid4()}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))


def kernel_rows(root: str) -> list[dict[str, Any]]:
    """Every live row as delta-kernel (delta-kernel-rust-sharing-wrapper) reads it."""
    import delta_kernel_rust_sharing_wrapper as kernel

    url = "file://" + os.path.abspath(root).rstrip("/") + "/"
    iface = kernel.PythonInterface(url)
    snapshot = kernel.Table(url).snapshot(iface)
    reader = kernel.ScanBuilder(snapshot).build().execute(iface)
    return pa.Table.from_batches(list(reader)).to_pylist()
