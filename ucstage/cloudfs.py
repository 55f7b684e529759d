"""GCS and Azure beyond what obstore gives: the URL forms users paste, the
fsspec backends (gcsfs, adlfs) configured from the same variables as the
engine, and listings that carry each object's stored checksum.

obstore (0.12.1) parses ``gs://bucket`` and ``az://container`` but reports
neither the checksum a store keeps (GCS ``md5Hash``/``crc32c``, Azure
``Content-MD5``) nor, in a GCS listing, the object's ``generation``. So both
engines list GCS through the JSON API and Azure through List Blobs, by gcsfs
and adlfs (which also authenticate as their users expect), and both build an
entry's version from that listing with :func:`version`:

* GCS: ``<generation>`` (stable, and the same whichever API or engine asks;
  the JSON ``etag`` and the XML ``ETag`` differ on real GCS), then
  ``;md5=<hex>`` from ``md5Hash``, or ``;crc32c=<hex>`` when the object has
  no MD5 (a composite object);
* Azure: ``<ETag>``, then ``;md5=<hex>`` when the blob has a ``Content-MD5``.

The checksum thus travels with the entry (manifests, workers, stamps), and a
copy checks its bytes against it (:mod:`ucstage.engines.checks`).

Settings: the obstore engine reads the standard variables; so do the fsspec
backends built here (:func:`filesystem`): ``STORAGE_EMULATOR_HOST`` for
gcsfs; ``AZURE_STORAGE_USE_EMULATOR`` (with ``AZURITE_BLOB_STORAGE_URL``),
``AZURE_STORAGE_ACCOUNT_NAME``/``_KEY``, ``AZURE_STORAGE_SAS_TOKEN`` and
``AZURE_STORAGE_ENDPOINT`` for adlfs.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from typing import Any

from .errors import MissingDependency

__all__ = ["EMULATOR_ACCOUNT", "EMULATOR_KEY", "NoCredentials", "azure_settings", "blob_service",
           "filesystem", "hex_of", "marker", "parse", "sums", "version"]

EMULATOR_ACCOUNT = "devstoreaccount1"
EMULATOR_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                "KBHBeksoGMGw==")
"""Azurite's published development account and key (not a secret)."""

_AZ_HOST = re.compile(r"^([a-z0-9]{3,24})\.(?:blob|dfs)\.core\.windows\.net$")
_GCS_HOSTS = ("storage.googleapis.com", "storage.cloud.google.com")


def parse(url: str) -> tuple[str, str, str] | None:
    """``(protocol, kind, root)`` of a GCS or Azure URL in any form users
    paste, the account (Azure) kept in the root's first segment as
    ``container@account``; None for any other URL.

    ``abfss://container@account.dfs.core.windows.net/path`` (Spark's and the
    platform's form), ``abfs://``, ``az://container/path``, ``adl://``,
    ``https://ACCOUNT.blob.core.windows.net/container/path``, ``gs://``,
    ``gcs://``, ``https://storage.googleapis.com/bucket/path``."""
    protocol, sep, rest = url.partition("://")
    protocol = protocol.lower()
    if not sep:
        return None
    if protocol in ("gs", "gcs"):
        return protocol, "gs", rest
    if protocol in ("az", "abfs", "abfss", "adl", "azure"):
        first, slash, path = rest.partition("/")
        container, at, host = first.partition("@")
        if at:
            match = _AZ_HOST.match(host.lower())
            account = match.group(1) if match else host.split(".", 1)[0]
            return protocol, "az", f"{container}@{account}{slash}{path}"
        return protocol, "az", rest
    if protocol in ("https", "http"):
        host, slash, path = rest.partition("/")
        if host.lower() in _GCS_HOSTS:
            return "https", "gs", path
        match = _AZ_HOST.match(host.lower())
        if match:
            container, slash2, key = path.partition("/")
            return "https", "az", f"{container}@{match.group(1)}{slash2}{key}"
    return None


def unparse(protocol: str, kind: str, path: str) -> str:
    """The URL of ``path`` (``bucket/key``, ``container@account/key``) in
    the form it was given (:func:`parse`'s inverse)."""
    first, slash, rest = path.lstrip("/").partition("/")
    container, at, account = first.partition("@")
    if protocol == "https":
        if kind == "gs":
            return f"https://storage.googleapis.com/{path.lstrip('/')}"
        return f"https://{account}.blob.core.windows.net/{container}{slash}{rest}"
    if at:
        return f"{protocol}://{container}@{account}.dfs.core.windows.net{slash}{rest}"
    return f"{protocol}://{path.lstrip('/')}"


def split_account(bucket: str) -> tuple[str, str]:
    """``(container, account)`` of a bucket segment (account '' when not given)."""
    container, _, account = bucket.partition("@")
    return container, account


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def azure_settings(account: str = "") -> dict[str, str]:
    """The Azure account, key, blob endpoint and SAS token the engines use,
    from the standard variables (the one reading of them: adlfs's options,
    :func:`azure_options`, and deltalake's, :func:`ucstage.engines.objstore.delta_location`).
    The emulator (``AZURE_STORAGE_USE_EMULATOR``) gets Azurite's account,
    key and endpoint unless they are set."""
    env = os.environ
    name = account or env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT", "")
    key = env.get("AZURE_STORAGE_ACCOUNT_KEY") or env.get("AZURE_STORAGE_KEY", "")
    endpoint = env.get("AZURE_STORAGE_ENDPOINT", "")
    if _truthy("AZURE_STORAGE_USE_EMULATOR"):
        base = env.get("AZURITE_BLOB_STORAGE_URL", "http://127.0.0.1:10000").rstrip("/")
        name = name or EMULATOR_ACCOUNT
        key = key or EMULATOR_KEY
        endpoint = endpoint or f"{base}/{name}"
    sas = env.get("AZURE_STORAGE_SAS_TOKEN") or env.get("AZURE_STORAGE_SAS_KEY", "")
    return {"name": name, "key": key, "endpoint": endpoint, "sas": sas}


def azure_options(account: str = "") -> dict[str, Any]:
    """adlfs's keyword arguments from the variables the obstore engine reads."""
    found = azure_settings(account)
    name, key, endpoint, sas = found["name"], found["key"], found["endpoint"], found["sas"]
    if endpoint and key:
        scheme = endpoint.split("://", 1)[0]
        return {"connection_string": f"DefaultEndpointsProtocol={scheme};AccountName={name};"
                                     f"AccountKey={key};BlobEndpoint={endpoint};"}
    options: dict[str, Any] = {"account_name": name} if name else {}
    if key:
        options["account_key"] = key
    if sas:
        options["sas_token"] = sas
    if not key and not sas:
        options["anon"] = False  # DefaultAzureCredential: managed identity, az login, ...
    return options


def blob_service(account: str = "", *, aio: bool = True, **config: Any) -> Any:
    """A ``BlobServiceClient`` (azure-storage-blob, which adlfs uses),
    async unless ``aio`` is false, authenticated as :func:`azure_options`
    says adlfs is, for requests that need headers obstore does not pass and
    checks adlfs does not make (:mod:`ucstage.engines.azranges`). ``config``:
    the SDK's client settings (retries, timeouts, sizes).

    Raises:
        MissingDependency: adlfs (with the SDK) is not installed.
    """
    try:
        if aio:
            from azure.storage.blob.aio import BlobServiceClient
        else:
            from azure.storage.blob import BlobServiceClient  # type: ignore[assignment]
    except ImportError as exc:
        raise MissingDependency("az:// needs adlfs (with azure-storage-blob) to read blobs "
                                "with their checksums", hint="pip install 'ucstage[azure]'") from exc
    options = azure_options(account)
    if "connection_string" in options:
        return BlobServiceClient.from_connection_string(options["connection_string"], **config)
    name = options.get("account_name", "")
    url = f"https://{name}.blob.core.windows.net"
    credential: Any
    if "account_key" in options:
        credential = {"account_name": name, "account_key": options["account_key"]}
    elif "sas_token" in options:
        credential = options["sas_token"]
    elif aio:
        from azure.identity.aio import DefaultAzureCredential

        credential = DefaultAzureCredential()
    else:
        from azure.identity import DefaultAzureCredential as SyncCredential

        credential = SyncCredential()
    return BlobServiceClient(url, credential=credential, **config)


def filesystem(kind: str, account: str = "") -> Any:
    """A fresh gcsfs or adlfs filesystem from the standard variables.

    Raises:
        MissingDependency: gcsfs or adlfs is not installed.
    """
    try:
        if kind == "gs":
            # The core class: gcsfs's default one first asks a gRPC control
            # API for the bucket's layout (a minute's timeout off GCS).
            from gcsfs.core import GCSFileSystem

            # gcsfs reads STORAGE_EMULATOR_HOST itself (and then signs nothing).
            token = "anon" if os.environ.get("STORAGE_EMULATOR_HOST") else _google_token()
            return GCSFileSystem(token=token, skip_instance_cache=True,
                                       use_listings_cache=False)
        import adlfs

        return adlfs.AzureBlobFileSystem(skip_instance_cache=True, **azure_options(account))
    except ImportError as exc:
        extra, package = ("gcs", "gcsfs") if kind == "gs" else ("azure", "adlfs")
        raise MissingDependency(f"{kind}:// needs {package} to list objects with their checksums",
                                hint=f"pip install 'ucstage[{extra}]'") from exc


class NoCredentials(Exception):
    """No GCS credentials in the environment (and no metadata server)."""


def _google_token() -> Any:
    """gcsfs's ``token`` from the variables obstore reads
    (``GOOGLE_SERVICE_ACCOUNT``: a key file; ``GOOGLE_SERVICE_ACCOUNT_KEY``:
    its JSON), else Application Default Credentials, asked before any
    request: without any, gcsfs would go on anonymously and fail later with
    a generic error.

    Raises:
        NoCredentials: none found.
    """
    import json

    env = os.environ
    if env.get("GOOGLE_SERVICE_ACCOUNT") or env.get("GOOGLE_SERVICE_ACCOUNT_PATH"):
        return env.get("GOOGLE_SERVICE_ACCOUNT") or env["GOOGLE_SERVICE_ACCOUNT_PATH"]
    if env.get("GOOGLE_SERVICE_ACCOUNT_KEY"):
        return json.loads(env["GOOGLE_SERVICE_ACCOUNT_KEY"])
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
    except DefaultCredentialsError as exc:
        raise NoCredentials(str(exc).splitlines()[0]) from exc
    return credentials


def hex_of(value: Any) -> str:
    """A stored checksum (base64 text, or bytes as adlfs gives them) in hex."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    try:
        return base64.b64decode(str(value), validate=True).hex()
    except (binascii.Error, ValueError):
        return ""


def version(info: dict[str, Any]) -> str:
    """The version of a gcsfs or adlfs ``info`` dict (see the module
    docstring); '' for any other backend's."""
    if info.get("generation") not in (None, ""):
        md5 = hex_of(info.get("md5Hash") or "")
        crc = hex_of(info.get("crc32c") or "") if not md5 else ""
        tail = f";md5={md5}" if md5 else f";crc32c={crc}" if crc else ""
        return f"{info['generation']}{tail}"
    settings = info.get("content_settings")
    if settings is not None and info.get("etag"):
        # A dict from find, the SDK's ContentSettings (a mapping) from info.
        md5 = hex_of((settings.get("content_md5") if hasattr(settings, "get") else
                    getattr(settings, "content_md5", None)) or b"")
        return str(info["etag"]).strip('"') + (f";md5={md5}" if md5 else "")
    return ""


def marker(listed: str) -> str:
    """The change marker of a :func:`version` (generation or ETag), without checksums."""
    return listed.split(";", 1)[0]


def sums(listed: str) -> dict[str, str]:
    """The checksums a :func:`version` carries (``{"md5": hex}``, ``{"crc32c": hex}``, ``{}``)."""
    found = {}
    for part in listed.split(";")[1:]:
        name, _, value = part.partition("=")
        if name in ("md5", "crc32c") and value:
            found[name] = value
    return found
