"""The engine's writes to an object store: a local file or a few bytes PUT
to a key, checked against what the store reports, and the key's removal.

A checkpoint's upload is the one place ucstage writes to a store; it sits
here, beside the GETs (:mod:`ucstage.engines.objget`), because the engine
owns every byte that moves. What each store reports, and so how a PUT is
checked:

* **S3** answers each PUT with an ETag the store computed from the bytes it
  received: the MD5 of the object for a single PUT, and for a multipart
  upload the MD5 of the parts' MD5s followed by ``-<parts>``. The parts are
  cut here at :data:`PART` bytes, so the expected ETag is computed locally
  in the same pass that feeds the upload, and compared: no read-back. A
  bucket whose ETags are not MD5s (SSE-KMS) fails that comparison; the
  object is then read back and hashed before the PUT counts as failed.
* **GCS** keeps a CRC32C of every object (composite ones included) and an
  MD5 of objects uploaded whole: the PUT (through gcsfs, which reaches the
  emulators obstore cannot write to without OAuth) is compared with the one
  of the checkpoint's kind the store reports, read back only when it keeps
  none of that kind.
* **Azure** keeps no checksum of a blob made of blocks (its ETag is opaque):
  the object is read back and hashed.

A throttled request (``503 SlowDown``, ``429``: :func:`ucstage.engines.pace.throttled`)
is retried after a growing, jittered pause, up to :data:`pace.FREE_RETRIES`
times, and a transient failure (a timeout, a dropped connection, a 5xx) up
to :data:`TRANSIENT_RETRIES` times (a file is sent again from its start);
any other error is raised (one line: :func:`objstore.concise`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from . import objstore, pace
from .checks import hasher

__all__ = ["PART", "Put", "Unfinished", "abort_upload", "delete", "put_bytes", "put_file",
           "read_back", "retried", "unfinished_uploads"]

T = TypeVar("T")

PART = 16 * 1024 * 1024
"""Bytes per part of a multipart upload (S3's minimum is 5 MiB): also the
block read from the local file at a time."""
CONCURRENCY = 8
"""Parts of one file in flight at once."""


@dataclass(frozen=True)
class Put:
    """What the store holds under a key after a put."""

    size: int
    checksum: str
    """``kind:<hex>`` of the bytes the store holds, as it vouched for them."""
    how: str
    """``etag`` (S3's ETag matched), ``stored`` (the store's own checksum
    matched) or ``read-back`` (the object was read back and hashed)."""


TRANSFER_SLACK_S = 90.0
"""Seconds a part's PUT, or a whole read-back, may take beyond the request
deadline (:func:`ucstage.engines.objstore.deadline`): that deadline is for a
GET's first bytes, while the client's timeout covers a request's whole body,
and a 16 MiB part on a slow link (or an emulator on a loaded machine, seen
at 35 s) needs more."""


def _transfers(kind: str, bucket: str) -> Any:
    """The client for sending a file or reading one back whole."""
    return objstore.store(kind, bucket, deadline=objstore.deadline() + TRANSFER_SLACK_S)


TRANSIENT_RETRIES = 2
"""Extra attempts after a transient failure of a request (a timeout, a
dropped connection, a 5xx answer): a real store, or an emulator on a loaded
machine, fails one now and then, and a save must not fail for it."""
_TRANSIENT = re.compile(r"timed? ?out|timeout|error sending request|connection (?:reset|refused|"
                        r"closed|aborted)|broken pipe|\b50[0234]\b", re.I)


def retried(fn: Callable[[], T], *, retries: int = pace.FREE_RETRIES) -> T:
    """``fn()``, again after a growing jittered pause while the store throttles
    it (up to ``retries`` more times), or after a transient failure (up to
    :data:`TRANSIENT_RETRIES` more times). Anything else, a stop among them,
    is raised at once."""
    transient = 0
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == retries:
                raise
            if not pace.throttled(exc):
                if transient == TRANSIENT_RETRIES or not _TRANSIENT.search(str(exc)):
                    raise
                transient += 1
            time.sleep(random.uniform(0.5, 1.0) * min(2.0, pace.PAUSE_S * 2 ** attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _gcs(bucket: str) -> Any:
    from .. import cloudfs

    return cloudfs.filesystem("gs")


Grown = Callable[[int], int]
"""For a file still being written: called with a byte count, it blocks until
the file holds that many bytes or is complete and returns the bytes it
holds (it raises when the writer failed)."""


def _whole(_n: int) -> int:
    return sys.maxsize  # a complete file: every read is its final bytes


def put_file(kind: str, bucket: str, key: str, local: str, check: str,
             go_on: Callable[[int], None] = lambda _n: None, grown: Grown = _whole) -> Put:
    """PUT the local file at ``local`` to ``key`` (multipart above
    :data:`PART`) and return what landed, checked (see the module
    docstring). ``check`` is the checksum kind to report (``crc32c``,
    ``md5``); ``go_on`` is called with each block's size before it is sent
    and raises to stop the upload (a cancelled save). ``grown``: the file
    is still being written (:data:`Grown`); each part is sent as soon as it
    is there, so the upload overlaps the writing."""
    if kind == "gs":
        return retried(lambda: _put_gcs(bucket, key, local, check, go_on, grown))
    return retried(lambda: _put_obstore(kind, bucket, key, local, check, go_on, grown))


def _put_obstore(kind: str, bucket: str, key: str, local: str, check: str,
                 go_on: Callable[[int], None], grown: Grown) -> Put:
    import obstore

    client = _transfers(kind, bucket)
    whole = hasher(check)
    parts: list[bytes] = []
    size = 0

    def blocks(fh: Any) -> Iterator[bytes]:
        nonlocal size
        while True:
            go_on(0)
            grown(size + PART)
            block = fh.read(PART)
            if not block:
                return
            whole.update(block)
            parts.append(hashlib.md5(block, usedforsecurity=False).digest())
            size += len(block)
            go_on(len(block))
            yield block

    with open(local, "rb", buffering=0) as fh:
        grown(PART + 1)  # one PUT or multipart: decided once it is known
        first = fh.read(PART + 1)
        try:
            if len(first) <= PART:  # one PUT: its ETag is the object's MD5
                go_on(len(first))
                whole.update(first)
                parts.append(hashlib.md5(first, usedforsecurity=False).digest())
                size = len(first)
                result = obstore.put(client, key, first, use_multipart=False)
            else:
                fh.seek(0)
                result = obstore.put(client, key, blocks(fh), use_multipart=True,
                                     chunk_size=PART, max_concurrency=CONCURRENCY)
        except Exception as exc:
            raise objstore.concise(exc, f"{kind}://{bucket}/{key}") from exc
    ours = f"{check}:{whole.hexdigest()}"
    if kind == "s3":
        etag = str(result.get("e_tag") or "").strip('"')
        expected = parts[0].hex() if len(parts) == 1 else \
            f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"
        if etag == expected:
            return Put(size, ours, "etag")
    got_size, got = read_back(kind, bucket, key, check, go_on)
    return Put(got_size, got, "read-back")


def _put_gcs(bucket: str, key: str, local: str, check: str,
             go_on: Callable[[int], None], grown: Grown) -> Put:
    from .. import cloudfs

    fs = _gcs(bucket)
    go_on(0)
    grown(sys.maxsize)  # gcsfs reads the file itself: only once it is complete
    fs.put_file(local, f"{bucket}/{key}")
    info = fs.info(f"{bucket}/{key}")
    stored = cloudfs.hex_of(info.get("crc32c" if check == "crc32c" else "md5Hash") or "")
    if stored:
        return Put(int(info["size"]), f"{check}:{stored}", "stored")
    got_size, got = read_back("gs", bucket, key, check, go_on)
    return Put(got_size, got, "read-back")


def read_back(kind: str, bucket: str, key: str, check: str,
              go_on: Callable[[int], None] = lambda _n: None) -> tuple[int, str]:
    """``(size, kind:<hex>)`` of the object as the store serves it, read whole."""
    digest = hasher(check)
    size = 0
    if kind == "gs":
        with _gcs(bucket).open(f"{bucket}/{key}", "rb", block_size=PART) as fh:
            while block := fh.read(PART):
                go_on(0)
                digest.update(block)
                size += len(block)
        return size, f"{check}:{digest.hexdigest()}"
    import obstore

    client = _transfers(kind, bucket)
    try:
        for block in obstore.get(client, key).stream(min_chunk_size=PART):
            go_on(0)
            digest.update(memoryview(block))
            size += len(block)
    except Exception as exc:
        raise objstore.concise(exc, f"{kind}://{bucket}/{key}") from exc
    return size, f"{check}:{digest.hexdigest()}"


def put_bytes(kind: str, bucket: str, key: str, data: bytes) -> None:
    """PUT a small object whole: a reader sees all of it or nothing."""
    if kind == "gs":
        retried(lambda: _gcs(bucket).pipe_file(f"{bucket}/{key}", data))
        return
    import obstore

    def once() -> None:
        try:
            obstore.put(objstore.store(kind, bucket), key, data, use_multipart=False)
        except Exception as exc:
            raise objstore.concise(exc, f"{kind}://{bucket}/{key}") from exc

    retried(once)


def delete(kind: str, bucket: str, key: str) -> None:
    """Remove ``key``; a key already gone is no error."""
    if kind == "gs":
        fs = _gcs(bucket)
        with contextlib.suppress(FileNotFoundError):
            retried(lambda: fs.rm_file(f"{bucket}/{key}"))
        return
    import obstore

    def once() -> None:
        try:
            obstore.delete(objstore.store(kind, bucket), key)
        except Exception as exc:
            err = objstore.concise(exc, f"{kind}://{bucket}/{key}")
            if isinstance(err, FileNotFoundError):
                return
            raise err from exc

    retried(once)


def list_folder(kind: str, bucket: str, prefix: str) -> tuple[dict[str, tuple[int, float]],
                                                              list[str]]:
    """One level of the "folder" ``prefix`` (a key prefix without its
    trailing ``/``; '' for the bucket): ``({name: (size, mtime)}, [subfolder names])``."""
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    files: dict[str, tuple[int, float]] = {}
    folders: list[str] = []
    if kind == "gs":
        fs = _gcs(bucket)
        try:
            found = retried(lambda: fs.ls(f"{bucket}/{base}", detail=True))
        except FileNotFoundError:
            return files, folders
        for info in found:
            name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            if info.get("type") == "directory":
                folders.append(name)
            elif name:
                modified = info.get("updated") or info.get("mtime")
                files[name] = (int(info["size"]), _seconds(modified))
        return files, sorted(set(folders))
    import obstore

    def once() -> Any:
        try:
            return obstore.list_with_delimiter(objstore.store(kind, bucket), prefix=base or None)
        except Exception as exc:
            raise objstore.concise(exc, f"{kind}://{bucket}/{base}") from exc

    listed = retried(once)
    for meta in listed["objects"]:
        name = str(meta["path"])[len(base):]
        if name and "/" not in name:
            files[name] = (int(meta["size"]), _seconds(meta.get("last_modified")))
    for common in listed["common_prefixes"]:
        name = str(common)[len(base):].strip("/")
        if name:
            folders.append(name)
    return files, sorted(folders)


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def get_bytes(kind: str, bucket: str, key: str) -> bytes | None:
    """A small object whole, or None when it is not there."""
    if kind == "gs":
        try:
            return bytes(retried(lambda: _gcs(bucket).cat_file(f"{bucket}/{key}")))
        except FileNotFoundError:
            return None
    import obstore

    def once() -> bytes | None:
        try:
            return bytes(obstore.get(objstore.store(kind, bucket), key).bytes())
        except Exception as exc:
            err = objstore.concise(exc, f"{kind}://{bucket}/{key}")
            if isinstance(err, FileNotFoundError):
                return None
            raise err from exc

    return retried(once)


@dataclass(frozen=True)
class Unfinished:
    """A multipart upload begun and never completed or aborted (its writer
    was killed): its parts are stored, and billed, until it is aborted."""

    key: str
    upload_id: str
    initiated: float
    """When it began (Unix time, the store's clock)."""
    last_part: float | None
    """When its newest part arrived; None when it has none."""

    @property
    def last_active(self) -> float:
        return max(self.initiated, self.last_part or 0.0)


def _s3fs() -> Any:
    """s3fs (``ucstage[s3]``), from the standard variables: obstore has no call
    that lists or aborts multipart uploads. A fresh instance each time (it is
    needed once per listing or prune): fsspec's cached one would keep the
    endpoint and keys of the first call after the variables changed."""
    import fsspec

    return fsspec.filesystem("s3", skip_instance_cache=True)


def unfinished_uploads(kind: str, bucket: str, prefix: str) -> list[Unfinished]:
    """The multipart uploads under ``prefix`` that were never completed or
    aborted, oldest first. Only S3 keeps such uploads where a listing does
    not show them; GCS's resumable uploads and Azure's uncommitted blocks
    expire by themselves (a week), so on those stores this is empty."""
    if kind != "s3":
        return []
    fs = _s3fs()
    found: list[Unfinished] = []
    marker: dict[str, str] = {}
    while True:
        try:
            page = retried(functools.partial(
                fs.call_s3, "list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker))
        except FileNotFoundError:
            # No bucket, or a store that keeps no such list (rclone's S3
            # answers NoSuchUpload): nothing there to abort.
            return found
        for upload in page.get("Uploads") or []:
            key, upload_id = str(upload["Key"]), str(upload["UploadId"])
            found.append(Unfinished(key, upload_id, _seconds(upload.get("Initiated")),
                                    _last_part(fs, bucket, key, upload_id)))
        if not page.get("IsTruncated"):
            break
        marker = {"KeyMarker": page.get("NextKeyMarker", ""),
                  "UploadIdMarker": page.get("NextUploadIdMarker", "")}
    return sorted(found, key=lambda u: (u.initiated, u.key))


def _last_part(fs: Any, bucket: str, key: str, upload_id: str) -> float | None:
    """When the newest part of an upload arrived (its parts, listed)."""
    newest: float | None = None
    marker: dict[str, int] = {}
    while True:
        try:
            page = retried(functools.partial(
                fs.call_s3, "list_parts", Bucket=bucket, Key=key, UploadId=upload_id, **marker))
        except FileNotFoundError:  # completed or aborted since it was listed
            return newest
        for part in page.get("Parts") or []:
            at = _seconds(part.get("LastModified"))
            newest = at if newest is None else max(newest, at)
        if not page.get("IsTruncated"):
            return newest
        marker = {"PartNumberMarker": int(page.get("NextPartNumberMarker", 0))}


def abort_upload(kind: str, bucket: str, upload: Unfinished) -> None:
    """Abort an unfinished multipart upload: the store drops its parts. One
    already gone (completed or aborted meanwhile) is no error."""
    if kind != "s3":
        return
    fs = _s3fs()
    with contextlib.suppress(FileNotFoundError):  # NoSuchUpload, as s3fs names it
        retried(lambda: fs.call_s3("abort_multipart_upload", Bucket=bucket,
                                           Key=upload.key, UploadId=upload.upload_id))
