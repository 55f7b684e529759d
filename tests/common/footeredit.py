"""Editing a Parquet file's footer in place, for tests that need files other
writers make (an old ``created_by``, understated chunk sizes, chunks that
point past the end): the footer's Thrift compact encoding decoded into plain
Python values, changed, and encoded back. Written from the Thrift compact
protocol and parquet.thrift; the bytes, varints, field headers and list heads
are read by ucstage's own compact-protocol reader (tables/encrypted.py), the
decoding of values into Python and the encoding back are this module's.

A struct is a list of ``[field_id, type, value]``; a list is ``(element_type,
[values])``; a map is ``(key_type, value_type, [(k, v), ...])``.
"""

from __future__ import annotations

import struct as _struct
from collections.abc import Callable
from typing import Any

from ucstage.tables.encrypted import CompactReader

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)

# parquet.thrift field ids used by the tests
FILE_ROW_GROUPS, FILE_CREATED_BY = 4, 6
ROW_GROUP_COLUMNS = 1
CHUNK_FILE_OFFSET, CHUNK_META = 2, 3
META_TOTAL_COMPRESSED, META_DATA_PAGE_OFFSET, META_DICT_PAGE_OFFSET = 7, 9, 11


class _In(CompactReader):
    """The library's compact-protocol reader, decoding each value rather than skipping it."""

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, t: int) -> Any:
        if t in (TRUE, FALSE):  # inside a list: one byte
            return self.byte() == 1
        if t == BYTE:
            return self.byte()
        if t in (I16, I32, I64):
            return self.zigzag()
        if t == DOUBLE:
            v = _struct.unpack("<d", self.data[self.at:self.at + 8])[0]
            self.at += 8
            return v
        if t == BINARY:
            n = self.varint()
            v = self.data[self.at:self.at + n]
            self.at += n
            return bytes(v)
        if t in (LIST, SET):
            n, et = self.items()
            return (et, [self.value(et) for _ in range(n)])
        if t == MAP:
            n = self.varint()
            if not n:
                return (0, 0, [])
            kv = self.byte()
            kt, vt = kv >> 4, kv & 0x0F
            return (kt, vt, [(self.value(kt), self.value(vt)) for _ in range(n)])
        if t == STRUCT:
            return self.struct()
        raise ValueError(f"thrift type {t}")

    def struct(self) -> list[list[Any]]:
        found: list[list[Any]] = []
        for fid, t in self.fields():
            if t in (TRUE, FALSE):
                found.append([fid, TRUE, t == TRUE])
            else:
                found.append([fid, t, self.value(t)])
        return found


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


def _value(t: int, v: Any) -> bytes:
    if t in (TRUE, FALSE):
        return bytes([1 if v else 2])
    if t == BYTE:
        return bytes([v & 0xFF])
    if t in (I16, I32, I64):
        return _zigzag(v)
    if t == DOUBLE:
        return _struct.pack("<d", v)
    if t == BINARY:
        return _varint(len(v)) + v
    if t in (LIST, SET):
        et, items = v
        head = bytes([(len(items) << 4) | et]) if len(items) < 15 else \
            bytes([0xF0 | et]) + _varint(len(items))
        return head + b"".join(_value(et, x) for x in items)
    if t == MAP:
        kt, vt, items = v
        if not items:
            return b"\0"
        return _varint(len(items)) + bytes([(kt << 4) | vt]) + b"".join(
            _value(kt, k) + _value(vt, x) for k, x in items)
    if t == STRUCT:
        return encode(v)
    raise ValueError(f"thrift type {t}")


def encode(fields: list[list[Any]]) -> bytes:
    out = bytearray()
    last = 0
    for fid, t, v in fields:
        wire = (TRUE if v else FALSE) if t in (TRUE, FALSE) else t
        delta = fid - last
        if 0 < delta <= 15:
            out.append((delta << 4) | wire)
        else:
            out.append(wire)
            out += _zigzag(fid)
        last = fid
        if t not in (TRUE, FALSE):
            out += _value(t, v)
    out.append(STOP)
    return bytes(out)


def decode(data: bytes) -> list[list[Any]]:
    return _In(data).struct()


def field(fields: list[list[Any]], fid: int) -> list[Any]:
    """The ``[id, type, value]`` entry of field ``fid`` (KeyError if absent)."""
    for entry in fields:
        if entry[0] == fid:
            return entry
    raise KeyError(fid)


def chunk_meta(footer: list[list[Any]], group: int, column: int) -> list[list[Any]]:
    """The ColumnMetaData struct of one column chunk."""
    groups = field(footer, FILE_ROW_GROUPS)[2][1]
    chunks = field(groups[group], ROW_GROUP_COLUMNS)[2][1]
    return field(chunks[column], CHUNK_META)[2]


def rewrite(data: bytes, edit: Callable[[list[list[Any]]], None]) -> bytes:
    """The Parquet file ``data`` with its footer changed by ``edit`` (in place
    on the decoded struct); the pages are untouched."""
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    n = int.from_bytes(data[-8:-4], "little")
    body = data[:-8 - n]
    footer = decode(data[-8 - n:-8])
    edit(footer)
    new = encode(footer)
    return body + new + len(new).to_bytes(4, "little") + b"PAR1"


def page_body(data: bytes, offset: int) -> int:
    """Where the body of the page whose header starts at ``offset`` begins."""
    reader = _In(data[offset:])
    reader.struct()  # the PageHeader
    return offset + reader.at


def chunk_offsets(data: bytes, group: int, column: int) -> tuple[int, int | None]:
    """(data_page_offset, dictionary_page_offset or None) of one column chunk."""
    n = int.from_bytes(data[-8:-4], "little")
    meta = chunk_meta(decode(data[-8 - n:-8]), group, column)
    try:
        dictionary = field(meta, META_DICT_PAGE_OFFSET)[2]
    except KeyError:
        dictionary = None
    return field(meta, META_DATA_PAGE_OFFSET)[2], dictionary
