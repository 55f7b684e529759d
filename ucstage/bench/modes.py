"""The four ways bench reads the sample, one small class each.

The driver (:func:`ucstage.bench.run`) runs every mode at every worker count
and knows nothing about any of them: it asks a mode to :meth:`Mode.prepare`
(untimed), :meth:`Mode.measure` (timed) and :meth:`Mode.cleanup`. What the
modes share, the sample, the deadline and the one private cache on disk, is
a :class:`Job`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..errors import MissingDependency
from ..manifest import Manifest
from ..progress import Callback
from ..sharding import DEFAULT_SHUFFLE_SCOPE
from ..volumes import FileEntry, Volume
from .measure import FileReader, Meter, ReadTally, measure, raise_read_error
from .pagecache import resident_share

if TYPE_CHECKING:
    from ..cache.local import LocalCache

__all__ = ["MODE_TYPES", "Cold", "Direct", "Job", "Loader", "Mode", "Threads", "Timing", "Warm"]

PROBE_FILES = 200
"""Files whose page-cache residency is asked before a run that reads the source."""

Timing = tuple[ReadTally, float, bool]
"""What a timed run counted, its seconds, and whether it read every file."""


@dataclass
class Job:
    """What every mode of one bench shares."""

    manifest: Manifest
    volume: Volume
    files: list[FileEntry]
    """The sample, in listing order."""
    batch_size: int
    fill_workers: int
    """Readers for the untimed warm fill: the largest worker count asked for."""
    deadline: float | None
    """The whole bench's deadline (a run gets its own share, passed to measure)."""
    callback: Callback
    scratch: str | None
    """The private folder for caches; None when no mode needs one."""
    notes: list[str] = field(default_factory=list)
    shuffle: tuple[bool, int, str, int | None] = (False, 0, DEFAULT_SHUFFLE_SCOPE, None)
    """The loader mode's (shuffle, seed, shuffle_scope, nproc_per_node)."""
    cache: LocalCache | None = None
    """The last cold run's cache, which warm runs reuse."""
    cache_root: str | None = None

    def fresh_cache(self, name: str) -> LocalCache:
        """An empty private cache; the previous one is removed first, so only
        one copy of the sample is on the scratch disk at a time."""
        from ..cache.local import LocalCache

        assert self.scratch is not None, "a cache mode ran without a scratch folder"
        if self.cache_root is not None:
            shutil.rmtree(self.cache_root, ignore_errors=True)
        self.cache_root = os.path.join(self.scratch, name)
        self.cache = LocalCache(self.cache_root)
        return self.cache


class Mode:
    """One way of reading the sample; subclasses set ``name`` and override
    what they need. The driver calls prepare, measure, then cleanup, once per
    worker count, in that order."""

    name: ClassVar[str]
    needs_scratch: ClassVar[bool] = False
    """Whether the mode makes caches under the job's scratch folder."""
    threads: ClassVar[bool] = False
    """Whether its workers are reader threads (which need at least one)."""
    reads_source: ClassVar[bool] = False
    """Whether each run reads the source itself (not a cache filled earlier)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.page_cache: float | None = None
        """Share of the sample's bytes in the OS page cache before the run."""

    def probe_page_cache(self, files: Sequence[FileEntry]) -> None:
        """Before a run that reads a local or mounted source: how much of it is in memory."""
        volume = self.job.volume
        if not (self.reads_source and volume.is_local and files):
            self.page_cache = None
            return
        # An even spread of at most PROBE_FILES files tells the share well
        # enough; opening every file of a large sample on a mount would not be free.
        step = -(-len(files) // PROBE_FILES)
        self.page_cache = resident_share([volume.full_path(e.path) for e in files[::step]])

    def prepare(self, workers: int, label: str) -> Sequence[FileEntry]:
        """Untimed setup before a run; return the files the run reads.

        ``label`` is the run's place among all runs ("3/9"), for progress.
        """
        return self.job.files

    def measure(self, workers: int, files: Sequence[FileEntry], deadline: float | None,
                meter: Meter) -> Timing:
        """Read ``files`` with ``workers`` readers until done or ``deadline``."""
        raise NotImplementedError

    def cleanup(self) -> None:
        """Called after every run, also when it raised."""


class Threads(Mode):
    """A mode whose workers are reader threads in this process, each reading
    through :meth:`cache` (None: straight from the source)."""

    threads = True

    def cache(self) -> LocalCache | None:
        return None

    def measure(self, workers: int, files: Sequence[FileEntry], deadline: float | None,
                meter: Meter) -> Timing:
        reader = FileReader(self.job.volume, self.cache())
        timing = measure(files, workers, reader.read, deadline=deadline, meter=meter)
        raise_read_error(timing[0], self.name)
        return timing


class Direct(Threads):
    """Read every file from the source; no cache."""

    name = "direct"
    reads_source = True


class Cold(Threads):
    """``LocalCache.fetch`` into an empty private cache, then read the copy."""

    name = "cold"
    needs_scratch = True
    reads_source = True

    def prepare(self, workers: int, label: str) -> Sequence[FileEntry]:
        self.job.fresh_cache(f"cold-{workers}")
        return self.job.files

    def cache(self) -> LocalCache | None:
        return self.job.cache


class Warm(Threads):
    """``LocalCache.fetch`` on the cache the last cold run filled (a validated
    hit), then read the copy. Without a cold run, the cache is filled first,
    untimed."""

    name = "warm"
    needs_scratch = True

    def prepare(self, workers: int, label: str) -> Sequence[FileEntry]:
        job = self.job
        cache = job.cache or job.fresh_cache("warm")
        missing = [e for e in job.files if cache.lookup(job.volume, e) is None]
        if not missing:
            return job.files

        def fill(entry: FileEntry, buf: bytearray, stop: threading.Event) -> int:
            cache.fetch(job.volume, entry)
            return entry.size

        # The fill counts against the whole bench's time, not this run's share:
        # a warm run has nothing to measure until it is done.
        meter = Meter(job.callback, f"{label} filling warm cache", missing, status="fetched")
        tally, _, _ = measure(missing, job.fill_workers, fill, deadline=job.deadline,
                              meter=meter)
        raise_read_error(tally, "warm-cache fill")
        cached = [e for e in job.files if cache.lookup(job.volume, e) is not None]
        if len(cached) < len(job.files):
            job.notes.append(f"warm runs read the {len(cached)} of {len(job.files)} "
                             "sample files that were cached before the time ran out")
        return cached

    def cache(self) -> LocalCache | None:
        return self.job.cache


class Loader(Mode):
    """The training path end to end: VolumeDataset, through its own fresh
    private cache, inside ucstage's DataLoader with ``num_workers`` workers."""

    name = "loader"
    needs_scratch = True
    root: str | None = None

    def prepare(self, workers: int, label: str) -> Sequence[FileEntry]:
        assert self.job.scratch is not None, "loader mode ran without a scratch folder"
        self.root = tempfile.mkdtemp(prefix=f"loader-{workers}-", dir=self.job.scratch)
        return self.job.files

    def measure(self, workers: int, files: Sequence[FileEntry], deadline: float | None,
                meter: Meter) -> Timing:
        # Imported here: the module imports torch, which only this mode needs.
        try:
            from .loadermode import loader_run
        except MissingDependency:
            raise
        except ImportError as exc:
            raise MissingDependency("loader needs torch",
                                    hint="pip install 'ucstage[torch]' "
                                         "(on a CPU machine: pip install torch==2.13.0)") from exc
        assert self.root is not None
        return loader_run(self.job.manifest, files, workers, self.job.batch_size, self.root,
                          deadline, meter, shuffle=self.job.shuffle)

    def cleanup(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


MODE_TYPES: dict[str, type[Mode]] = {m.name: m for m in (Direct, Cold, Warm, Loader)}
"""Each mode's class by name."""
