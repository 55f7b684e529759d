"""ShardDataset under torchrun: 2 ranks on gloo x 2 DataLoader workers each,
over tar shards written by the `webdataset` package and by GNU `tar`, and
JSON Lines written by pandas and by Hugging Face `datasets`
(`Dataset.to_json`): every sample is delivered exactly once per
epoch across the 4 slots, with the bytes the files hold."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import datasets
import pandas as pd
import pytest
import webdataset as wds

from tests.common.parts import REPO, free_port

pytestmark = [pytest.mark.torchrun]

WORKER = os.path.join(REPO, "tests", "workers", "shard_worker.py")


def digest(members: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for suffix in sorted(members):
        h.update(suffix.encode() + b"\0" + members[suffix] + b"\0")
    return h.hexdigest()


def make_source(root: Any) -> list[str]:
    """The source folder's samples, named as the worker names them."""
    src = root / "src"
    src.mkdir()
    want = []
    with wds.ShardWriter(str(src / "wds-%02d.tar"), maxcount=45, verbose=0) as w:
        for i in range(100):
            sample = {"__key__": f"w{i:04d}", "png": os.urandom(10 + i),
                      "cls": str(i % 7).encode()}
            w.write(sample)
            want.append(f"wds-{i // 45:02d}.tar/w{i:04d} "
                        f"{digest({'png': sample['png'], 'cls': sample['cls']})}")
    files = root / "files" / "g"
    files.mkdir(parents=True)
    for i in range(37):
        members = {"txt": os.urandom(i * 13), "json": json.dumps({"n": i}).encode()}
        for suffix, data in members.items():
            (files / f"{i:03d}.{suffix}").write_bytes(data)
        want.append(f"gnu.tar/g/{i:03d} {digest(members)}")
    subprocess.run(["tar", "cf", str(src / "gnu.tar"), "--sort=name", "-C", str(root / "files"),
                    "g"], check=True)
    frame = pd.DataFrame({"id": range(53), "text": [f"line {i}" for i in range(53)]})
    frame.to_json(src / "lines.jsonl", orient="records", lines=True)
    want += [f"jsonl {i} line {i}" for i in range(53)]
    hf = datasets.Dataset.from_dict({"id": list(range(1000, 1029)),
                                     "text": [f"hf {i}" for i in range(29)]})
    hf.to_json(str(src / "hf.jsonl"))  # JSON Lines, one record per line
    want += [f"jsonl {1000 + i} hf {i}" for i in range(29)]
    return want


def test_every_sample_once_on_two_ranks_two_workers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    want = make_source(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", WORKER,
           str(tmp_path / "src"), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    orders = []
    for epoch in range(2):
        got = [s for r in ranks for s in r["epochs"][epoch]["samples"]]
        assert Counter(got) == Counter(want), epoch  # every sample once, its bytes equal
        for r in ranks:
            e = r["epochs"][epoch]
            assert e["len"] == len(e["samples"])  # len(): this rank's samples
            assert e["audit"] == [len(want), 0, 0, True]  # the audit counts samples
        orders.append(got)
    assert orders[0] != orders[1]
