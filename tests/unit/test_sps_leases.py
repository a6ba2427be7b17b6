"""Unit tests of sps.leases: the lease table, the expiry clock and the balancing plan.

LeaseTable runs against real stores, parametrised like the metastore contract tests: a
real embedded (LMDB) store in tmp_path and a real standalone ZooKeeper server
(tests/zkserver.py, one per module, a fresh chroot prefix per test; the zk params skip
where ZooKeeper is not installed). Every write is one conditional write: it bumps the
counter and the version, and a write from a stale Lease raises LeaseLost and changes
nothing; two clients racing to claim one lease end with exactly one owner.

ExpiryClock is driven with explicit `now` arguments. plan_takes is checked by
hypothesis over random tables (single-round rules), and by simulating rounds of every
live worker over a model table until nothing changes (balance, newcomers, dead
workers). plan_takes reads the clock without `now` (time.monotonic()), so leases are
made expired by observing them far in the past.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from typing import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import limits
from sps.leases import (
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExpiryClock,
    Lease,
    LeaseLost,
    LeaseTable,
    lease_key,
    leases_path,
    plan_takes,
)
from tests.metastores import StoreFactory, store_factory, zk_server  # noqa: F401 (fixtures)

TEST_TIMEOUT_S = 30.0
FAR_PAST_S = 1e6          # observed this long ago: expired for any failover time used here


# --- real stores ---------------------------------------------------------------------------

def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


async def stored(table: LeaseTable, key: str) -> Lease | None:
    return (await table.all()).get(key)


# --- LeaseTable ----------------------------------------------------------------------------

def test_all_of_an_unknown_stage_is_empty(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            assert await LeaseTable(store, "nothing-here").all() == {}
    run(body)


def test_ensure_creates_a_free_entry_once(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            table = LeaseTable(store, "parse")
            lease = await table.ensure("clicks", 3, (1, 2), TRIM_HORIZON)
            assert lease == Lease("clicks", 3, owner="", counter=0, checkpoint=TRIM_HORIZON, parents=(1, 2),
                                  version=0)
            assert await table.all() == {"clicks:3": lease}
            # idempotent: a second ensure (whatever its arguments) leaves the entry alone
            assert await table.ensure("clicks", 3, (), LATEST) is None
            assert await table.ensure("clicks", 3, (1, 2), TRIM_HORIZON) is None
            assert await table.all() == {"clicks:3": lease}
            # entries live under the stage's lease path
            assert await store.children(leases_path("parse")) == ["clicks:3"]
            # another partition, another stream and another stage are separate entries
            other = await table.ensure("clicks", 4, (), LATEST)
            views = await table.ensure("views", 3, (), TRIM_HORIZON)
            assert other is not None and views is not None
            assert set(await table.all()) == {"clicks:3", "clicks:4", "views:3"}
            assert await LeaseTable(store, "count").ensure("clicks", 3, (), TRIM_HORIZON) is not None
            assert set(await table.all()) == {"clicks:3", "clicks:4", "views:3"}
    run(body)


def test_every_write_bumps_counter_and_version(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            table = LeaseTable(store, "parse")
            lease = await table.ensure("clicks", 0, (), TRIM_HORIZON)
            assert lease is not None
            before_ms = int(time.time() * 1000)

            claimed = await table.claim(lease, "w1")
            assert (claimed.owner, claimed.counter, claimed.version) == ("w1", 1, 1)
            assert before_ms <= claimed.heartbeat_ms <= int(time.time() * 1000)
            assert claimed.checkpoint == TRIM_HORIZON and claimed.records == 0
            assert await stored(table, lease.key) == claimed

            renewed = await table.renew(claimed)
            assert (renewed.owner, renewed.counter, renewed.version) == ("w1", 2, 2)
            assert renewed.heartbeat_ms >= claimed.heartbeat_ms
            assert await stored(table, lease.key) == renewed

            cp = await table.checkpoint(renewed, "100", pending_end="250", records=7, rate=12.5)
            assert (cp.owner, cp.counter, cp.version) == ("w1", 3, 3)
            assert (cp.checkpoint, cp.pending_end, cp.records, cp.rate) == ("100", "250", 7, 12.5)
            assert await stored(table, lease.key) == cp

            # records accumulate; pending_end defaults to none in progress; rate None keeps the last one
            cp2 = await table.checkpoint(cp, "250", records=5)
            assert (cp2.counter, cp2.version) == (4, 4)
            assert (cp2.checkpoint, cp2.pending_end, cp2.records, cp2.rate) == ("250", "", 12, 12.5)
            assert await stored(table, lease.key) == cp2

            released = await table.release(cp2)
            assert (released.owner, released.counter, released.version) == ("", 5, 5)
            assert (released.checkpoint, released.records) == ("250", 12)     # progress is kept
            assert await stored(table, lease.key) == released

            # a free lease is claimed by another worker, who resumes at the checkpoint
            again = await table.claim(released, "w2")
            assert (again.owner, again.counter, again.version, again.checkpoint) == ("w2", 6, 6, "250")

            done = await table.checkpoint(again, SHARD_END)
            assert done.done and not again.done
            assert await stored(table, lease.key) == done
    run(body)


WRITES: dict[str, Callable[[LeaseTable, Lease], Awaitable[Lease]]] = {
    "claim": lambda table, lease: table.claim(lease, "thief"),
    "renew": lambda table, lease: table.renew(lease),
    "checkpoint": lambda table, lease: table.checkpoint(lease, "999", pending_end="1000", records=3),
    "release": lambda table, lease: table.release(lease),
}


@pytest.mark.parametrize("op", sorted(WRITES))
def test_write_with_a_stale_lease_is_lost_and_changes_nothing(store_factory: StoreFactory, op: str) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            table = LeaseTable(store, "parse")
            lease = await table.ensure("clicks", 1, (), TRIM_HORIZON)
            mine = await table.claim(lease, "w1")
            current = await table.checkpoint(mine, "10", pending_end="20", records=2)   # another writer moved on
            for stale in (lease, mine):          # any older version
                with pytest.raises(LeaseLost):
                    await WRITES[op](table, stale)
                assert await stored(table, current.key) == current
            # the current one still writes
            newer = await WRITES[op](table, current)
            assert newer.version == current.version + 1 and newer.counter == current.counter + 1
    run(body)


def test_write_to_a_dropped_lease_is_lost(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            table = LeaseTable(store, "parse")
            lease = await table.ensure("clicks", 2, (), TRIM_HORIZON)
            claimed = await table.claim(lease, "w1")
            await table.drop(lease)                  # stale version: nothing happens
            assert await stored(table, lease.key) == claimed
            await table.drop(claimed)
            assert await table.all() == {}
            await table.drop(claimed)                # already gone: nothing happens
            for op in WRITES.values():
                with pytest.raises(LeaseLost):
                    await op(table, claimed)
            assert await table.all() == {}
    run(body)


def test_concurrent_claims_exactly_one_wins(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store_a, store_factory.client() as store_b:
            table_a, table_b = LeaseTable(store_a, "parse"), LeaseTable(store_b, "parse")
            assert await table_a.ensure("clicks", 0, (), TRIM_HORIZON) is not None
            for attempt in range(8):
                seen_a = (await table_a.all())["clicks:0"]
                seen_b = (await table_b.all())["clicks:0"]
                assert seen_a == seen_b
                results = await asyncio.gather(table_a.claim(seen_a, "wa"), table_b.claim(seen_b, "wb"),
                                               return_exceptions=True)
                winners = [r for r in results if isinstance(r, Lease)]
                losers = [r for r in results if isinstance(r, LeaseLost)]
                assert len(winners) == 1 and len(losers) == 1, f"attempt {attempt}: {results!r}"
                winner = winners[0]
                assert winner.counter == seen_a.counter + 1 and winner.version == seen_a.version + 1
                assert (await table_a.all())["clicks:0"] == winner
                assert (await table_b.all())["clicks:0"] == winner
                # the loser's next write from what it saw is lost too; the winner's works
                loser_table, loser_seen = (table_b, seen_b) if winner.owner == "wa" else (table_a, seen_a)
                with pytest.raises(LeaseLost):
                    await loser_table.renew(loser_seen)
                await (table_a if winner.owner == "wa" else table_b).release(winner)
    run(body)


def test_concurrent_claims_of_many_leases_never_share_one(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store_a, store_factory.client() as store_b:
            table_a, table_b = LeaseTable(store_a, "parse"), LeaseTable(store_b, "parse")
            for i in range(6):
                await table_a.ensure("clicks", i, (), TRIM_HORIZON)
            leases_a, leases_b = await table_a.all(), await table_b.all()

            async def claim_all(table: LeaseTable, leases: dict[str, Lease], worker: str) -> set[str]:
                won = set()
                for key in sorted(leases):
                    try:
                        await table.claim(leases[key], worker)
                        won.add(key)
                    except LeaseLost:
                        pass
                return won

            won_a, won_b = await asyncio.gather(claim_all(table_a, leases_a, "wa"),
                                                claim_all(table_b, leases_b, "wb"))
            assert not won_a & won_b
            assert won_a | won_b == set(leases_a)
            final = await table_a.all()
            assert {k for k, lease in final.items() if lease.owner == "wa"} == won_a
            assert {k for k, lease in final.items() if lease.owner == "wb"} == won_b
    run(body)


# --- Lease encoding ------------------------------------------------------------------------

def test_lease_key_and_done() -> None:
    assert lease_key("clicks", 7) == "clicks:7"
    assert Lease("clicks", 7).key == "clicks:7"
    assert Lease("clicks", 7, checkpoint=SHARD_END).done
    for cp in (TRIM_HORIZON, LATEST, "12345"):
        assert not Lease("clicks", 7, checkpoint=cp).done


leases_st = st.builds(
    Lease,
    stream=st.from_regex(r"[A-Za-z0-9_.-]{1,30}", fullmatch=True),
    ordinal=st.integers(0, limits.MAP_ENTRIES_MAX),
    owner=st.one_of(st.just(""), st.text(min_size=1, max_size=40)),
    counter=st.integers(0, 2**53),
    heartbeat_ms=st.integers(0, 2**53),
    checkpoint=st.one_of(st.sampled_from([TRIM_HORIZON, LATEST, SHARD_END]),
                         st.integers(0, 2**128).map(str)),
    pending_end=st.one_of(st.just(""), st.integers(0, 2**128).map(str)),
    parents=st.lists(st.integers(0, 1000), max_size=4).map(tuple),
    records=st.integers(0, 2**53),
    rate=st.floats(0, 1e9, allow_nan=False),
    version=st.integers(0, 2**31 - 1),
)


@settings(max_examples=200)
@given(leases_st)
def test_lease_json_round_trip(lease: Lease) -> None:
    raw = lease.to_bytes()
    d = json.loads(raw)
    assert "version" not in d                     # the version is the store's, not the value's
    back = Lease.from_bytes(raw, lease.version)
    assert back == dataclasses.replace(lease, rate=round(lease.rate, 3))
    assert Lease.from_bytes(raw, lease.version + 1).version == lease.version + 1
    assert Lease.from_bytes(back.to_bytes(), back.version) == back


# --- ExpiryClock ---------------------------------------------------------------------------

def test_owned_lease_expires_only_after_failover_with_an_unchanged_counter() -> None:
    clock = ExpiryClock(failover_s=10.0)
    lease = Lease("s", 0, owner="w1", counter=5)
    assert not clock.expired(lease, now=1000.0)          # never observed: not expired
    clock.observe(lease, now=100.0)
    assert not clock.expired(lease, now=100.0)
    assert not clock.expired(lease, now=109.999)
    clock.observe(lease, now=105.0)                      # same counter: the first sighting counts
    assert clock.expired(lease, now=110.0)
    assert clock.expired(lease, now=500.0)


def test_counter_change_resets_expiry() -> None:
    clock = ExpiryClock(failover_s=10.0)
    lease = Lease("s", 0, owner="w1", counter=5)
    clock.observe(lease, now=100.0)
    moved = dataclasses.replace(lease, counter=6)
    clock.observe(moved, now=108.0)
    assert not clock.expired(moved, now=110.0)
    assert not clock.expired(moved, now=117.9)
    assert clock.expired(moved, now=118.0)
    # the old counter is no longer what was last seen: that Lease is not judged expired
    assert not clock.expired(lease, now=200.0)
    # a renewal seen late resets it again
    renewed = dataclasses.replace(moved, counter=7)
    clock.observe(renewed, now=130.0)
    assert not clock.expired(renewed, now=139.0)
    assert clock.expired(renewed, now=140.0)


def test_free_lease_is_always_expired() -> None:
    clock = ExpiryClock(failover_s=10.0)
    free = Lease("s", 0, owner="", counter=3)
    assert clock.expired(free, now=0.0)
    clock.observe(free, now=100.0)
    assert clock.expired(free, now=100.0)
    assert clock.expired(free)


def test_leases_are_tracked_by_key() -> None:
    clock = ExpiryClock(failover_s=1.0)
    a, b = Lease("s", 0, owner="w", counter=1), Lease("s", 1, owner="w", counter=1)
    clock.observe(a, now=0.0)
    clock.observe(b, now=5.0)
    assert clock.expired(a, now=5.5) and not clock.expired(b, now=5.5)
    assert not clock.expired(Lease("t", 0, owner="w", counter=1), now=100.0)


def test_clock_defaults_to_monotonic_time() -> None:
    clock = ExpiryClock(failover_s=3600.0)
    lease = Lease("s", 0, owner="w1", counter=1)
    clock.observe(lease)
    assert not clock.expired(lease)
    assert clock.expired(lease, now=time.monotonic() + 3600.0)


# --- plan_takes: one round -------------------------------------------------------------------

LIVE = [f"w{i}" for i in range(6)]
DEAD = ["dead0", "dead1"]


def active_keys(leases: dict[str, Lease]) -> set[str]:
    def parents_done(lease: Lease) -> bool:
        return all(leases[lease_key(lease.stream, p)].done
                   for p in lease.parents if lease_key(lease.stream, p) in leases)
    return {k for k, lease in leases.items() if not lease.done and parents_done(lease)}


@st.composite
def tables(draw, live: list[str], *, allow_dead: bool = True, allow_done: bool = True,
           allow_parents: bool = True) -> dict[str, Lease]:
    """A random lease table: streams a/b, owners among live, dead and nobody, some done,
    children whose parents are lower ordinals of the same stream (present or not)."""
    n = draw(st.integers(0, 24))
    owners = [""] + live + (DEAD if allow_dead else [])
    leases: dict[str, Lease] = {}
    next_ordinal = {"a": 0, "b": 0}
    for _ in range(n):
        stream = draw(st.sampled_from(["a", "b"]))
        ordinal = next_ordinal[stream] + draw(st.integers(0, 1))      # gaps: parents not in the table
        next_ordinal[stream] = ordinal + 1
        parents: tuple[int, ...] = ()
        if allow_parents and ordinal > 0:
            parents = tuple(draw(st.lists(st.integers(0, ordinal - 1), unique=True, max_size=2)))
        done = allow_done and draw(st.integers(0, 4)) == 0
        lease = Lease(stream, ordinal, owner=draw(st.sampled_from(owners)), counter=draw(st.integers(0, 50)),
                      checkpoint=SHARD_END if done else draw(st.sampled_from([TRIM_HORIZON, "42"])),
                      parents=parents, version=draw(st.integers(0, 50)))
        leases[lease.key] = lease
    return leases


@st.composite
def rounds(draw):
    k = draw(st.integers(1, len(LIVE)))
    live = LIVE[:k]
    leases = draw(tables(live))
    me = draw(st.sampled_from(live))
    # the workers the store lists: maybe without me (plan_takes adds itself)
    workers = [w for w in live if w != me or draw(st.booleans())]
    expired = {k for k in sorted(leases) if draw(st.integers(0, 3)) == 0}
    max_take = draw(st.integers(1, 6))
    return leases, me, workers, expired, max_take


def clock_for(leases: dict[str, Lease], expired: set[str], failover_s: float = 10.0) -> ExpiryClock:
    """Every lease observed; those in `expired` so long ago they are expired now."""
    clock = ExpiryClock(failover_s)
    now = time.monotonic()
    for key, lease in leases.items():
        clock.observe(lease, now=now - FAR_PAST_S if key in expired else now)
    return clock


@settings(max_examples=200)
@given(rounds())
def test_one_round_obeys_the_rules(case) -> None:
    leases, me, workers, expired, max_take = case
    clock = clock_for(leases, expired)
    claims, releases = plan_takes(leases, me, workers, clock, max_take=max_take)

    active = active_keys(leases)
    # a registered worker all of whose active leases expired has stopped: it does not count
    owners = {leases[k].owner for k in active if leases[k].owner}
    stalled = {o for o in owners if all(k in expired for k in active if leases[k].owner == o)} - {me}
    live = (set(workers) - stalled) | {me}
    n, w = len(active), len(live)
    share, floor = -(-n // w), n // w
    counts = Counter(leases[k].owner for k in active)
    mine = counts[me]

    claimable = [k for k in active if leases[k].owner != me and (leases[k].owner not in live or k in expired)]
    claim_keys = [c.key for c in claims]
    assert len(set(claim_keys)) == len(claim_keys), "a lease claimed twice"
    for c in claims:
        assert c == leases[c.key], "a claim is not the lease as read (its version must be the one seen)"
        assert not c.done, f"claimed done lease {c.key}"
        assert c.key in active, f"claimed {c.key} whose parents are not all SHARD_END"
        assert c.owner != me
    # the claims of free, expired or unregistered-owner leases, and the single steal
    taken_live = [c for c in claims if c.owner in live and c.key not in expired]
    if taken_live:
        assert claims == taken_live and len(claims) == 1, f"took live unexpired leases of peers: {claims}"
        victim = claims[0].owner
        assert mine < floor, "stole while holding its floor share"
        assert counts[victim] >= mine + 2
        peers = {o: c for o, c in counts.items() if o and o != me}
        assert counts[victim] == max(peers.values()), "stole from a peer that is not the busiest"
        assert not claimable, "stole although a free, expired or unregistered-owner lease was there"
    else:
        assert len(claims) <= max_take
    assert not claims or mine + len(claims) <= share, "claims past ceil(n/w)"
    # it claims what it can: up to its share, the per-round bound, and what is claimable
    if not taken_live:
        assert len(claims) == min(max(share - mine, 0), max_take, len(claimable))
    # releases: its own active leases above ceil(n/w), never together with claims
    assert all(r.owner == me and r.key in active for r in releases)
    assert len(releases) == max(0, mine - share)
    assert not (claims and releases)


@settings(max_examples=100)
@given(rounds())
def test_max_take_bounds_the_claims_of_a_round(case) -> None:
    leases, me, workers, expired, _ = case
    clock = clock_for(leases, expired)
    for max_take in (1, 2, 3):
        claims, _ = plan_takes(leases, me, workers, clock, max_take=max_take)
        assert len(claims) <= max_take
    claims, _ = plan_takes(leases, me, workers, clock)
    assert len(claims) <= limits.SPS_LEASES_TAKEN_PER_ROUND_MAX


def free_table(n: int, stream: str = "s") -> dict[str, Lease]:
    return {lease_key(stream, i): Lease(stream, i) for i in range(n)}


def owned(leases: dict[str, Lease], owners: dict[int, str], stream: str = "s") -> dict[str, Lease]:
    out = dict(leases)
    for i, owner in owners.items():
        key = lease_key(stream, i)
        out[key] = dataclasses.replace(out[key], owner=owner, counter=out[key].counter + 1)
    return out


def test_max_take_default_bounds_a_large_free_table() -> None:
    claims, releases = plan_takes(free_table(20), "w0", ["w0"], ExpiryClock(10.0))
    assert len(claims) == limits.SPS_LEASES_TAKEN_PER_ROUND_MAX
    assert [c.ordinal for c in claims] == list(range(limits.SPS_LEASES_TAKEN_PER_ROUND_MAX))
    assert releases == []


def test_children_wait_for_every_parent_in_the_table() -> None:
    leases = {
        "s:0": Lease("s", 0, checkpoint=SHARD_END),
        "s:1": Lease("s", 1, checkpoint="77"),                 # open parent, not done
        "s:2": Lease("s", 2, parents=(0,)),                    # parent done: claimable
        "s:3": Lease("s", 3, parents=(0, 1)),                  # one parent not done: not yet
        "s:4": Lease("s", 4, parents=(9,)),                    # parent not in the table: claimable
        "s:5": Lease("s", 5, parents=(3,)),                    # grandchild of an open lease: not yet
    }
    claims, _ = plan_takes(leases, "w0", ["w0"], ExpiryClock(10.0), max_take=10)
    assert sorted(c.ordinal for c in claims) == [1, 2, 4]
    # once s:1 reaches SHARD_END, s:3 becomes claimable (s:5 still waits for s:3)
    leases["s:1"] = dataclasses.replace(leases["s:1"], checkpoint=SHARD_END)
    claims, _ = plan_takes(leases, "w0", ["w0"], ExpiryClock(10.0), max_take=10)
    assert sorted(c.ordinal for c in claims) == [2, 3, 4]


def test_dead_workers_leases_are_taken_at_once() -> None:
    leases = owned(free_table(8), {0: "w0", 1: "w0", 2: "w0", 3: "w0", 4: "gone", 5: "gone", 6: "gone", 7: "gone"})
    clock = ExpiryClock(failover_s=3600.0)
    now = time.monotonic()
    for lease in leases.values():
        clock.observe(lease, now=now)                         # just seen: nothing is expired
    claims, releases = plan_takes(leases, "w1", ["w0", "w1"], clock)
    assert sorted(c.ordinal for c in claims) == [4, 5, 6, 7]
    assert releases == []
    # while the owner is registered they are not taken: holding none of 8 among 3 workers,
    # w1 only steals one lease from the busiest peer (w0 and gone hold 4 each; ties go to the
    # greater name)
    claims, _ = plan_takes(leases, "w1", ["w0", "w1", "gone"], clock)
    assert [c.key for c in claims] == ["s:3"]


def test_expired_lease_of_a_registered_peer_is_taken() -> None:
    leases = owned(free_table(2), {0: "w0", 1: "w0"})
    clock = ExpiryClock(failover_s=10.0)
    clock.observe(leases["s:0"], now=time.monotonic() - FAR_PAST_S)
    clock.observe(leases["s:1"], now=time.monotonic())
    claims, _ = plan_takes(leases, "w1", ["w0", "w1"], clock)
    assert [c.key for c in claims] == ["s:0"]


def test_steal_one_from_the_busiest_peer() -> None:
    # 6 active leases, 3 workers: w0 holds 4, w1 holds 2, w2 none -> w2 steals one of w0's
    leases = owned(free_table(6), {0: "w0", 1: "w0", 2: "w0", 3: "w0", 4: "w1", 5: "w1"})
    claims, releases = plan_takes(leases, "w2", ["w0", "w1", "w2"], ExpiryClock(10.0))
    assert len(claims) == 1 and claims[0].owner == "w0"
    assert releases == []
    # no steal when the busiest has only one more
    leases = owned(free_table(5), {0: "w0", 1: "w0", 2: "w1", 3: "w1", 4: "w2"})
    assert plan_takes(leases, "w2", ["w0", "w1", "w2"], ExpiryClock(10.0)) == ([], [])


def test_above_share_releases_the_extra_ones() -> None:
    leases = owned(free_table(5), {i: "w0" for i in range(5)})
    claims, releases = plan_takes(leases, "w0", ["w0", "w1"], ExpiryClock(10.0))
    assert claims == []
    assert [r.ordinal for r in releases] == [3, 4]           # keeps ceil(5/2) = 3


# --- plan_takes: rounds until nothing changes ------------------------------------------------

class Model:
    """A lease table as the store would hold it after the planned writes, one worker at
    a time. Nobody's lease expires (all live workers renew): each worker's clock never
    sees a live lease stand still, so only free and unregistered-owner leases are taken,
    plus steals."""

    def __init__(self, leases: dict[str, Lease]) -> None:
        self.leases = dict(leases)

    def round(self, order: list[str], workers: list[str], max_take: int) -> int:
        changes = 0
        for me in order:
            claims, releases = plan_takes(self.leases, me, workers, ExpiryClock(10.0), max_take=max_take)
            for c in claims:
                assert self.leases[c.key] == c
                self.leases[c.key] = dataclasses.replace(c, owner=me, counter=c.counter + 1, version=c.version + 1)
            for r in releases:
                self.leases[r.key] = dataclasses.replace(r, owner="", counter=r.counter + 1, version=r.version + 1)
            changes += len(claims) + len(releases)
        return changes

    def settle(self, workers: list[str], orders, max_take: int) -> int:
        n = len(self.leases)
        for rounds_run in range(1, 4 * n + 20):
            order = orders.draw(st.permutations(workers)) if orders is not None else list(workers)
            if self.round(order, workers, max_take) == 0:
                return rounds_run
        raise AssertionError(f"no fixed point after {rounds_run} rounds: {self.counts(workers)}")

    def counts(self, workers: list[str]) -> dict[str, int]:
        active = active_keys(self.leases)
        c = Counter(self.leases[k].owner for k in active)
        return {w: c[w] for w in workers}

    def assert_balanced(self, workers: list[str]) -> None:
        active = active_keys(self.leases)
        n, w = len(active), len(workers)
        counts = self.counts(workers)
        assert all(n // w <= c <= n // w + 1 for c in counts.values()), f"unbalanced: {counts} for n={n}"
        assert sum(counts.values()) == n, "an active lease is free or held by an unregistered worker"
        assert all(self.leases[k].owner in workers for k in active)


@settings(max_examples=200)
@given(st.integers(1, len(LIVE)).flatmap(lambda k: st.tuples(st.just(LIVE[:k]), tables(LIVE[:k]))),
       st.integers(1, 4), st.data())
def test_rounds_reach_even_counts(case, max_take, data) -> None:
    workers, leases = case
    model = Model(leases)
    model.settle(workers, data, max_take)
    model.assert_balanced(workers)
    # done and waiting leases were never claimed by anybody new
    for key, lease in leases.items():
        if key not in active_keys(leases):
            assert model.leases[key] == lease


@settings(max_examples=150)
@given(st.integers(1, len(LIVE) - 1), st.integers(0, 30), st.integers(1, 4), st.data())
def test_a_new_worker_gets_its_share(k, n, max_take, data) -> None:
    workers = LIVE[:k]
    model = Model(free_table(n))
    model.settle(workers, data, max_take)
    model.assert_balanced(workers)
    newcomer = LIVE[k]
    grown = workers + [newcomer]
    model.settle(grown, data, max_take)
    model.assert_balanced(grown)
    assert model.counts(grown)[newcomer] >= n // len(grown)


@settings(max_examples=150)
@given(st.integers(2, len(LIVE)), st.integers(0, 30), st.integers(1, 4), st.data())
def test_a_dead_workers_leases_are_redistributed(k, n, max_take, data) -> None:
    workers = LIVE[:k]
    model = Model(free_table(n))
    model.settle(workers, data, max_take)
    dead = data.draw(st.sampled_from(workers))
    survivors = [w for w in workers if w != dead]
    held = {key for key, lease in model.leases.items() if lease.owner == dead}
    # the first survivor to plan takes the dead worker's leases at once (up to its share and max_take)
    first = data.draw(st.sampled_from(survivors))
    claims, _ = plan_takes(model.leases, first, survivors, ExpiryClock(10.0), max_take=max_take)
    mine = model.counts(survivors)[first]
    share = -(-n // len(survivors))
    assert {c.key for c in claims} <= held
    assert len(claims) == min(len(held), max_take, share - mine)
    model.settle(survivors, data, max_take)
    model.assert_balanced(survivors)
    assert not any(lease.owner == dead for lease in model.leases.values())


class ConcurrentModel(Model):
    """Rounds as the workers really run them: every worker plans from the same snapshot,
    then the planned writes land in a random order, each conditional on the version its
    planner saw (a write on a changed version is lost, as LeaseTable raises LeaseLost)."""

    def round(self, order: list[str], workers: list[str], max_take: int) -> int:
        snapshot = dict(self.leases)
        writes: list[tuple[str, Lease]] = []
        for me in order:
            claims, releases = plan_takes(snapshot, me, workers, ExpiryClock(10.0), max_take=max_take)
            writes += [(me, c) for c in claims] + [("", r) for r in releases]
        if not writes:
            return 0
        for new_owner, seen in self._shuffle(writes):
            if self.leases[seen.key].version == seen.version:
                self.leases[seen.key] = dataclasses.replace(seen, owner=new_owner, counter=seen.counter + 1,
                                                            version=seen.version + 1)
        return len(writes)

    def _shuffle(self, writes):
        return self.orders.draw(st.permutations(writes)) if self.orders is not None else writes

    def settle(self, workers, orders, max_take):
        self.orders = orders
        return super().settle(workers, orders, max_take)


@settings(max_examples=150)
@given(st.integers(1, len(LIVE)).flatmap(lambda k: st.tuples(st.just(LIVE[:k]), tables(LIVE[:k]))),
       st.integers(1, 4), st.data())
def test_concurrent_rounds_reach_even_counts(case, max_take, data) -> None:
    workers, leases = case
    model = ConcurrentModel(leases)
    model.settle(workers, data, max_take)
    model.assert_balanced(workers)


@settings(max_examples=100)
@given(st.integers(1, len(LIVE) - 1), st.integers(0, 30), st.integers(1, 4), st.data())
def test_concurrent_newcomer_gets_its_share(k, n, max_take, data) -> None:
    workers = LIVE[:k]
    model = ConcurrentModel(free_table(n))
    model.settle(workers, data, max_take)
    grown = workers + [LIVE[k]]
    model.settle(grown, data, max_take)
    model.assert_balanced(grown)


def test_expired_leases_of_a_silent_registered_peer_are_taken() -> None:
    leases = owned(free_table(4), {0: "w0", 1: "w0", 2: "w1", 3: "w1"})
    clock = ExpiryClock(failover_s=10.0)
    now = time.monotonic()
    for lease in leases.values():
        clock.observe(lease, now=now - FAR_PAST_S if lease.owner == "w1" else now)
    assert clock.expired(leases["s:2"]) and clock.expired(leases["s:3"])
    assert not clock.expired(leases["s:0"])
    # w0 plans round after round (its own writes renew its leases); w1 never writes again
    model = dict(leases)
    for _ in range(10):
        claims, releases = plan_takes(model, "w0", ["w0", "w1"], clock)
        for c in claims:
            model[c.key] = dataclasses.replace(c, owner="w0", counter=c.counter + 1)
            clock.observe(model[c.key])
        for r in releases:
            model[r.key] = dataclasses.replace(r, owner="", counter=r.counter + 1)
            clock.observe(model[r.key])
    silent = [k for k, lease in model.items() if lease.owner == "w1"]
    assert silent == [], f"expired leases still held by the silent worker: {silent}"
