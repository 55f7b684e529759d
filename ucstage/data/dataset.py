"""PyTorch integration: :class:`VolumeDataset` and :class:`DataLoader`.

``VolumeDataset`` is an ``IterableDataset`` of local file paths: it shards a
frozen listing of a volume over ranks and DataLoader workers with the slot
rule of :mod:`ucstage.sharding` (the one ``ucstage shard-plan`` prints), and
copies each file into the local cache on first access, fetching the next few
files of its slot in the background. ``DataLoader`` is torch's, with
ucstage's defaults, per-batch wait timing logged to MLflow, and a guard that
refuses to start when ranks disagree on ``num_workers`` or on the listing.

Usage and every argument: docs/training.md.

How every rank gets the same listing: the listing is frozen once into a
manifest file (under the cache root, ``.ucstage/manifests/<fingerprint>.json``). When
``torch.distributed`` is initialised, :meth:`VolumeDataset.freeze` lists on
rank 0 only and broadcasts the manifest to the other ranks; the ucstage
DataLoader calls it on every rank before starting workers. Or pass a
manifest (``ucstage cache lazy`` writes one) and no rank lists at all.

How a worker learns its slot: rank and world size from ``torch.distributed``
(in a forked worker its state is inherited; for spawned workers the values are
captured when the dataset is pickled), worker id and ``num_workers`` from
``torch.utils.data.get_worker_info()``; the main process (``num_workers=0``)
is worker 0 of 1.
"""

from __future__ import annotations

import inspect
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from .. import manifest as _manifest
from ..errors import InvalidArgument, ManifestError, MissingDependency, RankMismatch, UcstageError
from ..manifest import Manifest
from ..sharding import (
    EQUAL_LENGTH_MODES,
    effective_workers,
    equal_slot_files,
    read_order,
    slot_files,
)
from ..volumes import FileEntry, Volume
from .timing import EpochStats, MlflowSink, TimedIterator

try:
    import torch
    import torch.utils.data as tud
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise MissingDependency(
        "VolumeDataset and DataLoader need PyTorch, which is not installed",
        hint="install torch (on a CPU machine: pip install torch==2.13.0), "
             "or pip install 'ucstage[torch]'",
    ) from exc

if TYPE_CHECKING:
    from ..cache.local import LocalCache

__all__ = ["DataLoader", "EpochStats", "VolumeDataset"]

DEFAULT_READ_AHEAD = 4
# Frozen listings live in the cache's control folder, beside its own bookkeeping.
MANIFEST_DIR = os.path.join(".ucstage", "manifests")


def _dist() -> Any | None:
    """``torch.distributed`` when a process group is initialised, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist
    return None


def _equal_mode(value: bool | str | None) -> str | None:
    if value is None or value is False:
        return None
    if value is True:
        return "pad"
    if value in EQUAL_LENGTH_MODES:
        return str(value)
    raise InvalidArgument(
        f"equal_length must be False, True, 'pad' or 'drop', got {value!r}")


class VolumeDataset(tud.IterableDataset):  # type: ignore[type-arg]
    """Local paths of a volume's files, sharded over ranks and workers, cached on first read.

    Args:
        source: a volume path (``/Volumes/...``), fsspec URL, local folder, a
            manifest file, or a :class:`ucstage.Manifest`. A manifest is used
            as frozen; anything else is listed once, on first use.
        include: keep only files matching any of these globs (``*.jpg``
            matches names at any depth; a glob with ``/`` matches the path).
        exclude: drop files matching any of these globs.
        include_hidden: also list names starting with ``_`` or ``.``.
        shuffle: read in a permutation seeded by ``seed`` and the epoch (see
            :meth:`set_epoch`), identical on every rank.
        seed: shuffle seed.
        read_ahead: how many files of this slot to fetch in the background
            ahead of the one being consumed (0 fetches synchronously).
        equal_length: ``False`` (default) reads exactly the shard plan;
            ``"pad"`` (or ``True``) gives every slot ``ceil(n / slots)`` files
            by re-reading a few from the start of the read order; ``"drop"``
            gives every slot ``n // slots`` by skipping the last ``n % slots``.
            Either makes every rank yield the same count (needed by DDP when
            ``n`` is not a multiple of ``world_size * num_workers``).
        cache: a :class:`ucstage.LocalCache` to use.
        cache_dir: cache root when ``cache`` is not given (default:
            ``$UCSTAGE_CACHE_DIR``, else ``/tmp/ucstage-<uid>``).
        max_bytes: byte cap for a cache built from ``cache_dir``.

    Building one lists nothing and pickles to a few hundred bytes: the
    listing is frozen into a manifest file on first use and only its path
    and fingerprint are pickled.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Manifest,
        *,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        include_hidden: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        read_ahead: int = DEFAULT_READ_AHEAD,
        equal_length: bool | str | None = False,
        cache: LocalCache | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__()
        if read_ahead < 0:
            raise InvalidArgument(f"read_ahead must be 0 or more, got {read_ahead}")
        if cache is not None and cache_dir is not None:
            raise InvalidArgument("pass cache or cache_dir, not both")
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.read_ahead = int(read_ahead)
        self.equal_length = _equal_mode(equal_length)
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.include_hidden = bool(include_hidden)
        self._cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self._max_bytes = max_bytes
        self._manifest_path: str | None = None
        self._fingerprint: str | None = None
        self._dist_rank_world: tuple[int, int] | None = None
        # Not pickled: rebuilt on demand in each process.
        self._cache: LocalCache | None = cache
        self._manifest: Manifest | None = None
        self._volume: Volume | None = None
        if cache is not None:
            self._cache_dir = str(getattr(cache, "root", "")) or None
            self._max_bytes = getattr(cache, "max_bytes", max_bytes)
        if isinstance(source, Manifest):
            if self.include or self.exclude:
                raise InvalidArgument("include/exclude do not apply to a manifest (it is frozen)")
            self._source = source.source
            self._manifest = source
            self._fingerprint = source.fingerprint
            self._manifest_path = source.path
        else:
            self._source = os.fspath(source)

    # -- state ---------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch's permutation (with ``shuffle``); call it on every rank.

        With ``persistent_workers=True`` the workers keep the epoch they
        started with, as with torch's ``DistributedSampler``; leave it False.
        """
        self.epoch = int(epoch)

    @property
    def fingerprint(self) -> str | None:
        """The frozen listing's fingerprint, or None before :meth:`freeze`."""
        return self._fingerprint

    @property
    def source(self) -> str:
        return self._source

    def __getstate__(self) -> dict[str, Any]:
        if self._manifest is not None and self._manifest_path is None:
            self._save_manifest(self._manifest)
        state = dict(self.__dict__)
        for key in ("_cache", "_manifest", "_volume"):
            state[key] = None
        dist = _dist()
        if dist is not None:
            # A spawned worker has no process group: give it this rank's view.
            state["_dist_rank_world"] = (dist.get_rank(), dist.get_world_size())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        frozen = f"fingerprint={self._fingerprint[:12]}" if self._fingerprint else "not frozen"
        return (f"VolumeDataset({self._source!r}, shuffle={self.shuffle}, seed={self.seed}, "
                f"epoch={self.epoch}, {frozen})")

    # -- the listing -----------------------------------------------------------

    def cache(self) -> LocalCache:
        """The local cache this dataset copies files into."""
        if self._cache is None:
            from ..cache.local import LocalCache

            self._cache = LocalCache(self._cache_dir, max_bytes=self._max_bytes)
            if self._cache_dir is None:
                self._cache_dir = str(getattr(self._cache, "root", "")) or None
        return self._cache

    def _manifest_file(self, fingerprint: str) -> str:
        root = getattr(self.cache(), "root", None)
        if not root:
            raise ManifestError("the cache has no root folder to keep the frozen listing in")
        return os.path.join(os.fspath(root), MANIFEST_DIR, f"{fingerprint}.json")

    def _save_manifest(self, manifest: Manifest) -> None:
        path = self._manifest_file(manifest.fingerprint)
        if not os.path.exists(path):
            _manifest.save(manifest, path)
        self._manifest_path = path

    def _adopt(self, manifest: Manifest) -> Manifest:
        self._manifest = manifest
        self._fingerprint = manifest.fingerprint
        # A manifest broadcast from rank 0 names rank 0's file, which may not
        # exist on this node: keep a local copy then.
        if manifest.path is not None and os.path.exists(manifest.path):
            self._manifest_path = manifest.path
        else:
            self._save_manifest(manifest)
        return manifest

    def _snapshot(self) -> Manifest:
        return _manifest.snapshot(self._source, include=self.include, exclude=self.exclude,
                                  include_hidden=self.include_hidden)

    def _load_frozen(self) -> Manifest:
        assert self._manifest_path is not None and self._fingerprint is not None
        if os.path.exists(self._manifest_path):
            loaded = _manifest.load(self._manifest_path)
        else:
            # Unpickled on another node: re-list and insist on the same listing.
            loaded = self._snapshot()
            self._save_manifest(loaded)
        if loaded.fingerprint != self._fingerprint:
            raise ManifestError(
                f"the listing of {self._source} changed since it was frozen "
                f"(fingerprint {loaded.fingerprint[:12]}, expected {self._fingerprint[:12]})",
                hint="freeze it into a manifest with `ucstage cache lazy` and pass that to every rank",
            )
        self._manifest = loaded
        return loaded

    def freeze(self, *, broadcast: bool | None = None) -> Manifest:
        """Freeze the listing (once) and return it; lists the source on first call.

        Args:
            broadcast: list on rank 0 only and send the listing to the other
                ranks through ``torch.distributed``. This is a collective:
                every rank must call it. The default does so when a process
                group is initialised and this is not a DataLoader worker; the
                ucstage DataLoader calls it on every rank for you.
        """
        if self._manifest is not None:
            return self._manifest
        if self._manifest_path is not None:
            return self._load_frozen()
        dist = _dist()
        if broadcast is None:
            broadcast = dist is not None and tud.get_worker_info() is None
        if not broadcast or dist is None or dist.get_world_size() == 1:
            return self._adopt(self._snapshot())
        request = (self._source, self.include, self.exclude, self.include_hidden)
        return self._adopt(_broadcast_listing(dist, request, self._snapshot))

    def _entries(self) -> Sequence[FileEntry]:
        return self.freeze().entries

    def _get_volume(self) -> Volume:
        if self._volume is None:
            self._volume = self.freeze().volume()
        return self._volume

    # -- sharding --------------------------------------------------------------

    def slot(self) -> tuple[int, int, int, int]:
        """(rank, world_size, num_workers, worker) of the calling process."""
        info = tud.get_worker_info()
        dist = _dist()
        if dist is not None:
            rank, world = dist.get_rank(), dist.get_world_size()
        elif info is not None and self._dist_rank_world is not None:
            rank, world = self._dist_rank_world
        else:
            rank, world = 0, 1
        if info is None:
            return rank, world, 0, 0
        return rank, world, info.num_workers, info.id

    def slot_entries(self, *, rank: int, world_size: int, num_workers: int,
                     worker: int) -> list[FileEntry]:
        """The files slot (rank, worker) reads this epoch, in read order.

        Computed with :func:`ucstage.sharding.slot_files` (or its equal-length
        variant), the rule ``ucstage shard-plan`` prints.
        """
        entries = self._entries()
        n = len(entries)
        order = read_order(n, shuffle=self.shuffle, seed=self.seed, epoch=self.epoch)
        if self.equal_length is None:
            indices = slot_files(n, rank=rank, world_size=world_size, num_workers=num_workers,
                                 worker=worker, order=order)
        else:
            indices = equal_slot_files(n, rank=rank, world_size=world_size,
                                       num_workers=num_workers, worker=worker,
                                       mode=self.equal_length, order=order)
        return [entries[i] for i in indices]

    def __iter__(self) -> Iterator[str]:
        rank, world, num_workers, worker = self.slot()
        entries = self.slot_entries(rank=rank, world_size=world, num_workers=num_workers,
                                    worker=worker)
        return self._fetch_all(entries)

    def _fetch_all(self, entries: list[FileEntry]) -> Iterator[str]:
        cache, volume = self.cache(), self._get_volume()
        if self.read_ahead == 0:
            for entry in entries:
                yield cache.fetch(volume, entry)
            return
        # A window of fetches runs ahead of the consumer; results come back in
        # slot order. Fetches of one file by several processes are single-flight
        # in the cache, so read-ahead never copies a file twice.
        pool = ThreadPoolExecutor(max_workers=self.read_ahead,
                                  thread_name_prefix="ucstage-read-ahead")
        todo = iter(entries)
        window: deque[Future[str]] = deque(
            pool.submit(cache.fetch, volume, e) for e in islice(todo, self.read_ahead))
        try:
            while window:
                current = window.popleft()
                following = next(todo, None)
                if following is not None:
                    window.append(pool.submit(cache.fetch, volume, following))
                yield current.result()
        finally:
            for future in window:
                future.cancel()
            pool.shutdown(wait=False, cancel_futures=True)


def _broadcast_listing(dist: Any, request: tuple[Any, ...], snapshot: Any) -> Manifest:
    """Rank 0 lists; every rank gets its manifest (or its error).

    Ranks first compare what they ask for (source and filters): a rank must
    not silently adopt a listing made with another rank's filters.
    """
    requests = _all_gather(dist, request)
    if len(set(requests)) > 1:
        values = "; ".join(f"rank {r}: {_describe_request(q)}" for r, q in enumerate(requests))
        raise RankMismatch(
            f"ranks ask for different listings ({values})",
            hint="pass the same source and include/exclude on every rank",
        )
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            payload[0] = ("ok", snapshot())
        except UcstageError as exc:
            payload[0] = ("error", type(exc).__name__, exc.message, exc.hint)
        except Exception as exc:
            payload[0] = ("error", "UcstageError", f"listing failed on rank 0: {exc!r}", "")
    dist.broadcast_object_list(payload, src=0)
    result = payload[0]
    if result[0] == "error":
        from .. import errors

        cls = getattr(errors, result[1], UcstageError)
        raise cls(result[2], result[3])
    manifest: Manifest = result[1]
    if _manifest.fingerprint(manifest.entries) != manifest.fingerprint:
        raise ManifestError("the listing broadcast from rank 0 fails its fingerprint check")
    return manifest


def _describe_request(request: tuple[Any, ...]) -> str:
    source, include, exclude, hidden = request
    parts = [repr(source)]
    if include:
        parts.append(f"include={list(include)}")
    if exclude:
        parts.append(f"exclude={list(exclude)}")
    if hidden:
        parts.append("include_hidden=True")
    return " ".join(parts)


def find_volume_dataset(dataset: Any, depth: int = 3) -> VolumeDataset | None:
    """The VolumeDataset inside a user's wrapper dataset (its attributes, a few levels deep)."""
    if isinstance(dataset, VolumeDataset):
        return dataset
    if depth == 0:
        return None
    children: list[Any] = []
    attrs = getattr(dataset, "__dict__", None)
    if isinstance(attrs, dict):
        children.extend(attrs.values())
    for child in children:
        if isinstance(child, (list, tuple)):
            for item in child[:8]:
                found = find_volume_dataset(item, depth - 1)
                if found is not None:
                    return found
        elif hasattr(child, "__dict__") and not isinstance(child, type):
            found = find_volume_dataset(child, depth - 1)
            if found is not None:
                return found
    return None


_TORCH_INIT = inspect.signature(tud.DataLoader.__init__)


class DataLoader(tud.DataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` with ucstage defaults, timing and a rank guard.

    Takes every argument torch's DataLoader takes; the defaults differ:
    ``num_workers=6`` and, when ``num_workers > 0``, ``prefetch_factor=4``.
    ucstage's own keyword arguments:

    Args:
        log_mlflow: log per-batch wait time and an end-of-epoch summary to
            the MLflow run active in this process, if any (metric names in
            docs/training.md).
        mlflow_prefix: prefix of the metric names (default ``ucstage``).
        mlflow_flush_every: metrics buffered before a background
            ``log_batch`` (each epoch's end also sends; nothing waits).
        mlflow_step_every: log the per-step wait every N batches (the mean
            over those N) instead of every batch, for very fast loops: each
            logged metric costs the tracking store some CPU in the background.
        guard: when ``torch.distributed`` is initialised, check at the start
            of every epoch that all ranks use the same ``num_workers`` and the
            same listing, and raise :class:`ucstage.errors.RankMismatch` on
            every rank if not.
        volume_dataset: the VolumeDataset to freeze and guard, when the
            wrapper dataset hides it too deep to be found automatically.

    After each epoch, :attr:`epoch_stats` holds an :class:`EpochStats` per
    epoch (also without MLflow).
    """

    def __init__(self, dataset: Any, *args: Any, log_mlflow: bool = True,
                 mlflow_prefix: str = "ucstage", mlflow_flush_every: int = 500,
                 mlflow_step_every: int = 1,
                 guard: bool = True, volume_dataset: VolumeDataset | None = None,
                 **kwargs: Any) -> None:
        bound = _TORCH_INIT.bind_partial(None, dataset, *args, **kwargs).arguments
        if "num_workers" not in bound:
            kwargs["num_workers"] = 6
        num_workers = bound.get("num_workers", kwargs.get("num_workers"))
        if "prefetch_factor" not in bound and num_workers:
            kwargs["prefetch_factor"] = 4
        super().__init__(dataset, *args, **kwargs)
        self.log_mlflow = log_mlflow
        self.mlflow_prefix = mlflow_prefix
        self.mlflow_flush_every = mlflow_flush_every
        if mlflow_step_every < 1:
            raise InvalidArgument(f"mlflow_step_every must be 1 or more, got {mlflow_step_every}")
        self.mlflow_step_every = mlflow_step_every
        self.guard = guard
        self.volume_dataset = volume_dataset or find_volume_dataset(dataset)
        self.epoch_stats: list[EpochStats] = []
        self._steps = 0
        self._epochs = 0
        self._sinks: list[MlflowSink] = []

    def __iter__(self) -> TimedIterator:  # type: ignore[override]
        self._prepare()
        sink = (MlflowSink.for_active_run(self.mlflow_prefix, self.mlflow_flush_every)
                if self.log_mlflow else None)
        if sink is not None:
            self._sinks = [s for s in self._sinks if s.busy] + [sink]
        epoch = self._epochs
        self._epochs += 1
        return TimedIterator(super().__iter__(), epoch=epoch, first_step=self._steps,
                             sink=sink, on_done=self._epoch_done,
                             step_every=self.mlflow_step_every)

    def flush_metrics(self) -> None:
        """Wait until every metric logged so far is in the MLflow tracking store.

        Metrics are written in the background; call this before reading them
        back in the same process. Python waits for them at exit anyway.
        """
        for sink in self._sinks:
            sink.flush()
        self._sinks = []

    def _epoch_done(self, stats: EpochStats, next_step: int) -> None:
        self.epoch_stats.append(stats)
        self._steps = max(self._steps, next_step)

    def _prepare(self) -> None:
        """Freeze the listing on every rank and run the rank-consistency guard."""
        vds = self.volume_dataset
        dist = _dist()
        if dist is None or dist.get_world_size() == 1:
            if vds is not None:
                vds.freeze(broadcast=False)
            return
        # Every rank takes the same branches below, because every decision is
        # made on the same gathered values: no rank waits in a collective alone.
        sharded = vds is not None or isinstance(self.dataset, tud.IterableDataset)
        first = _all_gather(dist, _GuardInfo.of(self.num_workers, vds, sharded))
        if self.guard:
            _check_workers(first)
        unfrozen = [g.has_dataset and g.fingerprint is None for g in first]
        if vds is not None and vds.fingerprint is None:
            vds.freeze(broadcast=all(unfrozen))
        if not self.guard:
            return
        latest = first
        if any(unfrozen):
            latest = _all_gather(dist, _GuardInfo.of(self.num_workers, vds, sharded))
        _check_listings(latest)


@dataclass(frozen=True)
class _GuardInfo:
    num_workers: int
    fingerprint: str | None
    files: int | None
    has_dataset: bool
    sharded: bool
    """The dataset shards itself over workers (an IterableDataset): only then
    does num_workers decide which files a rank reads."""

    @classmethod
    def of(cls, num_workers: int, vds: VolumeDataset | None, sharded: bool) -> _GuardInfo:
        if vds is None:
            return cls(num_workers, None, None, False, sharded)
        frozen = vds.fingerprint is not None
        return cls(num_workers, vds.fingerprint, len(vds.freeze()) if frozen else None, True,
                   sharded)


def _all_gather(dist: Any, value: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _check_workers(gathered: list[_GuardInfo]) -> None:
    if not any(g.sharded for g in gathered):
        return  # a sampler shards map-style datasets; num_workers does not matter
    if len({effective_workers(g.num_workers) for g in gathered}) <= 1:
        return
    values = ", ".join(f"rank {r}: {g.num_workers}" for r, g in enumerate(gathered))
    plan_k = ",".join(str(g.num_workers) for g in gathered)
    raise RankMismatch(
        f"ranks disagree on DataLoader num_workers ({values}); the slot rule would read "
        f"some files twice and skip others (see `ucstage shard-plan SOURCE "
        f"-w {len(gathered)} -k {plan_k}`)",
        hint="pass the same num_workers to the DataLoader on every rank",
    )


def _check_listings(gathered: list[_GuardInfo]) -> None:
    if len({g.fingerprint for g in gathered if g.has_dataset}) <= 1:
        return
    values = ", ".join(
        f"rank {r}: fingerprint {(g.fingerprint or 'none')[:12]} ({g.files} files)"
        for r, g in enumerate(gathered) if g.has_dataset)
    raise RankMismatch(
        f"ranks shard different listings ({values}); they would read overlapping or "
        "missing files",
        hint="give every rank the same source and filters, or one manifest from "
             "`ucstage cache lazy`",
    )
