"""The ZooKeeper store's operations: reads, writes, atomic commits and recursive deletes,
with the embedded store's semantics (the contract tests hold both to them).

create() makes missing parents; commit() applies ops atomically with one ZooKeeper
`multi` and returns the versions the embedded store returns (a Delete without an expected
version is pinned to the version read just before); delete(recursive=True) deletes the
subtree in multis of at most ZK_MULTI_OPS_MAX ops, each guarded by a check of the
subtree root's version. A write retried after a connection loss that fails only because
the first attempt had been applied is recognised and reported as the success it was.
`ZkOps` is a part of `ZooKeeperMetaStore` (store.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import kazoo.exceptions as kz
from kazoo.protocol.states import ZnodeStat

from metastore.base import (
    ROOT,
    BadVersionError,
    Check,
    ConnectionLossError,
    Create,
    Delete,
    Entry,
    MetaStoreError,
    NodeExistsError,
    Op,
    Set,
    ancestors_of,
    validate_op,
    validate_path,
    validate_value,
    validate_version,
)
from sms import limits
from metastore.zookeeper.bridge import _CONNECTION_ERRORS
from metastore.zookeeper.url import ZK_RESERVED_NAME, _check_zk_chars

class ZkOps:
    """get, children, create, set, delete, commit, and the path checks."""

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
