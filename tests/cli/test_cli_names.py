"""Names a source can hold and a terminal or the cache cannot (issue 39, items 5,
6 and 8): object keys with ESC sequences, CR, LF and TAB, a segment over 255
bytes, a key ``d`` beside ``d/e``; and a manifest nested too deeply to decode.

Every name is shown escaped wherever a person reads it (warnings, summaries,
errors, logs) and raw in ``--json``; what the cache cannot hold is refused
when the listing is made, alike on every engine, and a copy that can never
succeed is never retried.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.common.backends import make_source
from tests.common.parts import unique
from ucstage import VolumeDataset, manifest, snapshot
from ucstage.errors import InvalidArgument, ManifestError
from ucstage.manifest.model import fingerprint
from ucstage.resume import load_state
from ucstage.volumes import FileEntry

TITLE = "esc\x1b]0;TITLE\x07.bin"
"""A key that sets the terminal's title when printed raw."""
ERASE = "clr\x1b[2K.bin"
"""A key that erases the terminal's line when printed raw."""
LONG = "long/" + "a" * 256
"""A key with a segment one byte over NAME_MAX."""

GOOD = {"ok/1.bin": b"one", "ok/2.bin": b"two"}
ESCAPES = {TITLE: b"t", ERASE: b"c", "cr\rx.bin": b"r", "tab\tx.bin": b"t"}
"""Control characters both kinds of source hold (moto cannot store a LF key)."""
STORE_ONLY = {"d": b"file d", "d/e": b"under d", LONG: b"long"}
"""Keys only an object store holds: a file beside a folder of the same name, a
segment no local file system takes."""

RAW = ("\x1b", "\x07", "\r", "\t")
"""Bytes that must never reach a terminal from a name."""


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucstage", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def _no_raw(text: str) -> None:
    for char in RAW:
        assert char not in text, (char, text)


def _files(kind: str) -> tuple[dict[str, bytes], set[str], set[str]]:
    """The files of a source of ``kind``, the ones the cache can hold, and the
    ones the listing must refuse."""
    files = {**GOOD, **ESCAPES}
    refused = set(ESCAPES)
    if kind == "local":
        files["lf\nx.bin"] = b"n"
        refused.add("lf\nx.bin")
    else:
        files.update(STORE_ONLY)
        refused |= {"d", LONG}
    return files, set(files) - refused, refused


def test_unsafe_names_are_refused_at_listing_and_shown_escaped(
        source_kind: str, tmp_path: Path) -> None:
    files, kept, refused = _files(source_kind)
    src = make_source(source_kind, str(tmp_path / "src"), files)

    result = _cli("cache", "warm", src, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["files"] == len(kept) and doc["failed"] == []
    # --json keeps the raw key (JSON escapes it), with the reason.
    assert {r["path"] for r in doc["refused"]} == refused
    assert all(r["reason"].startswith("the cache cannot hold it: ") for r in doc["refused"])
    reasons = {r["path"]: r["reason"] for r in doc["refused"]}
    assert "control character" in reasons[TITLE]
    if source_kind != "local":
        assert "256 bytes" in reasons[LONG] and "also the folder" in reasons["d"]
    _no_raw(result.stderr)
    assert "warning: skipped esc\\x1b]0;TITLE\\x07.bin: the cache cannot hold it" \
        in result.stderr
    assert "warning: skipped clr\\x1b[2K.bin" in result.stderr

    again = _cli("cache", "warm", src)
    assert again.returncode == 0, again.stderr
    _no_raw(again.stdout + again.stderr)
    assert f"Warmed {len(kept)} files" in again.stdout
    assert "cr\\rx.bin: the cache cannot hold it" in again.stderr

    plan = _cli("shard-plan", src, "-w", "1", "-k", "1")
    assert plan.returncode == 0, plan.stderr
    _no_raw(plan.stdout + plan.stderr)
    assert f"files            {len(kept)} " in plan.stdout
    assert "skipped cr\\rx.bin" in plan.stderr


def test_the_engines_refuse_the_same_keys(moto: Any, monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    files, kept, refused = _files("s3")
    src = make_source("s3", str(tmp_path), files)
    seen = []
    for engine in ("fsspec", "obstore"):
        monkeypatch.setenv("UCSTAGE_ENGINE", engine)
        m = snapshot(src)
        seen.append((m.fingerprint, sorted(m.paths()), sorted(p for p, _ in m.refused)))
    assert seen[0] == seen[1]
    assert seen[0][1] == sorted(kept) and seen[0][2] == sorted(refused)


def test_a_dataset_reads_every_file_it_can_hold_and_logs_names_escaped(
        source_kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The obstore engine used to raise FetchFailed at the first batch (0
    items delivered) on such keys."""
    caplog.set_level(logging.WARNING, logger="ucstage")
    files, kept, refused = _files(source_kind)
    src = make_source(source_kind, str(tmp_path / "src"), files)
    ds = VolumeDataset(src)
    got = {}
    for local in ds:
        with open(local, "rb") as fh:
            got[os.path.relpath(local, ds.cache().namespace_dir(ds.freeze().volume()))] = fh.read()
    assert got == {k.replace("/", os.sep): files[k] for k in kept}
    assert ds.listing_skipped == len(refused)
    logged = [r.getMessage() for r in caplog.records if r.name == "ucstage"]
    assert any("skipped esc\\x1b]0;TITLE\\x07.bin" in line for line in logged)
    for line in logged:
        _no_raw(line)


def test_a_source_not_found_is_named_escaped(moto: Any, tmp_path: Path) -> None:
    for src in (f"s3://ucstage-test/{unique('gone')}/{TITLE}", str(tmp_path / ERASE)):
        for args in (["cache", "warm", src], ["shard-plan", src, "-w", "1", "-k", "1"]):
            result = _cli(*args)
            assert result.returncode == 2, result.stderr
            _no_raw(result.stdout + result.stderr)
            assert "error: " in result.stderr and "Traceback" not in result.stderr
            assert ("TITLE\\x07.bin" if src.startswith("s3") else "clr\\x1b[2K.bin") \
                in result.stderr
            as_json = _cli(*args, "--json")
            doc = json.loads(as_json.stdout)
            assert as_json.returncode == 2 and doc["error"]["exit_code"] == 2
            _no_raw(as_json.stdout)


def test_a_manifest_naming_what_the_cache_cannot_hold_fails_once_not_retryable(
        moto: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A frozen listing is not listed again: the cache refuses the same names
    itself, and a file that is also a folder fails with EISDIR/ENOTDIR. Each
    is permanent: one attempt, ``retryable: false``, escaped for people."""
    from ucstage.volumes import version_of

    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    files = _files("s3")[0]
    src = make_source("s3", str(tmp_path), files)
    store = moto.filesystem()
    bucket_path = src.removeprefix("s3://")
    entries = sorted((FileEntry(rel, len(data), version_of(store.info(f"{bucket_path}/{rel}")))
                      for rel, data in files.items()), key=lambda e: e.path)
    listed = snapshot(src)
    m = dataclasses.replace(listed, entries=entries, fingerprint=fingerprint(entries),
                            refused=[])
    path = manifest.save(m, tmp_path / "all.manifest.json")

    result = _cli("cache", "warm", path, "--json")
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    failed = {f["path"]: f for f in doc["failed"]}
    # d and d/e: whichever is copied second meets the other as a file or folder.
    assert set(failed) - {"d", "d/e"} == set(ESCAPES) | {LONG}
    assert len(failed) == len(ESCAPES) + 2
    assert all(f["retryable"] is False for f in failed.values())
    assert not any("attempts" in f["reason"] for f in failed.values())
    assert "rerun to retry" not in result.stderr
    _no_raw(result.stderr)

    human = _cli("cache", "warm", path)
    assert human.returncode == 1
    _no_raw(human.stdout + human.stderr)
    assert "failed esc\\x1b]0;TITLE\\x07.bin" in human.stdout


def test_a_name_too_long_for_the_cache_path_is_not_retried(
        moto: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each segment fits, the whole path does not (PATH_MAX): ENAMETOOLONG
    from the cache's file system fails the same way every time."""
    root = tmp_path
    while len(str(root)) < 3300:  # deep, each name well under NAME_MAX
        root = root / ("r" * 200)
    root.mkdir(parents=True)
    cache_dir = root / "cache"
    key = "/".join(["k" * 200] * 4)
    src = make_source("s3", str(tmp_path), {key: b"deep", "short.bin": b"s"})
    result = _cli("cache", "warm", src, "--json", env={"UCSTAGE_CACHE_DIR": str(cache_dir),
                                                      "UCSTAGE_ENGINE": "fsspec"})
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["fetched"] == 1 and [f["path"] for f in doc["failed"]] == [key]
    failure = doc["failed"][0]
    assert failure["retryable"] is False and "attempts" not in failure["reason"]
    assert "too long" in failure["reason"].lower()


# -- item 8: a manifest nested too deeply -------------------------------------------


def _deep(path: Path, marker: bool) -> str:
    head = '{"format": "ucstage.manifest", "format_version": 1, "files": ' if marker else ""
    # 100 kB: under the size past which a file without the marker is refused
    # unread, so the decoder meets the nesting either way.
    path.write_text(head + "[" * 50_000 + "]" * 50_000 + ("}" if marker else ""))
    return str(path)


@pytest.mark.parametrize("marker", [True, False])
def test_a_manifest_nested_too_deeply_is_refused_in_one_line(tmp_path: Path,
                                                             marker: bool) -> None:
    deep = _deep(tmp_path / "deep.manifest.json", marker)
    for args in (["shard-plan", deep, "-w", "1", "-k", "1"],
                 ["shard-plan", "--manifest", deep, "-w", "1", "-k", "1"],
                 ["cache", "warm", deep]):
        result = _cli(*args)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.splitlines()
        assert lines[0].startswith("error: ") and "nested too deeply" in lines[0], lines
        assert all(line.startswith(("error: ", "hint: ")) for line in lines)
        assert "unexpected" not in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ManifestError, match="nested too deeply"):
        manifest.load(deep)
    with pytest.raises(ManifestError, match="nested too deeply"):
        VolumeDataset(deep).freeze()


def test_a_resume_state_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        load_state(_deep(tmp_path / "state.json", False))


def test_a_worker_error_re_raised_by_torch_keeps_its_traceback_lines() -> None:
    """torch re-raises a DataLoader worker's error as ``type(exc)(message=...)``
    with the worker's traceback; its line breaks stay, so the last line is the
    worker's message (already shown safe when raised there). Anything else
    with a line break, a name's above all, is escaped."""
    from ucstage.errors import FetchFailed

    inner = FetchFailed("cannot copy evil\x1b[2K\nerror: fake")
    assert "\n" not in str(inner) and "\x1b" not in str(inner)
    text = (f"Caught FetchFailed in DataLoader worker process 1.\nOriginal Traceback "
            f"(most recent call last):\n  File \"x.py\", line 1, in f\n"
            f"ucstage.errors.FetchFailed: {inner}\n")
    outer = FetchFailed(message=text)
    lines = str(outer).splitlines()
    assert lines[0] == "Caught FetchFailed in DataLoader worker process 1."
    assert lines[-1] == "ucstage.errors.FetchFailed: cannot copy evil\\x1b[2K\\nerror: fake"
    # The same text not in torch's form is one escaped line.
    assert "\n" not in str(FetchFailed("x " + text))
