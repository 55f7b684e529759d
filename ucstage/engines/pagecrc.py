"""Parquet page CRCs: what a row group's byte-range entry is checked against
before it is cached, where the store gives no checksum of a range.

A store's checksum covers a whole object, so a row group's column chunks,
read as ranges, get at most the size check and the file's ETag (every range
``If-Match``: a changed file is never mixed) on S3 and GCS; Azure gives the
MD5 of every range of at most 4 MiB (:func:`ucstage.engines.azranges.read_ranges`).
The file itself may carry a checksum of every page: a column chunk is a run
of pages, each a ``PageHeader`` (parquet.thrift, Thrift's compact protocol)
and ``compressed_page_size`` bytes, and a writer may put in the header
(field 4, ``crc``) the CRC32 of those bytes, the page as stored after its
header (for a v2 data page, levels and data alike). Spark (parquet-mr 1.12
and later, ``parquet.page.write-checksum.enabled``) writes them by default,
pyarrow with ``write_page_checksum=True``; pyarrow's default, and delta-rs
(deltalake 1.6), write none.

:func:`verified` walks each chunk's pages from its first byte, checks every
CRC a page carries, and requires the last page to end exactly where the
chunk does. The walk needs nothing but the bytes fetched (no footer), and
costs one CRC32 pass over them plus a few microseconds of header parsing a
page: 14.5 ms of CPU for a 64 MiB row group of 420 pages (pyarrow's default
pages of 20,000 rows), 4.6 GB/s on one core of the 2-core test machine,
about a sixth of an MD5 of the same bytes
(``tests/cache/test_page_crc.py::test_the_walk_of_a_64_mib_row_group``
prints it). pyarrow's own check (``page_checksum_verification=True``) would
decompress and decode every page as well, and needs the file's footer.

A chunk that fails is read again, :data:`~ucstage.engines.azranges.TRIES`
reads in a row at most: a CRC that never matches fails the entry with
:exc:`~ucstage.engines.checks.Mismatch` (never cached; the cache's retry of
the entry may follow). A walk that does not land on the chunk's end (a
header flipped in transit is not covered by any CRC, but moves the walk) is
read again too; when the same bytes come back, the layout is the file's own
(a writer known to understate its chunks, or an empty row group whose range
starts at the file's magic), and the entry keeps the size check.

An entry counts as ``page_crc`` (:data:`ucstage.engines.checks.CHECKS`)
only when every page of every chunk carried a CRC that matched; a file
without page CRCs, or with some pages only, counts as ``size``. The headers
themselves (page type, value counts, statistics) are covered by no CRC.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from ..thrift import I32, CompactReader, zigzag
from . import checks
from .azranges import TRIES

__all__ = ["CHECK", "Unwalkable", "verified", "walk"]

CHECK = "page_crc"
"""The name of the check in the cache's counts (``--json`` ``checks``)."""

# PageHeader field ids (parquet.thrift)
_COMPRESSED_SIZE, _CRC = 3, 4


class Unwalkable(ValueError):
    """A chunk's bytes are not a run of whole pages."""


class _BadCrc(ValueError):
    def __init__(self, want: int, got: int) -> None:
        super().__init__("a page's CRC32 differs from its bytes'")
        self.want, self.got = want, got


def walk(chunk: bytes | memoryview) -> tuple[int, int]:
    """``(pages, pages with a CRC)`` of one column chunk's bytes, every CRC
    checked.

    Raises:
        Unwalkable: a header does not parse, or the pages do not end where
            the chunk does.
        _BadCrc: a page's bytes do not give its CRC (private: :func:`verified`
            turns it into :exc:`~ucstage.engines.checks.Mismatch`).
    """
    view = memoryview(chunk)
    end = len(view)
    pos = pages = crcs = 0
    while pos < end:
        r = CompactReader(view, pos, what="a page header")
        size = crc = None
        try:
            for fid, kind in r.fields():
                if fid == _COMPRESSED_SIZE and kind == I32:
                    size = zigzag(r.varint())
                elif fid == _CRC and kind == I32:
                    crc = zigzag(r.varint()) & 0xFFFFFFFF
                else:
                    r.skip(kind)
        except ValueError as exc:
            raise Unwalkable(f"page {pages}: {exc}") from None
        if size is None or size < 0 or r.at + size > end:
            raise Unwalkable(f"page {pages} does not fit in the chunk")
        body = view[r.at:r.at + size]
        if crc is not None:
            got = zlib.crc32(body)  # releases the GIL on large pages
            if got != crc:
                raise _BadCrc(crc, got)
            crcs += 1
        pos, pages = r.at + size, pages + 1
    return pages, crcs


def verified(key: str, blobs: list[bytes], reread: Callable[[int], bytes]) -> bool:
    """Check each column chunk in ``blobs`` (:func:`walk`), replacing in
    place one that fails by ``reread(i)`` (its range read again) until it
    passes, :data:`TRIES` reads in a row at most. Returns whether every page
    of every chunk carried a CRC (the entry counts as ``page_crc``).

    Raises:
        checks.Mismatch: a chunk failed on every read (counted in the
            tally's mismatches, one per failed read).
    """
    covered = bool(blobs)
    for i in range(len(blobs)):
        reads = 1
        while True:
            try:
                pages, crcs = walk(blobs[i])
                covered = covered and pages > 0 and crcs == pages
                break
            except Unwalkable:
                if reads == TRIES:
                    raise checks.Mismatch(key, "page layout", "pages ending where the "
                                             "chunk ends", "other bytes on every read") from None
                again, reads = reread(i), reads + 1
                if again == blobs[i]:  # the file's own layout, read the same way twice
                    covered = False
                    break
                checks.TALLY.add("mismatches")  # the first read was damaged
                blobs[i] = again
            except _BadCrc as exc:
                checks.TALLY.add("mismatches")
                if reads == TRIES:
                    raise checks.Mismatch(key, "page CRC32", f"{exc.want:08x}",
                                             f"{exc.got:08x}") from None
                blobs[i], reads = reread(i), reads + 1
    return covered
