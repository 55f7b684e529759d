"""One interface over the four source kinds, so a test suite can run on each.

A Backend writes files into its store the way a data platform would and gives
the source string a user would pass to ucstage to read them back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.spec import AbstractFileSystem

from tests.common.parts import unique


@dataclass
class Backend:
    name: str
    url: str
    """What a user passes to ucstage."""
    store: Any
    """An fsspec filesystem writing to the backing store."""
    store_root: str
    """Where ``url``'s files live inside ``store``."""

    def write(self, relpath: str, data: bytes) -> None:
        """Write one file; on FUSE, return once the mount shows it."""
        self._put(relpath, data)
        self.settle()

    def write_many(self, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            self._put(rel, data)
        self.settle()

    def _put(self, relpath: str, data: bytes) -> None:
        path = f"{self.store_root}/{relpath}"
        if self.name in ("local", "fuse"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
        else:
            self.store.pipe_file(path, data)

    def settle(self) -> None:
        """Wait until a FUSE mount's directory cache shows what was written."""
        if self.name == "fuse":
            from tests.common.parts import wait_synced

            wait_synced(self.store_root, self.url)


def make_source(kind: str, root: str, files: dict[str, bytes]) -> str:
    """Write ``files`` where a ``source_kind`` fixture says (``local``: into the
    folder ``root``; ``s3-*``: under a fresh prefix of the moto bucket) and
    return the source a user passes to ucstage."""
    if kind == "local":
        for rel, data in files.items():
            path = os.path.join(root, *rel.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
        return root
    import s3fs

    prefix = f"ucstage-test/{unique('src')}"
    s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True).pipe(
        {f"{prefix}/{rel}": data for rel, data in files.items()})
    return f"s3://{prefix}"


class WalkingStore(MemoryFileSystem):
    """An fsspec store listed folder by folder with fsspec's own ``find`` (as
    dbfs://, sftp:// and other non-flat backends are), whose ``ls`` refuses
    the folders in ``denied`` as a store answers without permission."""

    protocol = "ucstage-walk"
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    denied: ClassVar[set[str]] = set()
    find = AbstractFileSystem.find  # fsspec's walk, which omits folders it cannot list

    @classmethod
    def _strip_protocol(cls, path):  # type: ignore[no-untyped-def]
        return super()._strip_protocol(str(path).replace("ucstage-walk://", "memory://", 1))

    def ls(self, path, detail=True, **kwargs):  # type: ignore[no-untyped-def]
        if self._strip_protocol(path) in self.denied:
            raise PermissionError(13, "Permission denied", path)
        return super().ls(path, detail=detail, **kwargs)


@pytest.fixture
def walking_store() -> Iterator[str]:
    """A ``ucstage-walk://KEY`` source holding cat/ and dog/, dog/ refused by ls."""
    fsspec.register_implementation("ucstage-walk", WalkingStore, clobber=True)
    key = unique()
    fs = WalkingStore()
    fs.pipe({f"/{key}/cat/1.jpg": b"c1", f"/{key}/cat/2.jpg": b"c2", f"/{key}/dog/1.jpg": b"d1"})
    WalkingStore.denied = {f"/{key}/dog"}
    yield f"ucstage-walk://{key}"
    WalkingStore.denied = set()
    fs.rm(f"/{key}", recursive=True)


@contextmanager
def deny_s3_listing(monkeypatch: pytest.MonkeyPatch, moto: Any, prefix: str) -> Iterator[None]:
    """Make listings of keys under ``prefix`` fail as a bucket policy would
    (403 AccessDenied on ListObjectsV2), for both engines: a proxy in front of
    the moto server answers them; other requests pass."""
    import s3fs

    from tests.common.throttle import throttled

    with throttled(moto.endpoint) as (url, proxy):
        proxy.deny_prefix = prefix
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            yield
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
