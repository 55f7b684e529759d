"""Manifests: freeze, save, load, fingerprint checks, and use as a SOURCE."""

from __future__ import annotations

import json

import pytest

from ucstage.errors import EmptySource, ManifestError, SourceNotFound
from ucstage.manifest import fingerprint, load, save, snapshot
from ucstage.manifest.files import is_manifest_file
from ucstage.volumes import FileEntry


@pytest.fixture
def vol(tmp_path):
    root = tmp_path / "vol"
    (root / "sub").mkdir(parents=True)
    for name, data in {"a.bin": b"a", "sub/b.bin": b"bb", "_SUCCESS": b""}.items():
        (root / name).write_bytes(data)
    return root


def test_roundtrip_and_fingerprint(vol, tmp_path):
    m = snapshot(str(vol))
    assert [e.path for e in m.entries] == ["a.bin", "sub/b.bin"]
    assert m.fingerprint == fingerprint(m.entries)
    path = save(m, tmp_path / "m.json")
    again = load(path)
    assert again.entries == m.entries
    assert again.fingerprint == m.fingerprint
    assert again.source == str(vol)
    assert is_manifest_file(path)
    assert not is_manifest_file(str(vol / "a.bin"))


def test_fingerprint_depends_on_every_field():
    base = [FileEntry("a", 1, "v1"), FileEntry("b", 2, "v2")]
    fp = fingerprint(base)
    assert fp == fingerprint(list(base))
    for changed in ([FileEntry("a", 1, "v1"), FileEntry("b", 3, "v2")],
                    [FileEntry("a", 1, "v1"), FileEntry("b", 2, "v3")],
                    [FileEntry("a", 1, "v1"), FileEntry("c", 2, "v2")],
                    [FileEntry("b", 2, "v2"), FileEntry("a", 1, "v1")],
                    base[:1]):
        assert fingerprint(changed) != fp


def test_manifest_is_frozen_while_volume_changes(vol, tmp_path):
    path = save(snapshot(str(vol)), tmp_path / "m.json")
    (vol / "c.bin").write_bytes(b"new")
    frozen = snapshot(manifest=str(path))
    assert [e.path for e in frozen.entries] == ["a.bin", "sub/b.bin"]
    assert [e.path for e in snapshot(str(path)).entries] == ["a.bin", "sub/b.bin"]
    assert len(snapshot(str(vol)).entries) == 3


def test_volumes_source_is_kept_for_re_resolution(vol, tmp_path, monkeypatch):
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path))
    m = snapshot("/Volumes/vol")
    assert m.source == "/Volumes/vol"
    assert m.volume().root == str(vol)


def test_tampered_manifest_fails_fingerprint(vol, tmp_path):
    path = save(snapshot(str(vol)), tmp_path / "m.json")
    with open(path) as fh:
        data = json.load(fh)
    data["files"][0][1] = 999
    with open(path, "w") as fh:
        json.dump(data, fh)
    with pytest.raises(ManifestError, match="fingerprint"):
        load(path)


@pytest.mark.parametrize("content", ["not json", "[]", '{"format": "other"}',
                                     '{"format": "ucstage.manifest", "format_version": 1}',
                                     '{"format": "ucstage.manifest", "format_version": 9}'])
def test_malformed_manifests(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ManifestError):
        load(path)


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        load(tmp_path / "nope.json")


def test_empty_source(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "_SUCCESS").write_bytes(b"")
    with pytest.raises(EmptySource):
        snapshot(str(tmp_path / "e"))
    assert len(snapshot(str(tmp_path / "e"), allow_empty=True).entries) == 0


def test_save_refuses_a_folder(vol, tmp_path):
    from ucstage.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="is a folder"):
        save(snapshot(str(vol)), tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InvalidArgument, match="not a folder"):
        save(snapshot(str(vol)), tmp_path / "afile" / "m.json")


def test_named_manifest_that_is_broken_is_reported_not_read_as_data(tmp_path):
    bad = tmp_path / "train.manifest.json"
    bad.write_text("garbage{")
    with pytest.raises(ManifestError, match="not a ucstage manifest") as info:
        snapshot(str(bad))
    assert "recreate it" in info.value.hint


@pytest.mark.parametrize("content", ['{"a": 1}', "[1, 2]", '{"format": "other"}', "not json"])
def test_a_json_source_that_is_not_a_manifest_is_refused(tmp_path, content):
    """A .json SOURCE is read as a manifest, never planned as a one-file source;
    the hint says how to stage a JSON data file instead."""
    other = tmp_path / "data.JSON"
    other.write_text(content)
    assert is_manifest_file(str(other))
    with pytest.raises(ManifestError, match="is not a ucstage manifest") as info:
        snapshot(str(other))
    assert f"give its folder {tmp_path} with `include` data.JSON" in info.value.hint


def test_a_large_json_data_file_is_refused_without_parsing_it(tmp_path, monkeypatch):
    big = tmp_path / "records.json"
    big.write_text("[" + ",".join(['{"x": 1}'] * 100_000) + "]")
    for name in ("load", "loads"):
        monkeypatch.setattr(json, name, lambda *a, **k: pytest.fail("parsed the whole file"))
    with pytest.raises(ManifestError, match="is not a ucstage manifest"):
        load(big)


def test_a_manifest_with_its_keys_reordered_still_loads(vol, tmp_path):
    m = snapshot(str(vol))
    path = save(m, tmp_path / "m.json")
    with open(path) as fh:
        data = json.load(fh)
    # Pad it so the marker is far from the head, as sort_keys puts "format" near the end.
    data["filters"]["pad"] = "x" * 200_000
    (tmp_path / "sorted.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    assert snapshot(str(tmp_path / "sorted.json")).fingerprint == m.fingerprint
    plain = tmp_path / "frozen.listing"  # any name: the marker at its start says what it is
    plain.write_text((tmp_path / "m.json").read_text())
    assert is_manifest_file(str(plain)) and snapshot(str(plain)).fingerprint == m.fingerprint


def test_json_sources_are_manifests_wherever_they_live(vol, tmp_path, monkeypatch):
    """The .json rule does not depend on the kind of SOURCE: a manifest on a
    volume or behind a URL loads, a JSON data file there is refused the same."""
    import fsspec

    from tests.common.parts import unique

    key = unique()
    fs = fsspec.filesystem("memory")
    m = snapshot(str(vol))
    saved = save(m, tmp_path / "m.json")
    with open(saved, "rb") as fh:
        fs.pipe(f"/{key}/train.manifest.json", fh.read())
    fs.pipe(f"/{key}/coco.json", b'{"images": []}')
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", f"memory://{key}")
    try:
        for where in (f"memory://{key}", "/Volumes", "dbfs:/Volumes"):
            assert is_manifest_file(f"{where}/train.manifest.json")
            assert snapshot(f"{where}/train.manifest.json").fingerprint == m.fingerprint
            with pytest.raises(ManifestError, match=r"coco\.json is not a ucstage manifest") as info:
                snapshot(f"{where}/coco.json")
            assert f"give its folder {where} with `include` coco.json" in info.value.hint
        with pytest.raises(SourceNotFound, match=f"memory://{key}/nope.json does not exist"):
            load(f"memory://{key}/nope.json")
    finally:
        fs.rm(f"/{key}", recursive=True)


def test_a_fresh_listing_does_not_resolve_its_source_again(vol, tmp_path, monkeypatch):
    """volume() of a manifest this process just listed reuses the listing's
    volume (no second HEAD + LIST against a store); the same as resolving
    afresh, and a pickled copy (another process) resolves afresh."""
    import dataclasses
    import pickle

    from ucstage import volumes
    from ucstage.volumes import location

    monkeypatch.chdir(tmp_path)
    m = snapshot("vol/")  # relative, with a slash: named as resolve() names it
    kinds = []
    real_kind = location.kind_of
    monkeypatch.setattr(location, "kind_of", lambda v: kinds.append(v) or real_kind(v))
    got = m.volume()
    assert kinds == []
    afresh = volumes.resolve(m.source)
    assert dataclasses.astuple(got) == dataclasses.astuple(afresh)
    copy = pickle.loads(pickle.dumps(m))
    assert copy == m
    kinds.clear()
    assert dataclasses.astuple(copy.volume()) == dataclasses.astuple(afresh) and len(kinds) == 1
