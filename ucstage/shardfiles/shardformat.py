"""Which format a shard file is in, and its bytes as one stream.

Three formats hold samples inside a file (docs/training.md, "Samples inside
files"): ``tar`` (WebDataset shards), ``jsonl`` (one JSON value per line) and
``lines`` (one text sample per line), each plain or gzip-compressed.

**Gzip.** A gzip stream has no random access. A compressed shard is indexed
by decompressing it once, and every offset of its index is an offset in the
*decompressed* stream; a range is read by decompressing from the start of the
file up to it (:func:`read_range`). So a block of samples late in a large
``.gz`` shard costs a decompression of what comes before it: gzip shards
suit small files or ``block_samples`` large enough that a shard is a few
blocks; uncompressed shards are read with one ``pread`` per block.
"""

from __future__ import annotations

import gzip
import os
import zlib
from typing import IO, cast

from ..errors import CorruptShard, InvalidArgument

__all__ = ["FORMATS", "format_of", "open_stream", "read_range", "shown"]

FORMATS = ("tar", "jsonl", "lines")

_SUFFIXES = (  # longest first: ".tar.gz" before ".gz"-less ".tar"
    (".tar.gz", "tar", True), (".tgz", "tar", True), (".tar", "tar", False),
    (".jsonl.gz", "jsonl", True), (".ndjson.gz", "jsonl", True), (".jsonl", "jsonl", False),
    (".ndjson", "jsonl", False), (".txt.gz", "lines", True), (".txt", "lines", False),
)

GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
"""What a damaged or cut gzip stream raises while it is read."""


def shown(name: str) -> str:
    """A shard's name as messages print it: escaped (``repr``) when it holds
    control characters or anything else a terminal would not show as is."""
    return name if name.isprintable() else repr(name)


def format_of(path: str, format: str | None = None) -> tuple[str, bool] | None:
    """``(format, gzipped)`` of the shard at relative ``path``: by its suffix,
    or ``format`` when given (gzipped when the name ends in ``.gz``/``.tgz``).
    None: no known suffix and no ``format``."""
    lower = path.lower()
    gz = lower.endswith((".gz", ".tgz"))
    if format is not None:
        if format not in FORMATS:
            raise InvalidArgument(f"format must be one of {', '.join(map(repr, FORMATS))}, "
                                  f"got {format!r}")
        return format, gz
    for suffix, found, zipped in _SUFFIXES:
        if lower.endswith(suffix):
            return found, zipped
    return None


def open_stream(path: str, gz: bool) -> IO[bytes]:
    """The shard's (decompressed) bytes as a binary file."""
    if not gz:
        return open(path, "rb")
    return cast("IO[bytes]", gzip.open(path, "rb"))  # owns and closes the file


def read_range(path: str, gz: bool, start: int, stop: int, name: str) -> bytes:
    """Bytes ``[start, stop)`` of the shard's (decompressed) stream.

    Raises:
        CorruptShard: the stream ends before ``stop`` (a file cut or replaced
            since it was indexed) or a gzip stream is damaged.
    """
    want = stop - start
    if not gz:
        with open(path, "rb") as fh:
            data = os.pread(fh.fileno(), want, start)
    else:
        with open_stream(path, gz) as fh:
            try:
                fh.seek(start)
                data = fh.read(want)
            except GZIP_ERRORS as exc:
                raise cut_gzip(name, exc) from None
    if len(data) != want:
        raise CorruptShard(f"shard {shown(name)} ends at byte {start + len(data):,}, before the "
                           f"samples indexed up to byte {stop:,}: it was cut or replaced "
                           "since it was indexed",
                           hint="freeze the dataset again (a new ShardDataset) if the shard "
                                "was rewritten on purpose")
    return data


def cut_gzip(name: str, exc: BaseException) -> CorruptShard:
    """The error for a gzip stream that is damaged or ends early."""
    why = "cut short" if isinstance(exc, EOFError) else f"damaged ({type(exc).__name__})"
    return CorruptShard(f"gzip stream of shard {shown(name)} is {why}",
                        hint="copy or write the shard again; `gzip -t` checks a file")
