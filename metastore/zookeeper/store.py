"""`ZooKeeperMetaStore`: the MetaStore over a ZooKeeper ensemble, made of its parts:
the operations (ops.py), the watches (watches.py) and the bridge to kazoo's threads, with
the lifecycle and the session (bridge.py)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Callable

from kazoo.client import KazooClient

from metastore.base import MetaStore
from metastore.zookeeper.bridge import ZkBridge, _State
from metastore.zookeeper.ops import ZkOps
from metastore.zookeeper.url import parse_zk_url
from metastore.zookeeper.watches import ZkWatches, _PathWatch


class ZooKeeperMetaStore(ZkOps, ZkWatches, ZkBridge, MetaStore):
    """A client of the ZooKeeper ensemble named by `url` (zk://...), with its own
    session. `loop`: the loop start() must run on (default: whichever runs it)."""

    def __init__(self, url: str, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._hosts, self._prefix = parse_zk_url(url)
        self._url = url
        self._loop = loop
        self._state = _State.NEW
        self._client: KazooClient | None = None
        self._client_id: tuple[int, bytes] | None = None
        self._session_gen = 0                     # +1 on every fresh session
        self._connected = asyncio.Event()
        self._closing = asyncio.Event()
        self._session_changed = asyncio.Event()   # set and replaced on a fresh session
        self._path_watches: dict[str, _PathWatch] = {}
        self._watch_count = 0
        self._lost_callbacks: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count()

    def __repr__(self) -> str:
        return (f"ZooKeeperMetaStore({self._url!r}, state={self._state.value},"
                f" session={self.session_id!r})")

    @property
    def url(self) -> str:
        return self._url

    @property
    def hosts(self) -> str:
        """The servers, as kazoo takes them: "host:port,host:port"."""
        return self._hosts

    @property
    def prefix(self) -> str:
        """The chroot every path lives under ("" for the server's root)."""
        return self._prefix

    @property
    def session_id(self) -> str:
        return "" if self._client_id is None else format(self._client_id[0], "016x")

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        """The current ZooKeeper session id and password (what a second client needs
        to take the session over: tests use it to force an expiry)."""
        return self._client_id
