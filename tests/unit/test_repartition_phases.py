"""Unit tests of the repartition phases (control/phases.py) and of the driver that
executes them (control/repartition.py), without a cluster.

- The stored record: every phase round-trips; a record written before phases existed
  (no `phase` key: what clusters hold) reads as the phase its keys imply, also through
  `StreamConfig.from_bytes`; the legacy keys win over a `phase` that disagrees; keys of
  a newer version are kept; what is written keeps the keys older readers use.
- `decide`, one test per phase transition and per failure path: the observations it asks
  for, Seal, the drain wait and its timeout, Commit (ending SNs, boundary, children
  placed), Finish, Fail (too many partitions, not enough nodes, a partition gone), and
  that no action leaves the transition table or unseals a closed partition.
- A hypothesis simulation: a fake world (map, chains, heads that drain after a while,
  writers) driven by `decide` the way the driver does, with lost commits and a takeover
  that re-reads the record (sometimes in its old form) every round. Every request ends
  DONE with the map it asked for, or FAILED with the parents open and unsealed.
- The real `Repartitioner` on an embedded metadata store with fake heads: a split
  sealed by one leader is committed and finished by another, and a record that the
  previous code wrote mid-switch (sealed, no `phase`) is resumed.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.parse
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control import phases
from control.phases import (Commit, Facts, Fail, Finish, HeadReport, Kind, Observe, Phase, ProbeHeads, ReadChains,
                            ReadNodes, RepartitionRequest, RepartitionState, Seal, Step, TRANSITIONS, Wait,
                            decide)
from sms import errors, limits, metadata, seqno
from sms.hashing import HASH_SPACE
from sms.metadata import ChainConfig, StreamConfig
from sms.partition_map import PartitionMap
from sms.types import IngestionPolicy, NodeInfo, PartitionState, Persistence

NOW_MS = 1_700_000_000_000
NODES = {"n1": 11, "n2": 22, "n3": 33}          # live storage node -> started_ms
DRAIN_TIMEOUT_MS = int(limits.REPARTITION_DRAIN_TIMEOUT_S * 1000)


def make_config(partitions: int = 2, rf: int = 2, record: dict | None = None) -> StreamConfig:
    return StreamConfig(name="s", partitions=partitions, replication_factor=rf, persistence=Persistence.DISK,
                        ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24,
                        created_ms=NOW_MS - 10_000, repartition=record)


def make_chain(o: int, sealed: bool = False, epoch: int = 1, members=("n1", "n2")) -> ChainConfig:
    return ChainConfig(chain_id=metadata.chain_id("s", o), stream="s", ordinal=o, epoch=epoch, members=members,
                       persistence=Persistence.DISK, sealed=sealed)


def sn_at(ts_ms: int, counter: int, o: int) -> int:
    return seqno.make(ts_ms, counter, o)


def drained(chain: ChainConfig, sn: int) -> tuple[HeadReport, ...]:
    return (HeadReport(chain.chain_id, chain.epoch, "head", True, sn, sn),)


def split_state(phase=Phase.REQUESTED, **kw) -> RepartitionState:
    return RepartitionState(RepartitionRequest.split("r1", 0, requested_ms=NOW_MS - 5), phase=phase, **kw)


# --- the stored record ----------------------------------------------------------------------------

# records exactly as the code before phases wrote them (control/service.py, auto_split,
# the seal, the commit and _finish of the old control/repartition.py)
LEGACY = [
    ({"id": "a1", "op": "split", "requested_ms": 5, "partition": 0, "at_hash": None}, Phase.REQUESTED),
    ({"id": "a2", "op": "split", "requested_ms": 5, "partition": 3, "at_hash": str(HASH_SPACE // 3)},
     Phase.REQUESTED),
    ({"id": "a3", "requested_ms": 5, "op": "split", "partition": 1, "auto": True}, Phase.REQUESTED),
    ({"id": "a4", "op": "merge", "requested_ms": 5, "partitions": [1, 2]}, Phase.REQUESTED),
    ({"id": "a5", "op": "scale", "requested_ms": 5, "target": 8}, Phase.REQUESTED),
    ({"id": "a6", "op": "split", "requested_ms": 5, "partition": 0, "at_hash": None, "sealed_ms": 9},
     Phase.SEALED),
    ({"id": "a7", "op": "scale", "requested_ms": 5, "target": 8, "steps_done": 2}, Phase.COMMITTED),
    ({"id": "a8", "op": "scale", "requested_ms": 5, "target": 8, "steps_done": 2, "sealed_ms": 9}, Phase.SEALED),
    ({"id": "a9", "op": "split", "requested_ms": 5, "partition": 0, "at_hash": None, "steps_done": 1,
      "done": True, "done_ms": 12, "error": None}, Phase.DONE),
    ({"id": "b1", "op": "merge", "requested_ms": 5, "partitions": [0, 1], "sealed_ms": 9, "done": True,
      "done_ms": 12, "error": ["Timeout", "p0000's head did not drain"]}, Phase.FAILED),
    ({"id": "b2", "op": "scale", "requested_ms": 5, "target": 2000, "done": True, "done_ms": 12,
      "error": ["TooManyPartitions", "scale to 2000"]}, Phase.FAILED),
]


@pytest.mark.parametrize("record,phase", LEGACY, ids=[r["id"] for r, _ in LEGACY])
def test_a_record_written_before_phases_reads_as_the_phase_its_keys_imply(record, phase):
    state = RepartitionState.from_record(record)
    assert state.phase is phase
    assert phases.recorded_phase(record) is phase
    assert phases.in_progress(make_config(record=record)) == (not phase.ended)
    request = state.request
    assert request.id == record["id"] and request.kind.value == record["op"]
    if request.kind is Kind.SPLIT:
        assert request.parents == (record["partition"],)
        assert request.at_hash == (None if record.get("at_hash") is None else int(record["at_hash"]))
        assert request.auto == bool(record.get("auto"))
    elif request.kind is Kind.MERGE:
        assert request.parents == tuple(record["partitions"])
    else:
        assert request.target == record["target"]
    assert state.steps_done == record.get("steps_done", 0)
    assert state.sealed_ms == (record["sealed_ms"] if phase is Phase.SEALED else None)
    assert state.error == (tuple(record["error"]) if phase is Phase.FAILED else None)
    # written back: the same phase, and every key an older reader looks at means the same
    again = state.to_record()
    assert again["phase"] == phase.value and RepartitionState.from_record(again) == state
    for key in ("id", "op", "partition", "partitions", "target", "at_hash", "auto", "requested_ms"):
        assert again.get(key) == record.get(key), key
    assert bool(again.get("done")) == bool(record.get("done"))
    assert again.get("error") == record.get("error")
    assert again.get("steps_done", 0) == record.get("steps_done", 0)
    if phase is Phase.SEALED:
        assert again["sealed_ms"] == record["sealed_ms"]


def test_a_stream_config_stored_by_the_previous_code_reads_with_its_request_mid_switch():
    """The bytes of a stream config as the previous code stored them, its split sealed."""
    raw = json.dumps({
        "name": "s", "partitions": 1, "replication_factor": 2, "persistence": "disk",
        "ingestion_policy": "at_least_once_no_dup", "retention_hours": 24, "created_ms": 1, "status": "ACTIVE",
        "tenant": "default", "dedup_window_ms": 300000, "retention_s": 0, "protect_unread": False,
        "trim_before_ms": 0, "trim_before_sns": {}, "auto_split_records_per_s": 0, "auto_split_period_s": 30,
        "repartition": {"id": "f00d", "op": "split", "requested_ms": 100, "partition": 0, "at_hash": None,
                        "sealed_ms": 200},
        "repartitions_ms": [50]}).encode()
    config = StreamConfig.from_bytes(raw)
    assert phases.in_progress(config)
    state = RepartitionState.from_record(config.repartition)
    assert state == RepartitionState(RepartitionRequest.split("f00d", 0, requested_ms=100), Phase.SEALED,
                                     sealed_ms=200)
    # what the driver writes back is readable by StreamConfig and by the previous code's keys
    after = phases.config_after(config, state, Commit(Step(Kind.SPLIT, (0,)), ((0, 7),), 300, PartitionMap.even(1, 0),
                                                      (), 300))
    back = StreamConfig.from_bytes(after.to_bytes())
    assert back.repartition["steps_done"] == 1 and "sealed_ms" not in back.repartition
    assert not back.repartition.get("done") and back.repartitions_ms == (50, 300)
    assert RepartitionState.from_record(back.repartition).phase is Phase.COMMITTED


@pytest.mark.parametrize("stored,keys,derived", [
    ("requested", {"sealed_ms": 9}, Phase.SEALED),               # an older leader sealed it
    ("sealed", {"steps_done": 1}, Phase.COMMITTED),             # ... and committed the step
    ("sealed", {"sealed_ms": 9, "done": True, "error": ["Timeout", "m"]}, Phase.FAILED),
    ("committed", {"steps_done": 3, "done": True, "error": None}, Phase.DONE),
    ("done", {}, Phase.REQUESTED),
    ("no-such-phase", {"steps_done": 1}, Phase.COMMITTED),
])
def test_the_legacy_keys_win_over_a_phase_that_disagrees(stored, keys, derived):
    record = {"id": "x", "op": "scale", "requested_ms": 5, "target": 4, "phase": stored, **keys}
    assert RepartitionState.from_record(record).phase is derived


def test_keys_of_a_newer_version_are_kept_and_a_malformed_request_is_a_named_error():
    record = {**RepartitionRequest.scale("x", 4).record(), "priority": [1, 2]}
    state = RepartitionState.from_record(record)
    assert state.to_record()["priority"] == [1, 2]
    assert state.after(Seal(Step(Kind.SPLIT, (0,)), (0,), 9)).to_record()["priority"] == [1, 2]
    for bad in ({"id": "x", "op": "shuffle"}, {"id": "x", "op": "split"}, {"id": "x", "op": "merge", "partitions": [1]},
                {"id": "x", "op": "scale", "target": "many"}):
        with pytest.raises(errors.InvalidArgument):
            RepartitionState.from_record(bad)
    with pytest.raises(errors.InvalidArgument):
        RepartitionRequest("x", Kind.MERGE, (1,))
    with pytest.raises(errors.InvalidArgument):
        RepartitionRequest("x", Kind.SCALE, target=4, at_hash=3)


requests = st.one_of(
    st.builds(RepartitionRequest.split, st.text(min_size=1, max_size=8), st.integers(0, 50),
              st.one_of(st.none(), st.integers(1, HASH_SPACE - 1)), requested_ms=st.integers(0, 2 ** 45),
              auto=st.booleans()),
    st.builds(RepartitionRequest.merge, st.text(min_size=1, max_size=8), st.integers(0, 50), st.integers(0, 50),
              requested_ms=st.integers(0, 2 ** 45)),
    st.builds(RepartitionRequest.scale, st.text(min_size=1, max_size=8), st.integers(1, 1024),
              requested_ms=st.integers(0, 2 ** 45)))


@st.composite
def states(draw) -> RepartitionState:
    phase = draw(st.sampled_from(Phase))
    steps = {Phase.REQUESTED: 0, Phase.COMMITTED: draw(st.integers(1, 20))}.get(phase, draw(st.integers(0, 20)))
    return RepartitionState(
        draw(requests), phase, steps,
        sealed_ms=draw(st.integers(0, 2 ** 45)) if phase is Phase.SEALED else None,
        done_ms=draw(st.integers(0, 2 ** 45)) if phase.ended else None,
        error=(draw(st.sampled_from(["Timeout", "NotEnoughNodes"])), draw(st.text(max_size=20)))
        if phase is Phase.FAILED else None)


@given(states(), st.booleans())
def test_every_state_round_trips_through_its_record_and_its_stream_config(state, without_phase):
    record = state.to_record()
    if without_phase:             # as the previous code would have stored the same progress
        record.pop("phase")
    assert RepartitionState.from_record(record) == state
    config = StreamConfig.from_bytes(make_config(record=record).to_bytes())
    assert RepartitionState.from_record(config.repartition) == state
    assert phases.in_progress(config) == (not state.phase.ended)


# --- decide: one transition at a time ----------------------------------------------------------------

def observe(state: RepartitionState, facts: Facts, chains: dict, heads: dict | None = None,
            nodes: dict | None = None) -> tuple:
    """Answer decide()'s observations from the given world, as the driver does; the
    first action that is not an observation, and what was asked."""
    asked = []
    for _ in range(4):
        action = decide(state, facts)
        if not isinstance(action, Observe):
            return action, asked
        asked.append(action)
        if isinstance(action, ReadChains):
            facts = replace(facts, chains={o: chains.get(o) for o in action.ordinals})
        elif isinstance(action, ProbeHeads):
            facts = replace(facts, heads={o: (heads or {}).get(o, ()) for o in action.ordinals})
        else:
            facts = replace(facts, nodes=NODES if nodes is None else nodes)
    raise AssertionError(f"decide kept observing: {asked}")


def test_requested_reads_the_parents_chains_then_seals_them():
    pmap = PartitionMap.even(2, NOW_MS - 10_000)
    facts = Facts(make_config(), pmap, NOW_MS)
    assert decide(split_state(), facts) == ReadChains((0,))
    action, asked = observe(split_state(), facts, {0: make_chain(0), 1: make_chain(1)})
    assert asked == [ReadChains((0,))]
    assert action == Seal(Step(Kind.SPLIT, (0,)), (0,), NOW_MS)
    after = split_state().after(action)
    assert after.phase is Phase.SEALED and after.sealed_ms == NOW_MS
    assert after.to_record()["sealed_ms"] == NOW_MS


def test_a_merge_seals_only_the_parent_not_sealed_yet():
    state = RepartitionState(RepartitionRequest.merge("m", 1, 0), Phase.SEALED, sealed_ms=NOW_MS - 100)
    facts = Facts(make_config(), PartitionMap.even(2, NOW_MS - 10_000), NOW_MS)
    action, _ = observe(state, facts, {0: make_chain(0, sealed=True), 1: make_chain(1)})
    assert action == Seal(Step(Kind.MERGE, (1, 0)), (1,), NOW_MS)


def test_parents_found_sealed_without_the_phase_record_it_so_the_drain_timeout_runs():
    facts = Facts(make_config(), PartitionMap.even(2, NOW_MS - 10_000), NOW_MS)
    action, _ = observe(split_state(), facts, {0: make_chain(0, sealed=True)})
    assert action == Seal(Step(Kind.SPLIT, (0,)), (), NOW_MS)
    assert split_state().after(action).phase is Phase.SEALED


def test_a_missing_chain_config_waits():
    facts = Facts(make_config(), PartitionMap.even(2, NOW_MS - 10_000), NOW_MS)
    action, _ = observe(split_state(), facts, {})
    assert isinstance(action, Wait) and "p0000" in action.reason


@pytest.mark.parametrize("report", [
    (),                                                                          # no live head
    (HeadReport("s:0", 1, "head", False, 50, 50),),                              # seal not applied
    (HeadReport("s:0", 1, "head", True, 50, 40),),                               # not all committed
    (HeadReport("s:0", 2, "head", True, 50, 50),),                               # another epoch
    (HeadReport("s:0", 1, "tail", True, 50, 50),),                               # not the head
    (HeadReport("s:1", 1, "head", True, 50, 50),),                               # another chain
])
def test_sealed_waits_while_the_head_has_not_drained_then_fails_at_the_timeout(report):
    chain = make_chain(0, sealed=True)
    state = split_state(Phase.SEALED, sealed_ms=NOW_MS)
    pmap = PartitionMap.even(2, NOW_MS - 10_000)
    action, asked = observe(state, Facts(make_config(), pmap, NOW_MS + 5), {0: chain}, {0: report})
    assert asked == [ReadChains((0,)), ProbeHeads((0,))]
    assert isinstance(action, Wait) and "draining" in action.reason
    action, _ = observe(state, Facts(make_config(), pmap, NOW_MS + DRAIN_TIMEOUT_MS), {0: chain}, {0: report})
    assert isinstance(action, Wait)
    late = NOW_MS + DRAIN_TIMEOUT_MS + 1
    action, _ = observe(state, Facts(make_config(), pmap, late), {0: chain}, {0: report})
    assert isinstance(action, Fail) and isinstance(action.error, errors.Timeout)
    assert action.unseal == (0,) and action.at_ms == late
    failed = state.after(action)
    assert failed.phase is Phase.FAILED and failed.error[0] == "Timeout" and failed.done_ms == late
    record = failed.to_record()
    assert record["done"] is True and record["error"][0] == "Timeout" and "sealed_ms" not in record


def test_sealed_commits_once_every_head_drained():
    pmap = PartitionMap.even(2, NOW_MS - 10_000).with_version(7)
    chains = {0: make_chain(0, sealed=True, epoch=3), 1: make_chain(1, sealed=True)}
    ending = sn_at(NOW_MS + 40, 12, 0)         # the head's clock is ahead of ours
    state = RepartitionState(RepartitionRequest.split("r", 0, HASH_SPACE // 8), Phase.SEALED, sealed_ms=NOW_MS - 50)
    action, asked = observe(state, Facts(make_config(rf=2), pmap, NOW_MS), chains, {0: drained(chains[0], ending)})
    assert asked == [ReadChains((0,)), ProbeHeads((0,)), ReadNodes()]
    assert isinstance(action, Commit) and action.step == Step(Kind.SPLIT, (0,), HASH_SPACE // 8)
    assert action.endings == ((0, ending),)
    assert action.boundary_ms == NOW_MS + 41 > seqno.timestamp_ms_of(ending)
    parent = action.new_map.entry(0)
    assert parent.state is PartitionState.CLOSED and parent.ending_sn == ending
    assert parent.valid_to_ms == action.boundary_ms and parent.children == (2, 3)
    kids = [action.new_map.entry(c) for c in (2, 3)]
    assert [(k.hash_lo, k.hash_hi) for k in kids] == [(0, HASH_SPACE // 8), (HASH_SPACE // 8, HASH_SPACE // 2)]
    assert action.new_map.entry(1) == pmap.entry(1)
    assert [c.ordinal for c in action.children] == [2, 3]
    for child in action.children:
        assert child.chain_id == f"s:{child.ordinal}" and child.epoch == 1 and not child.sealed
        assert len(set(child.members)) == 2 and set(child.members) <= set(NODES)
        assert child.from_ms == action.boundary_ms and child.persistence is Persistence.DISK
        assert dict(child.incarnations) == {n: NODES[n] for n in child.members}
        assert "split of p0000" in child.history[0].reason
    committed = state.after(action)
    assert committed.phase is Phase.COMMITTED and committed.steps_done == 1 and committed.sealed_ms is None
    config = phases.config_after(make_config(), state, action)
    assert config.repartitions_ms == (NOW_MS,) and config.repartition == committed.to_record()


def test_children_take_the_streams_min_in_sync():
    pmap = PartitionMap.even(1, NOW_MS - 10_000).with_version(3)
    chains = {0: replace(make_chain(0, sealed=True), min_in_sync=2)}
    state = split_state(Phase.SEALED, sealed_ms=NOW_MS)
    config = replace(make_config(partitions=1, rf=2), min_in_sync=2)
    action, _ = observe(state, Facts(config, pmap, NOW_MS + 3), chains, {0: drained(chains[0], 0)})
    assert isinstance(action, Commit) and [c.min_in_sync for c in action.children] == [2, 2]


def test_an_empty_parent_ends_at_sn_zero_and_the_boundary_is_now():
    chains = {0: make_chain(0, sealed=True)}
    state = split_state(Phase.SEALED, sealed_ms=NOW_MS)
    action, _ = observe(state, Facts(make_config(), PartitionMap.even(1, NOW_MS - 10), NOW_MS + 3), chains,
                        {0: drained(chains[0], 0)})
    assert isinstance(action, Commit) and action.endings == ((0, 0),) and action.boundary_ms == NOW_MS + 3


def test_committed_finishes_a_split_and_seals_the_next_step_of_a_scale():
    pmap = PartitionMap.even(1, NOW_MS - 10_000).split(0, None, NOW_MS - 5_000, sn_at(NOW_MS - 5_001, 1, 0))
    done_split = split_state(Phase.COMMITTED, steps_done=1)
    action = decide(done_split, Facts(make_config(), pmap, NOW_MS))
    assert action == Finish(NOW_MS, ())
    finished = done_split.after(action)
    assert finished.phase is Phase.DONE and finished.to_record()["done"] is True
    assert finished.to_record()["error"] is None and finished.to_record()["steps_done"] == 1

    scaling = RepartitionState(RepartitionRequest.scale("sc", 4), Phase.COMMITTED, steps_done=1)
    action, _ = observe(scaling, Facts(make_config(), pmap, NOW_MS), {1: make_chain(1), 2: make_chain(2)})
    assert isinstance(action, Seal) and action.step.kind is Kind.SPLIT and action.seal == action.step.parents
    assert action.step.parents[0] in (1, 2) and action.step.at_hash in (HASH_SPACE // 4, 3 * HASH_SPACE // 4)


def test_a_request_with_nothing_to_do_finishes_and_unseals_only_what_it_may_have_sealed():
    even4 = PartitionMap.even(4, NOW_MS)
    scale = RepartitionRequest.scale("sc", 4)
    assert decide(RepartitionState(scale), Facts(make_config(), even4, NOW_MS)) == Finish(NOW_MS, ())
    sealed = RepartitionState(scale, Phase.SEALED, sealed_ms=NOW_MS)
    assert decide(sealed, Facts(make_config(), even4, NOW_MS)) == Finish(NOW_MS, (0, 1, 2, 3))
    closed = PartitionMap.even(2, NOW_MS).split(0, None, NOW_MS + 1, 0)
    assert decide(split_state(Phase.SEALED, sealed_ms=NOW_MS), Facts(make_config(), closed, NOW_MS)) \
        == Finish(NOW_MS, ())


@pytest.mark.parametrize("phase", [Phase.REQUESTED, Phase.SEALED, Phase.COMMITTED])
def test_a_step_over_the_partition_limit_fails_and_unseals_the_open_parents(phase, monkeypatch):
    monkeypatch.setattr(limits, "STREAM_PARTITIONS_MAX", 2)
    state = split_state(phase, sealed_ms=NOW_MS if phase is Phase.SEALED else None,
                        steps_done=1 if phase is Phase.COMMITTED else 0)
    action = decide(state, Facts(make_config(), PartitionMap.even(2, NOW_MS), NOW_MS + 1))
    assert isinstance(action, Fail) and isinstance(action.error, errors.TooManyPartitions)
    assert action.unseal == (0,) and state.after(action).phase is Phase.FAILED
    assert Phase.FAILED in TRANSITIONS[phase]


def test_too_few_live_nodes_fail_the_commit_and_unseal_the_parents():
    chains = {0: make_chain(0, sealed=True), 1: make_chain(1, sealed=True)}
    state = RepartitionState(RepartitionRequest.merge("m", 0, 1), Phase.SEALED, sealed_ms=NOW_MS)
    action, _ = observe(state, Facts(make_config(rf=3), PartitionMap.even(2, NOW_MS - 99), NOW_MS), chains,
                        {o: drained(c, sn_at(NOW_MS - 9, 1, o)) for o, c in chains.items()}, nodes={"n1": 1, "n2": 2})
    assert isinstance(action, Fail) and isinstance(action.error, errors.NotEnoughNodes)
    assert action.unseal == (0, 1)


def test_a_partition_gone_from_the_map_fails_the_request_and_an_ended_one_does_nothing():
    pmap = PartitionMap.even(2, NOW_MS)
    state = RepartitionState(RepartitionRequest.merge("m", 1, 5))
    action = decide(state, Facts(make_config(), pmap, NOW_MS))
    assert isinstance(action, Fail) and isinstance(action.error, errors.PartitionNotFound)
    assert action.unseal == (1,)                       # open, named; p0005 is not in the map
    for phase in (Phase.DONE, Phase.FAILED):
        assert isinstance(decide(replace(state, phase=phase), Facts(make_config(), pmap, NOW_MS)), Wait)
        assert TRANSITIONS[phase] == frozenset()


def test_a_failed_request_never_unseals_a_closed_partition():
    closed = PartitionMap.even(2, NOW_MS).split(0, None, NOW_MS + 1, 0)       # p0000 closed, p2 p3 open
    state = RepartitionState(RepartitionRequest.merge("m", 0, 1), Phase.REQUESTED)
    # p0000 closed: nothing to merge, it finishes
    assert decide(state, Facts(make_config(), closed, NOW_MS)) == Finish(NOW_MS, ())
    scale = RepartitionState(RepartitionRequest.scale("sc", 2000), Phase.SEALED, sealed_ms=NOW_MS)
    action = decide(scale, Facts(make_config(), closed, NOW_MS))
    assert isinstance(action, Fail) and set(action.unseal) == {1, 2, 3}


def test_check_request_takes_the_typed_request_and_the_stored_form():
    config = make_config()
    pmap = PartitionMap.even(2, NOW_MS)
    assert phases.check_request(config, pmap, RepartitionRequest.scale("x", 4), NOW_MS) == 2
    assert phases.check_request(config, pmap, RepartitionRequest.scale("x", 4).record(), NOW_MS) == 2
    assert phases.check_request(config, pmap, {"id": "x", "op": "split", "partition": 1, "at_hash": None},
                                NOW_MS) == 1
    with pytest.raises(errors.InvalidArgument):
        phases.check_request(config, pmap, {"id": "x", "op": "shuffle"}, NOW_MS)
    busy = make_config(record=RepartitionState(RepartitionRequest.split("y", 0), Phase.SEALED,
                                               sealed_ms=1).to_record())
    with pytest.raises(errors.RepartitionInProgress):
        phases.check_request(busy, pmap, RepartitionRequest.scale("x", 4), NOW_MS)
    legacy_busy = make_config(record={"id": "y", "op": "split", "partition": 0, "sealed_ms": 1})
    with pytest.raises(errors.RepartitionInProgress):
        phases.check_request(legacy_busy, pmap, RepartitionRequest.scale("x", 4), NOW_MS)
    full = replace(config, repartitions_ms=(NOW_MS - 1,) * limits.REPARTITIONS_PER_DAY_MAX)
    with pytest.raises(errors.RescaleTooSoon):
        phases.check_request(full, pmap, RepartitionRequest.split("x", 0), NOW_MS)


# --- the simulation ----------------------------------------------------------------------------------

class World:
    """A stream's metadata and its heads, as the driver sees them: open unsealed
    partitions take writes (their head's last SN rises), a sealed head drains after
    `drain_after` probes (never if None)."""

    def __init__(self, pmap: PartitionMap, record: dict, rf: int, nodes: dict, drain_after: int | None):
        self.config = make_config(len(pmap.entries), rf, record)
        self.pmap = pmap
        self.nodes = nodes
        self.now_ms = NOW_MS
        self.drain_after = drain_after
        members = tuple(sorted(nodes))[:rf] or ("n1",)
        self.chains = {e.ordinal: make_chain(e.ordinal, members=members) for e in pmap.entries}
        self.last_sn = {e.ordinal: 0 for e in pmap.entries}
        self.counter = 0
        self.probes: Counter = Counter()
        self.commits = 0
        self.initial = pmap

    @property
    def record(self) -> dict:
        return self.config.repartition

    def tick(self, ms: int) -> None:
        self.now_ms += ms
        for e in self.pmap.open_entries():
            if not self.chains[e.ordinal].sealed:
                self.counter += 1
                self.last_sn[e.ordinal] = sn_at(self.now_ms, self.counter, e.ordinal)

    def report(self, o: int) -> tuple[HeadReport, ...]:
        chain = self.chains[o]
        if not chain.sealed:
            return (HeadReport(chain.chain_id, chain.epoch, "head", False, self.last_sn[o], self.last_sn[o]),)
        self.probes[o] += 1
        done = self.drain_after is not None and self.probes[o] >= self.drain_after
        committed = self.last_sn[o] if done else max(0, self.last_sn[o] - 1)
        return (HeadReport(chain.chain_id, chain.epoch, "head", True, self.last_sn[o], committed),)

    def load(self) -> tuple[Counter, Counter]:
        replicas, heads = Counter(), Counter()
        for c in self.chains.values():
            if not c.sealed:
                replicas.update(c.members)
                heads[c.head] += 1
        return replicas, heads

    def advance(self, lose_commit: bool, old_form: bool) -> tuple[RepartitionState, object]:
        """One driver round: the record read afresh (a takeover loses nothing), the
        observations answered, the action applied (unless its conditional commit loses)."""
        record = dict(self.record)
        if old_form:
            record.pop("phase", None)
        state = RepartitionState.from_record(record)
        facts = Facts(self.config, self.pmap, self.now_ms)
        read_epochs = {}
        for _ in range(4):
            action = decide(state, facts)
            if isinstance(action, ReadChains):
                read_epochs = {o: self.chains[o].epoch for o in action.ordinals if o in self.chains}
                facts = replace(facts, chains={o: self.chains.get(o) for o in action.ordinals})
            elif isinstance(action, ProbeHeads):
                facts = replace(facts, heads={o: self.report(o) for o in action.ordinals})
            elif isinstance(action, ReadNodes):
                replicas, heads = self.load()
                facts = replace(facts, nodes=self.nodes, replicas=replicas, head_load=heads)
            else:
                break
        assert not isinstance(action, Observe), "decide asked for a fact twice"
        if action.phase is not None:
            assert action.phase in TRANSITIONS[state.phase], f"{state.phase} -> {action.phase} by {action}"
        if isinstance(action, (Fail, Finish)):
            for o in action.unseal:
                assert self.pmap.entry(o).state is PartitionState.OPEN, f"{action} unseals closed p{o}"
        if lose_commit or isinstance(action, Wait):
            return state, action
        if isinstance(action, Seal):
            assert set(action.seal) <= set(action.step.parents)
            for o in action.seal:
                assert not self.chains[o].sealed
                self.chains[o] = replace(self.chains[o], sealed=True)
        elif isinstance(action, Commit):
            for o in action.step.parents:
                assert self.chains[o].sealed and self.chains[o].epoch == read_epochs[o]
                assert dict(action.endings)[o] == self.last_sn[o], "the ending SN is the head's last SN"
                if self.last_sn[o]:
                    assert action.boundary_ms > seqno.timestamp_ms_of(self.last_sn[o])
            assert action.new_map.version == self.pmap.version
            self.pmap = action.new_map.with_version(self.pmap.version + 1)
            for child in action.children:
                assert child.ordinal not in self.chains and child.from_ms == action.boundary_ms
                assert len(set(child.members)) == self.config.replication_factor
                self.chains[child.ordinal] = child
                self.last_sn[child.ordinal] = 0
            self.commits += 1
        elif isinstance(action, (Fail, Finish)):
            for o in action.unseal:
                self.chains[o] = replace(self.chains[o], sealed=False)
        self.config = phases.config_after(self.config, state, action)
        return state, action


@st.composite
def scenarios(draw):
    pmap = PartitionMap.even(draw(st.integers(1, 4)), NOW_MS - 60_000)
    for _ in range(draw(st.integers(0, 2))):          # some history: a few splits done already
        o = draw(st.sampled_from([e.ordinal for e in pmap.open_entries()]))
        pmap = pmap.split(o, None, NOW_MS - 30_000, 0)
    opened = sorted(pmap.open_entries(), key=lambda e: e.hash_lo)
    kind = draw(st.sampled_from(["split", "merge", "scale"] if len(opened) > 1 else ["split", "scale"]))
    if kind == "split":
        e = draw(st.sampled_from(opened))
        at = draw(st.one_of(st.none(), st.integers(e.hash_lo + 1, e.hash_hi - 1)))
        request = RepartitionRequest.split("r", e.ordinal, at)
    elif kind == "merge":
        i = draw(st.integers(0, len(opened) - 2))
        a, b = opened[i], opened[i + 1]
        request = RepartitionRequest.merge("r", *draw(st.permutations([a.ordinal, b.ordinal])))
    else:
        request = RepartitionRequest.scale("r", draw(st.integers(1, 6)))
    rf = draw(st.integers(1, 3))
    nodes = {f"n{i}": i for i in range(1, draw(st.integers(1, 4)) + 1)}
    drain_after = draw(st.one_of(st.integers(1, 4), st.just(None)))
    return pmap.with_version(5), request, rf, nodes, drain_after


def satisfied(request: RepartitionRequest, initial: PartitionMap, final: PartitionMap) -> bool:
    if request.kind is Kind.SCALE:
        bounds = [i * HASH_SPACE // request.target for i in range(request.target)] + [HASH_SPACE]
        return [(e.hash_lo, e.hash_hi) for e in sorted(final.open_entries(), key=lambda e: e.hash_lo)] \
            == list(zip(bounds, bounds[1:]))
    parents = [final.entry(o) for o in request.parents]
    if any(p.state is not PartitionState.CLOSED for p in parents) or len({p.children for p in parents}) != 1:
        return False
    kids = [final.entry(c) for c in parents[0].children]
    lo, hi = min(p.hash_lo for p in parents), max(p.hash_hi for p in parents)
    return (min(k.hash_lo for k in kids), max(k.hash_hi for k in kids)) == (lo, hi) \
        and (request.kind is Kind.MERGE or request.at_hash is None or kids[1].hash_lo == request.at_hash)


@settings(max_examples=150)
@given(scenarios(), st.integers(0, 2 ** 32 - 1))
def test_every_request_ends_done_as_asked_or_failed_with_its_parents_open_and_writable(scenario, seed):
    """Each round: time passes (writers write), the driver takes over afresh (the record is
    re-read, in its old form half the time) and one commit in ten is lost."""
    pmap, request, rf, nodes, drain_after = scenario
    rng = random.Random(seed)
    world = World(pmap, request.record(), rf, nodes, drain_after)
    seen = [Phase.REQUESTED]
    for _ in range(2000):
        world.tick(rng.randint(1, 400))
        world.advance(lose_commit=rng.random() < 0.1, old_form=rng.random() < 0.5)
        phase = phases.recorded_phase(world.record)
        if phase is not seen[-1]:
            seen.append(phase)
        if phase.ended:
            break
    else:
        raise AssertionError(f"not ended: {world.record}")
    for a, b in zip(seen, seen[1:]):
        assert b in TRANSITIONS[a] and b is not a, seen
    final = RepartitionState.from_record(world.record)
    assert final.steps_done == world.commits
    assert not any(world.chains[e.ordinal].sealed for e in world.pmap.open_entries()), \
        "an open partition stays sealed after the request ended"
    if final.phase is Phase.DONE:
        assert satisfied(request, world.initial, world.pmap), (request, world.pmap.open_entries())
        assert world.commits == 0 or drain_after is not None
    else:
        assert world.commits == 0 or request.kind is Kind.SCALE, "a split or merge fails only before its commit"
        name = final.error[0]
        if name == "Timeout":
            assert drain_after is None
        elif name == "NotEnoughNodes":
            assert len(nodes) < rf
        else:
            raise AssertionError(f"failed with {final.error}")
    if drain_after is not None and len(nodes) >= rf:
        assert final.phase is Phase.DONE


# --- the driver on a real metadata store -------------------------------------------------------------

class FakeHeads:
    """NodeStatus of every parent's head: drained (last SN = committed SN) once `drain` is set."""

    def __init__(self):
        self.drain = False
        self.last_sn = sn_at(NOW_MS, 5, 0)

    async def reports(self, chain: ChainConfig, nodes: dict) -> tuple[HeadReport, ...]:
        committed = self.last_sn if self.drain else self.last_sn - 1
        return (HeadReport(chain.chain_id, chain.epoch, "head", chain.sealed, self.last_sn, committed),)


def driver(store, heads: FakeHeads):
    from control.repartition import Repartitioner
    rp = Repartitioner(store)
    rp._head_reports = heads.reports
    return rp


async def setup_stream(store, record: dict, sealed: bool = False) -> None:
    for path in (metadata.NODES, metadata.STREAMS, metadata.CHAINS):
        await store.create(path)
    for n, started in NODES.items():
        await store.create(metadata.node_path(n), metadata.node_to_bytes(
            NodeInfo(node_id=n, address=f"127.0.0.1:{started}", roles=("storage",), pid=started,
                     started_ms=started)))
    await store.create(metadata.stream_path("s"), make_config(1, 2, record).to_bytes())
    await store.create(metadata.map_path("s"), PartitionMap.even(1, NOW_MS - 60_000).to_bytes())
    await store.create(metadata.chain_path("s:0"), make_chain(0, sealed=sealed).to_bytes())


async def read(store) -> tuple[StreamConfig, int, PartitionMap, ChainConfig]:
    entry = await store.get(metadata.stream_path("s"))
    map_entry = await store.get(metadata.map_path("s"))
    chain = ChainConfig.from_bytes((await store.get(metadata.chain_path("s:0"))).value)
    return (StreamConfig.from_bytes(entry.value), entry.version,
            PartitionMap.from_bytes(map_entry.value, version=map_entry.version), chain)


def with_store(tmp_path, body) -> None:
    from metastore import open_metastore
    url = "embedded://" + urllib.parse.quote(str(tmp_path / "meta.lmdb"))

    async def main():
        async with open_metastore(url) as first, open_metastore(url) as second:
            await body(first, second)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_split_sealed_by_one_leader_is_finished_by_the_next(tmp_path):
    async def body(first, second):
        heads = FakeHeads()
        await setup_stream(first, RepartitionRequest.split("r1", 0, requested_ms=NOW_MS).record())
        old_leader = driver(first, heads)
        config, version, _, _ = await read(first)
        assert isinstance(await old_leader.advance(config, version), Seal)
        config, version, pmap, chain = await read(first)
        assert chain.sealed and config.repartition["phase"] == "sealed" and config.repartition["sealed_ms"]
        assert isinstance(await old_leader.advance(config, version), Wait)       # the head still drains
        stale = (config, version)
        # the old leader dies; the new one resumes from the recorded phase
        heads.drain = True
        new_leader = driver(second, heads)
        config, version, _, _ = await read(second)
        assert isinstance(await new_leader.advance(config, version), Commit)
        config, version, pmap, chain = await read(second)
        assert config.repartition["phase"] == "committed" and config.repartition["steps_done"] == 1
        assert pmap.version == 1 and pmap.entry(0).state is PartitionState.CLOSED
        assert pmap.entry(0).ending_sn == heads.last_sn and chain.sealed
        for c in (1, 2):
            child = ChainConfig.from_bytes((await second.get(metadata.chain_path(f"s:{c}"))).value)
            assert child.from_ms == pmap.entry(c).valid_from_ms and not child.sealed
        assert len(config.repartitions_ms) == 1
        assert isinstance(await new_leader.advance(config, version), Finish)
        config, version, pmap, chain = await read(second)
        assert config.repartition["phase"] == "done" and config.repartition["done"] is True
        assert config.repartition["error"] is None and new_leader.steps == 1
        # the deposed leader, acting on what it read before, changes nothing
        assert isinstance(await old_leader.advance(*stale), Finish)      # its conditional write fails
        assert await read(second) == (config, version, pmap, chain)
    with_store(tmp_path, body)


def test_a_request_the_previous_code_left_sealed_is_resumed(tmp_path):
    async def body(first, _second):
        heads = FakeHeads()
        heads.drain = True
        legacy = {"id": "old", "op": "split", "requested_ms": NOW_MS - 100, "partition": 0, "at_hash": None,
                  "sealed_ms": NOW_MS - 50}
        await setup_stream(first, legacy, sealed=True)
        leader = driver(first, heads)
        config, version, _, _ = await read(first)
        assert isinstance(await leader.advance(config, version), Commit)
        config, version, pmap, _ = await read(first)
        assert config.repartition["phase"] == "committed" and pmap.entry(0).state is PartitionState.CLOSED
        assert isinstance(await leader.advance(config, version), Finish)
        assert (await read(first))[0].repartition["done"] is True
    with_store(tmp_path, body)


def test_a_head_that_never_drains_fails_the_request_and_unseals_its_parent(tmp_path):
    async def body(first, _second):
        heads = FakeHeads()
        record = {"id": "old", "op": "split", "requested_ms": 1, "partition": 0, "at_hash": None, "sealed_ms": 2}
        await setup_stream(first, record, sealed=True)
        leader = driver(first, heads)
        config, version, _, _ = await read(first)
        action = await leader.advance(config, version)
        assert isinstance(action, Fail) and isinstance(action.error, errors.Timeout)
        config, _, pmap, chain = await read(first)
        assert not chain.sealed and pmap.entry(0).state is PartitionState.OPEN and pmap.version == 0
        assert config.repartition["phase"] == "failed" and config.repartition["error"][0] == "Timeout"
        assert not phases.in_progress(config)
    with_store(tmp_path, body)


def test_opened_after_counts_the_open_partitions_a_request_leaves():
    pmap = PartitionMap.even(3, 1_000)
    assert phases.opened_after({"op": "split", "partition": 0}, pmap) == 4
    assert phases.opened_after({"op": "merge", "partitions": [0, 1]}, pmap) == 2
    assert phases.opened_after({"op": "scale", "target": 7}, pmap) == 7
