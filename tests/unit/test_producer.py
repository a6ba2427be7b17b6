"""Unit tests of sms.producer against an in-process fake of the ingestion owners (no sockets).

`FakeCluster` replaces the `sms.aio.Client`'s transport (`send_put_records`) and `get_stream_info`: it serves a
stream map and answers PutRecords like an ingestion owner, with an `ingestion.dedup.DedupTable`
per partition as its brain and a list per partition as its storage (a write commits at
once). It can drop a request, drop a response (after applying it), apply a request twice,
delay, throttle, fail a write, gate every call, and it checks what the producer sends as it
arrives: the HWM of each partition is cumulative (the producer holds an outcome for it and
every SSSN below) and never goes back, a request's records of one partition start at HWM+1
in SSSN order, at most one request per owner is in flight. Scenarios run under
`asyncio.run` with a deadline; linger and backoff are 1 ms unless a test is about them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sms.aio
import sms.client
import sms.accumulator as accumulator_module
import sms.producer as producer_module
from ingestion.fencing import session_producer_id
from ingestion.dedup import (DedupKeyTooLarge, DedupTable, DecisionKind, InvalidDedupKey, InvalidProducerId,
                             SessionConflict, StaleSubmission, TableFull)
from sms import wire, errors, hashing, limits, seqno
from sms.proto import sms_pb2
from sms.limits import (PRODUCER_DEDUP_WINDOW_MARGIN_S, PRODUCER_DELIVERY_TIMEOUT_S, PRODUCER_LINGER_MS,
                        PRODUCER_PENDING_PER_PARTITION_MAX, PRODUCER_SESSION_WINDOW_MAX)
from sms.producer import Producer, ProducerClosed, ProducerResult, ProducerState, SyncProducer
from sms.types import (ChainMember, IngestionPolicy, PartitionInfo, PartitionState, Persistence, StreamInfo,
                       StreamStatus)

STREAM = "s"
NODE_A, NODE_B = "node-a:1", "node-b:1"
SCENARIO_TIMEOUT_S = 10.0
FAST = {"linger_ms": 1, "retry_backoff_ms": 1, "retry_backoff_max_ms": 4}
FAULTS = ("ok", "drop_request", "drop_response", "timeout", "duplicate", "delay", "throttle")


@functools.lru_cache(maxsize=None)
def keys_of(ordinal: int, partitions: int, n: int = 8) -> tuple[str, ...]:
    """n partition keys whose hash falls into partition `ordinal` of an even split."""
    lo, hi = ordinal * hashing.HASH_SPACE // partitions, (ordinal + 1) * hashing.HASH_SPACE // partitions
    return tuple(itertools.islice((k for k in (f"key-{i}" for i in itertools.count())
                                   if lo <= hashing.hash_key_of(k) < hi), n))


@dataclass(frozen=True)
class Received:
    """One record as it reached the fake owner."""

    address: str
    producer_id: bytes
    ordinal: int
    sssn: int
    submit_ms: int
    hwm: int
    meta: dict


class FakeCluster:
    """A stream map and the ingestion owners of its partitions (see the module docstring)."""

    def __init__(self, partitions: int = 2, owners: tuple[str, ...] = (NODE_A,), faults=(), *,
                 window_s: int = 300):
        self.partitions = partitions
        self.owner = {p: owners[p % len(owners)] for p in range(partitions)}
        self.closed: set[int] = set()
        self.window_s = window_s
        self.map_version = 1
        self.tables = {p: DedupTable(f"{STREAM}/p{p}", window_s * 1000) for p in range(partitions)}
        self.stored: dict[int, list[tuple[bytes, int, bytes]]] = defaultdict(list)   # (producer, sssn, data)
        self.sns: dict[tuple[bytes, int, int], int] = {}                          # (producer, p, sssn) -> SN
        self.counter = Counter()
        self.faults = deque(faults)            # one per call, then "ok"
        self.record_errors: dict[tuple[int, int], str] = {}   # (p, sssn) -> error name, once
        self.fail_writes: set[tuple[int, int]] = set()        # (p, sssn): its write fails, once
        self.gate: asyncio.Event | None = None
        self.received: list[Received] = []
        self.requests: list[sms_pb2.PutRecordsRequest] = []
        self.told: dict[tuple[bytes, int], set[int]] = defaultdict(set)   # outcomes the producer holds
        self.last_hwm: dict[tuple[bytes, int], int] = {}
        self.inflight = Counter()
        self.max_inflight = Counter()
        self.max_inflight_total = 0
        self.violations: list[str] = []
        self.refreshes = 0
        self.refresh_failures = 0
        self.crash_with: BaseException | None = None
        self.epochs: dict[bytes, int] = {}         # producer id -> its current epoch (InitProducer)

    def attach(self, client: sms.aio.Client) -> sms.aio.Client:
        client.send_put_records = self.call
        client.get_stream_info = self.get_stream_info
        client.init_producer = self.init_producer
        return client

    async def init_producer(self, stream: str, producer_id: bytes) -> int:
        if stream != STREAM:
            raise errors.StreamNotFound(f"stream {stream!r} not found")
        self.epochs[producer_id] = self.epochs.get(producer_id, 0) + 1
        return self.epochs[producer_id]

    def producer(self, producer_id=b"p-1", **kwargs) -> Producer:
        return Producer(self.attach(sms.aio.Client("fake:0")), STREAM, producer_id, **{**FAST, **kwargs})

    def info(self) -> StreamInfo:
        n = self.partitions
        parts = []
        for p in range(n):
            member = ChainMember(f"n-{self.owner[p]}", self.owner[p], "head+tail") if self.owner[p] else None
            parts.append(PartitionInfo(
                ordinal=p, hash_lo=p * hashing.HASH_SPACE // n, hash_hi=(p + 1) * hashing.HASH_SPACE // n,
                valid_from_ms=0, valid_to_ms=None,
                state=PartitionState.CLOSED if p in self.closed else PartitionState.OPEN,
                parents=(), children=(), chain_epoch=1, chain=(member,) if member else (), ingestion_owner=member))
        return StreamInfo(name=STREAM, status=StreamStatus.ACTIVE, replication_factor=1,
                          persistence=Persistence.MEMORY, ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP,
                          retention_hours=24, map_version=self.map_version, created_ms=0, partitions=tuple(parts),
                          dedup_window_s=self.window_s)

    async def get_stream_info(self, name: str, *, refresh: bool = True) -> StreamInfo:
        self.refreshes += 1
        if self.refresh_failures:
            self.refresh_failures -= 1
            raise errors.Unavailable("control node unavailable")
        if name != STREAM:
            raise errors.StreamNotFound(f"stream {name!r} not found")
        return self.info()

    async def call(self, address, request):
        self.inflight[address] += 1
        self.max_inflight[address] = max(self.max_inflight[address], self.inflight[address])
        self.max_inflight_total = max(self.max_inflight_total, sum(self.inflight.values()))
        try:
            if self.crash_with is not None:
                raise self.crash_with
            if self.gate is not None:
                await self.gate.wait()
            fault = self.faults.popleft() if self.faults else "ok"
            if fault == "delay":
                await asyncio.sleep(0.002)
            if fault == "drop_request":
                raise errors.Unavailable("request lost")
            response = self.apply(address, request, fault)
            if fault == "duplicate":
                response = self.apply(address, request, "ok")
            if fault == "drop_response":
                raise errors.Unavailable("response lost")
            if fault == "timeout":
                raise errors.Timeout("deadline exceeded")
            self.deliver(request, response)
            return response
        finally:
            self.inflight[address] -= 1

    def apply(self, address: str, request, fault: str):
        """Answer a PutRecords as an ingestion owner would, checking what the producer sent."""
        self.requests.append(request)
        pid = request.producer_id
        session = session_producer_id(pid, request.producer_epoch)     # the table's name of the session
        fenced = request.producer_epoch and request.producer_epoch < self.epochs.get(pid, 0)
        now_ms = int(time.time() * 1000)
        entries = list(wire.iter_entries(request.entries, request.count))
        self.check_request(session, request, entries)
        sns, ordinals, errs, duplicates = [], [], [], []
        missing: dict[int, list[int]] = defaultdict(list)
        for j, e in enumerate(entries):
            meta = wire.decode_meta(e.meta)
            sssn = int.from_bytes(meta[wire.TAG_SSSN], "big")
            submit_ms = int.from_bytes(meta[wire.TAG_SUBMIT_MS], "big")
            raw_hash = meta.get(wire.TAG_EXPLICIT_HASH_KEY)
            hash_key = int.from_bytes(raw_hash, "big") if raw_hash else hashing.hash_key_of(e.key.decode())
            ordinal = hash_key * self.partitions // hashing.HASH_SPACE
            hwm = request.hwm.get(ordinal, -1)
            ordinals.append(ordinal)
            self.received.append(Received(address, pid, ordinal, sssn, submit_ms, hwm, meta))
            sn, error = 0, None
            if fenced:
                error = errors.ProducerFenced(f"epoch {request.producer_epoch} < {self.epochs[pid]}")
            elif ordinal in self.closed:
                error = errors.PartitionClosed(f"p{ordinal} is closed")
            elif self.owner[ordinal] != address:
                error = errors.WrongOwner(f"p{ordinal} is owned by {self.owner[ordinal]}")
            elif (ordinal, sssn) in self.record_errors:
                name = self.record_errors.pop((ordinal, sssn))
                error = errors.from_name(name, f"p{ordinal} sssn {sssn}: injected {name}")
            elif fault == "throttle" and j == 0:
                error = TableFull(f"p{ordinal}: injected table full")
            else:
                table = self.tables[ordinal]
                try:
                    decision = table.submit(session, sssn, hwm, submit_ms, hashing.signature(e.key + e.data),
                                            meta.get(wire.TAG_DEDUP_KEY), now_ms)
                except errors.SmsError as exc:
                    error = exc
                else:
                    missing[ordinal].extend(decision.missing)
                    if decision.kind is DecisionKind.WRITE and (ordinal, sssn) in self.fail_writes:
                        self.fail_writes.discard((ordinal, sssn))
                        assert table.failed(session, sssn) == []
                        error = errors.Unavailable(f"p{ordinal} sssn {sssn}: write failed")
                    elif decision.kind is DecisionKind.WRITE:
                        self.counter[ordinal] += 1
                        sn = seqno.make(now_ms, self.counter[ordinal], ordinal)
                        self.stored[ordinal].append((pid, sssn, e.data))
                        self.sns[(pid, ordinal, sssn)] = sn
                        assert table.committed(session, sssn, sn) == []
                    elif decision.kind is DecisionKind.DUPLICATE:
                        duplicates.append(j)
                        sn = decision.sn or 0
                    else:
                        self.violations.append(f"p{ordinal} sssn {sssn} queued: writes commit at once here")
                table.check_invariants()
            if error is not None:
                errs.append(sms_pb2.RecordError(index=j, name=error.name, message=error.message))
            sns.append(seqno.to_bytes(sn))
        return sms_pb2.PutRecordsResponse(
            sequence_numbers=b"".join(sns), ordinals=b"".join(o.to_bytes(4, "little") for o in ordinals),
            errors=errs, duplicates=duplicates,
            missing=[sms_pb2.MissingSssns(ordinal=o, sssns=sorted(set(s))) for o, s in missing.items() if s])

    def check_request(self, pid: bytes, request, entries) -> None:
        by_ordinal: dict[int, list[int]] = defaultdict(list)
        for e in entries:
            meta = wire.decode_meta(e.meta)
            raw_hash = meta.get(wire.TAG_EXPLICIT_HASH_KEY)
            hash_key = int.from_bytes(raw_hash, "big") if raw_hash else hashing.hash_key_of(e.key.decode())
            by_ordinal[hash_key * self.partitions // hashing.HASH_SPACE].append(
                int.from_bytes(meta[wire.TAG_SSSN], "big"))
        for ordinal, sssns in by_ordinal.items():
            if ordinal not in request.hwm:
                self.violations.append(f"p{ordinal}: request without its HWM")
                continue
            hwm = request.hwm[ordinal]
            told = self.told[(pid, ordinal)]
            if any(s not in told for s in range(hwm + 1)):
                self.violations.append(f"p{ordinal}: HWM {hwm} above an SSSN the producer holds no answer for")
            if hwm < self.last_hwm.get((pid, ordinal), -1):
                self.violations.append(f"p{ordinal}: HWM {hwm} after {self.last_hwm[(pid, ordinal)]}")
            self.last_hwm[(pid, ordinal)] = hwm
            if sssns[0] != hwm + 1 or sssns != sorted(set(sssns)):
                self.violations.append(f"p{ordinal}: SSSNs {sssns} with HWM {hwm}")

    def deliver(self, request, response) -> None:
        """Note the outcomes the producer now holds: acks and non-retriable errors."""
        retriable = {e.index for e in response.errors if errors.registry().get(e.name, errors.InternalError).retriable}
        for j, e in enumerate(wire.iter_entries(request.entries, request.count)):
            if j not in retriable:
                ordinal = int.from_bytes(response.ordinals[4 * j:4 * j + 4], "little")
                self.told[(session_producer_id(request.producer_id, request.producer_epoch), ordinal)].add(
                    int.from_bytes(wire.decode_meta(e.meta)[wire.TAG_SSSN], "big"))

    def stored_sssns(self, ordinal: int, pid: bytes = b"p-1") -> list[int]:
        return [s for p, s, _ in self.stored[ordinal] if p == pid]


def run(scenario, timeout_s: float = SCENARIO_TIMEOUT_S):
    async def bounded():
        async with asyncio.timeout(timeout_s):
            return await scenario()
    return asyncio.run(bounded())


async def send_all(producer: Producer, cluster: FakeCluster, per_partition: int, **kwargs) -> list:
    """per_partition records to each partition, round-robin; returns (ordinal, data, future)."""
    out = []
    for i in range(per_partition):
        for p in range(cluster.partitions):
            data = f"p{p}-r{i}".encode()
            out.append((p, data, await producer.send(data, keys_of(p, cluster.partitions)[i % 8], **kwargs)))
    return out


def assert_stored_once_in_order(cluster: FakeCluster, sent: list, pid: bytes = b"p-1", *,
                                stored_in_order: bool = True) -> None:
    """Every acked record stored exactly once, under the SN it was acked with; no failed
    record stored; each session's records first reached the owner in SSSN order. Stored
    in SSSN order too unless the owner refused a record and took later ones of the same
    request (throttled, write failed): then the refused one is stored when it comes back."""
    for p in range(cluster.partitions):
        stored = cluster.stored_sssns(p, pid)
        assert len(stored) == len(set(stored)), f"p{p}: stored twice: {stored}"
        if stored_in_order:
            assert stored == sorted(stored), f"p{p}: stored out of SSSN order: {stored}"
        arrivals = list(dict.fromkeys(r.sssn for r in cluster.received if r.ordinal == p and r.producer_id == pid))
        assert arrivals == sorted(arrivals), f"p{p}: first sent out of SSSN order: {arrivals}"
        acked = {f.result().sssn: f.result() for o, _, f in sent if o == p and f.exception() is None}
        assert set(stored) == set(acked), f"p{p}: stored {stored}, acked {sorted(acked)}"
        for sssn, result in acked.items():
            assert result.sn is None or result.sn == cluster.sns[(pid, p, sssn)]
        data = {s: d for q, s, d in cluster.stored[p] if q == pid}
        for o, sent_data, f in sent:
            if o == p and f.exception() is None:
                assert data[f.result().sssn] == sent_data


# --- sessions, SSSNs, the request fields -----------------------------------------------------

def test_sssns_count_from_zero_per_partition_in_send_order():
    async def scenario():
        cluster = FakeCluster(partitions=3)
        async with cluster.producer() as producer:
            sent = await send_all(producer, cluster, 7)
        for p in range(3):
            assert [f.result().sssn for o, _, f in sent if o == p] == list(range(7))
            assert all(f.result().partition_ordinal == p and not f.result().duplicate for o, _, f in sent if o == p)
        assert_stored_once_in_order(cluster, sent)
        assert cluster.violations == []
    run(scenario)


# --- epochs: a named producer opens a new epoch; an older one is fenced -------------------------

def test_a_restarted_named_producer_stores_what_it_sends():
    """The README's pattern: 5 acked, closed, a new instance of the same id sends 3 more,
    once one by one and once as futures at once: all stored (before epochs: duplicates
    with sn=None, or SessionConflict)."""
    async def scenario():
        cluster = FakeCluster(partitions=1)
        async with cluster.producer(producer_id="checkout-1") as first:
            for i in range(5):
                await first.put(f"a{i}".encode(), "k")
        async with cluster.producer(producer_id="checkout-1") as second:
            results = [await second.put(f"b{i}".encode(), "k") for i in range(3)]
        async with cluster.producer(producer_id="checkout-1") as third:
            futures = [await third.send(f"c{i}".encode(), "k") for i in range(5)]
            results += [await f for f in futures]
        assert (first.epoch, second.epoch, third.epoch) == (1, 2, 3)
        assert {r.producer_epoch for r in cluster.requests} == {1, 2, 3}
        assert all(not r.duplicate and r.sn for r in results)
        assert [d for _p, _s, d in cluster.stored[0]] == [f"a{i}".encode() for i in range(5)] + \
            [f"b{i}".encode() for i in range(3)] + [f"c{i}".encode() for i in range(5)]
        assert cluster.violations == []
    run(scenario)


def test_an_older_instance_is_fenced_and_says_so():
    """A zombie's records fail with ProducerFenced, never silently; it refuses new records
    and flush() raises; the successor's records are stored."""
    async def scenario():
        cluster = FakeCluster(partitions=2)
        zombie = cluster.producer(producer_id="checkout-1")
        await zombie.put(b"before", keys_of(0, 2)[0])
        async with cluster.producer(producer_id="checkout-1") as successor:
            await successor.put(b"successor", keys_of(0, 2)[0])
            late = [await zombie.send(f"late{i}".encode(), keys_of(i % 2, 2)[0]) for i in range(4)]
            outcomes = await asyncio.gather(*late, return_exceptions=True)
            assert all(isinstance(o, errors.ProducerFenced) for o in outcomes), outcomes
            assert zombie.state is ProducerState.FENCED
            with pytest.raises(errors.ProducerFenced):
                await zombie.send(b"more", keys_of(0, 2)[0])
            with pytest.raises(errors.ProducerFenced):
                await zombie.flush()
            await zombie.close()
            assert zombie.state is ProducerState.CLOSED
        stored = [d for p in range(2) for _pid, _s, d in cluster.stored[p]]
        assert sorted(stored) == [b"before", b"successor"]
    run(scenario)


def test_producers_without_epochs_keep_one_session():
    """Random ids, and epochs=False (writers that pin SSSNs), take no epoch."""
    async def scenario():
        cluster = FakeCluster(partitions=1)
        async with cluster.producer(producer_id=None) as anonymous:
            await anonymous.put(b"x", "k")
        async with cluster.producer(producer_id="stage-out", epochs=False) as pinned:
            await pinned.put(b"y", "k")
        assert anonymous.epoch == 0 and pinned.epoch == 0 and cluster.epochs == {}
        assert {r.producer_epoch for r in cluster.requests} == {0}
    run(scenario)


def test_each_entry_carries_sssn_submit_time_and_optional_keys():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        before_ms = int(time.time() * 1000)
        async with cluster.producer(producer_id="orders-7") as producer:
            await producer.put(b"a", "k")
            await producer.put(b"b", "k", dedup_key="order-42")
            await producer.put(b"c", "k", explicit_hash_key=5, dedup_key=b"\x00\x01")
        after_ms = int(time.time() * 1000)
        assert {r.producer_id for r in cluster.requests} == {b"orders-7"}
        metas = [r.meta for r in cluster.received]
        assert [int.from_bytes(m[wire.TAG_SSSN], "big") for m in metas] == [0, 1, 2]
        assert all(len(m[wire.TAG_SSSN]) == 8 and len(m[wire.TAG_SUBMIT_MS]) == 8 for m in metas)
        assert all(before_ms <= int.from_bytes(m[wire.TAG_SUBMIT_MS], "big") <= after_ms for m in metas)
        assert wire.TAG_DEDUP_KEY not in metas[0] and wire.TAG_EXPLICIT_HASH_KEY not in metas[0]
        assert metas[1][wire.TAG_DEDUP_KEY] == b"order-42"
        assert metas[2][wire.TAG_DEDUP_KEY] == b"\x00\x01"
        assert metas[2][wire.TAG_EXPLICIT_HASH_KEY] == (5).to_bytes(16, "big")
        assert wire.TAG_PRODUCER_ID not in metas[0]          # the request names the producer once
        assert [dict(r.hwm) for r in cluster.requests] == [{0: -1}, {0: 0}, {0: 1}]
    run(scenario)


def test_producer_id_is_kept_when_supplied_and_random_otherwise():
    client = sms.aio.Client("fake:0")
    assert Producer(client, STREAM, "orders-7").producer_id == b"orders-7"
    assert Producer(client, STREAM, b"\xff\x00").producer_id == b"\xff\x00"
    assert Producer(client, STREAM, "é" * 32).producer_id == "é".encode() * 32          # 64 bytes
    a, b = Producer(client, STREAM).producer_id, Producer(client, STREAM).producer_id
    assert len(a) == len(b) == 16 and a != b
    for bad in ("", b"", "x" * 65, "é" * 33, 7, ["x"]):
        with pytest.raises(InvalidProducerId):
            Producer(client, STREAM, bad)
    assert issubclass(InvalidProducerId, errors.InvalidArgument)


def test_bad_input_raises_its_named_error_and_queues_nothing():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        async with cluster.producer() as producer:
            cases = [
                ((b"x", ""), {}, errors.InvalidPartitionKey),
                ((b"x", "k" * 257), {}, errors.InvalidPartitionKey),
                ((b"x", 7), {}, errors.InvalidPartitionKey),
                ((12345, "k"), {}, errors.InvalidArgument),
                (("lone \ud800", "k"), {}, errors.InvalidArgument),
                ((b"x" * (limits.RECORD_DATA_BYTES_MAX + 1), "k"), {}, errors.RecordTooLarge),
                ((b"x", "k"), {"explicit_hash_key": -1}, errors.InvalidHashKey),
                ((b"x", "k"), {"explicit_hash_key": "12a"}, errors.InvalidHashKey),
                ((b"x", "k"), {"explicit_hash_key": 1 << 128}, errors.InvalidHashKey),
                ((b"x", "k"), {"dedup_key": b""}, InvalidDedupKey),
                ((b"x", "k"), {"dedup_key": 5}, InvalidDedupKey),
                ((b"x", "k"), {"dedup_key": b"d" * 129}, DedupKeyTooLarge),
            ]
            for args, kwargs, error in cases:
                with pytest.raises(error):
                    await producer.send(*args, **kwargs)
            assert producer.statistics()["sent_total"] == 0
            result = await producer.put(b"ok", "k", dedup_key=b"d" * 128)
            assert result.sssn == 0
        assert cluster.stored_sssns(0) == [0]
        with pytest.raises(errors.InvalidArgument):
            cluster.producer(linger_ms=-1)
        with pytest.raises(errors.InvalidArgument):
            cluster.producer(delivery_timeout_s=PRODUCER_DELIVERY_TIMEOUT_S + 1)
        with pytest.raises(errors.InvalidArgument):
            cluster.producer(max_pending_per_partition=0)
    run(scenario)


def test_unknown_stream_fails_the_first_send():
    async def scenario():
        cluster = FakeCluster()
        producer = Producer(cluster.attach(sms.aio.Client("fake:0")), "nope", b"p-1")
        with pytest.raises(errors.StreamNotFound):
            await producer.send(b"x", "k")
        await producer.close()
    run(scenario)


# --- retries, duplicates, missing SSSNs, HWM ---------------------------------------------------

def test_retries_reuse_the_sssn_and_the_first_submit_time():
    async def scenario():
        cluster = FakeCluster(partitions=2, faults=["drop_request", "drop_response", "timeout", "ok",
                                                    "drop_response", "throttle"])
        clock = itertools.count(int(time.time() * 1000))
        async with cluster.producer(clock_ms=lambda: next(clock)) as producer:
            sent = await send_all(producer, cluster, 5)
            await producer.flush()
            assert producer.statistics()["retries_total"] > 0
        submit_times: dict[tuple[int, int], set[int]] = defaultdict(set)
        for r in cluster.received:
            submit_times[(r.ordinal, r.sssn)].add(r.submit_ms)
        assert sorted(submit_times) == [(p, s) for p in range(2) for s in range(5)]
        assert all(len(t) == 1 for t in submit_times.values()), submit_times
        copies = Counter((r.ordinal, r.sssn) for r in cluster.received)
        assert max(copies.values()) > 1
        # one clock reading per request that sends records for the first time: they share it
        seen: set[tuple[int, int]] = set()
        first_sends = 0
        for request in cluster.requests:
            ordinals = wire.decode_ordinals(request.session_ordinals)
            sssns = [int.from_bytes(wire.decode_meta(e.meta)[wire.TAG_SSSN], "big")
                     for e in wire.iter_entries(request.entries, request.count)]
            fresh = set(zip(ordinals, sssns)) - seen
            first_sends += bool(fresh)
            seen |= fresh
        assert len(set().union(*submit_times.values())) == first_sends
        assert_stored_once_in_order(cluster, sent)
        assert cluster.violations == []
    run(scenario)


def test_a_resent_record_already_stored_is_acked_as_a_duplicate_with_its_sn():
    async def scenario():
        cluster = FakeCluster(partitions=1, faults=["drop_response"])
        async with cluster.producer() as producer:
            result = await producer.put(b"x", "k")
        assert result.duplicate and result.sssn == 0
        assert result.sn == cluster.sns[(b"p-1", 0, 0)] and result.sequence_number == str(result.sn)
        assert cluster.stored_sssns(0) == [0]
        assert producer.statistics()["duplicates_total"] == 1
    run(scenario)


def test_a_request_applied_twice_stores_each_record_once():
    async def scenario():
        cluster = FakeCluster(partitions=2, faults=["duplicate"] * 3)
        async with cluster.producer() as producer:
            sent = await send_all(producer, cluster, 4)
        assert all(f.result().duplicate for _, _, f in sent[:1])
        assert_stored_once_in_order(cluster, sent)
        assert cluster.violations == []
    run(scenario)


def test_missing_sssns_are_resent_at_once_skipping_the_backoff():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        cluster.fail_writes.add((0, 1))                    # the owner loses sssn 1, reports it missing
        async with cluster.producer(retry_backoff_ms=2000, retry_backoff_max_ms=2000) as producer:
            cluster.gate = asyncio.Event()
            futures = [await producer.send(f"r{i}".encode(), "k") for i in range(4)]
            cluster.gate.set()
            started = time.monotonic()
            await producer.flush()
            assert time.monotonic() - started < 1.0        # not the 2 s backoff
            stats = producer.statistics()
        assert stats["missing_resends_total"] == 1 and stats["retries_total"] == 1
        assert [f.result().sssn for f in futures] == [0, 1, 2, 3]
        assert cluster.stored_sssns(0) == [0, 2, 3, 1]     # the owner wrote 1 when it came back
        assert [r.sssn for r in cluster.received] == [0, 1, 2, 3, 1]
        assert cluster.violations == []
    run(scenario)


def test_missing_sssns_of_a_throttled_session_wait_for_the_backoff():
    async def scenario():
        cluster = FakeCluster(partitions=1, faults=["throttle"])   # sssn 0 refused, 1.. written
        async with cluster.producer(retry_backoff_ms=300, retry_backoff_max_ms=300) as producer:
            cluster.gate = asyncio.Event()
            futures = [await producer.send(f"r{i}".encode(), "k") for i in range(3)]
            cluster.gate.set()
            started = time.monotonic()
            await producer.flush()
            assert time.monotonic() - started >= 0.3
            assert producer.statistics()["missing_resends_total"] == 0
        assert [f.result().sssn for f in futures] == [0, 1, 2]
        assert cluster.stored_sssns(0) == [1, 2, 0]
    run(scenario)


def test_a_non_retriable_error_fails_only_its_record_and_the_hwm_passes_it():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        cluster.record_errors[(0, 2)] = "SessionConflict"
        cluster.record_errors[(0, 3)] = "StaleSubmission"
        async with cluster.producer() as producer:
            cluster.gate = asyncio.Event()
            futures = [await producer.send(f"r{i}".encode(), "k") for i in range(5)]
            cluster.gate.set()
            await producer.flush()
            assert producer.statistics()["hwm"] == {0: 4}
            late = await producer.put(b"late", "k")
        with pytest.raises(SessionConflict):
            futures[2].result()
        with pytest.raises(StaleSubmission):
            futures[3].result()
        assert [f.result().sssn for i, f in enumerate(futures) if i not in (2, 3)] == [0, 1, 4]
        assert late.sssn == 5 and dict(cluster.requests[-1].hwm) == {0: 4}
        assert cluster.stored_sssns(0) == [0, 1, 4, 5]
        assert cluster.violations == []
    run(scenario)


def test_a_whole_call_failing_non_retriably_fails_its_records():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        async with cluster.producer() as producer:
            async def refuse(*args, **kwargs):
                raise errors.RequestTooLarge("too large, says the owner")
            producer._client.send_put_records = refuse
            future = await producer.send(b"x", "k")
            with pytest.raises(errors.RequestTooLarge):
                await future
            assert producer.statistics()["hwm"] == {0: 0}
    run(scenario)


def test_wrong_owner_refreshes_the_map_and_resends_to_the_new_owner():
    async def scenario():
        cluster = FakeCluster(partitions=2, owners=(NODE_A,))
        async with cluster.producer() as producer:
            await producer.put(b"first", keys_of(1, 2)[0])
            cluster.owner[1] = NODE_B                   # moved; the producer's map still says A
            cluster.refresh_failures = 2                # and the next two refreshes fail
            refreshes = cluster.refreshes
            result = await producer.put(b"second", keys_of(1, 2)[0])
            assert producer.statistics()["map_refreshes_total"] == 3
        assert result.sssn == 1 and cluster.refreshes == refreshes + 3
        arrivals = [(r.address, r.sssn) for r in cluster.received]
        assert arrivals[:2] == [(NODE_A, 0), (NODE_A, 1)] and arrivals[-1] == (NODE_B, 1)
        assert set(arrivals[2:-1]) <= {(NODE_A, 1)}               # the old map, while refreshes failed
        assert cluster.stored_sssns(1) == [0, 1]
    run(scenario)


def test_a_call_held_by_an_owner_that_moved_is_given_up_and_resent_to_the_new_owner():
    """A paused head holds the call (it never answers); once the map names another owner,
    the producer gives the call up and resends the same SSSNs there, well before
    PUT_TIMEOUT_S."""
    async def scenario():
        cluster = FakeCluster(partitions=1, owners=(NODE_A,))
        held = asyncio.Event()
        async with cluster.producer() as producer:
            await producer.put(b"first", "k")
            call = cluster.call

            async def paused_a(address, request):
                if address == NODE_A:
                    held.set()
                    await asyncio.Event().wait()          # never answers
                return await call(address, request)
            producer._client.send_put_records = paused_a
            future = await producer.send(b"second", "k")
            await held.wait()
            cluster.owner[0] = NODE_B                      # the chain manager moved the head
            started = time.monotonic()
            result = await asyncio.wait_for(future, 5)
            assert time.monotonic() - started < 2 * limits.PRODUCER_OWNER_CHECK_S + 1
        assert result.sssn == 1 and not result.duplicate
        assert [(r.address, r.sssn) for r in cluster.received][-1] == (NODE_B, 1)
        assert cluster.stored_sssns(0) == [0, 1]
    run(scenario)


def test_records_of_a_closed_partition_wait_for_an_open_one_and_are_never_stored_in_it():
    # (with a real map a closed partition's children cover its range and its records go
    # there: tests/integration/test_repartition.py; this fake map closes one with none)
    async def scenario():
        cluster = FakeCluster(partitions=2)
        async with cluster.producer(delivery_timeout_s=0.5) as producer:
            await producer.put(b"w", keys_of(0, 2)[0])          # the producer's map: both open
            cluster.closed.add(1)
            closed = await producer.send(b"x", keys_of(1, 2)[0])
            still_open = await producer.send(b"y", keys_of(0, 2)[0])
            with pytest.raises(errors.Timeout):
                await closed
            assert (await still_open).sssn == 1
            with pytest.raises(errors.Unavailable):              # the refreshed map: no open partition
                await producer.send(b"z", keys_of(1, 2)[0])
            assert producer.statistics()["hwm"] == {0: 1, 1: 0}
        assert cluster.stored_sssns(1) == []
    run(scenario)


def test_a_record_not_delivered_in_time_fails_with_timeout():
    async def scenario():
        cluster = FakeCluster(partitions=1, faults=["drop_request"] * 10_000)
        async with cluster.producer(delivery_timeout_s=0.2) as producer:
            started = time.monotonic()
            futures = [await producer.send(f"r{i}".encode(), "k") for i in range(3)]
            for f in futures:
                with pytest.raises(errors.Timeout):
                    await f
            assert 0.2 <= time.monotonic() - started < 2.0
            stats = producer.statistics()
            assert stats["hwm"] == {0: 2} and stats["expired_total"] == 3
        assert cluster.stored_sssns(0) == []
    run(scenario)


def test_delivery_timeout_stays_inside_the_dedup_window():
    skew_s = limits.DEDUP_CLOCK_SKEW_MS_MAX / 1000
    assert PRODUCER_DELIVERY_TIMEOUT_S + skew_s + PRODUCER_DEDUP_WINDOW_MARGIN_S < limits.DEDUP_WINDOW_MS_DEFAULT / 1000
    assert PRODUCER_DEDUP_WINDOW_MARGIN_S + skew_s < limits.DEDUP_WINDOW_MS_MIN / 1000
    assert limits.PUT_RECORDS_COUNT_MAX <= PRODUCER_SESSION_WINDOW_MAX <= limits.DEDUP_ENTRIES_PER_SESSION_MAX

    async def scenario():              # a stream with a short window shortens every record's deadline
        cluster = FakeCluster(partitions=1, window_s=limits.DEDUP_WINDOW_MS_MIN // 1000)
        async with cluster.producer() as producer:
            await producer.put(b"x", "k")
            cluster.gate = asyncio.Event()
            now_s = asyncio.get_running_loop().time()
            future = await producer.send(b"y", "k")
            record = producer._acc.sessions[0].records[1]
            assert record.deadline_s - now_s <= 60 - skew_s - PRODUCER_DEDUP_WINDOW_MARGIN_S + 0.1
            cluster.gate.set()
            await future
    run(scenario)


def test_a_stuck_sssn_holds_the_session_inside_the_owners_window(monkeypatch):
    monkeypatch.setattr(accumulator_module, "PRODUCER_SESSION_WINDOW_MAX", 4)

    async def scenario():
        cluster = FakeCluster(partitions=1)
        for _ in range(6):
            cluster.faults.append("throttle")         # sssn 0 refused again and again
        async with cluster.producer() as producer:
            cluster.gate = asyncio.Event()
            futures = [await producer.send(f"r{i}".encode(), "k") for i in range(12)]
            cluster.gate.set()
            await producer.flush()
        assert [f.result().sssn for f in futures] == list(range(12))
        assert all(r.sssn <= r.hwm + 4 for r in cluster.received), [(r.sssn, r.hwm) for r in cluster.received]
        assert cluster.violations == []
        assert_stored_once_in_order(cluster, [(0, f"r{i}".encode(), f) for i, f in enumerate(futures)],
                                    stored_in_order=False)
    run(scenario)


# --- batching, flow control, flush, close ---------------------------------------------------

def test_records_sent_together_linger_into_one_request():
    async def scenario():
        cluster = FakeCluster(partitions=4)
        async with cluster.producer(linger_ms=50) as producer:
            sent = await send_all(producer, cluster, 25)
            await asyncio.wait([f for _, _, f in sent])
        assert len(cluster.requests) == 1 and cluster.requests[0].count == 100
        assert sorted(cluster.requests[0].hwm) == [0, 1, 2, 3]
        assert PRODUCER_LINGER_MS == 5
    run(scenario)


def test_a_request_holds_at_most_put_records_count_max_records():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        async with cluster.producer(linger_ms=100) as producer:
            futures = [await producer.send(b"x", "k") for _ in range(limits.PUT_RECORDS_COUNT_MAX + 100)]
            await producer.flush()
        assert [r.count for r in cluster.requests] == [limits.PUT_RECORDS_COUNT_MAX, 100]
        assert [f.result().sssn for f in futures] == list(range(limits.PUT_RECORDS_COUNT_MAX + 100))
    run(scenario)


def test_a_request_holds_at_most_put_records_bytes_max():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        big = b"x" * limits.RECORD_DATA_BYTES_MAX
        async with cluster.producer(linger_ms=100) as producer:
            for _ in range(6):
                await producer.send(big, "k")
            await producer.flush()
        assert [r.count for r in cluster.requests] == [4, 2]
        assert all(len(r.entries) - r.count * wire.ENTRY.size <= limits.PUT_RECORDS_BYTES_MAX
                   for r in cluster.requests)
    run(scenario)


def test_at_most_one_request_in_flight_per_owner():
    async def scenario():
        cluster = FakeCluster(partitions=6, owners=(NODE_A, NODE_B), faults=["delay"] * 10_000)
        async with cluster.producer(linger_ms=0) as producer:
            sent = []
            for _ in range(10):
                sent += await send_all(producer, cluster, 3)
                await asyncio.sleep(0)
        assert max(cluster.max_inflight.values()) == 1
        assert cluster.max_inflight_total == 2               # the owners are served in parallel
        assert len(cluster.requests) > 2
        assert_stored_once_in_order(cluster, sent)
        assert cluster.violations == []
    run(scenario)


def test_send_waits_while_its_partition_has_max_pending_records():
    async def scenario():
        cluster = FakeCluster(partitions=2)
        async with cluster.producer(max_pending_per_partition=3) as producer:
            cluster.gate = asyncio.Event()
            first = [await producer.send(b"x", keys_of(0, 2)[0]) for _ in range(3)]
            blocked = asyncio.ensure_future(producer.send(b"y", keys_of(0, 2)[0]))
            other = await producer.send(b"z", keys_of(1, 2)[0])    # another partition is not held up
            await asyncio.sleep(0.05)
            assert not blocked.done()
            assert producer.statistics()["pending"] == {0: 3, 1: 1}
            cluster.gate.set()
            fourth = await blocked
            assert (await fourth).sssn == 3 and (await other).sssn == 0
            assert all(f.done() for f in first)
    run(scenario)


def test_send_waits_while_pending_bytes_are_at_their_bound():
    async def scenario():
        cluster = FakeCluster(partitions=2)
        async with cluster.producer(max_pending_bytes=1000) as producer:
            cluster.gate = asyncio.Event()
            first = await producer.send(b"x" * 900, keys_of(0, 2)[0])
            blocked = asyncio.ensure_future(producer.send(b"y" * 200, keys_of(1, 2)[0]))
            await asyncio.sleep(0.05)
            assert not blocked.done()
            cluster.gate.set()
            await (await blocked)
            assert first.done()
    run(scenario)


def test_flush_waits_for_every_record_sent_before_it():
    async def scenario():
        cluster = FakeCluster(partitions=3)
        producer = cluster.producer(linger_ms=producer_module.PRODUCER_LINGER_MS_MAX)
        cluster.gate = asyncio.Event()
        sent = await send_all(producer, cluster, 4)
        flush = asyncio.ensure_future(producer.flush())
        await asyncio.sleep(0.05)
        assert not flush.done() and not any(f.done() for _, _, f in sent)
        cluster.gate.set()
        await flush                                    # without waiting out the 1 s linger
        assert all(f.done() for _, _, f in sent)
        assert producer.statistics()["pending"] == {0: 0, 1: 0, 2: 0}
        await producer.close()
    run(scenario)


def test_close_flushes_refuses_new_records_and_is_idempotent():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        producer = cluster.producer(linger_ms=200)
        future = await producer.send(b"x", "k")
        await producer.close()
        assert future.done() and future.result().sssn == 0
        assert producer.state is ProducerState.CLOSED and producer._sender.done()
        with pytest.raises(ProducerClosed):
            await producer.send(b"y", "k")
        await producer.close()
        await producer.flush()
    run(scenario)


def test_a_cancelled_close_can_be_resumed_and_concurrent_closes_wait_for_one_another():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        producer = cluster.producer()
        cluster.gate = asyncio.Event()
        future = await producer.send(b"x", "k")
        first = asyncio.ensure_future(producer.close())
        await asyncio.sleep(0.02)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert producer.state is ProducerState.CLOSING and not future.done()
        with pytest.raises(ProducerClosed):
            await producer.send(b"y", "k")
        second, third = asyncio.ensure_future(producer.close()), asyncio.ensure_future(producer.close())
        await asyncio.sleep(0.02)
        assert not second.done() and not third.done()
        cluster.gate.set()
        await asyncio.gather(second, third)
        assert future.result().sssn == 0 and producer.state is ProducerState.CLOSED
    run(scenario)


def test_statistics_count_what_happened():
    async def scenario():
        cluster = FakeCluster(partitions=2, faults=["drop_request"])
        cluster.fail_writes.add((0, 1))
        async with cluster.producer() as producer:
            cluster.gate = asyncio.Event()
            await send_all(producer, cluster, 3)
            await asyncio.sleep(0.05)                       # the request is at the gate
            stats = producer.statistics()
            assert stats["pending"] == {0: 3, 1: 3} and stats["inflight_requests"] == 1
            assert stats["inflight_records"] == 6 and stats["state"] == "RUNNING"
            cluster.gate.set()
            await producer.flush()
            stats = producer.statistics()
        assert stats["sent_total"] == stats["acked_total"] == 6
        assert stats["call_failures_total"] == 1 and stats["retries_total"] == 7
        assert stats["missing_resends_total"] == 1 and stats["hwm"] == {0: 2, 1: 2}
        assert stats["pending"] == {0: 0, 1: 0} and stats["pending_bytes"] == 0
    run(scenario)


def test_a_sender_bug_fails_every_pending_record_and_the_producer():
    async def scenario():
        cluster = FakeCluster(partitions=1)
        cluster.crash_with = RuntimeError("a bug")
        producer = cluster.producer()
        future = await producer.send(b"x", "k")
        with pytest.raises(errors.InternalError, match="a bug"):
            await future
        assert producer.state is ProducerState.BROKEN
        with pytest.raises(errors.InternalError):
            await producer.send(b"y", "k")
        await producer.close()
        assert producer.state is ProducerState.CLOSED
    run(scenario)


# --- faults at random -------------------------------------------------------------------------

def _random_faults_scenario(faults: list[str], partitions: int, owners: int, per_partition: int,
                            lost: list[tuple[int, int]]) -> None:
    async def scenario():
        cluster = FakeCluster(partitions, (NODE_A, NODE_B)[:owners], faults)
        cluster.fail_writes.update(lost)
        resolved = Counter()
        async with cluster.producer() as producer:
            sent = []
            for i in range(per_partition):
                for p in range(partitions):
                    data = f"p{p}-r{i}".encode()
                    future = await producer.send(data, keys_of(p, partitions)[i % 8])
                    future.add_done_callback(lambda f: resolved.update([id(f)]))
                    sent.append((p, data, future))
                if i % 3 == 0:
                    await asyncio.sleep(0)
            await producer.flush()
            assert all(f.done() and f.exception() is None for _, _, f in sent)
            stats = producer.statistics()
        await asyncio.sleep(0)
        assert sorted(resolved.values()) == [1] * len(sent)
        assert stats["acked_total"] == stats["sent_total"] == len(sent)
        assert stats["hwm"] == {p: per_partition - 1 for p in range(partitions)}
        assert_stored_once_in_order(cluster, sent, stored_in_order="throttle" not in faults and not lost)
        for p in range(partitions):
            assert [f.result().sssn for o, _, f in sent if o == p] == list(range(per_partition))
        submit_times = defaultdict(set)
        for r in cluster.received:
            submit_times[(r.ordinal, r.sssn)].add(r.submit_ms)
        assert all(len(t) == 1 for t in submit_times.values())
        assert max(cluster.max_inflight.values()) == 1
        assert cluster.violations == []
    run(scenario)


@settings(max_examples=150)
@given(faults=st.lists(st.sampled_from(FAULTS), max_size=40),
       partitions=st.integers(1, 4), owners=st.integers(1, 2), per_partition=st.integers(1, 40),
       lost=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 39)), max_size=5))
def test_every_record_is_stored_once_in_order_whatever_the_faults(faults, partitions, owners, per_partition,
                                                                   lost):
    _random_faults_scenario(faults, partitions, owners, per_partition, lost)


def test_a_long_run_of_faults_of_every_kind():
    _random_faults_scenario(list(FAULTS) * 20, 4, 2, 150, [(p, s) for p in range(4) for s in (0, 7, 149)])


# --- the synchronous wrapper -------------------------------------------------------------------

def test_sync_producer_runs_on_the_clients_loop():
    cluster = FakeCluster(partitions=2, faults=["drop_response"])
    with sms.client.Client("fake:0") as client:
        cluster.attach(client._aio)
        with SyncProducer(client, STREAM, "sync-1", **FAST) as producer:
            assert producer.producer_id == b"sync-1"
            futures = [producer.send(f"r{i}".encode(), keys_of(0, 2)[0]) for i in range(5)]
            assert all(isinstance(f, concurrent.futures.Future) for f in futures)
            result = producer.put(b"last", keys_of(1, 2)[0], dedup_key="d-1")
            assert isinstance(result, ProducerResult) and result.partition_ordinal == 1
            producer.flush()
            assert [f.result(timeout=5).sssn for f in futures] == [0, 1, 2, 3, 4]
            assert not futures[0].cancel()                # sent records cannot be called back
            with pytest.raises(errors.InvalidPartitionKey):
                producer.send(b"x", "")
            assert producer.statistics()["acked_total"] == 6
        with pytest.raises(ProducerClosed):
            producer.send(b"x", "k")
        producer.close()
    assert cluster.stored_sssns(0, b"sync-1") == [0, 1, 2, 3, 4]
    with pytest.raises(ProducerClosed):                    # the client's loop is gone
        producer.send(b"x", "k")


def test_defaults():
    assert PRODUCER_PENDING_PER_PARTITION_MAX == 10_000 and PRODUCER_DELIVERY_TIMEOUT_S == 120
