"""The shapes and types of public parameters, checked once when an object is
built: one rule each, used by every class and function that takes one.

* **Strings** (:func:`strings`): a parameter that takes several names,
  globs or suffixes (``include``, ``exclude``, ``require``, ``columns``)
  takes a single ``str`` whole, as click and fsspec do: ``include="*.jpg"``
  is ``include=("*.jpg",)``, never the characters ``*``, ``.``, ``j``...
  Any other iterable must hold only ``str``; ``None`` is empty.
* **Whole numbers** (:func:`whole`): an ``int`` (numpy integers too), never a
  ``bool`` or a ``float`` such as ``2.5`` (``2.0`` neither: a count is typed
  as one), at least ``minimum``.
* **Sizes** (:func:`size`): bytes as a whole number, or the same size
  strings as the CLI's ``--max-bytes`` (``"500M"``, ``"1.5G"``: powers of
  1024, :func:`ucstage.units.parse_size`).

Every refusal is an :class:`~ucstage.errors.InvalidArgument` naming the
parameter, raised at construction rather than as a ``TypeError`` mid-epoch.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

from .errors import InvalidArgument
from .units import SIZE_HELP, parse_size

__all__ = ["size", "size_string", "strings", "whole"]


def _kind(value: Any) -> str:
    return type(value).__name__


def strings(value: str | Iterable[str] | None, name: str) -> tuple[str, ...]:
    """``value`` as a tuple of str: a single str whole, ``None`` as empty.

    Raises:
        InvalidArgument: ``value`` is neither a str nor an iterable of str
            (bytes included: a name is text), naming ``name`` and the first
            item that is not a str.
    """
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise InvalidArgument(f"{name} must be a str or a list of str, got {_kind(value)} "
                              f"{bytes(value)!r}", hint=f"pass {name}={bytes(value).decode(errors='replace')!r}")
    try:
        items = tuple(value)
    except TypeError:
        raise InvalidArgument(f"{name} must be a str or a list of str, got {_kind(value)} "
                              f"{value!r}") from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidArgument(f"{name}[{i}] must be a str, got {_kind(item)} {item!r}")
    return items


def whole(value: Any, name: str, minimum: int | None = 0) -> int:
    """``value`` as an int of at least ``minimum`` (None: any).

    Raises:
        InvalidArgument: a bool, a float (even ``2.0``), a str or anything
            else that is not an integer, or one below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be a whole number, got {_kind(value)} {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        what = {0: "0 or more", 1: "1 or more"}.get(minimum, f"at least {minimum}")
        raise InvalidArgument(f"{name} must be {what}, got {number}")
    return number


def size_string(value: str, name: str, fix: str) -> int:
    """The bytes of the size string ``value`` (``"500M"``), which the
    caller calls ``name`` (a parameter, a variable).

    Raises:
        InvalidArgument: not a size, named ``name=value``; the hint is
            ``fix`` and the size syntax.
    """
    try:
        return parse_size(value)
    except InvalidArgument:
        raise InvalidArgument(f"{name}={value!r} is not a size",
                              hint=f"{fix}; {SIZE_HELP}") from None


def size(value: Any, name: str) -> int:
    """A positive byte count: a whole number, or a size string (``"500M"``).

    Raises:
        InvalidArgument: not a whole number or a size string, or not positive.
    """
    if isinstance(value, str):
        number = size_string(value, name, "pass a number of bytes or e.g. 500M, 20G")
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be a number of bytes or a size such as '500M', "
                              f"got {_kind(value)} {value!r}")
    else:
        number = int(value)
    if number < 1:
        raise InvalidArgument(f"{name} must be positive, got {value!r}")
    return number
