"""Leases: which member of a group processes which partition, and how far (Kinesis
Client Library's lease table; sms/consumer.py's consumer groups and the SPS stages).

One entry per partition, written only by conditional writes on the version the writer
last saw -- claim, renew, checkpoint, release, take -- so two members can never both
believe they own a partition for long: the one whose write fails on the version has lost
the lease and stops processing that partition at once (`LeaseLost`). Members are peers;
there is no coordinator. Where the entries live is a `LeaseStore`: the cluster's
GroupState / GroupWrite calls (sms/consumer.py), or the metadata store (sps/leases.py).

A lease expires when its counter has not moved for the group's failover time, as this
member observed it (its own clock only: no clock comparison between hosts, as in the
Kinesis Client Library). Checkpoints are an SN, or TRIM_HORIZON / LATEST (not started),
or SHARD_END (a closed partition read to its end: its children may be claimed). A lease
also records the batch in progress (`pending_end`): a member that takes the lease over
replays exactly that batch first, so the outputs it derives from it are the same
records under the same SSSNs, which ingestion de-duplicates.

Pure apart from the store: `plan_takes` decides, `ExpiryClock` observes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sms import limits
from sms.errors import LeaseLost
from sms.types import SHARD_END, IteratorType

TRIM_HORIZON = IteratorType.TRIM_HORIZON.value
LATEST = IteratorType.LATEST.value
# (checkpoints are sms.types.StartPosition's text form)


def lease_key(stream: str, ordinal: int) -> str:
    return f"{stream}:{ordinal}"


@dataclass(frozen=True, slots=True)
class Lease:
    stream: str
    ordinal: int
    owner: str = ""                       # worker id; "" when free
    counter: int = 0                      # rises with every write of the owner (liveness)
    heartbeat_ms: int = 0                 # the owner's clock at its last write (for operators)
    checkpoint: str = TRIM_HORIZON        # SN (decimal) of the last record done, or a sentinel
    pending_end: str = ""                 # SN the batch in progress ends at ("": none)
    parents: tuple[int, ...] = ()         # input partitions that must reach SHARD_END first
    records: int = 0                      # records processed under this lease
    rate: float = 0.0                     # records/s, as the owner last measured
    failures: int = 0                     # records whose operation failed (then retried)
    dead_letters: int = 0                 # ... and that went to the dead-letter stream
    last_error: str = ""                  # the last failure, for `sms graph status`
    state: str = ""                       # a stateful stage: changelog SN of its latest snapshot ("": none)
    version: int = -1                     # the store's version of the entry (-1: not stored)

    @property
    def key(self) -> str:
        return lease_key(self.stream, self.ordinal)

    @property
    def done(self) -> bool:
        return self.checkpoint == SHARD_END

    def to_bytes(self) -> bytes:
        return json.dumps({"stream": self.stream, "ordinal": self.ordinal, "owner": self.owner,
                           "counter": self.counter, "heartbeat_ms": self.heartbeat_ms,
                           "checkpoint": self.checkpoint, "pending_end": self.pending_end,
                           "parents": list(self.parents), "records": self.records,
                           "rate": round(self.rate, 3), "failures": self.failures,
                           "dead_letters": self.dead_letters, "last_error": self.last_error,
                           "state": self.state}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, version: int) -> "Lease":
        d = json.loads(raw)
        return cls(stream=d["stream"], ordinal=d["ordinal"], owner=d["owner"], counter=d["counter"],
                   heartbeat_ms=d["heartbeat_ms"], checkpoint=d["checkpoint"], pending_end=d["pending_end"],
                   parents=tuple(d["parents"]), records=d["records"], rate=d["rate"],
                   failures=d.get("failures", 0), dead_letters=d.get("dead_letters", 0),
                   last_error=d.get("last_error", ""), state=d.get("state", ""), version=version)


class LeaseStore(Protocol):
    """Where a group's lease entries live: conditional writes by key."""

    async def entries(self) -> list[tuple[str, bytes, int]]:
        """(key, value, version) of every entry."""

    async def create(self, key: str, value: bytes) -> int:
        """The new entry's version; LeaseLost if it exists."""

    async def set(self, key: str, value: bytes, version: int) -> int:
        """The new version; LeaseLost unless the entry is at `version`."""

    async def delete(self, key: str, version: int) -> None:
        """Gone, if still at `version` (no error otherwise)."""


class LeaseTable:
    """The leases of one group (or stage), read and written through a LeaseStore."""

    def __init__(self, store: LeaseStore, name: str):
        self.store = store
        self.name = name                  # for messages: the group or the stage

    async def all(self) -> dict[str, Lease]:
        out = {}
        for key, value, version in await self.store.entries():
            if value:
                out[key] = Lease.from_bytes(value, version)
        return out

    async def ensure(self, stream: str, ordinal: int, parents: tuple[int, ...], start: str) -> Lease | None:
        """Create the partition's entry (free, at `start`) unless it exists; None if it did."""
        lease = Lease(stream, ordinal, checkpoint=start, parents=parents)
        try:
            version = await self.store.create(lease.key, lease.to_bytes())
        except LeaseLost:
            return None
        return replace(lease, version=version)

    async def _write(self, old: Lease, new: Lease) -> Lease:
        try:
            version = await self.store.set(old.key, new.to_bytes(), old.version)
        except LeaseLost:
            raise LeaseLost(f"{self.name}: lease {old.key} changed under {old.owner or 'nobody'}") from None
        return replace(new, version=version)

    def _mine(self, lease: Lease, worker: str, **changes: Any) -> Lease:
        return replace(lease, owner=worker, counter=lease.counter + 1, heartbeat_ms=int(time.time() * 1000),
                       **changes)

    async def claim(self, lease: Lease, worker: str) -> Lease:
        """Take a free or expired lease, or one a balancing worker takes from a busy peer."""
        return await self._write(lease, self._mine(lease, worker))

    async def renew(self, lease: Lease) -> Lease:
        return await self._write(lease, self._mine(lease, lease.owner))

    async def checkpoint(self, lease: Lease, checkpoint: str, pending_end: str = "", records: int = 0,
                         rate: float | None = None, failures: int = 0, dead_letters: int = 0,
                         last_error: str = "", state: str | None = None) -> Lease:
        """Record progress: everything up to `checkpoint` is done (its outputs acknowledged),
        and the batch up to `pending_end` is in progress; `state`: where a stateful stage's
        latest snapshot of the partition is in its changelog (None: unchanged)."""
        return await self._write(lease, self._mine(
            lease, lease.owner, checkpoint=checkpoint, pending_end=pending_end, records=lease.records + records,
            rate=lease.rate if rate is None else rate, failures=lease.failures + failures,
            dead_letters=lease.dead_letters + dead_letters,
            last_error=last_error[:limits.SPS_ERROR_CHARS_MAX] or lease.last_error,
            state=lease.state if state is None else state))

    async def release(self, lease: Lease) -> Lease:
        return await self._write(lease, replace(lease, owner="", counter=lease.counter + 1,
                                                heartbeat_ms=int(time.time() * 1000)))

    async def drop(self, lease: Lease) -> None:
        await self.store.delete(lease.key, lease.version)


class ExpiryClock:
    """Expiry as one worker observes it: a lease whose counter has not changed for the
    failover time is expired (its owner stopped renewing)."""

    def __init__(self, failover_s: float):
        self.failover_s = failover_s
        self._seen: dict[str, tuple[int, float]] = {}

    def observe(self, lease: Lease, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        last = self._seen.get(lease.key)
        if last is None or last[0] != lease.counter:
            self._seen[lease.key] = (lease.counter, now)

    def keep(self, keys: set[str]) -> None:
        """Forget what it saw of entries no longer there (members come and go)."""
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]

    def expired(self, lease: Lease, now: float | None = None) -> bool:
        if not lease.owner:
            return True
        now = time.monotonic() if now is None else now
        seen = self._seen.get(lease.key)
        return seen is not None and seen[0] == lease.counter and now - seen[1] >= self.failover_s


def plan_takes(leases: dict[str, Lease], me: str, workers: list[str], clock: ExpiryClock,
               max_take: int = limits.SPS_LEASES_TAKEN_PER_ROUND_MAX,
               take_from_peers: bool = True) -> tuple[list[Lease], list[Lease]]:
    """(leases to claim, leases of mine to release) this round, toward even counts.

    Active leases: not done, and every parent still in the table at SHARD_END (a child is
    processed only after its parents). With n active leases and w live workers, each
    worker should hold n // w or one more:
    - it claims free or expired leases (or ones whose owner is no longer registered) up to
      ceil(n / w), where w leaves out a registered worker all of whose leases expired;
    - if none is free and it holds fewer than n // w, it takes one from the busiest peer,
      when that peer holds at least two more than it does (unless `take_from_peers` is
      off: members that release their extra leases themselves hand them over cleanly);
    - above ceil(n / w) it releases the extra ones (a newcomer then claims them)."""
    active = {k: lease for k, lease in leases.items() if not lease.done and _parents_done(lease, leases)}
    # a registered worker all of whose leases expired has stopped working (its rounds fail
    # while its metadata session lives): it does not count, so its leases are shared out
    stalled = {lease.owner for lease in active.values() if lease.owner and clock.expired(lease)} - \
        {lease.owner for lease in active.values() if lease.owner and not clock.expired(lease)}
    live = sorted((set(workers) - stalled) | {me})
    n, w = len(active), len(live)
    share, floor = -(-n // w), n // w
    mine = [lease for lease in active.values() if lease.owner == me]
    claims: list[Lease] = []
    for lease in sorted(active.values(), key=lambda lease: (lease.stream, lease.ordinal)):
        if len(mine) + len(claims) >= share or len(claims) >= max_take:
            break
        if lease.owner != me and (lease.owner not in live or clock.expired(lease)):
            claims.append(lease)
    if take_from_peers and not claims and len(mine) < floor:
        by_owner: dict[str, list[Lease]] = {}
        for lease in active.values():
            if lease.owner and lease.owner != me:
                by_owner.setdefault(lease.owner, []).append(lease)
        if by_owner:
            busiest = max(by_owner, key=lambda worker: (len(by_owner[worker]), worker))
            if len(by_owner[busiest]) >= len(mine) + 2:
                claims.append(max(by_owner[busiest], key=lambda lease: (lease.stream, lease.ordinal)))
    releases: list[Lease] = []
    if len(mine) > share:
        releases = sorted(mine, key=lambda lease: (lease.stream, lease.ordinal))[share:]
    return claims, releases


def _parents_done(lease: Lease, leases: dict[str, Lease]) -> bool:
    for p in lease.parents:
        parent = leases.get(lease_key(lease.stream, p))
        if parent is not None and not parent.done:
            return False
    return True
