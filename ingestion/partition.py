"""One partition as its ingestion owner sees it: the dedup table bound to the writer.

`PartitionIngest` turns each submission into a `DedupTable` decision and acts on it:
WRITE goes to the `PartitionWriter` and the outcome is reported back to the table
(`committed` / `failed`), DUPLICATE is answered with the original SN, QUEUED waits for
the resolution of the write it duplicates. Before it accepts anything it rebuilds the
table from storage: it waits until the chain head has committed everything it holds,
then reads the dedup window back through the Retrieval service. Records without a
producer session, and streams whose policy is not `at_least_once_no_dup`, skip the
table; `best_effort` answers as soon as a record is queued (no SN).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc

from ingestion import dedup
from ingestion.writer import PartitionWriter
from sms import limits, seqno, wire
from kernel import rpc
from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from sms.errors import InvalidSssn, SmsError, Throttled, Unavailable
from sms.metadata import ChainConfig, StreamConfig, chain_name
from kernel.ratelimit import PartitionLimits
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import IngestionPolicy

log = logging.getLogger(__name__)



@dataclass(slots=True)
class Submission:
    """One validated record of a PutRecords request, bound for this partition."""

    key: bytes                  # partition key, valid UTF-8
    data: bytes
    producer_id: bytes          # b"": no session
    sssn: int
    submit_ms: int
    dedup_key: bytes | None
    hwm: int
    session_ordinal: int | None = None   # set: the session is with this ancestor partition
    headers: bytes = b""        # its header TLVs (sms/wire.py), stored as they came
    signature: bytes = b""      # wire.signature of key, data and headers: a retry must match it


@dataclass(frozen=True, slots=True)
class Outcome:
    sn: int                     # 0: unknown (best effort, or a duplicate below the HWM)
    duplicate: bool = False


class Barrier:
    """The end of one PutRecords call's writes: one future for every partition's
    `Results` of the call (no future, callback and wait per partition: at 64 partitions a
    request of 500 records touches about 64). Armed once the call has submitted to every
    partition (a partition answered at once must not end the wait of those still writing)."""

    __slots__ = ("left", "future", "armed")

    def __init__(self, *, armed: bool = True) -> None:
        self.left = 0                       # Results of the call not yet complete
        self.armed = armed
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()

    def done_one(self) -> None:
        self.left -= 1
        if self.left == 0 and self.armed and not self.future.done():
            self.future.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Arm, and wait until every Results of the call is complete, at most timeout_s
        (never cancelling a write: the dedup table needs every write's outcome)."""
        self.armed = True
        if self.left:
            await asyncio.wait((self.future,), timeout=timeout_s)


class Results:
    """The outcomes of one request's records in one partition (an `Outcome`, an int: the
    SN a write was stored under, or a named error each); once every one is known, its
    call's `Barrier` hears it."""

    __slots__ = ("values", "pending", "barrier")

    def __init__(self, count: int, barrier: Barrier | None = None):
        self.values: list[Outcome | int | SmsError | None] = [None] * count
        self.pending = count
        self.barrier = barrier if barrier is not None else Barrier()
        if count:
            self.barrier.left += 1

    def set(self, index: int, value: "Outcome | int | SmsError") -> None:
        if self.values[index] is not None:
            return
        self.values[index] = value
        self.pending -= 1
        if self.pending == 0:
            self.barrier.done_one()


class RunResults:
    """The outcome of one fresh run (`PartitionIngest.submit_fresh`): the SN of its first
    record (record k: value + k * COUNTER_UNIT) or one named error for all of them; its
    call's `Barrier` hears it once known."""

    __slots__ = ("count", "value", "barrier")

    def __init__(self, count: int, barrier: Barrier):
        self.count = count
        self.value: int | SmsError | None = None
        self.barrier = barrier
        barrier.left += 1

    def set(self, value: "int | SmsError") -> None:
        if self.value is None:
            self.value = value
            self.barrier.done_one()


def session_key(producer_id: bytes, session_ordinal: int) -> bytes:
    """The dedup table's name for a session: (producer, partition). A child partition's
    table also holds its ancestors' sessions, so a retry of a record that a parent stored
    is recognised in the child."""
    return producer_id + session_ordinal.to_bytes(4, "big")


class PartitionIngest:
    def __init__(self, chain: ChainConfig, config: StreamConfig, writer: PartitionWriter,
                 resolve_head, ancestors=None, channels: rpc.NodeChannels | None = None):
        self.chain = chain
        self.channels = channels or rpc.NodeChannels()      # to the nodes' cluster ports, with this node's TLS
        self.config = config
        self.writer = writer
        self.limits: PartitionLimits | None = None     # write limits, made when the stream has some
        self.resolve_head = resolve_head
        self.ancestors = ancestors        # () -> [(ordinal, replica addresses, valid_to_ms)]
        self.policy = config.ingestion_policy
        self.table = dedup.DedupTable(chain.chain_id, window_ms=config.dedup_window_ms, policy=self.policy)
        self.ready = asyncio.Event()
        self.tickets: dict[int, tuple[Results, int, Submission]] = {}   # QUEUED records
        self.task: asyncio.Task | None = None
        self.rebuilt_records = 0

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._rebuild(), name=f"rebuild-{self.chain.chain_id}")

    async def close(self) -> None:
        await cancel_and_wait(self.task)
        await self.writer.close()
        for results, i, _s in self.tickets.values():
            results.set(i, Unavailable(f"{self.chain.chain_id}: ingestion closed"))
        self.tickets.clear()

    # --- rebuild ------------------------------------------------------------------------
    async def _rebuild(self) -> None:
        if not self.table.deduplicating:
            self.ready.set()
            return
        while True:
            try:
                records = await self._read_window()
                self.rebuilt_records = self.table.rebuild(records, int(time.time() * 1000))
                self.ready.set()
                log.info("%s: dedup table rebuilt from %d stored records", chain_name(self.chain.chain_id),
                         self.rebuilt_records)
                return
            except (grpc.aio.AioRpcError, SmsError, ConnectionError) as e:
                raise_if_cancelling()
                log.info("%s: rebuild of the dedup table failed, retrying: %s", chain_name(self.chain.chain_id), e)
                await asyncio.sleep(limits.LINK_RETRY_INTERVAL_S)

    async def _read_window(self) -> list[dedup.StoredRecord]:
        """The dedup window of this partition and of every ancestor whose records may
        still be retried (closed within the window), in SN order: a parent's SNs are all
        below its children's."""
        window_start_ms = int(time.time() * 1000) - self.config.dedup_window_ms - limits.DEDUP_CLOCK_SKEW_MS_MAX
        records: list[dedup.StoredRecord] = []
        for ordinal, addresses, valid_to_ms in (await self.ancestors() if self.ancestors else []):
            if valid_to_ms is not None and valid_to_ms < window_start_ms:
                continue
            records.extend(await self._read_ancestor(ordinal, addresses, window_start_ms))
        records.sort(key=lambda r: r.sn)
        return records + await self._read_own(window_start_ms)

    async def _read_ancestor(self, ordinal: int, addresses: list[str], window_start_ms: int):
        last: Exception | None = None
        for address in addresses:     # a closed partition is sealed and drained: any replica will do
            try:
                async with self.channels.node_channel(address) as channel:
                    return await self._read_partition(sms_pb2_grpc.RetrievalStub(channel), ordinal,
                                                      window_start_ms, to_end=True)
            except (grpc.aio.AioRpcError, SmsError) as e:
                raise_if_cancelling()
                last = e
        raise ConnectionError(f"no replica of ancestor p{ordinal:04d} answered: {last}")

    async def _read_own(self, window_start_ms: int) -> list[dedup.StoredRecord]:
        address = await self.resolve_head()
        async with self.channels.node_channel(address) as channel:
            retrieval = sms_pb2_grpc.RetrievalStub(channel)
            deadline = time.monotonic() + limits.DEDUP_REBUILD_TIMEOUT_S
            target = None
            while True:      # everything the head holds must be committed, so we can read it
                status = await self.channels.node_status(address, channel=channel)
                if status is None:
                    raise ConnectionError(f"the head of {self.chain.chain_id} at {address} does not answer")
                mine = [r for r in status.replicas if r.chain_id == self.chain.chain_id]
                if not mine:
                    raise ConnectionError(f"head holds no replica of {self.chain.chain_id} yet")
                if mine[0].epoch < self.chain.epoch or not mine[0].role.startswith("head"):
                    # until the replica leads in this epoch, a deposed predecessor may still
                    # ship it batches that the table must include
                    raise ConnectionError(f"replica of {self.chain.chain_id} not yet head in epoch {self.chain.epoch}")
                last, committed = int(mine[0].last_sn), int(mine[0].committed_sn)
                target = last if target is None else target
                if committed >= target:
                    break
                if time.monotonic() > deadline:
                    raise ConnectionError(f"head of {self.chain.chain_id} has not committed {target}")
                await asyncio.sleep(limits.METASTORE_POLL_INTERVAL_S)
            return await self._read_partition(retrieval, self.chain.ordinal, window_start_ms)

    async def _read_partition(self, retrieval, ordinal: int, window_start_ms: int,
                              to_end: bool = False) -> list[dedup.StoredRecord]:
        """The session fields of the partition's records from window_start_ms; `to_end`: a
        closed partition, read until the end-of-partition answer (a replica that has not
        committed up to the ending SN yet answers empty pages: try another)."""
        it = (await retrieval.GetIterator(sms_pb2.GetIteratorRequest(
            stream=self.chain.stream, partition_id=f"p{ordinal:04d}", iterator_type="AT_TIMESTAMP",
            timestamp_ms=max(0, window_start_ms)), timeout=limits.RPC_TIMEOUT_S)).iterator
        records: list[dedup.StoredRecord] = []
        while True:
            page = await retrieval.GetNextRecords(sms_pb2.GetNextRecordsRequest(
                iterator=it, max_records=limits.GET_RECORDS_COUNT_MAX, include_trimmed=True),
            timeout=limits.RPC_TIMEOUT_S)
            for s in page.slices:
                first_sn = wire.read_header(s.batch).first_sn
                for f in wire.session_fields(s.batch, s.start, s.end):
                    sn = first_sn + f.index * seqno.COUNTER_UNIT
                    records.append(dedup.StoredRecord(
                        session_key(f.producer_id, ordinal if f.session_ordinal is None else f.session_ordinal),
                        f.sssn, f.dedup_key, f.signature, sn, seqno.timestamp_ms_of(sn)))
            if not page.next_iterator:
                return records
            if not page.slices:
                if to_end:
                    raise ConnectionError(f"replica of p{ordinal:04d} has not committed it to its end")
                return records
            it = page.next_iterator

    # --- submissions ---------------------------------------------------------------------
    def submit(self, subs: list[Submission], now_ms: int, *, sn_known: bool = False,
               barrier: Barrier | None = None) -> tuple["Results", set[int]]:
        """The outcomes of the submissions (`Results`, complete when `barrier` hears it)
        and the SSSNs reported missing. The records to write leave as one writer chunk.
        `sn_known`: a duplicate is answered only with the SN of the record it duplicates
        (a producer with an epoch never resends at or below its HWM, so a table that no
        longer knows the SN answers InvalidSssn); writers that pin SSSNs across restarts
        replay below the HWM, and are told "stored" without the SN."""
        results = Results(len(subs), barrier)
        if self.writer.queued_records + len(subs) > limits.INGEST_PENDING_RECORDS_MAX:
            error = Throttled(f"{self.chain.chain_id}: {self.writer.queued_records} records already queued")
            for i in range(len(subs)):
                results.set(i, error)
            return results, set()
        missing: set[int] = set()
        writes: list[tuple[Results, int, Submission, bool]] = []
        deduplicating = self.table.deduplicating
        n, i = len(subs), 0
        while i < n:
            s = subs[i]
            if not s.producer_id or not deduplicating:
                writes.append((results, i, s, False))
                i += 1
                continue
            # a run of one session with one HWM (a request's records usually are one)
            j = i + 1
            while j < n and subs[j].producer_id == s.producer_id and subs[j].hwm == s.hwm \
                    and subs[j].session_ordinal == s.session_ordinal:
                j += 1
            decisions = self.table.submit_run(
                self._key(s), s.hwm, now_ms,
                [(r.sssn, r.submit_ms, r.signature, r.dedup_key) for r in subs[i:j]])
            for k, decision in enumerate(decisions, i):
                if isinstance(decision, SmsError):
                    results.set(k, decision)
                    continue
                if s.session_ordinal is None and decision.missing:
                    # (an inherited session's SSSNs are spread over the parent's children: the
                    # ones this child never saw are not missing)
                    missing.update(decision.missing)
                if decision.kind is dedup.DecisionKind.WRITE:
                    writes.append((results, k, subs[k], True))
                elif decision.kind is dedup.DecisionKind.DUPLICATE:
                    if decision.sn is None and sn_known:
                        results.set(k, InvalidSssn(
                            f"{self.chain.chain_id}: SSSN {subs[k].sssn} is at or below the HWM this session "
                            "sent before; a producer never resends what it acknowledged"))
                    else:
                        results.set(k, Outcome(decision.sn or 0, duplicate=True))
                else:
                    self.tickets[decision.ticket] = (results, k, subs[k])
            i = j
        self._write(writes)
        missing.difference_update(s.sssn for s in subs)   # arrived later in this same request
        return results, missing

    def submit_fresh(self, producer_id: bytes, run: tuple, hwm: int, now_ms: int,
                     barrier: Barrier) -> RunResults | None:
        """A run of one request (`wire.put_runs`: consecutive SSSNs of the producer's
        session with this partition, in the usual form) submitted whole when the table takes
        it as fresh (`DedupTable.submit_fresh`): one table step, one writer chunk, one
        outcome, no object per record. None: not fresh here (a retry, a gap, no room, a
        table still rebuilding, a full queue); nothing changed, and the caller submits its
        records with `submit`, which decides and answers each."""
        _o, _start, count, first, submit_min, submit_max, _hl, _hh, signatures, submits, stored, _size = run
        if not self.table.deduplicating or not self.ready.is_set() \
                or self.writer.queued_records + count > limits.INGEST_PENDING_RECORDS_MAX:
            return None
        key = session_key(producer_id, self.chain.ordinal)
        token = self.table.submit_fresh(key, hwm, now_ms, first, count, submit_min, submit_max, signatures, submits)
        if token is None:
            return None
        results = RunResults(count, barrier)
        try:
            chunk = self.writer.submit(stored, count)
        except SmsError as e:     # writer closed or full: the run was not written
            self._apply(self.table.failed_fresh(key, token))
            results.set(e)
            return results
        chunk.add_done_callback(lambda f: self._written_fresh(f, key, token, results))
        return results

    def _written_fresh(self, chunk: asyncio.Future, key: bytes, token, results: RunResults) -> None:
        error = Unavailable(f"{self.chain.chain_id}: write cancelled") if chunk.cancelled() else chunk.exception()
        if error is None:
            sn = chunk.result()
            resolutions = self.table.committed_fresh(key, token, sn)
            results.set(sn)
        else:
            resolutions = self.table.failed_fresh(key, token)
            results.set(error if isinstance(error, SmsError) else Unavailable(str(error)))
        self._apply(resolutions)

    def _write(self, writes: list[tuple["Results", int, Submission, bool]]) -> None:
        if not writes:
            return
        try:
            chunk = self.writer.submit(wire.stored_entries([w[2] for w in writes]), len(writes))
        except SmsError as e:     # writer closed or full: these writes did not happen
            for results, i, s, tracked in writes:
                if tracked:
                    self._apply(self.table.failed(self._key(s), s.sssn))
                results.set(i, e)
            return
        if self.policy is IngestionPolicy.BEST_EFFORT:
            for results, i, _s, _t in writes:
                results.set(i, Outcome(0))
        chunk.add_done_callback(lambda f: self._written(f, writes))

    def _written(self, chunk: asyncio.Future, writes: list[tuple["Results", int, Submission, bool]]) -> None:
        error = Unavailable(f"{self.chain.chain_id}: write cancelled") if chunk.cancelled() else chunk.exception()
        if error is None:
            sn = chunk.result()
            unit = seqno.COUNTER_UNIT
            resolutions: list[dedup.Resolution] = []
            run_key, run = None, []          # (sssn, sn) of consecutive records of one session
            last_pid, last_ordinal = None, None
            for results, i, s, tracked in writes:
                if tracked:
                    if s.producer_id is not last_pid or s.session_ordinal != last_ordinal:
                        last_pid, last_ordinal = s.producer_id, s.session_ordinal
                        key = self._key(s)
                        if key != run_key and run:
                            resolutions.extend(self.table.committed_run(run_key, run))
                            run = []
                        run_key = key
                    run.append((s.sssn, sn))
                results.set(i, sn)
                sn += unit
            if run:
                resolutions.extend(self.table.committed_run(run_key, run))
            self._apply(resolutions)
        else:
            for results, i, s, tracked in writes:
                if tracked:
                    self._apply(self.table.failed(self._key(s), s.sssn))
                results.set(i, error)

    def _key(self, s: Submission) -> bytes:
        return session_key(s.producer_id, self.chain.ordinal if s.session_ordinal is None else s.session_ordinal)

    def _apply(self, resolutions: list[dedup.Resolution]) -> None:
        writes = []
        for r in resolutions:
            results, i, s = self.tickets.pop(r.ticket)
            if r.kind is dedup.DecisionKind.DUPLICATE:
                results.set(i, Outcome(r.sn or 0, duplicate=True))
            else:
                writes.append((results, i, s, True))
        self._write(writes)

    def prune(self, now_ms: int) -> None:
        self.table.prune(now_ms)

    def status(self) -> dict:
        return {"chain_id": self.chain.chain_id, "policy": self.policy.value, "ready": self.ready.is_set(),
                "table": self.table.stats(), **self.writer.statistics()}
