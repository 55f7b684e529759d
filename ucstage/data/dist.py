"""The two ``torch.distributed`` calls the collectives need (the frozen listing's
broadcast, the loader's guard, the state's check); the rank and world size
themselves are read by :meth:`ucstage.sharding.World.detect`."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["active", "all_gather"]


def active() -> Any | None:
    """``torch.distributed`` when a process group is initialised, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def all_gather(dist: Any, value: Any) -> list[Any]:
    """Every rank's ``value``, indexed by rank (a collective: every rank must call it)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out
