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

from ..thrift import LIST, STRUCT, CompactReader

__all__ = ["CompactReader", "encryption"]  # the reader: tests/common/footeredit.py

# parquet.thrift field ids
_FILE_ROW_GROUPS, _FILE_ENCRYPTION = 4, 8
_GROUP_COLUMNS = 1
_CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META = 8, 9


def encryption(metadata: bytes) -> str | None:
    """Why the serialised ``FileMetaData`` ``metadata`` is (partly) encrypted,
    or None when it is not.

    Raises:
        ValueError: the bytes are not a compact-protocol struct.
    """
    r = CompactReader(metadata)
    for fid, kind in r.fields():
        if fid == _FILE_ENCRYPTION and kind == STRUCT:
            return "encrypted columns under a plaintext footer"
        if fid != _FILE_ROW_GROUPS or kind != LIST:
            r.skip(kind)
            continue
        groups, elem = r.items()
        for _ in range(groups):
            if elem != STRUCT:
                r.skip(elem, in_list=True)
                continue
            for gfid, gkind in r.fields():
                if gfid != _GROUP_COLUMNS or gkind != LIST:
                    r.skip(gkind)
                    continue
                chunks, celem = r.items()
                for _ in range(chunks):
                    if celem != STRUCT:
                        r.skip(celem, in_list=True)
                        continue
                    for cfid, ckind in r.fields():
                        if cfid in (_CHUNK_CRYPTO, _CHUNK_ENCRYPTED_META):
                            return "encrypted column metadata"
                        r.skip(ckind)
    return None
