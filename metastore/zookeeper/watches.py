"""The ZooKeeper store's watches: ZooKeeper's one-shot watches made into the MetaStore's
standing ones.

Each watched path holds one exists() and one get_children() watch, re-armed after every
event and after every reconnect. A re-arm that was not caused by an event (watch()
itself, a reconnect, a new session) compares what it reads with what was last seen
(zxids and versions) and reports a difference, so changes made while no watch was armed
are not missed; the first arm compares with the last zxid this client had seen when
watch() was called. Callbacks run once the re-arm's reads are answered. `ZkWatches` is a
part of `ZooKeeperMetaStore` (store.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable

import kazoo.exceptions as kz
from kazoo.protocol.states import EventType, WatchedEvent, ZnodeStat

from metastore.base import ROOT, MetaStoreClosedError, TooManyWatchesError
from sms import limits
from metastore.zookeeper.bridge import _CONNECTION_ERRORS
from metastore.zookeeper.ops import _parent

if TYPE_CHECKING:
    from metastore.zookeeper.store import ZooKeeperMetaStore

logger = logging.getLogger("metastore.zookeeper")

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



class ZkWatches:
    """watch() and the arms behind it."""

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

    def _on_zk_event(self, zpath: str, event: WatchedEvent) -> None:
        pw = self._path_watches.get(zpath)
        if pw is None or not pw.active or event is pw.last_event:
            return                 # a deletion calls both watches with one event
        pw.last_event = event
        # EventType.NONE: kazoo dropped its watches (connection lost or session
        # expired); re-arm, and report only what the re-arm finds changed.
        self._request_arm(pw, fire=event.type != EventType.NONE)

