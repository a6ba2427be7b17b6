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

from __future__ import annotations

import asyncio
import dataclasses
import os
import enum
import itertools
import logging
import re
import urllib.parse
from typing import Any, Awaitable, Callable, TypeVar

import kazoo.exceptions as kz
from kazoo.client import KazooClient
from kazoo.security import make_digest_acl
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat
from kazoo.retry import KazooRetry

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
    ancestors_of,
    validate_op,
    validate_path,
    validate_value,
    validate_version,
)
from sms import limits

ZOOKEEPER_SCHEME = "zk"
ZK_DEFAULT_PORT = 2181
ZK_RESERVED_NAME = "zookeeper"       # the server's own subtree at its root

# Characters ZooKeeper refuses in a path (PathUtils.validatePath).
_ZK_FORBIDDEN = re.compile("[\u0001-\u001f\u007f-\u009f\ud800-\uf8ff\ufff0-\uffff]")

logger = logging.getLogger(__name__)

T = TypeVar("T")



# --- the URL --------------------------------------------------------------------------

def parse_zk_url(url: object) -> tuple[str, str]:
    """(hosts, prefix) of `zk://host:port[,host:port...][/prefix]`: hosts as kazoo
    takes them ("h1:2181,h2:2181", port 2181 if omitted), prefix "" or an absolute
    path without a trailing "/". ValueError on anything else."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"zookeeper url {url!r}: expected a non-empty str")
    expected = f"expected {ZOOKEEPER_SCHEME}://host:port[,host:port...][/prefix]"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != ZOOKEEPER_SCHEME or not url.startswith(f"{ZOOKEEPER_SCHEME}://"):
        raise ValueError(f"zookeeper url {url!r}: {expected}")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"zookeeper url {url!r}: query or fragment; {expected}")
    if not parts.netloc or "@" in parts.netloc:
        raise ValueError(f"zookeeper url {url!r}: {expected}")
    hosts = []
    for item in parts.netloc.split(","):
        try:
            split = urllib.parse.urlsplit(f"//{item}")
            host, port = split.hostname, split.port
        except ValueError as exc:
            raise ValueError(f"zookeeper url {url!r}: bad host {item!r}: {exc}") from None
        if not item or not host or split.username or split.password or split.path:
            raise ValueError(f"zookeeper url {url!r}: bad host {item!r}; {expected}")
        if port == 0 or (port is None and item.endswith(":")):
            raise ValueError(f"zookeeper url {url!r}: bad port in {item!r}")
        host_text = f"[{host}]" if ":" in host else host
        hosts.append(f"{host_text}:{port or ZK_DEFAULT_PORT}")
    prefix = urllib.parse.unquote(parts.path)
    if prefix in ("", ROOT):
        return ",".join(hosts), ""
    try:
        _check_zk_chars(validate_path(prefix))
    except ValueError as exc:
        raise ValueError(f"zookeeper url {url!r}: bad prefix: {exc}") from None
    return ",".join(hosts), prefix


def _check_zk_chars(path: str) -> str:
    match = _ZK_FORBIDDEN.search(path)
    if match is not None:
        raise ValueError(f"path {path!r}: character {match.group()!r} is not allowed"
                         f" by ZooKeeper")
    return path


# --- lifecycle and watch bookkeeping --------------------------------------------------

class _State(enum.Enum):
    NEW = "new"            # constructed; start() not called yet
    STARTING = "starting"  # start() is connecting
    OPEN = "open"          # session up (or being re-established), usable
    CLOSING = "closing"    # close() is stopping kazoo and ending the session
    CLOSED = "closed"


_TRANSITIONS = {
    _State.NEW: {_State.STARTING, _State.CLOSED},
    _State.STARTING: {_State.OPEN, _State.CLOSED},
    _State.OPEN: {_State.CLOSING},
    _State.CLOSING: {_State.CLOSED},
    _State.CLOSED: set(),
}


class _ZkWatcher:
    """The kazoo watch function of one watched znode. Called on a kazoo thread; it only
    hops to the loop. Equal for equal (store, znode), so kazoo's per-path watcher sets
    hold one however often the path is watched, cancelled and watched again."""

    __slots__ = ("store", "zpath")

    def __init__(self, store: ZooKeeperMetaStore, zpath: str) -> None:
        self.store = store
        self.zpath = zpath

    def __call__(self, event: Any) -> None:
        self.store._from_kazoo(self.store._on_zk_event, self.zpath, event)

    def __eq__(self, other: object) -> bool:
        return (type(other) is _ZkWatcher and other.store is self.store
                and other.zpath == self.zpath)

    def __hash__(self) -> int:
        return hash((id(self.store), self.zpath))


@dataclasses.dataclass(slots=True, eq=False)
class _PathWatch:
    """Every watch() on one path: one armed pair of ZooKeeper watches, many callbacks."""

    zpath: str
    watcher: _ZkWatcher
    baseline_zxid: int                    # compare the first arm with this
    callbacks: dict[int, Callable[[], None]] = dataclasses.field(default_factory=dict)
    seen: tuple | None = None             # what the last arm read (None: not armed yet)
    fire: bool = False                    # an event came: call back after the arm
    again: bool = False                   # re-arm once more when this arm is done
    reads: _ArmReads | None = None        # an arm's requests, issued, not awaited yet
    last_event: WatchedEvent | None = None
    task: asyncio.Task[None] | None = None
    active: bool = True


@dataclasses.dataclass(slots=True)
class _ArmReads:
    """The requests of one arm, issued together (ZooKeeper answers them in order)."""

    parent: asyncio.Future | None         # exists(parent), for the absent case
    node: asyncio.Future                  # exists(path, watch)
    children: asyncio.Future              # get_children(path, watch, include_data)


_CONNECTION_ERRORS = (kz.ConnectionLoss, kz.SessionMovedError, kz.OperationTimeoutError)


# --- the client -----------------------------------------------------------------------

ENV_ZK_DIGEST = "SMS_ZK_DIGEST"     # "user:password": digest ACLs on every znode the cluster makes


def zk_auth() -> dict:
    """kazoo's arguments for the cluster's digest credential ($SMS_ZK_DIGEST,
    "user:password"; docs/operations.md): the session authenticates with it, and every
    znode it creates (the chroot too) may be read and changed by that user only. None
    set: open ACLs, as before."""
    digest = os.environ.get(ENV_ZK_DIGEST, "")
    if not digest:
        return {}
    user, sep, password = digest.partition(":")
    if not sep or not user or not password:
        raise MetaStoreError(f"${ENV_ZK_DIGEST} must be user:password")
    return {"auth_data": [("digest", digest)], "default_acl": [make_digest_acl(user, password, all=True)]}


class ZooKeeperMetaStore(MetaStore):
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

    # lifecycle

    async def start(self) -> None:
        if self._state is not _State.NEW:
            raise RuntimeError(f"start() of a store in state {self._state.value}")
        running = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not running:
            raise RuntimeError("start() on a loop other than the one given")
        self._loop = running
        self._transition(_State.STARTING)
        retry = KazooRetry(max_tries=-1, delay=limits.ZK_RECONNECT_DELAY_S, backoff=2,
                           max_delay=limits.ZK_RECONNECT_DELAY_MAX_S)
        client = KazooClient(hosts=self._hosts, timeout=limits.METASTORE_SESSION_TTL_S,
                             connection_retry=retry, randomize_hosts=True, **zk_auth())
        client.add_listener(self._kazoo_listener)
        self._client = client
        try:
            await running.run_in_executor(None, client.start_async)
            try:
                async with asyncio.timeout(limits.ZK_CONNECT_TIMEOUT_S):     # (not wait_for: see _await)
                    await self._connected.wait()
            except TimeoutError:
                raise MetaStoreError(f"metadata store {self._url!r}: no ZooKeeper server"
                                     f" answered within {limits.ZK_CONNECT_TIMEOUT_S} s") from None
            deadline = running.time() + limits.ZK_OPERATION_TIMEOUT_S
            try:
                if self._prefix:
                    await self._ensure_chroot(deadline)
                else:        # a first answer, so last_zxid is this server's
                    await self._read(deadline, client.exists_async, "/")
            except kz.KazooException as exc:
                raise self._translate(exc, "create the chroot") from exc
        except BaseException:
            client.remove_listener(self._kazoo_listener)
            await running.run_in_executor(None, self._stop_kazoo, client)
            self._client = None
            self._client_id = None
            self._transition(_State.CLOSED)
            raise
        self._transition(_State.OPEN)

    async def close(self) -> None:
        """Stops kazoo, which ends the session: its ephemeral entries are deleted
        before close() returns. Returns at once if already closing or closed."""
        if self._state is _State.NEW:
            self._transition(_State.CLOSED)
            return
        if self._state is not _State.OPEN:
            return
        self._transition(_State.CLOSING)
        self._closing.set()
        current = asyncio.current_task()      # close() from a watch callback
        tasks = [pw.task for pw in self._path_watches.values()
                 if pw.task is not None and pw.task is not current]
        for pw in self._path_watches.values():
            pw.active = False
            if pw.task is not None and pw.task is not current:
                pw.task.cancel()
        self._path_watches.clear()
        self._watch_count = 0
        self._lost_callbacks.clear()
        client = self._client
        assert client is not None and self._loop is not None
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            client.remove_listener(self._kazoo_listener)
            await self._loop.run_in_executor(None, self._stop_kazoo, client)
        finally:
            self._client = None
            self._connected.clear()
            self._transition(_State.CLOSED)

    @staticmethod
    def _stop_kazoo(client: KazooClient) -> None:
        """Blocking (executor): closes the session and joins kazoo's threads."""
        try:
            client.stop()
        except Exception:
            logger.exception("metadata store: stopping the kazoo client failed")
        finally:
            client.close()

    async def _ensure_chroot(self, deadline: float) -> None:
        assert self._client is not None
        components = self._prefix[1:].split("/")
        paths = ["/" + "/".join(components[:depth]) for depth in range(1, len(components) + 1)]
        for path in paths:
            try:
                await self._read(deadline, self._client.create_async, path, b"")
            except kz.NodeExistsError:
                pass

    # reads

    async def get(self, path: str) -> Entry | None:
        zpath = self._edge_path(path)
        self._require_open()

        async def body(deadline: float) -> Entry | None:
            try:
                value, stat = await self._read(deadline, self._kazoo.get_async, zpath,
                                               across_sessions=True)
            except kz.NoNodeError:
                return None
            return _entry(value, stat)

        return await self._op(f"get {path!r}", body)

    async def children(self, path: str) -> list[str]:
        zpath = self._edge_path(path)
        self._require_open()

        async def body(deadline: float) -> list[str]:
            names = await self._read(deadline, self._kazoo.get_children_async, zpath,
                                     across_sessions=True)
            if not self._prefix and path == ROOT:
                names = [name for name in names if name != ZK_RESERVED_NAME]
            return sorted(names)

        return await self._op(f"children of {path!r}", body)

    # writes

    async def create(self, path: str, value: bytes = b"", *,
                     ephemeral: bool = False) -> int:
        zpath = self._edge_path(path)
        value = validate_value(value)
        if not isinstance(ephemeral, bool):
            raise ValueError(f"ephemeral {ephemeral!r}: expected bool")
        self._require_open()
        if path == ROOT:
            raise NodeExistsError("the root entry '/' always exists")

        async def body(deadline: float) -> int:
            generation = self._session_gen
            retried = False
            while True:
                try:
                    await self._create_with_parents(path, zpath, value, ephemeral, deadline)
                    return 0
                except _CONNECTION_ERRORS:
                    await self._reconnected(deadline)
                    if ephemeral and self._session_gen != generation:
                        # Not retried under the fresh session: had the first attempt
                        # been applied, its entry went with the old session.
                        raise kz.SessionExpiredError() from None
                    retried = True
                except kz.NodeExistsError:
                    if retried and await self._created_by_us(zpath, value, ephemeral,
                                                             deadline):
                        return 0
                    raise

        return await self._op(f"create {path!r}", body)

    async def _create_with_parents(self, path: str, zpath: str, value: bytes,
                                   ephemeral: bool, deadline: float) -> None:
        for _round in range(limits.ZK_RETRIES_MAX):
            try:
                await self._await(self._kazoo.create_async(zpath, value,
                                                           ephemeral=ephemeral), deadline)
                return
            except kz.NoNodeError:
                pass
            # Missing parents: create them all, shallowest first, in one pipeline.
            pending = [self._await(self._kazoo.create_async(self._zpath(ancestor), b""),
                                   deadline) for ancestor in ancestors_of(path)]
            outcomes = await asyncio.gather(*pending, return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, (kz.NodeExistsError, kz.NoNodeError)):
                    continue                  # there already / a parent vanished: retry
                if isinstance(outcome, BaseException):
                    raise outcome
        raise MetaStoreError(f"create {path!r}: its parents kept vanishing")

    async def _created_by_us(self, zpath: str, value: bytes, ephemeral: bool,
                             deadline: float) -> bool:
        """After a retry of a create found the entry: was it our first attempt?"""
        try:
            data, stat = await self._read(deadline, self._kazoo.get_async, zpath)
        except kz.NoNodeError:
            return False
        if ephemeral:
            return (self._client_id is not None
                    and stat.ephemeralOwner == self._client_id[0])
        return stat.ephemeralOwner == 0 and stat.version == 0 and (data or b"") == value

    async def set(self, path: str, value: bytes,
                  expected_version: int | None = None) -> int:
        zpath = self._edge_path(path)
        value = validate_value(value)
        validate_version(expected_version, optional=True)
        self._require_open()
        version = -1 if expected_version is None else expected_version

        async def body(deadline: float) -> int:
            retried = False
            while True:
                try:
                    stat = await self._await(self._kazoo.set_async(zpath, value, version),
                                             deadline)
                    return stat.version
                except _CONNECTION_ERRORS:
                    await self._reconnected(deadline)
                    retried = True
                except kz.BadVersionError:
                    if retried and expected_version is not None:
                        try:
                            data, stat = await self._read(deadline, self._kazoo.get_async,
                                                          zpath)
                        except kz.NoNodeError:
                            raise kz.BadVersionError() from None
                        if stat.version == expected_version + 1 and (data or b"") == value:
                            return stat.version
                    raise

        return await self._op(f"set {path!r}", body)

    async def delete(self, path: str, expected_version: int | None = None, *,
                     recursive: bool = False) -> None:
        validate_op(Delete(path, expected_version))
        zpath = self._edge_path(path)
        self._require_open()

        async def body(deadline: float) -> None:
            if recursive:
                await self._delete_tree(path, zpath, expected_version, deadline)
                return
            version = -1 if expected_version is None else expected_version
            retried = False
            while True:
                try:
                    await self._await(self._kazoo.delete_async(zpath, version), deadline)
                    return
                except _CONNECTION_ERRORS:
                    await self._reconnected(deadline)
                    retried = True
                except kz.NoNodeError:
                    if retried:
                        return                # our first attempt had deleted it
                    raise

        await self._op(f"delete {path!r}", body)

    async def _delete_tree(self, path: str, zpath: str, expected_version: int | None,
                           deadline: float) -> None:
        """Deletes `zpath` and everything below it, deepest first, in multis that each
        check the version of `zpath` first: nothing is deleted once `zpath` changed."""
        retried = False
        for _round in range(limits.ZK_RETRIES_MAX):
            try:
                stat = await self._read(deadline, self._kazoo.exists_async, zpath)
                if stat is None:
                    if retried:
                        return                # deleted by our attempt before the loss
                    raise kz.NoNodeError()
                if expected_version is not None and stat.version != expected_version:
                    raise kz.BadVersionError()
                pinned = stat.version
                below = await self._subtree(zpath, deadline)
                deletes = list(reversed(below))
                chunk = limits.ZK_MULTI_OPS_MAX - 1
                batches = [deletes[i:i + chunk] for i in range(0, len(deletes), chunk)]
                if not batches or len(batches[-1]) == chunk:
                    batches.append([])
                for index, batch in enumerate(batches):
                    last = index == len(batches) - 1
                    txn = self._kazoo.transaction()
                    if not last:
                        txn.check(zpath, pinned)
                    for descendant in batch:
                        txn.delete(descendant)
                    if last:
                        txn.delete(zpath, pinned)
                    results = await self._await(txn.commit_async(), deadline)
                    failure = _first_failure(results)
                    if failure is None:
                        continue
                    _index, error = failure
                    if isinstance(error, kz.BadVersionError) and expected_version is not None:
                        raise kz.BadVersionError()
                    break         # raced with a writer (or the root went): read again
                else:
                    return
            except _CONNECTION_ERRORS:
                await self._reconnected(deadline)
                retried = True
        raise MetaStoreError(f"delete {path!r}: the subtree kept changing")

    async def _subtree(self, zpath: str, deadline: float) -> list[str]:
        """Every znode below `zpath`, breadth first (parents before children)."""
        found: list[str] = []
        level = [zpath]
        while level:
            listings = await asyncio.gather(
                *[self._read(deadline, self._kazoo.get_children_async, parent)
                  for parent in level], return_exceptions=True)
            next_level = []
            for parent, names in zip(level, listings):
                if isinstance(names, kz.NoNodeError):
                    continue                      # deleted meanwhile
                if isinstance(names, BaseException):
                    raise names
                next_level.extend(_join(parent, name) for name in names)
            found.extend(next_level)
            level = next_level
        return found

    async def commit(self, ops: list[Op]) -> list[int]:
        ops = [self._edge_op(op) for op in ops]
        self._require_open()
        if not ops:
            return []
        estimate = sum(len(self._zpath(op.path).encode()) + limits.ZK_OP_OVERHEAD_BYTES
                       + (len(op.value) if isinstance(op, (Create, Set)) else 0)
                       for op in ops)
        if estimate > limits.ZK_REQUEST_BYTES_MAX:
            raise ValueError(f"commit of about {estimate} bytes; expected at most"
                             f" {limits.ZK_REQUEST_BYTES_MAX}")

        async def body(deadline: float) -> list[int]:
            for _round in range(limits.ZK_RETRIES_MAX):
                pins = await self._delete_pins(ops, deadline)
                txn = self._kazoo.transaction()
                for index, op in enumerate(ops):
                    zpath = self._zpath(op.path)
                    match op:
                        case Check():
                            txn.check(zpath, op.version)
                        case Create():
                            txn.create(zpath, op.value, ephemeral=op.ephemeral)
                        case Set():
                            txn.set_data(zpath, op.value, _version_arg(op.expected_version))
                        case Delete():
                            txn.delete(zpath, pins[index])
                try:
                    results = await self._await(txn.commit_async(), deadline)
                except _CONNECTION_ERRORS:
                    await self._reconnected(deadline)
                    raise ConnectionLossError(
                        "the connection to ZooKeeper was lost during a commit; it may"
                        " or may not have been applied") from None
                failure = _first_failure(results)
                if failure is None:
                    return [_op_result(op, result, pin)
                            for op, result, pin in zip(ops, results, pins)]
                index, error = failure
                op = ops[index]
                if (isinstance(error, kz.BadVersionError) and isinstance(op, Delete)
                        and op.expected_version is None):
                    continue              # a pinned version went stale: read again
                raise error
            raise BadVersionError(f"commit: entries kept changing under"
                                  f" {limits.ZK_RETRIES_MAX} attempts")

        return await self._op("commit", body)

    async def _delete_pins(self, ops: list[Op], deadline: float) -> list[int]:
        """The version each Delete of `ops` is sent with: its expected version, else the
        version the entry will have when the Delete runs (read now, then followed
        through the ops before it), else 0 for an entry that is missing now (the multi
        then fails with NoNodeError, unless it appeared meanwhile)."""
        unpinned = sorted({op.path for op in ops
                           if isinstance(op, Delete) and op.expected_version is None})
        stats = await asyncio.gather(*[self._read(deadline, self._kazoo.exists_async,
                                                  self._zpath(path)) for path in unpinned])
        known = {path: stat.version for path, stat in zip(unpinned, stats)
                 if stat is not None}
        pins = [-1] * len(ops)                  # -1: not a Delete
        for index, op in enumerate(ops):
            match op:
                case Check():
                    known[op.path] = op.version
                case Create():
                    known[op.path] = 0
                case Set():
                    if op.expected_version is not None:
                        known[op.path] = op.expected_version + 1
                    elif op.path in known:
                        known[op.path] += 1
                case Delete():
                    if op.expected_version is not None:
                        pins[index] = op.expected_version
                    else:
                        pins[index] = known.get(op.path, 0)
                    known.pop(op.path, None)
        return pins

    # watches and session loss

    def watch(self, path: str, callback: Callable[[], None]) -> Callable[[], None]:
        zpath = self._edge_path(path)
        if not callable(callback):
            raise ValueError(f"callback {callback!r}: expected a callable")
        self._require_open()
        if self._watch_count >= limits.METASTORE_WATCHES_MAX:
            raise TooManyWatchesError(
                f"{self._watch_count} live watches; at most {limits.METASTORE_WATCHES_MAX}")
        pw = self._path_watches.get(zpath)
        if pw is None:
            client = self._kazoo
            pw = _PathWatch(zpath, _ZkWatcher(self, zpath), baseline_zxid=client.last_zxid)
            self._path_watches[zpath] = pw
            self._request_arm(pw, fire=False)
        key = next(self._keys)
        pw.callbacks[key] = callback
        self._watch_count += 1

        def cancel() -> None:
            if pw.callbacks.pop(key, None) is None:
                return
            self._watch_count -= 1
            if not pw.callbacks and self._path_watches.get(zpath) is pw:
                # The ZooKeeper watches stay armed until they fire; their events then
                # find no live _PathWatch and are dropped.
                del self._path_watches[zpath]
                pw.active = False
                if pw.task is not None:
                    pw.task.cancel()

        return cancel

    def on_session_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        if not callable(callback):
            raise ValueError(f"callback {callback!r}: expected a callable")
        if self._state in (_State.CLOSING, _State.CLOSED):
            raise MetaStoreClosedError(f"metadata store {self._url!r} is closed")
        if len(self._lost_callbacks) >= limits.METASTORE_WATCHES_MAX:
            raise TooManyWatchesError(f"{len(self._lost_callbacks)} session-lost"
                                      f" callbacks; at most {limits.METASTORE_WATCHES_MAX}")
        key = next(self._keys)
        self._lost_callbacks[key] = callback
        return lambda: self._lost_callbacks.pop(key, None)

    def _request_arm(self, pw: _PathWatch, *, fire: bool) -> None:
        """(Re-)arms the ZooKeeper watches of `pw`, then calls its callbacks if `fire`
        (an event came) or if the arm read a state other than the one last seen. The
        callbacks run only once the arm's reads are answered: a change made before
        those reads (by any client) is seen by what a callback reads, and a change made
        after them fires the new watches."""
        pw.fire = pw.fire or fire
        if pw.task is not None:
            pw.again = True
            return
        assert self._loop is not None
        pw.reads = self._issue_arm(pw)
        pw.task = self._loop.create_task(self._arm_loop(pw),
                                         name=f"metastore-watch {pw.zpath}")

    async def _arm_loop(self, pw: _PathWatch) -> None:
        try:
            while pw.active:
                pw.again = False
                try:
                    reads, pw.reads = pw.reads or self._issue_arm(pw), None
                    changed = await self._finish_arm(pw, reads)
                except (kz.ConnectionClosedError, MetaStoreClosedError):
                    return                        # the store is closing
                except (*_CONNECTION_ERRORS, kz.SessionExpiredError):
                    # kazoo fails requests while the connection is down: arm again
                    # once it is back (under a fresh session, if it came to that).
                    if not await self._wait_connected_or_closed():
                        return
                    await asyncio.sleep(limits.ZK_RETRY_DELAY_S)
                    pw.again = True
                except kz.KazooException:
                    logger.exception("metadata store %s: arming the watch on %r failed",
                                     self._url, pw.zpath)
                    await asyncio.sleep(limits.ZK_RETRY_DELAY_S)
                    pw.again = True
                else:
                    if (changed or pw.fire) and pw.active:
                        pw.fire = False           # events during the arm: reported too
                        self._call_watch_callbacks(pw)
                if not pw.again:
                    return
        finally:
            pw.task = None
            pw.reads = None

    def _issue_arm(self, pw: _PathWatch) -> _ArmReads:
        """Sends the reads of one arm, in this order: exists(path) with a watch (data
        changes, deletion, creation), get_children(path) with a watch and the stat it
        was read with (child changes: read together with their watch, nothing falls in
        between), and last exists(parent) without a watch, which, for an absent path,
        shows whether it went away since it was last seen (a deletion changes the
        parent's pzxid, and this read comes after the one that found it absent)."""
        client = self._kazoo
        node = self._future(client.exists_async(pw.zpath, watch=pw.watcher))
        children = self._future(client.get_children_async(pw.zpath, watch=pw.watcher,
                                                          include_data=True))
        parent = None
        if pw.zpath != (self._prefix or ROOT):
            parent = self._future(client.exists_async(_parent(pw.zpath)))
        return _ArmReads(parent, node, children)

    async def _finish_arm(self, pw: _PathWatch, reads: _ArmReads) -> bool:
        """Awaits the reads of an arm; True if they show a change since the last arm
        (or, for the first, since the zxid this client had seen at watch())."""
        try:
            stat: ZnodeStat | None = await reads.node
            try:
                _names, children_stat = await reads.children
                stat = children_stat              # the later read, with the child watch
            except kz.NoNodeError:
                pass                              # deleted or absent: exists watches it
            parent_stat = await reads.parent if reads.parent is not None else None
        except BaseException:
            for future in (reads.parent, reads.node, reads.children):
                if future is not None:
                    future.cancel()               # the outcome no longer matters
            raise
        if stat is not None:
            seen: tuple = ("present", stat.czxid, stat.mzxid, stat.pzxid, stat.version,
                           stat.cversion)
            marks = (stat.czxid, stat.mzxid, stat.pzxid)
        else:
            if parent_stat is None and reads.parent is not None:
                ancestor, parent_stat = await self._deepest_existing(pw.zpath)
            else:
                ancestor = _parent(pw.zpath) if reads.parent is not None else pw.zpath
            if parent_stat is None:
                seen, marks = ("absent", ancestor), ()
            else:
                seen = ("absent", ancestor, parent_stat.pzxid, parent_stat.cversion)
                marks = (parent_stat.pzxid,)
        previous, pw.seen = pw.seen, seen
        if previous is None:
            return any(mark > pw.baseline_zxid for mark in marks)
        return seen != previous

    async def _deepest_existing(self, zpath: str) -> tuple[str, ZnodeStat | None]:
        """The deepest ancestor of `zpath` that exists, and its stat."""
        root = self._prefix or ROOT
        path = _parent(zpath)
        while path != root and path != ROOT:
            path = _parent(path)
            stat = await self._future(self._kazoo.exists_async(path))
            if stat is not None:
                return path, stat
        return path, await self._future(self._kazoo.exists_async(path))

    def _call_watch_callbacks(self, pw: _PathWatch) -> None:
        for key, callback in list(pw.callbacks.items()):
            if not pw.active or key not in pw.callbacks:   # cancelled by a callback
                continue
            try:
                callback()
            except Exception:
                logger.exception("metadata store %s: watch callback on %r failed",
                                 self._url, pw.zpath)

    async def _wait_connected_or_closed(self) -> bool:
        """Waits until connected (True) or closing (False)."""
        while not self._connected.is_set():
            if self._closing.is_set():
                return False
            await _first_of(self._connected.wait(), self._closing.wait())
        return not self._closing.is_set()

    # kazoo threads -> the loop

    def _from_kazoo(self, function: Callable[..., None], *args: object) -> None:
        """Runs `function(*args)` on the loop; called on a kazoo thread."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(function, *args)
        except RuntimeError:          # the loop is closed: nobody is listening
            pass

    def _kazoo_listener(self, state: str) -> None:
        """kazoo's session-state listener (its connection thread)."""
        client = self._client
        client_id = client.client_id if client is not None else None
        self._from_kazoo(self._on_state, state, client_id)

    def _on_state(self, state: str, client_id: tuple[int, bytes] | None) -> None:
        if self._state in (_State.CLOSING, _State.CLOSED):
            return
        if state == KazooState.CONNECTED and client_id is not None:
            lost = self._client_id is not None and client_id[0] != self._client_id[0]
            previous = self.session_id
            self._client_id = client_id
            self._connected.set()
            if lost:
                self._session_gen += 1
                self._session_changed.set()
                self._session_changed = asyncio.Event()
                logger.warning("metadata store %s: session %s expired; started session %s",
                               self._url, previous, self.session_id)
                assert self._loop is not None
                for callback in list(self._lost_callbacks.values()):
                    self._loop.call_soon(self._call_lost_callback, callback)
        elif state in (KazooState.SUSPENDED, KazooState.LOST):
            self._connected.clear()

    def _call_lost_callback(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            logger.exception("metadata store %s: session-lost callback failed", self._url)

    def _on_zk_event(self, zpath: str, event: WatchedEvent) -> None:
        pw = self._path_watches.get(zpath)
        if pw is None or not pw.active or event is pw.last_event:
            return                 # a deletion calls both watches with one event
        pw.last_event = event
        # EventType.NONE: kazoo dropped its watches (connection lost or session
        # expired); re-arm, and report only what the re-arm finds changed.
        self._request_arm(pw, fire=event.type != EventType.NONE)

    # requests

    @property
    def _kazoo(self) -> KazooClient:
        client = self._client
        if client is None:
            raise MetaStoreClosedError(f"metadata store {self._url!r} is {self._state.value}")
        return client

    def _future(self, result: IAsyncResult) -> asyncio.Future:
        """An asyncio future settled on the loop with the outcome of `result`."""
        loop = self._loop
        assert loop is not None
        future = loop.create_future()

        def settle(done: IAsyncResult) -> None:       # a kazoo thread
            try:
                loop.call_soon_threadsafe(_settle, future, done)
            except RuntimeError:                      # the loop is closed
                pass

        result.rawlink(settle)
        future.add_done_callback(_retrieved)
        return future

    async def _await(self, result: IAsyncResult, deadline: float) -> Any:
        """The outcome of one kazoo request; ConnectionLossError past `deadline`."""
        assert self._loop is not None
        future = self._future(result)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancel that
            # lands as the reply does, and a node's stop then waited for a task that had
            # swallowed its cancel (seen in the disk-fault trials, tests/diskfault)
            async with asyncio.timeout(max(deadline - self._loop.time(), 0)):
                return await future
        except TimeoutError:
            raise ConnectionLossError(
                f"no answer from ZooKeeper ({self._hosts}) within"
                f" {limits.ZK_OPERATION_TIMEOUT_S} s; the operation may or may not have been"
                " applied") from None

    async def _read(self, deadline: float, method: Callable[..., IAsyncResult],
                    *args: Any, across_sessions: bool = False) -> Any:
        """A request that changes nothing, so it is retried after a reconnect; with
        `across_sessions`, after a session expiry too (get() and children() do not
        raise SessionExpiredError, as with the embedded store: a read is not bound to
        the session)."""
        while True:
            try:
                return await self._await(method(*args), deadline)
            except _CONNECTION_ERRORS:
                await self._reconnected(deadline)
            except kz.ConnectionClosedError:
                raise
            except kz.SessionExpiredError:
                if not across_sessions:
                    raise
                await self._reconnected(deadline)

    async def _reconnected(self, deadline: float) -> None:
        """Waits until kazoo is connected again (after a short pause, so a failure that
        the state listener has not reported yet is not retried at once)."""
        assert self._loop is not None
        await asyncio.sleep(limits.ZK_RETRY_DELAY_S)
        while not self._connected.is_set():
            if self._closing.is_set() or self._state not in (_State.STARTING,
                                                              _State.OPEN):
                raise kz.ConnectionClosedError()
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise ConnectionLossError(
                    f"no connection to ZooKeeper ({self._hosts}) within"
                    f" {limits.ZK_OPERATION_TIMEOUT_S} s")
            await _first_of(self._connected.wait(), self._closing.wait(),
                            timeout=remaining)

    async def _op(self, what: str, body: Callable[[float], Awaitable[T]]) -> T:
        """Runs one operation with its deadline and turns kazoo's errors into the
        store's."""
        assert self._loop is not None
        deadline = self._loop.time() + limits.ZK_OPERATION_TIMEOUT_S
        generation = self._session_gen
        lost = self.session_id
        try:
            return await body(deadline)
        except kz.ConnectionClosedError:
            raise MetaStoreClosedError(f"{what}: metadata store {self._url!r} is"
                                       f" {self._state.value}") from None
        except kz.SessionExpiredError:
            await self._new_session_after(generation)
            raise SessionExpiredError(
                f"{what}: session {lost} expired; its ephemeral entries are gone; now in"
                f" session {self.session_id}") from None
        except kz.KazooException as exc:
            raise self._translate(exc, what) from None

    async def _new_session_after(self, generation: int) -> None:
        """Waits (bounded) until a session newer than `generation` is connected."""
        assert self._loop is not None
        deadline = self._loop.time() + limits.ZK_NEW_SESSION_WAIT_S
        while self._session_gen == generation or not self._connected.is_set():
            remaining = deadline - self._loop.time()
            if remaining <= 0 or self._closing.is_set():
                return
            await _first_of(self._session_changed.wait(), self._connected.wait(),
                            self._closing.wait(), timeout=remaining)
            if self._session_gen == generation or not self._connected.is_set():
                await asyncio.sleep(limits.ZK_RETRY_DELAY_S)

    def _translate(self, exc: BaseException, what: str) -> BaseException:
        match exc:
            case kz.NodeExistsError():
                return NodeExistsError(f"{what}: the entry exists")
            case kz.NoNodeError():
                return NoNodeError(f"{what}: no such entry")
            case kz.BadVersionError():
                return BadVersionError(f"{what}: the entry's version is not the one"
                                       " expected")
            case kz.NotEmptyError():
                return NotEmptyError(f"{what}: the entry has children")
            case kz.NoChildrenForEphemeralsError():
                return NoChildrenForEphemeralsError(
                    f"{what}: an ephemeral entry cannot have children")
            case kz.BadArgumentsError():
                return ValueError(f"{what}: ZooKeeper refused the arguments")
            case kz.ConnectionLoss() | kz.SessionMovedError() | kz.OperationTimeoutError():
                return ConnectionLossError(f"{what}: {type(exc).__name__}; it may or may"
                                           " not have been applied")
        return MetaStoreError(f"{what}: ZooKeeper error {type(exc).__name__}: {exc}")

    # checks

    def _zpath(self, path: str) -> str:
        """The znode of a store path: below the prefix."""
        if not self._prefix:
            return path
        return self._prefix if path == ROOT else self._prefix + path

    def _edge_path(self, path: str) -> str:
        validate_path(path)
        size = len(path.encode())
        if size > limits.METASTORE_PATH_BYTES_MAX:
            raise ValueError(f"path of {size} bytes; expected at most"
                             f" {limits.METASTORE_PATH_BYTES_MAX}")
        _check_zk_chars(path)
        if not self._prefix and (path == "/" + ZK_RESERVED_NAME
                                 or path.startswith(f"/{ZK_RESERVED_NAME}/")):
            raise ValueError(f"path {path!r}: reserved by ZooKeeper")
        return self._zpath(path)

    def _edge_op(self, op: Op) -> Op:
        validate_op(op)
        self._edge_path(op.path)
        if isinstance(op, (Create, Set)):
            return dataclasses.replace(op, value=validate_value(op.value))
        return op

    def _require_open(self) -> None:
        if self._state is not _State.OPEN:
            raise MetaStoreClosedError(
                f"metadata store {self._url!r} is {self._state.value}")

    def _transition(self, new: _State) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise AssertionError(f"metastore transition {self._state} -> {new}")
        self._state = new


# --- helpers --------------------------------------------------------------------------

def _settle(future: asyncio.Future, done: IAsyncResult) -> None:
    """On the loop: copies a kazoo outcome into its future (unless cancelled)."""
    if future.done():
        return
    if done.successful():
        future.set_result(done.value)
    else:
        future.set_exception(done.exception)


def _retrieved(future: asyncio.Future) -> None:
    """Marks a request's exception as retrieved: an arm that gave up on one request
    leaves the others unawaited, and asyncio would log their errors."""
    if not future.cancelled():
        future.exception()


async def _first_of(*waits: Awaitable[object], timeout: float | None = None) -> None:
    """Returns when the first of `waits` is done (or at `timeout`); cancels the rest."""
    tasks = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


def _entry(value: bytes | None, stat: ZnodeStat) -> Entry:
    return Entry(value=value or b"", version=stat.version,
                 ephemeral=stat.ephemeralOwner != 0)


def _version_arg(version: int | None) -> int:
    return -1 if version is None else version


def _first_failure(results: list[Any]) -> tuple[int, BaseException] | None:
    """The failing op of a multi's results (the others are RolledBackError or
    RuntimeInconsistency), or None if it was applied."""
    for index, result in enumerate(results):
        if isinstance(result, BaseException) and not isinstance(
                result, (kz.RolledBackError, kz.RuntimeInconsistency)):
            return index, result
    if any(isinstance(result, BaseException) for result in results):
        return 0, kz.RuntimeInconsistency()
    return None


def _op_result(op: Op, result: Any, pin: int) -> int:
    match op:
        case Check():
            return op.version
        case Create():
            return 0
        case Set():
            return result.version
        case Delete():
            return pin
    raise AssertionError(f"unvalidated op {op!r}")


def _parent(zpath: str) -> str:
    head = zpath.rpartition("/")[0]
    return head or ROOT


def _join(parent: str, name: str) -> str:
    return (parent if parent != ROOT else "") + "/" + name
