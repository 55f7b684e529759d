"""A SOURCE is decided once (ucstage.source.open_source) and each thing it
names is resolved once: no module asks again what the SOURCE is."""

from __future__ import annotations

import pytest

from ucstage.errors import ManifestError, SourceNotFound
from ucstage.manifest import save
from ucstage.source import ManifestSource, VolumeSource, open_source, snapshot
from ucstage.volumes import is_volumes_path, location
from ucstage.volumes.location import is_mapped


@pytest.fixture
def vol(tmp_path):
    root = tmp_path / "vols" / "main" / "ml" / "train"
    (root / "sub").mkdir(parents=True)
    for name, data in {"a.bin": b"a", "sub/b.bin": b"bb"}.items():
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def lookups(monkeypatch):
    """Every existence check resolve() makes (one stat, or a HEAD on a store)."""
    seen: list[str] = []
    real = location.kind_of

    def counting(volume):
        seen.append(volume.url)
        return real(volume)

    monkeypatch.setattr(location, "kind_of", counting)
    return seen


def test_open_source_tells_a_manifest_from_files_to_list(vol, tmp_path):
    path = save(snapshot(str(vol)), tmp_path / "m.json")
    assert isinstance(open_source(str(vol)), VolumeSource)
    assert isinstance(open_source(path), ManifestSource)
    assert isinstance(open_source(str(vol), manifest=path), ManifestSource)  # the flag wins
    assert open_source(path).frozen and not open_source(str(vol)).frozen
    with pytest.raises(ManifestError, match="give a `source` or a `manifest` file"):
        open_source()


def test_opening_looks_nothing_up_yet(tmp_path, lookups):
    """Deciding is cheap: a missing folder fails when it is first used."""
    opened = open_source(str(tmp_path / "nope"))
    assert lookups == []
    with pytest.raises(SourceNotFound, match="does not exist") as err:
        opened.volume()
    # Where it was looked up is said only when it differs from the source as given.
    assert str(err.value) == f"source {tmp_path / 'nope'} does not exist"


def test_a_fresh_listing_resolves_its_source_once(vol, lookups):
    opened = open_source(str(vol))
    m = opened.snapshot()
    assert [e.path for e in m.entries] == ["a.bin", "sub/b.bin"]
    assert m.volume().root == str(vol) and opened.volume().root == str(vol)
    assert lookups == [str(vol)]


def test_a_volumes_manifest_resolves_its_file_once_and_its_source_once(vol, tmp_path,
                                                                        monkeypatch, lookups):
    """A columnar manifest on /Volumes: one lookup to find the file (mapped,
    then hashed from the same path), one for the source its files are read from."""
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path / "vols"))
    m = snapshot("/Volumes/main/ml/train")
    save(m, tmp_path / "vols" / "main" / "ml" / "m.manifest.arrow")
    lookups.clear()
    opened = open_source("/Volumes/main/ml/m.manifest.arrow")
    assert isinstance(opened, ManifestSource)
    frozen = opened.snapshot()
    assert frozen.fingerprint == m.fingerprint and lookups == [
        str(tmp_path / "vols" / "main" / "ml" / "m.manifest.arrow")]
    assert opened.volume().root == str(vol) and opened.volume() is opened.volume()
    assert lookups[1:] == [str(vol)]


def test_the_volumes_predicate():
    assert is_volumes_path("/Volumes") and is_volumes_path("/Volumes/main/ml")
    assert not is_volumes_path("/Volumesx/main") and not is_volumes_path("dbfs:/Volumes/a")
    assert not is_volumes_path("Volumes/main") and not is_volumes_path("/data/Volumes/a")
    assert is_mapped("dbfs:/Volumes/a") and is_mapped("s3://b/k") and is_mapped("/Volumes/a")
    assert not is_mapped("/data/m.json") and not is_mapped("m.json")
