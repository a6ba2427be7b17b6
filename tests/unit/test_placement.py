"""Unit tests of control.placement.place: distinct members, balance, determinism."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.placement import place
from sms.errors import NotEnoughNodes


def _nodes(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


def _counts(nodes: list[str], chains: list[tuple[str, ...]]) -> tuple[Counter, Counter]:
    replicas = Counter({n: 0 for n in nodes})
    heads = Counter({n: 0 for n in nodes})
    for chain in chains:
        replicas.update(chain)
        heads[chain[0]] += 1
    return replicas, heads


@st.composite
def cluster_shapes(draw):
    n = draw(st.integers(min_value=1, max_value=7), label="nodes")
    rf = draw(st.integers(min_value=1, max_value=n), label="replication_factor")
    p = draw(st.integers(min_value=1, max_value=64), label="partitions")
    return n, rf, p


@settings(max_examples=200)
@given(cluster_shapes())
def test_chains_have_rf_distinct_members(shape):
    n, rf, p = shape
    nodes = _nodes(n)
    chains = place(nodes, p, rf)
    assert len(chains) == p
    for chain in chains:
        assert len(chain) == rf
        assert len(set(chain)) == rf
        assert set(chain) <= set(nodes)


@settings(max_examples=200)
@given(cluster_shapes())
def test_replica_counts_per_node_differ_by_at_most_one(shape):
    n, rf, p = shape
    nodes = _nodes(n)
    replicas, _heads = _counts(nodes, place(nodes, p, rf))
    assert sum(replicas.values()) == p * rf
    assert max(replicas.values()) - min(replicas.values()) <= 1


@settings(max_examples=200)
@given(cluster_shapes())
def test_head_is_first_and_among_the_least_loaded_heads_of_its_members(shape):
    n, rf, p = shape
    chains = place(_nodes(n), p, rf)
    heads = Counter()
    for chain in chains:
        head = chain[0]
        assert all(heads[head] <= heads[m] for m in chain)
        heads[head] += 1


@pytest.mark.parametrize("n", range(1, 8))
def test_heads_balanced_when_every_node_is_in_every_chain(n):
    nodes = _nodes(n)
    for p in range(1, 65):
        _replicas, heads = _counts(nodes, place(nodes, p, n))
        assert max(heads.values()) - min(heads.values()) <= 1


@pytest.mark.parametrize("n", range(1, 8))
def test_heads_balanced_when_rf_is_one(n):
    nodes = _nodes(n)
    for p in range(1, 65):
        _replicas, heads = _counts(nodes, place(nodes, p, 1))
        assert max(heads.values()) - min(heads.values()) <= 1


def test_head_counts_differ_by_at_most_one_for_every_shape():
    unbalanced = []
    for n in range(1, 8):
        nodes = _nodes(n)
        for rf in range(1, n + 1):
            for p in range(1, 65):
                _replicas, heads = _counts(nodes, place(nodes, p, rf))
                if max(heads.values()) - min(heads.values()) > 1:
                    unbalanced.append((n, rf, p, dict(heads)))
    assert unbalanced == []


def test_head_counts_three_nodes_rf2_three_partitions():
    _replicas, heads = _counts(["a", "b", "c"], place(["a", "b", "c"], 3, 2))
    assert max(heads.values()) - min(heads.values()) <= 1


@pytest.mark.parametrize("n, rf", [(0, 1), (1, 2), (2, 3), (4, 5)])
def test_rf_above_node_count_raises_not_enough_nodes(n, rf):
    with pytest.raises(NotEnoughNodes):
        place(_nodes(n), 1, rf)


def test_duplicate_node_names_count_once():
    with pytest.raises(NotEnoughNodes):
        place(["a", "a", "a"], 1, 2)
    assert all(len(set(c)) == 2 for c in place(["a", "b", "a", "b"], 4, 2))


@settings(max_examples=100)
@given(cluster_shapes(), st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_input_order(shape, rnd):
    n, rf, p = shape
    nodes = _nodes(n)
    shuffled = list(nodes)
    rnd.shuffle(shuffled)
    first = place(nodes, p, rf)
    assert place(nodes, p, rf) == first
    assert place(shuffled, p, rf) == first


def test_zero_partitions_is_empty():
    assert place(_nodes(3), 0, 2) == []


def test_respects_existing_replica_load():
    nodes = _nodes(4)
    existing = Counter({"node-0": 5, "node-1": 5})
    chains = place(nodes, 2, 2, replicas_per_node=existing)
    # the two empty nodes take the new replicas first
    assert all(set(chain) == {"node-2", "node-3"} for chain in chains)
    # the caller's counters are not modified
    assert existing == Counter({"node-0": 5, "node-1": 5})


def test_respects_existing_head_load():
    nodes = _nodes(3)
    heads = Counter({"node-0": 3, "node-1": 3})
    chains = place(nodes, 1, 3, heads_per_node=heads)
    assert chains[0][0] == "node-2"
    assert heads == Counter({"node-0": 3, "node-1": 3})


@settings(max_examples=100)
@given(cluster_shapes(), st.data())
def test_existing_load_is_evened_out(shape, data):
    n, rf, p = shape
    nodes = _nodes(n)
    existing = Counter({node: data.draw(st.integers(min_value=0, max_value=5), label=node) for node in nodes})
    new_replicas, _heads = _counts(nodes, place(nodes, p, rf, replicas_per_node=existing))
    total = existing + new_replicas
    gap_before = max(existing[m] for m in nodes) - min(existing[m] for m in nodes)
    gap_after = max(total[m] for m in nodes) - min(total[m] for m in nodes)
    # the greedy never widens the spread beyond what was there (or 1)
    assert gap_after <= max(gap_before, 1)
    # and never places on a node more loaded than one it skipped in the same chain
    chains = place(nodes, p, rf, replicas_per_node=existing)
    load = Counter(existing)
    for chain in chains:
        skipped = [m for m in nodes if m not in chain]
        if skipped:
            assert max(load[m] for m in chain) <= min(load[m] for m in skipped)
        load.update(chain)
