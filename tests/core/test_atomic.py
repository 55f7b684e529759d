"""The one atomic writer (manifests, the export record, cache bookkeeping)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.common.parts import tmpfs
from ucstage.atomic import write_atomic


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_replaces_whole_file(tmp_path):
    path = str(tmp_path / "record.json")
    with umask(0o022):
        write_atomic(path, "first")
        write_atomic(path, b"second")
    assert Path(path).read_bytes() == b"second"
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
    assert os.listdir(tmp_path) == ["record.json"]  # no temp file left behind


@pytest.mark.parametrize(("mask", "expected"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)],
                         ids=["077", "022", "002"])
def test_the_file_follows_the_umask(tmp_path, mask, expected):
    # As any program's new file: `umask 077` keeps a private dataset's names private.
    path = str(tmp_path / "m.json")
    with umask(mask):
        write_atomic(path, "listing")
        assert oct(os.stat(path).st_mode & 0o777) == oct(expected)
        write_atomic(path, "again")  # a replaced file too
    assert oct(os.stat(path).st_mode & 0o777) == oct(expected)


def test_an_explicit_mode_is_exact(tmp_path):
    path = str(tmp_path / "state.json")
    with umask(0o077):
        write_atomic(path, "x", mode=0o640)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o640)


def test_a_link_at_the_path_is_replaced_not_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    path = tmp_path / "m.json"
    path.symlink_to(target)
    write_atomic(str(path), "listing")
    assert not path.is_symlink() and path.read_text() == "listing"
    assert target.read_text() == "keep"


def test_full_disk_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    with tmpfs(str(tmp_path / "small"), "size=64k") as folder:
        path = os.path.join(folder, "train.manifest.json")
        write_atomic(path, "old listing")
        with pytest.raises(OSError):
            write_atomic(path, "x" * (1 << 20))
        assert Path(path).read_text() == "old listing"
        assert os.listdir(folder) == ["train.manifest.json"]
