"""The job's layout: ranks, workers per rank, nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

from ..errors import InvalidArgument


def effective_workers(num_workers: int) -> int:
    """Reading processes per rank: ``num_workers=0`` means the main process reads."""
    return max(1, num_workers)


def slot_count(world_size: int, num_workers: int | Sequence[int]) -> int:
    """How many (rank, worker) slots a job has: ``world_size * max(1, num_workers)``,
    or, with one ``num_workers`` per rank, the sum of each rank's readers."""
    if isinstance(num_workers, int) and not isinstance(num_workers, bool) and num_workers >= 0:
        _check_world(world_size)
        return world_size * effective_workers(num_workers)  # the hot path: one value for all
    spec = _workers_spec(num_workers, world_size)
    if isinstance(spec, int):
        return world_size * effective_workers(spec)
    return sum(effective_workers(k) for k in spec)


def node_ranks(node_rank: int, nproc_per_node: int, world_size: int) -> list[int]:
    """The ranks on node ``node_rank``, as torchrun assigns them: ranks
    ``node_rank * nproc_per_node`` up to the next node's first rank."""
    if nproc_per_node < 1:
        raise InvalidArgument(f"nproc_per_node must be at least 1, got {nproc_per_node}")
    if node_rank < 0:
        raise InvalidArgument(f"node_rank must be 0 or more, got {node_rank}")
    _check_world(world_size)
    ranks = list(range(node_rank * nproc_per_node, (node_rank + 1) * nproc_per_node))
    if ranks[-1] >= world_size:
        raise InvalidArgument(f"node {node_rank} x {nproc_per_node} ranks per node covers rank "
                              f"{ranks[-1]}, outside world_size {world_size}")
    return ranks


def _check_world(world_size: int) -> None:
    if world_size < 1:
        raise InvalidArgument(f"world_size must be at least 1, got {world_size}")


def _workers_spec(num_workers: int | Sequence[int], world_size: int) -> int | list[int]:
    """Checked ``num_workers``: one int for every rank, or a list of one per rank.

    One value stays one int, so a plan over a huge ``world_size`` never holds
    a per-rank list of it.
    """
    _check_world(world_size)
    if isinstance(num_workers, int) and not isinstance(num_workers, bool):
        values = [num_workers]
    elif isinstance(num_workers, Sequence) and not isinstance(num_workers, str):
        values = list(num_workers)
    else:
        values = []
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidArgument(f"num_workers must be an int or a non-empty sequence of ints, "
                              f"got {num_workers!r}")
    if any(v < 0 for v in values):
        raise InvalidArgument(f"num_workers must be 0 or more, got {min(values)}")
    if len(values) == 1:
        return values[0]
    if len(values) != world_size:
        raise InvalidArgument(
            f"num_workers lists {len(values)} values but world_size is {world_size}",
            hint="give one value for all ranks, or exactly one per rank",
        )
    return values


def workers_per_rank(num_workers: int | Sequence[int], world_size: int) -> list[int]:
    """``num_workers`` for every rank: one int for all, or exactly one per rank.

    The library takes ints only; the CLI parses comma lists (``-k 6,4``).
    """
    spec = _workers_spec(num_workers, world_size)
    return [spec] * world_size if isinstance(spec, int) else spec


def node_count(world_size: int, nproc_per_node: int | None) -> int:
    """How many nodes a job of ``world_size`` ranks has: ``world_size //
    nproc_per_node``, or 1 when ``nproc_per_node`` is None (the whole job is one node).

    Raises:
        InvalidArgument: ``nproc_per_node`` is below 1 or does not divide ``world_size``.
    """
    _check_world(world_size)
    if nproc_per_node is None:
        return 1
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) \
            or nproc_per_node < 1:
        raise InvalidArgument(f"nproc_per_node must be an int of at least 1, "
                              f"got {nproc_per_node!r}")
    if world_size % nproc_per_node:
        raise InvalidArgument(
            f"world_size {world_size} is not a multiple of nproc_per_node {nproc_per_node}",
            hint="every node runs nproc_per_node ranks (torchrun's --nproc-per-node)")
    return world_size // nproc_per_node
