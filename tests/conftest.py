"""Session fixtures that start real parts; see tests/common/parts.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests.common import realcache
from tests.common.backends import walking_store  # noqa: F401  (a fixture for every test)
from tests.common.groups import pytest_collection_modifyitems  # noqa: F401  (xdist groups)
from tests.common.parts import MotoServer, rclone_mount, unique, wait_visible
from tests.common.realcache import pytest_sessionfinish, pytest_unconfigure  # noqa: F401
from tests.common.spark import (  # noqa: F401  (export fixtures)
    TEST_JAVA_OPTIONS,
    big_table,
    spark_session,
    warehouse,
    warehouse_root,
)
from tests.common.users import other_user  # noqa: F401  (a second local user)

# Every property test does I/O or heavy work on a machine that may be at load
# 30: a per-example deadline would fail on the machine, not on the code.
settings.register_profile("ucstage", deadline=None)
settings.load_profile("ucstage")


def pytest_configure(config: pytest.Config) -> None:
    """JVM options for the test JVMs (see TEST_JAVA_OPTIONS; a user's own
    win), and the cache isolated before any fixture of any scope runs
    (tests/common/realcache.py)."""
    os.environ.setdefault("JAVA_TOOL_OPTIONS", TEST_JAVA_OPTIONS)
    realcache.pytest_configure(config)


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets a fresh cache root and no volumes root (the session's
    are set at pytest_configure, for fixtures of wider scope)."""
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache") / "c"))
    monkeypatch.delenv("UCSTAGE_VOLUMES_ROOT", raising=False)


@pytest.fixture(scope="session")
def fuse_volume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(backing folder, read-only rclone FUSE mount of it), for the whole session.

    Tests write into a fresh subfolder of the backing folder and read it
    through the mount. Under pytest-xdist each worker mounts its own (about
    0.2 s): one mount shared by the workers would need a lifetime none of
    them owns.
    """
    base = tmp_path_factory.mktemp("fuse")
    backing, mnt = str(base / "backing"), str(base / "mnt")
    os.makedirs(backing)
    with rclone_mount(backing, mnt):
        yield backing, mnt


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A moto S3 server on 127.0.0.1; its env is applied for the session.

    Tests that need isolation take a fresh prefix of its bucket. Under
    pytest-xdist each worker starts its own (under a second), as for
    ``fuse_volume``.
    """
    server = MotoServer(str(tmp_path_factory.mktemp("moto")))
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    fs = server.filesystem()
    fs.mkdir("ucstage-test")
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def _server_session(server: Any) -> Iterator[Any]:
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A fake-gcs-server on 127.0.0.1 with bucket ``ucstage-test``; its env
    (``STORAGE_EMULATOR_HOST``) is applied for the session, as moto's."""
    from tests.common.cloud import GcsServer

    yield from _server_session(GcsServer(str(tmp_path_factory.mktemp("gcs"))))


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Azurite's blob service on 127.0.0.1 with container ``ucstage-test``;
    its env (``AZURE_STORAGE_USE_EMULATOR``, ``AZURITE_BLOB_STORAGE_URL``) is
    applied for the session."""
    from tests.common.cloud import Azurite

    yield from _server_session(Azurite(str(tmp_path_factory.mktemp("azurite"))))


BACKENDS = ["local", "fuse", "s3", "s3-obstore", "memory"]
ENGINES = ["fsspec", "obstore"]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each object-store engine in turn, chosen by $UCSTAGE_ENGINE (inherited
    by the processes a test starts)."""
    monkeypatch.setenv("UCSTAGE_ENGINE", request.param)
    return str(request.param)


@pytest.fixture(params=["local", "s3-fsspec", "s3-obstore"])
def source_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Where tests/common/backends.py's ``make_source`` puts files: a local
    folder, or the moto bucket read through each object-store engine."""
    if request.param != "local":
        request.getfixturevalue("moto")
        monkeypatch.setenv("UCSTAGE_ENGINE", request.param.split("-", 1)[1])
    return str(request.param)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Each source kind in turn: a local folder, an rclone FUSE mount, a moto S3
    bucket (through the fsspec engine, then the obstore engine) and fsspec's
    memory filesystem. Tests using it run on all five."""
    import fsspec

    from tests.common.backends import Backend

    name = request.param
    if name.startswith("s3"):
        monkeypatch.setenv("UCSTAGE_ENGINE", "obstore" if name == "s3-obstore" else "fsspec")
        name = "s3"
    key = unique()
    if name == "local":
        root = str(tmp_path / "vol")
        os.makedirs(root)
        yield Backend(name, root, fsspec.filesystem("file"), root)
    elif name == "fuse":
        backing, mnt = request.getfixturevalue("fuse_volume")
        os.makedirs(os.path.join(backing, key))
        wait_visible(os.path.join(mnt, key))
        yield Backend(name, os.path.join(mnt, key), fsspec.filesystem("file"),
                      os.path.join(backing, key))
    elif name == "s3":
        server = request.getfixturevalue("moto")
        yield Backend(name, f"s3://ucstage-test/{key}", server.filesystem(),
                      f"ucstage-test/{key}")
    else:
        fs = fsspec.filesystem("memory")
        yield Backend(name, f"memory://{key}", fs, f"/{key}")
        fs.rm(f"/{key}", recursive=True) if fs.exists(f"/{key}") else None
