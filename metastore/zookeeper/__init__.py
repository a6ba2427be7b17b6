"""ZooKeeper metadata store: the MetaStore interface over a ZooKeeper ensemble (kazoo).

`ZooKeeperMetaStore` implements `MetaStore` (base.py) for clusters of more than one
host. The URL is `zk://host:port[,host:port...][/prefix]`; the prefix is a chroot,
created at start() if missing, so several clusters can share one ensemble. Every store
client is one kazoo client with its own ZooKeeper session, whose timeout is
METASTORE_SESSION_TTL_S (the servers must allow it: minSessionTimeout <= TTL <=
maxSessionTimeout) and whose ephemeral znodes are the store's ephemeral entries.

Threads: kazoo runs a connection thread and two callback threads. This module is the
only one that touches them. Every request is issued with a kazoo `*_async` method from
the event loop and its IAsyncResult is turned into an asyncio future that is settled on
the loop (`loop.call_soon_threadsafe`); watch events and session-state changes hop to
the loop the same way, so store state is only ever touched on the loop, and no method
blocks the loop (start() and close() run kazoo's blocking start/stop in an executor).

Semantics kept equal to the embedded store (the contract tests hold both to them):
- create() makes missing parents; commit() applies ops atomically with one ZooKeeper
  `multi`, and returns the versions the embedded store returns. A Delete without an
  expected version is sent pinned to the version read just before (so its result can
  report the version the entry had); a concurrent set then makes the multi fail on that
  op, and the commit is re-read and re-sent. delete(recursive=True) deletes the subtree
  in multis of at most limits.ZK_MULTI_OPS_MAX ops, each guarded by a check of the version of
  the subtree's root: atomic for subtrees that fit one multi.
- Watches: ZooKeeper watches are one-shot and dropped with the connection, so each
  watched path holds one exists() and one get_children() watch, re-armed after every
  event and after every reconnect. A re-arm that was not caused by an event (watch()
  itself, a reconnect, a new session) compares what it reads with what was last seen
  (zxids and versions) and reports a difference, so changes made while no watch was
  armed are not missed; the first arm compares with the last zxid this client had seen
  when watch() was called, so a change made right after watch() is reported even if it
  reached the server before the watch did. Callbacks run once the re-arm's reads are
  answered (a round trip after the event; after the reconnect if the connection is
  down). A callback may come without a change (as the contract allows): after a
  reconnect, or at the first arm when the path or its parent changed shortly before.
- Session loss: kazoo starts a fresh session when it finds the old one expired; the
  on_session_lost callbacks run on the loop once the fresh session is connected. A
  write that found the session expired raises SessionExpiredError after waiting
  (bounded) for the fresh session, so a retry runs under the new one; get() and
  children() are simply retried under it (embedded reads never raise it either).
- Limits: the value size and path checks of base.py, the embedded store's path length
  limit, and ZooKeeper's own path rules (no control or private-use characters; without
  a prefix the reserved `/zookeeper` subtree is refused and hidden from children("/")).

Differences that cannot be papered over (see ConnectionLossError): an operation in
flight when the connection to the server drops may or may not have been applied. Reads
are retried after the reconnect; create/set/delete are retried and a retry that fails
only because the first attempt had been applied is recognised (an ephemeral entry owned
by this session, a set that left our value at the next version, a delete that finds no
entry) and reported as the success it was; commit() is not retried and raises
ConnectionLossError. An operation waits at most limits.ZK_OPERATION_TIMEOUT_S for a server
(ConnectionLossError after). With an ensemble, another client's read may lag a write
it did not make (ZooKeeper is sequentially consistent per client, not linearizable).
The servers must run with `-Djute.maxbuffer=` at least limits.ZK_JUTE_MAXBUFFER_BYTES, or a
METASTORE_VALUE_BYTES_MAX value makes the server drop the connection.
"""

from metastore.base import ConnectionLossError
from metastore.zookeeper.store import ZooKeeperMetaStore
from metastore.zookeeper.url import (ENV_ZK_DIGEST, ZK_DEFAULT_PORT, ZK_RESERVED_NAME, ZOOKEEPER_SCHEME,
                                         parse_zk_url, zk_auth)

__all__ = ["ConnectionLossError", "ENV_ZK_DIGEST", "ZK_DEFAULT_PORT", "ZK_RESERVED_NAME", "ZOOKEEPER_SCHEME",
           "ZooKeeperMetaStore", "parse_zk_url", "zk_auth"]
