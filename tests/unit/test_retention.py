"""Unit tests of retention and trimming: the pure rules of kernel.retention and LogStore.trim.

`requested_cut` / `trim_point`: the retention cut moves with time, trim_stream's
before-time and per-partition before-SN cuts, and, while a stream protects unread
records, each registered consumer's limit (a checkpoint in the partition allows up to
just after it, one in a descendant allows everything, none allows nothing, SHARD_END
allows everything). `droppable`: only closed partitions whose ending SN is below the
trim point, parents before children, also on a map that already lost entries
(`PartitionMap.without`). `LogStore.trim` on a real LMDB (and a memory log): whole
batches below the point go, never the newest one, in bounded transactions, and a
reopened store recovers the trimmed log.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import limits, seqno
from kernel import retention
from sms.metadata import ConsumerRecord, StreamConfig
from sms.partition_map import PartitionMap
from sms.types import IngestionPolicy, PartitionState, Persistence
from tests.unit.test_log_store import (ALL, BYTES_MAX, LAYOUT, expected_records, fill, make_batch, read_all,
                                       records_of, running_store, sn_of)

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
SHARD_END = ConsumerRecord.SHARD_END_SN


# --- helpers ---------------------------------------------------------------------------------

def config(**changes) -> StreamConfig:
    base = StreamConfig(name="s", partitions=1, replication_factor=3, persistence=Persistence.DISK,
                        ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_DUP_PERMITTED, retention_hours=24,
                        created_ms=NOW_MS - 100 * HOUR_MS)
    return replace(base, **changes)


def sn(ts_ms: int, counter: int = 1, ordinal: int = 0) -> int:
    return seqno.make(ts_ms, counter, ordinal)


def consumer(name: str, **checkpoints: int) -> ConsumerRecord:
    """A consumer with checkpoints given as p<ordinal>=SN."""
    return ConsumerRecord(name, tuple(sorted((int(k[1:]), v) for k, v in checkpoints.items())))


def lineage_map() -> PartitionMap:
    """p0 split at T1 into p1, p2; p1 split at T2 into p3, p4 (p0, p1 closed; p2, p3, p4 open).

    p0 holds SNs of times up to T1 - 10, p1 of times in [T1, T2 - 10)."""
    t0, t1, t2 = NOW_MS - 10 * HOUR_MS, NOW_MS - 8 * HOUR_MS, NOW_MS - 6 * HOUR_MS
    pmap = PartitionMap.even(1, t0)
    pmap = pmap.split(0, None, t1, sn(t1 - 10, 500, 0))
    pmap = pmap.split(1, None, t2, sn(t2 - 10, 300, 1))
    return pmap


T1 = NOW_MS - 8 * HOUR_MS
T2 = NOW_MS - 6 * HOUR_MS
P0_END = sn(T1 - 10, 500, 0)
P1_END = sn(T2 - 10, 300, 1)


# --- requested_cut: retention and trim requests ----------------------------------------------

def test_retention_cut_is_the_lowest_sn_of_now_minus_retention():
    c = config(retention_hours=24)
    cut = retention.requested_cut(c, 0, NOW_MS)
    assert cut == seqno.lower_bound_for_time(NOW_MS - 24 * HOUR_MS)
    assert sn(NOW_MS - 24 * HOUR_MS - 1, seqno.COUNTER_MAX, seqno.ORDINAL_MAX) < cut   # older: deleted
    assert sn(NOW_MS - 24 * HOUR_MS, 0, 0) >= cut                                     # as old: kept


def test_retention_cut_moves_with_time():
    c = config(retention_hours=1)
    cuts = [retention.requested_cut(c, 0, NOW_MS + d) for d in (0, 1, 1000, HOUR_MS)]
    assert cuts == sorted(cuts) and len(set(cuts)) == len(cuts)
    assert cuts[-1] == seqno.lower_bound_for_time(NOW_MS)


def test_retention_seconds_override_hours():
    c = config(retention_hours=1, retention_s=10)
    assert c.retention_ms == 10_000
    assert retention.requested_cut(c, 0, NOW_MS) == seqno.lower_bound_for_time(NOW_MS - 10_000)
    # retention_s 0: the hours govern
    assert retention.requested_cut(config(retention_hours=2), 0, NOW_MS) == \
        seqno.lower_bound_for_time(NOW_MS - 2 * HOUR_MS)


def test_retention_longer_than_the_clock_cuts_nothing():
    c = config(retention_hours=24)
    assert retention.requested_cut(c, 0, 1000) == 0


def test_trim_before_ms_cuts_above_the_retention_cut():
    trim_ms = NOW_MS - 5000
    c = config(trim_before_ms=trim_ms)
    assert retention.requested_cut(c, 0, NOW_MS) == seqno.lower_bound_for_time(trim_ms)
    assert retention.requested_cut(c, 7, NOW_MS) == seqno.lower_bound_for_time(trim_ms)   # every partition
    # below the retention cut it changes nothing
    old = config(trim_before_ms=NOW_MS - 48 * HOUR_MS)
    assert retention.requested_cut(old, 0, NOW_MS) == seqno.lower_bound_for_time(NOW_MS - 24 * HOUR_MS)


def test_trim_before_sns_cut_only_their_partition():
    before = sn(NOW_MS - 1000, 42, 1)
    c = config(trim_before_sns=((1, before),))
    retention_cut = seqno.lower_bound_for_time(NOW_MS - 24 * HOUR_MS)
    assert retention.requested_cut(c, 1, NOW_MS) == before
    assert retention.requested_cut(c, 0, NOW_MS) == retention_cut
    assert retention.requested_cut(c, 2, NOW_MS) == retention_cut
    # a before-SN below the time cut changes nothing
    low = config(trim_before_sns=((1, sn(NOW_MS - 48 * HOUR_MS, 1, 1)),))
    assert retention.requested_cut(low, 1, NOW_MS) == retention_cut
    # the highest of the before-SN and the before-time cut wins
    both = config(trim_before_sns=((1, before),), trim_before_ms=NOW_MS - 500)
    assert retention.requested_cut(both, 1, NOW_MS) == seqno.lower_bound_for_time(NOW_MS - 500)
    both = config(trim_before_sns=((1, before),), trim_before_ms=NOW_MS - 5000)
    assert retention.requested_cut(both, 1, NOW_MS) == before


def test_trim_fields_survive_the_config_json():
    c = config(retention_s=30, protect_unread=True, trim_before_ms=NOW_MS - 1,
               trim_before_sns=((0, seqno.SN_MAX - 7), (3, sn(NOW_MS, 9, 3))))
    again = StreamConfig.from_bytes(c.to_bytes())
    assert again == c
    assert retention.requested_cut(again, 0, NOW_MS) == seqno.SN_MAX - 7


def test_consumer_record_json_keeps_shard_end():
    c = ConsumerRecord("c", ((0, SHARD_END), (5, sn(NOW_MS, 3, 5))))
    assert ConsumerRecord.from_bytes(c.to_bytes()) == c


# --- trim_point: unread records ------------------------------------------------------------

EVERYTHING = config(trim_before_ms=NOW_MS)        # asks to delete every record older than now
CUT_ALL = seqno.lower_bound_for_time(NOW_MS)


def test_without_protection_consumers_do_not_matter():
    pmap = PartitionMap.even(2, NOW_MS - HOUR_MS)
    consumers = [consumer("a"), consumer("b", p0=sn(NOW_MS - HOUR_MS, 1))]
    assert not EVERYTHING.protect_unread
    for ordinal in (0, 1):
        assert retention.trim_point(EVERYTHING, pmap, ordinal, consumers, NOW_MS) == CUT_ALL


def test_protection_without_consumers_is_the_requested_cut():
    c = replace(EVERYTHING, protect_unread=True)
    pmap = PartitionMap.even(2, NOW_MS - HOUR_MS)
    assert retention.trim_point(c, pmap, 0, [], NOW_MS) == CUT_ALL


def test_checkpoint_in_the_partition_allows_up_to_just_after_it():
    c = replace(EVERYTHING, protect_unread=True)
    pmap = PartitionMap.even(2, NOW_MS - HOUR_MS)
    checkpoint = sn(NOW_MS - 1000, 17, 0)
    point = retention.trim_point(c, pmap, 0, [consumer("a", p0=checkpoint)], NOW_MS)
    assert point == checkpoint + 1            # the checkpointed record goes, the next one stays
    # a checkpoint above the requested cut does not raise the point
    late = sn(NOW_MS + 1000, 1, 0)
    assert retention.trim_point(c, pmap, 0, [consumer("a", p0=late)], NOW_MS) == CUT_ALL


def test_no_checkpoint_allows_nothing():
    c = replace(EVERYTHING, protect_unread=True)
    pmap = PartitionMap.even(2, NOW_MS - HOUR_MS)
    assert retention.trim_point(c, pmap, 0, [consumer("fresh")], NOW_MS) == 0
    # a checkpoint in another (not descendant) partition does not count
    other = consumer("other", p1=sn(NOW_MS - 10, 5, 1))
    assert retention.trim_point(c, pmap, 0, [other], NOW_MS) == 0
    assert retention.trim_point(c, pmap, 1, [other], NOW_MS) == sn(NOW_MS - 10, 5, 1) + 1


def test_checkpoint_in_a_descendant_allows_everything():
    c = replace(EVERYTHING, protect_unread=True)
    pmap = lineage_map()
    child = consumer("child", p2=sn(T1 + 5, 1, 2))                  # p2: a child of p0
    grandchild = consumer("grandchild", p4=sn(T2 + 5, 1, 4))        # p4: a child of p1, grandchild of p0
    assert retention.trim_point(c, pmap, 0, [child], NOW_MS) == CUT_ALL
    assert retention.trim_point(c, pmap, 0, [grandchild], NOW_MS) == CUT_ALL
    assert retention.trim_point(c, pmap, 1, [grandchild], NOW_MS) == CUT_ALL
    # p2 is not a descendant of p1: a checkpoint there does not free p1
    assert retention.trim_point(c, pmap, 1, [child], NOW_MS) == 0
    # a checkpoint in an ancestor does not free a child
    parent = consumer("parent", p0=SHARD_END)
    assert retention.trim_point(c, pmap, 2, [parent], NOW_MS) == 0


def test_shard_end_allows_everything():
    c = replace(EVERYTHING, protect_unread=True)
    pmap = lineage_map()
    done = consumer("done", p0=SHARD_END)
    assert retention.trim_point(c, pmap, 0, [done], NOW_MS) == CUT_ALL
    # even a cut at the very top of the SN space
    top = replace(c, trim_before_sns=((0, seqno.SN_MAX),))
    assert retention.trim_point(top, pmap, 0, [done], NOW_MS) == seqno.SN_MAX


def test_the_slowest_consumer_governs():
    c = replace(EVERYTHING, protect_unread=True)
    pmap = PartitionMap.even(1, NOW_MS - HOUR_MS)
    fast = consumer("fast", p0=sn(NOW_MS - 10, 90))
    slow = consumer("slow", p0=sn(NOW_MS - 900, 10))
    assert retention.trim_point(c, pmap, 0, [fast, slow], NOW_MS) == sn(NOW_MS - 900, 10) + 1
    assert retention.trim_point(c, pmap, 0, [slow, fast], NOW_MS) == sn(NOW_MS - 900, 10) + 1
    assert retention.trim_point(c, pmap, 0, [fast, slow, consumer("new")], NOW_MS) == 0


def test_protection_never_raises_the_requested_cut():
    c = config(protect_unread=True)               # 24 h retention, no trim request
    pmap = PartitionMap.even(1, NOW_MS - HOUR_MS)
    done = consumer("done", p0=SHARD_END)
    assert retention.trim_point(c, pmap, 0, [done], NOW_MS) == retention.requested_cut(c, 0, NOW_MS)


def test_an_unread_hold_cap_lets_old_unread_records_go():
    """A tenant's retention cap (unread_hold_max_s): a consumer that never reads holds
    records at most so long, and never past the requested cut."""
    pmap = PartitionMap.even(1, NOW_MS - 100 * HOUR_MS)
    stuck = consumer("stuck")                                        # has read nothing
    held = config(protect_unread=True, retention_hours=1, unread_hold_max_s=6 * 3600)
    assert retention.trim_point(held, pmap, 0, [stuck], NOW_MS) == seqno.lower_bound_for_time(NOW_MS - 6 * HOUR_MS)
    assert retention.trim_point(replace(held, unread_hold_max_s=0), pmap, 0, [stuck], NOW_MS) == 0
    # a hold longer than the retention: the consumer still keeps what retention would cut
    long_hold = replace(held, unread_hold_max_s=48 * 3600)
    assert retention.trim_point(long_hold, pmap, 0, [stuck], NOW_MS) == seqno.lower_bound_for_time(NOW_MS - 48 * HOUR_MS)
    # a consumer that read further governs as before
    fresh = consumer("fresh", p0=sn(NOW_MS - 10, 9))
    assert retention.trim_point(held, pmap, 0, [fresh], NOW_MS) == retention.requested_cut(held, 0, NOW_MS)
    # and without protection the hold is moot
    assert retention.trim_point(replace(held, protect_unread=False), pmap, 0, [stuck], NOW_MS) == \
        retention.requested_cut(held, 0, NOW_MS)
    assert StreamConfig.from_bytes(held.to_bytes()).unread_hold_max_s == 6 * 3600


# --- droppable: closed partitions that hold nothing more ----------------------------------

def test_open_partitions_are_never_dropped():
    pmap = PartitionMap.even(3, NOW_MS - 100 * HOUR_MS)
    c = config(trim_before_ms=NOW_MS, trim_before_sns=tuple((o, seqno.SN_MAX) for o in range(3)))
    assert retention.droppable(c, pmap, [], NOW_MS) == []


def test_closed_partition_goes_only_once_its_ending_sn_is_below_the_trim_point():
    pmap = PartitionMap.even(1, NOW_MS - 10 * HOUR_MS).split(0, None, T1, P0_END)
    assert retention.ending_of(pmap.entry(0)) == P0_END
    assert retention.droppable(config(), pmap, [], NOW_MS) == []                # 24 h retention
    at_end = config(trim_before_sns=((0, P0_END),))                            # deletes below P0_END only
    assert retention.droppable(at_end, pmap, [], NOW_MS) == []
    past_end = config(trim_before_sns=((0, P0_END + 1),))
    assert retention.droppable(past_end, pmap, [], NOW_MS) == [0]
    # the same by time: the boundary is above the ending SN's time
    assert retention.droppable(config(trim_before_ms=T1 - 10), pmap, [], NOW_MS) == []
    assert retention.droppable(config(trim_before_ms=T1 - 9), pmap, [], NOW_MS) == [0]
    # and by retention alone, once the records aged past it
    short = config(retention_s=10)
    assert retention.droppable(short, pmap, [], T1 - 10 + 10_000) == []
    assert retention.droppable(short, pmap, [], T1 - 9 + 10_000) == [0]


def test_parents_go_before_children():
    pmap = lineage_map()
    everything = config(trim_before_ms=NOW_MS)
    assert retention.droppable(everything, pmap, [], NOW_MS) == [0, 1]
    # the order does not come from the order of the map's entries
    shuffled = replace(pmap, entries=tuple(reversed(pmap.entries)))
    assert retention.droppable(everything, shuffled, [], NOW_MS) == [0, 1]


def test_a_child_waits_for_its_parent():
    pmap = lineage_map()
    only_p1 = config(trim_before_sns=((1, P1_END + 1),))       # p1 is past its end, p0 is not
    assert retention.trim_point(only_p1, pmap, 1, [], NOW_MS) > P1_END
    assert retention.droppable(only_p1, pmap, [], NOW_MS) == []
    # once the parent is gone from the map, the child may go
    assert retention.droppable(only_p1, pmap.without({0}), [], NOW_MS) == [1]


def test_merged_partitions_each_need_their_own_cut():
    t0, t1 = NOW_MS - 10 * HOUR_MS, NOW_MS - 8 * HOUR_MS
    a_end, b_end = sn(t1 - 100, 7, 0), sn(t1 - 50, 9, 1)
    pmap = PartitionMap.even(2, t0).merge(0, 1, t1, {0: a_end, 1: b_end})
    assert [e.ordinal for e in pmap.entries if e.state is PartitionState.CLOSED] == [0, 1]
    assert retention.droppable(config(trim_before_ms=t1 - 60), pmap, [], NOW_MS) == [0]
    assert retention.droppable(config(trim_before_ms=t1 - 49), pmap, [], NOW_MS) == [0, 1]
    assert retention.droppable(config(trim_before_sns=((1, b_end + 1),)), pmap, [], NOW_MS) == [1]


def test_partition_closed_with_no_records_goes_once_past_its_boundary():
    # ending SN 0: the split came before any record was written
    pmap = PartitionMap.even(1, NOW_MS - 10 * HOUR_MS).split(0, None, T1, 0)
    entry = pmap.entry(0)
    assert entry.ending_sn == 0 and entry.valid_to_ms == T1
    assert retention.ending_of(entry) == seqno.lower_bound_for_time(T1 - 1)
    assert retention.droppable(config(), pmap, [], NOW_MS) == []
    assert retention.droppable(config(trim_before_ms=T1 - 1), pmap, [], NOW_MS) == []
    assert retention.droppable(config(trim_before_ms=T1), pmap, [], NOW_MS) == [0]
    assert retention.droppable(config(retention_s=10), pmap, [], T1 + 10_000) == [0]


def test_unread_records_keep_a_closed_partition():
    pmap = lineage_map()
    c = config(trim_before_ms=NOW_MS, protect_unread=True)
    assert retention.droppable(c, pmap, [consumer("new")], NOW_MS) == []
    midway = consumer("midway", p0=P0_END - seqno.COUNTER_UNIT)
    assert retention.droppable(c, pmap, [midway], NOW_MS) == []
    at_end = consumer("at-end", p0=P0_END)
    assert retention.droppable(c, pmap, [at_end], NOW_MS) == [0]       # p1: no checkpoint
    assert retention.droppable(c, pmap, [consumer("shard-end", p0=SHARD_END, p1=SHARD_END)], NOW_MS) == [0, 1]
    in_children = consumer("children", p3=sn(T2 + 1, 1, 3))
    assert retention.droppable(c, pmap, [in_children], NOW_MS) == [0, 1]
    # every consumer must allow it
    assert retention.droppable(c, pmap, [in_children, midway], NOW_MS) == []


def test_a_map_without_dropped_entries():
    pmap = lineage_map()
    with pytest.raises(ValueError):
        pmap.without({2})                                    # open: never dropped
    after = pmap.without({0})
    assert [e.ordinal for e in after.entries] == [1, 2, 3, 4]
    assert sorted(e.ordinal for e in after.roots()) == [1, 2]
    assert after.entry(1).parents == (0,)                    # children keep naming the parent
    assert retention.descendants(after, 0) == set()
    assert retention.descendants(after, 1) == {3, 4}
    everything = config(trim_before_ms=NOW_MS)
    assert retention.droppable(everything, after, [], NOW_MS) == [1]
    last = after.without({1})
    assert sorted(e.ordinal for e in last.roots()) == [2, 3, 4]
    assert retention.droppable(everything, last, [], NOW_MS) == []
    # a consumer's checkpoint in a partition that is gone frees nothing that remains
    protected = replace(everything, protect_unread=True)
    stale = consumer("stale", p0=SHARD_END)
    for ordinal in (2, 3, 4):
        assert retention.trim_point(protected, last, ordinal, [stale], NOW_MS) == 0
    # the map round-trips through JSON without the dropped entries
    assert PartitionMap.from_bytes(last.to_bytes()).entries == last.entries


@st.composite
def repartitioned(draw):
    """A map after a random sequence of splits and merges, and the ending SN time of each."""
    t = NOW_MS - 100 * HOUR_MS
    pmap = PartitionMap.even(draw(st.integers(1, 3), label="partitions"), t)
    for _ in range(draw(st.integers(0, 6), label="steps")):
        t += draw(st.integers(1, HOUR_MS), label="gap")
        opened = pmap.open_entries()
        if len(opened) > 1 and draw(st.booleans(), label="merge?"):
            by_hash = sorted(opened, key=lambda e: e.hash_lo)
            i = draw(st.integers(0, len(by_hash) - 2), label="merge at")
            a, b = by_hash[i], by_hash[i + 1]
            endings = {o: draw(st.sampled_from([0, sn(t - 1, 3, o)]), label="ending") for o in (a.ordinal, b.ordinal)}
            pmap = pmap.merge(a.ordinal, b.ordinal, t, endings)
        else:
            e = draw(st.sampled_from(opened), label="split")
            pmap = pmap.split(e.ordinal, None, t, draw(st.sampled_from([0, sn(t - 1, 3, e.ordinal)]),
                                                       label="ending"))
    return pmap, t


@settings(max_examples=200)
@given(repartitioned(), st.data())
def test_droppable_is_closed_in_lineage_order_and_past_the_end(built, data):
    pmap, last_t = built
    cut_ms = data.draw(st.integers(NOW_MS - 101 * HOUR_MS, last_t + 10), label="trim before ms")
    c = config(trim_before_ms=cut_ms)
    rounds = 0
    while True:
        gone = retention.droppable(c, pmap, [], NOW_MS)
        present = {e.ordinal for e in pmap.entries}
        for i, o in enumerate(gone):
            e = pmap.entry(o)
            assert e.state is PartitionState.CLOSED
            assert retention.trim_point(c, pmap, o, [], NOW_MS) > retention.ending_of(e)
            assert all(p not in present or p in gone[:i] for p in e.parents), (o, e.parents, gone)
        if not gone:
            break
        pmap = pmap.without(set(gone))
        rounds += 1
        assert rounds < 20
    # nothing droppable was left behind: every closed entry still there is not past its end
    # or has a parent that is not
    for e in pmap.entries:
        if e.state is PartitionState.CLOSED and not any(p in {x.ordinal for x in pmap.entries} for p in e.parents):
            assert retention.trim_point(c, pmap, e.ordinal, [], NOW_MS) <= retention.ending_of(e)


# --- LogStore.trim ------------------------------------------------------------------------------

def state(plog) -> tuple:
    return plog.first_sn, plog.last_sn, plog.committed_sn, plog.batches, plog.records


@pytest.mark.parametrize("persistence", ALL)
@pytest.mark.parametrize("before, kept", [
    (0, LAYOUT),                               # nothing precedes 0
    (sn_of(1), LAYOUT),                        # the first record is not below its own SN
    (sn_of(1) + 1, LAYOUT[1:]),                # the first batch holds one record
    (sn_of(4), LAYOUT[1:]),                    # the last record of batch 2 is not below
    (sn_of(4) + 1, LAYOUT[2:]),
    (sn_of(10), LAYOUT[2:]),                   # in the gap between batches
    (sn_of(13), LAYOUT[3:]),                   # mid-batch: the batch stays whole
    (sn_of(17), LAYOUT[4:]),
    (seqno.SN_MAX, LAYOUT[4:]),                # the newest batch always stays
], ids=["zero", "first", "after-first", "last-of-2nd", "after-2nd", "gap", "mid-batch", "newest", "max"])
def test_trim_deletes_whole_batches_below_the_point(tmp_path, persistence, before, kept):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, LAYOUT)
            store.set_committed(plog, plog.last_sn)
            last, committed = plog.last_sn, plog.committed_sn
            deleted = await store.trim(plog, before)
            assert deleted == sum(k for _, k in LAYOUT) - sum(k for _, k in kept)
            assert read_all(store, plog) == expected_records(kept)
            assert state(plog) == (sn_of(kept[0][0]), last, committed, len(kept), sum(k for _, k in kept))
            assert await store.trim(plog, before) == 0          # again: nothing more
            assert state(plog) == (sn_of(kept[0][0]), last, committed, len(kept), sum(k for _, k in kept))

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_trim_of_an_empty_or_single_batch_log_deletes_nothing(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            assert await store.trim(plog, seqno.SN_MAX) == 0
            assert state(plog) == (0, 0, 0, 0, 0)
            await fill(store, plog, [(1, 5)])
            assert await store.trim(plog, seqno.SN_MAX) == 0
            assert read_all(store, plog) == expected_records([(1, 5)])
            assert (plog.first_sn, plog.batches, plog.records) == (sn_of(1), 1, 5)

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_trim_then_append_and_read(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, LAYOUT)
            await store.trim(plog, seqno.SN_MAX)
            await fill(store, plog, [(20, 2), (30, 1)])
            assert read_all(store, plog) == expected_records([(17, 1), (20, 2), (30, 1)])
            assert (plog.first_sn, plog.batches, plog.records) == (sn_of(17), 3, 4)
            assert await store.trim(plog, sn_of(30)) == 3
            assert read_all(store, plog) == expected_records([(30, 1)])
            assert (plog.first_sn, plog.last_sn, plog.batches, plog.records) == (sn_of(30), sn_of(30), 1, 1)

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_trim_leaves_other_logs_alone(tmp_path, persistence):
    async def scenario():
        async with running_store(tmp_path) as store:
            logs = [store.open_log(f"s:{i}", persistence) for i in range(3)]
            for i, plog in enumerate(logs):
                await fill(store, plog, LAYOUT, tag=f"log{i}")
            assert await store.trim(logs[1], seqno.SN_MAX) == 11
            for i, plog in enumerate(logs):
                want = LAYOUT[4:] if i == 1 else LAYOUT
                assert read_all(store, plog) == expected_records(want, tag=f"log{i}"), i
                assert (plog.batches, plog.records) == (len(want), sum(k for _, k in want))

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", ALL)
def test_trim_runs_in_bounded_transactions(tmp_path, persistence, monkeypatch):
    monkeypatch.setattr(limits, "TRIM_BATCHES_PER_TXN_MAX", 3)
    layout = [(c, 2) for c in range(1, 2 * 11, 2)]           # 11 batches of 2 records
    steps: list[int] = []
    inner = "_trim_memory" if persistence is Persistence.MEMORY else "_trim_txn"

    async def scenario():
        async with running_store(tmp_path) as store:
            original = getattr(store, inner)

            def counted(*args):
                victims = original(*args)
                steps.append(len(victims))
                return victims

            setattr(store, inner, counted)
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, layout)
            assert await store.trim(plog, seqno.SN_MAX) == 20
            assert read_all(store, plog) == expected_records(layout[-1:])
            assert (plog.first_sn, plog.batches, plog.records) == (sn_of(layout[-1][0]), 1, 2)
            assert steps[:4] == [3, 3, 3, 1], steps                 # 10 batches, 3 at a time
            # a point inside the run: stops at it, in bounded steps too
            steps.clear()
            await fill(store, plog, [(c, 1) for c in range(30, 40)])
            assert await store.trim(plog, sn_of(37)) == 2 + 7
            assert max(steps) <= 3 and sum(steps) == 8, steps
            assert read_all(store, plog) == expected_records([(c, 1) for c in range(37, 40)])

    asyncio.run(scenario())


@pytest.mark.parametrize("persistence", [Persistence.DISK, Persistence.DISK_ASYNC])
def test_trimmed_log_is_recovered_after_a_reopen(tmp_path, persistence):
    async def first():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            other = store.open_log("s:1", persistence)
            await fill(store, plog, LAYOUT)
            await fill(store, other, LAYOUT, tag="other")
            store.set_committed(plog, plog.last_sn)
            assert await store.trim(plog, sn_of(12)) == 6
            return state(plog)

    async def second():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", persistence)
            other = store.open_log("s:1", persistence)
            assert read_all(store, plog) == expected_records(LAYOUT[3:])
            assert read_all(store, other) == expected_records(LAYOUT, tag="other")
            got = state(plog)
            # the newest batch (the log's position) survives, so the next append follows it
            await store.append(plog, make_batch(18, 1))
            assert read_all(store, plog) == expected_records(LAYOUT[3:] + [(18, 1)])
            # and a trim after the reopen goes on from the recovered position
            assert await store.trim(plog, seqno.SN_MAX) == 6
            assert read_all(store, plog) == expected_records([(18, 1)])
            return got

    before = asyncio.run(first())
    assert before == (sn_of(12), sn_of(17), sn_of(17), 2, 6)
    assert asyncio.run(second()) == before


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=10),
       st.lists(st.integers(0, 70), min_size=1, max_size=4),
       st.integers(1, 4), st.sampled_from([Persistence.DISK_ASYNC, Persistence.MEMORY]))
def test_trims_match_a_model(gaps_counts, points, per_txn, persistence):
    layout, counter = [], 1
    for gap, count in gaps_counts:
        counter += gap
        layout.append((counter, count))
        counter += count

    async def scenario(path):
        async with running_store(path) as store:
            plog = store.open_log("s:0", persistence)
            await fill(store, plog, layout)
            model = list(layout)
            for point in points:
                before = sn_of(point)
                keep_from = 0
                while keep_from < len(model) - 1 and sn_of(sum(model[keep_from]) - 1) < before:
                    keep_from += 1
                removed = sum(k for _, k in model[:keep_from])
                model = model[keep_from:]
                assert await store.trim(plog, before) == removed, (layout, point)
                assert read_all(store, plog) == expected_records(model)
                assert (plog.first_sn, plog.batches, plog.records) == \
                    (sn_of(model[0][0]), len(model), sum(k for _, k in model))

    with mock.patch.object(limits, "TRIM_BATCHES_PER_TXN_MAX", per_txn), tempfile.TemporaryDirectory() as path:
        asyncio.run(scenario(path))


def test_read_slices_are_unaffected_by_records_of_deleted_batches(tmp_path):
    """A read from below the first stored SN starts at the first stored batch."""
    async def scenario():
        async with running_store(tmp_path) as store:
            plog = store.open_log("s:0", Persistence.DISK)
            await fill(store, plog, LAYOUT)
            await store.trim(plog, sn_of(12))
            got = records_of(store.read(plog, sn_of(2), seqno.SN_MAX, 2, BYTES_MAX))
            assert got == expected_records(LAYOUT[3:])[:2]

    asyncio.run(scenario())


def test_a_deduplicating_stream_drops_nothing_inside_its_dedup_window():
    dedup = config(ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_s=10, dedup_window_ms=60_000)
    floor = retention.dedup_floor(dedup, NOW_MS)
    assert floor == seqno.lower_bound_for_time(NOW_MS - 60_000 - limits.DEDUP_CLOCK_SKEW_MS_MAX)
    assert retention.dedup_floor(config(), NOW_MS) == seqno.SN_MAX       # no table: nothing to keep
    pmap = PartitionMap.even(1, NOW_MS - HOUR_MS).split(0, None, NOW_MS - 30_000, sn(NOW_MS - 31_000))
    assert retention.trim_point(dedup, pmap, 0, [], NOW_MS) > sn(NOW_MS - 31_000)   # hidden from readers
    assert retention.droppable(dedup, pmap, [], NOW_MS) == []                      # but kept stored
    assert retention.droppable(dedup, pmap, [], NOW_MS + 60_000) == [0]
