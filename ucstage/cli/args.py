"""Parsing of the CLI's list-valued flags into what the library takes.

The library speaks Python (``plan(num_workers=[6, 4])``); comma lists are a
command-line convenience, so they are parsed here and nowhere else. Errors
name the flag, since the person reading them typed it: directly, or, where
the check is the library's (``parse_modes``), through the CLI's error mapper.
"""

from __future__ import annotations

import math
from typing import Any

import click

from ..bench import check_modes
from ..errors import InvalidArgument
from ..units import parse_size

__all__ = ["Seconds", "column_list", "float_list", "int_list", "num_workers_list", "parse_modes", "parse_workers", "size_flag"]


def column_list(value: str | None) -> list[str] | None:
    """``"id,text"`` -> ``["id", "text"]`` (None stays None); an empty name is refused."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if any(not p for p in parts):
        raise InvalidArgument(f"empty column name in {value!r}",
                              hint="separate column names with single commas")
    return parts


def int_list(text: str, flag: str, *, minimum: int, example: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; every value a whole number >= ``minimum``."""
    tokens = [t.strip() for t in text.split(",")]
    if not any(tokens):
        raise InvalidArgument(f"{flag} is empty; give e.g. {example}")
    values: list[int] = []
    for token in tokens:
        try:
            value = int(token)
        except ValueError:
            value = None
        if value is None or value < minimum or str(value) != token.lstrip("+"):
            kind = "positive whole numbers" if minimum == 1 else f"whole numbers >= {minimum}"
            raise InvalidArgument(f"{flag} must be {kind} separated by commas, e.g. {example}; "
                                  f"got {token!r}")
        values.append(value)
    return values


def float_list(text: str, flag: str, *, example: str) -> list[float]:
    """``"0.7,0.3"`` -> ``[0.7, 0.3]``; the library checks the values' ranges."""
    values: list[float] = []
    for token in (t.strip() for t in text.split(",")):
        try:
            values.append(float(token))
        except ValueError:
            raise InvalidArgument(f"{flag} must be numbers separated by commas, e.g. {example}; "
                                  f"got {token!r}") from None
    return values


def num_workers_list(text: str) -> list[int]:
    """``-k 6`` or ``-k 6,4``: one value for every rank, or one per rank."""
    return int_list(text, "--num-workers", minimum=0, example="6 or 6,6,4,6")


def parse_workers(text: str) -> list[int]:
    """``bench -w 4,1,2`` -> ``[1, 2, 4]``: whole numbers, deduplicated, ascending.

    0 parses (DataLoader ``num_workers=0`` in loader mode); the library refuses
    it for the thread modes, knowing which modes run.
    """
    return sorted(set(int_list(text, "--workers", minimum=0, example="1,2,4,8")))


def parse_modes(text: str) -> list[str]:
    """``bench -m warm,direct`` -> ``["direct", "warm"]``, in measuring order.

    The names are checked by the library, the one list of modes; its message
    says ``modes``, which the CLI's error mapper turns into ``--modes``.
    """
    return check_modes(text.split(","))


def size_flag(value: str | None, flag: str) -> int | None:
    """A size flag (``500M``, ``20G``) in bytes; None when not given. A bad
    value's error names ``flag`` (an option, or the variable it came from)."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{flag}: {exc.message}", exc.hint) from None


class Seconds(click.FloatRange):
    """A number of seconds: finite, and in range. click's ``FloatRange`` lets
    ``nan`` through (no comparison with nan is true) and ``inf`` too; both
    reached the library as a value it then refused per request (or
    overflowed on), so they are refused here, naming the flag (exit 2)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(number, param, ctx)
