"""The metadata store: a versioned tree of entries with ephemerals and watches.

Callers import everything from here: the `MetaStore` interface and its types and
errors (base.py), and `open_metastore(url)`, which picks the backend from a URL:
`embedded:///abs/path/meta.lmdb` (or a plain filesystem path) opens the embedded LMDB
backend (embedded.py); `zk://host:port[,host:port...][/prefix]` opens the ZooKeeper
backend (zookeeper/, over kazoo; the prefix is a chroot, created if missing). The
ZooKeeper module is imported on first use (`ZooKeeperMetaStore` is importable from
here too), so embedded users do not load kazoo. The store returned is not started:
`await store.start()` (or `async with store:`) on the loop that will use it.
"""

from __future__ import annotations

import asyncio
import os
import urllib.parse

from metastore.base import (
    ROOT,
    BadVersionError,
    Check,
    ConnectionLossError,
    Create,
    Delete,
    Entry,
    MetaStore,
    MetaStoreClosedError,
    MetaStoreError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    Op,
    SessionExpiredError,
    Set,
    TooManyWatchesError,
)
from metastore.embedded import EmbeddedMetaStore

__all__ = [
    "ROOT",
    "BadVersionError",
    "Check",
    "ConnectionLossError",
    "Create",
    "Delete",
    "EmbeddedMetaStore",
    "Entry",
    "MetaStore",
    "MetaStoreClosedError",
    "MetaStoreError",
    "NoChildrenForEphemeralsError",
    "NodeExistsError",
    "NoNodeError",
    "NotEmptyError",
    "Op",
    "SessionExpiredError",
    "Set",
    "TooManyWatchesError",
    "ZooKeeperMetaStore",
    "open_metastore",
]

EMBEDDED_SCHEME = "embedded"
ZOOKEEPER_SCHEME = "zk"


def open_metastore(url: str, *,
                   loop: asyncio.AbstractEventLoop | None = None) -> MetaStore:
    """A (not yet started) client of the store named by `url`; ValueError if `url`
    names no store this build can open."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"metadata store url {url!r}: expected a non-empty str")
    parts = urllib.parse.urlsplit(url)
    if "://" not in url and parts.scheme not in (EMBEDDED_SCHEME, ZOOKEEPER_SCHEME):
        return EmbeddedMetaStore(os.path.abspath(url), loop=loop)
    if parts.scheme == ZOOKEEPER_SCHEME:
        from metastore.zookeeper import ZooKeeperMetaStore
        return ZooKeeperMetaStore(url, loop=loop)
    if parts.scheme != EMBEDDED_SCHEME:
        raise ValueError(f"metadata store url {url!r}: unknown scheme {parts.scheme!r};"
                         f" expected {EMBEDDED_SCHEME!r} or {ZOOKEEPER_SCHEME!r}")
    if parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"metadata store url {url!r}: expected"
                         f" {EMBEDDED_SCHEME}:///absolute/path/to/meta.lmdb")
    path = urllib.parse.unquote(parts.path)
    if not path.startswith("/") or path.endswith("/"):
        raise ValueError(f"metadata store url {url!r}: expected an absolute file path")
    return EmbeddedMetaStore(path, loop=loop)


def __getattr__(name: str) -> object:
    """`ZooKeeperMetaStore`, imported on first use (it loads kazoo)."""
    if name == "ZooKeeperMetaStore":
        from metastore.zookeeper import ZooKeeperMetaStore
        return ZooKeeperMetaStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
