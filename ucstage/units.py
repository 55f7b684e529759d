"""Human sizes and rates: the one parser and the one formatter.

Parsing: every size a person types means powers of 1024, whatever the suffix
says: ``1G``, ``1GB``, ``1GiB`` and ``1g`` are all 1024^3 bytes (:data:`SIZE_HELP`
is the one-line rule the CLI's ``--help`` shows). Formatting: IEC units for
everything a person reads (``KiB``, ``MiB``, ``GiB``; rates in ``MiB/s``).
JSON keeps raw numbers (``mb_per_s`` stays 10^6 bytes per second, as documented).
"""

from __future__ import annotations

import re

from .errors import InvalidArgument

__all__ = ["SIZE_HELP", "format_bytes", "format_rate", "parse_size"]

SIZE_HELP = "sizes are powers of 1024: 500M, 20G, 1.5T (1G = 1GB = 1GiB = 1024^3 bytes)"

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


def format_rate(bytes_per_s: float) -> str:
    """``3_145_728`` (bytes per second) -> ``3.0 MiB/s``."""
    return f"{format_bytes(bytes_per_s)}/s"
