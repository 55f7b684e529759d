"""The base of every wrapper of the loader's iterator on its way to the
training loop (the timing, the tag stripping, the loop's position): torch's
iterator's length and attributes (``_num_yielded``, ...) show through, so
code that reaches into torch's iterator keeps working."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["Wrapping"]

W = TypeVar("W", bound="Wrapping")


class Wrapping:
    """A wrapper of the loader's iterator: ``__iter__``, ``__len__`` and
    every other attribute are the wrapped iterator's (``_inner``); a
    subclass sets ``_inner`` and defines ``__next__``."""

    _inner: Iterator[Any]

    def __iter__(self: W) -> W:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet: the subclass's __init__ failed
            raise AttributeError(name)
        return getattr(self._inner, name)
