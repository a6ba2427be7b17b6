"""Consumer groups: `client.consumer(stream, group)` reads a stream as one member of a
group whose members share its partitions, as Kafka's consumer groups and the Kinesis
Client Library do.

    async with client.consumer("clicks", "billing") as consumer:
        async for batch in consumer:          # a ConsumerBatch: one partition's records, in order
            handle(batch.records)

Each member holds leases on some partitions (sms/leases.py), kept in the cluster's
lease table for the group (control/groups.py, through GroupState / GroupWrite; no
direct access to the metadata store). Every round -- a third of the failover time,
at once when a partition ends, and every CONSUMER_CATCHUP_ROUND_S while the member holds
less than its share (a newcomer waiting for the others to release theirs) -- a member
renews its leases, writes its checkpoints with them, and claims or releases leases toward
its exact share (`plan_share`). A partition is read only after its parents are read to
their end (SHARD_END), so per key records come in order across splits and merges.

Checkpoints: with `auto_checkpoint` (the default), asking for the next batch marks the
batches handed out before as processed (at least once, as KCL's processRecords); the
next round writes that to the lease. `checkpoint()` writes at once, and with
`auto_checkpoint=False` only it does. A member that stops cleanly (`close()`, or leaving
the `async with`) checkpoints what it processed and releases its leases: the others
take them at their next round. One that dies loses them after `failover_s`.

The group is a registered consumer of its stream: a stream that protects unread records
keeps what the group has not checkpointed. Records deleted before the group read them
(retention, a trim) end the iteration with RecordsTrimmed, unless the member was made with
`skip_trimmed=True` (it then goes on from the oldest record left). A member that loses a lease (a peer took it
after this member stalled, or `sms consumer reset` moved the group) stops reading that
partition at once and drops the batches of it not yet handed out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from sms import errors, limits, seqno
from sms.errors import LeaseLost
from sms.leases import LATEST, TRIM_HORIZON, ExpiryClock, Lease, LeaseTable, lease_key, plan_takes
from sms.proto import sms_pb2
from sms.tokens import peek
from sms.types import SHARD_END, Record, StartPosition, partition_id

if TYPE_CHECKING:
    from sms import aio, client as sync_client

log = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class ConsumerBatch:
    """Records of one partition, in SN order, after those of the batch before."""

    stream: str
    partition_id: str
    records: list[Record]
    millis_behind_latest: int
    _owned: "_Owned" = field(repr=False, compare=False)

    @property
    def last_sequence_number(self) -> str:
        return self.records[-1].sequence_number


class GroupLeases:
    """The group's lease entries through the cluster's API (a sms/leases.py LeaseStore)."""

    def __init__(self, client: aio.Client, stream: str, group: str, member: bool = False) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.member = member

    async def state(self) -> sms_pb2.GroupStateResponse:
        return await self.client._discovery_call("GroupState", sms_pb2.GroupRequest(stream=self.stream,
                                                                                    group=self.group))

    def _key(self, key: str) -> str:
        return key if self.member else key.rsplit(":", 1)[-1]

    def normalised(self, entries: Iterable[Any]) -> list[tuple[str, bytes, int]]:
        if self.member:
            return [(e.key, e.value, e.version) for e in entries]
        out = []
        for e in entries:
            d = json.loads(e.value)
            d["stream"] = self.stream            # (a reset writes leases without our name for the stream)
            out.append((f"{self.stream}:{e.key}", json.dumps(d).encode(), e.version))
        return out

    async def entries(self) -> list[tuple[str, bytes, int]]:
        state = await self.state()
        return self.normalised(state.members if self.member else state.leases)

    async def _write(self, key: str, value: bytes, version: int, delete: bool = False) -> int:
        pb = await self.client._discovery_call("GroupWrite", sms_pb2.GroupWriteRequest(
            stream=self.stream, group=self.group, member=self.member, key=self._key(key), value=value,
            version=version, delete=delete))
        written: int = pb.version
        return written

    async def create(self, key: str, value: bytes) -> int:
        return await self._write(key, value, -1)

    async def set(self, key: str, value: bytes, version: int) -> int:
        return await self._write(key, value, version)

    async def delete(self, key: str, version: int) -> None:
        try:
            await self._write(key, b"", version, delete=True)
        except LeaseLost:
            pass


class StreamsLeases:
    """One group's leases over several streams (an SPS stage with several inputs): a
    LeaseStore whose keys are "<stream>:<ordinal>", each kept in its stream's group."""

    def __init__(self, client: aio.Client, streams: tuple[str, ...], group: str) -> None:
        self.by_stream = {s: GroupLeases(client, s, group) for s in streams}

    async def entries(self) -> list[tuple[str, bytes, int]]:
        out = []
        for store in self.by_stream.values():
            out.extend(await store.entries())
        return out

    def _store(self, key: str) -> GroupLeases:
        return self.by_stream[key.rsplit(":", 1)[0]]

    async def create(self, key: str, value: bytes) -> int:
        return await self._store(key).create(key, value)

    async def set(self, key: str, value: bytes, version: int) -> int:
        return await self._store(key).set(key, value, version)

    async def delete(self, key: str, version: int) -> None:
        await self._store(key).delete(key, version)


class Membership:
    """A member's entry in its group (a heartbeat counter each round), and which members
    are alive as this member observes them: one whose counter has not moved for
    failover_s is not (its own clock only). Entries gone for long are removed."""

    def __init__(self, client: aio.Client, stream: str, group: str, member_id: str, failover_s: float) -> None:
        self.member_id = member_id
        self.failover_s = failover_s
        self.entries = GroupLeases(client, stream, group, member=True)
        self.version = -1
        self.counter = 0
        self.clock = ExpiryClock(failover_s)

    async def heartbeat(self) -> list[str]:
        """Write this member's entry; the members alive."""
        self.counter += 1
        value = json.dumps({"counter": self.counter, "heartbeat_ms": int(time.time() * 1000),
                            "host": socket.gethostname(), "pid": os.getpid()}).encode()
        entries = await self.entries.entries()
        mine = [version for key, _raw, version in entries if key == self.member_id]
        try:
            if mine:                          # (also after a create that was applied but answered late)
                self.version = await self.entries.set(self.member_id, value, mine[0])
            else:                             # first, or removed as dead by a peer: join again
                self.version = await self.entries.create(self.member_id, value)
        except LeaseLost:
            self.version = -1                 # (changed meanwhile: the next round sees it)
        alive = []
        now_ms = int(time.time() * 1000)
        for key, raw, version in entries:
            d = json.loads(raw) if raw else {}
            entry = Lease(key, 0, owner=key, counter=int(d.get("counter", 0)))
            self.clock.observe(entry)
            if key == self.member_id or not self.clock.expired(entry):
                alive.append(key)
            elif (self.clock.expired(entry, time.monotonic() - 2 * self.failover_s)
                  or now_ms - int(d.get("heartbeat_ms", 0)) > limits.GROUP_MEMBER_STALE_S * 1000):
                await self.entries.delete(key, version)        # gone for long: tidy up
        self.clock.keep({lease_key(key, 0) for key, _r, _v in entries})
        if self.member_id not in alive:
            alive.append(self.member_id)
        return alive

    async def leave(self) -> None:
        if self.version >= 0:
            await self.entries.delete(self.member_id, self.version)


@dataclass(eq=False)
class _Owned:
    lease: Lease
    task: asyncio.Task[None] | None = None
    delivered: str = ""               # SN of the last record handed out ("": none yet)
    processed: str = ""               # SN up to which the caller is done
    uncounted: int = 0                # records processed since the lease last counted them
    ended: bool = False               # a closed partition read to its end (SHARD_END once processed)
    end_delivered: bool = False       # ... and every batch of it handed out
    lost: bool = False
    renewed_at: float = 0.0           # when its lease was last written (monotonic)
    releasing: float = 0.0            # when this member decided to hand it over (0: it keeps it)


def plan_share(leases: dict[str, Lease], me: str, members: list[str], clock: ExpiryClock,
               max_take: int = limits.SPS_LEASES_TAKEN_PER_ROUND_MAX) -> tuple[list[Lease], list[Lease], int]:
    """(leases to claim, leases of mine to release, this member's share) this round:
    `plan_takes`' claims (free or expired leases; never one a live peer holds: each member
    releases its extra ones itself, so a rebalance reads nothing twice), held to this
    member's exact share. With n active leases and w live members, the first n % w members
    in id order hold n // w + 1 and the others n // w: each member works out every member's
    share alike, and the shares add up to n. (Up to the rounded-up share alone, two of
    three members could hold two of four leases each, and the third none for good.)
    Members that join together look at the free leases from different places (their rank),
    so that they seldom claim the same one."""
    claims, releases = plan_takes(leases, me, members, clock, max_take=max_take, take_from_peers=False)
    # (what plan_takes counts: leases not done whose parents are done, and the members
    # that are live and not stalled, i.e. not holding only expired leases)
    active = [lease for lease in leases.values() if not lease.done and all(
        (parent := leases.get(lease_key(lease.stream, p))) is None or parent.done for p in lease.parents)]
    stalled = {lease.owner for lease in active if lease.owner and clock.expired(lease)} - \
        {lease.owner for lease in active if lease.owner and not clock.expired(lease)}
    live = sorted((set(members) - stalled) | {me})
    n, w, rank = len(active), len(live), live.index(me)
    share = n // w + (1 if rank < n % w else 0)
    mine = sorted((lease for lease in active if lease.owner == me), key=lambda lease: (lease.stream, lease.ordinal))
    if claims:
        turn = rank % len(claims)
        claims = (claims[turn:] + claims[:turn])[:max(0, share - len(mine))]
    if len(mine) > share:
        releases = mine[share:]
    return claims, releases, share


def _due(owned: "_Owned") -> str:
    """The checkpoint the lease should hold now: what the caller processed, and SHARD_END
    once a closed partition's every batch was handed out and processed."""
    if owned.ended and owned.end_delivered and owned.processed == owned.delivered:
        return SHARD_END
    return owned.processed or owned.lease.checkpoint


class GroupConsumer:
    """One member of a consumer group (asyncio). See the module's docstring."""

    def __init__(self, client: aio.Client, stream: str, group: str, *, member_id: str | None = None,
                 start: str = TRIM_HORIZON, timestamp_ms: int | None = None, auto_checkpoint: bool = True,
                 failover_s: float = limits.CONSUMER_FAILOVER_S_DEFAULT, max_records: int = 1000,
                 wait_ms: int = 1000, skip_trimmed: bool = False) -> None:
        if str(start).upper() not in (TRIM_HORIZON, LATEST, "AT_TIMESTAMP"):
            raise errors.InvalidArgument(f"start {start!r}; expected TRIM_HORIZON, LATEST or AT_TIMESTAMP")
        position = StartPosition.of(start, timestamp_ms=timestamp_ms)     # (AT_TIMESTAMP needs timestamp_ms)
        if failover_s < limits.CONSUMER_FAILOVER_S_MIN:
            raise errors.InvalidArgument(f"failover_s {failover_s}; at least {limits.CONSUMER_FAILOVER_S_MIN}")
        if not 1 <= max_records <= limits.GET_RECORDS_COUNT_MAX:
            raise errors.InvalidArgument(f"max_records {max_records}; expected 1..{limits.GET_RECORDS_COUNT_MAX}")
        self.client = client
        self.stream = stream
        self.group = group
        self.member_id = member_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.start = position.encode()            # a new lease's checkpoint
        self.auto_checkpoint = auto_checkpoint
        self.failover_s = failover_s
        self.max_records = max_records
        self.wait_ms = wait_ms
        self.skip_trimmed = skip_trimmed          # else records trimmed before the group read them fail it
        self.table = LeaseTable(GroupLeases(client, stream, group), f"group {group}")
        self._membership = Membership(client, stream, group, self.member_id, failover_s)
        self._clock = ExpiryClock(failover_s)
        self._owned: dict[str, _Owned] = {}
        # batches read ahead, at most CONSUMER_BATCHES_QUEUED_MAX (a reader takes a slot
        # before it queues one), and _STOP once failed or closed: it wakes a waiting __anext__
        self._queue: asyncio.Queue[ConsumerBatch | object] = asyncio.Queue(maxsize=limits.CONSUMER_BATCHES_QUEUED_MAX + 1)
        self._stopped = False
        self._slots = asyncio.Semaphore(limits.CONSUMER_BATCHES_QUEUED_MAX)
        self._handed: list[ConsumerBatch] = []     # handed out, not yet marked processed (auto)
        self._wake = asyncio.Event()
        self._coordinator: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._writes = asyncio.Lock()             # lease writes: one at a time
        self._short_since = 0.0                   # below its share since (monotonic; 0: it is not)

    # --- life -------------------------------------------------------------------------
    async def __aenter__(self) -> "GroupConsumer":
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close(processed=exc_type is None)

    async def open(self) -> None:
        await self._round()                   # fails here, by name, for a stream that is not there
        self._coordinator = asyncio.get_running_loop().create_task(self._coordinate(),
                                                                   name=f"group-{self.group}-{self.member_id}")

    @property
    def assigned(self) -> list[str]:
        """The partitions this member holds now."""
        return sorted(partition_id(o.lease.ordinal) for o in self._owned.values())

    async def close(self, processed: bool = True) -> None:
        """Stop: checkpoint what was processed (with `processed`, every batch handed out
        under auto_checkpoint), release every lease, and leave the group."""
        if self._closed:
            return
        self._closed = True
        self._stop_queue()
        if self._coordinator is not None:
            self._wake.set()                  # (it ends after the round under way: no write is cut off)
            try:
                async with asyncio.timeout(limits.CONSUMER_RELEASE_WAIT_S):
                    await asyncio.gather(self._coordinator, return_exceptions=True)
            except TimeoutError:
                self._coordinator.cancel()
                await asyncio.gather(self._coordinator, return_exceptions=True)
        if processed and self.auto_checkpoint:
            self._mark_processed()
        for owned in list(self._owned.values()):
            if owned.task is not None:
                owned.task.cancel()
                await asyncio.gather(owned.task, return_exceptions=True)
        try:
            async with asyncio.timeout(limits.CONSUMER_RELEASE_WAIT_S):
                for key, owned in list(self._owned.items()):
                    await self._release(key, owned)
                await self._membership.leave()
        except (TimeoutError, errors.SmsError) as e:
            log.warning("group %s: %s left without releasing everything (%s); the others take over after "
                        "the failover time", self.group, self.member_id, e)
        self._owned.clear()

    # --- batches ----------------------------------------------------------------------
    def __aiter__(self) -> GroupConsumer:
        return self

    async def __anext__(self) -> ConsumerBatch:
        if self.auto_checkpoint:
            self._mark_processed()
        while True:
            batch = await self._queue.get()        # (cancelled while it waits: nothing is taken)
            if batch is _STOP:
                self._queue.put_nowait(_STOP)      # (for every later call too)
                if self._failure is not None:
                    raise self._failure
                raise StopAsyncIteration
            batch = cast(ConsumerBatch, batch)     # (the queue holds batches and _STOP)
            self._slots.release()
            owned = batch._owned
            if owned.lost or owned.releasing or self._owned.get(owned.lease.key) is not owned:
                continue                      # (its lease went or goes: another member reads it from its checkpoint)
            if not batch.records:             # the partition's end marker
                owned.end_delivered = True
                self._wake.set()
                continue
            owned.delivered = batch.last_sequence_number
            self._handed.append(batch)
            return batch

    def _fail(self, e: BaseException) -> None:
        self._failure = e
        self._stop_queue()

    def _stop_queue(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._queue.put_nowait(_STOP)     # (a slot of its own: the readers hold the others)

    async def poll(self, timeout_s: float | None = None) -> ConsumerBatch | None:
        """The next batch, or None when none came within `timeout_s` or the consumer is
        closed (as Kafka's poll)."""
        try:
            return await asyncio.wait_for(self.__anext__(), timeout_s)
        except (TimeoutError, StopAsyncIteration):
            return None

    def _mark_processed(self) -> None:
        for batch in self._handed:
            batch._owned.processed = batch.last_sequence_number
            batch._owned.uncounted += len(batch.records)
        self._handed.clear()

    async def checkpoint(self, batch: ConsumerBatch | None = None) -> None:
        """Record now that everything up to `batch` (of its partition), or every batch
        handed out so far, is processed."""
        if batch is not None:
            owned, last = batch._owned, int(batch.last_sequence_number)
            before = int(owned.processed or 0)
            sns = {r.sn for b in self._handed if b._owned is owned for r in b.records} | {r.sn for r in batch.records}
            owned.uncounted += sum(1 for sn in sns if before < sn <= last)
            owned.processed = batch.last_sequence_number
            self._handed = [b for b in self._handed if b._owned is not owned or int(b.last_sequence_number) > last]
            targets = [owned]
        else:
            self._mark_processed()
            targets = list(self._owned.values())
        for owned in targets:
            if self._owned.get(owned.lease.key) is owned:
                await self._renew(owned.lease.key, owned)

    # --- the rounds -------------------------------------------------------------------
    async def _coordinate(self) -> None:
        interval = self.failover_s / 3
        while True:
            # below its share, waiting for a peer to release its extra leases (the peer does
            # at its first round that sees this member): look again soon, for a while
            catching_up = self._short_since and time.monotonic() - self._short_since < self.failover_s
            try:
                async with asyncio.timeout(min(interval, limits.CONSUMER_CATCHUP_ROUND_S) if catching_up
                                           else interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self._closed:
                return
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except errors.SmsError as e:
                if not e.retriable and not isinstance(e, LeaseLost):
                    self._fail(e)               # (the stream was deleted, the key revoked: the caller hears)
                    return
                log.warning("group %s: round of %s failed: %s", self.group, self.member_id, e)
            except Exception as e:              # (a bug, or an entry written by something else)
                log.exception("group %s: round of %s failed", self.group, self.member_id)
                self._fail(errors.InternalError(f"consumer group {self.group}: {type(e).__name__}: {e}"))
                return
            self._drop_stale()

    def _drop_stale(self) -> None:
        """Stop processing a partition whose lease this member could not renew for most of
        the failover time: a peer may take it soon, and two must not process it at once."""
        now = time.monotonic()
        for key, owned in list(self._owned.items()):
            if now - owned.renewed_at > self.failover_s * limits.CONSUMER_STALE_FRACTION:
                log.warning("group %s: %s could not renew %s for %.1f s: stops reading it", self.group,
                            self.member_id, partition_id(owned.lease.ordinal), now - owned.renewed_at)
                self._lose(key, owned)

    async def _round(self) -> None:
        if self._closed:
            return
        members = await self._membership.heartbeat()
        info = await self.client.get_stream_info(self.stream)
        async with self._writes:              # (no checkpoint() of ours lands between the read and the compare)
            leases = await self.table.all()
            lost = [(key, owned) for key, owned in self._owned.items()
                    if (current := leases.get(key)) is None or current.owner != self.member_id
                    or current.version != owned.lease.version]
        present = {lease.ordinal for lease in leases.values()}
        for p in info.partitions:
            if p.ordinal not in present:
                # a partition whose parent the group knows starts at its beginning: everything
                # in it came after the parent's end; one the group never saw starts at `start`
                start = TRIM_HORIZON if any(q in present for q in p.parents) else self.start
                made = await self.table.ensure(self.stream, p.ordinal, tuple(p.parents), start)
                if made is not None:
                    leases[made.key] = made
                else:
                    self._wake.set()          # (a peer made it meanwhile: another round at once sees it)
        for lease in leases.values():
            self._clock.observe(lease)
        self._clock.keep(set(leases))
        # renew (with checkpoints) what this member holds; a lease changed under it is lost
        for key, owned in lost:
            self._lose(key, owned)
        for key, owned in list(self._owned.items()):
            if await self._renew(key, owned):
                leases[key] = owned.lease
        # (no taking from a live peer: each releases its extra leases itself, once the caller
        # is done with what it handed out, so a rebalance reads nothing twice)
        claims, releases, share = plan_share(leases, self.member_id, members, self._clock)
        # a lease still this member's that it no longer reads (a write answered late, or lost
        # and found again): take it up again from its checkpoint, before anything new
        dropped = [lease for key, lease in leases.items() if lease.owner == self.member_id and key not in self._owned
                   and not lease.done]
        claims = dropped + [lease for lease in claims if lease.key not in {d.key for d in dropped}]
        for lease in releases:
            mine = self._owned.get(lease.key)
            if mine is not None and not mine.releasing:
                # handed over once the caller is done with the batches it holds of it (a
                # clean rebalance reads nothing twice); what is queued is left to the next owner
                mine.releasing = time.monotonic()
                if mine.task is not None:
                    mine.task.cancel()
        for key, owned in list(self._owned.items()):
            # (auto_checkpoint: the caller asks for its next batch when done with this one; a
            # caller that checkpoints itself and does not within the failover time hands over
            # what it has not checkpointed)
            held = any(b._owned is owned for b in self._handed)
            if owned.releasing and (not held or (not self.auto_checkpoint
                                                 and time.monotonic() - owned.releasing > self.failover_s)):
                await self._release(key, owned)
        if len(claims) >= limits.SPS_LEASES_TAKEN_PER_ROUND_MAX:
            self._wake.set()                  # (claims are capped per round: another round at once)
        for lease in claims:
            try:
                async with self._writes:
                    won = await self.table.claim(lease, self.member_id)
                    if won.checkpoint == LATEST:
                        # where LATEST is now, written before reading: a member that takes the
                        # lease over later starts there too, and skips nothing
                        won = await self.table.checkpoint(won, await self._latest(won.ordinal))
            except LeaseLost:
                continue
            log.info("group %s: %s took %s at %s", self.group, self.member_id, partition_id(won.ordinal),
                     won.checkpoint)
            owned = _Owned(won, renewed_at=time.monotonic())
            owned.task = asyncio.get_running_loop().create_task(self._read(owned),
                                                                name=f"group-{self.group}-p{won.ordinal}")
            self._owned[won.key] = owned
        # below its share (a peer holds more than its own and releases it at its next round,
        # or another member claimed the same lease first): the coordinator looks again soon
        if len(self._owned) >= share:
            self._short_since = 0.0
        elif not self._short_since:
            self._short_since = time.monotonic()

    async def _renew(self, key: str, owned: _Owned) -> bool:
        """Renew the lease with its checkpoint (SHARD_END once a partition's end is
        processed); False if it was lost."""
        checkpoint = _due(owned)
        try:
            async with self._writes:
                if owned.lease.checkpoint == checkpoint:
                    owned.lease = await self.table.renew(owned.lease)
                else:
                    counted = owned.uncounted
                    owned.lease = await self.table.checkpoint(owned.lease, checkpoint, records=counted)
                    owned.uncounted -= counted
            owned.renewed_at = time.monotonic()
        except LeaseLost:
            self._lose(key, owned)
            return False
        if checkpoint == SHARD_END:
            self._forget(key, owned)
            self._wake.set()                  # its children may be claimed now
        return True

    async def _release(self, key: str, owned: _Owned) -> None:
        checkpoint = _due(owned)
        self._forget(key, owned)
        try:
            async with self._writes:
                if checkpoint != owned.lease.checkpoint:
                    owned.lease = await self.table.checkpoint(owned.lease, checkpoint, records=owned.uncounted)
                await self.table.release(owned.lease)
        except LeaseLost:
            pass

    def _forget(self, key: str, owned: _Owned) -> None:
        owned.lost = True
        if owned.task is not None:
            owned.task.cancel()
        if self._owned.get(key) is owned:
            del self._owned[key]
        self._handed = [b for b in self._handed if b._owned is not owned]

    def _lose(self, key: str, owned: _Owned) -> None:
        log.info("group %s: %s lost %s", self.group, self.member_id, partition_id(owned.lease.ordinal))
        self._forget(key, owned)

    # --- reading one partition --------------------------------------------------------
    async def _latest(self, ordinal: int) -> str:
        """The checkpoint that LATEST stands for now: after the partition's last committed
        record (TRIM_HORIZON for one that has none)."""
        last = peek(await self.client.get_iterator(self.stream, ordinal, LATEST)).position_sn - 1
        return str(last) if last > 0 and seqno.ordinal_of(last) == ordinal else TRIM_HORIZON

    async def _iterator(self, lease: Lease) -> str | None:
        position = StartPosition.parse(lease.checkpoint)
        if position.ended:
            return None
        kind, options = position.iterator()
        return await self.client.get_iterator(self.stream, lease.ordinal, kind, **options)

    async def _read(self, owned: _Owned) -> None:
        """Read the partition into the queue until its end, for as long as the lease is
        held: retriable failures are retried (with backoff) for as long as it takes; what
        cannot be retried fails the consumer, so nothing stops in silence."""
        pid = partition_id(owned.lease.ordinal)
        failures = 0
        it: str | None = None
        last_sn = ""                           # the last SN queued: a fresh iterator resumes after it
        try:
            while not owned.lost:
                try:
                    if it is None:
                        it = (await self.client.get_iterator(self.stream, owned.lease.ordinal, "AFTER_SEQUENCE_NUMBER",
                                                             sequence_number=last_sn)
                              if last_sn else await self._iterator(owned.lease))
                        if it is None:
                            break              # (SHARD_END: nothing to read)
                    page = await self.client.get_next_records(it, self.max_records, self.wait_ms,
                                                              skip_trimmed=self.skip_trimmed)
                    failures = 0
                except errors.ExpiredIterator:
                    it = None                  # (the caller took long: read on from what was queued)
                    continue
                except errors.PartitionNotFound:
                    if await self._dropped(owned.lease.ordinal):
                        break
                    it = None                  # (a node's map lagged behind a split: ask again)
                    failures += 1
                    await asyncio.sleep(min(0.05 * 2 ** failures, 2.0))
                    continue
                except errors.SmsError as e:
                    if not e.retriable:
                        raise
                    failures += 1
                    if failures % limits.READ_STREAM_RETRIES_MAX == 0:
                        log.warning("group %s: reading %s failed %d times in a row, retrying: %s", self.group, pid,
                                    failures, e)
                    await asyncio.sleep(min(0.05 * 2 ** min(failures, 6), 2.0))
                    continue
                if page.records:
                    await self._slots.acquire()
                    last_sn = page.records[-1].sequence_number
                    self._queue.put_nowait(ConsumerBatch(self.stream, pid, page.records, page.millis_behind_latest,
                                                         owned))
                it = page.next_iterator
                if it is None:
                    break
        except asyncio.CancelledError:
            raise
        except errors.SmsError as e:
            log.warning("group %s: reading %s failed: %s", self.group, pid, e)
            self._fail(e)                      # (RecordsTrimmed without skip_trimmed: the caller hears)
            return
        if not owned.lost:
            owned.ended = True
            await self._slots.acquire()
            self._queue.put_nowait(ConsumerBatch(self.stream, pid, [], 0, owned))     # the end marker

    async def _dropped(self, ordinal: int) -> bool:
        """True when retention dropped the partition (it is gone from a fresh map); its
        records the group had not read are RecordsTrimmed unless skip_trimmed."""
        info = await self.client.get_stream_info(self.stream)
        if any(p.ordinal == ordinal for p in info.partitions):
            return False
        if not self.skip_trimmed:
            raise errors.RecordsTrimmed(f"{self.stream} {partition_id(ordinal)}: dropped by retention before group "
                                        f"{self.group} read it to its end; make the member with skip_trimmed=True "
                                        "to go on with its children")
        log.warning("group %s: %s was dropped by retention before the group read it to its end; going on",
                    self.group, partition_id(ordinal))
        return True


class SyncGroupConsumer:
    """The sync client's consumer group member: a GroupConsumer run on the client's loop."""

    def __init__(self, client: sync_client.Client, consumer: GroupConsumer) -> None:
        self._client = client
        self._consumer = consumer

    def __enter__(self) -> "SyncGroupConsumer":
        self._client._run(self._consumer.open())
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._client._run(self._consumer.close(processed=exc_type is None))

    def __iter__(self) -> SyncGroupConsumer:
        return self

    def __next__(self) -> ConsumerBatch:
        try:
            return self._client._run(self._consumer.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def poll(self, timeout_s: float | None = None) -> ConsumerBatch | None:
        return self._client._run(self._consumer.poll(timeout_s))

    def checkpoint(self, batch: ConsumerBatch | None = None) -> None:
        self._client._run(self._consumer.checkpoint(batch))

    def close(self) -> None:
        self._client._run(self._consumer.close())

    @property
    def assigned(self) -> list[str]:
        return self._consumer.assigned

    @property
    def member_id(self) -> str:
        return self._consumer.member_id
