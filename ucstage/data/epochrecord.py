"""The per-epoch record: how each epoch's parameters reach DataLoader workers.

torch keeps persistent workers alive across epochs and, at each epoch's
start, makes every worker iterate *its own old copy* of the dataset again
(``_ResumeIteration`` carries only a seed, for IterDataPipes). Nothing set in
the main process since the workers started (``set_epoch``, a loaded state,
``equal_length``, the environment) would reach them. So the ucstage
DataLoader writes each epoch's parameters, before torch resets its workers,
into one small file the pickled dataset points to (:class:`EpochLink`), and
a sharded dataset's ``__iter__`` in a worker reads it first (:func:`apply`). Fresh
(non-persistent) workers read the same record, so there is one route.

Every record carries a generation number, one per started epoch iterator. A
worker knows which one it must read next: a different one is refused loudly
(:class:`StaleEpochRecord`) rather than silently dealing an old epoch.

An epoch given up before its end (a ``break``) is marked ``stopped`` in the
record; a watcher thread in each persistent worker (:func:`guarded`) then
closes that epoch's slot iterator, which ends its read-ahead copies and
lets go of its holds, even while the worker waits idle for its next task.

The file lives in a private folder (mode 0700) in ``/dev/shm`` when there is
one (memory, not disk), else the temp folder; it is removed when the loader
is collected or at exit.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from ..atomic import write_atomic
from ..errors import UcstageError

__all__ = ["EpochLink", "EpochRecord", "StaleEpochRecord", "apply", "guarded"]

_log = logging.getLogger("ucstage")

POLL_SECONDS = 0.05
"""How often a persistent worker's watcher looks for a stopped epoch."""
_SHM = "/dev/shm"

_FIELDS = ("epoch", "shuffle", "seed", "shuffle_scope", "equal_length", "nproc_per_node",
           "read_ahead")
"""The dataset attributes a worker takes from the record every epoch."""


class StaleEpochRecord(UcstageError):
    """A DataLoader worker found another epoch's record than the one it must read."""

    exit_code = 1


class EpochRecord:
    """The main process's side: one per loader, written once per epoch iterator."""

    def __init__(self) -> None:
        self.gen = 0
        self.path = ""
        self.base_env: dict[str, str] = {}
        """The environment the current workers started with."""
        self._payload: dict[str, Any] = {}
        self._done: set[int] = set()
        self._finalizer: weakref.finalize | None = None

    def _ensure(self) -> None:
        if self.path:
            return
        base = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK) else None
        folder = tempfile.mkdtemp(prefix="ucstage-epoch-", dir=base)
        self.path = os.path.join(folder, f"{secrets.token_hex(8)}.json")
        # Not a method of self: the finalizer must not keep the record alive.
        self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)

    @property
    def folder(self) -> str | None:
        return os.path.dirname(self.path) if self.path else None

    def write(self, dataset: Any, *, persistent: bool, fresh: bool) -> int:
        """Publish the epoch about to start; returns its generation.

        ``fresh``: the workers start now, with this process's environment.
        """
        self._ensure()
        if fresh:
            self.base_env = dict(os.environ)
        env = os.environ
        resume = dataset._link.resume
        self.gen += 1
        self._payload = {
            "gen": self.gen,
            "persistent": persistent,
            "stopped": False,
            **{name: getattr(dataset, name) for name in _FIELDS},
            "resume": resume.to_dict() if resume is not None else None,
            "env_set": {k: v for k, v in env.items() if self.base_env.get(k) != v},
            "env_unset": [k for k in self.base_env if k not in env],
        }
        self._flush()
        return self.gen

    def done(self, gen: int) -> None:
        """The epoch ran to its end: its workers closed their iterators themselves."""
        self._done.add(gen)

    def stop(self, gen: int) -> None:
        """The epoch of ``gen`` was given up: its workers close their iterators."""
        if gen != self.gen or gen in self._done or not self.path:
            return  # superseded (a newer record stops it too) or over
        self._payload["stopped"] = True
        try:
            self._flush()
        except OSError as exc:  # at exit the folder may be gone: nothing to stop
            _log.debug("could not mark epoch record %s stopped: %s", self.path, exc)

    def _flush(self) -> None:
        write_atomic(self.path, json.dumps(self._payload), mode=0o600)

    def close(self) -> None:
        """Remove the record's folder (also done when collected, or at exit)."""
        if self._finalizer is not None:
            self._finalizer()


class EpochLink:
    """Pickled with the dataset: the record's path and the generation due next."""

    def __init__(self, path: str, expect: int) -> None:
        self.path = path
        self.expect = expect

    def read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                payload: dict[str, Any] = json.load(fh)
        except (OSError, ValueError) as exc:
            raise StaleEpochRecord(
                f"DataLoader worker could not read its epoch record {self.path}: {exc}",
                hint="the loader that started this worker is gone") from exc
        gen = payload.get("gen")
        if gen == self.expect - 1 and not payload.get("persistent", True):
            return payload  # a worker of this epoch alone, iterating its dataset again
        if gen != self.expect:
            raise StaleEpochRecord(
                f"DataLoader worker expected epoch record {self.expect}, found {gen}: it "
                "would deal another epoch's files",
                hint="iterate the VolumeDataset once per epoch inside a worker, or pass "
                     "persistent_workers=False")
        self.expect = gen + 1
        return payload


def apply(dataset: Any) -> dict[str, Any] | None:
    """In a worker: take this epoch's parameters from the record (None without one)."""
    link = dataset._link.epoch_record
    if link is None:
        return None
    import torch.utils.data as tud

    if tud.get_worker_info() is None:
        return None  # the main process has the values itself
    payload = link.read()
    for name in _FIELDS:
        setattr(dataset, name, payload[name])
    resume = payload["resume"]
    if resume is None:
        dataset._link.resume = None
    else:
        from ..resume import LoaderState
        from .state import with_groups

        dataset._link.resume = with_groups(dataset, LoaderState.from_dict(resume))
    for name in payload["env_unset"]:
        os.environ.pop(name, None)
    os.environ.update(payload["env_set"])
    return payload


class _Watcher:
    """One daemon thread per worker process: stops runs whose epoch was given up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[int, Any]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, path: str, gen: int, stop: Any) -> None:
        with self._lock:
            self._runs[path] = (gen, stop)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ucstage-epoch-watch",
                                                daemon=True)
                self._thread.start()

    def forget(self, path: str, gen: int) -> None:
        with self._lock:
            if self._runs.get(path, (None,))[0] == gen:
                del self._runs[path]

    def _loop(self) -> None:
        seen: dict[str, tuple[int, int]] = {}
        while True:
            time.sleep(POLL_SECONDS)
            with self._lock:
                runs = dict(self._runs)
            for path, (gen, stop) in runs.items():
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # the loader is gone; torch ends this worker
                key = (st.st_ino, st.st_mtime_ns)
                if seen.get(path) == key:
                    continue
                try:
                    with open(path, encoding="utf-8") as fh:
                        payload = json.load(fh)
                except (OSError, ValueError):
                    continue
                seen[path] = key
                if payload.get("gen", 0) > gen or (payload.get("gen") == gen
                                                    and payload.get("stopped")):
                    self.forget(path, gen)
                    stop()


_WATCHER = _Watcher()


def guarded(inner: Iterator[str], link: EpochLink, gen: int) -> Iterator[str]:
    """``inner`` (a slot's iterator in a persistent worker), closed as soon as
    its epoch is given up, also while the worker waits for its next task."""
    lock = threading.Lock()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        with lock:  # never while the worker's own thread is inside next(inner)
            if stopped:
                return
            stopped = True
            try:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()  # its finally blocks stop the read-ahead, drop the holds
            except Exception:  # a close that fails must not kill the watcher
                _log.exception("closing an abandoned epoch's iterator failed")

    _WATCHER.watch(link.path, gen, stop)
    try:
        while True:
            with lock:
                if stopped:
                    return
                try:
                    item = next(inner)
                except StopIteration:
                    return
            yield item
    finally:
        _WATCHER.forget(link.path, gen)
        stop()
