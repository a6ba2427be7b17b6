"""Unit tests of the ZooKeeper store's URL parsing (no server needed)."""

from __future__ import annotations

import pytest

from metastore import ZooKeeperMetaStore, open_metastore
from metastore.zookeeper import ZK_DEFAULT_PORT, parse_zk_url


@pytest.mark.parametrize("url, hosts, prefix", [
    ("zk://127.0.0.1:2181", "127.0.0.1:2181", ""),
    ("zk://127.0.0.1:2181/", "127.0.0.1:2181", ""),
    ("zk://zk1:2181,zk2:2182,zk3:2183/sms", "zk1:2181,zk2:2182,zk3:2183", "/sms"),
    ("zk://zk1/sms/prod", f"zk1:{ZK_DEFAULT_PORT}", "/sms/prod"),
    ("zk://[::1]:2181/x", "[::1]:2181", "/x"),
    ("zk://ZK1:2181/a%20b", "zk1:2181", "/a b"),
])
def test_parses(url: str, hosts: str, prefix: str) -> None:
    assert parse_zk_url(url) == (hosts, prefix)


@pytest.mark.parametrize("url", [
    "", "zk://", "zk:///sms", "zk:h:2181/sms", "zookeeper://h:2181", "http://h:2181",
    "zk://h:2181/sms/", "zk://h:2181//sms", "zk://h:2181/a/../b", "zk://h:2181/a/./b",
    "zk://h:0/x", "zk://h:65536/x", "zk://h:port/x", "zk://h:/x", "zk://h:2181,/x",
    "zk://,h:2181/x", "zk://user@h:2181/x", "zk://h:2181/x?timeout=3",
    "zk://h:2181/x#frag", "zk://h:2181/a%00b", "zk://h:2181/a%01b", None, 7,
])
def test_rejects(url: object) -> None:
    with pytest.raises(ValueError):
        parse_zk_url(url)


def test_open_metastore_picks_the_zookeeper_backend() -> None:
    store = open_metastore("zk://127.0.0.1:2181/sms")
    assert isinstance(store, ZooKeeperMetaStore)
    assert (store.hosts, store.prefix, store.url) == (
        "127.0.0.1:2181", "/sms", "zk://127.0.0.1:2181/sms")
    assert store.session_id == "" and store.client_id is None   # not started
