"""Encrypted Parquet never reaches pyarrow's footer calls: an encrypted footer
(magic ``PARE``) and encrypted columns under a plaintext footer (on which
pyarrow aborts the process) are each one line naming the file, exit 2, from
``freeze()``, ``shard-plan`` and ``cache warm``, each run in a subprocess so
that a crash shows as a signal instead of taking pytest down. The files are
written by pyarrow's own encryption with a toy KMS client (keys wrapped in
the clear: a test stand-in for a KMS, which no test here can run)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
import pytest


class _ClearKms(pe.KmsClient):  # type: ignore[misc]
    """Wraps a key as its base64: enough for pyarrow to write the file."""

    def __init__(self, config: pe.KmsConnectionConfig) -> None:
        super().__init__()

    def wrap_key(self, key_bytes: bytes, master_key_identifier: str) -> bytes:
        return base64.b64encode(key_bytes)

    def unwrap_key(self, wrapped_key: bytes, master_key_identifier: str) -> bytes:
        return base64.b64decode(wrapped_key)


def write_encrypted(path: Path, *, plaintext_footer: bool) -> None:
    t = pa.table({"id": pa.array(range(30), pa.int64()), "secret": [f"s{i}" for i in range(30)]})
    factory = pe.CryptoFactory(lambda config: _ClearKms(config))
    config = pe.EncryptionConfiguration(footer_key="footer", column_keys={"col": ["secret"]},
                                        plaintext_footer=plaintext_footer,
                                        double_wrapping=False)
    props = factory.file_encryption_properties(pe.KmsConnectionConfig(), config)
    with pq.ParquetWriter(str(path), t.schema, encryption_properties=props) as writer:
        writer.write_table(t, row_group_size=10)


def run(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, UCSTAGE_CACHE_DIR=str(tmp / "cache"))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          check=False)


FREEZE = ("import sys\n"
          "from ucstage import TableDataset\n"
          "from ucstage.errors import UcstageError\n"
          "try:\n"
          "    TableDataset(sys.argv[1], cache_dir=sys.argv[2]).freeze()\n"
          "except UcstageError as exc:\n"
          "    print(type(exc).__name__, exc, file=sys.stderr)\n"
          "    sys.exit(exc.exit_code)\n")


@pytest.mark.parametrize("plaintext_footer", [True, False], ids=["plaintext-footer", "PARE"])
def test_encrypted_files_are_refused_by_name_without_a_crash(tmp_path: Path,
                                                             plaintext_footer: bool) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "secret": ["x"]}),
                   folder / "a-plain.parquet")
    write_encrypted(folder / "b-locked.parquet", plaintext_footer=plaintext_footer)
    magic = (folder / "b-locked.parquet").read_bytes()[-4:]
    assert magic == (b"PAR1" if plaintext_footer else b"PARE")
    why = "encrypted columns|encrypted column metadata" if plaintext_footer else "PARE"
    runs = {
        "freeze": run(["-c", FREEZE, str(folder), str(tmp_path / "cache")], tmp_path),
        "shard-plan": run(["-m", "ucstage", "shard-plan", str(folder), "--unit", "row-group",
                           "-w", "2", "-k", "1"], tmp_path),
        "cache warm": run(["-m", "ucstage", "cache", "warm", str(folder),
                           "--unit", "row-group"], tmp_path),
    }
    for name, done in runs.items():
        assert done.returncode == 2, (name, done.returncode, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert "Traceback" not in done.stderr, (name, done.stderr)
        assert "b-locked.parquet is encrypted" in lines[0], (name, done.stderr)
        assert any(re.search(why, line) for line in lines), (name, done.stderr)
        assert "no Parquet magic" not in done.stderr


def test_the_encryption_check_reads_any_bytes_without_a_crash(tmp_path: Path) -> None:
    # Every cut of a real footer, and its bytes reversed: the scanner either
    # answers or says the bytes are no footer (ValueError: NotParquet).
    from ucstage.tables.encrypted import encryption

    write_encrypted(tmp_path / "x.parquet", plaintext_footer=True)
    data = (tmp_path / "x.parquet").read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - n:-8]
    assert encryption(footer) is not None
    assert encryption(footer[:-28]) is not None  # the struct, without its 28-byte signature
    for cut in [*range(0, len(footer), 7), len(footer) - 1]:
        for blob in (footer[:cut], footer[cut:], footer[::-1][:cut]):
            try:
                got = encryption(blob)
            except ValueError:
                continue
            assert got is None or "encrypted" in got
