"""The slot rule, shard plans, their statistics and mismatch diagnosis.

One package, one concept per module:

* :mod:`.rule`: the slot rule: its inputs as values, each validated once when
  built (a job's :class:`Layout`: ranks, workers per rank, ranks per node; a
  :class:`Slot` of it; a :class:`ReadOrder`: files, shuffle, seed, epoch,
  scope, equal length), the rule itself (:func:`~.rule.stride`,
  :func:`slot_array`) and what is counted by it (:func:`slot_length`,
  :func:`rank_entries`);
* :mod:`.order`: read orders (:class:`~.order.Permutation`, :class:`~.order.NodeOrder`, :class:`~.order.GroupedOrder`);
* :mod:`.plan` and :mod:`.stats`: whole-job plans (:func:`shard_plan`);
* :mod:`.forecast`: the network over several epochs;
* :mod:`.resplit`: resuming an interrupted epoch on another layout.

``ucstage shard-plan``, ``ucstage cache warm --rank`` and
:class:`ucstage.VolumeDataset` all call the one rule, so what the plan prints
is what training reads.

The rule (the platform's documented one): files in listing order, or in a
permutation seeded by ``seed`` and ``epoch`` that is the same on every rank
(:class:`Permutation`: a keyed bijection, so one slot's files cost only that
slot's arithmetic, never a list of every file);
``slots = world_size * num_workers``; slot ``s = rank * num_workers + worker``
reads files ``s, s + slots, s + 2 * slots, ...``. ``num_workers = 0`` (the main
process reads) counts as one worker.

Shuffle scope (with ``shuffle``): under ``"global"`` every rank deals from the
one permutation above. Under ``"node"`` (the default) the job is cut into nodes
of ``nproc_per_node`` ranks (``node = rank // nproc_per_node``, as torchrun
numbers ranks); files are assigned to nodes once per seed, in balanced blocks
of a seeded permutation, and each epoch permutes each node's block and deals it
over that node's ranks x workers with the same rule. With one node (no
``nproc_per_node``) both scopes are exactly the rule above.
"""

from __future__ import annotations

# What other packages and users import; the rest is imported from its module.
from .forecast import Forecast, forecast
from .order import Permutation
from .plan import ShardPlan, shard_plan, slot_plan
from .resplit import Segment, epoch_slot_length, resume_slots, segment_runs
from .rule import (
    DEFAULT_SHUFFLE_SCOPE,
    SHUFFLE_SCOPES,
    Layout,
    ReadOrder,
    Slot,
    World,
    rank_entries,
    rank_length,
    slot_array,
    slot_length,
)
from .stats import SlotPlan

__all__ = [
    "DEFAULT_SHUFFLE_SCOPE",
    "SHUFFLE_SCOPES",
    "Forecast",
    "Layout",
    "Permutation",
    "ReadOrder",
    "Segment",
    "ShardPlan",
    "Slot",
    "SlotPlan",
    "World",
    "epoch_slot_length",
    "forecast",
    "rank_entries",
    "rank_length",
    "resume_slots",
    "segment_runs",
    "shard_plan",
    "slot_array",
    "slot_length",
    "slot_plan",
]
