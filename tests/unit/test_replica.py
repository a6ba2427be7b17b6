"""Unit tests of storage.replica.Replica (no downstream link, so no sockets) over a real LogStore.

The wall clock of the sequencer is replaced with a scripted one (`storage.replica.time`) where
a test needs time to go backwards; `time.monotonic` stays real for `wait_committed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import types

import pytest

import storage.replica as replica_module
from sms import wire, seqno
from sms.errors import InvariantViolation, LogDiverged, NotEnoughReplicas, PartitionClosed, StaleEpoch, WrongOwner
from sms.metadata import ChainConfig
from sms.types import Persistence
from storage.log import LogStore
from storage.replica import Replica, ReplicaState

EPOCH = 3
ORDINAL = 7
WAIT_S = 0.05


def chain(*members: str, epoch: int = EPOCH, min_in_sync: int = 1, learners: tuple[str, ...] = ()) -> ChainConfig:
    return ChainConfig(chain_id=f"s:{ORDINAL}", stream="s", ordinal=ORDINAL, epoch=epoch,
                       members=tuple(members), persistence=Persistence.DISK, min_in_sync=min_in_sync,
                       learners=learners)


def unsequenced(count: int, tag: str = "r", origin: tuple[int, int] = (0, 0)) -> bytes:
    return wire.build_batch([wire.encode_entry(f"k{i}".encode(), f"{tag}{i}".encode()) for i in range(count)],
                            origin_id=origin[0], origin_seq=origin[1])


@contextlib.asynccontextmanager
async def running_store(path):
    store = LogStore(str(path))
    await store.start()
    try:
        yield store
    finally:
        await store.close()


def replica_on(store: LogStore, node_id: str, config: ChainConfig) -> Replica:
    return Replica(node_id, config, store, store.open_log(config.chain_id, config.persistence))


class ScriptedClock:
    """time.time() answers from a script, then keeps answering its last value."""

    def __init__(self, seconds: list[float]):
        self.seconds = list(seconds)

    def time(self) -> float:
        return self.seconds.pop(0) if len(self.seconds) > 1 else self.seconds[0]


def use_clock(monkeypatch, seconds: list[float]) -> None:
    clock = ScriptedClock(seconds)
    monkeypatch.setattr(replica_module, "time", types.SimpleNamespace(time=clock.time, monotonic=time.monotonic))


# --- head -------------------------------------------------------------------------------------

def test_single_member_chain_commits_at_once(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            assert r.is_head and r.is_tail
            header = await r.append_as_head(EPOCH, unsequenced(3))
            assert header.count == 3
            assert r.last_sn == header.last_sn
            assert r.committed_sn == header.last_sn
            assert await r.wait_committed(header.last_sn, timeout_s=WAIT_S)
            assert await r.wait_committed(header.first_sn, timeout_s=0)
            assert not await r.wait_committed(header.last_sn + 1, timeout_s=WAIT_S)
            status = r.status()
            assert (status["role"], status["records"], status["batches"]) == ("head+tail", 3, 1)

    asyncio.run(scenario())


def test_sequence_numbers_name_the_partition_and_count_records(tmp_path, monkeypatch):
    use_clock(monkeypatch, [1_700_000_000.0])

    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            h1 = await r.append_as_head(EPOCH, unsequenced(2))
            h2 = await r.append_as_head(EPOCH, unsequenced(3))
            for h in (h1, h2):
                assert seqno.ordinal_of(h.first_sn) == ORDINAL
                assert seqno.timestamp_ms_of(h.first_sn) == 1_700_000_000_000
            assert [seqno.counter_of(h1.first_sn), seqno.counter_of(h1.last_sn)] == [1, 2]
            assert [seqno.counter_of(h2.first_sn), seqno.counter_of(h2.last_sn)] == [3, 5]

    asyncio.run(scenario())


def test_sns_strictly_increase_when_the_clock_goes_backwards(tmp_path, monkeypatch):
    seconds = [1_700_000_010.0, 1_700_000_005.0, 1_600_000_000.0, 1_700_000_010.0, 1_700_000_011.0, 0.0]
    use_clock(monkeypatch, seconds)

    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            headers = [await r.append_as_head(EPOCH, unsequenced(1 + i % 3)) for i in range(len(seconds))]
            for prev, nxt in zip(headers, headers[1:]):
                assert nxt.first_sn > prev.last_sn
                assert seqno.timestamp_ms_of(nxt.first_sn) >= seqno.timestamp_ms_of(prev.last_sn)
                assert seqno.counter_of(nxt.first_sn) == seqno.counter_of(prev.last_sn) + 1
            assert seqno.timestamp_ms_of(headers[-2].first_sn) == 1_700_000_011_000
            assert seqno.timestamp_ms_of(headers[-1].first_sn) == 1_700_000_011_000

    asyncio.run(scenario())


def test_sns_continue_after_a_restart_with_a_slower_clock(tmp_path, monkeypatch):
    use_clock(monkeypatch, [1_700_000_100.0])

    async def scenario():
        async with running_store(tmp_path) as store:
            last = (await replica_on(store, "n1", chain("n1")).append_as_head(EPOCH, unsequenced(4))).last_sn
        use_clock(monkeypatch, [1_700_000_000.0])
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            assert r.last_sn == last
            header = await r.append_as_head(EPOCH, unsequenced(1))
            assert header.first_sn > last

    asyncio.run(scenario())


def test_concurrent_head_appends_are_sequenced_one_at_a_time(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            headers = await asyncio.gather(*(r.append_as_head(EPOCH, unsequenced(2)) for _ in range(20)))
            spans = sorted((h.first_sn, h.last_sn) for h in headers)
            for (_, prev_last), (nxt_first, _) in zip(spans, spans[1:]):
                assert nxt_first > prev_last
            assert r.log.records == 40 and r.log.batches == 20
            assert r.committed_sn == spans[-1][1]

    asyncio.run(scenario())


@pytest.mark.parametrize("epoch", [EPOCH - 1, EPOCH + 1, 0])
def test_wrong_epoch_raises_stale_epoch(tmp_path, epoch):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            with pytest.raises(StaleEpoch):
                await r.append_as_head(epoch, unsequenced(1))
            assert (r.last_sn, r.log.batches) == (0, 0)
            with pytest.raises(StaleEpoch):
                r.check_epoch(epoch)
            r.check_epoch(EPOCH)

    asyncio.run(scenario())


@pytest.mark.parametrize("node", ["n2", "n3"])
def test_non_head_raises_wrong_owner(tmp_path, node):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, node, chain("n1", "n2", "n3"))
            assert not r.is_head
            with pytest.raises(WrongOwner) as info:
                await r.append_as_head(EPOCH, unsequenced(1))
            assert info.value.refresh_map
            assert (r.last_sn, r.log.batches) == (0, 0)

    asyncio.run(scenario())


def test_closed_replica_refuses_appends_and_releases_waiters(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1", "n2"))
            header = await r.append_as_head(EPOCH, unsequenced(1))
            waiter = asyncio.get_running_loop().create_task(r.wait_committed(header.last_sn, timeout_s=30))
            await asyncio.sleep(0)
            await r.close()
            assert r.state is ReplicaState.CLOSED
            assert await asyncio.wait_for(waiter, timeout=5) is False
            with pytest.raises(PartitionClosed):
                await r.append_as_head(EPOCH, unsequenced(1))
            with pytest.raises(PartitionClosed):
                await r.append_as_successor(wire.sequence(unsequenced(1), header.last_sn + seqno.COUNTER_UNIT))

    asyncio.run(scenario())


def test_head_refuses_a_corrupted_unsequenced_batch(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            damaged = bytearray(unsequenced(2))
            damaged[-1] ^= 0x01
            with pytest.raises(wire.CorruptBatch):
                await r.append_as_head(EPOCH, bytes(damaged))
            assert r.log.batches == 0

    asyncio.run(scenario())


# --- commit flowing back up the chain -------------------------------------------------------------

def test_head_of_a_longer_chain_commits_when_the_successor_says_so(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1", "n2"))
            assert r.is_head and not r.is_tail
            h1 = await r.append_as_head(EPOCH, unsequenced(2))
            h2 = await r.append_as_head(EPOCH, unsequenced(2))
            assert r.committed_sn == 0
            assert not await r.wait_committed(h1.last_sn, timeout_s=WAIT_S)
            waiter = asyncio.get_running_loop().create_task(r.wait_committed(h2.last_sn, timeout_s=30))
            await r.on_successor_committed(h1.last_sn)
            assert r.committed_sn == h1.last_sn
            assert await r.wait_committed(h1.last_sn, timeout_s=WAIT_S)
            assert not waiter.done()
            await r.on_successor_committed(h2.last_sn + 100 * seqno.COUNTER_UNIT)   # clamped to last
            assert r.committed_sn == h2.last_sn
            assert await asyncio.wait_for(waiter, timeout=5) is True
            await r.on_successor_committed(h1.first_sn)                              # never backwards
            assert r.committed_sn == h2.last_sn

    asyncio.run(scenario())


# --- successor ---------------------------------------------------------------------------------

async def _head_batches(store: LogStore, counts: list[int]) -> list[bytes]:
    head = replica_on(store, "n1", chain("n1"))
    out = []
    for count in counts:
        header = await head.append_as_head(EPOCH, unsequenced(count))
        out.append(head.batches_after(header.first_sn - 1, 1)[0])
    return out


def test_successor_stores_batches_and_skips_ones_it_holds(tmp_path):
    async def scenario():
        async with running_store(tmp_path / "head") as head_store, running_store(tmp_path / "tail") as store:
            batches = await _head_batches(head_store, [2, 1, 3])
            tail = replica_on(store, "n2", chain("n1", "n2"))
            assert tail.is_tail and not tail.is_head
            for batch in batches[:2]:
                await tail.append_as_successor(batch)
            state = (tail.last_sn, tail.log.batches, tail.log.records, tail.committed_sn)
            assert state == (wire.read_header(batches[1]).last_sn, 2, 3, wire.read_header(batches[1]).last_sn)
            for batch in batches[:2]:                       # resent after a reconnect
                await tail.append_as_successor(batch)
            assert (tail.last_sn, tail.log.batches, tail.log.records, tail.committed_sn) == state
            await tail.append_as_successor(batches[2])
            assert tail.last_sn == wire.read_header(batches[2]).last_sn
            assert tail.committed_sn == tail.last_sn
            assert await tail.wait_committed(tail.last_sn, timeout_s=WAIT_S)
            assert tail.batches_after(0, 10) == batches

    asyncio.run(scenario())


def test_middle_successor_does_not_commit_on_its_own(tmp_path):
    async def scenario():
        async with running_store(tmp_path / "head") as head_store, running_store(tmp_path / "mid") as store:
            batches = await _head_batches(head_store, [2])
            middle = replica_on(store, "n2", chain("n1", "n2", "n3"))
            await middle.append_as_successor(batches[0])
            assert middle.last_sn == wire.read_header(batches[0]).last_sn
            assert middle.committed_sn == 0

    asyncio.run(scenario())


def test_successor_refuses_an_overlapping_batch(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            tail = replica_on(store, "n2", chain("n1", "n2"))
            first = seqno.make(1_000, 1, ORDINAL)
            await tail.append_as_successor(wire.sequence(unsequenced(3), first))          # counters 1..3
            overlapping = wire.sequence(unsequenced(3), first + 2 * seqno.COUNTER_UNIT)   # counters 3..5
            with pytest.raises(InvariantViolation):
                await tail.append_as_successor(overlapping)
            assert tail.log.batches == 1

    asyncio.run(scenario())


def test_head_chains_each_batch_to_the_one_before(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            batches = await _head_batches(store, [2, 1, 3])
            headers = [wire.read_header(b) for b in batches]
            assert headers[0].prev_checksum == 0
            assert [h.prev_checksum for h in headers[1:]] == [h.checksum for h in headers[:-1]]

    asyncio.run(scenario())


def test_successor_refuses_a_batch_that_does_not_follow_its_last(tmp_path):
    """Two heads that stored the same first batch, then different second ones: the same
    third batch (same SNs, same records) sequenced by each differs, and a successor holding
    one history refuses the other's; an empty log takes any first batch (a copy of a
    trimmed log starts in the middle of the chain)."""
    async def scenario():
        async with running_store(tmp_path / "other") as other_store, running_store(tmp_path / "tail") as store:
            first = seqno.make(1_000, 1, ORDINAL)
            common = wire.sequence(unsequenced(1), first)
            a2 = wire.sequence(unsequenced(1, "a"), first + seqno.COUNTER_UNIT, wire.read_header(common).checksum)
            b2 = wire.sequence(unsequenced(1, "b"), first + seqno.COUNTER_UNIT, wire.read_header(common).checksum)
            a3 = wire.sequence(unsequenced(1), first + 2 * seqno.COUNTER_UNIT, wire.read_header(a2).checksum)
            b3 = wire.sequence(unsequenced(1), first + 2 * seqno.COUNTER_UNIT, wire.read_header(b2).checksum)
            assert wire.read_header(a3).checksum != wire.read_header(b3).checksum     # same bytes, other history
            tail = replica_on(store, "n2", chain("n1", "n2"))
            for batch in (common, a2):
                await tail.append_as_successor(batch)
            with pytest.raises(LogDiverged):
                await tail.append_as_successor(b3)
            assert tail.log.batches == 2 and not tail.holds_batch(first + 2 * seqno.COUNTER_UNIT,
                                                                   wire.read_header(b3).last_sn,
                                                                   wire.read_header(b3).checksum)
            await tail.append_as_successor(a3)
            assert tail.log.batches == 3
            empty = replica_on(other_store, "n3", chain("n1", "n3"))
            await empty.append_as_successor(b3)                    # no last batch to follow
            assert empty.log.batches == 1

    asyncio.run(scenario())


def test_successor_refuses_a_corrupted_batch(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            tail = replica_on(store, "n2", chain("n1", "n2"))
            damaged = bytearray(wire.sequence(unsequenced(2), seqno.make(1_000, 1, ORDINAL)))
            damaged[-1] ^= 0x01
            with pytest.raises(wire.CorruptBatch):
                await tail.append_as_successor(bytes(damaged))
            assert tail.log.batches == 0

    asyncio.run(scenario())


def test_batches_after_reads_from_the_log_when_recent_is_empty(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1"))
            headers = [await r.append_as_head(EPOCH, unsequenced(k)) for k in (1, 2, 3, 1)]
            from_recent = r.batches_after(headers[0].last_sn, 10)
            fresh = Replica("n1", chain("n1"), store, r.log)          # a restarted replica: no recent
            from_log = fresh.batches_after(headers[0].last_sn, 10)
            assert from_recent == from_log
            assert [wire.read_header(b).first_sn for b in from_log] == [h.first_sn for h in headers[1:]]
            assert len(fresh.batches_after(0, 2)) == 2
            assert fresh.batches_after(headers[-1].last_sn, 10) == []

    asyncio.run(scenario())


# --- config changes --------------------------------------------------------------------------------

def test_a_new_tail_commits_its_whole_log(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            head = replica_on(store, "n1", chain("n1", "n2"))
            header = await head.append_as_head(EPOCH, unsequenced(2))
            assert head.committed_sn == 0
            head.apply_config(chain("n1", epoch=EPOCH + 1))          # the successor was removed
            assert head.is_tail and head.committed_sn == header.last_sn
            with pytest.raises(StaleEpoch):
                await head.append_as_head(EPOCH, unsequenced(1))
            await head.append_as_head(EPOCH + 1, unsequenced(1))

    asyncio.run(scenario())


# --- min_in_sync --------------------------------------------------------------------------------

WRITER = 0x5EED                       # an ingestion writer's origin id


def test_a_head_below_min_in_sync_refuses_new_batches_and_stores_nothing(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            # one member left, a learner copying: learners do not count
            r = replica_on(store, "n1", chain("n1", min_in_sync=2, learners=("n3",)))
            with pytest.raises(NotEnoughReplicas, match="1 member.*min_in_sync 2"):
                await r.append_as_head(EPOCH, unsequenced(2, origin=(WRITER, 1)))
            assert (r.last_sn, r.committed_sn, r.log.batches) == (0, 0, 0)
            assert not r.sequence_lock.locked()
            # the learner joins (a new epoch): the chain has its two members, writes go on
            r.apply_config(chain("n1", "n3", epoch=EPOCH + 1, min_in_sync=2))
            header = await r.append_as_head(EPOCH + 1, unsequenced(2, origin=(WRITER, 1)))
            assert r.last_sn == header.last_sn and r.committed_sn == 0      # the tail n3 commits
            await r.on_successor_committed(header.last_sn)
            assert r.committed_sn == header.last_sn

    asyncio.run(scenario())


def test_min_in_sync_one_is_todays_behaviour(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1", learners=("n3",)))
            header = await r.append_as_head(EPOCH, unsequenced(1))
            assert r.committed_sn == header.last_sn

    asyncio.run(scenario())


def test_a_chain_that_degrades_holds_what_it_had_and_still_answers_its_resends(tmp_path):
    """o1 is sequenced while the chain has two members; the successor is removed before it
    acks: the lone head, now tail, does not commit o1 (one copy) -- it waits, answering a
    resend of o1 with the batch it holds (not NotEnoughReplicas, not stored twice) -- and
    refuses o2. Once a second member joins and holds o1, it is committed."""
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1", "n2", min_in_sync=2))
            o1 = await r.append_as_head(EPOCH, unsequenced(3, origin=(WRITER, 1)))
            r.apply_config(chain("n1", epoch=EPOCH + 1, min_in_sync=2, learners=("n3",)))
            assert r.is_tail and r.committed_sn == 0
            assert not await r.wait_committed(o1.last_sn, timeout_s=WAIT_S)
            again = await r.append_as_head(EPOCH + 1, unsequenced(3, origin=(WRITER, 1)))
            assert again == o1 and r.log.batches == 1
            with pytest.raises(NotEnoughReplicas):
                await r.append_as_head(EPOCH + 1, unsequenced(1, origin=(WRITER, 2)))
            assert r.last_sn == o1.last_sn and r.log.batches == 1
            # a learner's progress does not commit it either (it is not a member yet)
            await r.on_learner_acked("n3", o1.last_sn)
            assert r.committed_sn == 0
            # n3, which holds o1, joins as the tail: its commit reaches the head
            r.apply_config(chain("n1", "n3", epoch=EPOCH + 2, min_in_sync=2))
            assert not r.is_tail and r.committed_sn == 0
            await r.on_successor_committed(o1.last_sn)
            assert await r.wait_committed(o1.last_sn, timeout_s=WAIT_S)
            assert await r.append_as_head(EPOCH + 2, unsequenced(3, origin=(WRITER, 1))) == o1
            o2 = await r.append_as_head(EPOCH + 2, unsequenced(1, origin=(WRITER, 2)))
            assert o2.first_sn > o1.last_sn

    asyncio.run(scenario())


def test_a_tail_commits_its_log_once_its_chain_has_min_in_sync_members_again(tmp_path):
    async def scenario():
        async with running_store(tmp_path) as store:
            r = replica_on(store, "n1", chain("n1", "n2", min_in_sync=2))
            o1 = await r.append_as_head(EPOCH, unsequenced(2))
            r.apply_config(chain("n1", epoch=EPOCH + 1, min_in_sync=2))
            assert r.committed_sn == 0
            # two members again, n1 still the tail (n3 holds the same log, as after a head
            # handoff, control/chains.py rule 8): the tail commits everything it holds
            r.apply_config(chain("n3", "n1", epoch=EPOCH + 2, min_in_sync=2))
            assert r.is_tail and r.committed_sn == o1.last_sn

    asyncio.run(scenario())
