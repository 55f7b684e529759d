"""A skipping reader of Thrift's compact protocol: what ucstage reads of
Parquet's own structures (parquet.thrift) without pyarrow, where pyarrow
cannot be asked safely (a footer's encryption, :mod:`ucstage.tables.encrypted`)
or not cheaply (the page headers of a fetched row group,
:mod:`ucstage.engines.pagecrc`)."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["BINARY", "I32", "LIST", "STOP", "STRUCT", "CompactReader", "zigzag"]

STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)
_DEPTH = 64
"""Deepest nesting accepted (a footer nests a handful of levels)."""


def zigzag(n: int) -> int:
    """A compact-protocol integer's value from its varint."""
    return (n >> 1) ^ -(n & 1)


class CompactReader:
    """Reads Thrift's compact protocol from ``data`` from offset ``at``:
    bytes, varints, a struct's fields, a list's head; skips any value
    (tests/common/footeredit.py decodes values on top of it). ``what`` names
    the bytes in errors ("the footer"); no byte of them is ever shown."""

    def __init__(self, data: bytes | memoryview, at: int = 0, what: str = "the footer") -> None:
        self.data, self.at, self.what = data, at, what

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError(f"{self.what} ends inside a value")
        b = self.data[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 70:
                raise ValueError("a varint longer than 10 bytes")

    def fields(self) -> Iterator[tuple[int, int]]:
        """(field id, type) of each field of the struct here; the caller
        consumes each value (:meth:`skip` or descend) before the next."""
        last = 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == STOP:
                return
            delta = head >> 4
            if delta:
                last += delta
            else:
                last = zigzag(self.varint())
            yield last, kind

    def items(self) -> tuple[int, int]:
        """(count, element type) of the list or set here."""
        head = self.byte()
        n = head >> 4
        return (self.varint() if n == 15 else n), head & 0x0F

    def skip(self, kind: int, depth: int = 0, in_list: bool = False) -> None:
        if depth > _DEPTH:
            raise ValueError("values nested too deep")
        if kind in (TRUE, FALSE):
            if in_list:
                self.byte()  # a list's booleans are a byte each; a field's are in its type
        elif kind == BYTE:
            self.byte()
        elif kind in (I16, I32, I64):
            self.varint()
        elif kind == DOUBLE:
            self._advance(8)
        elif kind == BINARY:
            self._advance(self.varint())
        elif kind in (LIST, SET):
            n, elem = self.items()
            for _ in range(n):
                self.skip(elem, depth + 1, in_list=True)
        elif kind == MAP:
            n = self.varint()
            if n:
                kv = self.byte()
                for _ in range(n):
                    self.skip(kv >> 4, depth + 1, in_list=True)
                    self.skip(kv & 0x0F, depth + 1, in_list=True)
        elif kind == STRUCT:
            for _, t in self.fields():
                self.skip(t, depth + 1)
        else:
            raise ValueError("an unknown Thrift type")  # its value is the file's: not shown

    def _advance(self, n: int) -> None:
        if self.at + n > len(self.data):
            raise ValueError(f"{self.what} ends inside a value")
        self.at += n
