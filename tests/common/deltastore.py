"""A Delta table with every feature TableDataset honours, built in a local
folder, then uploaded as a whole to an object store (moto, fake-gcs-server,
Azurite) the way a table written there by another engine sits:

* written by deltalake: column mapping (``name``), partitioned by ``p`` (an int),
  8-row row groups, in two commits;
* a commit by the protocol (deltalake writes the feature, never the
  vectors: tests/common/deltadv.py) that deletes rows of three files with
  deletion vectors of each storage kind: inline, UUID-relative under a folder
  prefix (``q1/``), and by absolute URL (``p``: the table's own URL on the
  store, under ``abs/``);
* a classic checkpoint of that version (deltalake's), then one more
  deltalake commit after it, so the vectors come from the checkpoint.

The reference rows are delta-kernel's, read from the local folder the
upload copies (:func:`tests.common.deltadv.kernel_rows`).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tests.common.deltadv import bitmap, frame, z85

__all__ = ["StoreTable", "build", "upload"]

ROWS = 100


@dataclass
class StoreTable:
    local: str
    """The folder the table was built in (uploaded whole)."""
    url: str
    """Where it lives on the store."""
    vectors: dict[str, str]
    """Storage kind -> the data file (relative) whose rows that vector deletes."""


def _rows(start: int, n: int) -> pa.Table:
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "p": pa.array([i % 2 for i in ids], pa.int32()),
                     "st": pa.array([{"u": i, "w": f"w{i}"} for i in ids])})


def build(local: str, url: str) -> StoreTable:
    """The table (see the module docstring) in ``local``, naming ``url`` (its
    place on the store) in its absolute vector path."""
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=8)
    write_deltalake(local, _rows(0, 40), partition_by=["p"], writer_properties=props,
                    configuration={"delta.columnMapping.mode": "name"})
    write_deltalake(local, _rows(40, 40), mode="append", writer_properties=props)
    log = os.path.join(local, "_delta_log")
    adds = []
    for v in (0, 1):
        with open(os.path.join(log, f"{v:020d}.json"), encoding="utf-8") as f:
            adds += [a["add"] for a in map(json.loads, f) if "add" in a]
    adds.sort(key=lambda a: a["path"])
    actions: list[dict[str, Any]] = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["columnMapping", "deletionVectors"],
                      "writerFeatures": ["columnMapping", "deletionVectors"]}}]
    vectors = {}
    for kind, add, rows in (("i", adds[0], [0, 3, 4, 19]), ("u", adds[1], [1, 8, 9, 10, 11]),
                            ("p", adds[2], [*range(8), 12])):
        data = bitmap(rows)
        desc: dict[str, Any] = {"storageType": kind, "sizeInBytes": len(data),
                                "cardinality": len(rows)}
        if kind == "i":
            desc["pathOrInlineDv"] = z85(data)
        else:
            framed, offsets = frame([bitmap([5]), data])  # this one past offset 1
            u = uuid.uuid4()
            folder = "q1" if kind == "u" else "abs"
            os.makedirs(os.path.join(local, folder), exist_ok=True)
            name = f"deletion_vector_{u}.bin"
            with open(os.path.join(local, folder, name), "wb") as f:
                f.write(framed)
            desc["pathOrInlineDv"] = folder + z85(u.bytes) if kind == "u" else \
                f"{url}/{folder}/{name}"
            desc["offset"] = offsets[-1]
        actions.append({"remove": {"path": add["path"], "deletionTimestamp": 1,
                                   "dataChange": True}})
        actions.append({"add": {**add, "deletionVector": desc}})
        vectors[kind] = add["path"]
    with open(os.path.join(log, f"{2:020d}.json"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(a) + "\n" for a in actions))
    DeltaTable(local).create_checkpoint()
    write_deltalake(local, _rows(80, 20), mode="append", writer_properties=props)
    return StoreTable(local, url, vectors)


def upload(fs: Any, local: str, where: str) -> None:
    """Every file of the folder ``local`` to ``where`` (``bucket/prefix``)
    through the store's fsspec backend ``fs``, one object each."""
    for folder, _, names in os.walk(local):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, local).replace(os.sep, "/")
            with open(path, "rb") as f:
                fs.pipe_file(f"{where}/{rel}", f.read())
