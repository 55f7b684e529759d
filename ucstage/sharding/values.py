"""The slot rule's inputs as values: a job's :class:`Layout`, a :class:`Slot`
of it, and a :class:`ReadOrder`. Each is validated once, when built, so the
functions that take them check nothing again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgument

__all__ = ["DEFAULT_SHUFFLE_SCOPE", "EQUAL_LENGTH_MODES", "SHUFFLE_SCOPES", "Layout",
           "ReadOrder", "Slot", "effective_workers", "node_count", "node_ranks", "slot_count",
           "workers_per_rank"]

SHUFFLE_SCOPES = ("node", "global")
DEFAULT_SHUFFLE_SCOPE = "node"
"""Shuffling keeps each node's files by default: its cache serves every epoch."""
EQUAL_LENGTH_MODES = ("pad", "drop")


def effective_workers(num_workers: int) -> int:
    """Reading processes per rank: ``num_workers=0`` means the main process reads."""
    return max(1, num_workers)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_world(world_size: int) -> None:
    if not _is_int(world_size) or world_size < 1:
        raise InvalidArgument(f"world_size must be at least 1, got {world_size}")


def _workers_spec(num_workers: int | Sequence[int], world_size: int) -> int | tuple[int, ...]:
    """Checked ``num_workers``: one int for every rank, or a tuple of one per rank.

    One value stays one int, so a layout with a huge ``world_size`` never holds
    a per-rank list of it.
    """
    _check_world(world_size)
    if _is_int(num_workers):
        values: list[int] = [num_workers]  # type: ignore[list-item]
    elif isinstance(num_workers, Sequence) and not isinstance(num_workers, str):
        values = list(num_workers)
    else:
        values = []
    if not values or not all(_is_int(v) for v in values):
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
    return tuple(values)


def _check_nproc_value(nproc_per_node: int | None) -> None:
    if nproc_per_node is not None and (not _is_int(nproc_per_node) or nproc_per_node < 1):
        raise InvalidArgument(f"nproc_per_node must be an int of at least 1, "
                              f"got {nproc_per_node!r}")


def _check_nproc(world_size: int, nproc_per_node: int | None) -> None:
    _check_nproc_value(nproc_per_node)
    if nproc_per_node is not None and world_size % nproc_per_node:
        raise InvalidArgument(
            f"world_size {world_size} is not a multiple of nproc_per_node {nproc_per_node}",
            hint="every node runs nproc_per_node ranks (torchrun's nproc-per-node option)")


@dataclass(frozen=True)
class Layout:
    """A job's shape: ``world_size`` ranks, each with ``num_workers`` DataLoader
    workers, ``nproc_per_node`` ranks per node (None: the whole job is one node).

    ``num_workers`` is one int for every rank, or (to diagnose a mismatch, as
    ``shard-plan -k 6,4`` does) one per rank; a one-value sequence is that int.
    ``num_workers=0`` (the main process reads) counts as one worker.

    Raises:
        InvalidArgument: a world size below 1, a negative or ill-typed worker
            count, per-rank counts not one per rank, or ``nproc_per_node``
            below 1 or not dividing ``world_size``.
    """

    world_size: int
    num_workers: int | Sequence[int] = 0
    """One for every rank, or a tuple of one per rank (a sequence given becomes a tuple)."""
    nproc_per_node: int | None = None

    def __post_init__(self) -> None:
        _check_nproc_value(self.nproc_per_node)
        spec = _workers_spec(self.num_workers, self.world_size)
        object.__setattr__(self, "num_workers", spec)
        _check_nproc(self.world_size, self.nproc_per_node)

    @property
    def uniform(self) -> bool:
        """Every rank runs the same ``num_workers``."""
        return isinstance(self.num_workers, int)

    def workers_of(self, rank: int) -> int:
        """The ``num_workers`` rank ``rank`` runs with (as given: 0 stays 0)."""
        return self.num_workers if isinstance(self.num_workers, int) \
            else self.num_workers[rank]

    def readers_of(self, rank: int) -> int:
        """Reading processes of rank ``rank``: ``max(1, num_workers)``."""
        return effective_workers(self.workers_of(rank))

    @property
    def workers(self) -> int:
        """Reading processes per rank (one ``num_workers`` for every rank)."""
        if not isinstance(self.num_workers, int):
            raise InvalidArgument(f"the ranks run different num_workers {list(self.num_workers)}")
        return effective_workers(self.num_workers)

    @property
    def slots(self) -> int:
        """Every (rank, worker) slot of the job."""
        if isinstance(self.num_workers, int):
            return self.world_size * effective_workers(self.num_workers)
        return sum(effective_workers(k) for k in self.num_workers)

    @property
    def ranks_per_node(self) -> int:
        """``nproc_per_node``, or the whole job's ranks with one node."""
        return self.nproc_per_node if self.nproc_per_node is not None else self.world_size

    @property
    def nodes(self) -> int:
        """How many nodes the job runs on."""
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node rank ``rank`` runs on, as torchrun numbers them (0 with one node)."""
        return rank // self.ranks_per_node

    def slot(self, rank: int, worker: int) -> Slot:
        """Slot ``(rank, worker)`` of this layout.

        Raises:
            InvalidArgument: no such rank or worker in this layout.
        """
        if not _is_int(rank) or not 0 <= rank < self.world_size:
            raise InvalidArgument(f"rank {rank} is outside 0..{self.world_size - 1}")
        readers = self.readers_of(rank)
        if not _is_int(worker) or not 0 <= worker < readers:
            raise InvalidArgument(f"worker {worker} is outside 0..{readers - 1}")
        return Slot(rank, worker)

    def slot_index(self, slot: Slot) -> int:
        """The slot's number ``rank * workers + worker`` (one ``num_workers`` for all)."""
        return slot.rank * self.workers + slot.worker

    def slot_at(self, index: int) -> Slot:
        """The slot numbered ``index`` (one ``num_workers`` for all)."""
        return Slot(*divmod(index, self.workers))

    @classmethod
    def one_node(cls, nproc_per_node: int | None) -> Layout | None:
        """One node of ``nproc_per_node`` ranks (None for None): checks a ranks-per-node
        setting before the world size it will divide is known."""
        return None if nproc_per_node is None else cls(nproc_per_node, 0, nproc_per_node)


@dataclass(frozen=True)
class Slot:
    """One reader of a job: DataLoader worker ``worker`` of rank ``rank``
    (worker 0 is the main process with ``num_workers=0``). Build one checked
    against its job with :meth:`Layout.slot`."""

    rank: int
    worker: int = 0

    # No check of its own: a slot is only valid in a layout (Layout.slot checks
    # it there, and plan functions say which slots their layout has).

    def __str__(self) -> str:
        return f"{self.rank}:{self.worker}"


@dataclass(frozen=True)
class ReadOrder:
    """What decides which files an epoch reads in which order, besides the layout.

    ``n`` files in listing order, or (``shuffle``) a permutation seeded by
    ``seed`` and ``epoch``; ``shuffle_scope`` ``"node"`` keeps each node's
    files across epochs, ``"global"`` deals one permutation over the whole
    job; ``equal_length`` ``"pad"`` or ``"drop"`` gives every slot the same
    count, None reads the plain rule.

    Raises:
        InvalidArgument: a negative ``n``, an unknown scope or equal-length mode.
    """

    n: int
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    equal_length: str | None = None
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE

    def __post_init__(self) -> None:
        if self.n < 0:
            raise InvalidArgument(f"n must be 0 or more, got {self.n}")
        if self.shuffle_scope not in SHUFFLE_SCOPES:
            raise InvalidArgument(
                f"shuffle_scope must be one of {SHUFFLE_SCOPES}, got {self.shuffle_scope!r}")
        if self.equal_length is not None and self.equal_length not in EQUAL_LENGTH_MODES:
            raise InvalidArgument(
                f"equal_length must be one of {EQUAL_LENGTH_MODES}, got {self.equal_length!r}")

    def per_node(self, layout: Layout) -> bool:
        """Whether nodes deal from their own orders (else every rank deals from one)."""
        return self.shuffle and self.shuffle_scope == "node" and layout.nodes > 1

    def with_n(self, n: int) -> ReadOrder:
        """The same order over ``n`` files."""
        return ReadOrder(n, self.shuffle, self.seed, self.epoch, self.equal_length,
                         self.shuffle_scope)


def slot_count(world_size: int, num_workers: int | Sequence[int]) -> int:
    """How many (rank, worker) slots a job has: ``world_size * max(1, num_workers)``,
    or, with one ``num_workers`` per rank, the sum of each rank's readers."""
    if _is_int(num_workers) and num_workers >= 0:  # type: ignore[operator]
        _check_world(world_size)
        return world_size * effective_workers(num_workers)  # type: ignore[arg-type]
    return Layout(world_size, num_workers).slots  # type: ignore[arg-type]


def workers_per_rank(num_workers: int | Sequence[int], world_size: int) -> list[int]:
    """``num_workers`` for every rank: one int for all, or exactly one per rank.

    The library takes ints only; the CLI parses comma lists (``-k 6,4``).
    """
    spec = _workers_spec(num_workers, world_size)
    return [spec] * world_size if isinstance(spec, int) else list(spec)


def node_count(world_size: int, nproc_per_node: int | None) -> int:
    """How many nodes a job of ``world_size`` ranks has: ``world_size //
    nproc_per_node``, or 1 when ``nproc_per_node`` is None (the whole job is one node).

    Raises:
        InvalidArgument: ``nproc_per_node`` is below 1 or does not divide ``world_size``.
    """
    _check_world(world_size)
    _check_nproc(world_size, nproc_per_node)
    return 1 if nproc_per_node is None else world_size // nproc_per_node


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
