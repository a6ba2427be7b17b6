"""Repartitioning (split, merge, scale) of a live stream, through real processes.

The switch protocol (control/repartition.py) seals the parents, waits for their heads to
drain, then commits a map whose children govern from a boundary time above every parent
SN. These tests check what that promises to writers and readers: de-duplicating
producers and plain put_records keep going across every switch with nothing lost or
stored twice; a reader walking the lineage (read_stream) sees every acked record exactly
once, a partition's records only after all of its parents', and per key in SN order;
a closed parent reads to its ending SN and then names its children; AT_TIMESTAMP and
AT_SEQUENCE_NUMBER position correctly around a switch; and the named errors of bad
requests change nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict

import pytest

import sms
import sms.aio
from sms import errors, limits, seqno
from sms.hashing import HASH_SPACE, hash_key_of
from sms.types import PartitionState, Record
from tests.conftest import POLL_INTERVAL_S, stream_name, wait_until

pytestmark = pytest.mark.integration

ACCEPTANCE_TIMEOUT_S = 150.0      # the whole acceptance scenario, as a backstop
TAIL_CATCH_UP_S = 60.0            # the tailing reader sees every acked record within this


async def until(predicate, timeout_s: float, what: str):
    """`wait_until` for coroutines: poll without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def until_async(predicate, timeout_s: float, what: str):
    """`until` for an async predicate."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(POLL_INTERVAL_S)


async def _read_ends(client, stream: str, ordinal: int) -> bool:
    """Whether a read of the partition from its start reaches the end of a closed partition."""
    iterator = await client.get_iterator(stream, ordinal, "TRIM_HORIZON")
    while iterator:
        answer = await client.get_next_records(iterator, max_records=10_000)
        if answer.next_iterator is None:
            return True
        if not answer.records:
            return False
        iterator = answer.next_iterator
    return False


def open_partitions(info) -> list:
    return sorted((p for p in info.partitions if p.state is PartitionState.OPEN), key=lambda p: p.hash_lo)


def even_ranges(n: int) -> list[tuple[int, int]]:
    bounds = [i * HASH_SPACE // n for i in range(n)] + [HASH_SPACE]
    return list(zip(bounds, bounds[1:]))


def shape(info) -> list[tuple]:
    """What a failed request must not change: the map's version and every entry."""
    return [info.map_version, info.repartition] + [
        (p.ordinal, p.state, p.hash_lo, p.hash_hi, p.parents, p.children, p.ending_sn, p.valid_from_ms,
         p.valid_to_ms) for p in sorted(info.partitions, key=lambda p: p.ordinal)]


def describe_sn(sn: int) -> str:
    return f"p{seqno.ordinal_of(sn):04d}/{seqno.timestamp_ms_of(sn)}/{seqno.counter_of(sn)}"


def send_order_violations_of(producer: str, sent: list[tuple[str, bytes, int | None]]) -> list[str]:
    """Pairs of one producer's records of one key, in send order, whose SNs (None: not
    acked yet) do not increase."""
    last: dict[str, tuple[bytes, int]] = {}
    out = []
    for key, data, sn in sent:
        if sn is None:
            continue
        if key in last and last[key][1] >= sn:
            out.append(f"{producer}: {last[key][0]!r} (SN {describe_sn(last[key][1])}) sent before "
                       f"{data!r} (SN {describe_sn(sn)})")
        last[key] = (data, sn)
    return out


def check_lineage_order(records: list[Record], info, who: str) -> None:
    """Each partition's first record comes after the last record of each of its parents
    (and so of every ancestor) that holds records."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, r in enumerate(records):
        first.setdefault(r.partition_ordinal, i)
        last[r.partition_ordinal] = i
    for p in info.partitions:
        if p.ordinal not in first:
            continue
        for parent in p.parents:
            if parent in last:
                assert first[p.ordinal] > last[parent], (
                    f"{who}: first record of {p.partition_id} (#{first[p.ordinal]}) read before the last "
                    f"record of its parent p{parent:04d} (#{last[parent]})")


def check_per_key_order(records: list[Record], who: str) -> None:
    last: dict[str, int] = {}
    for r in records:
        if r.partition_key in last:
            assert r.sn > last[r.partition_key], (
                f"{who}: key {r.partition_key}: SN {r.sn} (p{r.partition_ordinal:04d}) read after "
                f"{last[r.partition_key]} (p{seqno.ordinal_of(last[r.partition_key]):04d})")
        last[r.partition_key] = r.sn


def check_map_lineage(info, read: list[Record]) -> None:
    """Closed partitions carry their ending SN and children; children govern from the
    parent's end; every SN's time lies in the validity range of its partition."""
    by = {p.ordinal: p for p in info.partitions}
    per_partition: dict[int, list[int]] = defaultdict(list)
    for r in read:
        per_partition[r.partition_ordinal].append(r.sn)
    for p in info.partitions:
        sns = per_partition.get(p.ordinal, [])
        for sn in sns:
            ts = seqno.timestamp_ms_of(sn)
            assert p.valid_from_ms <= ts, f"{p.partition_id}: SN time {ts} before its valid_from {p.valid_from_ms}"
            assert p.valid_to_ms is None or ts < p.valid_to_ms, \
                f"{p.partition_id}: SN time {ts} at or after its valid_to {p.valid_to_ms}"
        if p.state is PartitionState.OPEN:
            assert p.valid_to_ms is None and not p.children and p.ending_sn is None, p
            continue
        assert p.ending_sn is not None, f"closed {p.partition_id} has no ending SN"
        assert p.children, f"closed {p.partition_id} has no children"
        assert p.valid_to_ms is not None
        if p.ending_sn:
            assert seqno.ordinal_of(p.ending_sn) == p.ordinal
            assert sns and sns[-1] == p.ending_sn, \
                f"{p.partition_id}: ending SN {p.ending_sn}, last record read {sns[-1] if sns else None}"
        else:
            assert not sns, f"{p.partition_id}: ending SN 0 but {len(sns)} records read"
        for c in p.children:
            child = by[c]
            assert p.ordinal in child.parents, f"{child.partition_id} does not name its parent {p.partition_id}"
            assert child.valid_from_ms == p.valid_to_ms, \
                f"{child.partition_id} valid from {child.valid_from_ms}, parent {p.partition_id} to {p.valid_to_ms}"
            if p.ending_sn:
                assert child.valid_from_ms > seqno.timestamp_ms_of(p.ending_sn), \
                    f"{child.partition_id} valid from {child.valid_from_ms}, not above its parent's last SN time"
            child_sns = per_partition.get(c, [])
            if child_sns:
                assert seqno.timestamp_ms_of(child_sns[0]) >= child.valid_from_ms
                assert not p.ending_sn or child_sns[0] > p.ending_sn


# --- 1. the acceptance test of the issue ------------------------------------------------------

def test_producers_and_tailing_reader_across_split_split_merge_scale_scale(cluster):
    """3 de-duplicating producers on 200 keys and a tailing reader run while a 2-partition
    stream goes through split, split, merge, scale(8), scale(2); afterwards every acked
    record is read exactly once, in lineage and per-key order, by both readers, and each
    producer's records of a key are stored in the order it sent them."""
    stream = stream_name("repartition-acceptance")
    producers, keys = 3, [f"key-{k}" for k in range(200)]
    burst, pace_s = 10, 0.01            # at most ~1000 records/s per producer
    records_between_switches = 400

    async def scenario() -> dict:
        admin = sms.aio.Client(cluster.address)
        tail_client = sms.aio.Client(cluster.address)
        writer_clients = [sms.aio.Client(cluster.address) for _ in range(producers)]
        stop = asyncio.Event()
        tasks: list[asyncio.Task] = []
        try:
            await admin.create_stream(stream, partitions=2, replication_factor=2)
            sent: list[list[tuple[str, bytes, asyncio.Future]]] = [[] for _ in range(producers)]
            ack_order: list[list[int]] = [[] for _ in range(producers)]
            acked = [0]
            tail: list[Record] = []

            async def produce(n: int) -> None:
                rng = random.Random(n)
                producer = writer_clients[n].producer(stream, producer_id=f"producer-{n}")
                try:
                    i = 0
                    while not stop.is_set():
                        for _ in range(burst):
                            key = keys[rng.randrange(len(keys))]
                            data = f"{n}|{key}|{i}".encode()
                            future = await producer.send(data, key)
                            index = len(sent[n])
                            sent[n].append((key, data, future))

                            def on_done(_f, n=n, index=index):
                                ack_order[n].append(index)
                                acked[0] += 1
                            future.add_done_callback(on_done)
                            i += 1
                        await asyncio.sleep(pace_s)
                finally:
                    await producer.close()

            async def follow() -> None:
                reader = tail_client.read_stream(stream, follow=True, wait_ms=500)
                try:
                    async for record in reader:
                        tail.append(record)
                finally:
                    await reader.aclose()

            tasks += [asyncio.create_task(produce(n), name=f"producer-{n}") for n in range(producers)]
            tailer = asyncio.create_task(follow(), name="tailer")
            tasks.append(tailer)

            async def progress(what: str) -> None:
                """Let the producers write a while before the next switch."""
                target = acked[0] + records_between_switches
                await until(lambda: acked[0] >= target or any(t.done() for t in tasks), 30,
                            f"{records_between_switches} more acks {what}")
                for t in tasks:
                    if t.done():
                        t.result()          # a producer or the reader failed: raise its error

            timings = {}
            started = time.monotonic()
            await progress("before the first split")
            info = await admin.split(stream, 0)
            timings["split p0000"] = time.monotonic() - started
            assert [p.ordinal for p in open_partitions(info)] == [2, 3, 1]
            await progress("after the first split")
            info = await admin.split(stream, 3)
            timings["split p0003"] = time.monotonic() - started
            await progress("after the second split")
            info = await admin.get_stream_info(stream)
            opened = open_partitions(info)
            pairs = [(a, b) for a, b in zip(opened, opened[1:]) if a.hash_hi == b.hash_lo]
            # prefer two partitions of different parents: the merge joins two lineages
            a, b = next(((a, b) for a, b in pairs if a.parents != b.parents), pairs[0])
            info = await admin.merge(stream, a.partition_id, b.partition_id)
            timings[f"merge {a.partition_id} {b.partition_id}"] = time.monotonic() - started
            await progress("after the merge")
            info = await admin.scale(stream, 8)
            timings["scale 8"] = time.monotonic() - started
            assert [(p.hash_lo, p.hash_hi) for p in open_partitions(info)] == even_ranges(8)
            await progress("after scale(8)")
            info = await admin.scale(stream, 2)
            timings["scale 2"] = time.monotonic() - started
            assert [(p.hash_lo, p.hash_hi) for p in open_partitions(info)] == even_ranges(2)
            await progress("after scale(2)")

            stop.set()
            await asyncio.gather(*tasks[:producers])     # each closes its producer: flushed
            assert not tailer.done(), f"the tailing reader stopped: {tailer}"

            results = {}
            for n in range(producers):
                for key, data, future in sent[n]:
                    assert future.done(), f"producer-{n}: a future is not settled after close()"
                    assert future.exception() is None, f"producer-{n}: {data!r} failed: {future.exception()!r}"
                    results[(n, data)] = future.result()
            acked_sns = {r.sn for r in results.values()}

            def tail_caught_up() -> bool:
                if tailer.done():
                    tailer.result()
                return len(acked_sns - {r.sn for r in tail}) == 0
            await until(tail_caught_up, TAIL_CATCH_UP_S, "the tailing reader to see every acked record")
            tailer.cancel()
            try:
                await tailer
            except asyncio.CancelledError:
                pass

            final = [r async for r in admin.read_stream(stream)]
            info = await admin.get_stream_info(stream)
            return {"sent": sent, "ack_order": ack_order, "results": results, "tail": list(tail),
                    "final": final, "info": info, "timings": timings}
        finally:                 # on a failure: stop what still runs before closing the clients
            stop.set()
            running = [t for t in tasks if not t.done()]
            for t in running:
                t.cancel()
            if running:
                await asyncio.wait(running, timeout=10)
            for c in [admin, tail_client, *writer_clients]:
                await c.close()

    out = asyncio.run(asyncio.wait_for(scenario(), ACCEPTANCE_TIMEOUT_S))
    sent, ack_order, results, info = out["sent"], out["ack_order"], out["results"], out["info"]
    final, tail = out["final"], out["tail"]

    # every future has a result with an SN, in the partition its SN names
    by_sn: dict[int, tuple[int, str, bytes]] = {}
    for n in range(producers):
        for key, data, _future in sent[n]:
            r = results[(n, data)]
            assert r.sn is not None, f"producer-{n}: {data!r} acked without an SN: {r}"
            assert seqno.ordinal_of(r.sn) == r.partition_ordinal
            assert r.sn not in by_sn, f"two records acked with SN {r.sn}"
            by_sn[r.sn] = (n, key, data)
    total = sum(len(s) for s in sent)
    assert len(by_sn) == total > 6 * 400

    # both readers: every acked record exactly once with its bytes
    for who, records in (("final read", final), ("tailing reader", tail)):
        sns = [r.sn for r in records]
        assert len(sns) == len(set(sns)), f"{who}: {len(sns) - len(set(sns))} records read twice"
        assert set(sns) == set(by_sn), (f"{who}: {len(set(by_sn) - set(sns))} acked records not read, "
                                        f"{len(set(sns) - set(by_sn))} read that were not acked")
        for r in records:
            _n, key, data = by_sn[r.sn]
            assert (r.partition_key, r.data) == (key, data), f"{who}: SN {r.sn} holds other bytes"
            assert r.partition_ordinal == seqno.ordinal_of(r.sn)

    # per (producer, key): SNs strictly increase in send order and in ack order
    send_order_violations = []
    for n in range(producers):
        send_order_violations += send_order_violations_of(
            f"producer-{n}", [(key, data, results[(n, data)].sn) for key, data, _future in sent[n]])
        assert sorted(ack_order[n]) == list(range(len(sent[n])))
        acked_sns_of_key: dict[str, list[int]] = defaultdict(list)
        for index in ack_order[n]:
            key, data, _future = sent[n][index]
            acked_sns_of_key[key].append(results[(n, data)].sn)
        for key, sns in acked_sns_of_key.items():
            assert all(x < y for x, y in zip(sns, sns[1:])), f"producer-{n} key {key}: SNs not in ack order"

    # both readers: per key in SN order, each partition after all of its parents
    for who, records in (("final read", final), ("tailing reader", tail)):
        check_per_key_order(records, who)
        check_lineage_order(records, info, who)

    # the map: 2 + 2 + 2 + 1 + scale steps, lineage consistent with what was read
    assert len([p for p in info.partitions if p.state is PartitionState.CLOSED]) >= 9
    assert [(p.hash_lo, p.hash_hi) for p in open_partitions(info)] == even_ranges(2)
    assert info.repartition and info.repartition.get("done") and not info.repartition.get("error")
    check_map_lineage(info, final)
    # every partition of the final map took records (the producers wrote between switches)
    read_from = {r.partition_ordinal for r in final}
    assert read_from >= {p.ordinal for p in open_partitions(info)}, "an open partition took no record"
    print(f"{total} records sent; switches done at {out['timings']}; "
          f"records per partition {dict(sorted(Counter(r.partition_ordinal for r in final).items()))}")
    assert not send_order_violations, (f"records stored out of their producer's send order: "
                                       f"{len(send_order_violations)} pairs, e.g. {send_order_violations[:2]}")


def test_producer_with_a_stale_map_keeps_its_sessions_apart_across_a_split(make_cluster, monkeypatch):
    """A producer with a stale map must not mix its sessions. Two storage nodes; a 1-partition
    stream splits into a child led by the parent's head (`same`) and one led by the other
    node (`other`). A producer that loaded its map before the split sends records whose
    hash lies in `same`: still in its session with p0000, to p0000's owner. A record in
    `other` then gets WrongOwner, so the producer refreshes its map; its new session with
    `same` starts at SSSN 0. Every record must be stored once and every future succeed.
    (Before PutRecordsRequest.session_ordinals, the node filed the stale records under the
    session (producer, same) and the new session's SSSNs 10..19 failed with SessionConflict.)"""
    # The map must stay stale until WrongOwner: a call unanswered for PRODUCER_OWNER_CHECK_S
    # (a loaded machine) would otherwise read a fresh map early and the stale path would go
    # untested (CI saw exactly that: no refresh left for the reroute to make).
    monkeypatch.setattr(limits, "PRODUCER_OWNER_CHECK_S", 60.0)
    local = make_cluster(nodes=2)
    stream = stream_name("repartition-stale-producer")

    async def scenario():
        async with sms.aio.Client(local.address) as writer, sms.aio.Client(local.address) as admin:
            await writer.create_stream(stream, partitions=1, replication_factor=1)
            producer = writer.producer(stream, producer_id="stale-map")
            futures = []

            async def send_in(partition, n: int, tag: str) -> list:
                width = partition.hash_hi - partition.hash_lo
                out = [await producer.send(f"{tag} {i}".encode(), f"{tag}-{i}",
                                           explicit_hash_key=partition.hash_lo + (2 * i + 1) * (width // (2 * n)))
                       for i in range(n)]
                futures.extend(out)
                await producer.flush()
                return out

            info = await writer.get_stream_info(stream)
            first = await send_in(info.partition(0), 10, "first")          # session p0000: SSSNs 0..9
            assert all(f.exception() is None for f in first)

            info = await admin.split(stream, 0)
            parent_head = info.partition(0).chain[0].node_id
            children = [info.partition(c) for c in info.partition(0).children]
            same = [c for c in children if c.chain[0].node_id == parent_head]
            other = [c for c in children if c.chain[0].node_id != parent_head]
            assert same and other, f"placement: parent led by {parent_head}, children by " \
                                   f"{[c.chain[0].node_id for c in children]}"
            same, other = same[0], other[0]
            # the parent's node knows the split (its retrieval role reads p0000 to the end)
            await until_async(lambda: _read_ends(admin, stream, 0), 10, "p0000 to read as closed on its node")

            await send_in(same, 10, "stale")     # still in its session with p0000 (map not refreshed)
            refreshes = producer.statistics()["map_refreshes_total"]
            await send_in(other, 1, "reroute")           # WrongOwner: the producer refreshes its map
            assert producer.statistics()["map_refreshes_total"] > refreshes
            await send_in(same, 30, "fresh")     # its new session with the child: SSSNs 0..29
            await producer.close()
            failed = [f.exception() for f in futures if f.exception() is not None]
            read = [r async for r in admin.read_stream(stream)]
            return failed, futures, read

    failed, futures, read = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert not failed, f"{len(failed)} of {len(futures)} records failed, e.g. {failed[0]!r}"
    acked = sorted(f.result().sn for f in futures)
    assert sorted(r.sn for r in read) == acked, "every acked record is stored once"


def test_each_producer_keeps_per_key_order_across_repeated_scaling(cluster):
    """Producers send continuously on a few keys while the stream scales 2 -> 8 -> 2 ...;
    after each switch every acked record of a (producer, key) has a higher SN than the
    ones that producer sent before it. It stops at the first violation; with the bug
    present one shows within the first switches (in every run seen), fixed it does all."""
    stream = stream_name("repartition-producer-order")
    producers, keys = 3, [f"key-{k}" for k in range(50)]

    async def scenario() -> list[str]:
        admin = sms.aio.Client(cluster.address)
        writer_clients = [sms.aio.Client(cluster.address) for _ in range(producers)]
        stop = asyncio.Event()
        sent: list[list[tuple[str, bytes, asyncio.Future]]] = [[] for _ in range(producers)]
        tasks: list[asyncio.Task] = []
        try:
            await admin.create_stream(stream, partitions=2, replication_factor=1)

            async def produce(n: int) -> None:
                rng = random.Random(100 + n)
                producer = writer_clients[n].producer(stream, producer_id=f"order-{n}")
                try:
                    i = 0
                    while not stop.is_set():
                        for _ in range(10):
                            key = keys[rng.randrange(len(keys))]
                            data = f"{n}|{key}|{i}".encode()
                            sent[n].append((key, data, await producer.send(data, key)))
                            i += 1
                        await asyncio.sleep(0.005)
                finally:
                    await producer.close()

            tasks += [asyncio.create_task(produce(n)) for n in range(producers)]

            def violations() -> list[str]:
                out = []
                for n in range(producers):
                    for _key, data, f in sent[n]:
                        assert not (f.done() and f.exception()), f"{data!r} failed: {f.exception()!r}"
                    out += send_order_violations_of(f"order-{n}", [
                        (key, data, f.result().sn if f.done() else None) for key, data, f in sent[n]])
                return out

            for target in (8, 2, 8, 2):
                count = sum(len(x) for x in sent)
                await until(lambda: sum(len(x) for x in sent) >= count + 500 or any(t.done() for t in tasks), 30,
                            "500 more records sent")
                await admin.scale(stream, target)
                for t in tasks:
                    if t.done():
                        t.result()
                if found := violations():
                    return found
            stop.set()
            await asyncio.gather(*tasks)
            return violations()
        finally:
            stop.set()
            running = [t for t in tasks if not t.done()]
            for t in running:
                t.cancel()
            if running:
                await asyncio.wait(running, timeout=10)
            for c in [admin, *writer_clients]:
                await c.close()

    found = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert not found, f"{len(found)} records got a lower SN than one their producer sent before: {found[:3]}"


# --- 2. named errors ---------------------------------------------------------------------------

def test_invalid_repartition_requests_raise_named_errors_and_change_nothing(client):
    stream = stream_name("repartition-errors")
    client.create_stream(stream, partitions=3, replication_factor=1)
    client.put_records(stream, [(f"k{i}", b"x") for i in range(30)])
    info = client.split(stream, 0)              # p0000 closed; p0003, p0004 cover its range
    by = {p.ordinal: p for p in info.partitions}
    assert by[0].state is PartitionState.CLOSED and by[0].children == (3, 4)
    before = shape(client.get_stream_info(stream))

    cases = [
        (errors.PartitionNotOpen, lambda: client.split(stream, 0)),
        (errors.PartitionNotOpen, lambda: client.split(stream, "p0000", at_hash=by[0].hash_lo + 1)),
        (errors.PartitionNotOpen, lambda: client.merge(stream, 0, 1)),
        (errors.PartitionNotFound, lambda: client.split(stream, 99)),
        (errors.PartitionsNotAdjacent, lambda: client.merge(stream, 3, 1)),     # [0, 1/6) and [1/3, 2/3)
        (errors.PartitionsNotAdjacent, lambda: client.merge(stream, 4, 2)),     # [1/6, 1/3) and [2/3, 1)
        (errors.PartitionsNotAdjacent, lambda: client.merge(stream, 1, 1)),
        (errors.InvalidSplitPoint, lambda: client.split(stream, 1, at_hash=by[2].hash_lo + 5)),   # in p0002
        (errors.InvalidSplitPoint, lambda: client.split(stream, 1, at_hash=0)),
        (errors.InvalidSplitPoint, lambda: client.split(stream, 1, at_hash=by[1].hash_lo)),       # not inside
        (errors.InvalidSplitPoint, lambda: client.split(stream, 1, at_hash=by[1].hash_hi)),
        (errors.TooManyPartitions, lambda: client.scale(stream, 0)),
        (errors.TooManyPartitions, lambda: client.scale(stream, 2000)),
        (errors.TooManyPartitions, lambda: client.scale(stream, 1025)),
    ]
    for expected, call in cases:
        with pytest.raises(expected) as caught:
            call()
        assert type(caught.value) is expected, f"{type(caught.value).__name__}: {caught.value}"
        assert shape(client.get_stream_info(stream)) == before, f"{expected.__name__} changed the stream"
    # and the stream still takes writes everywhere
    result = client.put_records(stream, [(f"k{i}", b"y") for i in range(30)])
    assert result.failed_record_count == 0


def test_a_request_while_another_is_in_progress_is_refused(cluster):
    """A scale of 1 -> 16 partitions takes 15 splits, each a seal, drain and commit: a
    request that arrives meanwhile is answered RepartitionInProgress and changes nothing."""
    stream = stream_name("repartition-busy")

    async def scenario():
        async with sms.aio.Client(cluster.address) as a, sms.aio.Client(cluster.address) as b:
            await a.create_stream(stream, partitions=1, replication_factor=1)
            scaling = asyncio.create_task(a.scale(stream, 16))

            async def under_way():
                info = await b.get_stream_info(stream)
                assert not scaling.done(), f"the scale ended before it was seen under way: {scaling}"
                return info if info.repartition and not info.repartition.get("done") else None
            info = await until_async(under_way, 30, "the scale to show as under way")
            request_id = info.repartition["id"]
            opened = open_partitions(info)
            refused = []
            for attempt in (lambda: b.split(stream, opened[-1].ordinal),
                            lambda: b.scale(stream, 2),
                            lambda: b.merge(stream, 0, 1)):      # (checked before the partitions)
                with pytest.raises(errors.RepartitionInProgress) as caught:
                    await attempt()
                refused.append(caught.value)
            assert not scaling.done(), "the scale ended while the refused requests were sent: not a proof"
            final = await scaling
            return final, request_id, refused

    final, request_id, refused = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert len(refused) == 3
    assert [(p.hash_lo, p.hash_hi) for p in open_partitions(final)] == even_ranges(16)
    assert final.repartition["id"] == request_id and final.repartition["op"] == "scale"
    assert final.repartition.get("done") and not final.repartition.get("error")
    assert len(final.partitions) == 1 + 2 * 15, "exactly the 15 splits of the scale, nothing else"


# --- 3. reading a closed parent ------------------------------------------------------------------

def read_to_end(client, iterator: str, max_records: int = 7, max_calls: int = 1000):
    """Records from `iterator` until an answer without a next iterator; (records, last answer)."""
    records = []
    for _ in range(max_calls):
        answer = client.get_next_records(iterator, max_records=max_records)
        records.extend(answer.records)
        if answer.next_iterator is None:
            return records, answer
        assert answer.records or answer.millis_behind_latest == 0
        iterator = answer.next_iterator
    raise AssertionError(f"no end of the partition after {max_calls} reads")


def put_all(client, stream: str, records: list[tuple[str, bytes]]) -> list:
    result = client.put_records(stream, records)
    assert result.failed_record_count == 0, [r for r in result.records if not r.ok][:3]
    return list(result.records)


def next_ms_after(ts_ms: int) -> None:
    """Wait until the wall clock is past ts_ms: the next record gets a later SN time."""
    wait_until(lambda: time.time() * 1000 > ts_ms + 1, 5, f"the clock to pass {ts_ms}")


def test_closed_parent_reads_to_its_ending_sn_then_names_its_children(client):
    stream = stream_name("repartition-parent")
    client.create_stream(stream, partitions=1, replication_factor=2)
    before = []
    for round_ in range(3):
        before += put_all(client, stream, [(f"key-{i}", f"before {round_} {i}".encode()) for i in range(20)])
    info = client.split(stream, 0)
    parent = info.partition(0)
    assert parent.state is PartitionState.CLOSED and parent.children == (1, 2)
    assert parent.ending_sn == max(r.sn for r in before)
    after_first = put_all(client, stream, [(f"key-{i}", f"after 0 {i}".encode()) for i in range(40)])
    next_ms_after(max(seqno.timestamp_ms_of(r.sn) for r in after_first))
    after_second = put_all(client, stream, [(f"key-{i}", f"after 1 {i}".encode()) for i in range(40)])
    assert {r.partition_ordinal for r in after_first + after_second} == {1, 2}
    boundary = info.partition(1).valid_from_ms
    assert boundary == parent.valid_to_ms == info.partition(2).valid_from_ms

    # TRIM_HORIZON: every record up to the ending SN, then the end answer naming the children
    records, end = read_to_end(client, client.get_iterator(stream, "p0000", "TRIM_HORIZON"))
    assert [r.sn for r in records] == sorted(r.sn for r in before)
    assert records[-1].sn == parent.ending_sn
    assert end.next_iterator is None and sorted(end.child_partitions) == ["p0001", "p0002"]

    # AT / AFTER_SEQUENCE_NUMBER with a parent's SN position in the parent
    tenth = records[10]
    from_tenth, end = read_to_end(client, client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER",
                                                              sequence_number=tenth.sn))
    assert [r.sn for r in from_tenth] == [r.sn for r in records[10:]]
    assert end.next_iterator is None and sorted(end.child_partitions) == ["p0001", "p0002"]
    after_tenth, _ = read_to_end(client, client.get_iterator(stream, 0, "AFTER_SEQUENCE_NUMBER",
                                                             sequence_number=tenth.sn))
    assert [r.sn for r in after_tenth] == [r.sn for r in records[11:]]
    last_only, end = read_to_end(client, client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER",
                                                             sequence_number=parent.ending_sn))
    assert [r.sn for r in last_only] == [parent.ending_sn] and end.next_iterator is None
    with pytest.raises(errors.InvalidSequenceNumber):    # a child's SN names the child, not p0000
        client.get_iterator(stream, 0, "AT_SEQUENCE_NUMBER", sequence_number=after_first[0].sn)

    # AT_TIMESTAMP after the split on the parent: straight to the end answer
    for t in (boundary, boundary + 1, seqno.timestamp_ms_of(after_second[0].sn)):
        answer = client.get_next_records(client.get_iterator(stream, 0, "AT_TIMESTAMP", timestamp_ms=t))
        assert answer.records == [] and answer.next_iterator is None, t
        assert sorted(answer.child_partitions) == ["p0001", "p0002"]

    # read_stream(timestamp_ms=t) yields exactly the records whose SN time is >= t
    full = list(client.read_stream(stream))
    assert sorted(r.sn for r in full) == sorted(r.sn for r in before + after_first + after_second)
    times = [seqno.timestamp_ms_of(after_second[0].sn), boundary, boundary + 1,
             seqno.timestamp_ms_of(parent.ending_sn), seqno.timestamp_ms_of(records[30].sn),
             seqno.timestamp_ms_of(after_second[-1].sn) + 1]
    for t in times:
        got = [r.sn for r in client.read_stream(stream, timestamp_ms=t)]
        assert len(got) == len(set(got)), f"t={t}: a record read twice"
        expected = {r.sn for r in full if seqno.timestamp_ms_of(r.sn) >= t}
        assert set(got) == expected, (f"t={t} (boundary {boundary}): {len(expected - set(got))} missing, "
                                      f"{len(set(got) - expected)} extra")


# --- 4. put_records across a split ---------------------------------------------------------------

def test_put_records_reroutes_transparently_across_a_split(cluster, client):
    stream = stream_name("repartition-put")
    client.create_stream(stream, partitions=2, replication_factor=2)
    keys = [f"key-{i}" for i in range(100)]
    with sms.Client(cluster.address) as writer:     # its map is cached before the split
        first = put_all(writer, stream, [(k, f"{k} 0".encode()) for k in keys])
        assert {r.partition_ordinal for r in first} == {0, 1}
        info = client.split(stream, 0)
        children = {p.ordinal: p for p in info.partitions if 0 in p.parents}
        assert set(children) == {2, 3}
        second = put_all(writer, stream, [(k, f"{k} 1".encode()) for k in keys])
        single = writer.put_record(stream, b"one more", keys[0])
    for k, r0, r1 in zip(keys, first, second):
        h = hash_key_of(k)
        if r0.partition_ordinal == 0:
            assert r1.partition_ordinal in children and children[r1.partition_ordinal].hash_lo <= h \
                < children[r1.partition_ordinal].hash_hi, f"{k}: put after the split stored in p{r1.partition_ordinal}"
        else:
            assert r1.partition_ordinal == 1
        assert r1.sn > r0.sn
    read = list(client.read_stream(stream))
    assert sorted(r.sn for r in read) == sorted([r.sn for r in first + second] + [single.sn])
    check_per_key_order(read, "read_stream")
    check_lineage_order(read, client.get_stream_info(stream), "read_stream")
