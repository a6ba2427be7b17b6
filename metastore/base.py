"""The metadata store interface: a small ZooKeeper-shaped tree of versioned entries.

Every control-plane component (stream admin, chain manager, lease claimers) keeps its
shared state here: entries addressed by absolute "/"-separated paths, each with a value
of bytes, a version (0 after create, +1 on each set) and an optional owner session that
makes it ephemeral (it vanishes when the session ends or expires). The module owns the
abstract `MetaStore` every backend implements (`embedded.py` over one LMDB file; a
ZooKeeper backend over kazoo), the `Entry` and operation types of `commit()`, the error
classes, and the path and value checks both backends apply at the edge. Backends are
used from asyncio code only: every method runs on the event loop, and every callback
(watches, session loss) is called on that loop.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, TypeAlias

from sms.limits import METASTORE_VALUE_BYTES_MAX

ROOT = "/"


# --- entries and multi-op operations --------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One entry as read: its value, its version, and whether it is ephemeral."""

    value: bytes
    version: int          # 0 after create, +1 on each set
    ephemeral: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """commit() op: fail unless the entry at `path` exists with exactly `version`."""

    path: str
    version: int


@dataclasses.dataclass(frozen=True, slots=True)
class Create:
    """commit() op: create the entry; its parent must exist (no implicit parents)."""

    path: str
    value: bytes = b""
    ephemeral: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Set:
    """commit() op: replace the value, optionally only at `expected_version`."""

    path: str
    value: bytes
    expected_version: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    """commit() op: delete the entry (never recursive), optionally at a version."""

    path: str
    expected_version: int | None = None


Op: TypeAlias = Check | Create | Set | Delete


# --- errors ---------------------------------------------------------------------------

class MetaStoreError(Exception):
    """Base of every metadata store error. `retriable`: retrying may succeed."""

    retriable: bool = False


class NodeExistsError(MetaStoreError):
    """create() of a path that already has an entry."""


class NoNodeError(MetaStoreError):
    """set(), delete(), children() or a Check of a path without an entry, or a create
    inside commit() whose parent is missing."""


class BadVersionError(MetaStoreError):
    """The entry's version is not the expected one; re-read and decide again."""

    retriable = True


class NotEmptyError(MetaStoreError):
    """delete() without recursive=True of an entry that has children."""


class NoChildrenForEphemeralsError(MetaStoreError):
    """create() below an ephemeral entry: ephemeral entries cannot have children."""


class TooManyWatchesError(MetaStoreError):
    """watch() or on_session_lost() past METASTORE_WATCHES_MAX live registrations."""


class SessionExpiredError(MetaStoreError):
    """This client's session had expired, so its ephemeral entries are gone. The
    operation that found out was not applied; the client has already started a fresh
    session, so a retry runs under the new one."""

    retriable = True


class ConnectionLossError(MetaStoreError):
    """The connection to the store was lost while the operation was in flight (the
    ZooKeeper backend), or no server answered in time: it may or may not have been
    applied. Re-read, then decide again."""

    retriable = True


class MetaStoreClosedError(MetaStoreError):
    """An operation on a store that is not open (not started yet, or closed)."""


# --- checks at the edge ---------------------------------------------------------------

def validate_path(path: object) -> str:
    """Returns `path` if it is absolute, "/"-separated, without a trailing slash, with
    non-empty components free of NUL and not "." or ".."; raises ValueError otherwise."""
    if not isinstance(path, str):
        raise ValueError(f"path {path!r}: expected str")
    if not path.startswith("/"):
        raise ValueError(f"path {path!r}: expected an absolute path starting with '/'")
    if path == ROOT:
        return path
    if path.endswith("/"):
        raise ValueError(f"path {path!r}: trailing '/'")
    for component in path[1:].split("/"):
        if not component:
            raise ValueError(f"path {path!r}: empty component")
        if "\x00" in component:
            raise ValueError(f"path {path!r}: NUL in a component")
        if component in (".", ".."):
            raise ValueError(f"path {path!r}: relative component {component!r}")
    return path


def validate_value(value: object) -> bytes:
    """Returns `value` as bytes if it is bytes-like and at most METASTORE_VALUE_BYTES_MAX
    long; raises ValueError otherwise."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"value of type {type(value).__name__}: expected bytes")
    value = bytes(value)
    if len(value) > METASTORE_VALUE_BYTES_MAX:
        raise ValueError(
            f"value of {len(value)} bytes; expected at most {METASTORE_VALUE_BYTES_MAX}")
    return value


def validate_version(version: object, *, optional: bool) -> int | None:
    """Returns `version` if it is an int >= 0 (or None when `optional`)."""
    if version is None and optional:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version {version!r}: expected an int >= 0")
    return version


def validate_op(op: object) -> Op:
    """Checks one commit() op at the edge; raises ValueError on a malformed op."""
    match op:
        case Check(path=path, version=version):
            validate_path(path)
            validate_version(version, optional=False)
        case Create(path=path, value=value, ephemeral=ephemeral):
            validate_path(path)
            validate_value(value)
            if not isinstance(ephemeral, bool):
                raise ValueError(f"ephemeral {ephemeral!r}: expected bool")
        case Set(path=path, value=value, expected_version=expected_version):
            validate_path(path)
            validate_value(value)
            validate_version(expected_version, optional=True)
        case Delete(path=path, expected_version=expected_version):
            if validate_path(path) == ROOT:
                raise ValueError("cannot delete the root entry '/'")
            validate_version(expected_version, optional=True)
        case _:
            raise ValueError(f"op {op!r}: expected Check, Create, Set or Delete")
    return op


def ancestors_of(path: str) -> list[str]:
    """The proper ancestors of a validated path below the root, shallowest first:
    "/a/b/c" -> ["/a", "/a/b"]."""
    components = path[1:].split("/") if path != ROOT else []
    return ["/" + "/".join(components[:depth]) for depth in range(1, len(components))]


# --- the interface --------------------------------------------------------------------

class MetaStore(abc.ABC):
    """A client of the metadata store with its own session.

    Lifecycle: construct, `await start()`, use, `await close()` (or `async with`).
    Methods other than start() raise MetaStoreClosedError outside that window. Paths
    are checked by validate_path and values by validate_value (ValueError).
    """

    @property
    @abc.abstractmethod
    def session_id(self) -> str:
        """Identifies this client's current session (changes after a session loss)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Opens the store and starts the heartbeat and watch tasks on the running
        loop."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stops the tasks and deletes this session's ephemeral entries at once.
        Idempotent."""

    @abc.abstractmethod
    async def get(self, path: str) -> Entry | None:
        """The entry at `path`, or None if there is none."""

    @abc.abstractmethod
    async def create(self, path: str, value: bytes = b"", *,
                     ephemeral: bool = False) -> int:
        """Creates the entry and returns its version, 0. Missing parents are created
        as empty persistent entries (like kazoo's makepath=True). NodeExistsError if
        the entry exists; NoChildrenForEphemeralsError below an ephemeral entry."""

    @abc.abstractmethod
    async def set(self, path: str, value: bytes,
                  expected_version: int | None = None) -> int:
        """Replaces the value and returns the new version. NoNodeError if there is no
        entry; BadVersionError if `expected_version` is given and differs."""

    @abc.abstractmethod
    async def delete(self, path: str, expected_version: int | None = None, *,
                     recursive: bool = False) -> None:
        """Deletes the entry (and with `recursive`, everything below it). NoNodeError,
        BadVersionError (checked on `path` itself), NotEmptyError without `recursive`.
        The root cannot be deleted (ValueError)."""

    @abc.abstractmethod
    async def children(self, path: str) -> list[str]:
        """The names of the direct children of `path`, sorted; NoNodeError if there is
        no entry at `path`."""

    @abc.abstractmethod
    async def commit(self, ops: list[Op]) -> list[int]:
        """Applies `ops` in order, atomically: all or nothing. Each op sees the effects
        of the ones before it. Returns one int per op: Check -> the checked version,
        Create -> 0, Set -> the new version, Delete -> the version the entry had. On
        failure raises the first failing op's error and applies nothing. A Create's
        parent must exist (or be created earlier in the same commit)."""

    @abc.abstractmethod
    def watch(self, path: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls `callback()` on the loop after any change to the entry at `path`
        (created, set, deleted, expired) or to its set of children; several changes
        may be reported by one call. The watch lasts until the returned cancel function
        is called. TooManyWatchesError past METASTORE_WATCHES_MAX live watches."""

    @abc.abstractmethod
    def on_session_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls `callback()` on the loop whenever this client finds its session
        expired (its ephemeral entries are gone by then; a fresh session has been
        started). Returns a function that unregisters the callback."""

    async def get_strict(self, path: str) -> Entry:
        """The entry at `path`; NoNodeError if there is none."""
        entry = await self.get(path)
        if entry is None:
            raise NoNodeError(f"no entry at {path!r}")
        return entry

    async def __aenter__(self) -> MetaStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
