"""The shard indexers and readers (ucstage/shardfiles/) on files other tools
wrote: tar shards by the `webdataset` package and by GNU `tar` (plain and
gzipped), JSON Lines by pandas, text with CRLF lines; and the bad inputs,
each a CorruptShard naming the file (and line)."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from typing import Any

import numpy as np
import pandas as pd
import pytest
import webdataset as wds

from ucstage.errors import CorruptShard
from ucstage.manifest.shardsamples import ShardManifest
from ucstage.shardfiles.shardformat import format_of
from ucstage.shardfiles.shardindex import SKIPPED, index_shard, read_block
from ucstage.volumes import FileEntry


def manifest_of(folder: str, names: list[str], block: int) -> ShardManifest:
    found, kinds, entries = [], [], []
    for name in names:
        kind = format_of(name)
        assert kind is not None
        path = os.path.join(folder, name)
        found.append(index_shard(path, name, *kind))
        kinds.append(kind)
        entries.append(FileEntry(name, os.path.getsize(path), "v"))
    return ShardManifest.build(folder, folder, entries, kinds, found, block)


def every_sample(folder: str, m: ShardManifest, **kw: Any) -> list[Any]:
    out = []
    for b in range(len(m)):
        out += read_block(m, b, os.path.join(folder, m.files[m.block_file(b)].path), **kw)
    return out


def webdataset_shards(folder: str, n: int, per: int) -> list[dict[str, Any]]:
    written = []
    with wds.ShardWriter(os.path.join(folder, "shard-%03d.tar"), maxcount=per, verbose=0) as w:
        for i in range(n):
            sample = {"__key__": f"k{i:05d}", "jpg": os.urandom(50 + 7 * i),
                      "json": json.dumps({"i": i}).encode(), "seg.png": os.urandom(3)}
            w.write(sample)
            written.append(sample)
    return written


def test_webdataset_shards_read_back_as_webdataset_reads_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = str(tmp_path)
    webdataset_shards(folder, 23, 10)
    names = sorted(os.listdir(folder))
    m = manifest_of(folder, names, block=4)
    assert m.samples == 23 and list(m.rows_per_group) == [4, 4, 2, 4, 4, 2, 3]
    ours = every_sample(folder, m)
    theirs = list(wds.WebDataset([os.path.join(folder, n) for n in names], shardshuffle=False))
    assert [s["__key__"] for s in ours] == [s["__key__"] for s in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert {k: a[k] for k in ("jpg", "json", "seg.png")} == \
            {k: b[k] for k in ("jpg", "json", "seg.png")}
        assert a["__shard__"] in names


def gnu_tar(tmp_path: Any, *flags: str) -> tuple[str, dict[str, dict[str, bytes]]]:
    src = tmp_path / "src"
    (src / "d.v2").mkdir(parents=True)
    want: dict[str, dict[str, bytes]] = {}
    for i in range(9):
        key = f"d.v2/{i:03d}" + ("x" * 120 if i == 4 else "")  # a GNU long name
        for suffix in ("txt", "cls"):
            data = os.urandom(i * 300)
            (src / f"{key}.{suffix}").write_bytes(data)
            want.setdefault(key, {})[suffix] = data
    out = str(tmp_path / "g.tar")
    subprocess.run(["tar", "cf", out, "--sort=name", *flags, "-C", str(src), "d.v2"],
                   check=True)
    return out, want


@pytest.mark.parametrize("gz", [False, True])
def test_gnu_tar_shards_group_by_key(tmp_path, gz) -> None:  # type: ignore[no-untyped-def]
    path, want = gnu_tar(tmp_path)
    if gz:
        subprocess.run(["gzip", path], check=True)
        path += ".gz"
    folder, name = os.path.split(path)
    m = manifest_of(folder, [name], block=2)
    got = every_sample(folder, m)
    assert {s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
            for s in got} == want
    assert [s["__key__"] for s in got] == sorted(want)  # the folder member is no sample


def test_jsonl_written_by_pandas_and_lines_with_crlf(tmp_path) -> None:  # type: ignore[no-untyped-def]
    frame = pd.DataFrame({"id": range(1000), "text": [f"row {i} ü" for i in range(1000)]})
    frame.to_json(tmp_path / "a.jsonl", orient="records", lines=True, force_ascii=False)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as fh:
        frame.iloc[:10].to_json(fh, orient="records", lines=True)
    (tmp_path / "c.txt").write_bytes(b"one\r\ntwo\n\nthree")
    m = manifest_of(str(tmp_path), ["a.jsonl", "b.jsonl.gz", "c.txt"], block=64)
    got = every_sample(str(tmp_path), m)
    assert got[:1000] == frame.to_dict("records")
    assert got[1000:1010] == frame.iloc[:10].to_dict("records")
    assert got[1010:] == ["one", "two", "", "three"]


def test_a_bad_json_line_is_named_by_file_and_line_or_skipped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "x.jsonl").write_text('{"a": 1}\n\n{"a": 2}\n{"a": oops}\n{"a": 4}\n')
    m = manifest_of(str(tmp_path), ["x.jsonl"], block=8)
    with pytest.raises(CorruptShard) as err:
        every_sample(str(tmp_path), m)
    assert err.value.message.startswith("line 4 of shard x.jsonl is not valid JSON")
    assert "oops" not in err.value.message  # no byte of the file's content
    errors: list[tuple[str, int]] = []
    got = every_sample(str(tmp_path), m, on_error="skip", errors=errors)
    assert got == [{"a": 1}, {"a": 2}, SKIPPED, {"a": 4}] and errors == [("x.jsonl", 4)]


def tar_bytes(members: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(members):
            info = tarfile.TarInfo(f"s{i}.bin")
            info.size = 1000
            tf.addfile(info, io.BytesIO(bytes([i]) * 1000))
    return buf.getvalue()


@pytest.mark.parametrize(("cut", "says"), [
    (300, "truncated: its first member is cut short"),        # the first header
    (512 + 600, "data runs past the end"),                     # the first member's data
    (3 * 1536 + 512 + 10, "data runs past the end"),           # a later member's data
    (3 * 1536, "no end-of-archive marker"),                    # a clean cut between members
])
def test_a_truncated_tar_is_refused(tmp_path, cut, says) -> None:  # type: ignore[no-untyped-def]
    data = tar_bytes(5)  # each member: a header and 2 blocks of data
    (tmp_path / "t.tar").write_bytes(data[:cut])
    with pytest.raises(CorruptShard) as err:
        index_shard(str(tmp_path / "t.tar"), "t.tar", "tar", False)
    assert "t.tar" in err.value.message and says in err.value.message


def test_a_gzip_cut_short_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    whole = gzip.compress(tar_bytes(50) + os.urandom(1))
    (tmp_path / "t.tar.gz").write_bytes(whole[: len(whole) // 2])
    text = gzip.compress(os.urandom(300000).hex().encode())
    (tmp_path / "l.txt.gz").write_bytes(text[:20000])
    with pytest.raises(CorruptShard, match=re.escape("gzip stream of shard t.tar.gz is cut short")):
        index_shard(str(tmp_path / "t.tar.gz"), "t.tar.gz", "tar", True)
    with pytest.raises(CorruptShard, match=re.escape("gzip stream of shard l.txt.gz is cut short")):
        index_shard(str(tmp_path / "l.txt.gz"), "l.txt.gz", "lines", True)


def test_a_shard_cut_after_indexing_is_refused_at_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "t.tar").write_bytes(tar_bytes(5))
    m = manifest_of(str(tmp_path), ["t.tar"], block=2)
    (tmp_path / "t.tar").write_bytes(tar_bytes(5)[:2000])
    with pytest.raises(CorruptShard, match="cut or replaced since it was indexed"):
        read_block(m, 1, str(tmp_path / "t.tar"))


def test_the_manifest_round_trips_and_its_fingerprint_covers_the_index(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ucstage.manifest import load
    from ucstage.manifest.files import write

    folder = str(tmp_path / "w")
    os.makedirs(folder)
    webdataset_shards(folder, 12, 5)
    m = manifest_of(folder, sorted(os.listdir(folder)), block=3)
    path = write(m, str(tmp_path / "x.shards.arrow"))
    back = load(path, kind=ShardManifest)
    assert back.fingerprint == m.fingerprint and back.intact()
    assert back.keys == m.keys and back.member_suffix == m.member_suffix
    assert np.array_equal(back.rows_per_group, m.rows_per_group)
    other = manifest_of(folder, sorted(os.listdir(folder)), block=4)
    assert other.fingerprint != m.fingerprint  # the blocks are part of the listing


def test_saving_and_loading_a_shard_manifest_never_imports_pandas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # pyarrow's pa.array() imports pandas when it is installed (about a second of
    # every freeze's start-up, measured by benchmarks.shards); the manifest is
    # built from buffers instead. A fresh interpreter, since this one has pandas.
    folder = tmp_path / "w"
    folder.mkdir()
    webdataset_shards(str(folder), 12, 5)
    (folder / "text.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    # (Not importing this module there: it imports pandas itself.)
    script = (
        "import os, sys\n"
        "from ucstage.manifest import load\n"
        "from ucstage.manifest.files import write\n"
        "from ucstage.manifest.shardsamples import ShardManifest\n"
        "from ucstage.shardfiles.shardformat import format_of\n"
        "from ucstage.shardfiles.shardindex import index_shard\n"
        "from ucstage.volumes import FileEntry\n"
        "folder, out = sys.argv[1], sys.argv[2]\n"
        "names = sorted(os.listdir(folder))\n"
        "kinds = [format_of(n) for n in names]\n"
        "found = [index_shard(os.path.join(folder, n), n, *k) for n, k in zip(names, kinds)]\n"
        "entries = [FileEntry(n, os.path.getsize(os.path.join(folder, n)), 'v') for n in names]\n"
        "m = ShardManifest.build(folder, folder, entries, kinds, found, 3)\n"
        "back = load(write(m, out), kind=ShardManifest)\n"
        "assert back.keys == m.keys and len(back.keys) == 14 and back.intact()\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('pandas', 'pyarrow'))[:1],"
        " 'pandas' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script, str(folder), str(tmp_path / "m.arrow")],
                          capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['pyarrow']", "False"], done.stdout
