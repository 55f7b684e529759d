"""Byte ranges of a file: merged into as few reads as possible, cut back out,
and the error of a file that changed under them.

Ranged reads themselves are the engine's
(:func:`ucstage.engines.engine.read_ranges`, and Azure's checked ranges in
:mod:`ucstage.engines.azranges`); this is what both share.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RangeChanged", "cut_ranges", "merge_ranges"]


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


def cut_ranges(merged: list[tuple[int, int]], blobs: list[bytes],
               ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each of ``ranges`` out of ``blobs``, the bytes of the
    ``merged`` ranges (:func:`merge_ranges`) that hold them."""
    out = []
    for off, n in ranges:
        for (m_off, m_n), blob in zip(merged, blobs, strict=True):
            if m_off <= off and off + n <= m_off + m_n:
                out.append(blob[off - m_off:off - m_off + n])
                break
    return out
