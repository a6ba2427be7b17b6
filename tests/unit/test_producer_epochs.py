"""Unit tests of producer epochs: the register (metastore/producers.py) in a real embedded
metadata store, and an ingestion node's verdicts (ingestion/fencing.py) under a test clock.

Each test opens a real EmbeddedMetaStore (an LMDB file in tmp_path; no sockets) with the
stream's entry made first, as the control role makes it. Tests are sync functions around
asyncio.run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ingestion.fencing import ProducerEpochs, session_producer_id
from metastore import EmbeddedMetaStore, MetaStore
from metastore import producers
from sms import limits, metadata
from sms.errors import InvalidArgument, ProducerFenced, StreamNotActive, StreamNotFound
from sms.metadata import StreamConfig
from sms.types import IngestionPolicy, Persistence, StreamStatus

STREAM = "orders"
PID = b"checkout-1"
T0_MS = 1_800_000_000_000


def config(status: StreamStatus = StreamStatus.ACTIVE) -> bytes:
    return StreamConfig(name=STREAM, partitions=1, replication_factor=1, persistence=Persistence.MEMORY,
                        ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24,
                        created_ms=T0_MS, status=status).to_bytes()


def run(tmp_path: Path, body: Callable[[MetaStore], Awaitable[None]], *,
        status: StreamStatus | None = StreamStatus.ACTIVE) -> None:
    tmp_path.mkdir(parents=True, exist_ok=True)

    async def main() -> None:
        async with EmbeddedMetaStore(str(tmp_path / "meta.lmdb")) as meta:
            if status is not None:
                await meta.create(metadata.stream_path(STREAM), config(status))
            await asyncio.wait_for(body(meta), 20)
    asyncio.run(main())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- the register ---------------------------------------------------------------------------

def test_open_takes_an_epoch_above_every_earlier_one(tmp_path):
    async def body(meta):
        first, previous = await producers.open_epoch(meta, STREAM, PID, T0_MS)
        assert (first, previous) == (T0_MS, 0)
        second, previous = await producers.open_epoch(meta, STREAM, PID, T0_MS)     # same ms: +1
        assert (second, previous) == (T0_MS + 1, T0_MS)
        third, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS - 60_000)    # a clock gone back
        assert third == T0_MS + 2
        assert await producers.current_epoch(meta, STREAM, PID) == third
        assert await producers.current_epoch(meta, STREAM, b"other") == 0
        # an entry lost (an operator deleted it): a later open still rises above the old epochs
        await meta.delete(metadata.producer_path(STREAM, PID))
        fourth, previous = await producers.open_epoch(meta, STREAM, PID, T0_MS + 5)
        assert previous == 0 and fourth > first
    run(tmp_path, body)


def test_open_refuses_a_missing_or_deleting_stream_and_never_brings_it_back(tmp_path):
    async def missing(meta):
        with pytest.raises(StreamNotFound):
            await producers.open_epoch(meta, STREAM, PID, T0_MS)
        assert await meta.get(metadata.stream_path(STREAM)) is None
    run(tmp_path / "a", missing, status=None)

    async def deleting(meta):
        with pytest.raises(StreamNotActive):
            await producers.open_epoch(meta, STREAM, PID, T0_MS)
    run(tmp_path / "b", deleting, status=StreamStatus.DELETING)


def test_raise_only_rises(tmp_path):
    async def body(meta):
        assert await producers.raise_epoch(meta, STREAM, PID, 7, T0_MS) == 7
        assert await producers.raise_epoch(meta, STREAM, PID, 5, T0_MS) == 7
        assert await producers.raise_epoch(meta, STREAM, PID, 9, T0_MS) == 9
        assert await producers.current_epoch(meta, STREAM, PID) == 9
    run(tmp_path, body)


def test_a_damaged_entry_fences_nothing(tmp_path):
    async def body(meta):
        await producers.open_epoch(meta, STREAM, PID, T0_MS)
        await meta.set(metadata.producer_path(STREAM, PID), b"not json")
        assert await producers.current_epoch(meta, STREAM, PID) == 0
        epoch, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS + 1)
        assert epoch == T0_MS + 1
    run(tmp_path, body)


# --- an ingestion node's verdicts --------------------------------------------------------------

def test_an_older_epoch_is_fenced_once_the_verdict_runs_out(tmp_path):
    async def body(meta):
        clock = Clock()
        epochs = ProducerEpochs(meta, clock=clock)
        old, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS)
        await epochs.admit(STREAM, PID, old)
        assert epochs.still_current(STREAM, PID, old)
        new, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS + 10)
        # within its verdict the node still admits the old epoch: InitProducer answers only
        # after PRODUCER_EPOCH_VERDICT_S, so the new instance cannot have written yet
        clock.now += limits.PRODUCER_EPOCH_VERDICT_S * 0.4
        await epochs.admit(STREAM, PID, old)
        clock.now += limits.PRODUCER_EPOCH_VERDICT_S * 0.7
        assert not epochs.still_current(STREAM, PID, old)
        with pytest.raises(ProducerFenced, match="fenced by epoch"):
            await epochs.admit(STREAM, PID, old)
        await epochs.admit(STREAM, PID, new)
        with pytest.raises(ProducerFenced):          # from the verdict, without a read
            await epochs.admit(STREAM, PID, old)
        assert epochs.fenced == 2
        await epochs.close()
    run(tmp_path, body)


def test_the_new_epoch_fences_at_once_where_it_was_seen(tmp_path):
    async def body(meta):
        epochs = ProducerEpochs(meta, clock=Clock())
        old, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS)
        await epochs.admit(STREAM, PID, old)
        new, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS + 10)
        await epochs.admit(STREAM, PID, new)          # higher than the verdict: read again
        with pytest.raises(ProducerFenced):
            await epochs.admit(STREAM, PID, old)
        await epochs.close()
    run(tmp_path, body)


def test_a_higher_epoch_than_the_register_raises_it(tmp_path):
    async def body(meta):
        epochs = ProducerEpochs(meta, clock=Clock(), wall_ms=lambda: T0_MS)
        await epochs.admit(STREAM, PID, 42)           # no entry (deleted, or an older node opened it)
        assert await producers.current_epoch(meta, STREAM, PID) == 42
        with pytest.raises(ProducerFenced):
            await epochs.admit(STREAM, PID, 41)
        await epochs.close()
    run(tmp_path, body)


def test_a_steady_producer_refreshes_its_verdict_in_the_background(tmp_path):
    async def body(meta):
        clock = Clock()
        epochs = ProducerEpochs(meta, clock=clock)
        epoch, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS)
        await epochs.admit(STREAM, PID, epoch)
        clock.now += limits.PRODUCER_EPOCH_VERDICT_S * 0.6      # past half: admitted, refreshed meanwhile
        await epochs.admit(STREAM, PID, epoch)
        while epochs._tasks:
            await asyncio.gather(*epochs._tasks)
        clock.now += limits.PRODUCER_EPOCH_VERDICT_S * 0.6      # the refreshed verdict still holds
        assert epochs.still_current(STREAM, PID, epoch)
        await epochs.close()
    run(tmp_path, body)


def test_bad_epochs_and_concurrent_checks(tmp_path):
    async def body(meta):
        epochs = ProducerEpochs(meta, clock=Clock())
        with pytest.raises(InvalidArgument):
            await epochs.admit(STREAM, PID, limits.PRODUCER_EPOCH_MAX + 1)
        epoch, _ = await producers.open_epoch(meta, STREAM, PID, T0_MS)
        await asyncio.gather(*(epochs.admit(STREAM, PID, epoch) for _ in range(20)))   # one read shared
        assert epochs.still_current(STREAM, PID, epoch)
        with pytest.raises(StreamNotFound):           # a write of a stream gone: nothing is made
            await epochs.admit("gone", PID, 5)
        assert await meta.get(metadata.stream_path("gone")) is None
        await epochs.close()
    run(tmp_path, body)


def test_session_names_keep_epochs_apart():
    assert session_producer_id(PID, 0) == PID
    named = {session_producer_id(PID, e) for e in (1, 2, 1 << 40)}
    assert len(named) == 3 and all(n.startswith(PID + b"\x00") and len(n) == len(PID) + 9 for n in named)
    assert len(session_producer_id(b"p" * limits.PRODUCER_ID_BYTES_MAX, limits.PRODUCER_EPOCH_MAX)) + 4 \
        == limits.SESSION_KEY_BYTES_MAX


def test_session_names_split_back():
    from ingestion.fencing import split_session_producer_id
    for pid, epoch in ((PID, 0), (PID, 7), (b"\x00" * 3, T0_MS), (b"p" * 64, limits.PRODUCER_EPOCH_MAX)):
        assert split_session_producer_id(session_producer_id(pid, epoch)) == (pid, epoch)
