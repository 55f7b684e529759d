"""The URL forms users paste for GCS and Azure, one test each, against the
emulators where the form can reach them; the client options obstore reads
from the environment; the hints when nothing is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.parts import unique
from ucstage import cloudfs
from ucstage.cache import LocalCache
from ucstage.errors import SourceNotFound, SourceUnreadable
from ucstage.manifest import snapshot

FILES = {"a.bin": b"a" * 300, "d/b.bin": b"b" * 200}


def _warm(url: str) -> dict[str, bytes]:
    m = snapshot(url)
    cache = LocalCache()
    report = cache.warm(m.volume(), m.entries)
    assert report.failed == [] and report.check_counts()["md5"] == len(m.entries)
    return {e.path: Path(cache.fetch(m.volume(), e)).read_bytes() for e in m.entries}


@pytest.fixture
def az_prefix(azurite, monkeypatch: pytest.MonkeyPatch) -> str:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    prefix = unique()
    azurite.filesystem().pipe({f"{azurite.CONTAINER}/{prefix}/{k}": v for k, v in FILES.items()})
    return f"{azurite.CONTAINER}/{prefix}"


@pytest.fixture
def gs_prefix(gcs, monkeypatch: pytest.MonkeyPatch) -> str:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    prefix = unique()
    gcs.filesystem().pipe({f"{gcs.BUCKET}/{prefix}/{k}": v for k, v in FILES.items()})
    return f"{gcs.BUCKET}/{prefix}"


def test_abfss_with_the_account_in_the_host(az_prefix: str) -> None:
    """Spark's and the platform's form: the account is read from the host,
    not taken as part of the container."""
    container, prefix = az_prefix.split("/", 1)
    url = f"abfss://{container}@{cloudfs.EMULATOR_ACCOUNT}.dfs.core.windows.net/{prefix}"
    assert _warm(url) == FILES
    assert snapshot(url).volume().url == url  # the user's form, kept


def test_abfss_naming_an_account_the_server_does_not_have(az_prefix: str) -> None:
    container, prefix = az_prefix.split("/", 1)
    # Looked up in that account (Azurite has only its development one).
    with pytest.raises((SourceUnreadable, SourceNotFound), match="otheraccount"):
        snapshot(f"abfss://{container}@otheraccount.dfs.core.windows.net/{prefix}")


def test_abfs(az_prefix: str) -> None:
    assert _warm(f"abfs://{az_prefix}") == FILES


def test_az(az_prefix: str) -> None:
    assert _warm(f"az://{az_prefix}") == FILES


def test_adl(az_prefix: str) -> None:
    assert _warm(f"adl://{az_prefix}") == FILES


def test_https_blob_host(az_prefix: str) -> None:
    container, prefix = az_prefix.split("/", 1)
    assert _warm(f"https://{cloudfs.EMULATOR_ACCOUNT}.blob.core.windows.net/{container}/"
                 f"{prefix}") == FILES


def test_gs(gs_prefix: str) -> None:
    assert _warm(f"gs://{gs_prefix}") == FILES


def test_gcs(gs_prefix: str) -> None:
    assert _warm(f"gcs://{gs_prefix}") == FILES


def test_https_storage_googleapis(gs_prefix: str) -> None:
    """obstore cannot parse this form (its from_url takes https for S3): it
    is read as gs:// (STORAGE_EMULATOR_HOST points it at the emulator)."""
    assert _warm(f"https://storage.googleapis.com/{gs_prefix}") == FILES


def test_the_parsed_forms() -> None:
    assert cloudfs.parse("abfss://c@acct.dfs.core.windows.net/p/q") == ("abfss", "az", "c@acct/p/q")
    assert cloudfs.parse("https://acct.blob.core.windows.net/c/p") == ("https", "az", "c@acct/p")
    assert cloudfs.parse("https://storage.googleapis.com/b/p") == ("https", "gs", "b/p")
    assert cloudfs.parse("https://example.com/b/p") is None
    assert cloudfs.parse("s3://b/p") is None


def test_an_http_endpoint_with_real_credentials_keeps_the_users_client_options(
        azurite, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """AZURE_STORAGE_ENDPOINT=http://... with an account and key and
    AZURE_ALLOW_HTTP=true (no emulator switch): ucstage's own client options
    (the timeout) are merged into what obstore reads, not put in its place
    (which dropped allow_http: 'builder error')."""
    prefix = unique()
    azurite.filesystem().pipe({f"{azurite.CONTAINER}/{prefix}/{k}": v for k, v in FILES.items()})
    for name in ("AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", f"{azurite.endpoint}/{cloudfs.EMULATOR_ACCOUNT}")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", cloudfs.EMULATOR_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", cloudfs.EMULATOR_KEY)
    monkeypatch.setenv("AZURE_ALLOW_HTTP", "true")
    assert _warm(f"az://{azurite.CONTAINER}/{prefix}") == FILES


def test_gs_with_no_settings_names_its_variables(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "GCE_"))}
    # No request leaves the machine: the metadata probe of Application
    # Default Credentials goes to a closed loopback port, and without
    # credentials ucstage stops before asking the store.
    env.update({"UCSTAGE_ENGINE": "obstore", "GCE_METADATA_HOST": "127.0.0.1:9",
                "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "true",
                "HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud")})
    proc = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm",
                           "gs://some-bucket/data"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT",
                 "STORAGE_EMULATOR_HOST"):
        assert name in proc.stderr


def test_a_blob_without_content_md5_is_checked_by_the_md5s_of_its_ranges(
        azurite, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A blob the store keeps no MD5 for is read in ranges Azure gives the MD5
    of (tests/cloud/test_azure_ranges.py): counted as MD5-checked, never as
    checked by size only."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    prefix = unique()
    azurite.put_blocks(f"{azurite.CONTAINER}/{prefix}/blocks.bin", [b"x" * 100, b"y" * 100])
    url = f"az://{azurite.CONTAINER}/{prefix}"
    m = snapshot(url)
    assert ";md5=" not in m.entries[0].version  # the store keeps none
    proc = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["checks"] == {"md5": 1, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}
    assert "size only" not in proc.stdout + proc.stderr
