"""The slot rule: its inputs as values, and which files one (rank, worker)
slot reads, and how many.

The values: a job's :class:`Layout`, a :class:`Slot` of it and a
:class:`ReadOrder`, each validated once when built (so the functions that
take them check nothing again); :class:`World` is where the calling process
sits in its job, the one reader of the environment that says so.

Slot ``(rank, worker)`` of a group of ranks that deals one read order (the
whole job, or one node under the ``"node"`` shuffle scope) reads positions
``start, start + step, ...`` of it: :func:`stride` is the only place that
arithmetic lives, and :meth:`Stride.positions` the only place of the
equal-length wrap. A slot's part of the rule is worked out once per layout
(:meth:`SlotRule.of`); an epoch only deals it (:meth:`SlotRule.array`). The
plan, the forecast, the resume re-split, the cache's ``rank_entries`` and
the dataset all call them.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import numpy as np

from ..errors import InvalidArgument
from .order import GroupedOrder, NodeOrder, Permutation, node_block, node_deals, node_members

__all__ = ["DEFAULT_SHUFFLE_SCOPE", "EQUAL_LENGTH_MODES", "LOCAL_WORLD_SIZE", "SHUFFLE_SCOPES",
           "Dealing", "Layout", "ReadOrder", "Slot", "SlotRule", "Stride", "World",
           "equal_count", "layout_of", "rank_entries", "rank_length", "slot_array",
           "slot_dealing", "slot_length", "stride"]

T = TypeVar("T")

SHUFFLE_SCOPES = ("node", "global")
DEFAULT_SHUFFLE_SCOPE = "node"
"""Shuffling keeps each node's files by default: its cache serves every epoch."""
EQUAL_LENGTH_MODES = ("pad", "drop")
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
"""Set by torchrun on every rank: the ranks on its node."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Layout:
    """A job's shape: ``world_size`` ranks, each with ``num_workers`` DataLoader
    workers, ``nproc_per_node`` ranks per node (None: the whole job is one node).

    ``num_workers`` is one int for every rank, or (to diagnose a mismatch, as
    ``shard-plan -k 6,4`` does) one per rank; a one-value sequence is that int.
    ``num_workers=0`` (the main process reads) counts as one worker.

    What follows from the shape (:attr:`slots`, :attr:`ranks_per_node`,
    :attr:`nodes`, :attr:`uniform`) is worked out with the checks, once: a
    layout never changes.

    Raises:
        InvalidArgument: a world size below 1, a negative or ill-typed worker
            count, per-rank counts not one per rank, or ``nproc_per_node``
            below 1 or not dividing ``world_size``.
    """

    world_size: int
    num_workers: int | Sequence[int] = 0
    """One for every rank, or a tuple of one per rank (a sequence given becomes a tuple)."""
    nproc_per_node: int | None = None
    readers: int | tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Reading processes (``max(1, num_workers)``) of every rank, or of each rank."""
    slots: int = field(init=False, repr=False, compare=False)
    """Every (rank, worker) slot of the job."""
    ranks_per_node: int = field(init=False, repr=False, compare=False)
    """``nproc_per_node``, or the whole job's ranks with one node."""
    nodes: int = field(init=False, repr=False, compare=False)
    """How many nodes the job runs on."""
    uniform: bool = field(init=False, repr=False, compare=False)
    """Every rank runs the same ``num_workers``."""
    rules: dict[tuple[Any, ...], Any] = field(init=False, repr=False, compare=False,
                                              default_factory=dict)
    """The :class:`SlotRule` of each slot and read order worked out so far
    (:meth:`SlotRule.of`)."""

    def __post_init__(self) -> None:
        world, nproc, spec = self.world_size, self.nproc_per_node, self.num_workers
        if nproc is not None and (not _is_int(nproc) or nproc < 1):
            raise InvalidArgument(f"nproc_per_node must be an int of at least 1, got {nproc!r}")
        if not _is_int(world) or world < 1:
            raise InvalidArgument(f"world_size must be at least 1, got {world}")
        # One value stays one int, so a layout with a huge world_size never
        # holds a per-rank list of it.
        if _is_int(spec):
            values: list[int] = [spec]  # type: ignore[list-item]
        elif isinstance(spec, Sequence) and not isinstance(spec, str):
            values = list(spec)
        else:
            values = []
        if not values or not all(map(_is_int, values)):
            raise InvalidArgument(f"num_workers must be an int or a non-empty sequence of ints, "
                                  f"got {spec!r}")
        if min(values) < 0:
            raise InvalidArgument(f"num_workers must be 0 or more, got {min(values)}")
        if len(values) != 1 and len(values) != world:
            raise InvalidArgument(
                f"num_workers lists {len(values)} values but world_size is {world}",
                hint="give one value for all ranks, or exactly one per rank",
            )
        if nproc is not None and world % nproc:
            raise InvalidArgument(
                f"world_size {world} is not a multiple of nproc_per_node {nproc}",
                hint="every node runs nproc_per_node ranks (torchrun's nproc-per-node option)")
        uniform = len(values) == 1
        per_node = nproc if nproc is not None else world
        # Reading processes: num_workers=0 means the main process reads.
        readers = max(1, values[0]) if uniform else tuple(max(1, k) for k in values)
        put = functools.partial(object.__setattr__, self)
        put("num_workers", values[0] if uniform else tuple(values))
        put("uniform", uniform)
        put("readers", readers)
        put("slots", world * readers if isinstance(readers, int) else sum(readers))
        put("ranks_per_node", per_node)
        put("nodes", world // per_node)

    def workers_of(self, rank: int) -> int:
        """The ``num_workers`` rank ``rank`` runs with (as given: 0 stays 0)."""
        return self.num_workers if isinstance(self.num_workers, int) \
            else self.num_workers[rank]

    def readers_of(self, rank: int) -> int:
        """Reading processes of rank ``rank``: ``max(1, num_workers)``."""
        readers = self.readers
        return readers if isinstance(readers, int) else readers[rank]

    def workers_per_rank(self) -> list[int]:
        """The ``num_workers`` of every rank, as given (the CLI's ``-k 6,4`` checked
        against its ``-w``)."""
        spec = self.num_workers
        return [spec] * self.world_size if isinstance(spec, int) else list(spec)

    @property
    def readers_agree(self) -> bool:
        """Every rank runs as many reading processes (``num_workers`` 0 and 1 agree):
        only then do the slots partition a read order, each file read once."""
        return isinstance(self.readers, int) or len(set(self.readers)) == 1

    @functools.cached_property
    def workers(self) -> int:
        """Reading processes per rank (one ``num_workers`` for every rank)."""
        readers = self.readers
        if not isinstance(readers, int):
            raise InvalidArgument(f"the ranks run different num_workers {self.workers_per_rank()}")
        return readers

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
        """The slot's number ``rank * workers + worker`` (one ``num_workers`` for all:
        :attr:`workers` refuses per-rank counts)."""
        readers = self.readers
        return slot.rank * (readers if isinstance(readers, int) else self.workers) + slot.worker

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




@dataclass(frozen=True)
class Stride:
    """A slot's positions in the read order its group deals: ``start``,
    ``start + step``, ..."""

    start: int
    step: int

    def length(self, m: int) -> int:
        """Positions below ``m`` (files the slot reads of an order of ``m``)."""
        return len(range(self.start, m, self.step))

    def positions(self, m: int, count: int | None = None) -> np.ndarray:
        """The slot's positions in an order of ``m`` (int64).

        With ``count`` (equal length), exactly ``count`` positions: ``"pad"``
        continues the rule past the end, position ``p`` reading ``p % m``
        (so a few files from the start are read twice, as
        ``DistributedSampler`` pads); none when the order is empty.
        """
        import numpy as np

        if count is None:
            return np.arange(self.start, m, self.step, dtype=np.int64)
        pos = (self.start + self.step * np.arange(count, dtype=np.int64)) % max(m, 1)
        return pos if m else pos[:0]


def stride(layout: Layout, slot: Slot, *, per_node: bool) -> Stride:
    """Where ``slot`` of ``layout`` reads: the slot rule.

    ``per_node``: the slot's node deals its own order over its ranks x workers
    (the ``"node"`` scope with several nodes); else the whole job deals one.
    Each rank applies the rule with its own ``num_workers``, exactly as a
    rank given that value would (a mismatch then reads files twice or never).
    """
    k = layout.readers_of(slot.rank)
    if per_node:
        return Stride(layout.local_rank(slot.rank) * k + slot.worker, layout.ranks_per_node * k)
    return Stride(slot.rank * k + slot.worker, layout.world_size * k)


def equal_count(n: int, slots: int, equal_length: str | None) -> int | None:
    """Files every slot reads with ``equal_length`` (None without): counted over
    the whole job's ``slots``, so every rank of every node gets the same count."""
    if equal_length is None:
        return None
    return n // slots if equal_length == "drop" else -(-n // slots)


@dataclass(frozen=True)
class Dealing:
    """How one slot reads in one epoch: positions ``start``, ``start + step``,
    ... (below ``len(order)``) of ``order``, the read order its node deals from."""

    order: Sequence[int]
    start: int
    step: int
    node: int
    nodes: int

    @property
    def stride(self) -> Stride:
        return Stride(self.start, self.step)

    @property
    def length(self) -> int:
        """Files the slot reads (without ``equal_length``)."""
        return self.stride.length(len(self.order))


def slot_dealing(order: ReadOrder, layout: Layout, slot: Slot, *,
                 deals_from: Sequence[int] | None = None) -> Dealing:
    """Where ``slot`` reads from in one epoch: the slot rule with the scope.

    A slot's file at step ``i`` is ``deals_from[start + i * step]``; a resumed
    epoch can skip the first steps by arithmetic alone. Pass ``deals_from``
    (:func:`node_order` of the slot's node) to reuse it for the node's slots.
    """
    rule = SlotRule.of(order, layout, slot)
    if deals_from is None:
        deals_from = rule.deals_from(order)
    return Dealing(deals_from, rule.stride.start, rule.stride.step, rule.node, layout.nodes)


@dataclass(frozen=True)
class SlotRule:
    """One slot's part of the slot rule, checked and worked out once for a
    layout and the parts of a read order that no epoch changes (its size,
    shuffle, scope and equal-length mode): where it reads (``stride``), its
    node, whether that node deals its own order (``nodes``: the layout's
    node count then, else 0) and the equal-length ``count``. :meth:`array`
    deals one epoch; :meth:`of` keeps each rule on its layout, so a dataset's
    per-epoch path checks nothing again."""

    stride: Stride
    node: int
    nodes: int
    count: int | None
    n: int

    @staticmethod
    def of(order: ReadOrder, layout: Layout, slot: Slot) -> SlotRule:
        """The rule of ``slot`` of ``layout`` over ``order`` (any epoch).

        Raises:
            InvalidArgument: the slot is outside the layout.
        """
        # Kept on the layout by plain values: hashing a Layout or a Slot per
        # epoch would cost more than the rule it saves.
        key = (slot.rank, slot.worker, order.n, order.shuffle, order.shuffle_scope,
               order.equal_length)
        found = layout.rules.get(key)
        if found is None:  # worked out (``order``'s epoch plays no part)
            layout.slot(slot.rank, slot.worker)  # refuses a slot outside the layout
            per_node = order.per_node(layout)
            count = equal_count(order.n, layout.slots, order.equal_length) \
                if order.n and order.equal_length is not None else None
            found = layout.rules[key] = SlotRule(
                stride(layout, slot, per_node=per_node), layout.node_of(slot.rank),
                layout.nodes if per_node else 0, count, order.n)
        return found

    def deals_from(self, order: ReadOrder) -> Sequence[int]:
        """The read order this slot's node deals from in ``order``'s epoch."""
        return _deals(order, self.node, self.nodes)

    def array(self, order: ReadOrder, deals_from: Sequence[int] | None = None) -> np.ndarray:
        """:func:`slot_array` of ``order``'s epoch."""
        if deals_from is None:
            if not order.shuffle:  # the read order is the listing: positions are rows
                return self.stride.positions(order.n, self.count)
            deals_from = self.deals_from(order)
        m = len(deals_from)
        if self.count and not m:
            raise InvalidArgument(
                f'equal_length="pad" needs a file on every node: {self.n} files, '
                f'{self.nodes} nodes', hint='use fewer nodes, or equal_length="drop"')
        # m: the files the slot's node deals (the whole job's with one node).
        return _pick(deals_from, self.stride.positions(m, self.count))


def _deals(order: ReadOrder, node: int, nodes: int) -> Sequence[int]:
    """:func:`node_order` of a node already checked against its layout:
    ``nodes`` is the layout's node count when nodes deal their own orders
    (:meth:`ReadOrder.per_node`), else 0 (every node deals the job's)."""
    return node_deals(order.n, node, nodes, shuffle=order.shuffle, seed=order.seed,
                      epoch=order.epoch, groups=order.groups)


def node_order(order: ReadOrder, layout: Layout, node: int) -> Sequence[int]:
    """The read order node ``node``'s slots deal from in one epoch
    (:func:`~ucstage.sharding.order.node_deals`): under the ``"node"`` scope
    with several nodes and ``shuffle``, the node's own; otherwise the whole
    job's, which every node deals from."""
    layout.node_ranks(node)  # refuses a node outside the layout
    return _deals(order, node, layout.nodes if order.per_node(layout) else 0)


def node_share(n: int, layout: Layout, node: int, *, seed: int = 0,
               groups: np.ndarray | None = None) -> np.ndarray:
    """The files (sorted listing rows) node ``node`` of ``layout`` reads under the
    ``"node"`` scope with ``shuffle``: the same in every epoch, so warming them
    serves every epoch. With one node, every file. ``groups``: as for
    :func:`~ucstage.sharding.order.read_order`."""
    import numpy as np

    layout.node_ranks(node)  # refuses a node outside the layout
    if layout.nodes == 1:
        return np.arange(n, dtype=np.int64)
    return node_members(n, node, layout.nodes, seed=seed, groups=groups)


def _pick(order: Sequence[int], positions: np.ndarray) -> np.ndarray:
    """``order[p]`` for each read-order position in ``positions``, as int64,
    computed for those positions only (a permutation is never materialised)."""
    import numpy as np

    if isinstance(order, range):
        return order.start + positions * order.step
    if isinstance(order, (Permutation, NodeOrder, GroupedOrder)):
        return order.take(positions)
    if isinstance(order, np.ndarray):
        return order[positions].astype(np.int64, copy=False)
    return np.asarray([order[int(p)] for p in positions], dtype=np.int64)


def slot_array(order: ReadOrder, layout: Layout, slot: Slot, *,
               deals_from: Sequence[int] | None = None) -> np.ndarray:
    """The listing rows ``slot`` reads in one epoch, in read order, as an int64
    array: no Python object per file, and with a shuffle only this slot's
    positions are permuted. Pass ``deals_from`` (:func:`node_order` of the
    slot's node) to avoid recomputing a permutation for every slot.

    With ``order.equal_length`` every slot reads the same count, so every rank
    gets the same number of batches and DDP does not hang at the end of an
    epoch waiting for a rank with one more:

    * ``"drop"``: every slot reads ``n // slots`` files; the last ``n % slots``
      files of the read order are skipped this epoch (with ``shuffle`` a
      different few each epoch).
    * ``"pad"``: every slot reads ``ceil(n / slots)`` files; a slot one short
      continues the slot rule past the end of the read order, wrapping around
      (position ``p`` reads ``order[p % n]``), so a few files from the start of
      the read order are read twice, as ``DistributedSampler`` pads.

    Under the ``"node"`` scope with several nodes, ``slots`` still counts the
    whole job's, and the read order is the node's.
    """
    return SlotRule.of(order, layout, slot).array(order, deals_from)


def slot_length(order: ReadOrder, layout: Layout, slot: Slot) -> int:
    """How many files ``slot`` reads in one epoch: ``len`` of :func:`slot_array`,
    without building it (``order.seed`` and ``order.epoch`` change no count)."""
    layout.slot(slot.rank, slot.worker)
    if order.equal_length is not None:
        count = equal_count(order.n, layout.slots, order.equal_length)
        return count if order.n and count else 0
    per_node = order.per_node(layout)
    m = len(node_block(order.n, layout.node_of(slot.rank), layout.nodes)) if per_node \
        else order.n
    return stride(layout, slot, per_node=per_node).length(m)


def rank_length(order: ReadOrder, layout: Layout, rank: int) -> int:
    """How many files rank ``rank`` reads over all its workers (see :func:`slot_length`)."""
    return sum(slot_length(order, layout, layout.slot(rank, w))
               for w in range(layout.readers_of(rank)))


def rank_entries(entries: Sequence[T], ranks: Sequence[int], layout: Layout,
                 order: ReadOrder) -> list[T]:
    """The entries that ``ranks`` of ``layout`` read under the slot rule, in listing order.

    Calls :func:`slot_array` for every worker of every rank, the function
    ``shard-plan`` and the dataset use. With ``shuffle`` under the ``"node"``
    scope, a node's files are the same every epoch: the whole share of every
    node holding one of ``ranks`` (:func:`node_share`), whatever the epoch.
    ``order.n`` is ``len(entries)``; its ``equal_length`` is not applied.
    """
    order = order.with_n(len(entries)) if order.n != len(entries) else order
    wanted: set[int] = set()
    if order.shuffle and order.shuffle_scope == "node":
        for node in sorted({layout.node_of(rank) for rank in ranks}):
            wanted.update(node_share(order.n, layout, node, seed=order.seed,
                                     groups=order.groups).tolist())
        return [entries[i] for i in sorted(wanted)]
    plain = replace(order, equal_length=None)
    for rank in ranks:
        layout.slot(rank, 0)
        deals_from = node_order(plain, layout, layout.node_of(rank))
        for worker in range(layout.readers_of(rank)):
            wanted.update(slot_array(plain, layout, Slot(rank, worker),
                                     deals_from=deals_from).tolist())
    return [entries[i] for i in sorted(wanted)]
