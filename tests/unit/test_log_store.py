"""Unit tests of storage.log.LogStore against a real LMDB in a temporary directory.

Driven with plain asyncio.run(). A batch of k records built by `make_batch(counter, k)`
holds counters counter..counter+k-1, so its SNs are `seqno.make(TS_MS, counter + i, ordinal)`.
Every record's data names its log and counter, so a read that crosses into another log shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import wire, limits, seqno
from sms.errors import InvariantViolation
from sms.types import Persistence
from storage.log import LogStore, PartitionLog, ReadSlice

TS_MS = 1_700_000_000_000
DURABLE = [Persistence.DISK, Persistence.DISK_ASYNC]
ALL = list(Persistence)
BYTES_MAX = 1 << 30


def make_batch(counter: int, count: int, *, tag: str = "log", ordinal: int = 0, ts_ms: int = TS_MS) -> bytes:
    entries = [wire.encode_entry(f"key-{counter + i}".encode(), f"{tag}|{counter + i}".encode())
               for i in range(count)]
    return wire.sequence(wire.build_batch(entries), seqno.make(ts_ms, counter, ordinal))


def sn_of(counter: int, *, ordinal: int = 0, ts_ms: int = TS_MS) -> int:
    return seqno.make(ts_ms, counter, ordinal)


def records_of(slices: Iterable[ReadSlice]) -> list[tuple[int, bytes]]:
    """(SN, data) of every record the slices cover, in order."""
    out = []
    for s in slices:
        entries = list(wire.batch_entries(s.batch))
        assert 0 <= s.start < s.end <= len(entries)
        assert wire.verify(s.batch).first_sn == s.first_sn
        out.extend((s.sn_at(i), entries[i].data) for i in range(s.start, s.end))
    return out


def expected_records(layout: list[tuple[int, int]], tag: str = "log") -> list[tuple[int, bytes]]:
    """(SN, data) for batches given as (first counter, count)."""
    return [(sn_of(c + i), f"{tag}|{c + i}".encode()) for c, k in layout for i in range(k)]


@contextlib.asynccontextmanager
async def running_store(path):
    store = LogStore(str(path))
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def fill(store: LogStore, plog: PartitionLog, layout: list[tuple[int, int]], tag: str = "log") -> None:
    for counter, count in layout:
        await store.append(plog, make_batch(counter, count, tag=tag))


def read_all(store: LogStore, plog: PartitionLog) -> list[tuple[int, bytes]]:
    return records_of(store.read(plog, 0, seqno.SN_MAX, limits.GET_RECORDS_COUNT_MAX, BYTES_MAX))


# batches of 1, 3, 2, 5 and 1 records, with a gap in the counters between the 2nd and 3rd
LAYOUT = [(1, 1), (2, 3), (10, 2), (12, 5), (17, 1)]
LAYOUT_SNS = [sn for sn, _ in expected_records(LAYOUT)]


# --- opening and appending ---------------------------------------------------------------------

@pytest.mark.parametrize("persistence", ALL)
def test_new_log_is_empty(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            assert (plog.last_sn, plog.first_sn, plog.committed_sn, plog.batches, plog.records) == (0, 0, 0, 0, 0)
            assert store.read(plog, 0, seqno.SN_MAX, 100, BYTES_MAX) == []
            assert store.open_log("s:0", persistence) is plog

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_append_then_read_everything(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            for counter, count in LAYOUT:
                header = await store.append(plog, make_batch(counter, count))
                assert header.first_sn == sn_of(counter)
                assert header.last_sn == sn_of(counter + count - 1)
                assert plog.last_sn == header.last_sn
            assert plog.first_sn == sn_of(1)
            assert plog.batches == len(LAYOUT)
            assert plog.records == sum(k for _, k in LAYOUT)
            assert read_all(store, plog) == expected_records(LAYOUT)

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_read_ranges_named_cases(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, LAYOUT)
            everything = expected_records(LAYOUT)

            def read(from_sn, upto_sn, max_records=1000):
                return records_of(store.read(plog, from_sn, upto_sn, max_records, BYTES_MAX))

            # mid-batch start: record 2 of the 5-record batch at counter 12
            slices = store.read(plog, sn_of(14), seqno.SN_MAX, 1000, BYTES_MAX)
            assert (slices[0].first_sn, slices[0].start, slices[0].end) == (sn_of(12), 2, 5)
            assert records_of(slices) == [r for r in everything if r[0] >= sn_of(14)]
            # mid-batch end
            assert read(sn_of(2), sn_of(3)) == [r for r in everything if sn_of(2) <= r[0] <= sn_of(3)]
            # one record
            assert read(sn_of(11), sn_of(11)) == [(sn_of(11), b"log|11")]
            # between batches (counters 5..9 were never assigned)
            assert read(sn_of(5), sn_of(9)) == []
            assert read(sn_of(5), sn_of(10)) == [(sn_of(10), b"log|10")]
            # between two records of one batch (an SN that no record has)
            assert read(sn_of(13) + 1, sn_of(14)) == [(sn_of(14), b"log|14")]
            # before the first and after the last
            assert read(0, sn_of(1) - 1) == []
            assert read(0, sn_of(1)) == [(sn_of(1), b"log|1")]
            assert read(sn_of(17) + 1, seqno.SN_MAX) == []
            assert read(sn_of(17), seqno.SN_MAX) == [(sn_of(17), b"log|17")]
            # an empty range
            assert read(sn_of(12), sn_of(11)) == []
            # max_records, also inside one batch
            assert read(0, seqno.SN_MAX, 1) == everything[:1]
            assert read(sn_of(12), seqno.SN_MAX, 3) == everything[6:9]
            assert read(sn_of(3), seqno.SN_MAX, 4) == everything[2:6]
            assert read(0, seqno.SN_MAX, 0) == []

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_every_range_and_limit_matches_a_model(tmp_path, persistence):
    """Every (from, upto) over all SNs, their neighbours and the ends, with several limits."""

    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, LAYOUT)
            everything = expected_records(LAYOUT)
            points = sorted({0, seqno.SN_MAX, *LAYOUT_SNS, *(s - 1 for s in LAYOUT_SNS), *(s + 1 for s in LAYOUT_SNS)})
            for from_sn in points:
                for upto_sn in points:
                    for max_records in (1, 2, 4, 1000):
                        want = [r for r in everything if from_sn <= r[0] <= upto_sn][:max_records]
                        got = records_of(store.read(plog, from_sn, upto_sn, max_records, BYTES_MAX))
                        assert got == want, (from_sn, upto_sn, max_records)

    asyncio.run(scenario())


@st.composite
def layouts(draw):
    """Batches as (first counter, count), with random gaps between them."""
    layout, counter = [], 1
    for _ in range(draw(st.integers(min_value=1, max_value=8), label="batches")):
        counter += draw(st.integers(min_value=0, max_value=3), label="gap")
        count = draw(st.integers(min_value=1, max_value=6), label="count")
        layout.append((counter, count))
        counter += count
    return layout


@settings(max_examples=40, deadline=None)
@given(layouts(), st.sampled_from([Persistence.DISK_ASYNC, Persistence.MEMORY]), st.data())
def test_random_reads_match_a_model(layout, persistence, data):
    everything = expected_records(layout)
    top = layout[-1][0] + layout[-1][1] + 2
    sns = st.integers(min_value=0, max_value=top).map(sn_of) | st.integers(min_value=0, max_value=sn_of(top))
    queries = data.draw(st.lists(st.tuples(sns, sns, st.integers(min_value=1, max_value=40)),
                                 min_size=1, max_size=15), label="queries")

    async def scenario(path):
        async with running_store(path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, layout)
            for from_sn, upto_sn, max_records in queries:
                want = [r for r in everything if from_sn <= r[0] <= upto_sn][:max_records]
                got = records_of(store.read(plog, from_sn, upto_sn, max_records, BYTES_MAX))
                assert got == want, (from_sn, upto_sn, max_records)

    with tempfile.TemporaryDirectory() as path:
        asyncio.run(scenario(path))


@pytest.mark.parametrize("persistence", ALL)
def test_max_bytes_stops_after_the_batch_that_reaches_it(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, LAYOUT)
            one = store.read(plog, 0, seqno.SN_MAX, 1000, 1)
            assert len(one) == 1 and records_of(one) == expected_records(LAYOUT)[:1]
            first_two = len(make_batch(1, 1)) + len(make_batch(2, 3))
            two = store.read(plog, 0, seqno.SN_MAX, 1000, first_two)
            assert len(two) == 2

    asyncio.run(scenario())


# --- isolation of partitions in one environment ---------------------------------------------------

@pytest.mark.parametrize("persistence", ALL)
def test_partitions_in_one_env_do_not_see_each_other(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            names = [f"s:{i}" for i in range(6)]
            plogs = [store.open_log(name, persistence) for name in names]
            if persistence is not Persistence.MEMORY:
                ids = sorted(p.local_id for p in plogs)
                assert ids == list(range(ids[0], ids[0] + len(ids)))      # adjacent local ids
            # identical SNs in every log; logs 1 and 4 stay empty; log 3 starts later than log 2 ends
            layouts_by_log = {0: LAYOUT, 2: [(1, 2)], 3: [(40, 3), (43, 1)], 5: [(2, 1)]}
            for round_ in range(max(len(v) for v in layouts_by_log.values())):
                for i, layout in layouts_by_log.items():
                    if round_ < len(layout):
                        await store.append(plogs[i], make_batch(*layout[round_], tag=names[i]))
            for i, plog in enumerate(plogs):
                want = expected_records(layouts_by_log.get(i, []), tag=names[i])
                assert read_all(store, plog) == want, names[i]
                # from beyond this log's end: the next log's keys must not leak in
                assert store.read(plog, plog.last_sn + 1, seqno.SN_MAX, 1000, BYTES_MAX) == []
                # from before this log's start: the previous log's keys must not leak in
                assert records_of(store.read(plog, 0, seqno.SN_MAX, 1, BYTES_MAX)) == want[:1]
                if want:
                    last_sn = want[-1][0]
                    assert records_of(store.read(plog, last_sn, last_sn, 10, BYTES_MAX)) == want[-1:]

    asyncio.run(scenario())


def test_same_name_in_both_durable_envs_is_two_logs(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            disk = store.open_log("d:0", Persistence.DISK)
            disk_async = store.open_log("a:0", Persistence.DISK_ASYNC)
            assert disk.local_id == disk_async.local_id       # ids are per environment
            await fill(store, disk, [(1, 2)], tag="disk")
            await fill(store, disk_async, [(1, 3)], tag="async")
            assert read_all(store, disk) == expected_records([(1, 2)], tag="disk")
            assert read_all(store, disk_async) == expected_records([(1, 3)], tag="async")

    asyncio.run(scenario())


# --- refusing bad appends ------------------------------------------------------------------------

@pytest.mark.parametrize("persistence", ALL)
def test_append_at_or_before_last_sn_is_an_invariant_violation(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, [(5, 3)])       # counters 5..7
            before = (plog.last_sn, plog.first_sn, plog.batches, plog.records, read_all(store, plog))
            for counter, count in [(7, 1), (7, 2), (6, 4), (5, 3), (1, 1), (3, 10)]:
                with pytest.raises(InvariantViolation):
                    await store.append(plog, make_batch(counter, count))
            assert (plog.last_sn, plog.first_sn, plog.batches, plog.records, read_all(store, plog)) == before
            # an SN just above the last is fine
            await store.append(plog, make_batch(8, 1))
            assert plog.last_sn == sn_of(8)

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_unsequenced_batch_is_refused(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            with pytest.raises(InvariantViolation):
                await store.append(plog, wire.build_batch([wire.encode_entry(b"k", b"v")]))
            assert plog.batches == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_corrupted_batch_is_refused_and_nothing_changes(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, [(1, 2)])
            before = (plog.last_sn, plog.first_sn, plog.batches, plog.records, read_all(store, plog))
            good = make_batch(3, 4)
            for offset in (0, 5, 10, 30, wire.HEADER_BYTES, len(good) // 2, len(good) - 1):
                damaged = bytearray(good)
                damaged[offset] ^= 0x40
                with pytest.raises(wire.CorruptBatch):
                    await store.append(plog, bytes(damaged))
            assert (plog.last_sn, plog.first_sn, plog.batches, plog.records, read_all(store, plog)) == before
        if persistence is not Persistence.MEMORY:
            async with running_store(tmp_path) as store:
                plog = store.open_log("s:0", persistence)
                assert (plog.last_sn, plog.first_sn, plog.batches, plog.records, read_all(store, plog)) == before

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", DURABLE)
def test_batch_damaged_on_disk_is_detected_on_read(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, LAYOUT)
            env = store.envs[persistence]
            batches_db = store.dbs[persistence][0]
            key = plog.key(sn_of(10))
            with env.begin(write=True, db=batches_db) as txn:
                damaged = bytearray(txn.get(key))
                damaged[-1] ^= 0x01
                txn.put(key, bytes(damaged))
            # a read that stops (max_records) before the damaged batch answers; one that reaches it refuses
            assert records_of(store.read(plog, 0, seqno.SN_MAX, 4, BYTES_MAX)) == expected_records(LAYOUT)[:4]
            assert records_of(store.read(plog, sn_of(12), seqno.SN_MAX, 1000, BYTES_MAX)) == \
                expected_records(LAYOUT)[6:]
            with pytest.raises(wire.CorruptBatch):
                store.read(plog, 0, seqno.SN_MAX, 1000, BYTES_MAX)

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", DURABLE)
def test_concurrent_append_of_the_same_batch_is_refused(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, [(1, 3)])
            batch = make_batch(4, 2)
            results = await asyncio.gather(store.append(plog, batch), store.append(plog, batch),
                                           return_exceptions=True)
            assert sum(isinstance(r, InvariantViolation) for r in results) == 1
            assert (plog.batches, plog.records) == (2, 5)

    asyncio.run(scenario())


def test_concurrent_out_of_order_appends_are_refused(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", Persistence.DISK)
            results = await asyncio.gather(store.append(plog, make_batch(20, 2)),
                                           store.append(plog, make_batch(10, 2)), return_exceptions=True)
            assert isinstance(results[1], InvariantViolation)
            assert plog.last_sn == sn_of(21)

    asyncio.run(scenario())


def test_memory_log_refuses_a_concurrent_duplicate(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("m:0", Persistence.MEMORY)
            batch = make_batch(1, 2)
            results = await asyncio.gather(store.append(plog, batch), store.append(plog, batch),
                                           return_exceptions=True)
            assert sum(isinstance(r, InvariantViolation) for r in results) == 1
            assert (plog.batches, plog.records) == (1, 2)

    asyncio.run(scenario())


# --- commit watermark ------------------------------------------------------------------------------

@pytest.mark.parametrize("persistence", ALL)
def test_set_committed_only_moves_forward_and_never_past_last(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            with pytest.raises(InvariantViolation):
                store.set_committed(plog, 1)
            await fill(store, plog, [(1, 3)])
            store.set_committed(plog, sn_of(2))
            assert plog.committed_sn == sn_of(2)
            store.set_committed(plog, sn_of(1))
            assert plog.committed_sn == sn_of(2)
            with pytest.raises(InvariantViolation):
                store.set_committed(plog, sn_of(4))
            assert plog.committed_sn == sn_of(2)

    asyncio.run(scenario())


# --- recovery ------------------------------------------------------------------------------------

@pytest.mark.parametrize("persistence", DURABLE)
def test_reopen_recovers_the_log(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            other = store.open_log("s:1", persistence)
            await fill(store, plog, LAYOUT[:-1])
            store.set_committed(plog, sn_of(13))
            await fill(store, plog, LAYOUT[-1:])          # this txn writes the watermark
            await fill(store, other, [(1, 2)], tag="other")
            before = (plog.last_sn, plog.first_sn, plog.batches, plog.records, plog.committed_sn)
            before_id = plog.local_id
        async with running_store(tmp_path) as store:
            assert sorted(n for n in store.known_names() if n.startswith("s:")) == ["s:0", "s:1"]
            plog = store.open_log("s:0", persistence)
            assert plog.local_id == before_id
            assert (plog.last_sn, plog.first_sn, plog.batches, plog.records, plog.committed_sn) == before
            assert plog.committed_sn == sn_of(13)
            assert read_all(store, plog) == expected_records(LAYOUT)
            assert read_all(store, store.open_log("s:1", persistence)) == expected_records([(1, 2)], tag="other")
            # appends continue after the recovered last SN
            with pytest.raises(InvariantViolation):
                await store.append(plog, make_batch(17, 1))
            await store.append(plog, make_batch(18, 2))
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            assert plog.last_sn == sn_of(19)
            assert read_all(store, plog) == expected_records(LAYOUT + [(18, 2)])

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", DURABLE)
def test_reopen_of_an_empty_log(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            store.open_log("empty:0", persistence)
            await fill(store, store.open_log("full:0", persistence), [(1, 1)])
        async with running_store(tmp_path) as store:
            plog = store.open_log("empty:0", persistence)
            assert (plog.last_sn, plog.first_sn, plog.batches, plog.records, plog.committed_sn) == (0, 0, 0, 0, 0)

    asyncio.run(scenario())


def test_memory_logs_vanish_on_reopen(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("m:0", Persistence.MEMORY)
            await fill(store, plog, LAYOUT)
            assert read_all(store, plog) == expected_records(LAYOUT)
            assert "m:0" not in store.known_names()
        async with running_store(tmp_path) as store:
            plog = store.open_log("m:0", Persistence.MEMORY)
            assert (plog.last_sn, plog.batches, plog.records) == (0, 0, 0)
            assert read_all(store, plog) == []

    asyncio.run(scenario())


# --- dropping logs ---------------------------------------------------------------------------------

def _raw_keys_with_prefix(store: LogStore, persistence: Persistence, prefix: bytes) -> list[bytes]:
    env = store.envs[persistence]
    with env.begin(db=store.dbs[persistence][0]) as txn:
        return [k for k, _ in txn.cursor() if k[:4] == prefix]


@pytest.mark.parametrize("persistence", DURABLE)
@pytest.mark.parametrize("batches, trim_max", [(5, 1000), (7, 3), (6, 3)])
def test_drop_log_removes_records_and_name_only(tmp_path, monkeypatch, persistence, batches, trim_max):
    monkeypatch.setattr(limits, "TRIM_BATCHES_PER_TXN_MAX", trim_max)
    layout = [(1 + 2 * i, 2) for i in range(batches)]

    async def scenario():
        async with running_store(tmp_path) as store:
            victim = store.open_log("s:0", persistence)
            neighbour = store.open_log("s:1", persistence)
            before_victim = store.open_log("r:9", persistence)
            for counter, count in layout:
                await store.append(victim, make_batch(counter, count, tag="victim"))
                await store.append(neighbour, make_batch(counter, count, tag="neighbour"))
                await store.append(before_victim, make_batch(counter, count, tag="before"))
            prefix = victim.prefix
            await store.drop_log("s:0")
            assert _raw_keys_with_prefix(store, persistence, prefix) == []
            assert "s:0" not in store.known_names()
            assert {"s:1", "r:9"} <= set(store.known_names())
            assert read_all(store, neighbour) == expected_records(layout, tag="neighbour")
            assert read_all(store, before_victim) == expected_records(layout, tag="before")
            again = store.open_log("s:0", persistence)
            assert again is not victim
            assert (again.last_sn, again.batches) == (0, 0)
        async with running_store(tmp_path) as store:
            assert read_all(store, store.open_log("s:0", persistence)) == []
            assert read_all(store, store.open_log("s:1", persistence)) == expected_records(layout, tag="neighbour")

    asyncio.run(scenario())


def test_drop_of_a_memory_log_clears_it(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("m:0", Persistence.MEMORY)
            keep = store.open_log("m:1", Persistence.MEMORY)
            await fill(store, plog, LAYOUT)
            await fill(store, keep, LAYOUT, tag="keep")
            await store.drop_log("m:0")
            assert len(plog.memory) == 0
            again = store.open_log("m:0", Persistence.MEMORY)
            assert again is not plog and read_all(store, again) == []
            assert read_all(store, keep) == expected_records(LAYOUT, tag="keep")

    asyncio.run(scenario())


def test_drop_of_an_unknown_name_is_a_no_op(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", Persistence.DISK)
            await fill(store, plog, [(1, 1)])
            await store.drop_log("never:0")
            assert read_all(store, plog) == expected_records([(1, 1)])

    asyncio.run(scenario())


def test_known_names_lists_only_logs(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            store.open_log("a:0", Persistence.DISK)
            store.open_log("b:0", Persistence.DISK_ASYNC)
            assert sorted(store.known_names()) == ["a:0", "b:0"]

    asyncio.run(scenario())


def test_dropping_orphans_does_not_reuse_a_live_local_id(tmp_path):
    """StorageNode._drop_orphans drops every known name without a replica; the local-id
    allocator must survive that, or the next new log reuses a live log's id and batches."""
    async def scenario():
        async with running_store(tmp_path) as store:
            await fill(store, store.open_log("a:0", Persistence.DISK), [(1, 3), (4, 2)])
            store.open_log("orphan:0", Persistence.DISK)
        async with running_store(tmp_path) as store:
            live = store.open_log("a:0", Persistence.DISK)
            for name in store.known_names():
                if name != "a:0":
                    await store.drop_log(name)
            fresh = store.open_log("c:0", Persistence.DISK)
            assert fresh.local_id != live.local_id
            assert (fresh.batches, fresh.records) == (0, 0)
            assert read_all(store, fresh) == []

    asyncio.run(scenario())


# --- group commit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("persistence", DURABLE)
def test_concurrent_appends_share_commits(tmp_path, persistence):
    logs_n, per_log = 10, 5
    layout = [(1 + 3 * i, 3) for i in range(per_log)]

    async def scenario():
        async with running_store(tmp_path) as store:
            plogs = [store.open_log(f"s:{i}", persistence) for i in range(logs_n)]
            appends = [store.append(plogs[i], make_batch(*layout[j], tag=f"s:{i}"))
                       for j in range(per_log) for i in range(logs_n)]
            headers = await asyncio.gather(*appends)
            assert len(headers) == logs_n * per_log
            writer = store.writers[persistence]
            assert 1 <= writer.commits < logs_n * per_log
            assert store.statistics()["commits"][persistence.value] == writer.commits
            for i, plog in enumerate(plogs):
                assert (plog.batches, plog.records) == (per_log, 3 * per_log)
                assert read_all(store, plog) == expected_records(layout, tag=f"s:{i}")
        async with running_store(tmp_path) as store:
            for i in range(logs_n):
                plog = store.open_log(f"s:{i}", persistence)
                assert (plog.batches, plog.records) == (per_log, 3 * per_log)
                assert read_all(store, plog) == expected_records(layout, tag=f"s:{i}")

    asyncio.run(scenario())


def test_statistics_shape(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            store.open_log("s:0", Persistence.MEMORY)
            stats = store.statistics()
            assert stats["logs"] == 1
            assert set(stats["commits"]) == {p.value for p in DURABLE}
            assert set(stats["write_queue"]) == {p.value for p in DURABLE}

    asyncio.run(scenario())


def test_a_memory_only_store_opens_memory_logs_and_refuses_durable_ones():
    """LogStore(None), the simulation's store: no LMDB environment, the memory path whole."""
    store = LogStore(None)
    assert store.envs == {} and store.data_dir == ""
    plog = store.open_log("p", Persistence.MEMORY)
    asyncio.run(fill(store, plog, LAYOUT))
    assert read_all(store, plog) == expected_records(LAYOUT) and store.open_log("p", Persistence.MEMORY) is plog
    with pytest.raises(InvariantViolation, match="memory-only"):
        store.open_log("q", Persistence.DISK)
    assert "q" not in store.logs
