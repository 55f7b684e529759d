"""Real parts for the export tests: Spark Connect servers and a Delta warehouse.

* ``spark_session``: ONE embedded Spark Connect server for the whole test
  session, started through the library (``ucstage.export.spark.get_session``), so
  every test, library or CLI, reuses it as a user's process would. Under
  pytest-xdist every test that asks for it runs on one worker (the ``spark``
  group, tests/common/groups.py), so the suite still starts it once.
* ``warehouse``: a temp ``$UCSTAGE_WAREHOUSE`` with Delta tables written by
  deltalake (delta-rs): several commits, a partitioned table, odd names and
  types, a deletion-vector table and a column-mapping table.
* ``connect_script_server``: pyspark's own ``sbin/start-connect-server.sh``,
  as a user with a cluster would run it; stopped with ``stop-connect-server.sh``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest

from tests.common.parts import free_port, require, wait_port

TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""For every JVM the tests start (the session's server, a user's export
process, a script-started server), through $JAVA_TOOL_OPTIONS: they live
seconds to minutes, so the quick compiler alone and one GC thread cost about
a third less CPU than the defaults (measured: 15.5 s -> 10 s for a start and a
3M-row write) on the 2 cores the other tests share. Spark itself is the same."""


def java_ok() -> tuple[bool, str]:
    from ucstage.export.spark import java_executable

    if java_executable() is None:
        return False, "Java 17 is not installed (apt-get install openjdk-17-jre-headless)"
    try:
        import deltalake  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return False, f"pip install 'ucstage[spark]': {exc}"
    return True, ""


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """The process's embedded Spark Connect server and a session on it."""
    ok, reason = java_ok()
    require(ok, reason)
    from ucstage.export import spark

    saved = os.environ.pop("SPARK_REMOTE", None)
    session = spark.get_session()
    try:
        yield session
    finally:
        spark.stop_embedded()
        if saved is not None:
            os.environ["SPARK_REMOTE"] = saved


@dataclass
class Warehouse:
    root: str

    def path(self, name: str) -> str:
        from ucstage.tables.names import parse_table_name

        return os.path.join(self.root, *parse_table_name(name).parts)


def events_table(start: int, n: int) -> Any:
    """``n`` rows of the events table's shape, ids from ``start``."""
    import pyarrow as pa

    ids = list(range(start, start + n))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "text": [f"row {i}" if i % 7 else None for i in ids],
        "score": pa.array([i / 3 for i in ids], pa.float64()),
        "label": pa.array([i % 5 for i in ids], pa.int32()),
    })


def write_events(path: str) -> None:
    """Five commits: write, append, overwrite, append, delete."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(path, events_table(0, 1000))
    write_deltalake(path, events_table(1000, 1000), mode="append")
    write_deltalake(path, events_table(5000, 1500), mode="overwrite")
    write_deltalake(path, events_table(7000, 500), mode="append")
    DeltaTable(path).delete("label = 3")


def odd_table() -> Any:
    import pyarrow as pa

    utc = dt.timezone.utc
    n = 40
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "Odd Col": [f"v{i}" if i % 3 else None for i in range(n)],
        "naïve-ünicode": [f"ü{i}" for i in range(n)],
        "amount": pa.array([Decimal(f"{i}.{i % 10:04d}") if i % 4 else None for i in range(n)],
                           pa.decimal128(18, 4)),
        "at": pa.array([dt.datetime(2024, 1, 1, tzinfo=utc) + dt.timedelta(hours=i)
                        if i % 5 else None for i in range(n)], pa.timestamp("us", tz="UTC")),
        "day": pa.array([dt.date(2024, 1, 1 + i % 28) for i in range(n)], pa.date32()),
        "blob": pa.array([bytes([i, 0, 255]) if i % 6 else None for i in range(n)], pa.binary()),
        "nested": pa.array([{"a": i, "b": {"c": f"x{i}", "d": [i, i + 1]}} if i % 8 else None
                            for i in range(n)],
                           pa.struct([("a", pa.int64()),
                                      ("b", pa.struct([("c", pa.string()),
                                                       ("d", pa.list_(pa.int32()))]))])),
        "flag": [None if i % 9 == 0 else bool(i % 2) for i in range(n)],
    })


def parted_table(start: int = 0, n: int = 600) -> Any:
    import pyarrow as pa

    regions = ["eu west", "us/east", "ap%south", None]
    return pa.table({
        "id": pa.array(range(start, start + n), pa.int64()),
        "region": [regions[i % 4] for i in range(n)],
        "year": pa.array([2020 + i % 3 for i in range(n)], pa.int32()),
        "value": [float(i) for i in range(n)],
    })


@pytest.fixture(scope="session")
def warehouse_root(tmp_path_factory: pytest.TempPathFactory) -> Warehouse:
    """Delta tables for the export tests; treat them as read-only."""
    from deltalake import DeltaTable, write_deltalake

    wh = Warehouse(str(tmp_path_factory.mktemp("warehouse")))
    write_events(wh.path("main.ml.events"))
    write_deltalake(wh.path("main.`odd-schema`.`weird table`"), odd_table())
    parted = wh.path("main.ml.parted")
    write_deltalake(parted, parted_table(), partition_by=["region", "year"])
    write_deltalake(parted, parted_table(600, 300), partition_by=["region", "year"],
                    mode="append")
    DeltaTable(parted).delete("id % 10 = 0")
    write_deltalake(wh.path("main.ml.dv"), events_table(0, 10),
                    configuration={"delta.enableDeletionVectors": "true"})
    write_deltalake(wh.path("main.ml.cm"), events_table(0, 10),
                    configuration={"delta.columnMapping.mode": "name"})
    return wh


@pytest.fixture
def warehouse(warehouse_root: Warehouse, monkeypatch: pytest.MonkeyPatch) -> Warehouse:
    """``warehouse_root`` with $UCSTAGE_WAREHOUSE pointing at it."""
    monkeypatch.setenv("UCSTAGE_WAREHOUSE", warehouse_root.root)
    return warehouse_root


def read_delta(path: str) -> Any:
    """The table's current rows, read with pyarrow from delta-rs's live file list.

    (Reading through delta-rs's own filesystem can abort the process at exit.)
    """
    import pyarrow as pa
    import pyarrow.dataset as ds

    from ucstage.tables.delta import table_state

    state = table_state(path)
    partitioning = None
    if state.partition_columns:
        fields = [state.arrow_schema.field(c) for c in state.partition_columns]
        partitioning = ds.partitioning(pa.schema(fields), flavor="hive")
    data = ds.dataset(state.files, schema=state.arrow_schema, format="parquet",
                      partitioning=partitioning, partition_base_dir=state.path)
    return data.to_table()


def exported_table(dest: str, partitioned: bool = False) -> Any:
    import pyarrow.dataset as ds

    return ds.dataset(dest, format="parquet", partitioning="hive" if partitioned else None,
                      exclude_invalid_files=False).to_table()


def rows(table: Any, key: str = "id") -> list[dict[str, Any]]:
    return table.sort_by(key).to_pylist()


@contextmanager
def connect_script_server(workdir: str) -> Iterator[str]:
    """A Spark Connect server started with pyspark's sbin/start-connect-server.sh.

    The script daemonizes through spark-daemon.sh: its log goes to
    $SPARK_LOG_DIR/spark-$SPARK_IDENT_STRING-...SparkConnectServer-1-$HOSTNAME.out
    and its pid file to $SPARK_PID_DIR; the port comes from
    ``--conf spark.connect.grpc.binding.port`` (default 15002). Private log,
    pid and ident settings keep parallel test runs apart.
    """
    from ucstage.export.spark import SERVER_CONF, spark_home

    home = spark_home()
    port = free_port()
    env = dict(os.environ)
    env.update({"SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOG_DIR": os.path.join(workdir, "logs"),
                "SPARK_PID_DIR": os.path.join(workdir, "pids"),
                "SPARK_IDENT_STRING": f"ucstage-test-{port}"})
    env.pop("SPARK_REMOTE", None)
    conf: list[str] = []
    for key, value in {**SERVER_CONF, "spark.connect.grpc.binding.port": str(port),
                       "spark.connect.grpc.binding.address": "127.0.0.1"}.items():
        conf += ["--conf", f"{key}={value}"]
    start = subprocess.run([os.path.join(home, "sbin", "start-connect-server.sh"),
                            "--master", "local[2]", *conf],
                           env=env, capture_output=True, text=True, timeout=120)
    require(start.returncode == 0, f"start-connect-server.sh failed: {start.stderr[-300:]}")
    try:
        wait_port(port, timeout=180)
        yield f"sc://127.0.0.1:{port}"
    finally:
        subprocess.run([os.path.join(home, "sbin", "stop-connect-server.sh")], env=env,
                       capture_output=True, timeout=120)


BIG_ROWS = 3_000_000
"""Rows of ``big_table``: enough that Spark is still writing seconds after it starts."""


def write_big_table(path: str, n: int = BIG_ROWS) -> None:
    """A one-commit Delta table of ``n`` rows (id, text, x), about 7 MiB as Parquet."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import write_deltalake

    ids = pa.array(range(n), pa.int64())
    write_deltalake(path, pa.table({"id": ids, "text": pc.cast(ids, pa.string()),
                                    "x": pc.multiply(ids, 3)}))


@pytest.fixture(scope="session")
def big_table(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The path of a ``BIG_ROWS``-row Delta table; treat it as read-only."""
    ok, reason = java_ok()
    require(ok, reason)
    path = str(tmp_path_factory.mktemp("big") / "big")
    write_big_table(path)
    return path


def export_process(table: str, dest: str, tmpdir: str, *args: str) -> subprocess.Popen[str]:
    """``python -m ucstage export TABLE DEST ARGS`` as a user runs it, with its own $TMPDIR
    (so its embedded server's folder is the only one there) and stderr as a log."""
    import sys

    env = dict(os.environ, TMPDIR=tmpdir)
    env.pop("SPARK_REMOTE", None)
    os.makedirs(tmpdir, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "ucstage", "export", table, dest, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            stdin=subprocess.DEVNULL)


def wait_writing(proc: subprocess.Popen[str], dest: str, timeout: float = 300) -> None:
    """Wait until Spark writes into the export's staging folder beside ``dest``."""
    import time

    parent, base = os.path.split(dest)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the export ended (exit {proc.returncode}) before it wrote: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        names = os.listdir(parent) if os.path.isdir(parent) else []
        for name in names:
            if name.startswith(f".{base}.ucstage-staging-") and \
                    os.path.isdir(os.path.join(parent, name, "_temporary")):
                return
        time.sleep(0.02)
    raise AssertionError(f"no staging folder appeared beside {dest} within {timeout} s")


def server_folders(tmpdir: str) -> list[str]:
    """The embedded servers' folders in ``tmpdir``."""
    from ucstage.export.embedded import FOLDER_PREFIX

    return sorted(os.path.join(tmpdir, n) for n in os.listdir(tmpdir)
                  if n.startswith(FOLDER_PREFIX))


def server_pids(folder: str) -> list[int]:
    """The processes working in ``folder``: an embedded server runs there (its cwd)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == os.path.realpath(folder):
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def dest_listing(dest: str) -> dict[str, tuple[int, int]]:
    """Every file under an export DEST with its inode and mtime: equal before
    and after means DEST was not touched."""
    out = {}
    for folder, _dirs, names in os.walk(dest):
        for name in names:
            st = os.stat(os.path.join(folder, name))
            out[os.path.relpath(os.path.join(folder, name), dest)] = (st.st_ino, st.st_mtime_ns)
    return out


def beside_dest(dest: str) -> list[str]:
    """ucstage's hidden names beside DEST (staging, old export, lock file)."""
    parent, base = os.path.split(dest)
    return sorted(n for n in os.listdir(parent) if n.startswith(f".{base}.ucstage"))
