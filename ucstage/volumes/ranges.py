"""Ranged reads of a volume's file: a Parquet footer, a row group's column chunks.

One function for the three ways ucstage reads a volume: a local or mounted
file (``pread``), an object store on the object-store engine (ranged GETs,
each conditional on the listed ETag, so a changed object is an error, never
a mix of versions), and any other fsspec filesystem (``cat_file`` with a
range, the ETag compared before and after where the store gives one).
Adjacent ranges are read as one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .entry import version_of
from .location import Volume

__all__ = ["RangeChanged", "merge_ranges", "read_ranges"]

_HASH_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c")


class RangeChanged(InterruptedError):
    """The file changed while (or since it was listed and) its ranges were read."""


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges sorted, adjacent or overlapping ones merged."""
    out: list[list[int]] = []
    for off, n in sorted(ranges):
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + n - out[-1][0])
        else:
            out.append([off, n])
    return [(a, b) for a, b in out]


def _cut(merged: list[tuple[int, int]], blobs: list[bytes],
         ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    out = []
    for off, n in ranges:
        for (m_off, m_n), blob in zip(merged, blobs, strict=True):
            if m_off <= off and off + n <= m_off + m_n:
                out.append(blob[off - m_off:off - m_off + n])
                break
    return out


def _local(volume: Volume, relpath: str, merged: list[tuple[int, int]],
           version: str | None) -> tuple[list[bytes], str]:
    fd = os.open(volume.full_path(relpath), os.O_RDONLY | os.O_CLOEXEC)
    try:
        before = os.fstat(fd)
        seen = version_of({"mtime": before.st_mtime})
        if version is not None and version and seen != version:
            raise RangeChanged(f"{relpath} changed since it was listed")
        blobs = []
        for off, n in merged:
            data = os.pread(fd, n, off)
            if len(data) != n:
                raise OSError(f"short read: {len(data)} of {n} bytes at {off} of {relpath}")
            blobs.append(data)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if (after.st_mtime_ns, after.st_size) != (before.st_mtime_ns, before.st_size):
        raise RangeChanged(f"{relpath} changed while it was read")
    return blobs, seen


def _object(volume: Volume, relpath: str, merged: list[tuple[int, int]],
            version: str | None, deadline: float | None) -> tuple[list[bytes], str]:
    import obstore

    from .. import cloudfs, objstore

    kind, bucket, key = objstore.location(volume, volume.full_path(relpath))
    client = objstore.store(kind, bucket, deadline)
    blobs, seen = [], version or ""
    for off, n in merged:
        options: dict[str, Any] = {"range": (off, off + n)}
        # GCS and Azure versions carry the store's MD5 after the marker
        # (ucstage.cloudfs): GCS is pinned by its generation, Azure by its ETag.
        marker = cloudfs.marker(seen) if kind in ("gs", "az") else seen
        if seen and kind == "gs":
            options["version"] = marker
        elif seen:
            options["if_match"] = f'"{marker}"'
        try:
            got = obstore.get(client, key, options=options)  # type: ignore[arg-type]
            data = bytes(got.bytes())
        except FileNotFoundError as exc:
            if kind == "gs" and seen:  # that generation is gone: the object was replaced
                raise RangeChanged(f"{relpath} changed since it was listed") from exc
            raise
        except Exception as exc:
            text = str(exc)
            if "Precondition" in text or "412" in text:
                raise RangeChanged(f"{relpath} changed since it was listed") from exc
            raise objstore.concise(exc, volume.full_path(relpath)) from exc
        seen = seen or (str(got.meta.get("version") or "") if kind == "gs" else
                        objstore._etag(got.meta.get("e_tag")))
        if len(data) != n:
            raise OSError(f"short read: {len(data)} of {n} bytes at {off} of {relpath}")
        blobs.append(data)
    return blobs, seen


def _fsspec(volume: Volume, relpath: str, merged: list[tuple[int, int]],
            version: str | None) -> tuple[list[bytes], str]:
    path = volume.full_path(relpath)
    blobs = [bytes(volume.fs.cat_file(path, start=off, end=off + n)) for off, n in merged]
    for (_, n), data in zip(merged, blobs, strict=True):
        if len(data) != n:
            raise OSError(f"short read: {len(data)} of {n} bytes of {relpath}")
    info = volume.fs.info(path)
    # Only a content hash compares across calls: fsspec backends spell
    # timestamps differently in info() and in the listing.
    seen = version_of(info) if any(k in info for k in _HASH_KEYS) else ""
    if version and seen and seen != version:
        raise RangeChanged(f"{relpath} changed since it was listed")
    return blobs, seen


def read_ranges(volume: Volume, relpath: str, ranges: Sequence[tuple[int, int]], *,
                version: str | None = None, deadline: float | None = None
                ) -> tuple[list[bytes], str]:
    """The bytes of each (offset, length) range of ``relpath``, and the file's
    change marker as seen while reading (see :func:`~ucstage.volumes.version_of`).

    ``version``: the listed change marker; a file that no longer has it raises
    :class:`RangeChanged` (an ``InterruptedError``: the cache retries it).
    """
    from .. import objstore

    merged = merge_ranges(ranges)
    if volume.is_local:
        blobs, seen = _local(volume, relpath, merged, version)
    elif objstore.engine(volume) == "obstore":
        blobs, seen = _object(volume, relpath, merged, version, deadline)
    else:
        blobs, seen = _fsspec(volume, relpath, merged, version)
    return _cut(merged, blobs, ranges), seen
