"""The ingestion role: PutRecords validation, routing, de-duplication, acknowledgements.

A request is validated whole before anything is queued (bad input changes nothing):
framing, counts, sizes, partition keys, explicit hash keys and producer-session fields.
Each record then goes to the open partition whose hash range holds its key. A partition
whose chain head is not on this node answers that record with WrongOwner, so the client
refreshes its map and re-routes; the other records proceed. Records of a partition go
to its `PartitionIngest` (dedup table + writer); a partition taken up here answers only
once its table is rebuilt from storage.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kernel.tenants import TenantShares
from metastore import MetaStoreError
from metastore.view import ClusterView, bounded
from ingestion.fencing import ProducerEpochs, session_producer_id
from ingestion.partition import Barrier, Outcome, PartitionIngest, Results, RunResults, Submission
from ingestion.writer import PartitionWriter
from sms import wire, limits, seqno
from kernel import metrics, rpc
from kernel.aiotools import cancel_and_wait, wait_event
from sms.errors import InvalidArgument, PartitionClosed, SmsError, StreamNotFound, Unavailable, WrongOwner
from kernel.ratelimit import PartitionLimits
from sms.metadata import ChainConfig, chain_name, tenant_of
from kernel.ports import HeadPort
from sms.proto import sms_pb2, sms_pb2_grpc
from kernel.rpc import rpc_errors
from sms.types import IngestionPolicy, PartitionState, StreamStatus, partition_id

log = logging.getLogger(__name__)

# PutRecords waits at most METADATA_READ_WAIT_S for the stream's metadata. A node that
# cannot read it in that time may be cut off from the metadata store, its session (and
# with it its ownership) gone, the chain moved on: it answers Unavailable, and the client
# asks another node for the map. Without the bound, a head cut off from ZooKeeper (yet
# reached by clients) held every call for the store's own timeout (ZK_OPERATION_TIMEOUT_S,
# 30 s, as long as the client's PUT_TIMEOUT_S) and answered INTERNAL, so producers kept
# sending to it and its partitions took no write until it could reach ZooKeeper again
# (tests/netfault/trials.py head_isolated_from_zk).


def parse_put_entries(count: int, blob: bytes, producer_id: bytes, epoch: int = 0) -> list[tuple[int, Submission]]:
    """(hash key, submission) per record, or a named error for the whole request. The
    submissions of a producer with an epoch are in that epoch's sessions."""
    entries = wire.parse_put(count, blob, producer_id)
    session_id = session_producer_id(producer_id, epoch)
    return [(e.hash_key, Submission(e.key, e.data, session_id, e.sssn, e.submit_ms, e.dedup_key, -1,
                                    e.session_ordinal, e.headers, e.signature))
            for e in entries]


class IngestionService(sms_pb2_grpc.IngestionServicer):
    def __init__(self, node_id: str, view: ClusterView, local_head: HeadPort | None = None,
                 channels: rpc.NodeChannels | None = None):
        self.node_id = node_id
        self.view = view
        self.channels = channels or rpc.NodeChannels()      # to the nodes' cluster ports, with this node's TLS
        self.local_head = local_head      # this process's storage role's heads (kernel/ports.py), or None
        self.partitions: dict[str, PartitionIngest] = {}
        self.tenants = TenantShares(view)
        self.epochs = ProducerEpochs(view.store)
        self._pruner: asyncio.Task | None = None
        self._closing: set[asyncio.Task] = set()

    def start(self) -> None:
        self._pruner = asyncio.get_running_loop().create_task(self._prune_loop(), name="dedup-prune")

    async def close(self) -> None:
        await cancel_and_wait(self._pruner)
        await self.epochs.close()
        for part in list(self.partitions.values()):
            await part.close()
        self.partitions.clear()

    async def _prune_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.DEDUP_PRUNE_INTERVAL_MS / 1000)
            now_ms = int(time.time() * 1000)
            for part in list(self.partitions.values()):
                part.prune(now_ms)
            try:
                await self._retire_moved()
            except (SmsError, MetaStoreError, TimeoutError) as e:     # (the metadata store away: next round)
                log.info("ownership check failed: %s: %s", type(e).__name__, e)
            except Exception:                   # (never the end of pruning and retiring: logged, next round)
                log.exception("ownership check failed")

    async def _retire_moved(self) -> None:
        """Close the partitions whose head (and so ingestion ownership) left this node, and
        those a split or merge closed (their parents' writes are all settled by then)."""
        for cid, part in list(self.partitions.items()):
            try:
                view = await self.view.stream(part.chain.stream)
                chain = view.chains.get(part.chain.ordinal)
                closed = all(e.ordinal != part.chain.ordinal or e.state is not PartitionState.OPEN
                             for e in view.map.entries)
            except StreamNotFound:
                chain, closed = None, True
            if chain is None or chain.head != self.node_id or closed:
                self._retire(cid)

    def _retire(self, chain_id: str) -> None:
        part = self.partitions.pop(chain_id, None)
        if part is None:
            return
        log.info("%s: ingestion ownership left %s; closing (a retry goes to the new owner)", chain_name(chain_id),
                 self.node_id)
        task = asyncio.get_running_loop().create_task(part.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    def _within_limits(part: PartitionIngest, config, indexes: list[int], records, outcomes: list) -> list[int]:
        """The records of `indexes` (in request order) that fit the partition's write limits
        now, taken from them; each of the rest is answered Throttled with how long to wait
        (not stored), and the producer resends it."""
        now = time.monotonic()
        part.limits = PartitionLimits.kept(part.limits, config.write_records_per_s, config.write_bytes_per_s,
                                           limits.PARTITION_LIMIT_BURST_S, now)
        sizes = [len(records[i][1].data) + len(records[i][1].key) for i in indexes] if config.write_bytes_per_s \
            else [0] * len(indexes)
        admitted, wait_s = part.limits.admit(sizes, now)
        if admitted < len(indexes):
            error = part.limits.throttled(wait_s, part.chain.chain_id)
            for i in indexes[admitted:]:
                outcomes[i] = error
        return indexes[:admitted]

    def _partition(self, chain: ChainConfig, view) -> PartitionIngest:
        """The partition's ingest state, made at first use. No await in here: two
        concurrent requests must not both make one. A new epoch with the head still here
        keeps the state: the writer picks the epoch up and resends what is in flight."""
        part = self.partitions.get(chain.chain_id)
        if part is not None:
            return part
        stream, ordinal = chain.stream, chain.ordinal

        async def resolve_head() -> str:
            return (await resolve())[0]

        async def resolve() -> tuple[str, int]:
            current = (await self.view.stream(stream)).chains.get(ordinal)
            if current is None or current.head != self.node_id:
                self.view.invalidate()
                raise WrongOwner(f"{chain.chain_id}: the head is no longer on {self.node_id}")
            head = (await self.view.nodes()).get(current.head)
            if head is None:
                self.view.invalidate()
                raise Unavailable(f"{chain.chain_id}: head {current.head} is not registered")
            return head.internal_address, current.epoch

        async def ancestors() -> list[tuple[int, list[str], int | None]]:
            """(ordinal, replica addresses, valid_to_ms) of every ancestor still in the map."""
            current = await self.view.stream(stream)
            nodes = await self.view.nodes()
            by_ordinal = {e.ordinal: e for e in current.map.entries}
            out, todo, seen = [], list(by_ordinal[ordinal].parents) if ordinal in by_ordinal else [], set()
            while todo:
                o = todo.pop()
                if o in seen or o not in by_ordinal:
                    continue
                seen.add(o)
                c = current.chains.get(o)
                addresses = [nodes[n].internal_address for n in (c.members if c else ()) if n in nodes]
                out.append((o, addresses, by_ordinal[o].valid_to_ms))
                todo.extend(by_ordinal[o].parents)
            return out

        writer = PartitionWriter(chain.chain_id, chain.epoch, resolve, self.local_head, self.channels)
        writer.start()
        part = PartitionIngest(chain, view.config, writer, resolve_head, ancestors, self.channels)
        part.start()
        self.partitions[chain.chain_id] = part
        return part

    async def _stream_view(self, stream: str):
        """The stream's view, or Unavailable if the metadata store does not answer in
        METADATA_READ_WAIT_S (metastore/view.py bounded)."""
        return await bounded(self.view.stream(stream), f"PutRecords to {stream[:64]!r} on {self.node_id}")

    @rpc_errors
    async def PutRecords(self, request, context):
        t0 = time.perf_counter()
        view = await self._stream_view(request.stream)
        if view.config.status is not StreamStatus.ACTIVE:
            raise Unavailable(f"stream {request.stream!r} is {view.config.status.value}")
        epoch = request.producer_epoch
        if epoch and not request.producer_id:
            raise InvalidArgument("producer_epoch without a producer_id")
        limited = view.config.write_records_per_s or view.config.write_bytes_per_s
        runs = None
        if request.session_ordinals and request.producer_id and not limited \
                and view.config.ingestion_policy is IngestionPolicy.AT_LEAST_ONCE_NO_DUP:
            # the producer's usual request, as runs of columns (None: anything else, or bad input)
            runs = wire.put_runs(request.count, request.entries, request.producer_id,
                                 session_producer_id(request.producer_id, epoch), request.session_ordinals)
        if runs is None:
            records = parse_put_entries(request.count, request.entries, request.producer_id, epoch)
        if epoch:
            await self.epochs.admit(request.stream, request.producer_id, epoch)
        if runs is not None:
            answer = await self._put_runs(request, view, runs, epoch, t0)
            if answer is not None:
                return answer
            records = parse_put_entries(request.count, request.entries, request.producer_id, epoch)
        if request.session_ordinals:
            if not request.producer_id or len(request.session_ordinals) != wire.ORDINAL.size * len(records):
                raise InvalidArgument(f"session_ordinals of {len(request.session_ordinals)} bytes; expected 4 per "
                                      "record, with a producer session")
            for (_h, sub), session_ordinal in zip(records, wire.decode_ordinals(request.session_ordinals)):
                if sub.session_ordinal is None:
                    sub.session_ordinal = session_ordinal
        # the tenant's share here takes a prefix of the request; the rest is answered Throttled
        tenant_admitted, tenant_throttled = await self.tenants.admit_write(tenant_of(request.stream), records)
        by_partition: dict[int, list[int]] = {}
        sizes: dict[int, int] = {}              # bytes per partition (metrics)
        ordinals = [0] * len(records)
        unrouted: set[int] = set()
        outcomes: list[Outcome | int | SmsError | None] = [None] * len(records)
        entries = {e.ordinal: e for e in view.map.entries}
        for i in range(tenant_admitted, len(records)):
            outcomes[i] = tenant_throttled
            unrouted.add(i)
        hwm_of = dict(request.hwm)               # (a protobuf map: read once, not per record)
        open_state = PartitionState.OPEN
        for i in range(tenant_admitted):
            hash_key, sub = records[i]
            so = sub.session_ordinal
            session = entries.get(so) if so is not None else None
            if session is not None and session.state is open_state:
                # the usual record: its session's partition is open here, and is where it goes
                # (no bisect of the open map)
                if not session.covers(hash_key):
                    raise InvalidArgument(f"record {i}: its session partition p{session.ordinal:04d} does not "
                                          "cover its hash key")
                entry = session
                sub.session_ordinal = None
            else:
                entry = view.map.open_for_hash(hash_key)
            if sub.session_ordinal is not None:
                # a record of the producer's session with a partition since split or merged
                session = entries.get(sub.session_ordinal)
                if session is None and sub.session_ordinal < view.map.next_ordinal:
                    raise InvalidArgument(f"record {i}: session partition p{sub.session_ordinal:04d} of "
                                          f"{request.stream} no longer exists (retention dropped it)")
                if session is None:      # newer than this node's map: it refreshes meanwhile
                    self.view.invalidate()
                    unrouted.add(i)
                    outcomes[i] = PartitionClosed(f"p{sub.session_ordinal:04d} of {request.stream} is not in "
                                                  f"map version {view.map.version} here yet; retry")
                    continue
                if not session.covers(hash_key):
                    raise InvalidArgument(f"record {i}: its session partition p{session.ordinal:04d} does not "
                                          "cover its hash key")
                if session.state is PartitionState.OPEN:
                    entry = session      # this node's map is older: the parent's head decides
                if session.ordinal == entry.ordinal:
                    sub.session_ordinal = None
            ordinal = entry.ordinal
            ordinals[i] = ordinal
            sub.hwm = hwm_of.get(ordinal if sub.session_ordinal is None else sub.session_ordinal, -1)
            by_partition.setdefault(ordinal, []).append(i)
            sizes[ordinal] = sizes.get(ordinal, 0) + len(sub.data) + len(sub.key)
        missing_out = []
        submitted: list[tuple[list[int], Results]] = []
        barrier = Barrier(armed=False)          # every partition's writes of this call
        for ordinal, indexes in by_partition.items():
            chain = view.chains.get(ordinal)
            try:
                if chain is None:
                    raise PartitionClosed(f"partition {ordinal} of {request.stream} has no chain")
                if chain.sealed:
                    self.view.invalidate()
                    raise PartitionClosed(f"partition p{ordinal:04d} of {request.stream} is closing for a "
                                          f"repartition (map version {view.map.version}); refresh the map")
                if chain.head != self.node_id:
                    self._retire(chain.chain_id)
                    raise WrongOwner(f"partition {ordinal} of {request.stream} is owned by {chain.head}")
                part = self._partition(chain, view)
                if limited:
                    indexes = self._within_limits(part, view.config, indexes, records, outcomes)
                    if not indexes:
                        continue
                if not part.ready.is_set():
                    if not await wait_event(part.ready, limits.APPEND_TIMEOUT_S):
                        raise Unavailable(f"{chain.chain_id}: de-duplication table still rebuilding")
                if epoch and not self.epochs.still_current(request.stream, request.producer_id, epoch):
                    # (its verdict ran out during the awaits above: checked again on the retry)
                    raise Unavailable(f"{chain.chain_id}: the producer's epoch is being checked again; retry")
                results, missing = part.submit([records[i][1] for i in indexes], int(time.time() * 1000),
                                               sn_known=bool(epoch), barrier=barrier)
                submitted.append((indexes, results))
                if missing:
                    missing_out.append(sms_pb2.MissingSssns(ordinal=ordinal, sssns=sorted(missing)))
            except SmsError as e:
                for i in indexes:
                    outcomes[i] = e
        await barrier.wait(limits.APPEND_TIMEOUT_S)
        late = Unavailable("commit not confirmed in time; retry with the same SSSN")
        for indexes, results in submitted:
            for i, value in zip(indexes, results.values):
                outcomes[i] = late if value is None else value
        answer = _Answer()
        for i, o in enumerate(outcomes):
            answer.add(i, o, ordinals[i])
        _count_put(request.stream, records, by_partition, sizes, answer, ordinals, unrouted)
        return answer.response(request.stream, t0, missing_out, view.map.version)

    async def _put_runs(self, request, view, runs: list, epoch: int, t0: float):
        """PutRecords of the producer's usual request (`wire.put_runs`), run by run: each
        run whose partition is open, owned here and ready, with every record's hash key in
        its range, goes to its partition whole (`PartitionIngest.submit_fresh`); a run the
        table does not take as fresh goes record by record (`submit`) like any other. The
        answer is the one the record-by-record path gives. None, before anything is
        submitted: a run this path does not route (another owner, a closing or newer
        partition, a tenant's limit...); the caller takes the record-by-record path."""
        if len(runs) != len({run[0] for run in runs}):
            # a partition's records in several runs (SSSNs with gaps, or partitions interleaved:
            # SPS outputs pin their SSSNs so): its records go together, record by record
            return None
        entries = {e.ordinal: e for e in view.map.entries}
        open_state = PartitionState.OPEN
        parts: list[PartitionIngest] = []
        for run in runs:
            entry = entries.get(run[0])
            chain = view.chains.get(run[0])
            if entry is None or entry.state is not open_state or chain is None or chain.sealed \
                    or chain.head != self.node_id or not (entry.covers(run[6]) and entry.covers(run[7])):
                return None
            part = self._partition(chain, view)
            if not part.ready.is_set():
                return None
            parts.append(part)
        if not await self.tenants.writes_unlimited(tenant_of(request.stream)):
            return None
        if epoch and not self.epochs.still_current(request.stream, request.producer_id, epoch):
            return None
        session_id = session_producer_id(request.producer_id, epoch)
        hwm_of = dict(request.hwm)
        now_ms = int(time.time() * 1000)
        barrier = Barrier(armed=False)
        records = None                  # parsed only if a run goes record by record
        submitted: list[RunResults | Results] = []
        missing_of: dict[int, set[int]] = {}         # (one run per partition: submit leaves out its own SSSNs)
        for run, part in zip(runs, parts):
            ordinal, start, count = run[0], run[1], run[2]
            hwm = hwm_of.get(ordinal, -1)
            results = part.submit_fresh(session_id, run, hwm, now_ms, barrier)
            if results is None:
                if records is None:
                    records = parse_put_entries(request.count, request.entries, request.producer_id, epoch)
                subs = [records[i][1] for i in range(start, start + count)]
                for sub in subs:
                    sub.hwm, sub.session_ordinal = hwm, None
                results, missing = part.submit(subs, now_ms, sn_known=bool(epoch), barrier=barrier)
                if missing:
                    missing_of.setdefault(ordinal, set()).update(missing)
            submitted.append(results)
        missing_out = [sms_pb2.MissingSssns(ordinal=o, sssns=sorted(m)) for o, m in missing_of.items() if m]
        await barrier.wait(limits.APPEND_TIMEOUT_S)
        late = Unavailable("commit not confirmed in time; retry with the same SSSN")
        answer = _Answer()
        stored: dict[int, tuple[int, int]] = {}      # per partition: records and bytes stored (metrics)
        for (ordinal, start, count, *_columns, size), results in zip(runs, submitted):
            if type(results) is RunResults:
                value = late if results.value is None else results.value
                if type(value) is int:
                    answer.add_run(value, count, ordinal)
                    stored[ordinal] = (count, size)
                    continue
                values: list = [value] * count
            else:
                values = [late if v is None else v for v in results.values]
            ok = sum(answer.add(k, o, ordinal) for k, o in enumerate(values, start))
            if ok:
                stored[ordinal] = (ok, size * ok // count)   # (bytes: the run's share; exact when all are stored)
        _count_stored(request.stream, request.count, stored, answer)
        return answer.response(request.stream, t0, missing_out, view.map.version)

    @rpc_errors
    async def IngestionStatus(self, request, context):
        return sms_pb2.IngestionStatusResponse(node_id=self.node_id, partitions=[
            sms_pb2.PartitionIngestStatus(chain_id=st["chain_id"], policy=st["policy"], ready=st["ready"],
                                          table=st["table"], queued_records=st["queued_records"],
                                          inflight_batches=st["inflight_batches"])
            for st in (p.status() for p in self.partitions.values())])


class _Answer:
    """A PutRecords answer, built record by record in request order: each record's SN (0:
    failed, or a duplicate whose SN is no longer known), the partition it is in, the
    duplicates and the errors by index."""

    __slots__ = ("sns", "ordinals", "duplicates", "errors")

    def __init__(self) -> None:
        self.sns: list[int] = []
        self.ordinals: list[int] = []
        self.duplicates: list[int] = []
        self.errors: list[sms_pb2.RecordError] = []

    def add(self, index: int, outcome, routed: int) -> bool:
        """Record `index`'s outcome (an SN it was stored under, an `Outcome` or an error;
        `routed`: the partition it went to). True when this call stored it."""
        if type(outcome) is int:                  # stored under this SN (the usual answer)
            self.sns.append(outcome)
            self.ordinals.append(seqno.ordinal_of(outcome))
            return True
        if isinstance(outcome, Outcome):
            self.sns.append(outcome.sn)
            # (a duplicate may live in a parent)
            self.ordinals.append(seqno.ordinal_of(outcome.sn) if outcome.sn else routed)
            if outcome.duplicate:
                self.duplicates.append(index)
            return not outcome.duplicate
        err = outcome if isinstance(outcome, SmsError) else Unavailable(str(outcome))
        self.sns.append(0)
        self.ordinals.append(routed)
        self.errors.append(sms_pb2.RecordError(index=index, name=err.name, message=err.message))
        return False

    def add_run(self, first_sn: int, count: int, ordinal: int) -> None:
        """`count` records stored in `ordinal` from `first_sn` on (one per counter step)."""
        unit = seqno.COUNTER_UNIT
        self.sns.extend(range(first_sn, first_sn + count * unit, unit))
        self.ordinals.extend([ordinal] * count)

    def response(self, stream: str, t0: float, missing: list, map_version: int) -> sms_pb2.PutRecordsResponse:
        metrics.COMMIT_SECONDS.labels(stream).observe(time.perf_counter() - t0)
        sn_bytes, ordinal_bytes = wire.encode_put_results(self.sns, self.ordinals)
        return sms_pb2.PutRecordsResponse(
            sequence_numbers=sn_bytes, ordinals=ordinal_bytes,
            errors=self.errors, duplicates=self.duplicates, missing=missing, map_version=map_version)


def _count_put(stream: str, records, by_partition: dict[int, list[int]], sizes: dict[int, int], answer: _Answer,
               routed: list[int], unrouted: set[int]) -> None:
    """A PutRecords call's metrics (`_count_stored`): records and bytes acknowledged per
    partition are the submitted ones but those that failed or were duplicates, taken off
    one by one."""
    done = {o: len(indexes) for o, indexes in by_partition.items()}
    for i in [e.index for e in answer.errors] + list(answer.duplicates):
        o = routed[i]
        if i not in unrouted and o in done:
            done[o] -= 1
            sizes[o] -= len(records[i][1].data) + len(records[i][1].key)
    _count_stored(stream, len(records), {o: (n, max(0, sizes.get(o, 0))) for o, n in done.items() if n > 0},
                  answer)


def _count_stored(stream: str, count: int, stored: dict[int, tuple[int, int]], answer: _Answer) -> None:
    """A PutRecords call of `count` records: records and bytes stored per partition,
    duplicates, and errors by name."""
    metrics.PUT_BATCH_RECORDS.labels(stream).observe(count)
    for o, (n, size) in stored.items():
        metrics.PUT_RECORDS.labels(stream, partition_id(o)).inc(n)
        metrics.PUT_BYTES.labels(stream, partition_id(o)).inc(size)
    if answer.duplicates:
        metrics.PUT_DUPLICATES.labels(stream).inc(len(answer.duplicates))
    for e in answer.errors:
        metrics.PUT_RECORD_ERRORS.labels(stream, e.name).inc()
