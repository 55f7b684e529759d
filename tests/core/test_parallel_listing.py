"""The listing walks folders in parallel and gives exactly what the one-at-a-time
walk gave: the same sorted entries, refusals and unreadable folders, with
hidden folders never entered (unless include_hidden)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.common.backends import WalkingStore
from tests.common.parts import unique, wait_synced
from ucstage.errors import UnreadableFolders
from ucstage.volumes import list_files, walk

NAMES = ["a", "b", "_c", ".d", "e"]
FILES = ["x.bin", "_y", ".z", "w.jpg"]


def _hidden(path: str) -> bool:
    return any(part[:1] in ("_", ".") for part in path.split("/"))


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


@st.composite
def trees(draw: st.DrawFn) -> tuple[dict[str, bytes], set[str]]:
    """Files (relative path -> bytes) in nested folders, some hidden, and a
    set of folders that cannot be read."""
    folders = {""}
    for _ in range(draw(st.integers(0, 12))):
        parent = draw(st.sampled_from(sorted(folders)))
        if parent.count("/") < 3:
            folders.add(f"{parent}/{draw(st.sampled_from(NAMES))}".lstrip("/"))
    files: dict[str, bytes] = {}
    for folder in sorted(folders):
        for name in draw(st.lists(st.sampled_from(FILES), max_size=3, unique=True)):
            path = f"{folder}/{name}".lstrip("/")
            files[path] = path.encode()
    # Folders without files still exist (makedirs below), so they are walked too.
    denied = set(draw(st.lists(st.sampled_from(sorted(folders - {""}) or ["a"]),
                               max_size=3))) & folders
    return {**files, **{f"{f}/": b"" for f in folders if f}}, denied


def expected(tree: dict[str, bytes], denied: set[str], hidden: bool
             ) -> tuple[list[str], list[str], set[str]]:
    """What a walk must give, from the tree alone: entries, unreadable folders,
    and every folder it may open (never a hidden one without ``hidden``)."""
    def walked(folder: str) -> bool:  # opened: reachable, nothing above it denied
        parts = folder.split("/") if folder else []
        above = ["/".join(parts[:i]) for i in range(1, len(parts))]
        return (hidden or not _hidden(folder)) and not any(a in denied for a in above)

    folders = {p[:-1] for p in tree if p.endswith("/")} | {""}
    opened = {f for f in folders if walked(f)}
    entries = sorted(p for p in tree if not p.endswith("/")
                     and _parent(p) in opened and _parent(p) not in denied
                     and (hidden or not _hidden(p)))
    return entries, sorted(opened & denied), opened


@contextlib.contextmanager
def local_tree(tree: dict[str, bytes], denied: set[str]) -> Iterator[tuple[str, list[str]]]:
    """The tree in a temp folder; ``os.scandir`` refuses the denied folders as
    the kernel refuses a folder without read permission (the tests run as
    root, which reads anything) and records every folder it opens."""
    base = tempfile.mkdtemp(prefix="ucstage-plist-")
    opened: list[str] = []
    real = os.scandir

    def scandir(path: str):  # type: ignore[no-untyped-def]
        rel = os.path.relpath(path, base)
        rel = "" if rel == "." else rel
        opened.append(rel)
        if rel in denied:
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    try:
        for path, data in tree.items():
            full = os.path.join(base, path)
            os.makedirs(os.path.dirname(full) if not path.endswith("/") else full, exist_ok=True)
            if not path.endswith("/"):
                with open(full, "wb") as fh:
                    fh.write(data)
        os.scandir = scandir  # type: ignore[assignment]
        yield base, opened
    finally:
        os.scandir = real  # type: ignore[assignment]
        shutil.rmtree(base)


def outcome(source: str, hidden: bool, skip: bool
            ) -> tuple[list[tuple[str, int]], list[tuple[str, str]], list[str]]:
    """(entries, refused, unreadable) of a listing, or of its UnreadableFolders."""
    try:
        listing = list_files(source, include_hidden=hidden, skip_unreadable=skip)
    except UnreadableFolders as exc:
        return [], [], [path for path, _ in exc.folders]
    return ([(e.path, e.size) for e in listing.entries], listing.refused,
            [path for path, _ in listing.unreadable])


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """List with ``n`` threads (1: one folder at a time, as the walk always did)."""
    saved = walk.LIST_THREADS
    walk.LIST_THREADS = n
    try:
        yield
    finally:
        walk.LIST_THREADS = saved


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), hidden=st.booleans(), skip=st.booleans())
def test_local_parallel_walk_equals_the_sequential_walk(tree, hidden, skip):
    files, denied = tree
    want_entries, want_unreadable, may_open = expected(files, denied, hidden)
    with local_tree(files, denied) as (base, opened):
        with threads(1):
            sequential = outcome(base, hidden, skip)
        opened.clear()
        with threads(8):
            parallel = outcome(base, hidden, skip)
    assert parallel == sequential
    got_entries, _, got_unreadable = parallel
    if want_unreadable and not skip:
        assert got_unreadable == [os.path.join(base, f) for f in want_unreadable]
    else:
        assert [p for p, _ in got_entries] == want_entries
        assert got_unreadable == want_unreadable
    # Hidden folders are never entered without include_hidden; every folder
    # is opened once.
    assert sorted(opened) == sorted(may_open)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), hidden=st.booleans(), skip=st.booleans())
def test_fsspec_parallel_walk_equals_the_sequential_walk(tree, hidden, skip):
    """The same on a store walked with ``ls`` folder by folder (WalkingStore)."""
    files, denied = tree
    fsspec.register_implementation("ucstage-walk", WalkingStore, clobber=True)
    key = unique()
    fs = WalkingStore()
    fs.pipe({f"/{key}/{p}": d for p, d in files.items() if not p.endswith("/")} or
            {f"/{key}/.keep": b""})
    for folder in (p[:-1] for p in files if p.endswith("/")):
        fs.makedirs(f"/{key}/{folder}", exist_ok=True)
    WalkingStore.denied = {f"/{key}/{f}" for f in denied}
    source = f"ucstage-walk://{key}"
    try:
        with threads(1):
            sequential = outcome(source, hidden, skip)
        with threads(8):
            parallel = outcome(source, hidden, skip)
    finally:
        WalkingStore.denied = set()
        fs.rm(f"/{key}", recursive=True)
    assert parallel == sequential
    want_entries, want_unreadable, _ = expected(files, denied, hidden)
    got_entries, _, got_unreadable = parallel
    if not (want_unreadable and not skip):
        if not files or not any(not p.endswith("/") for p in files):
            want_entries = [".keep"] if hidden else []
        assert [p for p, _ in got_entries] == want_entries
        assert got_unreadable == want_unreadable


def test_sibling_folders_are_listed_at_the_same_time(tmp_path):
    """Four sibling folders are open at once (a sequential walk opens one at
    a time, and would wait out the deadline in each)."""
    for name in "abcd":
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.bin").write_bytes(name.encode())
    lock = threading.Condition()
    inside = {"now": 0, "most": 0}
    real = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]
        if os.path.dirname(path) == str(tmp_path):
            with lock:
                inside["now"] += 1
                inside["most"] = max(inside["most"], inside["now"])
                lock.notify_all()
                # Long enough for 4 threads to start on a loaded machine.
                deadline = time.monotonic() + 30
                while inside["most"] < 4 and time.monotonic() < deadline:
                    lock.wait(0.1)
                inside["now"] -= 1
        return real(path)

    os.scandir = scandir  # type: ignore[assignment]
    try:
        listing = list_files(str(tmp_path))
    finally:
        os.scandir = real  # type: ignore[assignment]
    assert [e.path for e in listing.entries] == ["a/f.bin", "b/f.bin", "c/f.bin", "d/f.bin"]
    assert inside["most"] == 4


def test_a_failing_folder_visit_stops_the_walk_and_is_raised():
    seen: list[str] = []

    def visit(folder: str) -> list[str]:
        seen.append(folder)
        if folder == "boom":
            raise RuntimeError("boom")
        return [f"{folder}/{i}" for i in range(3)] if folder.count("/") < 2 else \
            (["boom"] if folder == "top/0/0" else [])

    with pytest.raises(RuntimeError, match="boom"):
        walk.walk_folders("top", visit, threads=4)
    assert "boom" in seen


def test_fuse_mount_with_nesting_and_hidden_folders(fuse_volume):
    """Through a real FUSE mount: nested and hidden folders, both thread counts."""
    backing, mnt = fuse_volume
    key = unique()
    tree = {f"{key}/{a}/{b}/{n}": b"x" * (len(a) + len(b))
            for a in ("p", "q", "_delta_log", ".cache") for b in ("r", "s", ".t") for n in FILES}
    for path, data in tree.items():
        os.makedirs(os.path.join(backing, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(backing, path), "wb") as fh:
            fh.write(data)
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    source = os.path.join(mnt, key)
    for hidden in (False, True):
        with threads(1):
            sequential = list_files(source, include_hidden=hidden)
        parallel = list_files(source, include_hidden=hidden)
        assert parallel.entries == sequential.entries
        want = sorted(p.split("/", 1)[1] for p in tree if hidden or not _hidden(p))
        assert [e.path for e in parallel.entries] == want
