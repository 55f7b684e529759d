"""The shard-plan request: what ``ucstage shard-plan`` takes, its rules
between options checked once, and the one dispatch to its five modes.

A :class:`PlanRequest` holds the options as given, None (or False, or empty)
for one not given, so that a rule such as "``seed`` only matters with
``shuffle``" tells a choice from a default. Building it checks every rule
that needs no listing; :meth:`PlanRequest.plan` reads the sources and plans:

* a **mix** (several sources, ``weights``, ``repeat`` or ``epoch_size``):
  :func:`ucstage.sharding.mixing.mix_plan` -> ``MixPlan``;
* **row groups** (``unit="row-group"``): the table's row groups by
  :func:`ucstage.tables.slots.plan_row_groups` -> ``RowGroupPlan``;
* **samples** (``unit="sample"``): the shards' samples, indexed as
  ``ShardDataset`` indexes them (:func:`read_shards`), by
  :func:`ucstage.sampleplan.plan_samples` -> ``SamplePlan``;
* a **resume** (``resume`` names a saved loader state): the rest of the epoch,
  :func:`ucstage.resume.resume_plan` -> :class:`ResumeFiles`;
* one **slot** (``slot``): its files in read order -> :class:`SlotFiles`;
* the **files** of every slot (samples with ``group``), and with ``epochs``
  the network forecast under both shuffle scopes -> :class:`FilePlan`.

Messages name parameters, as everywhere in the library; the CLI's one error
mapper says them as the command's flags.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .cache.local import env_max_bytes
from .cache.paths import default_root
from .cache.space import free_bytes
from .errors import InvalidArgument
from .manifest.groups import Grouping, split_name
from .manifest.model import Manifest, group_manifest
from .resume import ResumePlan, SlotRest, load_state, resume_plan
from .sharding.forecast import Forecast, forecast
from .sharding.mixing import MixPlan, mix_plan, mix_shares
from .sharding.plan import ShardPlan, shard_plan, slot_plan
from .sharding.rule import DEFAULT_SHUFFLE_SCOPE, SHUFFLE_SCOPES, Layout, ReadOrder, Slot
from .sharding.stats import SlotPlan
from .source import snapshot
from .volumes.entry import FileEntry

if TYPE_CHECKING:
    from .manifest.rowgroups import RowGroupManifest
    from .manifest.shardsamples import ShardManifest
    from .sampleplan import SamplePlan
    from .tables.slots import RowGroupPlan

__all__ = ["FILE_ONLY", "MIX_REFUSED", "PLAN_UNITS", "ROW_GROUP_ONLY", "SAMPLE_ONLY",
           "SAMPLE_REFUSED", "UNITS", "FilePlan", "ItemNames", "PlanRequest", "ResumeFiles",
           "SlotFiles", "check_unit", "disk_free", "read_row_groups", "read_shards", "scope_of"]

UNITS = ("file", "row-group")
"""What ``cache warm`` warms by (shards are warmed as files)."""
PLAN_UNITS = (*UNITS, "sample")
"""What ``shard-plan`` deals: files, a table's row groups, or shards' samples."""
SAMPLE_ONLY = ("format", "block_samples")
"""What means something only with ``unit="sample"``."""
SAMPLE_REFUSED = ("include_hidden", "batch_size", "slot", "resume", "epochs", "max_bytes",
                  "group", "batch_rows", "columns", "version", "filter")
"""What a sample plan does not take (``equal_length`` counts samples there)."""
ROW_GROUP_ONLY = ("batch_rows", "equal_length", "columns", "version", "filter")
"""What means something only with ``unit="row-group"``."""
FILE_ONLY = ("include", "exclude", "include_hidden", "batch_size", "slot", "resume", "epochs",
             "max_bytes", "group")
"""What a file plan takes and a row-group plan does not."""
MIX_REFUSED = ("manifest_path", "shuffle", "shuffle_scope", "epochs", "max_bytes", "batch_size",
               "slot", "resume", "group", "unit", "batch_rows", "equal_length", "columns",
               "version", "filter")
"""What plans one source and a mix does not take (each source's read order is the mix's)."""

ReadFiles = Callable[[str | None, str | None, Sequence[str], Sequence[str], bool], Manifest]
"""``(source, manifest_path, include, exclude, include_hidden)`` -> the files."""
ReadTable = Callable[[str | None, str | None, int | None, str | None], "RowGroupManifest"]
"""``(source, manifest_path, version, filter)`` -> the table's row groups."""
ReadShards = Callable[[str | None, str | None, Sequence[str], Sequence[str], str | None, int | None],
                      "ShardManifest"]
"""``(source, manifest_path, include, exclude, format, block_samples)`` -> the shards' samples."""


def _names(names: Sequence[str]) -> str:
    return " and ".join(f"`{n}`" for n in names)


def _unset(value: Any) -> bool:
    """Not given: None, False or empty (0 is a value given)."""
    return value is None or value is False or value == ()


def scope_of(scope: str | None, shuffle: bool) -> str:
    """The scope to plan with (None: the default); refuses a scope without
    ``shuffle``, where it would silently change nothing."""
    if scope is not None and not shuffle:
        raise InvalidArgument("shuffle_scope only matters with `shuffle`",
                              hint="add `shuffle`, or leave shuffle_scope out")
    return scope or DEFAULT_SHUFFLE_SCOPE


def check_unit(unit: str, given: Collection[str], file_only: Sequence[str] = FILE_ONLY,
               row_group_only: Sequence[str] = ROW_GROUP_ONLY) -> None:
    """Refuse the options ``given`` that do not go with ``unit`` (``"file"``
    or ``"row-group"``), all of them in one message."""
    if unit == "file":
        wrong = [n for n in row_group_only if n in given]
        if wrong:
            raise InvalidArgument(f"{_names(wrong)} only apply to `unit` row-group",
                                  hint="add `unit` row-group, or leave them out")
        return
    wrong = [n for n in file_only if n in given]
    if wrong:
        hint = ("use `batch_rows` for rows per batch" if "batch_size" in wrong else
                "a table is read whole by row group: give `columns` to choose columns")
        raise InvalidArgument(f"{_names(wrong)} do not apply to `unit` row-group", hint=hint)


def read_shards(source: str | None, manifest_path: str | None = None,
                include: Sequence[str] = (), exclude: Sequence[str] = (),
                format: str | None = None, block_samples: int | None = None) -> ShardManifest:
    """The samples of a shard ``source``, every shard fetched into this
    machine's default cache and indexed as ``ShardDataset`` indexes them
    (:func:`ucstage.shardfiles.sourceindex.index_source`); or a saved
    ``.shards.arrow`` (``manifest_path``, which wins)."""
    from .cache.local import LocalCache
    from .manifest.shardsamples import ShardManifest
    from .shardfiles.shardformat import format_of
    from .shardfiles.sourceindex import DEFAULT_BLOCK_SAMPLES, index_source

    if manifest_path is not None:
        given = [n for n, v in (("include", include), ("exclude", exclude), ("format", format),
                                ("block_samples", block_samples)) if not _unset(v)]
        if given:
            raise InvalidArgument(f"{_names(given)} choose how shards are indexed; a frozen "
                                  "shard manifest already is", hint="leave them out")
        from .manifest import load
        return load(manifest_path, kind=ShardManifest)
    if source is None:
        raise InvalidArgument("give a shard `source` or a `manifest_path`")
    if format is not None:
        format_of("", format)  # checks the name before any fetch
    return index_source(source, fetch=LocalCache().fetch, format=format, include=include,
                        exclude=exclude, block_samples=DEFAULT_BLOCK_SAMPLES
                        if block_samples is None else block_samples)


def read_row_groups(source: str | None, manifest_path: str | None = None,
                    version: int | None = None, filter: str | None = None
                    ) -> RowGroupManifest:
    """The row groups of a table ``source`` (at Delta ``version``, those that
    can hold a row ``filter`` matches), or of a saved ``.rowgroups.arrow``
    (``manifest_path``, which wins)."""
    from .manifest.rowgroups import RowGroupManifest
    from .tables.row_groups import row_groups

    if manifest_path is not None:
        given = [n for n, v in (("version", version), ("filter", filter)) if v is not None]
        if given:
            raise InvalidArgument(f"{_names(given)} choose what a table lists; a frozen "
                                  "row-group manifest already is listed",
                                  hint="pass the table itself")
        from .manifest import load
        return load(manifest_path, kind=RowGroupManifest)
    if source is None:
        raise InvalidArgument("give a table `source` or a `manifest_path`")
    return row_groups(source, version=version, filter=filter)


def _read_files(source: str | None, manifest_path: str | None, include: Sequence[str],
                exclude: Sequence[str], include_hidden: bool) -> Manifest:
    return snapshot(source, manifest=manifest_path, include=include, exclude=exclude,
                    include_hidden=include_hidden)


class ItemNames:
    """``names[i]``: the path of file ``i``, or the key of sample ``i`` of a
    grouped manifest, made per access (a plan names a few; a million-file
    listing is never turned into names it does not print)."""

    def __init__(self, manifest: Manifest) -> None:
        self._manifest = manifest

    def __getitem__(self, index: int) -> str:
        groups, entries = self._manifest.groups, self._manifest.entries
        if groups is None:
            return entries[int(index)].path
        return split_name(entries[int(groups.offsets[int(index)])].path)[0]

    def __len__(self) -> int:
        groups = self._manifest.groups
        return len(self._manifest.entries) if groups is None else groups.count


def _item_sizes(manifest: Manifest) -> Any:
    """Bytes per item: per file, or per sample of a grouped manifest."""
    sizes = manifest.sizes()
    return sizes if manifest.groups is None else manifest.groups.sample_sizes(sizes)


@dataclass(frozen=True)
class FilePlan:
    """Every slot's files (or samples) and, with ``epochs``, the forecast."""

    manifest: Manifest
    plan: ShardPlan
    scope: str
    cap: int | None
    """The node cache cap the forecast is checked against (None: not checked)."""
    forecasts: dict[str, Forecast] = field(default_factory=dict)
    """Per shuffle scope, the chosen one first (empty without ``epochs``): the
    forecast shows what the other scope costs."""

    @property
    def names(self) -> ItemNames:
        return ItemNames(self.manifest)

    @property
    def forecast(self) -> Forecast | None:
        """The forecast of the chosen scope (None without ``epochs``)."""
        return self.forecasts.get(self.scope)

    @property
    def fits(self) -> bool:
        """Every node's share fits under :attr:`cap` (True without a forecast)."""
        return self.forecast is None or self.forecast.fits(self.cap)

    def grouping(self) -> dict[str, Any] | None:
        """The samples and member files per slot (None when not grouped)."""
        groups = self.manifest.groups
        if groups is None:
            return None
        members = groups.members()
        per_slot = [{"rank": s.rank, "worker": s.worker, "samples": len(s.indices),
                     "members": int(members[s.indices].sum())} for s in self.plan.slots]
        counts = [s["members"] for s in per_slot] or [0]
        return {"by": groups.by, "samples": groups.count, "members": len(self.manifest.entries),
                "members_per_slot": {"min": min(counts), "mean": sum(counts) / len(counts),
                                     "max": max(counts)},
                "slots": per_slot}

    def to_json(self) -> dict[str, Any]:
        """docs/json.md#shard-plan: it names every file."""
        m = self.manifest
        paths: Any = m.paths() if m.groups is None else self.names
        doc = self.plan.to_json(paths, source=m.source, fingerprint=m.fingerprint)
        grouping = self.grouping()
        if grouping is not None:
            doc["grouping"] = grouping
        if self.forecasts:
            first = self.forecasts[self.scope]
            root, free = disk_free()
            doc["forecast"] = {
                "epochs": len(first.epochs), "first_epoch": first.epochs[0],
                "shuffle_scope": self.scope, "max_bytes": self.cap, "cache_dir": root,
                "disk_free": free,
                "scopes": {name: f.to_json(self.cap) for name, f in self.forecasts.items()}}
        return doc


def disk_free() -> tuple[str, int]:
    """This machine's cache folder and the free bytes of its disk (of the
    nearest existing parent): where a node's share lands, if this is a node."""
    root = path = default_root()
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return root, free_bytes(path)


@dataclass(frozen=True)
class SlotFiles:
    """One slot's files in read order (its samples' members with ``group``)."""

    manifest: Manifest
    slot: SlotPlan

    @cached_property
    def files(self) -> list[FileEntry]:
        groups = self.manifest.groups
        rows = self.slot.indices if groups is None else groups.rows(self.slot.indices)
        return self.manifest.take(rows)  # only this slot's rows

    def to_json(self) -> dict[str, Any]:
        s = self.slot
        return {"rank": s.rank, "worker": s.worker, "node": s.node,
                "files": [e.path for e in self.files], "bytes": s.bytes}


@dataclass(frozen=True)
class ResumeFiles:
    """What every slot (or one) of the new layout reads to finish a saved epoch."""

    manifest: Manifest
    rest: ResumePlan
    slots: list[SlotRest]
    """Every slot's rest, or the one slot asked for."""
    batch_size: int | None
    one_slot: bool

    def to_json(self) -> dict[str, Any]:
        """docs/json.md#shard-plan---resume (one slot's document with ``slot``)."""
        m, rest, state = self.manifest, self.rest, self.rest.state
        doc: dict[str, Any] = {
            "source": m.source,
            "fingerprint": m.fingerprint,
            "files": len(m.entries),
            "epoch": state.order.epoch,
            "shuffle": state.order.shuffle,
            "seed": state.order.seed,
            "shuffle_scope": state.order.shuffle_scope,
            "equal_length": state.order.equal_length,
            "saved_layout": {"world_size": state.last.layout.world_size,
                             "num_workers": state.last.layout.num_workers,
                             "nproc_per_node": state.last.layout.nproc_per_node},
            "world_size": rest.layout.world_size,
            "num_workers": rest.layout.num_workers,
            "mode": "continue" if rest.continued else "resplit",
            "resumed_files": state.delivered,
            "remaining_files": sum(len(s.files) for s in self.slots),
            "batch_size": self.batch_size,
            "ranks": ResumePlan(state, rest.layout, rest.continued,
                                self.slots).rank_totals(self.batch_size),
            "slots": [{"rank": s.rank, "worker": s.worker,
                       "files": [e.path for e in m.take(s.files)], "bytes": s.bytes}
                      for s in self.slots],
        }
        return doc["slots"][0] if self.one_slot else doc


@dataclass(frozen=True)
class PlanRequest:
    """What a shard plan is asked for; see the module's docstring for the
    modes. ``sources``: one SOURCE, or several for a mix (empty with
    ``manifest_path`` alone). ``seed``, ``epoch`` and ``unit`` are None when
    not given (0, 0 and ``"file"`` then).

    Raises:
        InvalidArgument: options that do not go together, naming them.
    """

    sources: tuple[str, ...] = ()
    manifest_path: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    include_hidden: bool = False
    world_size: int = 1
    num_workers: tuple[int, ...] = (0,)
    """One for every rank, or one per rank (to see what a mismatch does); an
    int is one for every rank."""
    nproc_per_node: int | None = None
    shuffle: bool = False
    seed: int | None = None
    epoch: int | None = None
    shuffle_scope: str | None = None
    epochs: int | None = None
    """Forecast the network over this many epochs from ``epoch``."""
    max_bytes: int | None = None
    """With ``epochs``: a node's cache cap (default ``$UCSTAGE_CACHE_MAX_BYTES``)."""
    batch_size: int | None = None
    slot: tuple[int, int] | None = None
    """(rank, worker): that slot's files only."""
    resume: str | None = None
    """A saved loader state (JSON) whose epoch to finish."""
    group: str | None = None
    unit: str | None = None
    batch_rows: int | None = None
    equal_length: str | None = None
    columns: tuple[str, ...] | None = None
    version: int | None = None
    filter: str | None = None
    """With ``unit="row-group"``: a row filter (``TableDataset(filter=...)``)."""
    weights: tuple[float, ...] | None = None
    repeat: tuple[float, ...] | None = None
    epoch_size: int | None = None
    format: str | None = None
    """With ``unit="sample"``: every file's shard format (default: by suffix)."""
    block_samples: int | None = None
    """With ``unit="sample"``: samples per block, as ``ShardDataset``'s."""
    cap: int | None = field(init=False, default=None)
    """The forecast's cap: ``max_bytes``, else the environment's (with ``epochs``)."""

    def __post_init__(self) -> None:
        workers = self.num_workers
        object.__setattr__(self, "num_workers",
                           (workers,) if isinstance(workers, int) else tuple(workers))
        if self.mode == "mix":
            self._check_mix()
            return
        if self.mode == "sample":
            self._check_samples()
            return
        wrong = self._given(SAMPLE_ONLY)
        if wrong:
            raise InvalidArgument(f"{_names(wrong)} only apply to `unit` sample",
                                  hint="add `unit` sample, or leave them out")
        check_unit(self.unit or "file", self._given(FILE_ONLY + ROW_GROUP_ONLY))
        if self.mode == "row-group":
            self._check_rows()
        else:
            self._check_files()

    @property
    def mode(self) -> str:
        """``"mix"``, ``"row-group"``, ``"sample"``, ``"resume"``, ``"slot"`` or ``"files"``."""
        if len(self.sources) > 1 or any(v is not None for v in
                                        (self.weights, self.repeat, self.epoch_size)):
            return "mix"
        if self.unit in ("row-group", "sample"):
            return self.unit
        if self.resume is not None:
            return "resume"
        return "files" if self.slot is None else "slot"

    @property
    def source(self) -> str | None:
        return self.sources[0] if self.sources else None

    @cached_property
    def layout(self) -> Layout:
        return Layout(self.world_size, self.num_workers, self.nproc_per_node)

    @property
    def scope(self) -> str:
        return scope_of(self.shuffle_scope, self.shuffle)

    def _given(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if not _unset(getattr(self, n))]

    def _check_mix(self) -> None:
        refused = self._given(MIX_REFUSED)
        if refused:
            raise InvalidArgument(f"{_names(refused)} plan one source; a mix (several SOURCEs, "
                                  "`weights`, `repeat` or epoch_size) does not take them",
                                  hint="give each manifest as a SOURCE; the mix deals its own "
                                       "order")
        if not self.layout.uniform:
            raise InvalidArgument("num_workers takes one value for every rank in a mix plan",
                                  hint="see what a mismatch does with one SOURCE")

    def _check_order(self) -> None:
        """``seed`` and ``epoch`` choose the permutation: without ``shuffle`` they
        change nothing, and a plan that ignores them is not the one meant."""
        given = self._given(("seed", "epoch"))
        if given and not self.shuffle:
            raise InvalidArgument("`seed`/`epoch` only matter with `shuffle`",
                                  hint=f"add `shuffle`, or leave {_names(given)} out")

    def _check_samples(self) -> None:
        wrong = self._given(SAMPLE_REFUSED)
        if wrong:
            raise InvalidArgument(f"{_names(wrong)} do not apply to `unit` sample",
                                  hint="a sample plan prints each slot's shards and sample "
                                       "ranges; give `equal_length` to count equal samples")
        self._check_order()
        scope_of(self.shuffle_scope, self.shuffle)
        if self.block_samples is not None and self.block_samples < 1:
            raise InvalidArgument(f"block_samples must be at least 1, got {self.block_samples}")

    def _check_rows(self) -> None:
        self._check_order()
        scope_of(self.shuffle_scope, self.shuffle)
        # Before the table is listed (plan_row_groups checks them again, after).
        if self.batch_rows is not None and self.batch_rows < 1:
            raise InvalidArgument(f"batch_rows must be at least 1, got {self.batch_rows}")
        if self.equal_length is not None and self.batch_rows is None:
            raise InvalidArgument("equal_length counts batches, so it needs batch_rows")

    def _check_files(self) -> None:
        if self.resume is not None:
            # The state decides the read order: a shuffle, seed or epoch
            # beside it would plan another epoch than the one resumed.
            given = ["shuffle"] * self.shuffle + self._given(
                ("seed", "epoch", "shuffle_scope", "epochs"))
            if given:
                raise InvalidArgument("`resume` takes shuffle, its scope, seed and epoch from "
                                      "the state", hint=f"leave {_names(given)} out")
        self._check_order()
        scope_of(self.shuffle_scope, self.shuffle)
        if self.slot is not None and self.epochs is not None:
            raise InvalidArgument("`epochs` forecasts the whole job; it does not combine "
                                  "with `slot`")
        if self.max_bytes is not None and self.epochs is None:
            raise InvalidArgument("max_bytes checks the forecast's node shares; it needs "
                                  "`epochs`")
        if self.epochs is not None:
            object.__setattr__(self, "cap", self.max_bytes if self.max_bytes is not None
                               else env_max_bytes())
        if self.group is not None and self.resume is not None:
            raise InvalidArgument("`resume` plans a file listing's state; it does not combine "
                                  "with `group` yet")
        if self.resume is not None and len(self.num_workers) != 1:
            raise InvalidArgument("`resume` takes one num_workers for every rank",
                                  hint="a resumed epoch is planned for one layout, e.g. -k 2")

    def _order(self, n: int) -> ReadOrder:
        return ReadOrder(n, self.shuffle, self.seed or 0, self.epoch or 0, None, self.scope)

    def plan(self, read_files: ReadFiles = _read_files, read_table: ReadTable = read_row_groups,
             read_samples: ReadShards = read_shards
             ) -> MixPlan | RowGroupPlan | SamplePlan | ResumeFiles | SlotFiles | FilePlan:
        """Read the sources and plan in the request's :attr:`mode`.

        ``read_files``, ``read_table`` and ``read_samples`` read a SOURCE
        (defaults: :func:`ucstage.source.snapshot`, :func:`read_row_groups`,
        :func:`read_shards`); the CLI's also warn about what a listing skipped.
        """
        mode = self.mode
        if mode == "sample":
            from .sampleplan import plan_samples

            layout = self.layout  # before the shards are fetched: a bad layout fails fast
            shards = read_samples(self.source, self.manifest_path, self.include, self.exclude,
                                  self.format, self.block_samples)
            return plan_samples(shards, layout, self._order(len(shards)),
                                equal_length=self.equal_length)
        if mode == "mix":
            manifests = [read_files(s, None, self.include, self.exclude, self.include_hidden)
                         for s in self.sources]
            shares = mix_shares([len(m) for m in manifests], self.weights, self.repeat,
                                self.epoch_size)
            return mix_plan(list(self.sources), shares, self.layout, seed=self.seed or 0,
                            epoch=self.epoch or 0)
        if mode == "row-group":
            from .tables.slots import plan_row_groups

            layout = self.layout  # before the listing: a bad layout fails fast
            table = read_table(self.source, self.manifest_path, self.version, self.filter)
            return plan_row_groups(table, layout, self._order(table.row_groups),
                                   columns=None if self.columns is None else list(self.columns),
                                   batch_rows=self.batch_rows, equal_length=self.equal_length)
        manifest = read_files(self.source, self.manifest_path, self.include, self.exclude,
                              self.include_hidden)
        if self.group is not None:
            manifest = group_manifest(manifest, Grouping(self.group))[0]
        if self.resume is not None:
            rest = resume_plan(load_state(self.resume), self.layout,
                               fingerprint=manifest.fingerprint, sizes=manifest.sizes())
            slots = rest.slots if self.slot is None else [rest.slot(*self.slot)]
            return ResumeFiles(manifest, rest, slots, self.batch_size, self.slot is not None)
        sizes = _item_sizes(manifest)  # numpy for a columnar manifest; per sample with group
        order = self._order(len(sizes))
        if self.slot is not None:
            return SlotFiles(manifest, slot_plan(sizes, self.layout, order, Slot(*self.slot)))
        planned = shard_plan(sizes, self.layout, order, batch_size=self.batch_size)
        scope = self.scope
        forecasts = {} if self.epochs is None else {
            name: forecast(sizes, self.layout, replace(order, shuffle_scope=name),
                           epochs=self.epochs)
            for name in sorted(SHUFFLE_SCOPES, key=lambda x: x != scope)}
        return FilePlan(manifest, planned, scope, self.cap, forecasts)
