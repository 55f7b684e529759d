"""Line shards: JSON Lines (one JSON value per line) and text line files
(one ``str`` sample per line), their lines found once as byte offsets and
read back from a byte range.

A line ends at ``\\n``; a last line without one counts. A ``\\r`` before the
``\\n`` is not part of the line. In a ``jsonl`` shard an empty line is no
sample (JSON Lines allows a trailing one); in a ``lines`` shard it is the
empty string. Offsets are in the decompressed stream for a gzip shard
(:mod:`.shardformat`).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CorruptShard
from .shardformat import GZIP_ERRORS, cut_gzip, open_stream, read_range, shown

__all__ = ["SKIPPED", "index_lines", "line_samples"]

CHUNK = 8 << 20
SKIPPED: Any = object()
"""What :func:`line_samples` gives for a JSON line that does not parse under
``on_error="skip"``."""


def index_lines(path: str, name: str, gz: bool, *, jsonl: bool) -> tuple[Any, Any]:
    """(starts, stops): each line's byte range, its newline (and a ``\\r``
    before it) left out; for ``jsonl``, empty lines left out.

    Raises:
        CorruptShard: a gzip stream cut short or damaged.
    """
    import numpy as np

    starts: list[Any] = []
    stops: list[Any] = []
    at, begin, before = 0, 0, 0  # before: the last byte of the previous chunk
    try:
        with open_stream(path, gz) as fh:
            while True:
                chunk = fh.read(CHUNK)
                if not chunk:
                    break
                data = np.frombuffer(chunk, dtype=np.uint8)
                ends = np.flatnonzero(data == 10)
                if len(ends):
                    # a "\r" before the newline is no part of the line
                    prior = np.where(ends > 0, data[np.maximum(ends - 1, 0)], before)
                    stop = ends + at
                    starts.append(np.concatenate([[begin], stop[:-1] + 1]))
                    stops.append(stop - (prior == 13))
                    begin = int(stop[-1]) + 1
                at += len(chunk)
                before = int(data[-1])
    except GZIP_ERRORS as exc:
        raise cut_gzip(name, exc) from None
    if at > begin:  # a last line without a newline
        starts.append(np.array([begin]))
        stops.append(np.array([at - (before == 13)]))
    start = np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64)
    stop = np.concatenate(stops).astype(np.int64) if stops else np.zeros(0, np.int64)
    stop = np.maximum(stop, start)  # a line of just "\r"
    if jsonl:
        keep = stop > start
        start, stop = start[keep], stop[keep]
    return start, stop


def line_samples(path: str, gz: bool, starts: Any, stops: Any, name: str, *, jsonl: bool,
                 on_error: str, errors: list[tuple[str, int]]) -> list[Any]:
    """The samples of lines ``[starts[i], stops[i])``, read with one range
    read: parsed JSON values, or ``str``s. Under ``on_error="skip"`` a JSON
    line that does not parse is :data:`SKIPPED` and ``(name, line number)`` is
    appended to ``errors``.

    Raises:
        CorruptShard: a JSON line that does not parse (``on_error="raise"``),
            or text that is not UTF-8; each names the shard and line number.
    """
    if not len(starts):
        return []
    base = int(starts[0])
    data = read_range(path, gz, base, int(stops[-1]), name)
    out: list[Any] = []
    for lo, hi in zip(starts.tolist(), stops.tolist(), strict=True):
        raw = data[lo - base:hi - base]
        if jsonl:
            try:
                out.append(json.loads(raw))
            except ValueError as exc:
                line = line_number(path, gz, lo)
                if on_error == "skip":
                    errors.append((name, line))
                    out.append(SKIPPED)
                    continue
                why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
                raise CorruptShard(f"line {line:,} of shard {shown(name)} is not valid JSON "
                                   f"({why})",
                                   hint='fix or remove the line, or pass on_error="skip" to '
                                        "count and skip such lines") from None
        else:
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise CorruptShard(f"line {line_number(path, gz, lo):,} of shard {shown(name)} "
                                   "is not UTF-8 text") from None
    return out


def line_number(path: str, gz: bool, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` (an error's
    message; counts the newlines before it)."""
    before = read_range(path, gz, 0, offset, path) if offset else b""
    return before.count(b"\n") + 1
