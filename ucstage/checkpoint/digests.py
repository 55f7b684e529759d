"""Checksums of a checkpoint's files and of the byte ranges inside them.

One kind per checkpoint, written into its record as ``kind:<hex>``: CRC32C
when the ``crc32c`` package is installed (C speed, and what object stores
report), else MD5 from the standard library. A checkpoint is checked with
the kind its record names, whichever this process would pick.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..engines.checks import hasher
from ..errors import MissingDependency

CHUNK = 8 * 1024 * 1024
"""Bytes read at a time: large enough for throughput, small enough that
Ctrl-C and progress are prompt."""


def default_kind() -> str:
    """``crc32c`` when its package is installed, else ``md5``."""
    try:
        import crc32c  # noqa: F401
    except ImportError:
        return "md5"
    return "crc32c"


def _hasher(kind: str) -> Any:
    if kind == "crc32c":
        try:
            import crc32c  # noqa: F401
        except ImportError as exc:
            raise MissingDependency("this checkpoint's checksums are CRC32C and the crc32c "
                                    "package is not installed", hint="pip install crc32c") from exc
    if kind not in ("crc32c", "md5"):
        raise ValueError(f"unknown checksum kind {kind!r}")
    return hasher(kind)


def new_hasher(kind: str) -> Any:
    """A running digest (``update``, ``hexdigest``) of ``kind``."""
    return _hasher(kind)


def kind_of(checksum: str) -> str:
    """The kind of a ``kind:<hex>`` checksum."""
    return checksum.partition(":")[0]


def of_bytes(data: bytes | memoryview, kind: str) -> str:
    """``kind:<hex>`` of ``data``."""
    digest = _hasher(kind)
    digest.update(data)
    return f"{kind}:{digest.hexdigest()}"


def of_file(path: str, kind: str, ranges: Sequence[tuple[int, int]] = (),
            progress: Callable[[int], None] | None = None) -> tuple[int, str, list[str]]:
    """``(size, checksum, range checksums)`` of the file at ``path``, read once.

    ``ranges`` are ``(offset, length)`` pairs that do not overlap (a DCP
    file's items); each gets its own checksum from the same pass, so a load
    that reads one range can check it without reading the whole file.
    ``progress`` is called with the bytes of each block read.
    """
    whole = _hasher(kind)
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    parts: list[Any] = [_hasher(kind) for _ in ranges]
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            block = fh.read(CHUNK)
            if not block:
                break
            whole.update(block)
            start, end = size, size + len(block)
            for i in order:
                offset, length = ranges[i]
                lo, hi = max(offset, start), min(offset + length, end)
                if lo < hi:
                    parts[i].update(memoryview(block)[lo - start:hi - start])
            size = end
            if progress is not None:
                progress(len(block))
    return size, f"{kind}:{whole.hexdigest()}", [f"{kind}:{p.hexdigest()}" for p in parts]
