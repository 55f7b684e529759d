"""`ucstage pack` read back by others and by ShardDataset: a local folder and
moto `s3://` (both engines) packed into tar shards that the `webdataset`
package and GNU `tar` read with SOURCE's samples and bytes; ShardDataset
over the pack takes the index (no shard fetched or scanned at freeze) and
scans a shard whose size no longer matches; the index equals a scan of the
shards; grouping, order, skip on rerun, force, two ranks into one DEST."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import webdataset as wds

from tests.common.backends import make_source
from ucstage import ShardDataset
from ucstage.packing import pack
from ucstage.shardfiles import sourceindex
from ucstage.shardfiles.packindex import RECORD
from ucstage.shardfiles.tarindex import index_tar

FIELDS = ("keys", "starts", "stops", "member_start", "suffixes", "offsets", "sizes")


def pairs(n: int = 30) -> dict[str, bytes]:
    """``n`` image-caption pairs in two class folders, sizes varied."""
    files = {}
    for i in range(n):
        cls = "cat" if i % 2 else "dog"
        files[f"{cls}/{i:04d}.jpg"] = os.urandom(100 + 37 * i)
        files[f"{cls}/{i:04d}.json"] = json.dumps({"i": i, "cls": cls}).encode()
    return files


def shards(dest: str) -> list[str]:
    return sorted(str(p) for p in Path(dest).glob("*.tar"))


def read_wds(dest: str) -> dict[str, dict[str, bytes]]:
    got: dict[str, dict[str, bytes]] = {}
    for sample in wds.WebDataset(shards(dest), shardshuffle=False):
        key = sample["__key__"]
        assert key not in got, f"sample {key} read twice"
        got[key] = {k: v for k, v in sample.items() if not k.startswith("__")}
    return got


def by_key(files: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    want: dict[str, dict[str, bytes]] = {}
    for rel, data in files.items():
        key, _, suffix = rel.partition(".")
        want.setdefault(key, {})[suffix] = data
    return want


def tar_members(dest: str) -> list[str]:
    names = []
    for path in shards(dest):
        out = subprocess.run(["tar", "-tf", path], capture_output=True, text=True, check=True)
        names += out.stdout.splitlines()
    return names


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The shards ShardDataset's freeze scans (index_shard wrapped, still run)."""
    seen: list[str] = []
    real = sourceindex.index_shard

    def counting(path: str, name: str, format: str, gz: bool) -> Any:
        seen.append(name)
        return real(path, name, format, gz)

    monkeypatch.setattr(sourceindex, "index_shard", counting)
    return seen


def test_pack_reads_back_everywhere(source_kind: str, tmp_path: Path, scans: list[str]) -> None:
    files = pairs()
    source = make_source(source_kind, str(tmp_path / "src"), files)
    dest = str(tmp_path / "packed")
    result = pack(source, dest, group="key", samples_per_shard=7, shuffle=True, seed=5)
    assert result.published and not result.skipped_unchanged
    want = by_key(files)

    assert read_wds(dest) == want
    members = tar_members(dest)
    assert sorted(members) == sorted(files)  # every file once, named key.ext
    # A sample's members are consecutive: WebDataset groups only those.
    keys = [m.partition(".")[0] for m in members]
    assert len([k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]) == len(want)
    # Seeded order: the first shard mixes both classes, and not in listing order.
    assert {k.split("/")[0] for k in keys[:14]} == {"cat", "dog"}
    assert keys != sorted(keys)

    # The index beside the shards is exactly what a scan of each shard finds.
    record = json.loads((Path(dest) / RECORD).read_text())
    assert [s["path"] for s in record["shards"]] == [os.path.basename(p) for p in shards(dest)]
    for entry in record["shards"]:
        scanned = index_tar(os.path.join(dest, entry["path"]), entry["path"], False)
        assert {f: getattr(scanned, f) for f in FIELDS} == {f: entry[f] for f in FIELDS}

    # ShardDataset takes the index: freeze fetches and scans no shard...
    cache = tmp_path / "cache"
    ds = ShardDataset(dest, cache_dir=str(cache))
    assert ds.freeze().samples == len(want)
    assert scans == []
    assert not [p for p in cache.rglob("*.tar")]
    # ...and reads the same samples and bytes.
    got = {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")} for s in ds}
    assert got == want


def test_a_shard_whose_size_changed_is_scanned(tmp_path: Path, scans: list[str]) -> None:
    src = tmp_path / "src"
    make_source("local", str(src), pairs(12))
    dest = tmp_path / "packed"
    pack(str(src), str(dest), group="key", samples_per_shard=4)
    # Rewrite one shard with other samples, as another tool might: the index
    # no longer describes it (its size differs), so that one is scanned, the
    # others not.
    victim = shards(str(dest))[1]
    before = os.path.getsize(victim)
    with tarfile.open(victim, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(3):
            data = os.urandom(5000 + i)
            info = tarfile.TarInfo(f"new/{i}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert os.path.getsize(victim) != before
    ds = ShardDataset(str(dest), cache_dir=str(tmp_path / "cache"))
    assert ds.freeze().samples == 11
    assert scans == [os.path.basename(victim)]
    assert len(list(ds)) == 11


def test_each_file_is_a_sample_in_listing_order(tmp_path: Path) -> None:
    files = {f"d/{i:03d}.bin": os.urandom(3000) for i in range(20)}
    files["d/skip.txt"] = b"notes"
    src = tmp_path / "src"
    make_source("local", str(src), files)
    dest = str(tmp_path / "packed")
    # --shard-size as other size flags take it; 8 KiB holds two 3000-byte files.
    proc = subprocess.run([sys.executable, "-m", "ucstage", "pack", str(src), dest,
                           "--exclude", "*.txt", "--shard-size", "8K", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["pack"] == {"samples": 20, "files": 20, "bytes": 60000, "shards": 10}
    assert tar_members(dest) == sorted(f for f in files if f.endswith(".bin"))
    assert all(os.path.getsize(p) <= 10240 for p in shards(dest))  # tar pads to 10 KiB records
    assert read_wds(dest) == {k.partition(".")[0]: {"bin": v} for k, v in files.items()
                              if k.endswith(".bin")}


def test_rerun_skips_force_repacks_a_change_repacks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_source("local", str(src), pairs(10))
    dest = str(tmp_path / "packed")
    first = pack(str(src), dest, group="key")
    stamps = {p: os.stat(p).st_ino for p in shards(dest)}
    again = pack(str(src), dest, group="key")
    assert again.skipped_unchanged and not again.published
    assert {p: os.stat(p).st_ino for p in shards(dest)} == stamps  # untouched
    assert again.record == first.record
    # Other options are another pack.
    other = pack(str(src), dest, group="key", samples_per_shard=3)
    assert other.published and len(shards(dest)) == 4
    forced = pack(str(src), dest, group="key", samples_per_shard=3, force=True)
    assert forced.published and not forced.skipped_unchanged
    # A changed source file is packed again, with its new bytes.
    (src / "cat" / "0001.jpg").write_bytes(b"new bytes")
    changed = pack(str(src), dest, group="key", samples_per_shard=3)
    assert changed.published
    assert read_wds(dest)["cat/0001"]["jpg"] == b"new bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "src"]  # nothing beside


def test_two_ranks_pack_disjoint_shares_into_one_dest(tmp_path: Path) -> None:
    files = pairs(40)
    src = tmp_path / "src"
    make_source("local", str(src), files)
    dest = str(tmp_path / "packed")
    base = [sys.executable, "-m", "ucstage", "pack", str(src), dest, "--group", "key",
            "--samples-per-shard", "6", "--shuffle", "--json"]
    # Rank 0 by flags, rank 1 by torchrun's variables; both at once.
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2"}
    procs = [subprocess.Popen([*base, "--rank", "0", "-w", "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True),
             subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    results = [json.loads(out) for out, _ in outs]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert sum(r["published"] for r in results) == 1  # exactly one published
    assert sum(r["share"]["samples"] for r in results) == 40
    assert read_wds(dest) == by_key(files)
    assert Counter(tar_members(dest)) == Counter(list(files))  # every file once
    names = {os.path.basename(p) for p in shards(dest)}
    assert {n[:11] for n in names} == {"shard-00000", "shard-00001"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "src"]  # no staging left
    # A rerun of either rank finds the pack unchanged.
    again = subprocess.run([*base, "--rank", "1", "-w", "2"], capture_output=True, text=True)
    assert json.loads(again.stdout)["skipped_unchanged"] is True


def test_a_missing_rank_rerun_finishes_the_pack(tmp_path: Path) -> None:
    files = pairs(10)
    src = tmp_path / "src"
    make_source("local", str(src), files)
    dest = str(tmp_path / "packed")
    r0 = pack(str(src), dest, group="key", rank=0, world_size=2)
    assert not r0.published and r0.parts_done == 1 and not os.path.exists(dest)
    r1 = pack(str(src), dest, group="key", rank=1, world_size=2)
    assert r1.published and r1.parts_done == 2
    assert read_wds(dest) == by_key(files)
