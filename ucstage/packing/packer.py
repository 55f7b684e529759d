"""SOURCE's files into tar shards in DEST, atomically, once, by several ranks.

:func:`pack` does it in these steps:

1. **List** SOURCE (``include``/``exclude`` as for ``cache warm``) and, with
   ``group="key"``, group the listing into samples exactly as
   ``VolumeDataset(group="key")`` does (:func:`ucstage.manifest.group_manifest`);
   otherwise each file is a sample, and two files that WebDataset would read
   as one sample (the same key) are refused.
2. **Skip** when DEST's record (``_ucstage_pack.json``) names the same
   source, listing fingerprint and options and every shard it lists is there
   with its size; ``force`` re-packs.
3. **Order** the samples: the listing's order, or with ``shuffle`` one
   permutation seeded by ``seed``, so each shard mixes the classes. Rank
   ``r`` of ``world_size`` takes the ``r``-th contiguous slice of that order
   and cuts it into shards of at most ``shard_size`` bytes and/or
   ``samples_per_shard`` samples, named ``shard-RRRRR-NNNNNN.tar``.
4. **Write** the rank's shards into the run's staging folder beside DEST,
   ``.<DEST>.ucstage-pack-<id>``, where ``<id>`` hashes the listing, the
   options and ``world_size``: every rank of one run finds the same folder
   without talking to the others. When its shards are written and fsynced,
   the rank commits its *part* (``_part-RRRRR-of-WWWWW.json``: its shards'
   indexes) with one atomic write.
5. **Publish**: the rank that commits the last part (it sees all
   ``world_size`` parts) claims the publish by creating ``_publishing`` with
   ``O_EXCL`` (exactly one rank can), then, holding DEST's lock, writes the
   record (every part's index, in rank order) into the staging folder and
   swaps it in for DEST with two renames (:func:`ucstage.export.dest.swap`).
   Other ranks return as soon as their part is committed: once every rank
   has returned, DEST holds the whole pack.

Nothing is visible in DEST until the swap. A rank stopped or failed removes
the shards it wrote in this run; parts other ranks committed stay in the
staging folder, so rerunning the missing rank (same SOURCE, options and
world size) finishes the pack, and a rank rerun whose part is committed
reuses it. A run with other inputs into the same DEST gets another staging
folder; the publish removes the stale ones. DEST must be a local or mounted
folder (an object store has no atomic rename), the same path on every node.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .. import __version__, params
from ..atomic import write_atomic
from ..cache.inflight import Inflight, Stopped
from ..errors import InvalidArgument, PackError
from ..export.dest import (
    check_dest_writable,
    dest_lock,
    remove_path,
    swap,
    sweep_leftovers,
)
from ..export.interrupt import add_note, signals_deferred
from ..manifest.groups import KEY, split_name
from ..progress import NO_PROGRESS, Callback
from ..shardfiles.packindex import FORMAT, RECORD, parse_record
from ..shown import shown
from ..volumes import resolve
from ..volumes.entry import FileEntry
from ..volumes.location import Volume
from .tarwrite import TarShard, tar_size

__all__ = ["DEFAULT_SHARD_SIZE", "PackResult", "pack"]

DEFAULT_SHARD_SIZE = 256 << 20
"""``shard_size`` when neither it nor ``samples_per_shard`` is given."""
DEFAULT_JOBS = 16
"""Source files read at once from a local or mounted folder: a stop waits
for one read per job (:data:`_READ_SIZE`), so more would stop slower."""
OBJECT_JOBS = 64
"""... and from an object store, where a file is one GET whose round trip,
not bandwidth, sets the pace of small files (``cache warm`` keeps up to 256
in flight there); a stop abandons the GETs in flight."""
_CLAIM = "_publishing"
_PART = re.compile(r"_part-(\d{5})-of-(\d{5})\.json")
_SHARD = "shard-{rank:05d}-{n:06d}.tar"


@dataclass
class PackResult:
    """What one rank's :func:`pack` did."""

    source: str
    dest: str
    rank: int
    world_size: int
    skipped_unchanged: bool
    """DEST already held this pack; nothing was written."""
    published: bool
    """This rank published DEST (it committed the last part)."""
    parts_done: int
    """Ranks whose share is committed (``world_size`` once published)."""
    samples: int = 0
    """This rank's share: samples, files and bytes of source data."""
    files: int = 0
    bytes: int = 0
    shards: list[dict[str, Any]] = field(default_factory=list)
    """This rank's shards: ``path``, ``bytes``, ``samples``."""
    reused: bool = False
    """This rank's share was committed by an earlier run and kept."""
    record: dict[str, Any] | None = None
    """DEST's record, when DEST holds the pack (published or skipped)."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The stable JSON of ``ucstage pack --json`` (docs/json.md#pack)."""
        pack = None
        if self.record is not None:
            pack = {key: self.record[key] for key in ("samples", "files", "bytes")}
            pack["shards"] = len(self.record["shards"])
        return {
            "source": self.source, "dest": self.dest, "rank": self.rank,
            "world_size": self.world_size, "skipped_unchanged": self.skipped_unchanged,
            "published": self.published, "parts_done": self.parts_done,
            "share": {"samples": self.samples, "files": self.files, "bytes": self.bytes,
                      "reused": self.reused, "shards": self.shards},
            "pack": pack, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class _Plan:
    """A rank's share: samples as lists of (entry, key, suffix), cut into shards."""

    shards: list[list[list[tuple[FileEntry, str, str]]]]

    @property
    def samples(self) -> int:
        return sum(len(s) for s in self.shards)

    @property
    def files(self) -> int:
        return sum(len(m) for s in self.shards for m in s)

    @property
    def bytes(self) -> int:
        return sum(e.size for s in self.shards for m in s for e, _, _ in m)


def pack(source: str | os.PathLike[str], dest: str | os.PathLike[str], *,
         group: str | None = None, include: str | Sequence[str] = (),
         exclude: str | Sequence[str] = (), shard_size: int | str | None = None,
         samples_per_shard: int | None = None, shuffle: bool = False, seed: int = 0,
         rank: int | None = None, world_size: int | None = None, force: bool = False,
         jobs: int | None = None, callback: Callback = NO_PROGRESS) -> PackResult:
    """Pack SOURCE's files into WebDataset tar shards in DEST (see the module docstring).

    Args:
        source: a volume path, URL, local folder or manifest, as for ``cache warm``.
        dest: a local or mounted folder (``/Volumes/...`` through the mapping).
        group: ``"key"``: files sharing a key are one sample, as
            ``VolumeDataset(group="key")`` groups them; None: each file is one.
        include, exclude: globs, as for ``VolumeDataset``.
        shard_size: at most about this many bytes per shard (a number or
            ``"256M"``); a sample larger than it is a shard of its own.
        samples_per_shard: at most this many samples per shard. With neither,
            ``shard_size`` is 256 MiB.
        shuffle, seed: a seeded order of the samples instead of the listing's.
        rank, world_size: this process's share; default ``$RANK`` and
            ``$WORLD_SIZE`` (torchrun's), else 0 of 1.
        force: pack even when DEST holds this pack; replace a DEST holding
            only ``.tar`` files and no record.
        jobs: source files read at once (default: :data:`OBJECT_JOBS` from
            an object store, else :data:`DEFAULT_JOBS`).
        callback: ``set_size`` (bytes, files of the share), ``relative_update``
            per file's bytes, ``item_done`` per file, ``set_description`` for
            the steps.

    Raises:
        InvalidArgument: bad options; DEST is not a folder, not a pack, holds
            files its record does not list (without ``force``), or lies in SOURCE;
            files WebDataset cannot name or would merge.
        SourceNotFound, EmptySource: SOURCE is missing or holds no file.
        PackError: a file changed or vanished while read; DEST is as it was.
    """
    started = time.monotonic()
    options = _options(group, include, exclude, shard_size, samples_per_shard, shuffle, seed)
    rank, world_size = _rank(rank, world_size)
    if jobs is not None:
        jobs = params.whole(jobs, "jobs", minimum=1)
    dest_path = _resolve_dest(os.fspath(dest))
    check_dest_writable(dest_path)
    src = os.fspath(source)
    _check_not_inside(src, dest_path)
    record = _check_dest(dest_path, force)

    callback.set_description("listing")
    manifest, samples = _samples(src, options)
    callback.set_description("")
    result = PackResult(src, dest_path, rank, world_size, False, False, 0)
    if (not force and record is not None and record.get("source") == manifest.source
            and record.get("fingerprint") == manifest.fingerprint
            and record.get("options") == options and _complete(dest_path, record)):
        result.skipped_unchanged, result.parts_done, result.record = True, world_size, record
        result.seconds = time.monotonic() - started
        return result

    plan = _plan(samples, options, rank, world_size)
    result.samples, result.files, result.bytes = plan.samples, plan.files, plan.bytes
    run = hashlib.sha256(json.dumps([manifest.source, manifest.fingerprint, options, world_size],
                                    sort_keys=True).encode()).hexdigest()[:12]
    parent, base = os.path.split(dest_path)
    staging = os.path.join(parent, f".{base}.ucstage-pack-{run}")
    os.makedirs(staging, exist_ok=True)
    part = os.path.join(staging, f"_part-{rank:05d}-of-{world_size:05d}.json")
    try:
        if force:
            _forget_share(staging, rank, part)
        committed = _committed(staging, part)
        if committed is None:
            volume = manifest.volume()
            if jobs is None:
                jobs = DEFAULT_JOBS if volume.is_local else OBJECT_JOBS
            committed = _write_share(volume, staging, part, plan, rank, jobs, callback)
        else:
            result.reused = True
        result.shards = [{k: s[k] for k in ("path", "bytes", "samples")} for s in committed]
        result.parts_done = len(_parts(staging, world_size))
        if result.parts_done == world_size:
            published = _publish(staging, dest_path, manifest, options, world_size, force,
                                 callback)
            if published is not None:
                result.published, result.record = True, published
    except KeyboardInterrupt as exc:
        add_note(exc, f"nothing was published: {dest_path} is as it was"
                 if not result.published else f"{dest_path} holds the new pack")
        _drop_if_empty(staging)
        raise
    except BaseException:
        _drop_if_empty(staging)
        raise
    result.seconds = time.monotonic() - started
    return result


# -- options, rank, DEST ------------------------------------------------------------

def _options(group: str | None, include: str | Sequence[str], exclude: str | Sequence[str],
             shard_size: int | str | None, samples_per_shard: int | None, shuffle: bool,
             seed: int) -> dict[str, Any]:
    """The options as the record keeps them (a rerun with other ones re-packs)."""
    if group is not None and group != KEY:
        raise InvalidArgument(f'group must be "key" or None, got {group!r}')
    size = params.size(shard_size, "shard_size") if shard_size is not None else None
    per = (params.whole(samples_per_shard, "samples_per_shard", minimum=1)
           if samples_per_shard is not None else None)
    if size is None and per is None:
        size = DEFAULT_SHARD_SIZE
    return {"group": group, "include": list(params.strings(include, "include")),
            "exclude": list(params.strings(exclude, "exclude")), "shard_size": size,
            "samples_per_shard": per, "shuffle": bool(shuffle),
            "seed": params.whole(seed, "seed") if shuffle else None}


def _rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): given, else torchrun's ``$RANK``/``$WORLD_SIZE``, else 0 of 1."""
    def env(name: str) -> int | None:
        text = os.environ.get(name)
        if text is None or not text.strip():
            return None
        try:
            return int(text)
        except ValueError:
            raise InvalidArgument(f"${name} must be a whole number, got {text!r}") from None

    world = params.whole(world_size, "world_size", minimum=1) if world_size is not None \
        else env("WORLD_SIZE") or 1
    r = params.whole(rank, "rank") if rank is not None else env("RANK") or 0
    if not 0 <= r < world:
        raise InvalidArgument(f"rank must be below world_size ({world}), got {r}")
    return r, world


def _resolve_dest(dest: str) -> str:
    """DEST's local folder; an object store, ``/``, home or a file refused."""
    volume = resolve(dest, must_exist=False)
    if not volume.is_local:
        raise InvalidArgument(f"cannot pack into {volume.url}: DEST must be a local or "
                              "mounted folder", hint="an object store has no atomic rename to "
                              "publish with: pack to a local folder or the volume's mount, "
                              "then copy the folder")
    path = os.path.abspath(volume.root)
    if path in ("/", os.path.expanduser("~")):
        raise InvalidArgument(f"refusing to pack into {path}: it would be replaced")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"DEST {path} exists and is not a folder")
    return path


def _check_not_inside(source: str, dest: str) -> None:
    """Refuse a DEST inside a local SOURCE: the next listing would hold the shards."""
    if "://" in source or not os.path.isdir(source):
        return
    root = os.path.realpath(source)
    real = os.path.realpath(dest)
    if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
        raise InvalidArgument(f"DEST {dest} is inside SOURCE {source}: the next listing of "
                              "SOURCE would hold the shards", hint="choose a DEST outside SOURCE")


def _load_record(dest: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(dest, RECORD), "rb") as fh:
            return parse_record(fh.read())
    except OSError:
        return None


def _check_dest(dest: str, force: bool) -> dict[str, Any] | None:
    """DEST's record (None: no DEST, or an empty one); refuses what pack must not replace.

    Refused: a DEST with files but no pack record (even with ``force``, unless
    it holds only ``.tar`` files, a pack whose record was lost); without
    ``force``, a pack holding files its record does not list.
    """
    if not os.path.isdir(dest):
        return None
    names = sorted(_contents(dest))
    record = _load_record(dest)
    if record is None:
        if not names:
            return None
        shown_names = ", ".join(repr(shown(n)) for n in names[:5]) + (
            f" and {len(names) - 5:,} more" if len(names) > 5 else "")
        if all(n.endswith(".tar") and "/" not in n for n in names):
            if force:
                return None
            raise InvalidArgument(f"DEST {shown(dest)} holds tar files ({shown_names}) but no "
                                  f"{RECORD}: ucstage did not pack it; refusing to replace it",
                                  hint="choose another DEST, or pass `force` to replace it")
        raise InvalidArgument(f"DEST {shown(dest)} is not a pack: it holds {shown_names}; "
                              "refusing to replace it",
                              hint="choose another DEST, or move those files away")
    listed = {s["path"] for s in record["shards"]} | {RECORD}
    unlisted = [n for n in names if n not in listed]
    if unlisted and not force:
        raise InvalidArgument(f"DEST {shown(dest)} holds files its pack record does not list: "
                              f"{', '.join(repr(shown(n)) for n in unlisted[:5])}; a new pack "
                              "would delete them",
                              hint="move them out of DEST, or pass `force` to replace DEST "
                                   "with them")
    return record


def _contents(dest: str) -> Iterator[str]:
    """DEST's files and folders, as relative paths (a folder as ``name/``)."""
    for name in os.listdir(dest):
        yield name + "/" if os.path.isdir(os.path.join(dest, name)) else name


def _complete(dest: str, record: dict[str, Any]) -> bool:
    """Every shard the record lists is in ``dest`` with its size."""
    for shard in record["shards"]:
        try:
            if os.path.getsize(os.path.join(dest, shard["path"])) != shard["bytes"]:
                return False
        except OSError:
            return False
    return True


# -- the samples and the plan -----------------------------------------------------------

def _samples(source: str, options: dict[str, Any]) -> tuple[Any, list[list[tuple[FileEntry, str, str]]]]:
    """The listing (grouped with ``group``) and its samples: (entry, key, suffix) each.

    Raises:
        InvalidArgument: a file without a suffix (WebDataset reads only
            ``key.suffix`` members), or, ungrouped, two files of one key.
    """
    from ..manifest import group_manifest
    from ..manifest.groups import Grouping
    from ..source import snapshot

    manifest = snapshot(source, include=options["include"], exclude=options["exclude"])
    if options["group"] is not None and manifest.groups is None:
        manifest = group_manifest(manifest, Grouping(options["group"]))[0]
    entries = list(manifest.entries)
    named = [(e, *split_name(e.path)) for e in entries]
    bare = [e.path for e, _, suffix in named if not suffix]
    if bare:
        raise InvalidArgument(
            f"{len(bare):,} files have no suffix after a '.' in their name, e.g. "
            f"{shown(bare[0])}: a WebDataset member is named key.suffix",
            hint="leave them out with `exclude`")
    if manifest.groups is not None:
        offsets = manifest.groups.offsets.tolist()
        return manifest, [named[a:b] for a, b in itertools.pairwise(offsets)]
    seen: dict[str, str] = {}
    for e, key, _ in named:
        if key in seen:
            raise InvalidArgument(
                f"files {shown(seen[key])} and {shown(e.path)} share the key {shown(key)}: "
                "WebDataset would read them as one sample",
                hint="pass `group` key to pack such files as one sample")
        seen[key] = e.path
    return manifest, [[n] for n in named]


def _plan(samples: list[list[tuple[FileEntry, str, str]]], options: dict[str, Any], rank: int,
          world_size: int) -> _Plan:
    """Rank ``rank``'s slice of the (seeded) order, cut into shards."""
    import numpy as np

    n = len(samples)
    order = (np.random.default_rng(options["seed"]).permutation(n) if options["shuffle"]
             else np.arange(n))
    share = order[n * rank // world_size:n * (rank + 1) // world_size].tolist()
    size, per = options["shard_size"], options["samples_per_shard"]
    shards: list[list[list[tuple[FileEntry, str, str]]]] = []
    current: list[list[tuple[FileEntry, str, str]]] = []
    held = 0
    for i in share:
        sample = samples[i]
        adds = tar_size([(f"{key}.{suffix}", e.size) for e, key, suffix in sample])
        if current and ((per is not None and len(current) >= per)
                        or (size is not None and held + adds > size)):
            shards.append(current)
            current, held = [], 0
        current.append(sample)
        held += adds
    if current:
        shards.append(current)
    return _Plan(shards)


# -- writing a share ----------------------------------------------------------------------

_READ_SIZE = 32 << 10
"""Bytes per read of a local or mounted source file. Ctrl-C cannot cut short
a read a FUSE mount is serving (the kernel waits for it even as the process
exits), so a stop waits for up to one read per job: at most 16 x 32 KiB, about
1 s on a 512 KiB/s mount, where whole 256 KiB files took 3 s."""


def _read(volume: Volume, entry: FileEntry, inflight: Inflight) -> bytes:
    """A source file's bytes, as listed (its change marker checked).

    Read as ``cache warm`` copies a file, by the same engine: a local or
    mounted file with symlinks leaving SOURCE refused and a change while read
    caught, in :data:`_READ_SIZE` reads that stop once ``inflight`` stops
    (:exc:`Stopped`); an object by a whole GET checked against the store's
    checksum where it keeps one (a ranged GET of the whole object would
    fail on servers that answer ranges with the whole object).
    """
    from ..engines.ranges import RangeChanged

    try:
        if not entry.size:
            volume.fs.info(volume.full_path(entry.path))  # still there
            return b""
        return _read_copy(volume, entry, inflight)
    except (RangeChanged, InterruptedError):
        raise PackError(f"{shown(entry.path)} changed since SOURCE was listed",
                        hint="rerun the pack once SOURCE stops changing") from None
    except FileNotFoundError:
        raise PackError(f"{shown(entry.path)} vanished since SOURCE was listed",
                        hint="rerun the pack once SOURCE stops changing") from None
    except OSError as exc:
        raise PackError(f"cannot read {shown(entry.path)}: {exc.strerror or exc}") from None


def _read_copy(volume: Volume, entry: FileEntry, inflight: Inflight) -> bytes:
    """Through the engine's copy (:meth:`ucstage.engines.engine.Engine.copy`,
    the cache's) into a memory file: one copy path, with its checks and its
    stop, for both."""
    from ..engines import engine
    from ..engines.context import FetchContext

    fd = os.memfd_create("ucstage-pack", os.MFD_CLOEXEC)
    try:
        copied = engine.of(volume).copy(volume, entry.path, fd, FetchContext(
            inflight=inflight, read_size=_READ_SIZE))
        if copied.size != entry.size or (entry.version and copied.version != entry.version):
            raise InterruptedError(f"{entry.path} changed since it was listed")
        return os.pread(fd, copied.size, 0)
    finally:
        os.close(fd)


def _in_order(volume: Volume, entries: list[FileEntry], jobs: int) -> Iterator[bytes]:
    """Each entry's bytes, in order, ``jobs`` read at once, at most ``4 * jobs``
    ahead of the consumer.

    The readers are daemon threads, not a ``ThreadPoolExecutor``'s: Python
    joins an executor's threads at exit, so Ctrl-C would wait for every read
    under way (seconds on a slow mount). Stopping (Ctrl-C, an error, the
    generator closed) stops the readers through an
    :class:`~ucstage.cache.inflight.Inflight`, as ``cache warm`` stops its
    copies: no file is started, and a file being read stops before its next
    :data:`_READ_SIZE` read; the reads under way end, or die with the process.
    """
    results: dict[int, tuple[bool, Any]] = {}
    cond = threading.Condition()
    inflight = Inflight()
    state = {"next": 0, "taken": 0}
    window = 4 * jobs

    def reader() -> None:
        while True:
            with cond:
                while (not inflight.stopped and state["next"] < len(entries)
                       and state["next"] >= state["taken"] + window):
                    cond.wait()
                if inflight.stopped or state["next"] >= len(entries):
                    return
                i = state["next"]
                state["next"] += 1
            try:
                out: tuple[bool, Any] = (True, _read(volume, entries[i], inflight))
            except Stopped:
                return  # nobody waits for it any more
            except BaseException as exc:  # handed to the consumer, raised there
                out = (False, exc)
            with cond:
                results[i] = out
                cond.notify_all()

    for _ in range(min(jobs, len(entries))):
        threading.Thread(target=reader, name="ucstage-pack", daemon=True).start()
    try:
        for i in range(len(entries)):
            with cond:
                while i not in results:
                    cond.wait()
                ok, value = results.pop(i)
                state["taken"] = i + 1
                cond.notify_all()
            if not ok:
                raise value
            yield value
    finally:
        inflight.stop()
        with cond:
            cond.notify_all()


def _write_share(volume: Volume, staging: str, part: str, plan: _Plan, rank: int, jobs: int,
                 callback: Callback) -> list[dict[str, Any]]:
    """Write the plan's shards into ``staging`` and commit the part; on any
    failure or stop, the shards this call wrote are deleted."""
    callback.set_description(f"packing rank {rank}" if rank else "packing")
    callback.set_size(plan.bytes, plan.files)
    files = [e for shard in plan.shards for sample in shard for e, _, _ in sample]
    data = _in_order(volume, files, jobs)
    written: list[str] = []
    index: list[dict[str, Any]] = []
    shard: TarShard | None = None
    try:
        for n, samples in enumerate(plan.shards):
            name = _SHARD.format(rank=rank, n=n)
            path = os.path.join(staging, name)
            remove_path(path)  # a stopped run's, killed before it could delete it
            shard = TarShard(path)
            written.append(path)
            for sample in samples:
                members = []
                for entry, _, suffix in sample:
                    members.append((suffix, next(data)))
                    callback.relative_update(entry.size)
                    callback.item_done(entry.path, "packed")
                shard.add(sample[0][1], members)
            index.append(shard.close(name))
            shard = None
        write_atomic(part, json.dumps({"format": FORMAT, "rank": rank, "shards": index}))
    except BaseException:
        if shard is not None:
            shard.abort()
        for path in written:
            remove_path(path)
        raise
    finally:
        data.close()  # type: ignore[attr-defined]  # a generator
        callback.set_description("")
    return index


def _forget_share(staging: str, rank: int, part: str) -> None:
    """``force``: drop this rank's committed part and shards (and a stale claim)."""
    remove_path(part)
    remove_path(os.path.join(staging, _CLAIM))
    prefix = f"shard-{rank:05d}-"
    for name in os.listdir(staging):
        if name.startswith(prefix):
            remove_path(os.path.join(staging, name))


def _committed(staging: str, part: str) -> list[dict[str, Any]] | None:
    """This rank's committed shards, when the part and all its shards are there."""
    try:
        with open(part, "rb") as fh:
            shards = json.load(fh)["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _complete(staging, {"shards": shards}):
        return None
    return list(shards)


def _parts(staging: str, world_size: int) -> list[str]:
    """The committed parts of this run, by rank."""
    names = []
    for name in sorted(os.listdir(staging)):
        match = _PART.fullmatch(name)
        if match and int(match.group(2)) == world_size:
            names.append(os.path.join(staging, name))
    return names


def _drop_if_empty(staging: str) -> None:
    """Remove the staging folder when no rank has left anything in it."""
    with contextlib.suppress(OSError):
        os.rmdir(staging)


# -- publishing -----------------------------------------------------------------------------

def _publish(staging: str, dest: str, manifest: Any, options: dict[str, Any], world_size: int,
             force: bool, callback: Callback) -> dict[str, Any] | None:
    """Claim the publish; if ours, swap the staging folder in for DEST and
    return the record. None: another rank claimed it."""
    claim = os.path.join(staging, _CLAIM)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return None
    try:
        callback.set_description("publishing")
        shards: list[dict[str, Any]] = []
        for path in _parts(staging, world_size):
            with open(path, "rb") as fh:
                shards.extend(json.load(fh)["shards"])
        record = {
            "format": FORMAT, "source": manifest.source, "fingerprint": manifest.fingerprint,
            "options": options, "world_size": world_size,
            "samples": sum(s["samples"] for s in shards),
            "files": sum(len(s["suffixes"]) for s in shards),
            "bytes": sum(sum(s["sizes"]) for s in shards),
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "ucstage_version": __version__, "shards": shards}
        with dest_lock(dest, callback):
            sweep_leftovers(dest)
            _check_dest(dest, force)  # again, under the lock: it may have changed
            # Not cut apart by a signal: the record replaces the parts, then the swap.
            with signals_deferred():
                write_atomic(os.path.join(staging, RECORD),
                             json.dumps(record, separators=(",", ":")))
                for path in _parts(staging, world_size):
                    os.unlink(path)
                os.unlink(claim)
                swap(staging, dest)
        _remove_stale(dest)
        return record
    except BaseException:
        remove_path(claim)
        raise
    finally:
        callback.set_description("")


def _remove_stale(dest: str) -> None:
    """Staging folders of other pack runs into ``dest``: obsolete once DEST is replaced."""
    parent, base = os.path.split(dest)
    pattern = re.compile(r"\." + re.escape(base) + r"\.ucstage-pack-[0-9a-f]{12}")
    for name in os.listdir(parent or os.curdir):
        if pattern.fullmatch(name):
            remove_path(os.path.join(parent, name))
