"""A shard plan with the sample as its unit (``ucstage shard-plan --unit
sample``): each slot's shards and sample ranges, as
:class:`~ucstage.data.shardset.ShardDataset` deals them.

The slot rule deals a shard manifest's blocks
(:class:`~ucstage.manifest.shardsamples.ShardManifest`) through
:func:`ucstage.sharding.shard_plan`, over the manifest's own read order
(:meth:`ShardManifest.read_order`, the one the dataset reads), so the plan
and the dataset cannot part; the equal-length count is
:func:`ucstage.tables.rowplan.equal_batches`'s, one sample per batch, as the
dataset counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .errors import InvalidArgument
from .manifest.shardsamples import ShardManifest
from .sharding import Layout, ReadOrder, ShardPlan, shard_plan
from .sharding.stats import SlotPlan
from .tables.rowplan import EQUAL_MODES, equal_batches

__all__ = ["SamplePlan", "SampleRange", "plan_samples"]


@dataclass(frozen=True)
class SampleRange:
    """Samples ``first`` up to ``stop`` (numbers within the shard) of shard ``shard``
    (its index in the manifest's files), read as one run of the slot's blocks."""

    shard: int
    first: int
    stop: int


@dataclass(frozen=True)
class SamplePlan:
    """Which blocks, shards and samples every slot reads (``plan``'s units are
    blocks; ``slot_samples[i]`` goes with ``plan.slots[i]``)."""

    manifest: ShardManifest
    plan: ShardPlan
    slot_samples: list[int]
    equal_length: str | None
    equal: int | None
    """Samples every slot yields with ``equal_length``; None without."""

    def ranges(self, slot: SlotPlan) -> list[SampleRange]:
        """The slot's sample ranges in read order, consecutive blocks of one
        shard joined into one range."""
        out: list[SampleRange] = []
        m = self.manifest
        for block in slot.indices.tolist():
            shard = m.block_file(block)
            first, stop = m.file_range(block)
            if out and out[-1].shard == shard and out[-1].stop == first:
                out[-1] = SampleRange(shard, out[-1].first, stop)
            else:
                out.append(SampleRange(shard, first, stop))
        return out

    @cached_property
    def slot_shards(self) -> list[int]:
        """Distinct shards each slot opens."""
        import numpy as np

        files = np.asarray(self.manifest.sample_file)[np.asarray(self.manifest.block_first)]
        return [len(set(files[s.indices].tolist())) for s in self.plan.slots]

    @property
    def problems(self) -> list[str]:
        """What is wrong with the plan, in words (empty when all is well)."""
        return self.plan.coverage_problems("blocks", "no sample")

    def spread(self, values: list[int]) -> dict[str, float]:
        """min / mean / max over every slot of the job, the empty ones as zeros."""
        if not values:
            return {"min": 0, "mean": 0.0, "max": 0}
        low = 0 if self.plan.empty.count else min(values)
        return {"min": low, "mean": sum(values) / self.plan.layout.slots, "max": max(values)}

    def to_json(self) -> dict[str, Any]:
        """The plan as docs/json.md#shard-plan---unit-sample documents it."""
        m, p = self.manifest, self.plan
        layout, order = p.layout, p.order
        paths = [e.path for e in m.files]
        return {
            "unit": "sample",
            "source": m.source,
            "fingerprint": m.fingerprint,
            "shards": len(m.files),
            "samples": m.samples,
            "blocks": len(m),
            "block_samples": m.block_samples,
            "world_size": layout.world_size,
            "num_workers": layout.workers_per_rank(),
            "shuffle": order.shuffle, "shuffle_scope": order.shuffle_scope,
            "nproc_per_node": layout.nproc_per_node, "node_count": layout.nodes,
            "seed": order.seed, "epoch": order.epoch,
            "equal_length": self.equal_length,
            "samples_per_slot_equal": self.equal,
            "consistent": p.consistent,
            "summary": {
                "slots": layout.slots,
                "samples_per_slot": self.spread(self.slot_samples),
                "shards_per_slot": self.spread(self.slot_shards),
            },
            "slots": [{"rank": s.rank, "worker": s.worker, "node": s.node,
                       "blocks": s.count, "samples": n, "shards": k,
                       "ranges": [{"shard": paths[r.shard], "first": r.first, "stop": r.stop}
                                  for r in self.ranges(s)]}
                      for s, n, k in zip(p.slots, self.slot_samples, self.slot_shards,
                                         strict=True)],
            "empty_slots": p.empty.to_json() if p.empty.count else None,
        }


def plan_samples(manifest: ShardManifest, layout: Layout, order: ReadOrder, *,
                 equal_length: str | None = None) -> SamplePlan:
    """Plan which samples of ``manifest`` every slot of ``layout`` reads in
    ``order`` (its shuffle, seed, epoch and scope; ``order.n`` is ignored:
    the manifest's blocks are dealt); with ``equal_length`` (``"pad"`` or
    ``"drop"``) the samples every slot yields.

    Raises:
        InvalidArgument: an unknown ``equal_length``, or ``"pad"`` with a
            slot that has no sample.
    """
    import numpy as np

    if equal_length is not None and equal_length not in EQUAL_MODES:
        raise InvalidArgument(f"equal_length must be one of {', '.join(EQUAL_MODES)}, "
                              f"got {equal_length!r}")
    dealt = manifest.read_order(order)
    rows = np.asarray(manifest.rows_per_group, dtype=np.int64)
    planned = shard_plan(rows, layout, dealt)  # a block's "bytes": its samples
    slot_samples = [int(rows[s.indices].sum()) for s in planned.slots]
    equal = equal_batches([*slot_samples, *[0] * planned.empty.count], 1, equal_length)
    return SamplePlan(manifest, planned, slot_samples, equal_length, equal)
