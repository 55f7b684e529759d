"""Nothing a listing leaves out is left out silently: entries the listing
refuses (a folder linked from outside the source, a broken link, a name with
a backslash, a name like ucstage's temp files) are warned of once by the
library, with the lines shard-plan prints, and counted in the epoch's audit;
files a group callable returns None for are left out of every sample and
counted, never merged into one sample."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ucstage import DataLoader, VolumeDataset
from ucstage.cli import cli
from ucstage.errors import EmptySource


@pytest.fixture
def tricky(tmp_path: Path) -> Path:
    """7 entries, 3 of them files a listing can read: a class folder linked
    from outside the source (2 files), a broken link, a name with a backslash."""
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "cat").mkdir(parents=True)
    outside.mkdir()
    for name in ("cat/1.jpg", "cat/2.jpg", "top.jpg"):
        (src / name).write_text(name)
    for name in ("1.jpg", "2.jpg"):
        (outside / name).write_text(name)
    os.symlink(outside, src / "dog")
    os.symlink(tmp_path / "missing.jpg", src / "broken.jpg")
    (src / "back\\slash.jpg").write_text("b")
    return src


def _skips(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ucstage" and r.getMessage().startswith("skipped ")]


def test_refused_entries_are_warned_of_once_and_counted_in_the_audit(
        tricky: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ucstage")
    ds = VolumeDataset(str(tricky))
    loader = DataLoader(ds, batch_size=2, num_workers=0)
    for _epoch in range(2):
        paths = [p for batch in loader for p in batch]
    assert sorted(os.path.basename(p) for p in paths) == ["1.jpg", "2.jpg", "top.jpg"]
    cli_lines = CliRunner().invoke(cli, ["shard-plan", str(tricky), "-w", "1", "-k", "1"]
                                   ).stderr.splitlines()
    expected = [line.removeprefix("warning: ") for line in cli_lines
                if line.startswith("warning: skipped")]
    assert len(expected) == 3
    assert _skips(caplog) == expected  # the same lines, once for the listing (not per epoch)
    assert ds.listing_skipped == 3
    assert [a.skipped for a in loader.audits] == [3, 3]
    assert all(a.coverage_ok and a.gaps == 0 for a in loader.audits)


def test_a_given_manifest_counts_nothing_skipped(tricky: Path, tmp_path: Path) -> None:
    from ucstage import manifest, snapshot

    path = manifest.save(snapshot(str(tricky)), tmp_path / "m.manifest.arrow")
    ds = VolumeDataset(path)
    loader = DataLoader(ds, batch_size=2, num_workers=0)
    assert len([p for b in loader for p in b]) == 3
    assert loader.audits[0].skipped == 0


def test_a_name_like_a_temp_file_is_refused_at_listing_not_mid_epoch(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ucstage")
    src = tmp_path / "src"
    (src / ".ucstage-ranges").mkdir(parents=True)
    for i in range(50):
        (src / f"f{i:02d}").write_text(str(i))
    (src / ".0001.f01.ucstage-part").write_text("looks like a copy in progress")
    (src / ".ucstage-ranges" / "x").write_text("where row groups go")
    (src / ".keep").write_text("an ordinary hidden file")
    ds = VolumeDataset(str(src), include_hidden=True)
    got = sorted(os.path.basename(p) for p in ds)
    assert got == sorted([".keep", *(f"f{i:02d}" for i in range(50))])
    assert _skips(caplog) == [
        "skipped .0001.f01.ucstage-part: the cache cannot hold it: the name looks like one of "
        "ucstage's temp files",
        "skipped .ucstage-ranges/x: the cache cannot hold it: the folder is where ucstage keeps "
        "byte-range entries"]
    assert ds.listing_skipped == 2


def key_or_none(path: str) -> str | None:
    """Images and their labels are samples; anything else is in none."""
    stem, _, suffix = path.partition(".")
    return stem if suffix in ("jpg", "json") else None


def no_key(path: str) -> None:
    return None


def test_a_key_of_none_leaves_the_file_out_of_every_sample(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ucstage")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.jpg", "a.json", "b.jpg", "b.json", "README.txt", "notes.md"):
        (src / name).write_text(name)
    ds = VolumeDataset(str(src), group=key_or_none)
    samples = list(ds)
    assert sorted(sorted(s) for s in samples) == [["jpg", "json"], ["jpg", "json"]]
    assert len(ds) == 2
    left_out = [r.getMessage() for r in caplog.records if "returned None" in r.getMessage()]
    assert len(left_out) == 1
    assert left_out[0].startswith("left out 2 of 6 files of ")
    assert left_out[0].endswith("e.g. README.txt, notes.md")
    with pytest.raises(EmptySource, match=r"returned None for every file of "):
        VolumeDataset(str(src), group=no_key).freeze()
