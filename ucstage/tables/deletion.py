"""Delta deletion vectors: which rows of a data file are deleted, read by the
Delta protocol's byte layout (no Delta engine).

A data file's ``add`` action may carry a deletion-vector descriptor. Its
bitmap is stored inline in the log (``storageType`` ``i``: the bytes in the
protocol's base85, the Z85 alphabet), in a file beside the data named by a
UUID (``u``: an optional folder prefix, then the UUID's 16 bytes as 20 base85
characters; the file is ``<prefix>/deletion_vector_<uuid>.bin`` under the
table's folder) or by an absolute path (``p``). A file holds a version byte,
then for each vector: its size (4 bytes, big-endian), the bitmap, and the
bitmap's CRC-32 (4 bytes, big-endian); the descriptor's ``offset`` points at
the size. The bitmap is a RoaringBitmapArray: a little-endian magic number,
then the 64-bit portable roaring format (pyroaring's ``BitMap64``).

Descriptors are resolved at freeze (:func:`resolve`: a file's absolute path,
refused unless inside the table's folder, so a reader needs no table
folder); the bitmap is then read by :func:`deleted` wherever rows are
counted or read, and checked every time against the descriptor (magic,
checksum, size, cardinality): a vector that does not match is an error,
never a guess at which rows are live. A message never shows a value the
file holds (it may not be a vector file at all).
"""

from __future__ import annotations

import functools
import json
import uuid
import zlib
from typing import Any

from ..errors import MissingDataFiles, MissingDependency, UnreadableDeltaLog, UnsupportedTable
from .logpaths import Folder, shown

__all__ = ["MAGIC", "deleted", "inlined", "resolve", "z85_decode", "z85_encode"]

MAGIC = 1681511377
"""The RoaringBitmapArray format's magic number (little-endian, first 4 bytes)."""

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


def z85_decode(text: str) -> bytes:
    """Bytes of Z85 ``text`` (5 characters per 4 bytes, big-endian).

    Written here because ``base64.z85decode`` needs Python 3.13.

    Raises:
        ValueError: a length that is not a multiple of 5, or a character outside Z85.
    """
    if len(text) % 5:
        raise ValueError(f"{len(text)} base85 characters (not a multiple of 5)")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i:i + 5]:
            digit = _Z85_VALUE.get(c)
            if digit is None:
                raise ValueError(f"{c!r} is not a base85 (Z85) character")
            value = value * 85 + digit
        if value >= 1 << 32:
            raise ValueError(f"base85 group {text[i:i + 5]!r} overflows 4 bytes")
        out += value.to_bytes(4, "big")
    return bytes(out)


def z85_encode(data: bytes) -> str:
    """Z85 text of ``data``, zero-padded to a multiple of 4 bytes (an inline
    vector's ``sizeInBytes`` says where the bitmap ends)."""
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        group = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            group.append(_Z85[digit])
        out.append("".join(reversed(group)))
    return "".join(out)


def resolve(folder: Folder, descriptor: dict[str, Any]) -> dict[str, Any]:
    """``descriptor`` (the log's ``deletionVector``) with its file's absolute
    local ``file`` (``u``, ``p``; the file's URL for a table on an object
    store, whose vectors are then fetched and inlined: :func:`inlined`),
    checked for the fields the reader needs.

    Raises:
        UnsupportedTable: a storage type this reader does not know; a ``p``
            path on another filesystem.
        UnsafePath: a ``u`` prefix or ``p`` path leading outside the table's
            ``folder`` (:meth:`ucstage.tables.logpaths.TableFolder.path`).
        UnreadableDeltaLog: a descriptor missing a field or with a bad UUID.
    """
    kind = descriptor.get("storageType")
    try:
        out: dict[str, Any] = {"storageType": kind, "pathOrInlineDv": str(descriptor["pathOrInlineDv"]),
               "sizeInBytes": int(descriptor["sizeInBytes"]),
               "cardinality": int(descriptor["cardinality"])}
        if kind == "u":
            text = str(out["pathOrInlineDv"])
            name = uuid.UUID(bytes=z85_decode(text[-20:]))
            prefix = text[:-20]
            out["file"] = folder.path(f"{prefix}/deletion_vector_{name}.bin" if prefix
                                      else f"deletion_vector_{name}.bin", "deletion vector",
                                      encoded=False)
        elif kind == "p":
            out["file"] = folder.path(out["pathOrInlineDv"], "deletion vector",
                                      encoded=False)
        elif kind != "i":
            raise UnsupportedTable(f"table {folder.label}: a deletion vector of storage type "
                                   f"{kind!r}, which the Delta protocol does not define",
                                   hint="read it with a Delta engine, or rewrite the table")
        if kind != "i":
            offset = descriptor.get("offset")
            out["offset"] = 1 if offset is None else int(offset)
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableDeltaLog(f"table {folder.label}: a deletion-vector descriptor cannot be read "
                                 f"({exc})", hint="the log may be damaged") from exc
    return out


def deleted(descriptor: dict[str, Any], what: str) -> Any:
    """The deleted row indices of the data file ``what`` (a ``BitMap64``, frozen:
    shared by every reader of this process), its descriptor from :func:`resolve`.

    Raises:
        MissingDataFiles: the vector's file is gone.
        UnreadableDeltaLog: wrong size, checksum, magic or cardinality.
    """
    return _load(json.dumps(descriptor, sort_keys=True), what)


@functools.lru_cache(maxsize=256)
def _load(key: str, what: str) -> Any:
    try:
        from pyroaring import BitMap64, FrozenBitMap64
    except ImportError as exc:
        raise MissingDependency("reading deletion vectors needs pyroaring",
                                hint="pip install 'ucstage[spark]'") from exc
    d = json.loads(key)
    size = d["sizeInBytes"]
    bad = functools.partial(_unreadable, what)
    if d["storageType"] == "i":
        try:
            data = z85_decode(d["pathOrInlineDv"])
        except ValueError as exc:
            raise bad(f"its inline bytes are not base85 ({exc})") from exc
        if len(data) < size:
            raise bad(f"{len(data)} inline bytes, the descriptor says {size}")
        data = data[:size]  # base85 pads to 4 bytes
    else:
        data = _file_bytes(d, d["file"], what)
    if len(data) < 4 or int.from_bytes(data[:4], "little") != MAGIC:
        raise bad("no RoaringBitmapArray magic number")
    try:
        bitmap = BitMap64.deserialize(data[4:])
    except (ValueError, OverflowError, IndexError) as exc:  # IndexError: no bytes after the magic
        raise bad("its bitmap does not parse") from exc
    if len(bitmap) != d["cardinality"]:
        raise bad(f"its row count does not match the descriptor's {d['cardinality']}")
    return FrozenBitMap64(bitmap)


def _unreadable(what: str, why: str) -> UnreadableDeltaLog:
    return UnreadableDeltaLog(f"the deletion vector of {what} cannot be read: {why}",
                              hint="the table's deletion-vector files may be damaged; "
                                   "a Delta engine's REORG TABLE ... APPLY (PURGE) "
                                   "rewrites them")


def _file_bytes(d: dict[str, Any], path: str, what: str, named: str = "") -> bytes:
    """The bitmap bytes of vector ``d`` in its file at local ``path`` (named
    ``named`` in messages, default the path), checked against its size
    header and checksum."""
    bad = functools.partial(_unreadable, what)
    size = d["sizeInBytes"]
    named = shown(named or path)
    try:
        with open(path, "rb") as f:
            f.seek(d["offset"])
            framed = f.read(size + 8)
    except FileNotFoundError as exc:
        raise MissingDataFiles(f"the deletion vector of {what} is missing: {named}",
                               hint="the table was vacuumed or copied incompletely") from exc
    except OSError as exc:
        raise bad(f"{named}: {exc.strerror or exc}") from exc
    if len(framed) < size + 8:
        raise bad(f"{named} ends {size + 8 - len(framed)} bytes early")
    # What the file says is never shown: it may not be a vector file at all.
    if int.from_bytes(framed[:4], "big") != size:
        raise bad(f"{named} is not a valid deletion-vector file (the size header at "
                  f"offset {d['offset']} does not match the descriptor's {size} bytes)")
    data = framed[4:4 + size]
    if zlib.crc32(data) != int.from_bytes(framed[4 + size:], "big"):
        raise bad(f"its checksum in {named} does not match")
    return data


def inlined(descriptor: dict[str, Any], local: str, what: str) -> dict[str, Any]:
    """A resolved ``u``/``p`` descriptor of a table on an object store as an
    inline one (``i``), its bitmap read from ``local``, the vector file's
    copy in the cache, and checked as :func:`deleted` checks a file's
    (messages name the file's URL, ``descriptor["file"]``).

    The manifest then carries the vector: every reader (ranks, workers, a
    resume) applies the very bitmap checked here, and none fetches the file
    again.

    Raises:
        UnreadableDeltaLog: wrong size, checksum, magic or cardinality.
    """
    data = _file_bytes(descriptor, local, what, descriptor["file"])
    out = {"storageType": "i", "pathOrInlineDv": z85_encode(data), "sizeInBytes": len(data),
           "cardinality": descriptor["cardinality"]}
    deleted(out, what)  # the magic, the bitmap and its cardinality checked now
    return out
