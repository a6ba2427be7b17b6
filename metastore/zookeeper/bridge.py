"""The ZooKeeper store's bridge between kazoo's threads and the event loop, its lifecycle
and its session.

kazoo runs a connection thread and two callback threads; this module is the only one that
touches them. Every request is issued with a kazoo `*_async` method from the event loop and
its IAsyncResult is turned into an asyncio future settled on the loop
(`loop.call_soon_threadsafe`); session-state changes hop to the loop the same way, so store
state is only ever touched on the loop, and no method blocks it (start() and close() run
kazoo's blocking start/stop in an executor). Requests wait at most ZK_OPERATION_TIMEOUT_S;
reads are retried after a reconnect (`_read`), writes through `_op`, which waits (bounded)
for a fresh session after an expiry. `ZkBridge` is a part of `ZooKeeperMetaStore`
(store.py)."""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Any, Awaitable, Callable, TypeVar

import kazoo.exceptions as kz
from kazoo.client import KazooClient
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from metastore.base import (
    BadVersionError,
    ConnectionLossError,
    MetaStoreClosedError,
    MetaStoreError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    TooManyWatchesError,
)
from sms import limits
from metastore.zookeeper.url import zk_auth

logger = logging.getLogger("metastore.zookeeper")

# --- lifecycle -----------------------------------------------------------------------

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


_CONNECTION_ERRORS = (kz.ConnectionLoss, kz.SessionMovedError, kz.OperationTimeoutError)


T = TypeVar("T")


class ZkBridge:
    """The lifecycle, the session and the requests of `ZooKeeperMetaStore` (its state is
    made in its __init__)."""

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


