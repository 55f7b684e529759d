"""One interface over the four source kinds, so a test suite can run on each.

A Backend writes files into its store the way a data platform would and gives
the source string a user would pass to ucstage to read them back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


def deny_s3_listing(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """Make s3fs's listing of keys under ``prefix`` fail as a bucket policy
    would (403 AccessDenied on ListObjectsV2); other prefixes list as usual."""
    import s3fs
    from botocore.exceptions import ClientError

    original = s3fs.S3FileSystem._iterdir

    async def denied(self, bucket, *args, prefix="", **kwargs):  # type: ignore[no-untyped-def]
        if prefix.startswith(key):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}},
                              "ListObjectsV2")
        async for item in original(self, bucket, *args, prefix=prefix, **kwargs):
            yield item

    key = prefix
    monkeypatch.setattr(s3fs.S3FileSystem, "_iterdir", denied)
