""":class:`VolumeDataset`: a volume's files as local paths, sharded by the slot rule.

``VolumeDataset`` is an ``IterableDataset`` of local file paths: it shards a
frozen listing of a volume over ranks and DataLoader workers with the slot
rule of :mod:`ucstage.sharding` (the one ``ucstage shard-plan`` prints), and
copies each file into the local cache on first access, fetching the next few
files of its slot in the background. The DataLoader that runs it lives in
:mod:`ucstage.data.loader`.

Usage and every argument: docs/training.md.

How every rank gets the same listing (:mod:`ucstage.data.frozen`): the
listing is frozen once into a columnar manifest file under the cache root,
which every process opens memory-mapped; with ``torch.distributed`` rank 0
lists and broadcasts it (:meth:`VolumeDataset.freeze`, which the ucstage
DataLoader calls on every rank before starting workers). Or pass a manifest
(``ucstage cache lazy`` writes one) and no rank lists at all.

How a worker learns its slot: rank and world size from ``torch.distributed``
(in a forked worker its state is inherited; for spawned workers the values are
captured when the dataset is pickled), worker id and ``num_workers`` from
``torch.utils.data.get_worker_info()``; the main process (``num_workers=0``)
is worker 0 of 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import params
from ..errors import InvalidArgument
from ..manifest import Manifest
from ..manifest.groups import Grouping
from ..sharding import DEFAULT_SHUFFLE_SCOPE, slot_array
from ..volumes import FileEntry
from . import samples, slotread
from . import state as _state
from .channel import LoopView
from .frozen import FrozenListing
from .sharded import ShardedDataset, rule_order
from .slotread import AUTO, Share, check_read_ahead

if TYPE_CHECKING:
    from ..cache import LocalCache

__all__ = ["VolumeDataset"]

DEFAULT_READ_AHEAD = AUTO


class VolumeDataset(FrozenListing, ShardedDataset):
    """Local paths of a volume's files, sharded over ranks and workers, cached on first read.

    Args:
        source: a volume path (``/Volumes/...``), fsspec URL, local folder, a
            manifest file, or a :class:`ucstage.Manifest`. A manifest is used
            as frozen; anything else is listed once, on first use.
        include: keep only files matching any of these globs (``*.jpg``
            matches names at any depth; a glob with ``/`` matches the path);
            a single str is one glob.
        exclude: drop files matching any of these globs (a str: one glob).
        include_hidden: also list names starting with ``_`` or ``.``.
        skip_unreadable: list around folders that cannot be read (each is
            warned about through the ``ucstage`` logger) instead of raising
            :class:`ucstage.errors.UnreadableFolders`.
        shuffle: read in a permutation seeded by ``seed`` and the epoch (see
            :meth:`set_epoch`), identical on every rank.
        seed: shuffle seed.
        shuffle_scope: with ``shuffle``, ``"node"`` (default) assigns files to
            nodes once per seed and shuffles within each node every epoch, so a
            node's cache serves every epoch; ``"global"`` deals one permutation
            over the whole job (every epoch hands each node other files).
        nproc_per_node: ranks per node (node = rank // nproc_per_node); default
            ``$LOCAL_WORLD_SIZE`` (set by torchrun) when a process group is
            running, else the whole job is one node, where both scopes read
            exactly the same. ``world_size`` must be a multiple of it.
        read_ahead: how many files of this slot to fetch in the background
            ahead of the one being consumed (0 fetches synchronously), or
            ``"auto"`` (default): each reader of the node takes a share of the
            copies ``cache warm --jobs auto`` would keep in flight for this
            source, tuned as it runs and cut to fit a byte cap
            (:func:`ucstage.data.slotread.node_share`).
        equal_length: ``False`` (default) reads exactly the shard plan;
            ``"pad"`` (or ``True``) gives every slot ``ceil(n / slots)`` files
            by re-reading a few from the start of the read order; ``"drop"``
            gives every slot ``n // slots`` by skipping the last ``n % slots``.
            Either makes every rank yield the same count (needed by DDP when
            ``n`` is not a multiple of ``world_size * num_workers``).
        cache: a :class:`ucstage.LocalCache` to use.
        cache_dir: cache root when ``cache`` is not given (default:
            ``$UCSTAGE_CACHE_DIR``, else ``/tmp/ucstage-<uid>``).
        max_bytes: byte cap for a cache built from ``cache_dir``: bytes, or a
            size string as the CLI takes (``"500M"``, ``"20G"``).
        group: ``"key"`` makes files sharing a key one sample (the key is the
            relative path up to the first ``.`` of the file name; a name
            without a dot is its own key, suffix ``""``), or a callable from
            relative path to key (module-level, so that it pickles into
            workers). The dataset then yields ``{suffix: local path}`` per
            sample (``{"jpg": ..., "json": ...}``), every member cached first;
            samples are the unit of the slot rule, the shuffle,
            ``equal_length``, ``len()``, resume and the audit.
        require: with ``group``, suffixes every sample must have
            (case-sensitive), e.g. ``("jpg", "json")``; a single str is one suffix.
        on_incomplete: with ``require``, ``"drop"`` (default: such samples are
            left out, counted in one warning with examples) or ``"error"``.

    Building one lists nothing and pickles to a few hundred bytes: the
    listing is frozen into a manifest file on first use and only its path
    and fingerprint are pickled.

    ``len(dataset)`` needs the frozen listing (:meth:`freeze`, which the
    ucstage DataLoader calls, or a first iteration); before that it raises
    ``TypeError``. Inside a DataLoader worker it is that worker's slot count;
    in the main process it is this rank's count over all its workers, for
    :attr:`num_workers` workers (both follow ``equal_length``).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Manifest,
        *,
        include: str | Sequence[str] = (),
        exclude: str | Sequence[str] = (),
        include_hidden: bool = False,
        skip_unreadable: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
        nproc_per_node: int | None = None,
        read_ahead: int | str = DEFAULT_READ_AHEAD,
        equal_length: bool | str | None = False,
        cache: LocalCache | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_bytes: int | str | None = None,
        group: str | Callable[[str], str] | None = None,
        require: str | Sequence[str] = (),
        on_incomplete: str = "drop",
    ) -> None:
        try:
            read_ahead = check_read_ahead(read_ahead)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        self._use_cache(cache, cache_dir, max_bytes)
        super().__init__(rule_order(shuffle, seed, shuffle_scope, equal_length), nproc_per_node)
        self.read_ahead: int | str = read_ahead
        # A single str is one pattern (or suffix), never its characters (ucstage/params.py).
        self.include = params.strings(include, "include")
        self.exclude = params.strings(exclude, "exclude")
        require = params.strings(require, "require")
        self.include_hidden = bool(include_hidden)
        self.skip_unreadable = bool(skip_unreadable)
        if group is None and (require or on_incomplete != "drop"):
            raise InvalidArgument("require and on_incomplete apply to grouped samples: pass "
                                  'group="key" (or a key callable) too')
        self._grouping = (Grouping(group, require, on_incomplete)
                          if group is not None else None)
        self._manifest_path: str | None = None
        self._fingerprint: str | None = None
        self._manifest_size: int | None = None
        # Not pickled: rebuilt on demand in each process.
        self._manifest: Manifest | None = None
        self._bound = None
        if isinstance(source, Manifest):
            if self.include or self.exclude:
                raise InvalidArgument("include/exclude do not apply to a manifest (it is frozen)")
            self._source = source.source
            if self._grouping is not None:
                source = self._group(source)
            self._manifest = source
            self._fingerprint = source.fingerprint
            self._manifest_path = source.path
        else:
            self._source = os.fspath(source)

    # -- state ---------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        if self._manifest is not None and self._manifest_path is None:
            self._save_manifest(self._manifest)
        return super().__getstate__()

    def __len__(self) -> int:
        """Items this process yields per epoch (files, or samples when grouped):
        a worker's slot, or the rank's in the main process (see the class docstring)."""
        self._frozen("the frozen listing")
        return self.rule_length()

    def __repr__(self) -> str:
        group = "" if self._grouping is None else f"group={self._grouping.label!r}, "
        return self._repr(f"{group}shuffle={self.shuffle}, seed={self.seed}, "
                          f"shuffle_scope={self.shuffle_scope!r}")

    # -- sharding --------------------------------------------------------------

    def _item_count(self) -> int:
        """Files, or samples when grouped: what the read order deals."""
        manifest = self.freeze()
        return manifest.groups.count if manifest.groups is not None else len(manifest.entries)

    def slot_entries(self, *, rank: int, world_size: int, num_workers: int,
                     worker: int) -> list[FileEntry] | list[samples.Sample]:
        """The files slot (rank, worker) reads this epoch, in read order (when
        grouped, its samples: :class:`~ucstage.data.samples.Sample`, whose
        ``members`` are the entries and ``suffixes`` their suffixes).

        Computed with :func:`ucstage.sharding.slot_array` (or its equal-length
        variant), the rule ``ucstage shard-plan`` prints.
        """
        return self._slot_rows(rank=rank, world_size=world_size, num_workers=num_workers,
                               worker=worker).take_all()

    def _slot_rows(self, *, rank: int, world_size: int, num_workers: int,
                   worker: int) -> samples.SlotRows:
        layout = self.layout(world_size, num_workers)
        return self._rows(slot_array(self.read_order(), layout, layout.slot(rank, worker)))

    def _rows(self, indices: Any) -> samples.SlotRows:
        """The items at ``indices`` of the read order (samples when grouped)."""
        manifest = self.freeze()
        if manifest.groups is not None:
            return samples.SampleRows(manifest, indices)
        return samples.SlotRows(manifest, indices)

    def iter_rows(self, rows: Any, rank: int, *, sharers: int = 1) -> Iterator[Any]:
        """The items at ``rows`` of the read order (an int array: listing rows,
        or sample numbers when grouped), in order, fetched through the cache
        with this dataset's read-ahead and holds, untracked: what
        :class:`ucstage.Mix` reads of each of its sources (``sharers`` of them
        read in each worker: under ``read_ahead="auto"`` each takes that part
        of the worker's share)."""
        share = slotread.check_loader_window(self, self.cache(), self.world().num_workers,
                                             sharers=sharers)
        return self._fetch_all(self._rows(rows), rank, slotread.UNTRACKED, share)

    def _slot_items(self, tracker: _state.SlotTracker, share: Share,
                    loop: LoopView | None) -> Iterator[Any]:
        return self._fetch_all(self._rows(tracker.indices), tracker.rank, tracker, share, loop)

    def _fetch_all(self, items: samples.SlotRows, rank: int, tracker: slotread.Tracker,
                   share: Share, loop: LoopView | None = None) -> Iterator[Any]:
        kind = slotread.SAMPLES if isinstance(items, samples.SampleRows) else slotread.FILES
        # Each path stays held until the consumer moves past it (cache/leases.py).
        reader = slotread.open_reader(self, rank)
        try:
            yield from slotread.read(items, kind, reader, self._namespace(),
                                     share, tracker=tracker, loop=loop)
        finally:
            reader.close()
        tracker.end()
