"""Manifests: freeze, save, load, fingerprint checks, and use as a SOURCE."""

from __future__ import annotations

import json

import pytest

from ucstage.errors import EmptySource, ManifestError
from ucstage.manifest import fingerprint, is_manifest_file, load, save, snapshot
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
    with pytest.raises(ManifestError):
        snapshot(str(bad))
    other = tmp_path / "data.json"
    other.write_text('{"a": 1}')
    assert [e.path for e in snapshot(str(other)).entries] == ["data.json"]
