"""Embedded metadata store: one LMDB file shared by the SMS processes of one host.

`EmbeddedMetaStore` implements `MetaStore` (base.py) without a ZooKeeper: every client
process opens the same LMDB file, each write is one LMDB write transaction (LMDB's
single writer gives compare-and-set), and each read is one read transaction. The file
holds five named databases: `nodes` (path -> version, revisions, owner session, value),
`children` (parent path + NUL + child name, so children() is one cursor range scan),
`owned` (session id + NUL + path of each ephemeral entry), `sessions` (session id ->
expiry as wall-clock seconds, owner pid) and `meta` (format marker and the global
revision, bumped by every write that changes the tree). A client keeps its session
alive with a heartbeat task; an ephemeral entry whose session's expiry has passed is
invisible to every reader at once and is removed physically by the next writer of any
process, so a kill -9'd process's ephemerals vanish within METASTORE_SESSION_TTL_S.
Watches are served by one poll task per client that reads the revision and the set of
live sessions and, when either changed, compares each watched path's visible state
with the last one it reported. Expiries are compared against `time.time()` in every
process (wall clock, shared by the processes of one host); a clock jump past the TTL
expires sessions. Clients of one process share one LMDB environment (LMDB forbids
opening a file twice in a process); an environment is never used across fork(). A
process stopped while it holds LMDB's writer lock stalls every writer until it runs
again: the embedded store is for one host and cooperating processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import logging
import os
import struct
import time
import uuid
from typing import Callable, Iterator, TypeVar

import lmdb

from metastore.filewatch import FileWatch
from metastore.base import (
    BadVersionError,
    Check,
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
from sms.limits import (
    LMDB_MAX_READERS,
    METASTORE_HEARTBEAT_INTERVAL_S,
    METASTORE_MAP_BYTES,
    METASTORE_POLL_INTERVAL_S,
    METASTORE_WAKE_INTERVAL_S,
    METASTORE_WATCHES_MAX,
)
from sms.errors import invariant
from sms import limits          # (METASTORE_SESSION_TTL_S is read when used: node/config.py may set it)

# Paths are LMDB keys (and parts of index keys), and LMDB keys are at most 511 bytes.
_LMDB_KEY_BYTES_MAX = 511
_SESSION_ID_BYTES = 32                         # uuid4().hex
invariant(_SESSION_ID_BYTES + 1 + limits.METASTORE_PATH_BYTES_MAX <= _LMDB_KEY_BYTES_MAX,
          "a session's index key (its id, a separator, a path) fits in an LMDB key")

_FORMAT = b"sms-metastore/1"
_FORMAT_KEY = b"format"
_REVISION_KEY = b"revision"
_DB_NAMES = (b"meta", b"nodes", b"children", b"owned", b"sessions")
_NUL = b"\x00"

_REVISION = struct.Struct(">Q")
_SESSION = struct.Struct(">dQ")                # expiry (time.time() seconds), owner pid
_RECORD_HEADER = struct.Struct(">QQQQH")       # version, created/modified/children
                                               # revision, owner session id length

logger = logging.getLogger(__name__)


T = TypeVar("T")


# --- stored records -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    """One stored entry. The three revisions (global revision of the write that created
    the entry, last set it, last added or removed a child) let a watcher see a change
    even when the version alone would not (delete then re-create)."""

    version: int
    created_rev: int
    modified_rev: int
    children_rev: int
    owner: bytes          # owner session id of an ephemeral entry, b"" if persistent
    value: bytes

    def encode(self) -> bytes:
        header = _RECORD_HEADER.pack(self.version, self.created_rev, self.modified_rev,
                                     self.children_rev, len(self.owner))
        return header + self.owner + self.value

    @classmethod
    def decode(cls, path_b: bytes, raw: bytes) -> _Record:
        if len(raw) < _RECORD_HEADER.size:
            raise MetaStoreError(f"corrupt record at {path_b!r}: {len(raw)} bytes")
        version, created, modified, children, owner_len = _RECORD_HEADER.unpack_from(raw)
        owner_end = _RECORD_HEADER.size + owner_len
        if len(raw) < owner_end:
            raise MetaStoreError(f"corrupt record at {path_b!r}: owner past the end")
        return cls(version, created, modified, children,
                   raw[_RECORD_HEADER.size:owner_end], raw[owner_end:])


def _join(parent_b: bytes, name_b: bytes) -> bytes:
    return (b"/" if parent_b == b"/" else parent_b + b"/") + name_b


def _split(path_b: bytes) -> tuple[bytes, bytes]:
    head, _, name = path_b.rpartition(b"/")
    return head or b"/", name


def _new_session_id() -> bytes:
    session_id = uuid.uuid4().hex.encode("ascii")
    assert len(session_id) == _SESSION_ID_BYTES
    return session_id


# --- one LMDB environment per file and process ----------------------------------------

class _SharedEnv:
    """The LMDB environment of one store file in this process, shared by its clients."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.refs = 0
        try:
            self.env = lmdb.open(path, subdir=False, map_size=METASTORE_MAP_BYTES,
                                 max_readers=LMDB_MAX_READERS, max_dbs=len(_DB_NAMES),
                                 lock=True, mode=0o600)
            # it holds the cluster's token secret and the keys' hashes: its owner only
            # (lmdb's mode applies to new files; an older store is tightened here)
        except lmdb.Error as exc:
            raise MetaStoreError(f"cannot open metadata store {path!r}: {exc}") from exc
        for name in (path, path + "-lock"):
            try:
                os.chmod(name, 0o600)
            except OSError as exc:       # (not ours to change: say so, and go on)
                logger.warning("cannot make %s private (mode 0600): %s", name, exc)
        try:
            self._init_file()
        except BaseException:
            self.env.close()
            raise

    def _init_file(self) -> None:
        try:
            with self.env.begin(write=True) as txn:
                dbs = {name: self.env.open_db(name, txn=txn, create=True)
                       for name in _DB_NAMES}
                stored_format = txn.get(_FORMAT_KEY, db=dbs[b"meta"])
                if stored_format is None:
                    txn.put(_FORMAT_KEY, _FORMAT, db=dbs[b"meta"])
                    txn.put(_REVISION_KEY, _REVISION.pack(0), db=dbs[b"meta"])
                    txn.put(b"/", _Record(0, 0, 0, 0, b"", b"").encode(),
                            db=dbs[b"nodes"])
                elif stored_format != _FORMAT:
                    raise MetaStoreError(f"{self.path!r} has format {stored_format!r};"
                                         f" expected {_FORMAT!r}")
        except lmdb.Error as exc:
            raise MetaStoreError(f"cannot open metadata store {self.path!r}: {exc}") \
                from exc
        self.meta, self.nodes, self.children, self.owned, self.sessions = (
            dbs[name] for name in _DB_NAMES)


# Keyed by pid too: an environment inherited through fork() must not be used (or closed)
# in the child, which opens its own.
_ENVS: dict[tuple[int, str], _SharedEnv] = {}


def _acquire_env(path: str) -> _SharedEnv:
    key = (os.getpid(), os.path.realpath(path))
    shared = _ENVS.get(key)
    if shared is None:
        shared = _SharedEnv(path)
        _ENVS[key] = shared
    shared.refs += 1
    return shared


def _release_env(shared: _SharedEnv) -> None:
    assert shared.refs > 0, "released an environment more often than acquired"
    shared.refs -= 1
    if shared.refs == 0:
        del _ENVS[(os.getpid(), os.path.realpath(shared.path))]
        shared.env.close()


# --- the tree as seen by one transaction ----------------------------------------------

class _Tree:
    """The entry tree as one LMDB transaction sees it at wall-clock time `now`:
    an ephemeral entry whose owner session is missing or past its expiry is hidden."""

    def __init__(self, shared: _SharedEnv, txn: lmdb.Transaction, now: float) -> None:
        self._shared = shared
        self._txn = txn
        self.now = now
        self._live: dict[bytes, bool] = {}   # session id -> live, cached per txn

    def revision(self) -> int:
        raw = self._txn.get(_REVISION_KEY, db=self._shared.meta)
        if raw is None or len(raw) != _REVISION.size:
            raise MetaStoreError(f"corrupt revision in {self._shared.path!r}")
        return _REVISION.unpack(raw)[0]

    def session_live(self, session_id: bytes) -> bool:
        live = self._live.get(session_id)
        if live is None:
            raw = self._txn.get(session_id, db=self._shared.sessions)
            live = raw is not None and _SESSION.unpack(raw)[0] > self.now
            self._live[session_id] = live
        return live

    def live_sessions(self) -> frozenset[bytes]:
        cursor = self._txn.cursor(db=self._shared.sessions)
        return frozenset(session_id for session_id, raw in cursor
                         if _SESSION.unpack(raw)[0] > self.now)

    def record(self, path_b: bytes) -> _Record | None:
        raw = self._txn.get(path_b, db=self._shared.nodes)
        return None if raw is None else _Record.decode(path_b, raw)

    def visible(self, path_b: bytes) -> _Record | None:
        record = self.record(path_b)
        if record is None or (record.owner and not self.session_live(record.owner)):
            return None
        return record

    def child_names(self, path_b: bytes) -> Iterator[bytes]:
        """Names of the stored children of `path_b`, in byte (= code point) order."""
        yield from self._prefix_scan(self._shared.children, path_b + _NUL)

    def visible_children(self, path_b: bytes) -> list[str]:
        return [name_b.decode() for name_b in self.child_names(path_b)
                if self.visible(_join(path_b, name_b)) is not None]

    def snapshot(self, path_b: bytes) -> tuple | None:
        """What a watch on `path_b` compares: None if there is no visible entry."""
        record = self.visible(path_b)
        if record is None:
            return None
        return (record.created_rev, record.modified_rev, record.children_rev,
                tuple(self.visible_children(path_b)))

    def _prefix_scan(self, db: lmdb._Database, prefix: bytes) -> Iterator[bytes]:
        cursor = self._txn.cursor(db=db)
        if not cursor.set_range(prefix):
            return
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                return
            yield key[len(prefix):]


class _TreeWriter(_Tree):
    """The tree inside one write transaction. Every change is stamped with the next
    global revision; finish() stores that revision if anything changed. Operations
    raise the MetaStoreError of the first check that fails; the caller then aborts the
    transaction, so nothing of a failed operation is applied."""

    def __init__(self, shared: _SharedEnv, txn: lmdb.Transaction, now: float) -> None:
        super().__init__(shared, txn, now)
        self._rev = self.revision() + 1
        self._changed = False

    def finish(self) -> None:
        if self._changed:
            self._txn.put(_REVISION_KEY, _REVISION.pack(self._rev), db=self._shared.meta)

    # sessions

    def put_session(self, session_id: bytes, expiry: float) -> None:
        self._txn.put(session_id, _SESSION.pack(expiry, os.getpid()),
                      db=self._shared.sessions)
        self._live[session_id] = expiry > self.now

    def purge_expired_sessions(self) -> None:
        cursor = self._txn.cursor(db=self._shared.sessions)
        expired = [session_id for session_id, raw in cursor
                   if _SESSION.unpack(raw)[0] <= self.now]
        for session_id in expired:
            self.end_session(session_id)

    def end_session(self, session_id: bytes) -> None:
        """Deletes the session and its ephemeral entries."""
        prefix = session_id + _NUL
        for path_b in list(self._prefix_scan(self._shared.owned, prefix)):
            record = self.record(path_b)
            if record is not None and record.owner == session_id:
                self._remove(path_b, record, bump_parent=False)
            else:
                self._txn.delete(prefix + path_b, db=self._shared.owned)
        self._txn.delete(session_id, db=self._shared.sessions)
        self._live[session_id] = False

    # entries

    def create(self, path: str, value: bytes, owner: bytes, *, make_parents: bool) -> int:
        path_b = path.encode()
        if self._live_record(path_b) is not None:
            raise NodeExistsError(f"entry {path!r} exists")
        for ancestor in ancestors_of(path):
            record = self._live_record(ancestor.encode())
            if record is None:
                if not make_parents:
                    raise NoNodeError(f"no entry {ancestor!r} to hold {path!r}")
                self._insert(ancestor.encode(), b"", b"")
            elif record.owner:
                raise NoChildrenForEphemeralsError(
                    f"{ancestor!r} is ephemeral and cannot hold {path!r}")
        self._insert(path_b, value, owner)
        return 0

    def set(self, path: str, value: bytes, expected_version: int | None) -> int:
        path_b = path.encode()
        record = self._existing(path, expected_version)
        updated = dataclasses.replace(record, version=record.version + 1,
                                      modified_rev=self._rev, value=value)
        self._put(path_b, updated)
        return updated.version

    def delete(self, path: str, expected_version: int | None, *, recursive: bool) -> int:
        path_b = path.encode()
        record = self._existing(path, expected_version)
        if not recursive and self.visible_children(path_b):
            raise NotEmptyError(f"entry {path!r} has children")
        subtree = [path_b]                     # breadth first, so parents come first
        for parent_b in subtree:
            subtree.extend(_join(parent_b, name_b)
                           for name_b in list(self.child_names(parent_b)))
        for descendant_b in reversed(subtree[1:]):
            descendant = self.record(descendant_b)
            invariant(descendant is not None,
                       f"child index names missing entry {descendant_b!r}")
            self._remove(descendant_b, descendant, bump_parent=False)
        self._remove(path_b, record, bump_parent=True)
        return record.version

    def check(self, path: str, version: int) -> int:
        return self._existing(path, version).version

    def _existing(self, path: str, expected_version: int | None) -> _Record:
        record = self._live_record(path.encode())
        if record is None:
            raise NoNodeError(f"no entry {path!r}")
        if expected_version is not None and record.version != expected_version:
            raise BadVersionError(f"entry {path!r} has version {record.version};"
                                  f" expected {expected_version}")
        return record

    def _live_record(self, path_b: bytes) -> _Record | None:
        """The visible record; a hidden one (owner session gone) is removed right away."""
        record = self.record(path_b)
        if record is None or not record.owner or self.session_live(record.owner):
            return record
        self._remove(path_b, record, bump_parent=False)
        return None

    def _insert(self, path_b: bytes, value: bytes, owner: bytes) -> None:
        self._put(path_b, _Record(0, self._rev, self._rev, self._rev, owner, value))
        parent_b, name_b = _split(path_b)
        self._txn.put(parent_b + _NUL + name_b, b"", db=self._shared.children)
        if owner:
            self._txn.put(owner + _NUL + path_b, b"", db=self._shared.owned)
        self._touch_children(parent_b)

    def _remove(self, path_b: bytes, record: _Record, *, bump_parent: bool) -> None:
        """Removes one entry and its index keys. Removing an expired ephemeral does not
        bump the parent's children revision: readers stopped seeing it at expiry."""
        invariant(path_b != b"/", "the root entry is never removed")
        self._txn.delete(path_b, db=self._shared.nodes)
        parent_b, name_b = _split(path_b)
        self._txn.delete(parent_b + _NUL + name_b, db=self._shared.children)
        if record.owner:
            self._txn.delete(record.owner + _NUL + path_b, db=self._shared.owned)
        if bump_parent:
            self._touch_children(parent_b)
        self._changed = True

    def _touch_children(self, parent_b: bytes) -> None:
        parent = self.record(parent_b)
        invariant(parent is not None,
                   f"parent {parent_b!r} of a stored entry is missing")
        self._put(parent_b, dataclasses.replace(parent, children_rev=self._rev))

    def _put(self, path_b: bytes, record: _Record) -> None:
        self._txn.put(path_b, record.encode(), db=self._shared.nodes)
        self._changed = True


# --- the client -----------------------------------------------------------------------

class _State(enum.Enum):
    NEW = "new"            # constructed; start() not called yet
    OPEN = "open"          # environment open, session live, tasks running
    CLOSING = "closing"    # close() is stopping the tasks and ending the session
    CLOSED = "closed"


_TRANSITIONS = {
    _State.NEW: {_State.OPEN, _State.CLOSED},
    _State.OPEN: {_State.CLOSING},
    _State.CLOSING: {_State.CLOSED},
    _State.CLOSED: set(),
}


@dataclasses.dataclass(slots=True, eq=False)
class _Watch:
    path_b: bytes
    callback: Callable[[], None]
    snapshot: tuple | None       # the visible state last reported (or seen at watch())
    active: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class _SessionReplaced:
    """A write found this client's session expired and started `session_id` instead."""

    session_id: bytes


class EmbeddedMetaStore(MetaStore):
    """A client of the embedded store file at `path`, with its own session.

    `loop`: the loop start() must run on (default: whichever runs it). `clock`:
    wall-clock seconds, shared with the other processes through session expiries;
    injectable for tests."""

    def __init__(self, path: str, *, loop: asyncio.AbstractEventLoop | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._path = os.path.abspath(path)
        self._loop = loop
        self._clock = clock
        self._state = _State.NEW
        self._shared: _SharedEnv | None = None
        self._session_id = b""
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: dict[int, _Watch] = {}
        self._lost_callbacks: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count()
        self._seen_revision = -1
        self._seen_live: frozenset[bytes] = frozenset()

    def __repr__(self) -> str:
        return (f"EmbeddedMetaStore({self._path!r}, state={self._state.value},"
                f" session={self.session_id!r})")

    @property
    def path(self) -> str:
        return self._path

    @property
    def session_id(self) -> str:
        return self._session_id.decode("ascii")

    # lifecycle

    async def start(self) -> None:
        if self._state is not _State.NEW:
            raise RuntimeError(f"start() of a store in state {self._state.value}")
        running = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not running:
            raise RuntimeError("start() on a loop other than the one given")
        self._loop = running
        self._shared = _acquire_env(self._path)
        try:
            self._shared.env.reader_check()
            session_id = _new_session_id()
            self._transact(lambda tree: tree.put_session(
                session_id, tree.now + limits.METASTORE_SESSION_TTL_S))
        except BaseException:
            _release_env(self._shared)
            self._shared = None
            self._transition(_State.CLOSED)
            raise
        self._session_id = session_id
        self._transition(_State.OPEN)
        self._tasks = [
            running.create_task(self._heartbeat_loop(), name="metastore-heartbeat"),
            running.create_task(self._poll_loop(), name="metastore-watch-poll"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    async def close(self) -> None:
        """Stops the tasks and ends the session (its ephemeral entries are deleted).
        Returns at once if the store is already closing or closed."""
        if self._state is _State.NEW:
            self._transition(_State.CLOSED)
            return
        if self._state is not _State.OPEN:
            return
        self._transition(_State.CLOSING)
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in self._tasks:
            task.cancel()
        try:
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            session_id = self._session_id
            self._transact(lambda tree: tree.end_session(session_id))
            for outcome in outcomes:           # a task that crashed crashes close()
                if (isinstance(outcome, BaseException)
                        and not isinstance(outcome, asyncio.CancelledError)):
                    raise outcome
        finally:
            self._tasks.clear()
            for watch in self._watches.values():
                watch.active = False
            self._watches.clear()
            self._lost_callbacks.clear()
            assert self._shared is not None
            _release_env(self._shared)
            self._shared = None
            self._transition(_State.CLOSED)

    # reads

    async def get(self, path: str) -> Entry | None:
        path_b = self._edge_path(path)
        self._require_open()
        record = self._read(lambda tree: tree.visible(path_b))
        if record is None:
            return None
        return Entry(value=record.value, version=record.version,
                     ephemeral=bool(record.owner))

    async def children(self, path: str) -> list[str]:
        path_b = self._edge_path(path)
        self._require_open()

        def scan(tree: _Tree) -> list[str]:
            if tree.visible(path_b) is None:
                raise NoNodeError(f"no entry {path!r}")
            return tree.visible_children(path_b)

        return self._read(scan)

    # writes

    async def create(self, path: str, value: bytes = b"", *,
                     ephemeral: bool = False) -> int:
        self._edge_path(path)
        value = validate_value(value)
        if not isinstance(ephemeral, bool):
            raise ValueError(f"ephemeral {ephemeral!r}: expected bool")
        self._require_open()
        return self._write(lambda tree: tree.create(
            path, value, self._session_id if ephemeral else b"", make_parents=True))

    async def set(self, path: str, value: bytes,
                  expected_version: int | None = None) -> int:
        self._edge_path(path)
        value = validate_value(value)
        validate_version(expected_version, optional=True)
        self._require_open()
        return self._write(lambda tree: tree.set(path, value, expected_version))

    async def delete(self, path: str, expected_version: int | None = None, *,
                     recursive: bool = False) -> None:
        validate_op(Delete(path, expected_version))
        self._edge_path(path)
        self._require_open()
        self._write(lambda tree: tree.delete(path, expected_version,
                                             recursive=bool(recursive)))

    async def commit(self, ops: list[Op]) -> list[int]:
        ops = [self._edge_op(op) for op in ops]
        self._require_open()
        if not ops:
            return []
        return self._write(lambda tree: [self._apply(tree, op) for op in ops])

    def _apply(self, tree: _TreeWriter, op: Op) -> int:
        match op:
            case Check():
                return tree.check(op.path, op.version)
            case Create():
                owner = self._session_id if op.ephemeral else b""
                return tree.create(op.path, op.value, owner, make_parents=False)
            case Set():
                return tree.set(op.path, op.value, op.expected_version)
            case Delete():
                return tree.delete(op.path, op.expected_version, recursive=False)
        raise AssertionError(f"unvalidated op {op!r}")

    # watches and session loss

    def watch(self, path: str, callback: Callable[[], None]) -> Callable[[], None]:
        path_b = self._edge_path(path)
        if not callable(callback):
            raise ValueError(f"callback {callback!r}: expected a callable")
        self._require_open()
        if len(self._watches) >= METASTORE_WATCHES_MAX:
            raise TooManyWatchesError(
                f"{len(self._watches)} live watches; at most {METASTORE_WATCHES_MAX}")
        watch = _Watch(path_b, callback, self._read(lambda tree: tree.snapshot(path_b)))
        key = next(self._keys)
        self._watches[key] = watch

        def cancel() -> None:
            watch.active = False
            self._watches.pop(key, None)

        return cancel

    def on_session_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        if not callable(callback):
            raise ValueError(f"callback {callback!r}: expected a callable")
        if self._state in (_State.CLOSING, _State.CLOSED):
            raise MetaStoreClosedError(f"metadata store {self._path!r} is closed")
        if len(self._lost_callbacks) >= METASTORE_WATCHES_MAX:
            raise TooManyWatchesError(f"{len(self._lost_callbacks)} session-lost"
                                      f" callbacks; at most {METASTORE_WATCHES_MAX}")
        key = next(self._keys)
        self._lost_callbacks[key] = callback
        return lambda: self._lost_callbacks.pop(key, None)

    # tasks

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Tasks end only when close() cancels them; anything else is a crash."""
        if not task.cancelled() and task.exception() is not None:
            logger.critical("metadata store %s: task %s crashed", self._path,
                            task.get_name(), exc_info=task.exception())

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(METASTORE_HEARTBEAT_INTERVAL_S)
            try:
                assert self._shared is not None
                self._shared.env.reader_check()      # frees slots of dead readers
                self._write(self._renew_session, raise_if_lost=False)
            except (MetaStoreError, lmdb.Error):
                logger.exception("metadata store %s: heartbeat failed", self._path)

    def _renew_session(self, tree: _TreeWriter) -> None:
        tree.put_session(self._session_id, tree.now + limits.METASTORE_SESSION_TTL_S)

    async def _poll_loop(self) -> None:
        """Watches served every METASTORE_POLL_INTERVAL_S, and at once (at most every
        METASTORE_WAKE_INTERVAL_S) when any process writes the file (metastore/filewatch.py)."""
        woken = asyncio.Event()
        files = FileWatch.open(self._path)
        loop = asyncio.get_running_loop()
        if files is not None:
            def readable() -> None:
                files.drain()
                woken.set()
            loop.add_reader(files.fd, readable)
        try:
            while True:
                # (asyncio.timeout, not wait_for: 3.11's wait_for loses a cancel that comes as
                # the wait ends, and this task is cancelled amid the writes of a shutdown)
                try:
                    async with asyncio.timeout(METASTORE_POLL_INTERVAL_S):
                        await woken.wait()
                except TimeoutError:
                    pass
                else:
                    await asyncio.sleep(METASTORE_WAKE_INTERVAL_S)        # (writes in a burst: one scan)
                woken.clear()
                self._serve_watches()
        finally:
            if files is not None:
                loop.remove_reader(files.fd)
                files.close()

    def _serve_watches(self) -> None:
        try:
            changed = self._changed_watches()
        except MetaStoreError:
            logger.exception("metadata store %s: watch poll failed", self._path)
            return
        for watch in changed:
            if not watch.active:         # cancelled by an earlier callback
                continue
            try:
                watch.callback()
            except Exception:
                logger.exception("metadata store %s: watch callback on %r failed",
                                 self._path, watch.path_b.decode())

    def _changed_watches(self) -> list[_Watch]:
        """The watches whose visible state differs from the one last reported; nothing
        is read past the revision and the live sessions unless one of them changed."""
        if not self._watches:
            return []

        def scan(tree: _Tree) -> list[_Watch]:
            revision, live = tree.revision(), tree.live_sessions()
            if revision == self._seen_revision and live == self._seen_live:
                return []
            self._seen_revision, self._seen_live = revision, live
            snapshots: dict[bytes, tuple | None] = {}
            changed = []
            for watch in list(self._watches.values()):
                if watch.path_b not in snapshots:
                    snapshots[watch.path_b] = tree.snapshot(watch.path_b)
                if snapshots[watch.path_b] != watch.snapshot:
                    watch.snapshot = snapshots[watch.path_b]
                    changed.append(watch)
            return changed

        return self._read(scan)

    # transactions

    def _read(self, scan: Callable[[_Tree], T]) -> T:
        assert self._shared is not None
        try:
            with self._shared.env.begin() as txn:
                return scan(_Tree(self._shared, txn, self._clock()))
        except lmdb.Error as exc:
            raise MetaStoreError(f"metadata store {self._path!r}: {exc}") from exc

    def _transact(self, apply: Callable[[_TreeWriter], T]) -> T:
        """Runs `apply` in one write transaction, after removing expired sessions and
        their ephemerals. Commits if `apply` returns, aborts if it raises."""
        assert self._shared is not None
        try:
            with self._shared.env.begin(write=True) as txn:
                tree = _TreeWriter(self._shared, txn, self._clock())
                tree.purge_expired_sessions()
                result = apply(tree)
                tree.finish()
            return result
        except lmdb.Error as exc:
            raise MetaStoreError(f"metadata store {self._path!r}: {exc}") from exc

    def _write(self, apply: Callable[[_TreeWriter], T], *,
               raise_if_lost: bool = True) -> T | None:
        """Runs `apply` on behalf of this session. If the session has expired, applies
        nothing, starts a fresh session, schedules the on_session_lost callbacks and
        (with `raise_if_lost`) raises SessionExpiredError."""

        def as_session(tree: _TreeWriter) -> T | _SessionReplaced:
            if tree.session_live(self._session_id):
                return apply(tree)
            replacement = _new_session_id()
            tree.put_session(replacement, tree.now + limits.METASTORE_SESSION_TTL_S)
            return _SessionReplaced(replacement)

        outcome = self._transact(as_session)
        if not isinstance(outcome, _SessionReplaced):
            return outcome
        lost = self.session_id
        self._session_id = outcome.session_id
        logger.warning("metadata store %s: session %s expired; started session %s",
                       self._path, lost, self.session_id)
        assert self._loop is not None
        for callback in list(self._lost_callbacks.values()):
            self._loop.call_soon(callback)
        if raise_if_lost:
            raise SessionExpiredError(f"session {lost} expired; its ephemeral entries"
                                      f" are gone; now in session {self.session_id}")
        return None

    # checks

    def _edge_op(self, op: Op) -> Op:
        validate_op(op)
        self._edge_path(op.path)
        if isinstance(op, (Create, Set)):
            return dataclasses.replace(op, value=validate_value(op.value))
        return op

    def _edge_path(self, path: str) -> bytes:
        path_b = validate_path(path).encode()
        if len(path_b) > limits.METASTORE_PATH_BYTES_MAX:
            raise ValueError(f"path of {len(path_b)} bytes; expected at most"
                             f" {limits.METASTORE_PATH_BYTES_MAX}")
        return path_b

    def _require_open(self) -> None:
        if self._state is not _State.OPEN:
            raise MetaStoreClosedError(
                f"metadata store {self._path!r} is {self._state.value}")

    def _transition(self, new: _State) -> None:
        if new not in _TRANSITIONS[self._state]:
            raise AssertionError(f"metastore transition {self._state} -> {new}")
        self._state = new
