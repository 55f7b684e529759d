"""Checkpoints through the stage: torch.distributed.checkpoint storage for
local and mounted folders and object stores (``Writer``, ``Reader``; where:
:mod:`.place`), and the checkpoints of a
folder (listed, verified, pruned: :mod:`.folder`, :mod:`.retention`; the
newest complete one: ``latest``).

``Writer`` and ``Reader`` import torch, so they load on first use: ``ucstage
checkpoint list`` never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .retention import latest

__all__ = ["Reader", "Writer", "latest"]

if TYPE_CHECKING:  # pragma: no cover
    from .reader import Reader
    from .writer import Writer


def __getattr__(name: str) -> Any:
    if name == "Writer":
        from .writer import Writer
        return Writer
    if name == "Reader":
        from .reader import Reader
        return Reader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
