"""Unit tests of the pure repartition operations of sms.partition_map.PartitionMap.

`check_split`, `split`, `check_merge`, `merge`, `next_scale_step` and `entries_at`: the
named errors, the shape of the entries a change adds and closes, that nothing else is
rewritten, that the open entries (and `entries_at(ts)` for any ts after creation) tile
the hash space [0, 2^128) exactly, the limits, the JSON round trip, and that
`next_scale_step` reaches N even ranges from any reachable map within a derived bound.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import limits
from sms.errors import (InvalidArgument, InvalidSplitPoint, PartitionNotFound, PartitionNotOpen,
                        PartitionsNotAdjacent, SmsError, TooManyPartitions)
from sms.hashing import HASH_SPACE
from sms.partition_map import PartitionEntry, PartitionMap
from sms.types import PartitionState

NOW_MS = 1_700_000_000_000
BIG_SN = (1 << 127) + 12345          # SNs are 128-bit: must survive JSON unharmed


# --- helpers ---------------------------------------------------------------------------------

def by_hash(entries) -> list[PartitionEntry]:
    return sorted(entries, key=lambda e: e.hash_lo)


def ranges(entries) -> list[tuple[int, int]]:
    return [(e.hash_lo, e.hash_hi) for e in by_hash(entries)]


def assert_tiles(entries, what: str = "entries") -> None:
    """`entries` cover [0, 2^128) exactly: no gap, no overlap, no empty range."""
    entries = by_hash(entries)
    assert entries, f"{what}: nothing covers the hash space"
    assert entries[0].hash_lo == 0, f"{what}: gap below {entries[0].hash_lo}"
    assert entries[-1].hash_hi == HASH_SPACE, f"{what}: gap above {entries[-1].hash_hi}"
    for e in entries:
        assert e.hash_lo < e.hash_hi, f"{what}: empty range p{e.ordinal}"
    for prev, nxt in zip(entries, entries[1:]):
        assert prev.hash_hi == nxt.hash_lo, (
            f"{what}: p{prev.ordinal} ends at {prev.hash_hi}, p{nxt.ordinal} starts at {nxt.hash_lo}")


def even_bounds(n: int) -> list[tuple[int, int]]:
    b = [i * HASH_SPACE // n for i in range(n)] + [HASH_SPACE]
    return list(zip(b, b[1:]))


def critical_times(pmap: PartitionMap) -> list[int]:
    """Every time at which entries_at can change, and its neighbours."""
    ts = set()
    for e in pmap.entries:
        for t in (e.valid_from_ms, e.valid_to_ms):
            if t is not None:
                ts.update((t - 1, t, t + 1))
    return sorted(ts)


def assert_consistent(pmap: PartitionMap, created_ms: int = NOW_MS) -> None:
    """The structural invariants of any map reachable from `even` by split/merge."""
    ordinals = [e.ordinal for e in pmap.entries]
    assert len(set(ordinals)) == len(ordinals), "duplicate ordinals"
    assert all(0 <= o < pmap.next_ordinal for o in ordinals)
    assert len(pmap.open_entries()) <= limits.STREAM_PARTITIONS_MAX
    assert len(pmap.entries) <= limits.MAP_ENTRIES_MAX
    assert_tiles(pmap.open_entries(), "open entries")
    by_ord = {e.ordinal: e for e in pmap.entries}
    for e in pmap.entries:
        assert e.hash_lo < e.hash_hi
        if e.state is PartitionState.OPEN:
            assert e.valid_to_ms is None and e.children == () and e.ending_sn is None
        else:
            assert e.state is PartitionState.CLOSED
            assert e.valid_to_ms is not None and e.valid_from_ms <= e.valid_to_ms
            assert e.ending_sn is not None
            assert len(e.children) in (1, 2)
            kids = [by_ord[c] for c in e.children]
            for k in kids:
                assert e.ordinal in k.parents                      # link back
                assert k.valid_from_ms == e.valid_to_ms             # no gap / overlap in time
            if len(kids) == 2:                                      # a split: the children tile the parent
                assert ranges(kids) == [(e.hash_lo, kids[0].hash_hi), (kids[0].hash_hi, e.hash_hi)]
                assert all(k.parents == (e.ordinal,) for k in kids)
            else:                                                   # a merge: the child holds the parent
                assert kids[0].hash_lo <= e.hash_lo and e.hash_hi <= kids[0].hash_hi
        assert len(e.parents) in (0, 1, 2)
        for p in e.parents:
            assert e.ordinal in by_ord[p].children                 # link forward
            assert by_ord[p].valid_to_ms == e.valid_from_ms
        if len(e.parents) == 2:                                     # merge child: parents tile it, low first
            ps = [by_ord[p] for p in e.parents]
            assert ps[0].hash_lo == e.hash_lo and ps[0].hash_hi == ps[1].hash_lo and ps[1].hash_hi == e.hash_hi
        if not e.parents:
            assert e.valid_from_ms == created_ms                    # only the creation entries are roots
    # entries_at tiles the hash space at every time after creation, and is empty before
    for t in critical_times(pmap):
        at = pmap.entries_at(t)
        if t < created_ms:
            assert at == []
        else:
            assert_tiles(at, f"entries_at({t})")
            for e in at:
                assert e.valid_from_ms <= t and (e.valid_to_ms is None or t < e.valid_to_ms)
    assert pmap.entries_at(10 ** 15) == pmap.open_entries()         # far future: the open ones
    # the stored form round-trips
    back = PartitionMap.from_bytes(pmap.to_bytes(), version=pmap.version)
    assert back == pmap


def assert_split_transition(before: PartitionMap, after: PartitionMap, ordinal: int, at: int,
                            boundary_ms: int, ending_sn: int) -> None:
    parent = before.entry(ordinal)
    a, b = before.next_ordinal, before.next_ordinal + 1
    assert after.next_ordinal == before.next_ordinal + 2
    assert len(after.entries) == len(before.entries) + 2
    # unaffected entries are the very same objects at the same positions
    for old, new in zip(before.entries, after.entries):
        if old.ordinal == ordinal:
            assert new == replace(old, state=PartitionState.CLOSED, valid_to_ms=boundary_ms,
                                  children=(a, b), ending_sn=ending_sn)
        else:
            assert new is old
    assert after.entries[-2:] == (
        PartitionEntry(a, parent.hash_lo, at, boundary_ms, parents=(ordinal,)),
        PartitionEntry(b, at, parent.hash_hi, boundary_ms, parents=(ordinal,)))


def assert_merge_transition(before: PartitionMap, after: PartitionMap, lower: int, upper: int,
                            boundary_ms: int, ending_sns: dict[int, int]) -> None:
    lo_e, hi_e = before.entry(lower), before.entry(upper)
    assert lo_e.hash_hi == hi_e.hash_lo
    c = before.next_ordinal
    assert after.next_ordinal == before.next_ordinal + 1
    assert len(after.entries) == len(before.entries) + 1
    for old, new in zip(before.entries, after.entries):
        if old.ordinal in (lower, upper):
            assert new == replace(old, state=PartitionState.CLOSED, valid_to_ms=boundary_ms,
                                  children=(c,), ending_sn=ending_sns[old.ordinal])
        else:
            assert new is old
    assert after.entries[-1] == PartitionEntry(c, lo_e.hash_lo, hi_e.hash_hi, boundary_ms,
                                               parents=(lower, upper))


def apply_step(pmap: PartitionMap, step: tuple, boundary_ms: int, sn: int) -> PartitionMap:
    if step[0] == "split":
        _, ordinal, at = step
        assert pmap.check_split(ordinal, at) == at
        return pmap.split(ordinal, at, boundary_ms, sn)
    _, a, b = step
    assert step[0] == "merge"
    pmap.check_merge(a, b)
    return pmap.merge(a, b, boundary_ms, {a: sn, b: sn + 1})


def scale(pmap: PartitionMap, target: int, start_ms: int, max_steps: int,
          check_pure: bool = True) -> tuple[PartitionMap, list[tuple]]:
    """Apply next_scale_step until it answers None; fail past `max_steps`."""
    steps = []
    t = start_ms
    while (step := pmap.next_scale_step(target)) is not None:
        assert len(steps) < max_steps, f"scale to {target} did not finish within {max_steps} steps"
        if check_pure:
            assert pmap.next_scale_step(target) == step            # pure: same map, same answer
        t += 1
        pmap = apply_step(pmap, step, t, 1000 + 2 * len(steps))
        steps.append(step)
    return pmap, steps


def scale_plan_size(pmap: PartitionMap, target: int) -> tuple[int, int]:
    """(splits, merges) that a split-then-merge plan toward `target` even ranges needs:
    one split per interior target boundary that is not already an edge of an open
    entry (it lies strictly inside exactly one, as the open entries tile), then one
    merge per open entry beyond `target`. Hence steps = n + 2s - target, and since
    s <= target - 1, steps <= n + target - 2 (n = open entries now)."""
    edges = {e.hash_lo for e in pmap.open_entries()}
    interior = [lo for lo, _ in even_bounds(target)][1:]
    splits = sum(1 for b in interior if b not in edges)
    merges = len(pmap.open_entries()) + splits - target
    return splits, merges


def churned_map(cycles: int) -> PartitionMap:
    """The map after `cycles` rounds of (split the single partition, merge the halves),
    built directly (3 * cycles + 1 entries): cheap even at MAP_ENTRIES_MAX."""
    entries = []
    for i in range(cycles):
        w, left, right, nxt = 3 * i, 3 * i + 1, 3 * i + 2, 3 * i + 3
        t_split, t_merge = NOW_MS + 2 * i + 1, NOW_MS + 2 * i + 2
        entries.append(PartitionEntry(w, 0, HASH_SPACE, NOW_MS + 2 * i, t_split,
                                      parents=() if i == 0 else (w - 2, w - 1), children=(left, right),
                                      state=PartitionState.CLOSED, ending_sn=10 * i))
        entries.append(PartitionEntry(left, 0, HASH_SPACE // 2, t_split, t_merge, parents=(w,),
                                      children=(nxt,), state=PartitionState.CLOSED, ending_sn=10 * i + 1))
        entries.append(PartitionEntry(right, HASH_SPACE // 2, HASH_SPACE, t_split, t_merge, parents=(w,),
                                      children=(nxt,), state=PartitionState.CLOSED, ending_sn=10 * i + 2))
    last = 3 * cycles
    entries.append(PartitionEntry(last, 0, HASH_SPACE, NOW_MS + 2 * cycles,
                                  parents=() if cycles == 0 else (last - 2, last - 1)))
    return PartitionMap(entries=tuple(entries), next_ordinal=last + 1)


# --- hypothesis: maps reachable by random splits and merges ------------------------------------

@st.composite
def histories(draw, max_initial: int = 12, max_ops: int = 25, monotonic: bool = False):
    """(initial map, [(op, map after op, boundary_ms)]) for a random sequence of valid
    splits and merges. Boundaries never precede the affected parents' valid_from; with
    `monotonic` they also never decrease across the whole sequence."""
    pmap = PartitionMap.even(draw(st.integers(1, max_initial)), NOW_MS)
    initial = pmap
    clock = NOW_MS
    history = []
    for _ in range(draw(st.integers(0, max_ops))):
        opened = by_hash(pmap.open_entries())
        splittable = [e for e in opened if e.hash_hi - e.hash_lo >= 2]
        kinds = (["split"] if splittable else []) + (["merge"] if len(opened) >= 2 else [])
        if not kinds:
            break
        kind = draw(st.sampled_from(kinds))
        if kind == "split":
            e = draw(st.sampled_from(splittable))
            at = draw(st.one_of(st.none(), st.just(e.hash_lo + 1), st.just(e.hash_hi - 1),
                                st.integers(e.hash_lo + 1, e.hash_hi - 1)))
            parents = [e]
        else:
            i = draw(st.integers(0, len(opened) - 2))
            lower, upper = opened[i], opened[i + 1]
            parents = [lower, upper]
        floor = max(p.valid_from_ms for p in parents)
        if monotonic:
            clock = max(clock, floor) + draw(st.integers(0, 2))
            boundary = clock
        else:
            boundary = floor + draw(st.integers(0, 5))
        if kind == "split":
            sn = draw(st.integers(0, HASH_SPACE - 1))
            op = ("split", e.ordinal, at, boundary, sn)
            pmap = pmap.split(e.ordinal, at, boundary, sn)
        else:
            a, b = (lower.ordinal, upper.ordinal) if draw(st.booleans()) else (upper.ordinal, lower.ordinal)
            sns = {lower.ordinal: draw(st.integers(0, HASH_SPACE - 1)),
                   upper.ordinal: draw(st.integers(0, HASH_SPACE - 1))}
            op = ("merge", a, b, boundary, sns)
            pmap = pmap.merge(a, b, boundary, sns)
        history.append((op, pmap, boundary))
    return initial, history


def replay(pmap: PartitionMap, op: tuple, boundary: int) -> PartitionMap:
    """Apply one op recorded by `histories` to `pmap`."""
    if op[0] == "split":
        _, ordinal, at, _, sn = op
        return pmap.split(ordinal, at, boundary, sn)
    _, a, b, _, sns = op
    return pmap.merge(a, b, boundary, sns)


def final_map(hist) -> PartitionMap:
    initial, history = hist
    return history[-1][1] if history else initial


# --- split ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 16])
def test_split_defaults_to_the_middle(n):
    pmap = PartitionMap.even(n, NOW_MS)
    for e in pmap.entries:
        mid = (e.hash_lo + e.hash_hi) // 2
        assert pmap.check_split(e.ordinal) == mid
        assert pmap.check_split(e.ordinal, None) == mid
        after = pmap.split(e.ordinal, None, NOW_MS + 10, BIG_SN)
        assert_split_transition(pmap, after, e.ordinal, mid, NOW_MS + 10, BIG_SN)
        assert_consistent(after)


def test_split_of_the_whole_space_halves_it():
    pmap = PartitionMap.even(1, NOW_MS)
    after = pmap.split(0, None, NOW_MS + 5, 77)
    assert ranges(after.open_entries()) == [(0, 1 << 127), (1 << 127, HASH_SPACE)]
    assert [e.ordinal for e in after.open_entries()] == [1, 2]
    parent = after.entry(0)
    assert parent.state is PartitionState.CLOSED
    assert parent.valid_from_ms == NOW_MS and parent.valid_to_ms == NOW_MS + 5
    assert parent.children == (1, 2) and parent.ending_sn == 77
    for c in (1, 2):
        child = after.entry(c)
        assert child.parents == (0,) and child.children == ()
        assert child.valid_from_ms == NOW_MS + 5 and child.valid_to_ms is None
        assert child.state is PartitionState.OPEN and child.ending_sn is None


@pytest.mark.parametrize("offset", ["lo+1", "quarter", "hi-1"])
def test_split_at_a_given_hash(offset):
    pmap = PartitionMap.even(3, NOW_MS)
    e = pmap.entry(1)
    at = {"lo+1": e.hash_lo + 1, "quarter": e.hash_lo + (e.hash_hi - e.hash_lo) // 4,
          "hi-1": e.hash_hi - 1}[offset]
    assert pmap.check_split(1, at) == at
    after = pmap.split(1, at, NOW_MS + 1, 5)
    assert_split_transition(pmap, after, 1, at, NOW_MS + 1, 5)
    assert ranges([after.entry(3), after.entry(4)]) == [(e.hash_lo, at), (at, e.hash_hi)]
    assert_consistent(after)


def test_split_at_the_top_of_the_hash_space():
    pmap = PartitionMap.even(2, NOW_MS)
    after = pmap.split(1, HASH_SPACE - 1, NOW_MS + 1, 1)
    assert ranges([after.entry(2), after.entry(3)]) == [(1 << 127, HASH_SPACE - 1), (HASH_SPACE - 1, HASH_SPACE)]
    assert after.open_for_hash(limits.HASH_KEY_MAX).ordinal == 3
    assert_consistent(after)


@pytest.mark.parametrize("where", ["at lo", "at hi", "beyond hi", "below lo", "negative",
                                   "HASH_SPACE", "far above", "in the neighbour"])
def test_invalid_split_points(where):
    pmap = PartitionMap.even(4, NOW_MS)
    e = pmap.entry(1)
    at = {"at lo": e.hash_lo, "at hi": e.hash_hi, "beyond hi": e.hash_hi + 1, "below lo": e.hash_lo - 1,
          "negative": -1, "HASH_SPACE": HASH_SPACE, "far above": 10 * HASH_SPACE,
          "in the neighbour": pmap.entry(2).hash_lo + 5}[where]
    before = pmap.to_bytes()
    with pytest.raises(InvalidSplitPoint) as err:
        pmap.check_split(1, at)
    assert isinstance(err.value, InvalidArgument)
    assert "p0001" in str(err.value)
    with pytest.raises(InvalidSplitPoint):
        pmap.split(1, at, NOW_MS + 1, 0)
    assert pmap.to_bytes() == before                                 # nothing changed


@pytest.mark.parametrize("at", [0, -1, HASH_SPACE, HASH_SPACE + 1])
def test_invalid_split_points_of_the_whole_space(at):
    pmap = PartitionMap.even(1, NOW_MS)
    with pytest.raises(InvalidSplitPoint):
        pmap.split(0, at, NOW_MS + 1, 0)


def test_a_width_one_partition_cannot_split_even_by_default():
    pmap = PartitionMap.even(1, NOW_MS).split(0, 1, NOW_MS + 1, 0)   # p1 = [0, 1)
    assert (pmap.entry(1).hash_lo, pmap.entry(1).hash_hi) == (0, 1)
    with pytest.raises(InvalidSplitPoint):
        pmap.check_split(1)
    with pytest.raises(InvalidSplitPoint):
        pmap.split(1, None, NOW_MS + 2, 0)
    # width 2 still splits, in the middle
    pmap = pmap.split(2, 3, NOW_MS + 2, 0)                          # p3 = [1, 3)
    assert pmap.check_split(3) == 2
    assert_consistent(pmap.split(3, None, NOW_MS + 3, 0))


def test_split_of_a_closed_partition_names_its_children():
    pmap = PartitionMap.even(2, NOW_MS).split(0, None, NOW_MS + 1, 9)
    for call in (lambda: pmap.check_split(0), lambda: pmap.check_split(0, 5),
                 lambda: pmap.split(0, None, NOW_MS + 2, 10)):
        with pytest.raises(PartitionNotOpen) as err:
            call()
        msg = str(err.value)
        assert "p0000" in msg and "p0002" in msg and "p0003" in msg
    merged = pmap.merge(2, 3, NOW_MS + 2, {2: 1, 3: 2})
    with pytest.raises(PartitionNotOpen) as err:
        merged.split(3, None, NOW_MS + 3, 0)
    assert "p0003" in str(err.value) and "p0004" in str(err.value)


@pytest.mark.parametrize("ordinal", [4, 5, 100, -1])
def test_split_of_an_unknown_partition(ordinal):
    pmap = PartitionMap.even(4, NOW_MS)
    with pytest.raises(PartitionNotFound):
        pmap.check_split(ordinal)
    with pytest.raises(PartitionNotFound):
        pmap.split(ordinal, None, NOW_MS + 1, 0)


def test_split_never_rewrites_other_entries_and_leaves_the_input_alone():
    pmap = PartitionMap.even(8, NOW_MS).with_version(42)
    raw = pmap.to_bytes()
    entries = pmap.entries
    after = pmap.split(5, None, NOW_MS + 1, 1)
    assert pmap.entries is entries and pmap.to_bytes() == raw and pmap.next_ordinal == 8
    assert after.version == 42
    for i, e in enumerate(entries):
        if e.ordinal != 5:
            assert after.entries[i] is e
    assert after.entries[5] is not entries[5]


def test_children_take_ordinals_from_next_ordinal_not_from_the_entries():
    pmap = replace(PartitionMap.even(2, NOW_MS), next_ordinal=50)
    after = pmap.split(1, None, NOW_MS + 1, 0)
    assert [e.ordinal for e in after.entries[-2:]] == [50, 51]
    assert after.entry(1).children == (50, 51)
    assert after.next_ordinal == 52
    merged = after.merge(50, 51, NOW_MS + 2, {50: 0, 51: 0})
    assert merged.entries[-1].ordinal == 52 and merged.next_ordinal == 53


def test_a_split_boundary_equal_to_the_parents_start_leaves_an_empty_validity():
    pmap = PartitionMap.even(1, NOW_MS).split(0, None, NOW_MS, 0)
    parent = pmap.entry(0)
    assert parent.valid_from_ms == parent.valid_to_ms == NOW_MS
    assert parent not in pmap.entries_at(NOW_MS)
    assert_consistent(pmap)


# --- merge ------------------------------------------------------------------------------------

@pytest.mark.parametrize("swap", [False, True])
def test_merge_of_two_adjacent_partitions(swap):
    pmap = PartitionMap.even(4, NOW_MS)
    a, b = (2, 1) if swap else (1, 2)
    sns = {1: BIG_SN, 2: BIG_SN + 1}
    assert [e.ordinal for e in pmap.check_merge(a, b)] == [1, 2]          # lower range first
    after = pmap.merge(a, b, NOW_MS + 7, sns)
    assert_merge_transition(pmap, after, 1, 2, NOW_MS + 7, sns)
    child = after.entry(4)
    assert (child.hash_lo, child.hash_hi) == (pmap.entry(1).hash_lo, pmap.entry(2).hash_hi)
    assert child.parents == (1, 2)
    assert after.entry(1).ending_sn == BIG_SN and after.entry(2).ending_sn == BIG_SN + 1
    assert after.entry(1).children == after.entry(2).children == (4,)
    assert after.entry(1).valid_to_ms == after.entry(2).valid_to_ms == child.valid_from_ms == NOW_MS + 7
    assert_consistent(after)


def test_merge_of_children_of_different_parents():
    pmap = PartitionMap.even(2, NOW_MS).split(0, None, NOW_MS + 1, 0).split(1, None, NOW_MS + 2, 0)
    # p2 [0, 1/4) p3 [1/4, 1/2) | p4 [1/2, 3/4) p5 [3/4, 1)
    after = pmap.merge(4, 3, NOW_MS + 3, {3: 11, 4: 12})
    assert_merge_transition(pmap, after, 3, 4, NOW_MS + 3, {3: 11, 4: 12})
    assert ranges(after.open_entries()) == [(0, 1 << 126), (1 << 126, 3 << 126), (3 << 126, HASH_SPACE)]
    assert_consistent(after)


def test_merge_back_to_the_whole_space():
    pmap = PartitionMap.even(2, NOW_MS).merge(0, 1, NOW_MS + 1, {0: 1, 1: 2})
    assert ranges(pmap.open_entries()) == [(0, HASH_SPACE)]
    assert [e.ordinal for e in pmap.entries_at(NOW_MS)] == [0, 1]
    assert [e.ordinal for e in pmap.entries_at(NOW_MS + 1)] == [2]
    assert_consistent(pmap)


@pytest.mark.parametrize("a, b", [(0, 2), (2, 0), (0, 3), (1, 3), (3, 0)])
def test_merge_of_non_adjacent_partitions(a, b):
    pmap = PartitionMap.even(4, NOW_MS)
    raw = pmap.to_bytes()
    with pytest.raises(PartitionsNotAdjacent) as err:
        pmap.check_merge(a, b)
    assert isinstance(err.value, InvalidArgument)
    assert f"p{a:04d}" in str(err.value) and f"p{b:04d}" in str(err.value)
    with pytest.raises(PartitionsNotAdjacent):
        pmap.merge(a, b, NOW_MS + 1, {a: 0, b: 0})
    assert pmap.to_bytes() == raw


@pytest.mark.parametrize("n", [1, 3])
def test_merge_of_a_partition_with_itself(n):
    pmap = PartitionMap.even(n, NOW_MS)
    for o in range(n):
        with pytest.raises(PartitionsNotAdjacent):
            pmap.check_merge(o, o)
        with pytest.raises(PartitionsNotAdjacent):
            pmap.merge(o, o, NOW_MS + 1, {o: 0})


def test_merge_of_a_closed_partition_names_its_children():
    pmap = PartitionMap.even(2, NOW_MS).split(1, None, NOW_MS + 1, 0)   # p1 -> p2, p3
    for a, b in [(0, 1), (1, 0), (1, 2), (3, 1)]:
        with pytest.raises(PartitionNotOpen) as err:
            pmap.check_merge(a, b)
        assert "p0001" in str(err.value) and "p0002" in str(err.value) and "p0003" in str(err.value)
        with pytest.raises(PartitionNotOpen):
            pmap.merge(a, b, NOW_MS + 2, {a: 0, b: 0})
    merged = pmap.merge(2, 3, NOW_MS + 2, {2: 0, 3: 0})             # p2, p3 -> p4
    with pytest.raises(PartitionNotOpen) as err:
        merged.merge(0, 2, NOW_MS + 3, {0: 0, 2: 0})
    assert "p0004" in str(err.value)


@pytest.mark.parametrize("a, b", [(0, 9), (9, 0), (7, 8), (-1, 0)])
def test_merge_of_an_unknown_partition(a, b):
    pmap = PartitionMap.even(3, NOW_MS)
    with pytest.raises(PartitionNotFound):
        pmap.check_merge(a, b)
    with pytest.raises(PartitionNotFound):
        pmap.merge(a, b, NOW_MS + 1, {a: 0, b: 0})


def test_merge_never_rewrites_other_entries_and_leaves_the_input_alone():
    pmap = PartitionMap.even(6, NOW_MS).with_version(3)
    raw = pmap.to_bytes()
    entries = pmap.entries
    after = pmap.merge(3, 4, NOW_MS + 1, {3: 0, 4: 0})
    assert pmap.entries is entries and pmap.to_bytes() == raw and pmap.next_ordinal == 6
    assert after.version == 3
    for i, e in enumerate(entries):
        assert (after.entries[i] is e) == (e.ordinal not in (3, 4))


# --- entries_at -------------------------------------------------------------------------------

def test_entries_at_follows_each_boundary_exactly():
    m0 = PartitionMap.even(2, NOW_MS)                                  # p0 p1 from NOW
    m1 = m0.split(0, None, NOW_MS + 10, 1)                             # p2 p3 | p1 from +10
    m2 = m1.merge(3, 1, NOW_MS + 20, {3: 2, 1: 3})                     # p2 | p4 from +20
    m3 = m2.split(4, 3 << 126, NOW_MS + 30, 4)                         # p2 | p5 p6 from +30
    expected = [(NOW_MS - 1, []), (NOW_MS, [0, 1]), (NOW_MS + 9, [0, 1]), (NOW_MS + 10, [1, 2, 3]),
                (NOW_MS + 19, [1, 2, 3]), (NOW_MS + 20, [2, 4]), (NOW_MS + 29, [2, 4]),
                (NOW_MS + 30, [2, 5, 6]), (NOW_MS + 10 ** 9, [2, 5, 6])]
    for ts, ords in expected:
        assert sorted(e.ordinal for e in m3.entries_at(ts)) == ords, ts
    assert ranges(m3.entries_at(NOW_MS + 20)) == [(0, 1 << 126), (1 << 126, HASH_SPACE)]
    # older maps answer the same for the times they already knew
    for m in (m1, m2):
        for ts in (NOW_MS, NOW_MS + 9):
            assert sorted(e.ordinal for e in m.entries_at(ts)) == [0, 1]
    assert_consistent(m3)


def test_entries_at_returns_the_stored_entries_in_map_order():
    pmap = PartitionMap.even(4, NOW_MS).split(2, None, NOW_MS + 5, 0)
    at = pmap.entries_at(NOW_MS + 5)
    assert [e.ordinal for e in at] == [0, 1, 3, 4, 5]
    for e in at:
        assert e is pmap.entry(e.ordinal)


@settings(max_examples=200)
@given(histories(monotonic=True))
def test_entries_at_matches_a_replay_of_the_history(hist):
    """With non-decreasing boundaries the entries governing ts are the open entries of
    the last map whose change took effect at or before ts (the initial map at NOW)."""
    initial, history = hist
    final = final_map(hist)
    snapshots = [(NOW_MS, initial)] + [(boundary, m) for _, m, boundary in history]
    times = sorted({t for t, _ in snapshots} | {t + 1 for t, _ in snapshots} | {t - 1 for t, _ in snapshots})
    for ts in times:
        governing = [m for t, m in snapshots if t <= ts]
        expected = sorted(e.ordinal for e in governing[-1].open_entries()) if governing else []
        assert sorted(e.ordinal for e in final.entries_at(ts)) == expected, ts


# --- invariants under random repartitions -------------------------------------------------------

@settings(max_examples=200)
@given(histories())
def test_random_repartitions_keep_every_invariant(hist):
    initial, history = hist
    prev = initial
    assert_consistent(prev)
    model = ranges(initial.entries)                                    # the open ranges, independently
    for op, after, boundary in history:
        if op[0] == "split":
            _, ordinal, at, _, sn = op
            e = prev.entry(ordinal)
            point = (e.hash_lo + e.hash_hi) // 2 if at is None else at
            assert_split_transition(prev, after, ordinal, point, boundary, sn)
            i = model.index((e.hash_lo, e.hash_hi))
            model[i:i + 1] = [(e.hash_lo, point), (point, e.hash_hi)]
        else:
            _, a, b, _, sns = op
            lower, upper = sorted((prev.entry(a), prev.entry(b)), key=lambda e: e.hash_lo)
            assert_merge_transition(prev, after, lower.ordinal, upper.ordinal, boundary, sns)
            i = model.index((lower.hash_lo, lower.hash_hi))
            assert model[i + 1] == (upper.hash_lo, upper.hash_hi)
            model[i:i + 2] = [(lower.hash_lo, upper.hash_hi)]
        assert ranges(after.open_entries()) == model
        assert_consistent(after)
        prev = after


@settings(max_examples=100)
@given(histories(), st.data())
def test_invalid_requests_on_a_reachable_map(hist, data):
    pmap = final_map(hist)
    raw = pmap.to_bytes()
    opened = by_hash(pmap.open_entries())
    closed = [e for e in pmap.entries if e.state is PartitionState.CLOSED]
    e = data.draw(st.sampled_from(opened))
    bad = data.draw(st.sampled_from([e.hash_lo, e.hash_hi, e.hash_hi + 1, e.hash_lo - 1, -1, HASH_SPACE]))
    with pytest.raises(InvalidSplitPoint):
        pmap.split(e.ordinal, bad, NOW_MS + 10 ** 6, 0)
    if e.hash_hi - e.hash_lo < 2:
        with pytest.raises(InvalidSplitPoint):
            pmap.split(e.ordinal, None, NOW_MS + 10 ** 6, 0)
    with pytest.raises(PartitionNotFound):
        pmap.split(pmap.next_ordinal, None, NOW_MS + 10 ** 6, 0)
    with pytest.raises(PartitionsNotAdjacent):
        pmap.merge(e.ordinal, e.ordinal, NOW_MS + 10 ** 6, {e.ordinal: 0})
    if len(opened) >= 3:
        i = data.draw(st.integers(0, len(opened) - 3))
        j = data.draw(st.integers(i + 2, len(opened) - 1))
        with pytest.raises(PartitionsNotAdjacent):
            pmap.check_merge(opened[j].ordinal, opened[i].ordinal)
    if closed:
        c = data.draw(st.sampled_from(closed))
        with pytest.raises(PartitionNotOpen) as err:
            pmap.split(c.ordinal, None, NOW_MS + 10 ** 6, 0)
        assert all(f"p{k:04d}" in str(err.value) for k in c.children)
        with pytest.raises(PartitionNotOpen):
            pmap.check_merge(c.ordinal, e.ordinal)
    assert pmap.to_bytes() == raw


# --- stored form --------------------------------------------------------------------------------

def test_round_trip_after_splits_and_merges():
    pmap = (PartitionMap.even(3, NOW_MS).split(0, 1, NOW_MS + 1, BIG_SN)
            .split(2, HASH_SPACE - 1, NOW_MS + 2, 0).merge(4, 1, NOW_MS + 3, {4: HASH_SPACE - 1, 1: 7})
            .with_version(9))
    raw = pmap.to_bytes()
    back = PartitionMap.from_bytes(raw, version=9)
    assert back == pmap
    assert back.to_bytes() == raw
    assert PartitionMap.from_bytes(raw).version == 0
    doc = json.loads(raw)
    assert doc["next_ordinal"] == pmap.next_ordinal == 8
    stored = {d["ordinal"]: d for d in doc["entries"]}
    assert stored[0]["ending_sn"] == str(BIG_SN)                      # 128-bit values as strings
    assert stored[6]["hash_hi"] == str(HASH_SPACE)
    assert stored[7]["parents"] == [4, 1]                          # p4 [1, 2^128/3) lies below p1
    assert back.entry(7).parents == (4, 1)
    assert_consistent(back)


# --- limits -------------------------------------------------------------------------------------

def test_split_past_the_open_partition_limit():
    full = PartitionMap.even(limits.STREAM_PARTITIONS_MAX, NOW_MS)
    with pytest.raises(TooManyPartitions) as err:
        full.split(0, None, NOW_MS + 1, 0)
    assert str(limits.STREAM_PARTITIONS_MAX) in str(err.value)
    # a merge is fine, and then exactly one split fits again
    merged = full.merge(0, 1, NOW_MS + 1, {0: 0, 1: 0})
    assert len(merged.open_entries()) == limits.STREAM_PARTITIONS_MAX - 1
    again = merged.split(limits.STREAM_PARTITIONS_MAX, None, NOW_MS + 2, 0)
    assert len(again.open_entries()) == limits.STREAM_PARTITIONS_MAX
    with pytest.raises(TooManyPartitions):
        again.split(5, None, NOW_MS + 3, 0)


def test_split_up_to_the_open_partition_limit():
    pmap = PartitionMap.even(limits.STREAM_PARTITIONS_MAX - 1, NOW_MS)
    pmap = pmap.split(0, None, NOW_MS + 1, 0)
    assert len(pmap.open_entries()) == limits.STREAM_PARTITIONS_MAX
    assert_tiles(pmap.open_entries())
    with pytest.raises(TooManyPartitions):
        pmap.split(1, None, NOW_MS + 2, 0)
    with pytest.raises(TooManyPartitions):
        pmap.split(pmap.next_ordinal - 1, None, NOW_MS + 2, 0)


def test_churned_map_is_what_split_and_merge_build():
    pmap = PartitionMap.even(1, NOW_MS)
    for i in range(5):
        pmap = pmap.split(3 * i, None, NOW_MS + 2 * i + 1, 10 * i)
        pmap = pmap.merge(3 * i + 1, 3 * i + 2, NOW_MS + 2 * i + 2, {3 * i + 1: 10 * i + 1, 3 * i + 2: 10 * i + 2})
    assert pmap == churned_map(5)
    assert_consistent(pmap)


def test_map_entry_limit():
    assert limits.MAP_ENTRIES_MAX % 3 == 2                      # 3 * cycles + 1 lands just below it
    # MAP_ENTRIES_MAX - 1 entries: a split (+2) is one too many
    full = churned_map((limits.MAP_ENTRIES_MAX - 2) // 3)
    assert len(full.entries) == limits.MAP_ENTRIES_MAX - 1
    with pytest.raises(TooManyPartitions) as err:
        full.split(full.next_ordinal - 1, None, NOW_MS + 10 ** 6, 0)
    assert str(limits.MAP_ENTRIES_MAX) in str(err.value)
    # MAP_ENTRIES_MAX - 4 entries: two splits reach the limit exactly, then a merge (+1) fails
    pmap = churned_map((limits.MAP_ENTRIES_MAX - 5) // 3)
    assert len(pmap.entries) == limits.MAP_ENTRIES_MAX - 4
    top = pmap.next_ordinal - 1
    pmap = pmap.split(top, None, NOW_MS + 10 ** 6, 0)
    pmap = pmap.split(top + 1, None, NOW_MS + 10 ** 6 + 1, 0)
    assert len(pmap.entries) == limits.MAP_ENTRIES_MAX
    assert len(pmap.open_entries()) == 3
    with pytest.raises(TooManyPartitions):
        pmap.merge(top + 3, top + 4, NOW_MS + 10 ** 6 + 2, {top + 3: 0, top + 4: 0})
    with pytest.raises(TooManyPartitions):
        pmap.merge(top + 2, top + 4, NOW_MS + 10 ** 6 + 2, {top + 2: 0, top + 4: 0})
    assert_tiles(pmap.open_entries())


@settings(max_examples=100)
@given(histories(max_initial=6, max_ops=30), st.integers(2, 6), st.integers(10, 40), st.data())
def test_limits_are_exact_under_random_changes(hist, max_open, max_entries, data):
    """With small limits patched in, a change raises TooManyPartitions exactly when its
    result would exceed one of them, and then leaves the map as it was."""
    initial, history = hist
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(limits, "STREAM_PARTITIONS_MAX", max_open)
        mp.setattr(limits, "MAP_ENTRIES_MAX", max_entries)
        pmap = initial
        if len(pmap.open_entries()) > max_open or len(pmap.entries) > max_entries:
            return
        for op, _, boundary in history:
            raw = pmap.to_bytes()
            grow_open, grow_all = (1, 2) if op[0] == "split" else (-1, 1)
            too_many = (len(pmap.open_entries()) + grow_open > max_open
                        or len(pmap.entries) + grow_all > max_entries)
            if too_many:
                with pytest.raises(TooManyPartitions):
                    replay(pmap, op, boundary)
                assert pmap.to_bytes() == raw
                return
            pmap = replay(pmap, op, boundary)
            assert len(pmap.open_entries()) <= max_open and len(pmap.entries) <= max_entries
            assert_tiles(pmap.open_entries())


# --- next_scale_step --------------------------------------------------------------------------

@pytest.mark.parametrize("target", [0, -1, limits.STREAM_PARTITIONS_MAX + 1, 10 ** 6])
def test_scale_to_an_impossible_target(target):
    pmap = PartitionMap.even(2, NOW_MS)
    with pytest.raises(SmsError) as err:
        pmap.next_scale_step(target)
    if target > limits.STREAM_PARTITIONS_MAX:
        assert isinstance(err.value, TooManyPartitions)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, limits.STREAM_PARTITIONS_MAX])
def test_scale_to_the_current_even_layout_is_nothing_to_do(n):
    assert PartitionMap.even(n, NOW_MS).next_scale_step(n) is None


def test_scale_steps_name_valid_changes():
    pmap = PartitionMap.even(2, NOW_MS)
    assert pmap.next_scale_step(4) == ("split", 0, 1 << 126)
    assert pmap.next_scale_step(1) == ("merge", 0, 1)
    three = PartitionMap.even(3, NOW_MS)
    step = three.next_scale_step(2)
    assert step == ("split", 1, 1 << 127)                    # the middle boundary lies inside p1


def test_scale_2_to_8_to_2():
    pmap = PartitionMap.even(2, NOW_MS)
    up, steps = scale(pmap, 8, NOW_MS + 100, max_steps=8 + 2 - 2)
    assert [s[0] for s in steps] == ["split"] * 6
    assert ranges(up.open_entries()) == even_bounds(8)
    assert up.next_scale_step(8) is None
    assert_consistent(up)
    down, steps = scale(up, 2, NOW_MS + 1000, max_steps=8 + 2 - 2)
    assert [s[0] for s in steps] == ["merge"] * 6
    assert ranges(down.open_entries()) == even_bounds(2)
    assert down.next_scale_step(2) is None
    assert len(down.entries) == 2 + 12 + 6 and down.next_ordinal == 20
    assert_consistent(down)
    # each epoch still answers with its own layout
    assert ranges(down.entries_at(NOW_MS + 50)) == even_bounds(2)
    assert ranges(down.entries_at(NOW_MS + 500)) == even_bounds(8)
    assert ranges(down.entries_at(NOW_MS + 5000)) == even_bounds(2)
    assert {e.ordinal for e in down.entries_at(NOW_MS)} == {0, 1}
    assert {e.ordinal for e in down.open_entries()}.isdisjoint({0, 1})


@pytest.mark.parametrize("n, target", [(1, 256), (256, 1), (3, 5), (5, 3), (7, 64), (100, 99), (1, 3)])
def test_scale_between_even_layouts(n, target):
    pmap = PartitionMap.even(n, NOW_MS)
    splits, merges = scale_plan_size(pmap, target)
    assert splits == target - math.gcd(n, target)               # boundaries shared by both layouts stay
    final, steps = scale(pmap, target, NOW_MS + 1, max_steps=n + target - 2)
    assert [s[0] for s in steps].count("split") == splits
    assert [s[0] for s in steps].count("merge") == merges
    assert ranges(final.open_entries()) == ranges(PartitionMap.even(target, NOW_MS).entries)
    assert final.next_scale_step(target) is None
    assert_tiles(final.open_entries())
    if len(final.entries) <= 600:
        assert_consistent(final)


@pytest.mark.slow
def test_scale_1_to_1024():
    target = limits.STREAM_PARTITIONS_MAX
    final, steps = scale(PartitionMap.even(1, NOW_MS), target, NOW_MS + 1, max_steps=target - 1,
                         check_pure=False)
    assert len(steps) == target - 1 and all(s[0] == "split" for s in steps)
    assert ranges(final.open_entries()) == even_bounds(target)
    assert final.next_scale_step(target) is None
    assert len(final.entries) == 1 + 2 * (target - 1)


@settings(max_examples=150)
@given(histories(max_initial=12, max_ops=20), st.integers(1, 40))
def test_scale_from_any_reachable_map_reaches_even_ranges(hist, target):
    pmap = final_map(hist)
    n = len(pmap.open_entries())
    splits, merges = scale_plan_size(pmap, target)
    assert 0 <= splits <= target - 1
    bound = n + target - 2                                        # derived in scale_plan_size
    final, steps = scale(pmap, target, max(e.valid_from_ms for e in pmap.entries), max_steps=bound)
    assert len(steps) == splits + merges == n + 2 * splits - target <= bound
    assert ranges(final.open_entries()) == even_bounds(target)
    assert final.next_scale_step(target) is None
    assert final.next_scale_step(target) is None                 # and stays so
    kinds = [s[0] for s in steps]
    assert kinds.count("split") == splits and kinds.count("merge") == merges
    assert_consistent(final)


@settings(max_examples=100)
@given(histories(max_initial=8, max_ops=10), st.lists(st.integers(1, 24), min_size=1, max_size=4))
def test_repeated_rescales(hist, targets):
    pmap = final_map(hist)
    t = max(e.valid_from_ms for e in pmap.entries)
    for target in targets:
        n = len(pmap.open_entries())
        pmap, steps = scale(pmap, target, t, max_steps=n + target - 2)
        t += len(steps) + 1
        assert ranges(pmap.open_entries()) == even_bounds(target)
    assert_consistent(pmap)


# --- known bug: the scale plan splits everything before it merges anything --------------------


@pytest.mark.parametrize("max_open, n, target", [(8, 8, 7), (8, 6, 7), (4, 4, 3)])
def test_scale_near_the_open_limit_small(max_open, n, target):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(limits, "STREAM_PARTITIONS_MAX", max_open)
        pmap = PartitionMap.even(n, NOW_MS)
        final, _ = scale(pmap, target, NOW_MS + 1, max_steps=n + target - 2 + max_open)
        assert ranges(final.open_entries()) == even_bounds(target)


@pytest.mark.slow
@pytest.mark.parametrize("n, target", [(limits.STREAM_PARTITIONS_MAX, limits.STREAM_PARTITIONS_MAX - 1),
                                       (1000, 1020)])
def test_scale_near_the_open_limit(n, target):
    pmap = PartitionMap.even(n, NOW_MS)
    assert n + scale_plan_size(pmap, target)[0] > limits.STREAM_PARTITIONS_MAX
    final, _ = scale(pmap, target, NOW_MS + 1, max_steps=10 * (n + target))
    assert ranges(final.open_entries()) == even_bounds(target)
