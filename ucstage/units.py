"""Human sizes: parse ``500M``/``20G`` and format byte counts."""

from __future__ import annotations

import re

from .errors import InvalidArgument

__all__ = ["format_bytes", "parse_size"]

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Parse a byte size: ``1048576``, ``500M``, ``20G``, ``1.5GiB`` (powers of 1024)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise InvalidArgument(
            f"cannot read size {text!r}", hint="use a number of bytes or e.g. 500M, 20G, 1.5T"
        )
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.upper()])


def format_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"  # pragma: no cover
