"""What a Parquet footer says that pyarrow cannot be asked safely: whether its
columns are encrypted.

pyarrow parses a footer with encrypted column metadata under a plaintext
footer, then aborts the process (an uncaught C++ exception, or SIGSEGV in
``write_metadata_file``) the moment that metadata is touched, so the check is
made on the raw bytes first: a skipping reader of Thrift's compact protocol
walks ``FileMetaData`` (parquet.thrift) for ``encryption_algorithm`` and each
``ColumnChunk`` for ``crypto_metadata`` / ``encrypted_column_metadata``.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["encryption"]

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, \
    _STRUCT = range(13)
_DEPTH = 64
"""Deepest nesting accepted (a footer nests a handful of levels)."""

# parquet.thrift field ids
_FILE_ROW_GROUPS, _FILE_ENCRYPTION = 4, 8
_GROUP_COLUMNS = 1
_CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META = 8, 9


class CompactReader:
    """Reads Thrift's compact protocol from ``data``: bytes, varints, a struct's
    fields, a list's head; skips any value (tests/common/footeredit.py decodes
    values on top of it)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise ValueError("the footer ends inside a value")
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
            if kind == _STOP:
                return
            delta = head >> 4
            if delta:
                last += delta
            else:
                n = self.varint()
                last = (n >> 1) ^ -(n & 1)
            yield last, kind

    def items(self) -> tuple[int, int]:
        """(count, element type) of the list or set here."""
        head = self.byte()
        n = head >> 4
        return (self.varint() if n == 15 else n), head & 0x0F

    def skip(self, kind: int, depth: int = 0, in_list: bool = False) -> None:
        if depth > _DEPTH:
            raise ValueError("values nested too deep")
        if kind in (_TRUE, _FALSE):
            if in_list:
                self.byte()  # a list's booleans are a byte each; a field's are in its type
        elif kind == _BYTE:
            self.byte()
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self._advance(8)
        elif kind == _BINARY:
            self._advance(self.varint())
        elif kind in (_LIST, _SET):
            n, elem = self.items()
            for _ in range(n):
                self.skip(elem, depth + 1, in_list=True)
        elif kind == _MAP:
            n = self.varint()
            if n:
                kv = self.byte()
                for _ in range(n):
                    self.skip(kv >> 4, depth + 1, in_list=True)
                    self.skip(kv & 0x0F, depth + 1, in_list=True)
        elif kind == _STRUCT:
            for _, t in self.fields():
                self.skip(t, depth + 1)
        else:
            raise ValueError("an unknown Thrift type")  # its value is the file's: not shown

    def _advance(self, n: int) -> None:
        if self.at + n > len(self.data):
            raise ValueError("the footer ends inside a value")
        self.at += n


def encryption(metadata: bytes) -> str | None:
    """Why the serialised ``FileMetaData`` ``metadata`` is (partly) encrypted,
    or None when it is not.

    Raises:
        ValueError: the bytes are not a compact-protocol struct.
    """
    r = CompactReader(metadata)
    for fid, kind in r.fields():
        if fid == _FILE_ENCRYPTION and kind == _STRUCT:
            return "encrypted columns under a plaintext footer"
        if fid != _FILE_ROW_GROUPS or kind != _LIST:
            r.skip(kind)
            continue
        groups, elem = r.items()
        for _ in range(groups):
            if elem != _STRUCT:
                r.skip(elem, in_list=True)
                continue
            for gfid, gkind in r.fields():
                if gfid != _GROUP_COLUMNS or gkind != _LIST:
                    r.skip(gkind)
                    continue
                chunks, celem = r.items()
                for _ in range(chunks):
                    if celem != _STRUCT:
                        r.skip(celem, in_list=True)
                        continue
                    for cfid, ckind in r.fields():
                        if cfid in (_CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META):
                            return "encrypted column metadata"
                        r.skip(ckind)
    return None
