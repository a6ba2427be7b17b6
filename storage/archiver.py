"""The archiver of a storage node: old committed batches of the partitions whose chain
tail is this node go to their stream's archive (archive/), are verified there before
any replica deletes its local copy, and leave the archive with its retention.

One pass every ARCHIVE_CHECK_INTERVAL_S, over every replica this node is the tail of
(the tail holds only committed batches, and a chain has one tail; a chain change names
another, and the index's versioned commit keeps an old tail that has not seen it yet
from indexing the same records twice: archive/index.py). For each such partition of a
stream with an archive:

1. **Write.** The batches after the state's `archived_sn`, committed and older than
   `archive_after_s`, in runs of up to ARCHIVE_FRAGMENT_RAW_BYTES_TARGET: a full run is
   written at once; a shorter one once its oldest record has waited ARCHIVE_FLUSH_S
   more, so a quiet partition is archived too, in fewer, larger fragments. Each run is
   encoded (archive/fragment.py), put in the store, then indexed.
2. **Verify.** Fragments whose records are due to leave the replicas (past local
   retention) are read back from the store and checked; `verified_sn` moves past them.
   A fragment that is corrupt or missing is written again from this node's copy first.
   Replicas delete local batches only up to `verified_sn` (StorageNode.apply_retention).
3. **Expire.** Fragments wholly below the partition's trim point (retention, trims,
   unread-record protection: kernel/retention.py) are deleted, file then index entry; so
   are files no index entry names (orphans of a killed or out-raced writer).

A step that fails (the store unreachable or full, a metadata hiccup) is retried with
backoff, up to ARCHIVE_RETRY_S_MAX; local data stays meanwhile, and the archive lag
(`lag_ms`, in NodeStatus, `sms status` and the metrics) shows it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from archive import fragment, index
from archive.fragment import FragmentRef
from sms.objectstore import open_store
from metastore import BadVersionError, NodeExistsError, NoNodeError
from sms import errors, limits, payloads, seqno, wire
from kernel import metrics, retention
from kernel.aiotools import raise_if_cancelling
from sms.errors import InvariantViolation
from sms.metadata import StreamConfig, chain_name

from storage.replica import Replica, ReplicaState

if TYPE_CHECKING:
    from storage.service import StorageNode

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PartitionArchive:
    """What this node knows of one partition's archiving, for status and backoff."""
    archived_sn: int = 0
    verified_sn: int = 0
    failures: int = 0
    retry_at: float = 0.0
    error: str = ""
    next_orphan_scan: float = 0.0
    lag_ms: int = 0          # how far the oldest committed record not archived is past archive_after_s
    # the partition's fragment list as of the state at `index_version` (the index is listed
    # again only when the state moved under another writer: a pass reads one entry, not a
    # listing of every fragment)
    index: list[FragmentRef] | None = None
    index_version: int = -1
    trim_point: int = 0      # the partition's trim point at the last expire step


class Archiver:
    def __init__(self, node: "StorageNode"):
        self.node = node
        self.meta = node.meta
        self.parts: dict[str, PartitionArchive] = {}
        self._payload_gc_at: dict[str, float] = {}      # stream -> when its payloads are looked at next
        self._configs: dict[str, tuple[float, StreamConfig | None]] = {}   # stream -> (read again after, config)
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=limits.ARCHIVE_WRITE_THREADS,
                                                              thread_name_prefix="archive-write")

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _config(self, stream: str, now: float) -> StreamConfig | None:
        """The stream's config, read at most every ARCHIVE_CONFIG_REFRESH_S: a node with
        thousands of replicas of streams without an archive makes no metadata read a pass
        for each (an archive set on a stream is seen within that time)."""
        cached = self._configs.get(stream)
        if cached is None or now >= cached[0]:
            if len(self._configs) >= limits.ARCHIVE_INDEXES_MAX:
                self._configs.clear()
            cached = self._configs[stream] = (now + limits.ARCHIVE_CONFIG_REFRESH_S,
                                              await self.node._read_decoded_stream(stream))
        return cached[1]

    async def _call(self, fn, *args):
        """`fn(*args)` on a write thread, within ARCHIVE_STORE_CALL_TIMEOUT_S (a store that
        hangs is ArchiveUnavailable: the thread stays blocked, the loop goes on)."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        try:
            return await asyncio.wait_for(future, limits.ARCHIVE_STORE_CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise_if_cancelling()
            raise errors.ArchiveUnavailable(f"the archive store did not answer within "
                                            f"{limits.ARCHIVE_STORE_CALL_TIMEOUT_S:.0f} s") from None

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except InvariantViolation:
                raise
            except Exception:
                raise_if_cancelling()
                log.exception("archive pass failed")
            # (as retention's passes: with many replicas, less often, so the cost stays flat)
            await asyncio.sleep(max(limits.ARCHIVE_CHECK_INTERVAL_S,
                                    len(self.node.replicas) / limits.RETENTION_REPLICAS_PER_S))

    async def pass_once(self) -> None:
        now = time.monotonic()
        held = set()
        for cid, replica in list(self.node.replicas.items()):
            if replica.state is not ReplicaState.ACTIVE or replica.config.tail != self.node.node_id:
                continue
            config = await self._config(replica.config.stream, now)
            if config is None or not config.archive:
                continue
            held.add(cid)
            part = self.parts.setdefault(cid, PartitionArchive())
            if now < part.retry_at:
                continue
            failed = ""
            # each step on its own: one that fails (a fragment that cannot be verified) never
            # keeps the others from running (retention still expires it)
            for step, run_step in (("expire", self._expire), ("write", self._write), ("verify", self._verify)):
                try:
                    await run_step(replica, config, part)
                except InvariantViolation:
                    raise
                except Exception as e:    # (each partition and step on its own)
                    raise_if_cancelling()
                    part.index = None     # (listed again: another writer may have changed it)
                    if not isinstance(e, (errors.SmsError, BadVersionError, NodeExistsError, NoNodeError, OSError)):
                        log.exception("%s: archiving: %s failed unexpectedly", chain_name(cid), step)
                    name = e.name if isinstance(e, errors.SmsError) else type(e).__name__
                    metrics.ARCHIVE_ERRORS.labels(config.name, step, name).inc()
                    failed = failed or f"{step}: {name}: {getattr(e, 'message', '') or e}"
            if failed:
                part.failures += 1
                part.retry_at = time.monotonic() + min(limits.ARCHIVE_RETRY_S_MAX,
                                                       limits.ARCHIVE_CHECK_INTERVAL_S * 2 ** min(part.failures, 16))
                if failed != part.error:
                    log.warning("%s: archiving: %s (retried)", chain_name(cid), failed)
                part.error = failed
            else:
                if part.error:
                    log.info("%s: archiving goes on", chain_name(cid))
                part.failures, part.error = 0, ""
        for cid in [c for c in self.parts if c not in held]:
            del self.parts[cid]
        await self._payloads_pass(held)

    # --- 4. payloads by reference (sms/payloads.py) ------------------------------------

    async def _payloads_pass(self, held: set[str]) -> None:
        """For each stream whose first open partition's tail is this node (one node per
        stream), at most every PAYLOAD_GC_INTERVAL_S: delete the uploads never claimed
        PAYLOAD_GRACE_S after they started, and claimed ones older than the stream's
        oldest record (the lowest trim point of its partitions) by the grace period."""
        now = time.monotonic()
        streams = {self.node.replicas[cid].config.stream for cid in held if cid in self.node.replicas}
        for stream in streams:
            if now < self._payload_gc_at.get(stream, 0.0):
                continue
            facts = await self.node._stream_retention_facts(stream)
            if facts is None:
                continue
            config, pmap, consumers = facts
            first = min((e.ordinal for e in pmap.open_entries()), default=None)
            if first is None or f"{stream}:{first}" not in held:
                continue
            self._payload_gc_at[stream] = now + limits.PAYLOAD_GC_INTERVAL_S
            now_ms = int(time.time() * 1000)
            oldest_ms = min(seqno.timestamp_ms_of(retention.trim_point(config, pmap, e.ordinal, consumers, now_ms))
                            for e in pmap.entries)
            try:
                gone = await self._call(_collect_payloads, config.archive, f"{config.name}/{config.created_ms}/payloads/",
                                        now_ms, oldest_ms)
            except (errors.SmsError, OSError) as e:
                raise_if_cancelling()
                metrics.ARCHIVE_ERRORS.labels(stream, "payloads", getattr(e, "name", type(e).__name__)).inc()
                log.warning("%s: collecting payloads failed: %s", stream, e)
                continue
            if gone:
                metrics.PAYLOADS_DELETED.labels(stream).inc(gone)
                log.info("%s: deleted %d payload uploads (past retention, or never claimed)", stream, gone)

    async def _fragments(self, stream: str, ordinal: int, part: PartitionArchive, version: int) -> list[FragmentRef]:
        """The partition's indexed fragments (oldest first) at state `version`."""
        if part.index is None or part.index_version != version:
            part.index = await index.fragments(self.meta, stream, ordinal)
            part.index_version = version
        return part.index

    # --- 1. write ---------------------------------------------------------------------

    async def _write(self, replica: Replica, config: StreamConfig, part: PartitionArchive) -> None:
        stream, ordinal = config.name, replica.config.ordinal
        store = open_store(config.archive)
        prefix = fragment.partition_prefix(stream, config.created_ms, ordinal)
        for _ in range(limits.ARCHIVE_FRAGMENTS_PER_PASS):
            now_ms = int(time.time() * 1000)
            known = await index.read_state(self.meta, stream, ordinal)
            archived = known[0].archived_sn if known else 0
            part.archived_sn = archived
            part.verified_sn = known[0].verified_sn if known else 0
            eligible_ms = now_ms - config.archive_after_s * 1000
            limit_sn = min(replica.committed_sn, seqno.lower_bound_for_time(max(0, eligible_ms)) - 1)
            run, size = self._run(replica, archived, limit_sn)
            part.lag_ms = 0
            for batch in self.node.logs.read_batches_from(replica.log, archived + 1, 2):
                header = wire.read_header(batch)
                if header.last_sn <= archived:
                    continue                      # (the batch that holds `archived` itself)
                if header.first_sn <= replica.committed_sn:
                    part.lag_ms = max(0, eligible_ms - seqno.timestamp_ms_of(header.first_sn))
                break
            if not run:
                return
            full = size >= limits.ARCHIVE_FRAGMENT_RAW_BYTES_TARGET or len(run) >= limits.ARCHIVE_FRAGMENT_BATCHES_MAX
            waited = eligible_ms - seqno.timestamp_ms_of(wire.read_header(run[0]).first_sn)
            if not full and waited < int(limits.ARCHIVE_FLUSH_S * 1000):
                return
            first_sn = wire.read_header(run[0]).first_sn
            if first_sn <= archived:
                log.error("%s: the batch after archived SN %d starts at %d: not archived here", chain_name(replica.chain_id),
                          archived, first_sn)
                return
            if archived and seqno.counter_of(first_sn) != seqno.counter_of(archived) + 1:
                log.warning("%s: %d records after SN %d were deleted before they were archived", chain_name(replica.chain_id),
                            seqno.counter_of(first_sn) - seqno.counter_of(archived) - 1, archived)
            encoded = await self._call(fragment.encode, run, config.compression)
            await self._call(store.put, prefix + encoded.ref.name, encoded.data)
            details = {"records": encoded.records, "batches": encoded.batches, "bytes": len(encoded.data),
                       "raw_bytes": encoded.raw_bytes, "node": self.node.node_id, "written_ms": now_ms}
            try:
                await index.add_fragment(self.meta, stream, ordinal, encoded.ref, details, known, self.node.node_id,
                                         now_ms)
            except (BadVersionError, NodeExistsError):
                # another writer indexed these records first (a tail change): this file, unless
                # it has the same name as theirs, is an orphan that retention deletes
                log.info("%s: another node archived from SN %d first", chain_name(replica.chain_id), first_sn)
                continue
            part.archived_sn = encoded.ref.last_sn
            if part.index is not None and known is not None and part.index_version == known[1]:
                part.index.append(encoded.ref)          # (the commit moved the state by one version)
                part.index_version = known[1] + 1
            metrics.ARCHIVE_FRAGMENTS.labels(stream).inc()
            metrics.ARCHIVE_WRITE_RECORDS.labels(stream).inc(encoded.records)
            metrics.ARCHIVE_WRITE_BYTES.labels(stream).inc(len(encoded.data))
            metrics.ARCHIVE_RAW_BYTES.labels(stream).inc(encoded.raw_bytes)

    def _run(self, replica: Replica, archived: int, limit_sn: int) -> tuple[list[bytes], int]:
        """The batches after `archived` that end at or before limit_sn, up to a fragment's size."""
        run: list[bytes] = []
        size = 0
        if limit_sn <= archived:
            return run, size
        # (one batch at a time, up to the fragment's size: never thousands copied to use a few)
        for batch in self.node.logs.iter_batches_from(replica.log, archived + 1):
            if len(run) >= limits.ARCHIVE_FRAGMENT_BATCHES_MAX:
                break
            header = wire.read_header(batch)
            if header.last_sn <= archived:
                continue
            if header.last_sn > limit_sn:
                break
            run.append(batch)
            size += len(batch)
            if size >= limits.ARCHIVE_FRAGMENT_RAW_BYTES_TARGET:
                break
        return run, size

    # --- 2. verify ----------------------------------------------------------------------

    async def _verify(self, replica: Replica, config: StreamConfig, part: PartitionArchive) -> None:
        stream, ordinal = config.name, replica.config.ordinal
        known = await index.read_state(self.meta, stream, ordinal)
        if known is None or known[0].verified_sn >= known[0].archived_sn:
            return
        now_ms = int(time.time() * 1000)
        # verified a little ahead of when replicas may delete, so deletion never waits for it
        due = seqno.lower_bound_for_time(max(0, now_ms - config.local_retention_ms
                                             + int(limits.ARCHIVE_VERIFY_AHEAD_S * 1000)))
        indexed = await self._fragments(stream, ordinal, part, known[1])
        # below the oldest fragment indexed, nothing is left to verify (expired, or never
        # archived); fragments retention is about to expire are not verified either
        gone_below = min(indexed[0].first_sn - 1, known[0].archived_sn) if indexed else known[0].archived_sn
        refs = [r for r in indexed
                if r.last_sn > known[0].verified_sn and r.first_sn < due and r.last_sn >= part.trim_point]
        if not refs and gone_below <= known[0].verified_sn:
            return
        store = open_store(config.archive)
        prefix = fragment.partition_prefix(stream, config.created_ms, ordinal)
        verified = max(known[0].verified_sn, gone_below)
        for ref in refs[:limits.ARCHIVE_VERIFY_PER_PASS]:
            if indexed and ref is not indexed[0] and verified < ref.first_sn - 1 and \
                    any(r.last_sn > verified and r.last_sn < ref.first_sn for r in indexed):
                break                    # (one not verified lies before it: verified_sn stays below)
            try:
                await self._call(_check, store, prefix + ref.name, ref)
            except errors.FragmentCorrupt as e:    # (FragmentMissing too)
                await self._repair(replica, config, ref, prefix, e)
            verified = ref.last_sn
        await index.set_verified(self.meta, stream, ordinal, known, verified)
        part.verified_sn = verified
        if part.index_version == known[1]:
            part.index_version = known[1] + 1

    async def _repair(self, replica: Replica, config: StreamConfig, ref: FragmentRef, prefix: str,
                      problem: errors.FragmentCorrupt) -> None:
        """Write a bad fragment again from this node's copy of its batches."""
        batches = []
        for batch in self.node.logs.iter_batches_from(replica.log, ref.first_sn):
            header = wire.read_header(batch)
            if header.first_sn > ref.last_sn or len(batches) > limits.ARCHIVE_FRAGMENT_BATCHES_MAX:
                break
            batches.append(batch)
        if not batches or wire.read_header(batches[0]).first_sn != ref.first_sn:
            raise errors.FragmentCorrupt(f"{problem.message}; this node no longer holds its records to write it "
                                         f"again", fragment=ref.name)
        codec = "zstd" if ref.codec == 1 else "none"
        encoded = await self._call(fragment.encode, batches, codec)
        if encoded.ref != ref:
            raise errors.FragmentCorrupt(f"{problem.message}; this node's copy of its records differs from what "
                                         f"was archived", fragment=ref.name)
        await self._call(open_store(config.archive).put, prefix + ref.name, encoded.data)
        metrics.ARCHIVE_REPAIRS.labels(config.name).inc()
        log.warning("%s: %s; written again from this node's copy", chain_name(replica.chain_id), problem.message)

    # --- 3. expire -----------------------------------------------------------------------

    async def _expire(self, replica: Replica, config: StreamConfig, part: PartitionArchive) -> None:
        stream, ordinal = config.name, replica.config.ordinal
        facts = await self.node._stream_retention_facts(stream)
        if facts is None:
            return
        _config, pmap, consumers = facts
        point = retention.trim_point(config, pmap, ordinal, consumers, int(time.time() * 1000))
        point = min(point, replica.committed_sn + 1)
        part.trim_point = point
        known = await index.read_state(self.meta, stream, ordinal)
        if known is None:
            return                       # (nothing archived yet: nothing to expire, no orphan to tell)
        part.archived_sn = max(part.archived_sn, known[0].archived_sn)
        refs = await self._fragments(stream, ordinal, part, known[1])
        store = open_store(config.archive)
        prefix = fragment.partition_prefix(stream, config.created_ms, ordinal)
        gone = [r for r in refs if r.last_sn < point][:limits.ARCHIVE_EXPIRE_PER_PASS]
        if gone:
            # the index entries first: a reader never meets an indexed fragment whose file is
            # gone (a file left by a failure here is an orphan the scan below deletes)
            await index.forget(self.meta, stream, ordinal, gone)
            names = {r.name for r in gone}
            refs = [r for r in refs if r.name not in names]
            if part.index is not None:
                part.index = [r for r in part.index if r.name not in names]
            for ref in gone:
                await self._call(store.delete, prefix + ref.name)
            metrics.ARCHIVE_EXPIRED.labels(stream).inc(len(gone))
            log.info("%s: the archive's retention deleted %d fragments below %d", chain_name(replica.chain_id), len(gone), point)
        now = time.monotonic()
        if now >= part.next_orphan_scan:
            part.next_orphan_scan = now + limits.ARCHIVE_ORPHAN_SCAN_S
            # (read afresh, never from the cache: a file wrongly taken for an orphan is lost data)
            indexed = {r.name for r in await index.fragments(self.meta, stream, ordinal)}
            names = await self._call(store.list, prefix)
            orphans = []
            for name in names:
                ref = FragmentRef.parse(name[len(prefix):])
                # a file no index entry names, within what is archived: its writer lost
                # (or was killed before) the commit, and never will index it
                if ref is not None and ref.name not in indexed and ref.last_sn <= part.archived_sn:
                    orphans.append(name)
            for name in orphans[:limits.ARCHIVE_EXPIRE_PER_PASS]:
                await self._call(store.delete, name)
            if orphans:
                log.info("%s: deleted %d orphan fragment files", chain_name(replica.chain_id), len(orphans))

    def status(self, chain_id: str) -> PartitionArchive | None:
        return self.parts.get(chain_id)


def _check(store, key: str, ref: FragmentRef) -> None:
    """(a write thread) Read a fragment back and verify it; FragmentCorrupt/Missing if bad."""
    fragment.decode(ref, store.get(key))


def _collect_payloads(url: str, prefix: str, now_ms: int, oldest_ms: int) -> int:
    """(a write thread) Delete the uploads under `prefix` that no record needs: never
    claimed within the grace period, or started before the stream's oldest record by
    more than it. Returns how many."""
    store = open_store(url)
    # (the start time in an upload's name is its producer's clock: a margin for skew)
    grace_ms = int(limits.PAYLOAD_GRACE_S * 1000) + limits.DEDUP_CLOCK_SKEW_MS_MAX
    uploads: dict[str, set[str]] = {}
    for name in store.list(prefix):
        upload, _sep, leaf = name[len(prefix):].rpartition("/")      # "<hour>/<start ms>-<random>", leaf
        uploads.setdefault(upload, set()).add(leaf)
    gone = 0
    for upload, leaves in uploads.items():
        try:
            started_ms = int(upload.rpartition("/")[2].split("-")[0])
        except ValueError:
            continue             # (not ours)
        unclaimed = payloads.CLAIMED not in leaves and started_ms < now_ms - grace_ms
        if unclaimed or started_ms < oldest_ms - grace_ms:
            store.delete_prefix(f"{prefix}{upload}/")
            gone += 1
    return gone
