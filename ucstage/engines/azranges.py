"""Azure blobs the store keeps no MD5 for, read in ranges whose MD5 Azure
computes as it serves them: every byte that crosses is checked.

A blob committed from blocks (Put Block + Put Block List, as large uploads
are) without ``Content-MD5`` has no stored checksum, so its whole GET could be
checked by size only. Azure returns the MD5 of the range it serves when asked
(``x-ms-range-get-content-md5: true``, ranges of at most :data:`RANGE`), and
Azurite does the same. obstore (0.12.1) neither sends that header (a
``default_headers`` one is left out of the signature: 403) nor returns
``Content-MD5``, so these GETs go through azure-storage-blob, which adlfs
already brings for Azure's listings, authenticated as adlfs is
(:func:`ucstage.cloudfs.blob_service`).

:class:`Blobs` answers ``get_async(key, options=)`` as an obstore store does
(one range, ``if_match``), so :func:`ucstage.engines.objget.read` sends,
hedges and bounds these legs like any other; the range's MD5 rides in the
response's ``meta["range_md5"]``, and :mod:`ucstage.engines.objget` checks
each range against it as the bytes are written.

One client per process and container, made on the engine's loop (its
aiohttp session belongs to that loop), closed at exit before the loop
stops; a forked child makes its own.

The fsspec engine (DataLoader workers forked after obstore ran in their
parent, where obstore cannot run) copies such a blob with :func:`copy_into`:
the SDK's sync client, whose ``download_blob(validate_content=True)`` asks
each range of at most :data:`RANGE` for its MD5 and checks the bytes against
it, every range after the first ``If-Match`` the first one's ETag. A range
that mismatches is read again from where the copy got, :data:`TRIES` reads
at most, as on the object-store engine.

A table's row-group entries (byte ranges of a blob, however large, and
whatever MD5 the store keeps of the whole) are read the same way on both
engines (:func:`read_ranges`): their copies run in a thread on either, so
the sync client serves them, every GET ``If-Match`` the listed ETag.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from .. import cloudfs
from . import checks, reset_after_fork
from .context import Stoppable
from .objstore import deadline
from .ranges import RangeChanged

__all__ = ["RANGE", "TRIES", "Blobs", "Read", "blobs", "copy_into", "passed", "read_ranges",
           "wanted"]

RANGE = 4 * 1024 * 1024
"""The largest range Azure returns an MD5 for."""
TRIES = 3
"""Reads of one range whose bytes mismatch its MD5 before the copy fails
(and the cache's own retry of the file, if any, begins)."""

_RANGE_HEADER = {"x-ms-range-get-content-md5": "true"}
_CONTENT_RANGE = re.compile(r"bytes \d+-\d+/(\d+)")
_ENV = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_KEY", "AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL",
        "AZURE_STORAGE_ENDPOINT", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_SAS_KEY")


def _settings(limit: float) -> dict[str, Any]:
    """The SDK client's settings, async and sync alike: no retries inside
    the SDK (the cache's retry rule applies, as for obstore), no GET of more
    than :data:`RANGE`, timeouts a backstop behind the engine's deadline."""
    return {"retry_total": 0, "max_single_get_size": RANGE, "max_chunk_get_size": RANGE,
            "connection_timeout": limit + 5, "read_timeout": limit + 5}


def passed(md5: str) -> checks.Verdict:
    """The verdict on a copy whose every range matched its MD5, ``md5`` (hex)
    being the whole copy's, recorded for ``cache verify --checksum``."""
    checks.TALLY.add("md5")
    return checks.Verdict("md5", f"md5:{md5}")


def wanted(source: str, listed: str, size: int) -> bool:
    """Whether a copy of ``source`` (``kind://bucket``) listed as ``listed``
    with ``size`` bytes is read in MD5-checked ranges: an Azure blob whose
    listing carries no MD5. An empty one has no byte to check (its size says
    all)."""
    return source.startswith("az://") and size > 0 and not cloudfs.sums(listed)


class _Got:
    """One range's response, shaped as obstore's ``GetResult``: ``meta``
    (``size`` of the blob, ``e_tag``, ``last_modified``, and ``range_md5``,
    the hex MD5 Azure gave of this range, '' if none) and the body."""

    def __init__(self, meta: dict[str, Any], body: bytes) -> None:
        self.meta, self._body = meta, body

    async def bytes_async(self) -> bytes:
        return self._body

    async def stream(self, min_chunk_size: int = 0) -> AsyncIterator[bytes]:
        yield self._body


class Blobs:
    """One container's blobs, read a range at a time with its MD5."""

    def __init__(self, bucket: str, limit: float) -> None:
        container, account = cloudfs.split_account(bucket)
        self.service = cloudfs.blob_service(account, **_settings(limit))
        self.container = self.service.get_container_client(container)

    async def get_async(self, key: str, options: Any = None) -> _Got:
        """The bytes ``options["range"]`` (``(start, end)``, at most
        :data:`RANGE`) of blob ``key``, with Azure's MD5 of them; ``if_match``
        as obstore's. Errors are the ``OSError``\\s obstore's map to."""
        from azure.core import MatchConditions

        start, end = options["range"]
        if end - start > RANGE:
            raise ValueError(f"a range of {end - start} bytes has no MD5 (at most {RANGE})")
        heard: dict[str, Any] = {}
        kwargs: dict[str, Any] = {}
        if options.get("if_match"):
            kwargs = {"etag": options["if_match"], "match_condition": MatchConditions.IfNotModified}
        try:
            got = await self.container.download_blob(
                key, offset=start, length=end - start, headers=_RANGE_HEADER,
                raw_response_hook=lambda response: heard.update(response.http_response.headers),
                **kwargs)
            body = await got.readall()
        except Exception as exc:
            raise _oserror(exc, key) from exc
        headers = {name.lower(): value for name, value in heard.items()}
        total = _CONTENT_RANGE.match(headers.get("content-range", ""))
        props = got.properties
        return _Got({"location": key, "size": int(total.group(1)) if total else start + len(body),
                     "e_tag": props.etag, "last_modified": props.last_modified,
                     "version": None,
                     "range_md5": cloudfs.hex_of(headers.get("content-md5", ""))}, body)

    async def close(self) -> None:
        await self.service.close()


def _oserror(exc: BaseException, key: str) -> BaseException:
    """The SDK's errors as the one-line ``OSError``\\s of
    :func:`ucstage.engines.objstore.concise`: 404 ``FileNotFoundError``, 401/403
    ``PermissionError``, else ``OSError`` (retried; 503 and 429 read as
    throttling by :mod:`ucstage.engines.pace`)."""
    from azure.core.exceptions import AzureError, ClientAuthenticationError, ResourceNotFoundError

    if isinstance(exc, OSError) or not isinstance(exc, AzureError):
        return exc
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    status = getattr(exc, "status_code", None)
    code = getattr(exc, "error_code", None)
    line = f"Azure GET: status code: {status}: {code or ''} {first}" if status else \
        f"Azure GET: {first}"
    if isinstance(exc, ResourceNotFoundError) or status == 404:
        return FileNotFoundError(2, line, key)
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        return PermissionError(line)
    return OSError(line)


_clients: dict[tuple[Any, ...], Blobs] = {}
_forked_away: list[Any] = []
"""What a forked child keeps but never uses: the parent's clients (their
sessions belong to the parent's loop)."""


_containers: dict[tuple[Any, ...], Any] = {}
"""This process's sync container clients (:func:`copy_into`)."""
_containers_lock = threading.Lock()


@reset_after_fork
def _forget_after_fork() -> None:
    global _containers_lock
    _forked_away.append((dict(_clients), dict(_containers)))
    _clients.clear()
    _containers.clear()
    _containers_lock = threading.Lock()


def blobs(bucket: str, limit: float | None = None) -> Blobs:
    """This process's client of ``bucket`` (``container`` or
    ``container@account``). Call it on the engine's loop, which its
    connections belong to."""
    limit = deadline() if limit is None else limit
    key = _key(bucket, limit)
    found = _clients.get(key)
    if found is None:
        if not _clients:
            # Registered after the loop's own stop (atexit runs last first):
            # the sessions close while their loop still runs.
            import asyncio

            atexit.register(_close_all, asyncio.get_running_loop())
        found = _clients[key] = Blobs(bucket, limit)
    return found


def _key(bucket: str, limit: float) -> tuple[Any, ...]:
    # The variables read are part of the key, so a process that changes them
    # (a test, a notebook) gets a client that follows.
    return (os.getpid(), bucket, limit, *(os.environ.get(name, "") for name in _ENV))


def _container(bucket: str, limit: float | None) -> Any:
    """This process's sync client of ``bucket`` (``container`` or
    ``container@account``), shared by its threads (the SDK's clients are
    thread-safe)."""
    limit = deadline() if limit is None else limit
    key = _key(bucket, limit)
    with _containers_lock:
        found = _containers.get(key)
        if found is None:
            container, account = cloudfs.split_account(bucket)
            service = cloudfs.blob_service(account, aio=False, **_settings(limit))
            found = _containers[key] = service.get_container_client(container)
    return found


class Read(NamedTuple):
    """What :func:`copy_into` copied."""

    size: int
    etag: str
    """The blob's ETag (unquoted), the same for every range."""
    last_modified: datetime | None
    md5: str
    """The MD5 (hex) of the whole copy."""


_MISMATCH = re.compile(r"MD5 mismatch\. Expected value is '([^']*)', computed value is '([^']*)'")
"""The SDK's error for a range whose bytes differ from its MD5 (azure-storage-blob
12.x, ``StorageContentValidation``), with both MD5s in base64."""


def copy_into(bucket: str, key: str, fd: int, inflight: Stoppable | None = None,
              limit: float | None = None) -> Read:
    """Copy blob ``key`` of ``bucket`` into the open file ``fd`` from offset
    0 (a preallocated file is not cut: the caller does), every byte checked
    against the MD5 Azure gives of its range (see the module docstring).
    ``inflight`` is checked between ranges; ``limit``: seconds per request
    (None: the environment's).

    Raises:
        checks.Mismatch: a range mismatched on :data:`TRIES` reads in a row.
        Stopped: ``inflight`` stopped.
        OSError: a range came without its MD5, the blob changed during the
            copy (412), or any other error of the store (one line, as
            :func:`_oserror` maps them).
    """
    whole = checks.hasher("md5")

    def put(pos: int, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fd, view, pos)
            view, pos = view[written:], pos + written
        whole.update(chunk)

    size, etag, modified = _download(_container(bucket, limit), key, 0, None, "", put, inflight)
    return Read(size, etag, modified, whole.hexdigest())


def read_ranges(bucket: str, key: str, ranges: Sequence[tuple[int, int]], etag: str,
                inflight: Stoppable | None = None, limit: float | None = None) -> list[bytes]:
    """The bytes of each (offset, length) range of blob ``key`` of
    ``bucket`` (a table's row group: its column chunks, however large), each
    read as GETs of at most :data:`RANGE` whose bytes are checked against the
    MD5 Azure gives of them, as :func:`copy_into` reads a whole blob: a piece
    that mismatches is read again, :data:`TRIES` reads in a row at most.
    ``etag``: the listed ETag (unquoted; '' for none), which every GET must
    match.

    Raises:
        checks.Mismatch: a piece mismatched on :data:`TRIES` reads in a row.
        RangeChanged: the blob is no longer the listed one (412).
        Stopped: ``inflight`` stopped.
        OSError: a piece came without its MD5, or any other error of the store.
    """
    container = _container(bucket, limit)
    out = []
    for offset, length in ranges:
        got = bytearray(length)

        def put(pos: int, chunk: bytes, got: bytearray = got, offset: int = offset) -> None:
            got[pos - offset:pos - offset + len(chunk)] = chunk

        if length:
            _download(container, key, offset, offset + length, etag, put, inflight)
        out.append(bytes(got))
    return out


def _download(container: Any, key: str, start: int, end: int | None, etag: str,
              put: Callable[[int, bytes], None], inflight: Stoppable | None
              ) -> tuple[int, str, datetime | None]:
    """Bytes ``start`` to ``end`` (None: the blob's end) of blob ``key``,
    each handed to ``put(offset, chunk)`` once checked against the MD5 Azure
    gives of its piece (the SDK's ``validate_content``, pieces of at most
    :data:`RANGE`); every GET ``If-Match`` ``etag``, or, when '', the ETag
    the first GET found. A piece that mismatches is read again from the
    first byte not yet taken, :data:`TRIES` reads in a row at most. Returns
    the blob's size (``end`` for a range), ETag (unquoted) and last-modified
    time (None for a range).

    Raises:
        checks.Mismatch, RangeChanged, Stopped, OSError: as :func:`read_ranges`.
    """
    from azure.core import MatchConditions
    from azure.core.exceptions import AzureError

    def heard(response: Any) -> None:
        # The SDK checks a range only when the response carries its MD5:
        # one that came without is refused here, never taken unchecked.
        http = response.http_response
        if http.status_code < 300 and not http.headers.get("content-md5"):
            raise OSError(f"Azure sent no MD5 of the bytes {http.headers.get('content-range')} "
                          "(x-ms-range-get-content-md5)")

    pos, size, misses = start, -1 if end is None else end, 0
    etag = f'"{etag.strip(chr(34))}"' if etag else ""
    modified = None
    while pos < size or size < 0:
        if inflight is not None:
            inflight.check()
        conditions: dict[str, Any] = {} if not etag else \
            {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        try:
            # A whole blob's first GET names its size and ETag; after a
            # mismatch, the read goes on from its first byte not taken.
            got = container.download_blob(
                key, offset=pos if pos or end is not None else None,
                length=None if end is None else end - pos, validate_content=True,
                raw_response_hook=heard, **conditions)
            if size < 0:
                size, etag, modified = got.size, got.properties.etag, got.properties.last_modified
            for chunk in got.chunks():
                put(pos, chunk)
                pos += len(chunk)
                misses = 0
                if inflight is not None:
                    inflight.check()
        except AzureError as exc:
            mismatch = _MISMATCH.search(str(exc))
            if mismatch is None:
                if end is not None and getattr(exc, "status_code", None) == 412:
                    raise RangeChanged(f"{key} changed since it was listed") from None
                raise _oserror(exc, key) from exc
            # A transfer error (or a bad replica): this piece again, not the whole.
            checks.TALLY.add("mismatches")
            misses += 1
            if misses == TRIES:
                raise checks.Mismatch(key, "md5", cloudfs.hex_of(mismatch.group(1)),
                                         cloudfs.hex_of(mismatch.group(2))) from None
    return size, str(etag or "").strip('"'), modified


def _close_all(loop: asyncio.AbstractEventLoop) -> None:
    """Close this process's clients on ``loop`` (the engine's, which their
    connections belong to) before it stops, so no "Unclosed client session"
    is reported at exit."""
    import asyncio

    mine = [c for k, c in _clients.items() if k[0] == os.getpid()]
    _clients.clear()
    if not mine:
        return

    async def close() -> None:
        for client in mine:
            with contextlib.suppress(Exception):
                await client.close()

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=2.0)
