"""Listing and path resolution. The TestListing suite runs on every backend:
a local folder, an rclone FUSE mount, a moto S3 bucket and memory://."""

from __future__ import annotations

import os
import subprocess
import sys

import fsspec
import pytest

from tests.common.backends import WalkingStore, deny_s3_listing
from tests.common.parts import unique
from ucstage.errors import (
    InvalidArgument,
    MissingDependency,
    SourceNotFound,
    SourceUnreadable,
    UnreadableFolders,
    UnsafePath,
)
from ucstage.manifest import fingerprint, snapshot
from ucstage.volumes import list_files, resolve, safe_relpath
from ucstage.volumes.listing import matches

ODD = ["with space.bin", "ünïcødé.bin", "hash#1.bin", "pct%20.bin", "br[ack]et.bin", "-lead.bin"]


class TestListing:
    def test_sorted_recursive_with_sizes_and_versions(self, backend):
        files = {"b/2.bin": b"22", "a.bin": b"1", "b/1.bin": b"333", "c/d/e.bin": b"4444"}
        backend.write_many(files)
        listing = list_files(backend.url)
        assert [e.path for e in listing.entries] == ["a.bin", "b/1.bin", "b/2.bin", "c/d/e.bin"]
        assert {e.path: e.size for e in listing.entries} == {k: len(v) for k, v in files.items()}
        assert all(e.version for e in listing.entries)

    def test_hidden_names_skipped_unless_all(self, backend):
        backend.write_many({"x.parquet": b"x", "_SUCCESS": b"", "_delta_log/0.json": b"{}",
                            ".part.crc": b"c", "sub/.hidden": b"h", "sub/y.parquet": b"y"})
        assert [e.path for e in list_files(backend.url).entries] == ["sub/y.parquet", "x.parquet"]
        everything = [e.path for e in list_files(backend.url, include_hidden=True).entries]
        assert everything == [".part.crc", "_SUCCESS", "_delta_log/0.json", "sub/.hidden",
                              "sub/y.parquet", "x.parquet"]

    def test_include_exclude(self, backend):
        backend.write_many({"a/1.jpg": b"1", "a/2.png": b"2", "b/3.jpg": b"3", "4.jpg": b"4"})
        got = list_files(backend.url, include=["*.jpg"], exclude=["b/*"]).entries
        assert [e.path for e in got] == ["4.jpg", "a/1.jpg"]
        got = list_files(backend.url, include=["a/*", "4.*"]).entries
        assert [e.path for e in got] == ["4.jpg", "a/1.jpg", "a/2.png"]

    def test_odd_names(self, backend):
        backend.write_many({f"odd dir [1]/{name}": name.encode() for name in ODD})
        listing = list_files(backend.url)
        assert sorted(e.path.split("/", 1)[1] for e in listing.entries) == sorted(ODD)
        vol = listing.volume
        for entry in listing.entries:
            with vol.open(entry.path) as fh:
                assert fh.read() == entry.path.split("/", 1)[1].encode()

    def test_version_changes_when_file_rewritten(self, backend):
        backend.write("f.bin", b"one")
        before = list_files(backend.url).entries[0]
        backend.settle()
        if backend.name in ("local", "fuse"):
            # Same size, new content: only the version (mtime) can tell.
            path = os.path.join(backend.store_root, "f.bin")
            backend.write("f.bin", b"two")
            os.utime(path, ns=(before_ns := os.stat(path).st_mtime_ns + 5_000_000_000, before_ns))
        else:
            backend.write("f.bin", b"two")
        backend.settle()
        after = list_files(backend.url).entries[0]
        assert after.size == before.size == 3
        assert after.version != before.version

    def test_missing_source_is_an_error(self, backend):
        with pytest.raises(SourceNotFound) as info:
            list_files(backend.url.rstrip("/") + "/does-not-exist")
        assert "does-not-exist" in str(info.value)

    def test_single_file_source(self, backend):
        backend.write_many({"only.bin": b"abc", "other.bin": b"zz"})
        backend.settle()
        url = backend.url.rstrip("/") + "/only.bin"
        listing = list_files(url)
        assert [(e.path, e.size) for e in listing.entries] == [("only.bin", 3)]
        with listing.volume.open("only.bin") as fh:
            assert fh.read() == b"abc"
        # The volume is the file, not its folder: the cache names its namespace
        # from this URL, and a manifest re-resolves the same one file.
        assert listing.volume.url == resolve(url, must_exist=False).url
        assert listing.volume.url.endswith("/only.bin")
        m = snapshot(url)
        assert m.source == listing.volume.url
        again = list_files(m.volume())
        assert [e.path for e in again.entries] == ["only.bin"]
        assert again.volume == m.volume()


class TestResolve:
    def test_volumes_path_maps_through_env(self, tmp_path, monkeypatch):
        root = tmp_path / "vols"
        (root / "main/ml/train").mkdir(parents=True)
        (root / "main/ml/train/x.bin").write_bytes(b"x")
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(root))
        for source in ("/Volumes/main/ml/train", "dbfs:/Volumes/main/ml/train"):
            vol = resolve(source)
            assert vol.root == str(root / "main/ml/train")
            assert vol.source == "/Volumes/main/ml/train"

    def test_volumes_root_may_be_a_url(self, monkeypatch):
        fs = fsspec.filesystem("memory")
        fs.pipe("/vroot/c/s/v/f.bin", b"data")
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", "memory://vroot")
        listing = list_files("/Volumes/c/s/v")
        assert [e.path for e in listing.entries] == ["f.bin"]
        assert listing.volume.url.startswith("memory://")

    def test_missing_volume_names_path_and_variable(self, tmp_path, monkeypatch):
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path))
        with pytest.raises(SourceNotFound) as info:
            resolve("/Volumes/main/ml/nope")
        message = str(info.value)
        assert "/Volumes/main/ml/nope" in message and "UCSTAGE_VOLUMES_ROOT" in message
        assert str(tmp_path / "main/ml/nope") in message
        monkeypatch.delenv("UCSTAGE_VOLUMES_ROOT")
        with pytest.raises(SourceNotFound, match="UCSTAGE_VOLUMES_ROOT is not set"):
            resolve("/Volumes/main/ml/nope")

    def test_file_url_and_relative_path(self, tmp_path, monkeypatch):
        (tmp_path / "d").mkdir()
        assert resolve(f"file://{tmp_path}/d").root == str(tmp_path / "d")
        monkeypatch.chdir(tmp_path)
        assert resolve("d").root == str(tmp_path / "d")

    def test_empty_source(self):
        with pytest.raises(InvalidArgument):
            resolve("  ")


class TestSafety:
    @pytest.mark.parametrize("bad", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/."])
    def test_unsafe_relpaths_refused(self, bad):
        with pytest.raises(UnsafePath):
            safe_relpath(bad)

    def test_dotdot_keys_in_s3_are_refused(self, moto):
        fs = moto.filesystem()
        fs.pipe_file("ucstage-test/evil/ok.bin", b"ok")
        # S3 keys are opaque strings: a key may really contain "..".
        fs.pipe_file("ucstage-test/evil/a/../../escape.bin", b"bad")
        listing = list_files("s3://ucstage-test/evil")
        names = [e.path for e in listing.entries]
        assert "ok.bin" in names
        assert not any(".." in n for n in names)
        assert any(".." in path for path, _ in listing.refused)

    def test_symlink_leaving_local_volume_is_refused(self, tmp_path):
        outside = tmp_path / "secret.txt"
        outside.write_text("secret")
        vol = tmp_path / "vol"
        (vol / "sub").mkdir(parents=True)
        (vol / "ok.txt").write_text("ok")
        (vol / "inner.txt").symlink_to(vol / "ok.txt")
        (vol / "leak.txt").symlink_to(outside)
        (vol / "sub" / "dirlink").symlink_to(tmp_path, target_is_directory=True)
        listing = list_files(str(vol))
        assert [e.path for e in listing.entries] == ["inner.txt", "ok.txt"]
        refused = dict(listing.refused)
        assert "leak.txt" in refused and "outside the volume" in refused["leak.txt"]
        # A symlinked folder leaving the volume is neither descended nor listed:
        # the exact entry list above has nothing under sub/dirlink.


class TestFollowLinks:
    """A link to a folder inside the volume is walked as find -L walks it."""

    @pytest.fixture
    def tree(self, tmp_path):
        vol = tmp_path / "vol"
        (vol / "real" / "sub").mkdir(parents=True)
        (vol / "real" / "a.bin").write_bytes(b"a")
        (vol / "real" / "sub" / "b.bin").write_bytes(b"bb")
        (vol / "link").symlink_to("real", target_is_directory=True)
        (vol / "real" / "sub" / "loop").symlink_to("..", target_is_directory=True)
        (tmp_path / "outside").mkdir()
        (tmp_path / "outside" / "secret.bin").write_bytes(b"secret")
        (vol / "out").symlink_to(tmp_path / "outside", target_is_directory=True)
        (vol / "dangling").symlink_to(vol / "nowhere")
        return vol

    def test_linked_folders_are_listed_loops_broken_escapes_refused(self, tree):
        listing = list_files(str(tree))
        assert [(e.path, e.size) for e in listing.entries] == [
            ("link/a.bin", 1), ("link/sub/b.bin", 2), ("real/a.bin", 1), ("real/sub/b.bin", 2)]
        refused = dict(listing.refused)
        assert set(refused) == {"dangling", "link/sub/loop", "out", "real/sub/loop"}
        assert "outside the volume" in refused["out"]
        assert "loop" in refused["real/sub/loop"] and "broken symlink" in refused["dangling"]
        # Every listed path reads as what it names; the fingerprint is over them.
        for entry in listing.entries:
            with listing.volume.open(entry.path) as fh:
                assert len(fh.read()) == entry.size
        assert snapshot(str(tree)).fingerprint == fingerprint(listing.entries)

    def test_a_link_cycle_between_folders_ends(self, tmp_path):
        vol = tmp_path / "vol"
        (vol / "a").mkdir(parents=True)
        (vol / "b").mkdir()
        (vol / "a" / "x.bin").write_bytes(b"x")
        (vol / "a" / "to_b").symlink_to("../b", target_is_directory=True)
        (vol / "b" / "to_a").symlink_to("../a", target_is_directory=True)
        paths = [e.path for e in list_files(str(vol)).entries]
        assert paths == ["a/x.bin", "b/to_a/x.bin"]


class TestUnreadable:
    def test_fsspec_walk_does_not_drop_an_unreadable_folder(self, walking_store):
        with pytest.raises(UnreadableFolders) as info:
            list_files(walking_store)
        assert info.value.exit_code == 1
        assert "dog" in str(info.value) and "Permission denied" in str(info.value)
        assert [p for p, _ in info.value.folders] == [resolve(walking_store).url + "/dog"]
        assert "`skip_unreadable`" in info.value.hint
        listing = list_files(walking_store, skip_unreadable=True)
        assert [e.path for e in listing.entries] == ["cat/1.jpg", "cat/2.jpg"]
        assert listing.unreadable == [("dog", "Permission denied")]
        m = snapshot(walking_store, skip_unreadable=True)
        assert list(m.unreadable) == [("dog", "Permission denied")] and len(m) == 2

    def test_hidden_unreadable_folders_do_not_stop_a_listing(self, walking_store):
        WalkingStore.denied = {walking_store.replace("ucstage-walk:/", "") + "/_delta_log"}
        WalkingStore().pipe(walking_store.replace("ucstage-walk:/", "") + "/_delta_log/0.json",
                            b"{}")
        assert len(list_files(walking_store).entries) == 3

    def test_an_s3_403_on_listing_is_an_error(self, moto, monkeypatch, engine):
        """S3 lists a prefix in one flat request: a 403 there is the source's,
        raised, never an empty listing (on both engines)."""
        key = unique()
        moto.filesystem().pipe({f"ucstage-test/{key}/cat/1.jpg": b"c"})
        with deny_s3_listing(monkeypatch, moto, key), \
                pytest.raises(SourceUnreadable, match="Access Denied"):
            list_files(f"s3://ucstage-test/{key}", skip_unreadable=True)

    def test_local_unreadable_folder_as_an_unprivileged_user(self, tmp_path):
        """Root reads anything: the listing runs as nobody (see tests/cli for the CLI)."""
        import shutil
        import tempfile

        base = tempfile.mkdtemp(prefix="ucstage-perm-", dir="/tmp")
        try:
            os.chmod(base, 0o755)
            for name in ("cat", "dog"):
                os.makedirs(os.path.join(base, "vol", name))
                with open(os.path.join(base, "vol", name, "1.jpg"), "wb") as fh:
                    fh.write(name.encode())
            os.chmod(os.path.join(base, "vol", "dog"), 0)
            code = ("import sys\n"
                    "from ucstage.errors import UnreadableFolders\n"
                    "from ucstage.volumes import list_files\n"
                    "try:\n    list_files(sys.argv[1])\n"
                    "except UnreadableFolders as exc:\n    print('raised', exc.folders)\n"
                    "print([e.path for e in list_files(sys.argv[1], skip_unreadable=True).entries])")
            proc = subprocess.run(
                ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                 "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", code,
                 os.path.join(base, "vol")], capture_output=True, text=True, timeout=120,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
            assert proc.returncode == 0, proc.stderr
            dog = os.path.join(base, "vol", "dog")
            assert proc.stdout.splitlines() == [f"raised [({dog!r}, 'Permission denied')]",
                                                "['cat/1.jpg']"]
        finally:
            os.chmod(os.path.join(base, "vol", "dog"), 0o755)
            shutil.rmtree(base)


def test_missing_backend_names_what_to_install():
    code = ("import sys; sys.modules['s3fs'] = None; sys.modules['gcsfs'] = None\n"
            "from ucstage.volumes import resolve\n"
            "for url in ('s3://b/k', 'gs://b/k'):\n"
            "    try:\n        resolve(url)\n"
            "    except Exception as exc:\n        print(type(exc).__name__, '|', exc.hint)\n")
    fsspec_only = {**os.environ, "UCSTAGE_ENGINE": "fsspec"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=fsspec_only).stdout.splitlines()
    assert out[0] == "MissingDependency | pip install 'ucstage[s3]'"
    # gs:// lists through gcsfs on both engines: the extra that brings it.
    assert out[1] == "MissingDependency | pip install 'ucstage[gcs]'"
    assert MissingDependency.exit_code == 2
    # The object-store engine asked for, without obstore: the extra that brings it.
    code = code.replace("sys.modules['s3fs'] = None", "sys.modules['obstore'] = None")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "UCSTAGE_ENGINE": "obstore"}
                         ).stdout.splitlines()
    assert out == ["MissingDependency | pip install 'ucstage[s3]'",
                   "MissingDependency | pip install 'ucstage[gcs]'"]


def test_glob_rules():
    assert matches("a/b/c.jpg", "*.jpg")
    assert not matches("a/b/c.jpg", "a/*.png")
    assert matches("a/b/c.jpg", "a/*")  # fnmatch's * crosses / in path patterns
    assert matches("x[1].bin", "x[[]1].bin")


def test_the_plain_name_screen_vouches_only_for_paths_the_full_checks_pass() -> None:
    """``PLAIN`` lets a copy skip ``safe_relpath`` and ``uncacheable``: every
    path it matches must pass both. 50,000 random paths over the characters
    that matter (dots, slashes, backslashes, NUL, controls, non-ASCII, long
    runs), and the known hostile ones, which it must not match."""
    import random

    from ucstage.errors import UnsafePath
    from ucstage.volumes.entry import PLAIN, uncacheable
    from ucstage.volumes.location import safe_relpath

    rng = random.Random(41)
    alphabet = ["a", "Z", "0", " ", "-", "_", ".", "..", "/", "//", "\\", "\x00", "\n", "\x1b",
                "\x7f", "é", ":", "~", ".ucstage-ranges", ".0001.x.ucstage-part", "a" * 130]
    matched = 0
    for _ in range(50_000):
        path = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        if not PLAIN.fullmatch(path):
            continue
        matched += 1
        try:
            safe_relpath(path)
        except UnsafePath as exc:
            raise AssertionError(f"PLAIN vouched for {path!r}, which safe_relpath refuses") from exc
        assert uncacheable(path) is None, path
    assert matched > 1_000  # the screen is exercised, not vacuous
    for hostile in ("../x", "a/../b", "/etc/passwd", "a//b", "a/", ".", "a/.hidden", "a\\b",
                    "a\x00b", "a\nb", "x" * 256, ".ucstage-ranges/f/0", "d/.0001.f.ucstage-part",
                    "é"):
        assert not PLAIN.fullmatch(hostile), hostile
