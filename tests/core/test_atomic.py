"""The one atomic writer (manifests, the export record, cache bookkeeping)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.common.parts import tmpfs
from ucstage.atomic import write_atomic


def test_replaces_whole_file(tmp_path):
    path = str(tmp_path / "record.json")
    write_atomic(path, "first")
    write_atomic(path, b"second")
    assert Path(path).read_bytes() == b"second"
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644)
    assert os.listdir(tmp_path) == ["record.json"]  # no temp file left behind


def test_full_disk_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    with tmpfs(str(tmp_path / "small"), "size=64k") as folder:
        path = os.path.join(folder, "train.manifest.json")
        write_atomic(path, "old listing")
        with pytest.raises(OSError):
            write_atomic(path, "x" * (1 << 20))
        assert Path(path).read_text() == "old listing"
        assert os.listdir(folder) == ["train.manifest.json"]
