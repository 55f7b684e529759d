"""`ucstage pack` from the shell: Ctrl-C (a real SIGINT) mid-run on a slow
FUSE source leaves DEST as it was and no partial file; bad input exits 2
with one error line and touches nothing; files a user added to a pack are
not replaced without --force."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cache.test_warm_stop import _hung
from tests.common.parts import rclone_mount
from ucstage.packing.packer import _READ_SIZE

KB = 1024


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucstage", "pack", *args],
                          capture_output=True, text=True)


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def test_ctrl_c_leaves_dest_as_it_was(tmp_path: Path) -> None:
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    # 16 MiB read at 512 KiB/s through the mount: still packing when the signal comes.
    _write(backing, {f"d{i % 4}/f{i:03d}.bin": os.urandom(256 * KB) for i in range(64)})
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "packed"
    small = tmp_path / "small"
    _write(small, {"a/1.bin": b"one", "a/2.bin": b"two"})
    assert _run(str(small), str(dest)).returncode == 0
    before = _tree(out)
    with rclone_mount(str(backing), str(mnt), "--bwlimit", "512k"):
        proc = subprocess.Popen([sys.executable, "-m", "ucstage", "pack", str(mnt), str(dest),
                                 "--shard-size", "1M", "-j", "4"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120  # only stops a hang
        # Wait until a shard is being written in the staging folder beside DEST.
        while not list(out.glob(".packed.ucstage-pack-*/shard-*.tar")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no shard was started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped: nothing was published" in err
    assert "Traceback" not in err
    assert _tree(out) == before  # DEST as it was, nothing beside it
    assert sorted(p.name for p in out.iterdir()) == ["packed"]


_MOUNT_WAITS = {"request_wait_answer", "fuse_get_req", "folio_wait_bit_common"}
"""Where a thread reading a FUSE file waits for its daemon: for the answer,
for a free request slot, or for the page a read-ahead request fills."""


def _on_mount(pid: int) -> int:
    """How many of the process's threads wait on a FUSE daemon."""
    waiting = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # the thread just ended
            waiting += Path(f"/proc/{pid}/task/{tid}/wchan").read_text() in _MOUNT_WAITS
    return waiting


@pytest.mark.fuse
def test_ctrl_c_does_not_wait_for_reads_of_a_hung_mount(tmp_path: Path) -> None:
    """Ctrl-C at the default --jobs (16) while the source mount hangs: pack
    says what it did, leaves DEST as it was and its interpreter exits while
    reads of the hung mount are still pending, so it does not wait for them.
    The kernel still holds the dead process until the mount answers the reads
    it is serving, one per job at most, and each read pack asks for is
    small: that is all a Ctrl-C waits for."""
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    # 16 MiB at 512 KiB/s: still packing when the signal comes.
    _write(backing, {f"d{i % 4}/f{i:03d}.bin": os.urandom(256 * KB) for i in range(64)})
    out = tmp_path / "out"
    out.mkdir()
    dest = out / "packed"
    dest.mkdir()  # an empty DEST: still there, still empty, after the stop
    log = tmp_path / "stderr.log"
    # -vv: the mount logs every read it is asked for, with its length.
    with rclone_mount(str(backing), str(mnt), "--bwlimit", "512k", "-vv"), \
            open(log, "w") as errfile:
        proc = subprocess.Popen([sys.executable, "-m", "ucstage", "pack", str(mnt), str(dest),
                                 "--shard-size", "1M"], stdout=subprocess.DEVNULL, stderr=errfile)
        try:
            deadline = time.monotonic() + 120  # only stops a hang
            # Until a file read through the mount is in a shard.
            while not any(p.stat().st_size for p in out.glob(".packed.ucstage-pack-*/shard-*")):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "no file was packed"
                time.sleep(0.02)
            with _hung(backing, mnt):
                while not _on_mount(proc.pid):
                    assert time.monotonic() < deadline, "no read waits on the hung mount"
                    time.sleep(0.02)
                proc.send_signal(signal.SIGINT)
                while "stopped: " not in log.read_text():
                    assert time.monotonic() < deadline, "the stop was not reported"
                    time.sleep(0.02)
                # The interpreter exits (its main thread ends: a zombie) while
                # the mount, stopped, has answered none of the reads waiting
                # on it: nothing waited for them.
                while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
                        != "Z":
                    assert time.monotonic() < deadline, "pack waits for its reads"
                    time.sleep(0.02)
                assert not list(out.glob(".packed.ucstage-pack-*"))  # cleaned up before
            assert proc.wait(timeout=60) == 130  # once the mount answers them
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    err = log.read_text()
    assert f"stopped: nothing was published: {dest} is as it was" in err, err
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["packed"] and _tree(dest) == {}
    reads = [int(n) for n in re.findall(r"Read: len=(\d+)", (tmp_path / "mnt.rclone.log")
                                        .read_text())]
    assert reads and max(reads) <= _READ_SIZE, sorted(set(reads))


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(src, {"a/1.jpg": b"x", "a/1.json": b"{}", "b/2.jpg": b"y"})
    project = tmp_path / "project"
    _write(project, {"notes.md": b"mine", "code/run.py": b"print()"})
    before = _tree(project)
    cases = [
        ((str(src), str(project)), "is not a pack"),            # DEST is someone's folder
        ((str(tmp_path / "nope"), str(tmp_path / "d1")), "does not exist"),  # no SOURCE
        ((str(src), str(tmp_path / "d2")), "share the key"),     # would merge: needs --group
        ((str(src), str(project / "notes.md")), "not a folder"),  # DEST is a file
        ((str(src), str(src / "inner")), "inside SOURCE"),
        ((str(src), str(tmp_path / "d3"), "--shard-size", "lots"), "--shard-size"),
    ]
    for args, says in cases:
        proc = _run(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.splitlines()
        assert lines[0].startswith("error:") and says in lines[0], (args, lines)
        assert len([ln for ln in lines if ln.startswith("error:")]) == 1
        assert "Traceback" not in proc.stderr
    assert _tree(project) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "src"]
    # --json answers the error in JSON too.
    proc = _run(str(src), str(project), "--json")
    assert json.loads(proc.stdout)["error"]["exit_code"] == 2


def test_files_added_to_a_pack_need_force(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(src, {"a/1.jpg": b"x", "a/1.json": b"{}"})
    dest = tmp_path / "packed"
    assert _run(str(src), str(dest), "--group", "key").returncode == 0
    (dest / "README.md").write_bytes(b"my notes")
    (src / "a" / "1.jpg").write_bytes(b"changed")
    proc = _run(str(src), str(dest), "--group", "key")
    assert proc.returncode == 2 and "does not list" in proc.stderr
    assert (dest / "README.md").read_bytes() == b"my notes"
    forced = _run(str(src), str(dest), "--group", "key", "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (dest / "README.md").exists()
    # A DEST of tar files without a record is replaced only with --force.
    tars = tmp_path / "tars"
    _write(tars, {"x.tar": b"not mine"})
    assert _run(str(src), str(tars), "--group", "key").returncode == 2
    assert _run(str(src), str(tars), "--group", "key", "--force").returncode == 0


@pytest.mark.parametrize("flag", ["--json", None])
def test_output(tmp_path: Path, flag: str | None) -> None:
    src = tmp_path / "src"
    _write(src, {f"a/{i}.jpg": os.urandom(10) for i in range(5)})
    dest = tmp_path / "packed"
    proc = _run(str(src), str(dest), *([flag] if flag else []))
    assert proc.returncode == 0, proc.stderr
    if flag:
        data = json.loads(proc.stdout)
        assert data["published"] and data["pack"]["samples"] == 5
        assert data["share"]["shards"][0]["path"] == "shard-00000-000000.tar"
    else:
        assert "published" in proc.stdout and "5 samples" in proc.stdout
