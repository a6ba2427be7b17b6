"""Real metadata stores for tests that run against both backends: `store_factory` (a
fixture parametrized over the embedded store and ZooKeeper) opens clients of one fresh
store; `zk_server` is one real ZooKeeper server per module (tests/zkserver.py), each test
under a prefix of its own. A test module uses them by importing both fixtures."""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metastore import MetaStore, open_metastore
from tests.zkserver import ZkServer, skip_reason, zk_available


class StoreFactory:
    """Opens clients (unstarted) of one fresh store; `url` is what child processes
    pass to open_metastore()."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url

    def client(self) -> MetaStore:
        return open_metastore(self.url)


def fresh_prefix() -> str:
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    """One real ZooKeeper server for the module's tests (each uses its own prefix)."""
    if not zk_available():
        pytest.skip(skip_reason())
    server = ZkServer(tmp_path_factory.mktemp("zk"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["embedded", "zk"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "embedded":
        path = urllib.parse.quote(str(tmp_path / "meta.lmdb"))
        return StoreFactory("embedded", f"embedded://{path}")
    if request.param == "zk":
        server: ZkServer = request.getfixturevalue("zk_server")
        return StoreFactory("zk", server.url(fresh_prefix()))
    raise AssertionError(f"unknown backend {request.param!r}")
