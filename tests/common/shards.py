"""Tar shards written by the `webdataset` package, for ShardDataset's tests."""

from __future__ import annotations

import json
import os

import webdataset as wds


def write_shards(folder: str, n: int, per: int) -> dict[str, dict[str, bytes]]:
    """``n`` samples in shards of ``per`` by webdataset's ShardWriter: {key: members}."""
    os.makedirs(folder, exist_ok=True)
    want = {}
    with wds.ShardWriter(os.path.join(folder, "part-%03d.tar"), maxcount=per, verbose=0) as w:
        for i in range(n):
            sample = {"__key__": f"k{i:05d}", "jpg": os.urandom(20 + i % 50),
                      "json": json.dumps({"i": i}).encode()}
            w.write(sample)
            want[sample["__key__"]] = {"jpg": sample["jpg"], "json": sample["json"]}
    return want
