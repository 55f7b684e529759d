"""The object-store engine's store side: whether obstore reads a source (the
``$UCSTAGE_ENGINE`` rule, :func:`reads`; the engine itself is chosen by
:func:`ucstage.engines.engine.of`), one obstore client per process, and listing.

ucstage reads ``s3://``, ``gs://`` and ``az://``/``abfs://`` sources (and
``/Volumes`` mapped to them) through obstore, the Python binding of Rust's
``object_store``: requests are signed and parsed in Rust, and many of them
share one event loop (:mod:`ucstage.engines.objget`). Every other protocol, and
these too when obstore is missing or ``UCSTAGE_ENGINE=fsspec``, goes through
fsspec. Both engines list the same entries (paths, sizes, ETag versions), so
switching engines changes no fingerprint and invalidates no cached file. GCS
and Azure are listed through gcsfs and adlfs on both engines, in every URL
form (:mod:`ucstage.cloudfs`): obstore's listing lacks the stored checksums.

Fork: obstore's clients hold connection pools, and its requests run on a
Tokio runtime whose threads do not survive ``fork``; a child that touches it
hangs, and the runtime cannot be started again in that child. So clients are
per process (keyed by process id, emptied in a forked child), and a process
forked after obstore was used in its parent (DataLoader workers fork after the
main process listed) reads through fsspec instead: both engines list and
stamp the same, so the child's copies are valid for everyone. A process that
starts fresh (spawn, forkserver) or was forked before obstore was used keeps
the obstore engine. That is why the ucstage DataLoader starts its workers
from a forkserver over an object-store volume once obstore was used here
(:func:`forks_fall_back`; :mod:`ucstage.data.workerstart`): the server process
never touches obstore, so each worker forked from it builds its own client
and runtime. Workers forked from this process (an explicit
``multiprocessing_context="fork"``, torch's own DataLoader) read through fsspec.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import cloudfs
from ..errors import InvalidArgument, MissingDependency, SourceUnreadable
from . import reset_after_fork

if TYPE_CHECKING:
    from obstore._buffered import ReadableFile

T = TypeVar("T")

__all__ = ["DEADLINE_ENV", "ENGINES", "ENGINE_ENV", "ObjectFS", "OnStore", "StoreVolume", "Unparsable",
           "concise", "deadline",
           "delta_location", "forks_fall_back", "keep_clean", "list_objects", "location", "reads",
           "run_here", "serves", "store", "usable"]

ENGINE_ENV = "UCSTAGE_ENGINE"
ENGINES = ("auto", "obstore", "fsspec")
"""Values of ``$UCSTAGE_ENGINE``: ``auto`` (the default) uses obstore for the
protocols it serves when it is installed, ``fsspec`` forces fsspec, ``obstore``
requires obstore for those protocols."""

# fsspec protocol -> the store kind that serves it.
_KINDS = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "abfs": "az",
          "abfss": "az", "adl": "az"}
_EXTRA = {"s3": "ucstage[s3]", "gs": "ucstage[gcs]", "az": "ucstage[azure]"}

_ENV = {
    "s3": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
           "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
           "AWS_DEFAULT_REGION"),
    "gs": ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS",
           "GOOGLE_SERVICE_ACCOUNT"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY",
           "AZURE_STORAGE_KEY", "AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL",
           "AZURE_STORAGE_ENDPOINT", "AZURE_STORAGE_SAS_TOKEN"),
}
_lock = threading.Lock()
_stores: dict[tuple[Any, ...], Any] = {}


class Unparsable(Exception):
    """The store holds keys object_store refuses to parse (``.`` or ``..``
    segments): the listing falls back to fsspec, which reports them as refused."""


_used_in: int | None = None
"""The process in which obstore's runtime was first used (None: not yet)."""


_forked_away: list[Any] = []
"""What a forked child keeps but never uses: the parent's clients."""


@reset_after_fork
def _forget_after_fork() -> None:
    global _lock, _stores
    _lock = threading.Lock()  # a lock held by another thread at fork stays held
    # The parent's clients are set aside, never freed: an obstore client's
    # Rust drop can block for good in the child on a lock of the runtime left
    # in the parent (a forked worker hung in `_stores.clear()` once).
    _forked_away.append(_stores)
    _stores = {}


def usable() -> bool:
    """Whether obstore can run in this process: not in a child forked after
    obstore was used (its runtime's threads stayed in the parent)."""
    return _used_in is None or _used_in == os.getpid()


def forks_fall_back() -> bool:
    """Whether a process forked from this one now would read through fsspec:
    obstore was used here (or before the fork that made this process). A
    process started fresh (``forkserver``, ``spawn``) would not."""
    return _used_in is not None


def keep_clean(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` without starting obstore's runtime in this process: in a
    short-lived forked child while obstore is unused here, so that processes
    forked from this one later (DataLoader workers) can still use it
    (:mod:`ucstage.aside`); directly once it is used here anyway."""
    if _used_in is not None or not hasattr(os, "fork"):  # no fork, no forked workers
        return fn(*args)
    from ..aside import aside

    return aside(_claimed, fn, *args)


def run_here() -> None:
    """Start obstore's runtime in this process for its metadata calls too
    (resolving, listing, footers), instead of in a child per call
    (:func:`keep_clean`): for a process that reads the store through obstore
    itself and forks no DataLoader workers (``ucstage cache warm``), each
    child only adds a fork, a second client and fresh connections before the
    first GET. A process where obstore cannot run (:func:`usable`) is left as it is."""
    global _used_in
    if _used_in is None:
        _used_in = os.getpid()


def _claimed(fn: Callable[..., T], *args: Any) -> T:
    global _used_in
    _used_in = os.getpid()  # this child uses obstore: it does not go aside again
    return fn(*args)


def _installed() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def reads(fs: Any) -> bool:
    """Whether obstore reads the store behind ``fs`` (a volume's filesystem)
    in this process; :func:`ucstage.engines.engine.of` picks the engine by it.

    Raises:
        InvalidArgument: ``$UCSTAGE_ENGINE`` has an unknown value.
        MissingDependency: ``UCSTAGE_ENGINE=obstore`` for a store obstore
            serves, but obstore is not installed.
    """
    if not usable():
        return False
    if isinstance(fs, ObjectFS):
        return fs.kind == "s3" or _wanted(fs.kind)
    protocol = fs.protocol
    kind = _KINDS.get(str(protocol[0] if isinstance(protocol, (tuple, list)) else protocol))
    return kind is not None and _wanted(kind)


class OnStore(Protocol):
    """What the store functions read of a volume: its file system (a
    :class:`ucstage.volumes.Volume`'s; an :class:`ObjectFS` is one too, its
    ``fs`` being itself). A Protocol: :mod:`ucstage.volumes` imports this module."""

    @property
    def fs(self) -> Any: ...


class StoreVolume(OnStore, Protocol):
    """A :class:`ucstage.volumes.Volume` on a store, as :func:`delta_location` reads it."""

    @property
    def root(self) -> str: ...


def location(volume: OnStore, path: str) -> tuple[str, str, str]:
    """``(kind, bucket, key)`` of an fsspec path inside ``volume``'s filesystem
    (``bucket/key``, as s3fs, gcsfs and adlfs spell paths); ``volume`` may be
    an :class:`ObjectFS` itself (its ``fs`` is itself)."""
    fs = volume.fs
    if isinstance(fs, ObjectFS):
        kind = fs.kind
    else:
        protocol = fs.protocol
        kind = _KINDS[str(protocol[0] if isinstance(protocol, (tuple, list)) else protocol)]
    bucket, _, key = path.strip("/").partition("/")
    return kind, bucket, key


def store(kind: str, bucket: str, deadline: float | None = None) -> Any:
    """This process's obstore client for one bucket (container), built on first
    use from the standard environment; its timeout backs up ``deadline``
    (seconds per request, default :func:`deadline`)."""
    # Keyed by the variables read too, so a process that changes them (a
    # test, a notebook) gets a client that follows.
    global _used_in
    if _used_in is None:
        _used_in = os.getpid()
    limit = _deadline() if deadline is None else deadline
    key = (os.getpid(), kind, bucket, limit,
           *(os.environ.get(name, "") for name in _ENV[kind]),
           *(os.environ.get(_PREFIX[kind] + name.upper(), "") for name in _CLIENT_KEYS))
    client = _stores.get(key)
    if client is None:
        with _lock:
            client = _stores.get(key)
            if client is None:
                client = _stores[key] = _build(kind, bucket, limit)
    return client


def _retry() -> Any:
    # No retries inside object_store: the cache's one retry rule (backoff with
    # jitter, throttling included, ``LocalCache(retries=, backoff=)``) applies
    # to both engines, and a stopping warm does not wait out Rust's backoff.
    from datetime import timedelta

    return {"max_retries": 0, "retry_timeout": timedelta(seconds=30)}


DEADLINE_ENV = "UCSTAGE_REQUEST_DEADLINE"
DEFAULT_DEADLINE = 30.0
"""Seconds one GET may take at most by default (``object_store``'s own default)."""


def deadline() -> float:
    """Seconds one request may take at most: ``$UCSTAGE_REQUEST_DEADLINE``,
    else :data:`DEFAULT_DEADLINE`. The engine drops a request at it
    (:mod:`ucstage.engines.objget`); the client's own timeout is a little later.

    Raises:
        InvalidArgument: the variable is not a positive, finite number.
    """
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEFAULT_DEADLINE
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):  # nan and inf too: inf overflowed the client's timeout
        raise InvalidArgument(f"{DEADLINE_ENV}={raw!r} is not a positive, finite number of "
                              "seconds",
                              hint="set it to e.g. 30, or unset it")
    return value


_deadline = deadline  # the default, under a name a parameter does not shadow

_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "connect_timeout",
                "default_content_type", "http1_only", "http2_only", "http2_keep_alive_interval",
                "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http2_max_frame_size",
                "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate",
                "proxy_excludes", "randomize_addresses", "timeout", "user_agent")
_PREFIX = {"s3": "AWS_", "gs": "GOOGLE_", "az": "AZURE_"}


def _client_options(kind: str, endpoint: str, limit: float) -> Any:
    """The client options obstore would read from the environment
    (``AWS_ALLOW_HTTP``, ``AZURE_ALLOW_HTTP``, ``GOOGLE_TIMEOUT``...), with
    ucstage's added where the user set none: an explicit ``client_options``
    replaces what obstore reads, so ucstage must pass them on itself."""
    from datetime import timedelta

    options: dict[str, Any] = {}
    for name in _CLIENT_KEYS:
        value = os.environ.get(_PREFIX[kind] + name.upper())
        if value is not None and value.strip():
            options[name] = value.strip()
    # A backstop only: the engine's own deadline ends a request first, with
    # a clear error (obstore's default overall timeout is 30 s too).
    options.setdefault("timeout", timedelta(seconds=limit + 5))
    if endpoint.startswith("http://"):
        options.setdefault("allow_http", True)
    return options


def _build(kind: str, bucket: str, limit: float) -> Any:
    from obstore.store import AzureStore, GCSStore, S3Store

    env = os.environ
    if kind == "s3":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
        kwargs: dict[str, Any] = {}
        if endpoint:
            kwargs["endpoint"] = endpoint
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        provider = None
        if not env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_PROFILE"):
            provider = _profile_provider(env["AWS_PROFILE"])
        elif not env.get("AWS_ACCESS_KEY_ID") and not env.get("AWS_SECRET_ACCESS_KEY") \
                and _only_credentials_file(bucket):
            provider = _profile_provider("default")
        elif env.get("AWS_ACCESS_KEY_ID") and not env.get("AWS_SECRET_ACCESS_KEY"):
            raise _missing("s3", bucket, "AWS_SECRET_ACCESS_KEY is not set "
                                         "(AWS_ACCESS_KEY_ID is)")
        return S3Store(bucket, client_options=_client_options("s3", endpoint, limit),
                       retry_config=_retry(), credential_provider=provider, **kwargs)
    if kind == "gs":
        endpoint = env.get("STORAGE_EMULATOR_HOST", "")
        kwargs = {}
        if endpoint:
            endpoint = endpoint if "://" in endpoint else "http://" + endpoint
            kwargs["base_url"] = endpoint
            kwargs["skip_signature"] = True
        return GCSStore(bucket, client_options=_client_options("gs", endpoint, limit),
                        retry_config=_retry(), **kwargs)
    # The account of a URL that names it (container@account) wins over the
    # environment's, as in Spark's abfss:// form.
    container, account = cloudfs.split_account(bucket)
    account = account or env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT") or ""
    emulator = env.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true")
    if not account and not emulator:
        raise _missing("az", bucket, "AZURE_STORAGE_ACCOUNT_NAME is not set")
    kwargs = {"account_name": account} if account else {}
    key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or env.get("AZURE_STORAGE_KEY")
    if key:
        kwargs["account_key"] = key
    # obstore reads AZURE_STORAGE_ENDPOINT itself; plain http there needs
    # AZURE_ALLOW_HTTP, as with obstore alone (merged by _client_options).
    return AzureStore(container,
                      client_options=_client_options("az", "http://" if emulator else "", limit),
                      retry_config=_retry(), **kwargs)


def delta_location(volume: StoreVolume) -> tuple[str, dict[str, str]]:
    """The URL and ``storage_options`` deltalake opens the Delta table at
    ``volume`` (an ``s3``, ``gs`` or ``az`` volume, any URL form) with: the
    store, endpoint and credentials the engines read (:func:`_build`, and
    :func:`ucstage.cloudfs.azure_settings` for adlfs), as deltalake's keys,
    so one environment serves the log and the data files alike.

    Raises:
        KeyError: ``volume`` is on no store of these three.
        SourceUnreadable: S3 credentials half set (as the engine refuses them).
    """
    kind, bucket, key = location(volume, volume.root)
    env = os.environ
    options: dict[str, str] = {}
    endpoint = ""
    if kind == "s3":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or ""
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        if endpoint:
            options["aws_endpoint_url"] = endpoint
        if region:
            options["aws_region"] = region
        if env.get("AWS_ACCESS_KEY_ID"):
            if not env.get("AWS_SECRET_ACCESS_KEY"):
                raise _missing("s3", bucket, "AWS_SECRET_ACCESS_KEY is not set "
                                             "(AWS_ACCESS_KEY_ID is)")
            options["aws_access_key_id"] = env["AWS_ACCESS_KEY_ID"]
            options["aws_secret_access_key"] = env["AWS_SECRET_ACCESS_KEY"]
            if env.get("AWS_SESSION_TOKEN"):
                options["aws_session_token"] = env["AWS_SESSION_TOKEN"]
        elif env.get("AWS_PROFILE"):
            options["aws_profile"] = env["AWS_PROFILE"]
        if env.get("AWS_SKIP_SIGNATURE"):
            options["aws_skip_signature"] = env["AWS_SKIP_SIGNATURE"]
        url = f"s3://{bucket}/{key}"
    elif kind == "gs":
        emulator = env.get("STORAGE_EMULATOR_HOST", "")
        if emulator:
            # object_store reaches an emulator through a service-account
            # key naming its URL, unsigned (obstore's base_url does the same).
            endpoint = emulator if "://" in emulator else "http://" + emulator
            options["google_service_account_key"] = json.dumps(
                {"gcs_base_url": endpoint.rstrip("/"), "disable_oauth": True,
                 "client_email": "", "private_key": "", "private_key_id": ""})
        elif env.get("GOOGLE_SERVICE_ACCOUNT_KEY"):
            options["google_service_account_key"] = env["GOOGLE_SERVICE_ACCOUNT_KEY"]
        elif env.get("GOOGLE_SERVICE_ACCOUNT") or env.get("GOOGLE_SERVICE_ACCOUNT_PATH"):
            options["google_service_account"] = env.get("GOOGLE_SERVICE_ACCOUNT") or \
                env["GOOGLE_SERVICE_ACCOUNT_PATH"]
        elif env.get("GOOGLE_APPLICATION_CREDENTIALS"):
            options["google_application_credentials"] = env["GOOGLE_APPLICATION_CREDENTIALS"]
        url = f"gs://{bucket}/{key}"
    else:
        container, account = cloudfs.split_account(bucket)
        found = cloudfs.azure_settings(account)
        endpoint = found["endpoint"]
        for name, value in (("azure_storage_account_name", found["name"]),
                            ("azure_storage_account_key", found["key"]),
                            ("azure_storage_endpoint", endpoint),
                            ("azure_storage_sas_token", found["sas"])):
            if value:
                options[name] = value
        url = f"az://{container}/{key}"
    for name in _CLIENT_KEYS:  # AWS_ALLOW_HTTP, GOOGLE_TIMEOUT...: as obstore reads them
        value = env.get(_PREFIX[kind] + name.upper(), "").strip()
        if value:
            options[name] = value
    if endpoint.startswith("http://"):
        options.setdefault("allow_http", "true")
    return url.rstrip("/"), options


def _only_credentials_file(bucket: str) -> bool:
    """Whether the only S3 credentials around are a shared credentials file
    (which object_store does not read, so boto3 reads it for it)."""
    env = os.environ
    if any(env.get(k) for k in ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                "AWS_CONTAINER_CREDENTIALS_FULL_URI")):
        return False
    if env.get("AWS_SKIP_SIGNATURE", "").lower() in ("1", "true"):
        return False
    path = env.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials")
    if os.path.exists(path):
        return True  # read through boto3, as s3fs users expect
    if env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true":
        raise _missing("s3", bucket, "no credentials: set AWS_ACCESS_KEY_ID and "
                                 "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or "
                                 "AWS_WEB_IDENTITY_TOKEN_FILE (instance metadata is "
                                 "disabled by AWS_EC2_METADATA_DISABLED)")
    return False  # instance metadata, as on EC2


def _profile_provider(profile: str) -> Any:
    """Credentials of an AWS profile (``~/.aws/config``/``credentials``),
    which object_store does not read itself, through boto3."""
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        raise MissingDependency(
            f"AWS_PROFILE={profile} needs boto3 to read the profile",
            hint="pip install boto3, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                 "or UCSTAGE_ENGINE=fsspec") from exc
    try:
        session = boto3.Session(profile_name=profile)
        return Boto3CredentialProvider(session)
    except Exception as exc:
        raise _missing("s3", "", f"AWS profile {profile!r}: {exc}") from exc


def _missing(kind: str, bucket: str, what: str) -> SourceUnreadable:
    names = {"s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL",
             "gs": "GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT, "
                   "STORAGE_EMULATOR_HOST",
             "az": "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, "
                   "AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_USE_EMULATOR"}[kind]
    error = SourceUnreadable(f"cannot read {kind}://{bucket}: {what}",
                             hint=f"set the store's variables ({names}), "
                                  f"or UCSTAGE_ENGINE=fsspec to use fsspec's configuration")
    error.what = what  # type: ignore[attr-defined]
    return error


def _etag(value: Any) -> str:
    return str(value).strip('"') if value else ""


def concise(exc: BaseException, path: str = "") -> BaseException:
    """One of obstore's errors as the one-line ``OSError`` the rest of ucstage
    knows: ``FileNotFoundError`` for 404, ``PermissionError`` for 401/403 (not
    retried), else ``OSError`` (retried). Other exceptions pass unchanged.

    obstore's messages run to dozens of lines (a Rust debug dump); this keeps
    the first line, with the store's own error code and message when the
    response carried them."""
    try:
        from obstore.exceptions import (
            BaseError,
            NotFoundError,
            PermissionDeniedError,
            UnauthenticatedError,
        )
    except ImportError:  # pragma: no cover
        return exc
    if not isinstance(exc, BaseError):
        return exc
    text = str(exc).split("\n\nDebug source:", 1)[0]
    status = re.search(r"status code: (\d{3})", text)
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    line = re.sub(r"\s+", " ", text.split("<?xml", 1)[0]).strip().rstrip(":")
    if code or message:
        line = f"{line}: {code.group(1) if code else ''} {message.group(1) if message else ''}"
    line = line.strip()
    if isinstance(exc, NotFoundError) or (status and status.group(1) == "404"):
        return FileNotFoundError(2, line, path) if path else FileNotFoundError(line)
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or \
            (status and status.group(1) in ("401", "403")):
        return PermissionError(line)
    return OSError(line)


def list_objects(volume: OnStore, root: str) -> dict[str, dict[str, Any]]:
    """Every object under ``root`` (an fsspec path, ``bucket/prefix``), as
    fsspec's ``find(detail=True)`` gives them: full path -> info with
    ``size``, ``ETag`` and ``LastModified``.

    Raises:
        Unparsable: a key has ``.`` or ``..`` segments (list with fsspec).
        Exception: obstore's, for the store or the credentials.
    """
    kind, bucket, prefix = location(volume, root)
    fs = volume.fs
    if kind in ("gs", "az"):
        return _cloud_find(fs if isinstance(fs, ObjectFS) else ObjectFS(kind), root)
    head = fs.take_listed(bucket, prefix) if isinstance(fs, ObjectFS) else None
    if head is not None and head[1] is None:
        return head[0]  # resolving the source just listed all of it
    return keep_clean(_list_all, kind, bucket, prefix, head)


Head = tuple[dict[str, dict[str, Any]], str | None]
"""The start of a prefix's listing that resolving it read (:meth:`ObjectFS.info`):
the objects of its first pages, and the key to go on listing after (None:
that was all of them)."""


def _list_all(kind: str, bucket: str, prefix: str,
              head: Head | None = None) -> dict[str, dict[str, Any]]:
    import obstore
    from obstore.exceptions import InvalidPathError

    client = store(kind, bucket)
    found: dict[str, dict[str, Any]] = dict(head[0]) if head is not None else {}
    # The pages resolving read are not asked for again: the listing goes on
    # after their last key (S3 lists keys in order; ``start-after``).
    after = head[1] if head is not None else None
    try:
        for batch in obstore.list(client, prefix or None, offset=after, chunk_size=_PAGE):
            _add(found, bucket, batch)
    except InvalidPathError as exc:
        raise Unparsable(str(exc)) from exc
    except Exception as exc:
        raise concise(exc) from exc
    return found


_PAGE = 1000
"""Keys per listing request (S3's most)."""
_LISTED_FOR = 10.0
"""Seconds a listing made while resolving a source serves the walk that follows."""


def _add(found: dict[str, dict[str, Any]], bucket: str, batch: Any) -> None:
    for meta in batch:
        name = f"{bucket}/{meta['path']}"
        found[name] = {"name": name, "type": "file", "size": meta["size"],
                       "ETag": _etag(meta["e_tag"]), "LastModified": meta["last_modified"]}


def _first_page(client: Any, bucket: str, key: str) -> tuple[bool, Head | None]:
    """Whether any object is below ``key``, and the start of its listing
    (:data:`Head`; None when a key cannot be parsed)."""
    import obstore
    from obstore.exceptions import InvalidPathError

    try:
        pages = iter(obstore.list(client, key or None, chunk_size=_PAGE))
        batch = next(pages, None)
        if batch is None:
            return False, None
        found: dict[str, Any] = {}
        _add(found, bucket, batch)
        # A batch short of a page is the last one. After a full one, one more
        # page is read (a request) and kept too: the walk that follows lists
        # on after it, never asking for a page twice.
        if len(batch) < _PAGE:
            return True, (found, None)
        more = next(pages, None)
        if more is None:
            return True, (found, None)
        _add(found, bucket, more)
        if len(more) < _PAGE:
            return True, (found, None)
        return True, (found, max(str(meta["path"]) for meta in more))
    except InvalidPathError:
        return True, None  # a key object_store cannot parse: it holds something


_executor: tuple[int, Any] | None = None


def _pool() -> Any:
    """A small thread pool of this process for requests asked side by side."""
    global _executor
    if _executor is None or _executor[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _executor = (os.getpid(), ThreadPoolExecutor(2, thread_name_prefix="ucstage-objstore"))
    return _executor[1]


def mtime_ns(value: datetime | None) -> int | None:
    """A listing's or response's ``last_modified`` in nanoseconds."""
    return int(value.timestamp() * 1e9) if value is not None else None


def serves(url: str) -> bool:
    """Whether ``url`` (``s3://...``) is read through obstore: a protocol it
    serves, obstore installed, and ``$UCSTAGE_ENGINE`` not ``fsspec``."""
    protocol = url.split("://", 1)[0].lower()
    parsed = cloudfs.parse(url)
    kind = parsed[1] if parsed else _KINDS.get(protocol)
    return kind is not None and usable() and _wanted(kind)


def _cloud_find(fs: ObjectFS, path: str) -> dict[str, dict[str, Any]]:
    """GCS and Azure listings through gcsfs/adlfs (the JSON API, List Blobs),
    which carry the generation and the stored checksums obstore drops; each
    entry's ``ETag`` is :func:`ucstage.cloudfs.version`."""
    backend, inner, _container, account = fs._cloud(path)
    try:
        found = backend.find(inner, withdirs=False, detail=True)
    except FileNotFoundError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, info in found.items():
        if info.get("type") == "directory":
            continue
        out[fs._outer(name, account)] = _cloud_info(fs, info, account)
    return out


def _cloud_info(fs: ObjectFS, info: dict[str, Any], account: str) -> dict[str, Any]:
    name = fs._outer(str(info["name"]), account)
    if info.get("type") == "directory":
        return {"name": name, "type": "directory", "size": 0}
    modified = info.get("updated") or info.get("last_modified")
    return {"name": name, "type": "file", "size": int(info["size"]),
            "ETag": cloudfs.version(info), "LastModified": modified}


def _wanted(kind: str) -> bool:
    """Whether ``$UCSTAGE_ENGINE`` and the installation choose obstore for a
    store of ``kind`` (the variable's one reading)."""
    choice = os.environ.get(ENGINE_ENV, "").strip().lower() or "auto"
    if choice not in ENGINES:
        raise InvalidArgument(f"{ENGINE_ENV}={choice!r} is not an engine",
                              hint=f"set it to one of {', '.join(ENGINES)}, or unset it")
    if choice == "fsspec":
        return False
    if _installed():
        return True
    if choice == "obstore":
        raise MissingDependency(f"{ENGINE_ENV}=obstore but obstore is not installed",
                                hint=f"pip install '{_EXTRA[kind]}'")
    return False


class ObjectFS:
    """The part of an fsspec filesystem a :class:`ucstage.volumes.Volume` of
    an object store needs, served by obstore: ``info``, ``open``, ``find`` and
    the URL spelling. Building it imports neither fsspec's backend (s3fs and
    botocore take most of a second to import) nor opens a connection; anything
    else is delegated to the fsspec backend, created on first use."""

    def __init__(self, protocol: str, kind: str = "") -> None:
        self.protocol = protocol
        self.kind = kind or _KINDS[protocol]
        """The store: ``s3``, ``gs`` or ``az`` (``https`` URLs name it by their host)."""
        self._fsspec: Any = None
        self._backends: dict[tuple[int, str], Any] = {}
        self._listed: tuple[str, str, float, Head] | None = None
        """The start of a prefix's listing that :meth:`info` read (bucket,
        key, when, :data:`Head`), for the walk that follows (:func:`list_objects`)."""

    def take_listed(self, bucket: str, key: str) -> Head | None:
        """The start of the listing of ``bucket/key`` that :meth:`info` read
        in the last :data:`_LISTED_FOR` seconds, once; else None."""
        listed, self._listed = self._listed, None
        if listed is None or listed[:2] != (bucket, key) or \
                time.monotonic() - listed[2] >= _LISTED_FOR:
            return None
        return dict(listed[3][0]), listed[3][1]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectFS) and (other.protocol, other.kind) == \
            (self.protocol, self.kind)

    def __hash__(self) -> int:
        return hash((ObjectFS, self.protocol, self.kind))

    def __reduce__(self) -> tuple[Any, ...]:
        # Clients are per process: rebuilt after pickling.
        return (ObjectFS, (self.protocol, self.kind))

    def unstrip_protocol(self, path: str) -> str:
        if self.kind in ("gs", "az"):
            return cloudfs.unparse(self.protocol, self.kind, path)
        return f"{self.protocol}://{path.lstrip('/')}"

    def _cloud(self, path: str) -> tuple[Any, str, str, str]:
        """(gcsfs/adlfs filesystem, its path, container, account) of a GCS or
        Azure path (``container@account/key``: the account goes to the filesystem)."""
        first, slash, rest = path.strip("/").partition("/")
        container, account = cloudfs.split_account(first)
        # Per process: an fsspec async filesystem refuses to run in a forked child.
        backend = self._backends.get((os.getpid(), account))
        if backend is None:
            try:
                backend = cloudfs.filesystem(self.kind, account)
            except cloudfs.NoCredentials as exc:
                error = _missing(self.kind, container, f"no credentials are set ({exc})")
                error.message = f"cannot read {self.unstrip_protocol(path)}: " \
                                f"no credentials are set ({exc})"
                raise error from None
            self._backends[(os.getpid(), account)] = backend
        return backend, f"{container}{slash}{rest}", container, account

    @staticmethod
    def _outer(name: str, account: str) -> str:
        """A gcsfs/adlfs name as this filesystem's path (the account put back)."""
        if not account:
            return name.strip("/")
        container, slash, rest = name.strip("/").partition("/")
        return f"{container}@{account}{slash}{rest}"

    def invalidate_cache(self, path: str | None = None) -> None:
        """Nothing is cached here; the fsspec backend's cache if it was used."""
        if self._fsspec is not None:
            self._fsspec.invalidate_cache(path)

    def _store(self, path: str) -> tuple[Any, str, str]:
        kind = self.kind
        bucket, _, key = path.strip("/").partition("/")
        try:
            return store(kind, bucket), bucket, key
        except SourceUnreadable as exc:  # name the whole location, not just the bucket
            what = getattr(exc, "what", exc.message)
            raise SourceUnreadable(f"cannot read {self.unstrip_protocol(path)}: {what}",
                                   hint=exc.hint) from None

    def info(self, path: str) -> dict[str, Any]:
        """fsspec's ``info``: a file's size and ETag, or ``type: directory``
        for a bucket or a prefix that holds objects.

        Raises:
            FileNotFoundError: no object and no object under it.
        """
        if self.kind in ("gs", "az"):
            return self._cloud_info(path)
        if not usable():
            return dict(self.fsspec().info(path))
        found, listed = keep_clean(self._info, path)
        if listed is not None:
            self._listed = (listed[0], listed[1], time.monotonic(), listed[2])
        return found

    def _info(self, path: str) -> tuple[dict[str, Any], tuple[str, str, Head] | None]:
        """:meth:`info`, and the start of the prefix's listing (:data:`Head`)."""
        import obstore

        client, bucket, key = self._store(path)
        name = f"{bucket}/{key}".rstrip("/")
        # A source is a file or a prefix: ask both at once (one round trip
        # instead of two for a folder, the usual source). The prefix's first
        # pages are kept: the walk that follows resolving starts from them
        # instead of asking again.
        below = _pool().submit(_first_page, client, bucket, key)
        if key:
            try:
                meta = obstore.head(client, key)
            except FileNotFoundError:
                pass
            except Exception as exc:
                below.cancel()
                raise concise(exc, path) from exc
            else:
                below.cancel()
                return {"name": name, "type": "file", "size": meta["size"],
                        "ETag": _etag(meta["e_tag"]),
                        "LastModified": meta["last_modified"]}, None
        try:
            holds, listed = below.result()
        except Exception as exc:
            raise concise(exc, path) from exc
        if key and not holds:
            raise FileNotFoundError(2, "No such object or prefix", self.unstrip_protocol(path))
        return ({"name": name, "type": "directory", "size": 0},
                None if listed is None else (bucket, key, listed))

    def _cloud_info(self, path: str) -> dict[str, Any]:
        backend, inner, _container, account = self._cloud(path)
        try:
            info = backend.info(inner)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise self._refused(path, exc) from exc
        return _cloud_info(self, info, account)

    def _refused(self, path: str, exc: BaseException) -> BaseException:
        """A GCS/Azure error as ucstage's: credentials missing named by their variables."""
        if isinstance(exc, (PermissionError, OSError, ValueError)) or "401" in str(exc) \
                or "403" in str(exc) or "credential" in str(exc).lower():
            names = _ENV[self.kind]
            if not any(os.environ.get(name) for name in names):
                what = f"no credentials or emulator are set ({type(exc).__name__}: " \
                       f"{str(exc).splitlines()[0][:200] if str(exc) else ''})"
                error = _missing(self.kind, path.split("/", 1)[0], what)
                error.message = f"cannot read {self.unstrip_protocol(path)}: {what}"
                return error
        return exc

    def open(self, path: str, mode: str = "rb") -> Any:
        """A file-like reader of one object (binary reads only)."""
        import obstore

        if mode != "rb":
            raise ValueError(f"mode must be 'rb', got {mode!r}")
        if self.kind in ("gs", "az") and not reads(self):
            backend, inner, _, _ = self._cloud(path)
            return backend.open(inner, mode)
        if not usable():
            return self.fsspec().open(path, mode)
        client, _, key = self._store(path)
        try:
            return _Reader(obstore.open_reader(client, key))
        except Exception as exc:
            raise concise(exc, path) from exc

    def find(self, path: str, withdirs: bool = False, detail: bool = True) -> Any:
        """Every object under ``path``; through fsspec when obstore cannot
        parse a key (so its refusal is reported)."""
        try:
            if self.kind in ("gs", "az"):
                found = _cloud_find(self, path)
                return found if detail else sorted(found)
            if not usable():
                raise Unparsable("obstore cannot run in a forked child")
            found = list_objects(self, path)
        except Unparsable:
            found = self.fsspec().find(path, withdirs=False, detail=True)
        return found if detail else sorted(found)

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> Any:
        """fsspec's ``cat_file`` (ranged reads of the fsspec engine), the
        account of a GCS or Azure path given to its backend."""
        if self.kind in ("gs", "az"):
            backend, inner, _, _ = self._cloud(path)
            return backend.cat_file(inner, start=start, end=end)
        if start is None and end is None and usable():
            # A whole small object (a pack's index, an export's record): one GET
            # on obstore, not s3fs's import (a second of start-up) and its HEAD.
            return keep_clean(self._get, path)
        return self.fsspec().cat_file(path, start=start, end=end)

    def _get(self, path: str) -> bytes:
        import obstore

        client, _, key = self._store(path)
        try:
            return bytes(obstore.get(client, key).bytes())
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise concise(exc, path) from exc

    @property
    def is_local(self) -> bool:
        return False  # so that list_objects can take this object as its volume

    @property
    def fs(self) -> ObjectFS:
        return self

    def fsspec(self) -> Any:
        """The fsspec backend of this protocol (s3fs, gcsfs, adlfs)."""
        if self._fsspec is None:
            if self.kind in ("gs", "az"):
                self._fsspec = cloudfs.filesystem(self.kind)  # the engine's settings
            else:
                import fsspec

                self._fsspec = fsspec.filesystem(self.protocol)
        return self._fsspec

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.fsspec(), name)


class _Reader:
    """obstore's reader as a context manager, like an fsspec file."""

    def __init__(self, reader: ReadableFile) -> None:
        self._reader = reader

    def __enter__(self) -> ReadableFile:
        return self._reader

    def __exit__(self, *exc: object) -> None:
        self._reader.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)
