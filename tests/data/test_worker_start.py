"""How the ucstage DataLoader starts its workers over an object-store volume
once the main process has itself read through obstore (here: by iterating
the dataset without workers first): from a forkserver, so each worker reads
through obstore with a client and runtime of its own; with an explicit
``fork`` they read through fsspec, and one warning says so. Listing alone
leaves the main process clean and workers fork
(tests/data/test_notebook_workers.py)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch.utils.data as tud

from tests.common.backends import make_source
from ucstage import DataLoader, VolumeDataset
from ucstage.data import workerstart
from ucstage.engines import objstore
from ucstage.engines.engine import of as engine_of

KB = 1024
MARK = "UCSTAGE_TEST_WORKER_MARK"


class Seen(tud.IterableDataset):  # type: ignore[type-arg]
    """Each file's bytes, with what the process that fetched it saw: which
    engine reads the volume there, whether obstore ran in that very process,
    and whether fsspec's S3 backend was ever imported there."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for path in self.paths:
            with open(path, "rb") as fh:
                data = fh.read()
            yield {"name": os.path.basename(path), "data": data, "pid": os.getpid(),
                   "engine": engine_of(self.paths._get_volume()).name,
                   "obstore_here": objstore._used_in == os.getpid(),
                   "s3fs": "s3fs" in sys.modules, "mark": os.environ.get(MARK)}


def _read_here(src: str, tmp_path: Any) -> None:
    """Read ``src`` once in this process, without workers (into a cache of its
    own, so the loader's workers still fetch): obstore's runtime now runs
    here, so workers forked from here could not use it."""
    assert len(list(VolumeDataset(src, cache_dir=str(tmp_path / "read-here")))) > 0
    assert objstore._used_in == os.getpid()


def _source(n: int) -> tuple[str, dict[str, bytes]]:
    files = {f"f{i:02}.bin": os.urandom(3 * KB + i) for i in range(n)}
    return make_source("s3", "", files), files


def test_default_workers_read_through_obstore_with_their_own_clients(
        moto, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    src, files = _source(10)
    paths = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    _read_here(src, tmp_path)
    loader = DataLoader(Seen(paths), batch_size=None, num_workers=2)
    got = list(loader)
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    assert sorted(g["name"] for g in got) == sorted(files)
    assert all(g["data"] == files[g["name"]] for g in got)
    assert len({g["pid"] for g in got}) == 2 and os.getpid() not in {g["pid"] for g in got}
    for g in got:  # a worker that fell back would say fsspec and have imported s3fs
        assert (g["engine"], g["obstore_here"], g["s3fs"]) == ("obstore", True, False)
    # The forkserver runs now; workers still get the environment of the epoch's start.
    monkeypatch.setenv(MARK, "epoch 2")
    again = list(loader)
    assert sorted(g["name"] for g in again) == sorted(files)
    assert {(g["engine"], g["mark"]) for g in again} == {("obstore", "epoch 2")}


def test_an_explicit_fork_reads_through_fsspec_and_warns_once(
        moto, monkeypatch, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    monkeypatch.setattr(workerstart, "_warned", set())
    src, files = _source(8)
    paths = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    _read_here(src, tmp_path)
    loader = DataLoader(Seen(paths), batch_size=None, num_workers=2,
                        multiprocessing_context="fork")
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        epochs = [list(loader) for _ in range(2)]
    for got in epochs:
        assert sorted(g["name"] for g in got) == sorted(files)
        assert all(g["data"] == files[g["name"]] for g in got)
        assert {g["engine"] for g in got} == {"fsspec"}
    # Only the start's own warnings: a loader an earlier test left mid-epoch
    # may be collected now and log its skipped audit.
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "DataLoader workers" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "fork" in warnings[0] and "fsspec" in warnings[0] and src in warnings[0]
    assert "multiprocessing_context" in warnings[0]


class _Unpicklable:
    def __init__(self) -> None:
        self.lock = __import__("threading").Lock()

    def __call__(self, worker_id: int) -> None:
        pass


def test_workers_fork_and_say_why_when_what_they_run_does_not_pickle(
        moto, monkeypatch, tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    monkeypatch.setattr(workerstart, "_warned", set())
    src, files = _source(4)
    paths = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    _read_here(src, tmp_path)
    loader = DataLoader(Seen(paths), batch_size=None, num_workers=2,
                        worker_init_fn=_Unpicklable())
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        got = list(loader)
    assert sorted(g["name"] for g in got) == sorted(files)
    assert {g["engine"] for g in got} == {"fsspec"}
    # Only the start's own warnings: a loader an earlier test left mid-epoch
    # may be collected now and log its skipped audit.
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "DataLoader workers" in r.getMessage()]
    assert len(warnings) == 1 and "does not pickle" in warnings[0], warnings


def test_a_local_volume_keeps_fork(tmp_path) -> None:  # type: ignore[no-untyped-def]
    src, _ = tmp_path / "vol", None
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.bin").write_bytes(b"x" * (i + 1))
    loader = DataLoader(VolumeDataset(str(src), cache_dir=str(tmp_path / "cache")),
                        batch_size=None, num_workers=2)
    assert len(list(loader)) == 4
    assert loader.multiprocessing_context is None  # torch's default: fork on Linux


@pytest.mark.parametrize("script, reruns", [
    ("if __name__ == '__main__':\n    run()\n", False),
    ("x = 1\nrun()\n", True),
    ("if '__main__' == __name__:\n    x = 1\n    run()\n", False),
    ("def main():\n    run()\nif __name__ == '__main__':\n    main()\n", False),
    ("def main():\n    run()\nmain()\n", True),
])
def test_a_script_that_would_run_again_in_each_worker_is_found(
        tmp_path, monkeypatch, script: str, reruns: bool) -> None:  # type: ignore[no-untyped-def]
    """A fresh worker imports the main script again: iterating the loader at
    its top level, outside the ``__main__`` guard, would train in every worker."""
    import types

    path = tmp_path / "train.py"
    path.write_text(script)
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    found: list[str | None] = []
    main.__dict__["run"] = lambda: found.append(workerstart._main_reruns())
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec(compile(script, str(path), "exec"), main.__dict__)
    assert (found[0] is not None) == reruns, found
