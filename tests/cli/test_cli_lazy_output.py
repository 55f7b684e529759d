"""`cache lazy -o FILE` (and `manifest.save`) never replaces what a user
wrote: an existing file that is not a ucstage manifest needs --force, and a
FILE inside SOURCE is refused even with it. A refusal writes nothing, not
even the source's cache folder."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ucstage import manifest, snapshot
from ucstage.cli import cli
from ucstage.errors import InvalidArgument

names = st.text(st.characters(codec="utf-8", categories=["L", "N"], include_characters="_-"),
                min_size=1, max_size=8)


def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(folder)):
        dirs.sort()
        for f in sorted(files):
            p = Path(dirpath, f)
            h.update(f"{p.relative_to(folder)}\0".encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    (folder / "d").mkdir(parents=True)
    for name in ("part-1.csv", "part-2.csv", "d/x.json"):
        (folder / name).write_text(f"a,b\n{name}\n")
    return folder


def lazy(*args: str, cache: Path) -> object:
    return CliRunner(env={"UCSTAGE_CACHE_DIR": str(cache)}).invoke(
        cli, ["cache", "lazy", *args])


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(names, min_size=1, max_size=3), st.booleans(), st.booleans(),
       st.sampled_from(["", ".csv", ".json", ".manifest.arrow"]))
def test_no_target_inside_the_source_even_with_force(src: Path, tmp_path: Path,
                                                      parts: list[str], existing: bool,
                                                      force: bool, suffix: str) -> None:
    target = src.joinpath(*parts[:-1], parts[-1] + suffix)
    if existing and not target.exists():
        # "existing": one of the source's own files (the part-2.csv)
        target = src / "part-2.csv"
    before = tree_digest(src)
    cache = tmp_path / f"cache-{len(parts)}-{existing}-{force}"
    result = lazy(str(src), "-o", str(target), *(["--force"] if force else []), cache=cache)
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert f"is inside the source {src}" in result.stderr  # type: ignore[attr-defined]
    assert tree_digest(src) == before
    assert not cache.exists() or not [n for n in os.listdir(cache) if not n.startswith(".")]
    with pytest.raises(InvalidArgument, match="is inside the source"):
        manifest.save(snapshot(str(src)), target, force=True)
    assert tree_digest(src) == before


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200), st.sampled_from(["notes.txt", "data.json", "x.manifest.arrow",
                                                 "table.arrow", "README"]))
def test_a_file_that_is_not_a_manifest_needs_force(src: Path, tmp_path: Path, content: bytes,
                                                   name: str) -> None:
    target = tmp_path / "out" / name
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(content)
    m = snapshot(str(src))
    with pytest.raises(InvalidArgument, match=r"exists and is not a ucstage manifest; "
                                              r"refusing to replace it$"):
        manifest.save(m, target)
    assert target.read_bytes() == content
    result = lazy(str(src), "-o", str(target), cache=tmp_path / "c")
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert "pass --force to replace it" in result.stderr  # type: ignore[attr-defined]
    assert target.read_bytes() == content
    fmt = "json" if name.endswith(".json") else "arrow"
    result = lazy(str(src), "-o", str(target), "--force", "--format", fmt, cache=tmp_path / "c")
    assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    assert manifest.load(target).fingerprint == m.fingerprint
    # Now a manifest: replaced again without --force.
    again = lazy(str(src), "-o", str(target), "--format", fmt, cache=tmp_path / "c")
    assert again.exit_code == 0, again.output  # type: ignore[attr-defined]


def test_a_manifest_source_is_guarded_by_its_own_source(src: Path, tmp_path: Path) -> None:
    m = manifest.save(snapshot(str(src)), tmp_path / "m.manifest.arrow")
    result = lazy(m, "-o", str(src / "new.manifest.json"), cache=tmp_path / "c")
    assert result.exit_code == 2, result.output  # type: ignore[attr-defined]
    assert f"is inside the source {src}: the manifest would be listed as its data" in \
        result.stderr  # type: ignore[attr-defined]
    assert not (src / "new.manifest.json").exists()


@pytest.mark.parametrize(("mask", "mode"), [("077", 0o600), ("022", 0o644)])
def test_the_manifest_follows_the_umask(src: Path, tmp_path: Path, mask: str, mode: int) -> None:
    # `(umask 077; ucstage cache lazy SRC -o m.json)`: a private dataset's
    # names stay private, as any file that shell's programs write.
    out = tmp_path / "m.json"
    run = subprocess.run(
        ["sh", "-c", f'umask {mask} && exec "$0" -m ucstage cache lazy "$1" -o "$2"',
         sys.executable, str(src), str(out)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "UCSTAGE_CACHE_DIR": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr
    assert oct(out.stat().st_mode & 0o777) == oct(mode)
    assert len(manifest.load(out).entries) == 3
