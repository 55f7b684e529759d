"""The slot rule's inputs as values: a job's :class:`Layout`, a :class:`Slot`
of it, and a :class:`ReadOrder`. Each is validated once, when built, so the
functions that take them check nothing again. :class:`World` is where the
calling process sits in its job, the one reader of the environment that says so."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument

__all__ = ["DEFAULT_SHUFFLE_SCOPE", "EQUAL_LENGTH_MODES", "LOCAL_WORLD_SIZE", "SHUFFLE_SCOPES",
           "Layout", "ReadOrder", "Slot", "World", "layout_of"]

SHUFFLE_SCOPES = ("node", "global")
DEFAULT_SHUFFLE_SCOPE = "node"
"""Shuffling keeps each node's files by default: its cache serves every epoch."""
EQUAL_LENGTH_MODES = ("pad", "drop")
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
"""Set by torchrun on every rank: the ranks on its node."""


def _readers(num_workers: int) -> int:
    """Reading processes of a rank: ``num_workers=0`` means the main process reads."""
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
        return _readers(self.workers_of(rank))

    def workers_per_rank(self) -> list[int]:
        """The ``num_workers`` of every rank, as given (the CLI's ``-k 6,4`` checked
        against its ``-w``)."""
        spec = self.num_workers
        return [spec] * self.world_size if isinstance(spec, int) else list(spec)

    @property
    def readers_agree(self) -> bool:
        """Every rank runs as many reading processes (``num_workers`` 0 and 1 agree):
        only then do the slots partition a read order, each file read once."""
        return isinstance(self.num_workers, int) or \
            len({_readers(k) for k in self.num_workers}) == 1

    @functools.cached_property
    def workers(self) -> int:
        """Reading processes per rank (one ``num_workers`` for every rank)."""
        if not isinstance(self.num_workers, int):
            raise InvalidArgument(f"the ranks run different num_workers {list(self.num_workers)}")
        return _readers(self.num_workers)

    @functools.cached_property
    def rules(self) -> dict[tuple[Any, ...], Any]:
        """The :class:`~ucstage.sharding.rule.SlotRule` of each slot and read
        order worked out so far (:meth:`~ucstage.sharding.rule.SlotRule.of`)."""
        return {}

    @functools.cached_property
    def slots(self) -> int:
        """Every (rank, worker) slot of the job."""
        if isinstance(self.num_workers, int):
            return self.world_size * _readers(self.num_workers)
        return sum(_readers(k) for k in self.num_workers)

    @functools.cached_property
    def ranks_per_node(self) -> int:
        """``nproc_per_node``, or the whole job's ranks with one node."""
        return self.nproc_per_node if self.nproc_per_node is not None else self.world_size

    @functools.cached_property
    def nodes(self) -> int:
        """How many nodes the job runs on."""
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node rank ``rank`` runs on, as torchrun numbers them (0 with one node)."""
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        """Rank ``rank``'s place among its node's ranks (torchrun's ``LOCAL_RANK``)."""
        return rank % self.ranks_per_node

    def node_ranks(self, node: int) -> range:
        """The ranks on node ``node``, as torchrun assigns them: ``node *
        ranks_per_node`` up to the next node's first rank.

        Raises:
            InvalidArgument: no such node in this layout.
        """
        if not _is_int(node) or node < 0:
            raise InvalidArgument(f"node_rank must be 0 or more, got {node}")
        per = self.ranks_per_node
        if node >= self.nodes:
            raise InvalidArgument(f"node {node} x {per} ranks per node covers rank "
                                  f"{(node + 1) * per - 1}, outside world_size {self.world_size}")
        return range(node * per, (node + 1) * per)

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


layout_of = functools.lru_cache(maxsize=64, typed=True)(Layout)
"""``Layout(world_size, num_workers, nproc_per_node)`` (one int ``num_workers``,
positional) checked once per shape: a layout never changes, so a dataset's
every epoch deals by the same one."""


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
class World:
    """Where the calling process sits in its job, as its environment says:
    :meth:`detect` is the one place that reads it.

    ``rank`` of ``world_size`` (rank 0 of 1 without a process group); ``worker``
    of the ``num_workers`` of the DataLoader this process is a worker of (0 of
    0 in a main process, which reads as worker 0); torchrun's
    ``$LOCAL_WORLD_SIZE`` as set (checked where it is used, by
    :attr:`local_ranks`, so a bad value fails what needs it and nothing else)
    and the run this process belongs to (``$TORCHELASTIC_RUN_ID``, when
    ``$LOCAL_RANK`` says torchrun started it). ``$RANK`` and ``$WORLD_SIZE`` are
    not read: without a process group the ranks share nothing, so each is a
    job of one.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 0
    local_world_size: str | None = None
    """``$LOCAL_WORLD_SIZE`` as set (None: unset or empty)."""
    torchrun_run: str | None = None

    @classmethod
    def detect(cls, carried: tuple[int, int] | None = None) -> World:
        """The calling process's world.

        Rank and world size come from ``torch.distributed`` when a process group
        is initialised; in a DataLoader worker without one (started by spawn),
        from ``carried``: the (rank, world size) its dataset was pickled with.
        Worker and count come from ``torch.utils.data.get_worker_info()``.
        torch is looked for in ``sys.modules``, never imported: no process group
        or DataLoader worker exists before it is (and the core stays torch-free).
        """
        dist = sys.modules.get("torch.distributed")
        tud = sys.modules.get("torch.utils.data")
        info = tud.get_worker_info() if tud is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        elif info is not None and carried is not None:
            rank, world_size = carried
        else:
            rank, world_size = 0, 1
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 0)
        env = os.environ
        run = env.get("TORCHELASTIC_RUN_ID") if env.get("LOCAL_RANK") is not None else None
        return cls(rank, world_size, worker, num_workers, env.get(LOCAL_WORLD_SIZE) or None,
                   run or None)

    @property
    def in_worker(self) -> bool:
        """This process is a DataLoader worker (else a main process, reading itself)."""
        return self.num_workers > 0

    @property
    def local_ranks(self) -> int | None:
        """Ranks on this node, from ``$LOCAL_WORLD_SIZE`` (None: unset).

        Raises:
            InvalidArgument: it is set but not a whole number of at least 1.
        """
        text = self.local_world_size
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise InvalidArgument(
                f"${LOCAL_WORLD_SIZE} must be a whole number of at least 1, got {text!r}",
                hint="torchrun sets it to the ranks on each node: unset it, or pass "
                     "nproc_per_node explicitly")
        return value

    def node_readers(self, num_workers: int) -> int:
        """Readers sharing this node's cache: its ranks (``$LOCAL_WORLD_SIZE``, else
        this one alone) x each rank's reading processes for ``num_workers``."""
        return layout_of(self.local_ranks or 1, num_workers, None).slots


@dataclass(frozen=True)
class ReadOrder:
    """What decides which files an epoch reads in which order, besides the layout.

    ``n`` files in listing order, or (``shuffle``) a permutation seeded by
    ``seed`` and ``epoch``; ``shuffle_scope`` ``"node"`` keeps each node's
    files across epochs, ``"global"`` deals one permutation over the whole
    job; ``equal_length`` ``"pad"`` or ``"drop"`` gives every slot the same
    count, None reads the plain rule.

    ``groups`` (optional, int64 array summing to ``n``): the items come in
    runs that shuffle as one, e.g. a shard's blocks (the shard manifest's
    :meth:`~ucstage.manifest.shardsamples.ShardManifest.read_order` sets it).
    With ``shuffle`` the runs are permuted and each keeps its items together
    (:class:`~ucstage.sharding.order.GroupedOrder`). It follows from the
    listing, so it is neither compared nor saved in a state.

    Raises:
        InvalidArgument: a negative ``n``, an unknown scope or equal-length mode.
    """

    n: int
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    equal_length: str | None = None
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE
    groups: Any = field(default=None, compare=False, repr=False)

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
        """The same order over ``n`` files (without ``groups``, which were another
        listing's)."""
        return ReadOrder(n, self.shuffle, self.seed, self.epoch, self.equal_length,
                         self.shuffle_scope)

