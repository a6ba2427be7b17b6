"""Partition logs of one storage node: many partitions per LMDB environment.

A node keeps two LMDB environments, one per durable persistence policy: `disk`
(`sync=True`: every commit is fsynced) and `disk_async` (written per batch, flushed by
the OS, so it survives a process crash but not a power cut). `memory` logs live in a
sorted dict and vanish with the process. Each stored value is one whole batch
(sms/wire.py) keyed by (local partition id, first SN), so an append is one put and a
read is a cursor walk over whole batches.

Writes go through one `GroupCommitWriter` per environment: appends from every partition
queue up and are folded into one write transaction (one fsync) on a dedicated thread.
Every batch's checksum is verified before it is written and again when it is read back.
The last SN and commit watermark of each partition are kept in memory; the watermark is
also written with each transaction so a restarted node knows what was committed.

A failed write transaction is one of two things (`storage_error`). A full disk or map
(`StorageFull`) is retried by the next transaction, as LMDB leaves the last commit intact.
A disk that fails a write or an fsync (`StorageFailed`) fences the node's durable logs:
what reached the disk is unknown, so no transaction is tried again until the node is
restarted and recovers from what LMDB holds durably (`StorageHealth`; docs/operations.md,
"A failing disk").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import lmdb
from sortedcontainers import SortedDict

from sms import errors, wire, limits, seqno
from kernel import metrics
from kernel.aiotools import cancel_and_wait
from sms.errors import invariant
from sms.types import Persistence

log = logging.getLogger(__name__)

_LOCAL_ID = struct.Struct(">I")
_META_NEXT_ID = b"next_local_id"     # in the partitions db, whose other keys are 4-byte ids


@dataclass(slots=True)
class ReadSlice:
    batch: bytes
    start: int
    end: int
    first_sn: int

    def sn_at(self, index: int) -> int:
        return self.first_sn + index * seqno.COUNTER_UNIT


class PartitionLog:
    """One partition's log on this node. Mutated only by its LogStore."""

    def __init__(self, name: str, persistence: Persistence, local_id: int):
        self.name = name
        self.persistence = persistence
        self.local_id = local_id
        self.prefix = _LOCAL_ID.pack(local_id)
        self.last_sn = 0
        self.first_sn = 0          # first stored SN (0: empty)
        self.trim_floor = 0        # a trim deletes below this: readers take what is below as gone
        self.committed_sn = 0
        self.stored_committed_sn = 0
        self.batches = 0
        self.records = 0
        self.memory: SortedDict | None = SortedDict() if persistence is Persistence.MEMORY else None
        self.append_lock = asyncio.Lock()   # check-then-write of the prefix rule spans an await

    def key(self, first_sn: int) -> bytes:
        return self.prefix + seqno.to_bytes(first_sn)


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FAILED_ERRNOS = (errno.EIO, errno.EROFS)


def _errno_of(e: Exception) -> int | None:
    """The errno of a failed LMDB call (py-lmdb names most of them only in the text)."""
    code = getattr(e, "errno", None)
    if code:
        return code
    if isinstance(e, lmdb.DiskError):
        return errno.ENOSPC
    text = str(e)
    return next((code for code in _FULL_ERRNOS + _FAILED_ERRNOS if os.strerror(code) in text), None)


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free if path else None
    except OSError:
        return None


def storage_error(e: Exception, path: str = "", txn_bytes: int = 0) -> errors.SmsError:
    """The named error of a failed LMDB write.

    StorageFull: the map or the disk is full (MDB_MAP_FULL, ENOSPC, EDQUOT), or an I/O
    error while the disk at `path` has less room than twice the transaction (at least
    STORAGE_FULL_FREE_BYTES): LMDB reports a short write as EIO, which is what a full disk
    gives mid-transaction. The batch was not stored. Retriable: the next transaction
    tries again, as a failed commit leaves LMDB's last commit intact.

    StorageFailed: the disk failed a write or an fsync (EIO with room on the disk; EROFS,
    a filesystem that gave up; LMDB's panic after a failed meta page write; a corrupted
    page). What reached the disk is unknown: the batch was not acknowledged, and the store
    is fenced (StorageHealth).

    Unavailable: anything else; the store goes on."""
    text = str(e)
    code = _errno_of(e)
    if isinstance(e, lmdb.MapFullError) or code in _FULL_ERRNOS:
        return errors.StorageFull(f"storage is full ({text}); the batch was not stored")
    if code == errno.EIO:
        free = _free_bytes(path)
        if free is not None and free < max(2 * txn_bytes, limits.STORAGE_FULL_FREE_BYTES):
            return errors.StorageFull(f"storage is full ({free} bytes free; {text}); the batch was not stored")
    if code in _FAILED_ERRNOS or isinstance(e, (lmdb.PanicError, lmdb.CorruptedError)):
        return errors.StorageFailed(f"the disk failed a write ({text}): what reached it is unknown; the batch "
                                    f"was not acknowledged, and this node refuses writes until it is restarted")
    return errors.Unavailable(f"a storage write failed ({text}); the batch was not stored")


class StorageHealth:
    """Failed write transactions of a node's durable logs, and the fence a failed disk
    puts up. Shared by both environments (one data directory, one disk) and by every
    thread that writes them.

    After an I/O error the disk's state is unknown -- Linux reports a failed writeback
    once and then marks the pages clean, so a retried fsync can succeed over pages that
    never reached the disk ("fsyncgate"); a filesystem may have gone read-only; LMDB
    itself panics after a failed meta page write -- so a failed disk is never retried:
    every later write is refused with StorageFailed, without touching the disk, until the
    node is restarted (the new process recovers from LMDB's last durable commit, and its
    chains take it back only after checking its log against their own). Reads go on."""

    def __init__(self) -> None:
        self.failures = 0                                   # failed write transactions
        self.last_error: tuple[str, int] | None = None      # (named error and text, wall-clock ms)
        self.failed: tuple[str, int] | None = None         # the fence: (what LMDB said, wall-clock ms)
        # called once when the fence goes up, on the thread that found the failure: the node
        # reports it, so the chain manager takes the node out of its chains (node/server.py)
        self.on_fence: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def record(self, e: Exception, path: str = "", txn_bytes: int = 0) -> errors.SmsError:
        """Count one failed write transaction; fence the store if the disk failed.
        Returns the named error for its callers."""
        error = storage_error(e, path, txn_bytes)
        now_ms = int(time.time() * 1000)
        fenced = False
        with self._lock:
            self.failures += 1
            if self.failed is None:      # once fenced, the status keeps showing why
                self.last_error = (f"{error.name}: {error.message}", now_ms)
                if isinstance(error, errors.StorageFailed):
                    self.failed = (str(e), now_ms)
                    fenced = True
                    log.critical("the disk under %s failed a write (%s): refusing every write to the durable "
                                 "logs until this node is restarted", path or "the data directory", e)
        if fenced and self.on_fence is not None:
            self.on_fence()
        return error

    def check(self) -> None:
        """Raise StorageFailed if the store is fenced: nothing may be written."""
        failed = self.failed
        if failed is not None:
            at = time.strftime("%H:%M:%S", time.localtime(failed[1] / 1000))
            raise errors.StorageFailed(f"this node's disk failed at {at} ({failed[0]}); it refuses writes "
                                       f"until it is restarted; the batch was not stored")


class GroupCommitWriter:
    """Folds queued appends of many partitions into one LMDB write transaction."""

    def __init__(self, env: lmdb.Environment, batches_db, parts_db, name: str, health: StorageHealth):
        self.env = env
        self.batches_db = batches_db
        self.parts_db = parts_db
        self.health = health
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=limits.STORAGE_WRITE_QUEUE_MAX)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lmdb-{name}")
        self.task: asyncio.Task | None = None
        self.commits = 0
        self._commit_seconds = metrics.STORAGE_COMMIT_SECONDS.labels(name)
        self._commit_batches = metrics.STORAGE_COMMIT_BATCHES.labels(name)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        await cancel_and_wait(self.task)
        self.executor.shutdown(wait=True)

    async def submit(self, plog: PartitionLog, key: bytes, batch: bytes) -> None:
        self.health.check()
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((plog, key, batch, fut))
        await fut

    def _commit(self, items: list) -> None:
        watermarks = {}
        t0 = time.perf_counter()
        with self.env.begin(write=True) as txn:
            for plog, key, batch, _fut in items:
                txn.put(key, batch, db=self.batches_db)
            for plog in {item[0] for item in items}:
                watermarks[plog] = plog.committed_sn
                txn.put(plog.prefix, seqno.to_bytes(watermarks[plog]), db=self.parts_db)
        self._commit_seconds.observe(time.perf_counter() - t0)
        self._commit_batches.observe(len(items))
        for plog, sn in watermarks.items():      # only once the transaction is durable
            plog.stored_committed_sn = max(plog.stored_committed_sn, sn)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            while len(items) < limits.STORAGE_GROUP_COMMIT_BATCHES_MAX and not self.queue.empty():
                items.append(self.queue.get_nowait())
            try:
                self.health.check()          # a failed disk is not written again (StorageHealth)
                try:
                    await loop.run_in_executor(self.executor, self._commit, items)
                except (lmdb.Error, OSError) as e:  # disk full, map full, I/O error: fail these appends
                    error = self.health.record(e, self.env.path(), sum(len(item[2]) for item in items))
                    log.error("LMDB commit of %d batches failed (%s): %s", len(items), error.name, e)
                    raise error from e
                self.commits += 1
            except errors.SmsError as error:
                for *_, fut in items:
                    if not fut.done():
                        fut.set_exception(error)
                continue
            for *_, fut in items:
                if not fut.done():
                    fut.set_result(None)


class LogStore:
    """All partition logs of a node, by name (the chain id)."""

    def __init__(self, data_dir: str | None):
        """`data_dir` None: a store of memory logs only, with no LMDB environment (the
        simulation's, tests/sim/harness.py); opening a durable log there is an invariant
        violation."""
        self.data_dir = data_dir or ""
        self.envs: dict[Persistence, lmdb.Environment] = {}
        self.dbs: dict[Persistence, tuple] = {}
        self.writers: dict[Persistence, GroupCommitWriter] = {}
        self.logs: dict[str, PartitionLog] = {}
        self.health = StorageHealth()
        if data_dir is None:
            return
        os.makedirs(data_dir, exist_ok=True)
        for persistence, sync in ((Persistence.DISK, True), (Persistence.DISK_ASYNC, False)):
            env = lmdb.open(os.path.join(data_dir, f"log-{persistence.value}.lmdb"), subdir=True,
                            map_size=limits.LMDB_MAP_BYTES, max_dbs=4, max_readers=limits.LMDB_MAX_READERS,
                            sync=sync, metasync=sync, readahead=False)
            self.envs[persistence] = env
            self.dbs[persistence] = (env.open_db(b"batches"), env.open_db(b"partitions"),
                                     env.open_db(b"names"))

    async def start(self) -> None:
        for persistence, env in self.envs.items():
            batches, parts, _names = self.dbs[persistence]
            writer = GroupCommitWriter(env, batches, parts, persistence.value, self.health)
            writer.start()
            self.writers[persistence] = writer

    async def close(self) -> None:
        for writer in self.writers.values():
            await writer.stop()
        if self.health.failed is None:       # a failed disk is not written again
            try:
                self._store_watermarks()
            except errors.SmsError as e:      # (a full disk: each transaction stored its watermark)
                log.warning("commit watermarks not stored at close: %s: %s", e.name, e.message)
        for env in self.envs.values():
            env.close()

    @property
    def failed(self) -> bool:
        """The disk failed a write: every write to the durable logs is refused until restart."""
        return self.health.failed is not None

    @contextlib.contextmanager
    def _write_txn(self, env: lmdb.Environment, db=None):
        """A write transaction outside the group commit (open, drop, trim, watermarks):
        refused on a fenced store, and its failure counted and named like an append's."""
        self.health.check()
        try:
            with env.begin(write=True, db=db) as txn:
                yield txn
        except lmdb.Error as e:
            error = self.health.record(e, env.path())
            log.error("LMDB write transaction failed (%s): %s", error.name, e)
            raise error from e

    def _store_watermarks(self) -> None:
        """Write each durable log's commit watermark, so a clean restart serves reads up to
        it at once (a watermark written with the last batch lags that batch's commit)."""
        for persistence, env in self.envs.items():
            parts = self.dbs[persistence][1]
            stale = [p for p in self.logs.values()
                     if p.persistence is persistence and p.committed_sn > p.stored_committed_sn]
            if not stale:
                continue
            with self._write_txn(env, db=parts) as txn:
                for plog in stale:
                    txn.put(plog.prefix, seqno.to_bytes(plog.committed_sn))
            for plog in stale:
                plog.stored_committed_sn = plog.committed_sn

    # --- partitions ---------------------------------------------------------------

    def open_log(self, name: str, persistence: Persistence) -> PartitionLog:
        """The log named `name`, created empty if new; recovered from LMDB if it exists."""
        plog = self.logs.get(name)
        if plog is not None:
            return plog
        if persistence is Persistence.MEMORY:
            plog = PartitionLog(name, persistence, 0)
        else:
            errors.invariant(persistence in self.envs, f"log {name}: a {persistence.value} log in a memory-only store")
            plog = PartitionLog(name, persistence, self._local_id(name, persistence))
            self._recover(plog)
        self.logs[name] = plog
        return plog

    def known_names(self) -> list[str]:
        """Names of durable logs stored on this node (including ones not opened yet)."""
        names = []
        for persistence, env in self.envs.items():
            with env.begin(db=self.dbs[persistence][2]) as txn:
                names.extend(k.decode() for k, _ in txn.cursor())
        return names

    def _local_id(self, name: str, persistence: Persistence) -> int:
        """The log's id in its environment, allocated (and stored) if it is new. On a fenced
        store a new log gets id 0, which no stored batch has: it is empty, and stays so,
        since every append to it is refused (so a failed disk does not keep the node from
        taking part in its chains' configuration)."""
        env = self.envs[persistence]
        _batches, parts, names = self.dbs[persistence]
        if self.failed:
            with env.begin(db=names) as txn:
                raw = txn.get(name.encode())
            return _LOCAL_ID.unpack(raw)[0] if raw is not None else 0
        with self._write_txn(env) as txn:
            raw = txn.get(name.encode(), db=names)
            if raw is not None:
                return _LOCAL_ID.unpack(raw)[0]
            nxt = txn.get(_META_NEXT_ID, db=parts)
            local_id = _LOCAL_ID.unpack(nxt)[0] if nxt else 1
            txn.put(_META_NEXT_ID, _LOCAL_ID.pack(local_id + 1), db=parts)
            txn.put(name.encode(), _LOCAL_ID.pack(local_id), db=names)
            return local_id

    def _recover(self, plog: PartitionLog) -> None:
        env = self.envs[plog.persistence]
        batches, parts, _names = self.dbs[plog.persistence]
        with env.begin() as txn:
            cur = txn.cursor(db=batches)
            if cur.set_range(plog.prefix):
                if cur.key()[:4] == plog.prefix:
                    plog.first_sn = wire.read_header(cur.value()).first_sn
            count_batches = count_records = 0
            if cur.set_range(plog.prefix):
                while cur.key()[:4] == plog.prefix:
                    header = wire.read_header(cur.value())
                    count_batches += 1
                    count_records += header.count
                    plog.last_sn = header.last_sn
                    if not cur.next():
                        break
            plog.batches, plog.records = count_batches, count_records
            raw = txn.get(plog.prefix, db=parts)
            plog.committed_sn = min(seqno.from_bytes(raw), plog.last_sn) if raw else 0
            plog.stored_committed_sn = plog.committed_sn

    async def drop_log(self, name: str) -> None:
        """Delete a partition's records and name from this node, in bounded txns. On a
        fenced store only this process forgets it: the disk keeps it until a restart."""
        plog = self.logs.pop(name, None)
        for persistence, env in self.envs.items():
            if self.failed:
                break
            batches, parts, names = self.dbs[persistence]
            with env.begin(db=names) as txn:
                raw = txn.get(name.encode())
            if raw is None:
                continue
            prefix = raw
            while True:
                with self._write_txn(env) as txn:
                    cur = txn.cursor(db=batches)
                    deleted = 0
                    if cur.set_range(prefix):
                        while cur.key()[:4] == prefix and deleted < limits.TRIM_BATCHES_PER_TXN_MAX:
                            if not cur.delete():
                                break
                            deleted += 1
                    if deleted < limits.TRIM_BATCHES_PER_TXN_MAX:
                        txn.delete(prefix, db=parts)
                        txn.delete(name.encode(), db=names)
                        break
                await asyncio.sleep(0)  # let other work run between bounded deletions
        if plog is not None and plog.memory is not None:
            plog.memory.clear()

    async def trim(self, plog: PartitionLog, before_sn: int) -> int:
        """Delete the log's oldest whole batches whose records all precede before_sn, in
        transactions of at most TRIM_BATCHES_PER_TXN_MAX batches, on the log's writer thread
        (so they queue with appends instead of blocking the loop on LMDB's write lock). The
        newest batch always stays: it carries the log's position (last SN, the batch a
        successor's log is verified against). Returns the records deleted; none on a
        fenced store."""
        deleted_records = 0
        # set before the delete commits: a reader of a stream with an archive reads what is
        # below from the archive, never a log whose first batches are going
        plog.trim_floor = max(plog.trim_floor, before_sn)
        while True:
            if plog.memory is None and self.failed:
                return deleted_records
            async with plog.append_lock:
                if plog.memory is not None:
                    victims = self._trim_memory(plog, before_sn)
                else:
                    victims = await asyncio.get_running_loop().run_in_executor(
                        self.writers[plog.persistence].executor, self._trim_txn, plog, before_sn)
                if not victims:
                    return deleted_records
                plog.batches -= len(victims)
                plog.records -= sum(count for _sn, count in victims)
                deleted_records += sum(count for _sn, count in victims)
                nxt = self._batches_from(plog, victims[-1][0] + 1)
                plog.first_sn = next((wire.read_header(b).first_sn for b in nxt), 0)
            if len(victims) < limits.TRIM_BATCHES_PER_TXN_MAX:
                return deleted_records

    def _trim_memory(self, plog: PartitionLog, before_sn: int) -> list[tuple[int, int]]:
        victims = []
        for first in list(plog.memory.keys()[:-1][:limits.TRIM_BATCHES_PER_TXN_MAX]):
            header = wire.read_header(plog.memory[first])
            if header.last_sn >= before_sn:
                break
            del plog.memory[first]
            victims.append((header.last_sn, header.count))
        return victims

    def _trim_txn(self, plog: PartitionLog, before_sn: int) -> list[tuple[int, int]]:
        """(last SN, records) of each batch deleted in one write transaction."""
        env = self.envs[plog.persistence]
        batches_db = self.dbs[plog.persistence][0]
        victims = []
        with self._write_txn(env, db=batches_db) as txn:
            cur = txn.cursor()
            if not cur.set_range(plog.prefix):
                return victims
            while cur.key()[:4] == plog.prefix and len(victims) < limits.TRIM_BATCHES_PER_TXN_MAX:
                header = wire.read_header(cur.value())
                if header.last_sn >= before_sn or header.last_sn >= plog.last_sn:
                    break
                victims.append((header.last_sn, header.count))
                if not cur.delete():
                    break
        return victims

    # --- append / read --------------------------------------------------------------

    async def append(self, plog: PartitionLog, batch: bytes) -> wire.BatchHeader:
        """Persist one sequenced batch after the log's last SN (prefix rule).

        Appends to one log are serialised: the prefix check and the state update must not
        interleave with another append while this one waits for its group commit. Appends
        to different logs still share transactions.

        Cancelling the caller (its stream broke) does not cancel the append: once submitted
        the batch is committed by the writer thread anyway, so the log's state must follow,
        or the head would later sequence new records under SNs the log already holds."""
        header = wire.verify(batch)
        return await asyncio.shield(self.append_verified(plog, header, batch))

    async def append_verified(self, plog: PartitionLog, header: wire.BatchHeader, batch: bytes) -> wire.BatchHeader:
        """`append` for a caller that verified the batch (`header` is `wire.verify`'s) and
        shields this call itself (storage/replica.py): one checksum pass and one task per
        batch fewer on the write path."""
        async with plog.append_lock:
            invariant(header.first_sn > plog.last_sn,
                      f"{plog.name}: append first_sn {header.first_sn} <= last_sn {plog.last_sn}")
            if plog.memory is not None:
                plog.memory[header.first_sn] = batch
            else:
                await self.writers[plog.persistence].submit(plog, plog.key(header.first_sn), batch)
            if plog.first_sn == 0:
                plog.first_sn = header.first_sn
            plog.last_sn = header.last_sn
            plog.batches += 1
            plog.records += header.count
        return header

    def set_committed(self, plog: PartitionLog, committed_sn: int) -> None:
        invariant(committed_sn <= plog.last_sn,
                  f"{plog.name}: committed {committed_sn} beyond last {plog.last_sn}")
        if committed_sn > plog.committed_sn:
            plog.committed_sn = committed_sn

    def read(self, plog: PartitionLog, from_sn: int, upto_sn: int, max_records: int,
             max_bytes: int) -> list[ReadSlice]:
        """Whole or partial batches holding records with from_sn <= SN <= upto_sn."""
        if upto_sn < from_sn or plog.last_sn == 0:
            return []
        out: list[ReadSlice] = []
        records = size = 0
        for batch in self._batches_from(plog, from_sn):
            if wire.read_header(batch).first_sn > upto_sn:
                break
            header = wire.verify(batch)
            start = wire.index_at_or_after(header, from_sn)
            end = wire.index_at_or_after(header, upto_sn + 1)
            end = min(end, start + (max_records - records))
            if end > start:
                out.append(ReadSlice(batch, start, end, header.first_sn))
                records += end - start
                size += len(batch)
            if records >= max_records or size >= max_bytes or len(out) >= limits.STORAGE_READ_BATCHES_MAX:
                break
        return out

    def _batches_from(self, plog: PartitionLog, from_sn: int):
        """Stored batches in SN order, starting with the one that holds from_sn."""
        if plog.memory is not None:
            keys = plog.memory.keys()
            i = plog.memory.bisect_right(from_sn)
            if i > 0:
                i -= 1
            for k in keys[i:]:
                yield plog.memory[k]
            return
        env = self.envs[plog.persistence]
        batches_db = self.dbs[plog.persistence][0]
        with env.begin(db=batches_db) as txn:
            cur = txn.cursor()
            found = cur.set_range(plog.key(from_sn))
            if not found or cur.key()[:4] != plog.prefix or seqno.from_bytes(cur.key()[4:]) > from_sn:
                # the batch holding from_sn starts before it: step back one
                if (cur.prev() if found else cur.last()) and cur.key()[:4] == plog.prefix:
                    pass
                elif not cur.set_range(plog.prefix):
                    return
            while cur.key()[:4] == plog.prefix:
                yield cur.value()
                if not cur.next():
                    return

    def iter_batches_from(self, plog: PartitionLog, from_sn: int):
        """Stored batches in SN order from the one that holds from_sn, one at a time, in
        one read transaction (consume it on the loop, without awaiting in between)."""
        return self._batches_from(plog, from_sn)

    def read_batches_from(self, plog: PartitionLog, from_sn: int, count: int) -> list[bytes]:
        """Up to `count` stored batches, starting with the one that holds from_sn."""
        out: list[bytes] = []
        for batch in self._batches_from(plog, from_sn):
            out.append(bytes(batch))
            if len(out) >= count:
                break
        return out

    def last_batches(self, plog: PartitionLog, count: int) -> list[bytes]:
        """The last `count` stored batches of the log, oldest first."""
        out: list[bytes] = []
        if plog.memory is not None:
            return [plog.memory[k] for k in plog.memory.keys()[-count:]]
        env = self.envs[plog.persistence]
        with env.begin(db=self.dbs[plog.persistence][0]) as txn:
            cur = txn.cursor()
            found = cur.set_range(plog.key(seqno.SN_MAX))
            ok = cur.prev() if found else cur.last()
            while ok and cur.key()[:4] == plog.prefix and len(out) < count:
                out.append(cur.value())
                ok = cur.prev()
        out.reverse()
        return out

    def write_failures(self) -> tuple[int, tuple[str, int] | None]:
        """Failed write transactions over every environment, and the latest one's error
        and time (on a fenced store: the failure that fenced it)."""
        return self.health.failures, self.health.last_error

    def statistics(self) -> dict:
        return {"logs": len(self.logs),
                "commits": {p.value: w.commits for p, w in self.writers.items()},
                "write_queue": {p.value: w.queue.qsize() for p, w in self.writers.items()}}
