"""Notebook-style training code over an object store: a wrapper dataset
defined inside a function (as in a notebook cell, it does not pickle), a
script fed on stdin (its ``__main__`` has no file), an explicit ``fork``.
The main process lists through a short-lived child (``ucstage.aside``), so it
never starts obstore's runtime, and workers forked from it read through
obstore with clients of their own, without a warning.

Each case runs in a fresh interpreter: whether obstore ran in a process is
process-wide state, which the other tests of a pytest worker change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.common.backends import make_source

KB = 1024

SCRIPT = r'''
import json, os, sys
import torch.utils.data as tud
from ucstage import DataLoader, VolumeDataset
from ucstage.engines import objstore
from ucstage.engines.engine import of as engine_of

def main(src, cache, context):
    class Wrapper(tud.IterableDataset):  # defined here: does not pickle
        def __init__(self, paths):
            self.paths = paths
        def __iter__(self):
            for path in self.paths:
                with open(path, "rb") as fh:
                    size = len(fh.read())
                yield {"name": os.path.basename(path), "size": size, "pid": os.getpid(),
                       "engine": engine_of(self.paths._get_volume()).name,
                       "obstore_here": objstore._used_in == os.getpid(),
                       "s3fs": "s3fs" in sys.modules}

    paths = VolumeDataset(src, cache_dir=cache, shuffle=True, seed=1)
    kwargs = {} if context is None else {"multiprocessing_context": context}
    loader = DataLoader(Wrapper(paths), batch_size=None, num_workers=2, **kwargs)
    epochs = []
    for epoch in range(2):
        paths.set_epoch(epoch)
        epochs.append(list(loader))
    start = loader.multiprocessing_context
    print(json.dumps({"epochs": epochs, "main_used_obstore": objstore._used_in is not None,
                      "start": None if start is None else start.get_start_method()}))

if __name__ == "__main__":
    main(*json.loads(os.environ["CASE"]))
'''


def _run(tmp_path, src: str, context: str | None, stdin: bool) -> tuple[dict, str]:  # type: ignore[no-untyped-def, type-arg]
    env = dict(os.environ, UCSTAGE_ENGINE="obstore",
               CASE=json.dumps([src, str(tmp_path / "cache"), context]))
    if stdin:
        args, text = [sys.executable, "-"], SCRIPT
    else:
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        args, text = [sys.executable, str(script)], None
    done = subprocess.run(args, input=text, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.parametrize("context, stdin", [(None, False), (None, True), ("fork", False)],
                         ids=["local-class", "stdin-script", "explicit-fork"])
def test_forked_workers_of_notebook_code_read_through_obstore(
        moto, tmp_path, context: str | None, stdin: bool) -> None:  # type: ignore[no-untyped-def]
    files = {f"d{i % 3}/f{i:02}.bin": os.urandom(2 * KB + i) for i in range(12)}
    src = make_source("s3", "", files)
    out, stderr = _run(tmp_path, src, context, stdin)
    assert not out["main_used_obstore"]  # listing went aside: the main process is clean
    assert out["start"] in (None, "fork")  # forked, as the platform's loader does
    sizes = {os.path.basename(k): len(v) for k, v in files.items()}
    for got in out["epochs"]:
        assert sorted(g["name"] for g in got) == sorted(sizes)  # each file once per epoch
        assert all(g["size"] == sizes[g["name"]] for g in got)
        assert len({g["pid"] for g in got}) == 2
        for g in got:  # a worker that fell back would say fsspec and have imported s3fs
            assert (g["engine"], g["obstore_here"], g["s3fs"]) == ("obstore", True, False)
    assert "fsspec" not in stderr and "WARNING" not in stderr.upper(), stderr


TABLE_SCRIPT = r'''
import json, os
import torch.utils.data as tud
from ucstage import DataLoader, TableDataset
from ucstage.engines import objstore

def main(src, cache):
    class Rows(tud.IterableDataset):  # defined here: does not pickle
        def __init__(self, table):
            self.table = table
        def __iter__(self):
            for batch in self.table:
                yield {"ids": batch.column("id").to_pylist(), "pid": os.getpid(),
                       "obstore_here": objstore._used_in == os.getpid()}

    table = TableDataset(src, cache_dir=cache, batch_rows=10, shuffle=True, seed=3)
    loader = DataLoader(Rows(table), batch_size=None, num_workers=2)
    got = list(loader)
    start = loader.multiprocessing_context
    print(json.dumps({"got": got, "main_used_obstore": objstore._used_in is not None,
                      "start": None if start is None else start.get_start_method()}))

if __name__ == "__main__":
    main(*json.loads(os.environ["CASE"]))
'''


def test_forked_workers_of_a_notebook_table_read_through_obstore(
        moto, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The footers are read in a child too, so a table's workers fork and use obstore."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {}
    for i in range(4):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": list(range(i * 50, i * 50 + 50))}), buf,
                       row_group_size=10)
        files[f"part-{i}.parquet"] = buf.getvalue()
    src = make_source("s3", "", files)
    script = tmp_path / "train_table.py"
    script.write_text(TABLE_SCRIPT)
    env = dict(os.environ, UCSTAGE_ENGINE="obstore",
               CASE=json.dumps([src, str(tmp_path / "cache")]))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["main_used_obstore"]
    assert out["start"] in (None, "fork")
    assert sorted(i for g in out["got"] for i in g["ids"]) == list(range(200))
    assert len({g["pid"] for g in out["got"]}) == 2
    assert all(g["obstore_here"] for g in out["got"])
    assert "WARNING" not in done.stderr.upper(), done.stderr
