"""Unit tests of control.chains.plan: the pure chain reconfiguration rules (DESIGN section 7).

Examples pin each rule of the module docstring (member removal and fencing, restarts,
the all-gone "restored" case, learner drop / promotion / placement, history and
incarnation bookkeeping); hypothesis properties check the invariants of any single
step and that repeated application with stable inputs converges.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from control.chains import LearnerProgress, count_change, failed_members, plan, under_replicated
from sms import limits
from sms.metadata import ChainChange, ChainConfig
from sms.types import Persistence

INC = 1_000          # default incarnation (registration started_ms) of every pinned node
NEW_INC = 2_000      # the incarnation of a restarted process
NOW = 1_700_000_000_000
LAG_OK = limits.LEARNER_PROMOTE_LAG_RECORDS
ACTIONS = {"removed", "restored", "learner dropped", "promoted", "learner"}
GONE = "node is not registered (crashed, paused past its session, or stopped)"
RESTARTED = "node restarted as a new process"


def chain(members, learners=(), *, epoch=7, incarnations=None, history=(),
          persistence=Persistence.DISK) -> ChainConfig:
    """A chain config with every member and learner pinned to INC unless told otherwise."""
    members, learners = tuple(members), tuple(learners)
    if incarnations is None:
        incarnations = {n: INC for n in (*members, *learners)}
    return ChainConfig(chain_id="s:0", stream="s", ordinal=0, epoch=epoch, members=members,
                       persistence=persistence, learners=learners,
                       incarnations=tuple(sorted(incarnations.items())), history=tuple(history))


def alive(*nodes, **restarted) -> dict[str, int]:
    """live map: `nodes` at INC, keyword nodes at the given incarnation."""
    out = {n: INC for n in nodes}
    out.update(restarted)
    return out


def run(config, live, rf=3, load=None, progress=None, counts=None, now=NOW):
    return plan(config, live, rf, Counter(load or {}), progress or {}, now, counts)


def roundtrips(config: ChainConfig) -> bool:
    return ChainConfig.from_bytes(config.to_bytes()) == config


def added_history(old: ChainConfig, new: ChainConfig) -> list[ChainChange]:
    """The entries plan appended (valid while the old history is below the cap)."""
    assert new.history[:len(old.history)] == old.history
    return list(new.history[len(old.history):])


def entries(new: ChainConfig, n: int) -> list[tuple[str, str, str]]:
    return [(c.action, c.node, c.reason) for c in new.history[-n:]]


# ---------------------------------------------------------------------------------------
# failed_members


def test_failed_members_reports_missing_and_restarted_nodes_with_reasons():
    config = chain(["a", "b", "c"], ["l1", "l2"])
    live = alive("a", "l1", b=NEW_INC)
    assert failed_members(config, live) == {"b": RESTARTED, "c": GONE, "l2": GONE}


def test_failed_members_unpinned_live_node_is_not_failed():
    config = chain(["a", "b"], ["l"], incarnations={"a": INC})
    assert failed_members(config, alive("a", b=5, l=9)) == {}
    assert failed_members(config, alive("a")) == {"b": GONE, "l": GONE}


def test_failed_members_ignores_nodes_outside_the_chain():
    assert failed_members(chain(["a"]), alive("a", x=NEW_INC)) == {}


# ---------------------------------------------------------------------------------------
# Rule 1: a gone or restarted member is removed, the epoch rises


@pytest.mark.parametrize("gone, remaining", [
    ("a", ("b", "c")),      # head: its successor becomes head
    ("b", ("a", "c")),      # middle: predecessor ships to successor
    ("c", ("a", "b")),      # tail: predecessor becomes tail
], ids=["head", "middle", "tail"])
def test_member_gone_is_removed_with_new_epoch(gone, remaining):
    config = chain(["a", "b", "c"], epoch=7)
    live = alive(*(n for n in "abc" if n != gone), "x")
    new = run(config, live)
    assert new is not None
    assert new.members == remaining
    assert new.epoch == 8
    assert new.learners == ()
    assert new.head == remaining[0] and new.tail == remaining[-1]
    assert added_history(config, new) == [ChainChange(8, NOW, "removed", gone, GONE)]
    assert dict(new.incarnations) == {n: INC for n in remaining}
    assert roundtrips(new)


def test_removal_does_not_add_learners_in_the_same_step():
    # a spare live node exists, but the removal is a step of its own
    new = run(chain(["a", "b", "c"]), alive("a", "b", "spare"))
    assert new.members == ("a", "b") and new.learners == ()


@pytest.mark.parametrize("position", [0, 1, 2])
def test_restarted_member_is_treated_as_failed(position):
    members = ("a", "b", "c")
    node = members[position]
    live = alive(*members)
    live[node] = NEW_INC
    config = chain(members)
    new = run(config, live)
    assert new.members == tuple(m for m in members if m != node)
    assert new.epoch == config.epoch + 1
    assert added_history(config, new) == [ChainChange(config.epoch + 1, NOW, "removed", node, RESTARTED)]
    # the new process is not pinned to the old one's place
    assert node not in dict(new.incarnations)
    assert roundtrips(new)


def test_restarted_member_can_rejoin_later_as_a_learner():
    config = chain(["a", "b", "c"])
    live = alive("a", "c", b=NEW_INC)
    step1 = run(config, live)
    assert step1.members == ("a", "c")
    step2 = run(step1, live)
    assert step2.members == ("a", "c") and step2.learners == ("b",)
    assert step2.epoch == step1.epoch
    assert step2.incarnation_of("b") == NEW_INC


def test_unpinned_live_member_is_kept_and_gets_pinned():
    config = chain(["a", "b", "c"], incarnations={"a": INC, "c": INC})
    new = run(config, {"a": INC, "b": 42})
    assert new.members == ("a", "b")
    assert dict(new.incarnations) == {"a": INC, "b": 42}


def test_several_members_fail_at_once_one_epoch_step():
    config = chain(["a", "b", "c", "d", "e"], epoch=3)
    live = alive("a", "c", "e", d=NEW_INC)
    new = run(config, live, rf=5)
    assert new.members == ("a", "c", "e")
    assert new.epoch == 4
    assert added_history(config, new) == [
        ChainChange(4, NOW, "removed", "b", GONE),
        ChainChange(4, NOW, "removed", "d", RESTARTED),
    ]
    assert dict(new.incarnations) == {"a": INC, "c": INC, "e": INC}
    assert roundtrips(new)


def test_head_and_tail_fail_at_once_leaves_the_middle_alone():
    config = chain(["a", "b", "c"])
    new = run(config, alive("b"))
    assert new.members == ("b",)
    assert new.role_of("b") == "head+tail"
    assert [c.node for c in added_history(config, new)] == ["a", "c"]


def test_member_removal_also_drops_gone_learners_and_keeps_live_ones():
    config = chain(["a", "b", "c"], ["l1", "l2", "l3"], epoch=10)
    live = alive("a", "c", "l1", "l3")
    new = run(config, live, rf=6)
    assert new.members == ("a", "c")
    assert new.learners == ("l1", "l3")
    assert new.epoch == 11
    assert added_history(config, new) == [
        ChainChange(11, NOW, "removed", "b", GONE),
        ChainChange(11, NOW, "learner dropped", "l2", GONE),
    ]
    assert dict(new.incarnations) == {n: INC for n in ("a", "c", "l1", "l3")}
    assert roundtrips(new)


def test_member_removal_takes_precedence_over_promotion():
    config = chain(["a", "b", "c"], ["l"], epoch=1)
    progress = {"l": LearnerProgress(verified=True, lag_records=0)}
    new = run(config, alive("a", "b", "l"), progress=progress)
    assert new.epoch == 2                    # exactly one epoch step
    assert new.members == ("a", "b") and new.learners == ("l",)
    after = run(new, alive("a", "b", "l"), progress=progress)
    assert after.members == ("a", "b", "l") and after.epoch == 3


# ---------------------------------------------------------------------------------------
# Rule 2: every member gone


def test_every_member_gone_and_none_back_is_no_change():
    config = chain(["a", "b", "c"], ["l"])
    assert run(config, alive("l", "x", "y")) is None
    assert run(config, {}) is None


def test_every_member_gone_none_back_gone_learner_is_kept():
    # Documents current behaviour: rule 2 ("nothing is removed") wins over rule 3 while no
    # member is back; the gone learner is dropped in the step that restores a member.
    config = chain(["a"], ["l"])
    assert run(config, alive("x")) is None
    new = run(config, alive("x", a=NEW_INC))
    assert new.members == ("a",) and new.learners == ()
    assert [c.action for c in added_history(config, new)] == ["restored", "learner dropped"]


def test_members_coming_back_are_restored_in_old_order_with_new_incarnations():
    config = chain(["a", "b", "c", "d"], epoch=20)
    # all four fail (b and d crashed, a and c restarted); then a and c (but not b, d) are back
    live = {"c": NEW_INC, "a": NEW_INC + 1, "x": INC}
    new = run(config, live, rf=4)
    assert new is not None
    assert new.members == ("a", "c")                 # old order, not live-dict order
    assert new.epoch == 21
    assert dict(new.incarnations) == {"a": NEW_INC + 1, "c": NEW_INC}
    reason = "every member had failed; its log is the only copy"
    left_out = ("not back within 10 s of the other members after every member had failed: "
                f"{GONE}; it may rejoin as a learner")
    assert added_history(config, new) == [
        ChainChange(21, NOW, "restored", "a", reason),
        ChainChange(21, NOW, "restored", "c", reason),
        ChainChange(21, NOW, "removed", "b", left_out),
        ChainChange(21, NOW, "removed", "d", left_out),
    ]
    assert roundtrips(new)
    # the restored config is stable: the new incarnations are not failures any more
    assert failed_members(new, live) == {}


def test_only_tail_back_is_restored_alone():
    config = chain(["a", "b", "c"])
    new = run(config, {"c": NEW_INC})
    assert new.members == ("c",)
    assert [(c.action, c.node) for c in added_history(config, new)] == [
        ("restored", "c"), ("removed", "a"), ("removed", "b")]


def test_every_member_restarted_keeps_members_but_raises_epoch():
    # members unchanged but the epoch rises: the new processes must fence the old ones
    config = chain(["a", "b"], epoch=5)
    new = run(config, {"a": NEW_INC, "b": NEW_INC})
    assert new.members == ("a", "b")
    assert new.epoch == 6
    assert dict(new.incarnations) == {"a": NEW_INC, "b": NEW_INC}


def test_restore_drops_gone_learners_keeps_live_ones():
    config = chain(["a", "b"], ["l1", "l2"], epoch=2)
    new = run(config, {"b": NEW_INC, "l1": INC})
    assert new.members == ("b",)
    assert new.learners == ("l1",)
    assert new.epoch == 3
    assert [(c.action, c.node, c.epoch) for c in added_history(config, new)] == [
        ("restored", "b", 3), ("removed", "a", 3), ("learner dropped", "l2", 3)]
    assert dict(new.incarnations) == {"b": NEW_INC, "l1": INC}


WAIT = limits.CHAIN_RESTORE_WAIT_MS


def test_a_whole_cluster_restart_restores_every_member_as_they_register_one_by_one():
    """The chain manager of a restarted cluster sees its storage nodes register one after
    another: the first back is not restored alone (the others would have to copy the chain
    again, or find no place when no other node can take it); every member is taken back,
    in its old order, once all are back."""
    config = chain(["n2", "n3", "n4"], epoch=9)
    first = NOW - 1_500                   # the first node back started 1.5 s ago
    draining = frozenset({"n1"})          # (a drain under way when the cluster stopped)
    steps = [{"n1": first, "n3": first + 100},
             {"n1": first, "n3": first + 100, "n2": first + 300},
             {"n1": first, "n3": first + 100, "n2": first + 300, "n4": first + 900}]
    got = [plan(config, live, 3, Counter(), {}, NOW, draining=draining) for live in steps]
    assert got[:2] == [None, None]
    new = got[2]
    assert new.members == ("n2", "n3", "n4") and new.epoch == 10 and not new.learners
    assert dict(new.incarnations) == {"n2": first + 300, "n3": first + 100, "n4": first + 900}
    assert [(c.action, c.node) for c in added_history(config, new)] == [
        ("restored", "n2"), ("restored", "n3"), ("restored", "n4")]
    assert plan(new, steps[2], 3, Counter(), {}, NOW, draining=draining) is None     # whole: nothing more


def test_members_not_back_in_time_are_left_out_and_may_rejoin_as_learners():
    config = chain(["a", "b", "c"], epoch=4)
    first = NOW - 2_000
    live = {"a": first, "b": first + 50, "x": INC}
    assert run(config, live) is None                             # c may be back in a moment
    assert run(config, live, now=first + WAIT - 1) is None
    new = run(config, live, now=first + WAIT)
    assert new.members == ("a", "b") and new.epoch == 5 and new.learners == ()
    assert entries(new, 1) == [("removed", "c", f"not back within {WAIT / 1000:g} s of the other members after "
                                                 f"every member had failed: {GONE}; it may rejoin as a learner")]
    # c registers later, holding nothing now: the least loaded, it is the learner
    live = {**live, "c": first + WAIT + 500}
    learner = run(new, live, load={"a": 3, "b": 3, "c": 2, "x": 3}, now=first + WAIT + 600)
    assert learner.learners == ("c",) and learner.members == ("a", "b") and learner.epoch == 5


@pytest.mark.parametrize("started", [NOW + WAIT, NOW - WAIT, NOW - 10 * WAIT])
def test_a_restore_does_not_wait_on_a_clock_far_off_or_once_the_wait_is_over(started):
    config = chain(["a", "b", "c"])
    new = run(config, {"b": started})
    assert new.members == ("b",)


def test_under_replicated_counts_members_on_registered_nodes():
    assert not under_replicated(("a", "b", "c"), 3)
    assert under_replicated(("a", "b"), 3)
    assert under_replicated(("a", "b", "c"), 3, {"a", "b"})
    assert not under_replicated(("a", "b", "c"), 3, {"a", "b", "c", "d"})
    assert not under_replicated(("a",), 1, {"a"})

# ---------------------------------------------------------------------------------------
# Rule 3: gone learners are dropped without an epoch change


def test_gone_learner_is_dropped_without_epoch_change():
    config = chain(["a", "b"], ["l1", "l2"], epoch=9)
    new = run(config, alive("a", "b", "l2"))
    assert new.epoch == 9
    assert new.members == ("a", "b")
    assert new.learners == ("l2",)
    assert added_history(config, new) == [ChainChange(9, NOW, "learner dropped", "l1", GONE)]
    assert dict(new.incarnations) == {"a": INC, "b": INC, "l2": INC}
    assert roundtrips(new)


def test_restarted_learner_is_dropped():
    config = chain(["a", "b"], ["l"])
    new = run(config, alive("a", "b", l=NEW_INC))
    assert new.learners == () and new.epoch == config.epoch
    assert added_history(config, new) == [ChainChange(config.epoch, NOW, "learner dropped", "l", RESTARTED)]
    assert "l" not in dict(new.incarnations)


def test_several_learners_dropped_at_once():
    config = chain(["a"], ["l1", "l2", "l3"])
    new = run(config, alive("a", "l2"), rf=4)
    assert new.learners == ("l2",)
    assert [c.node for c in added_history(config, new)] == ["l1", "l3"]


def test_learner_drop_takes_precedence_over_promotion_and_placement():
    config = chain(["a"], ["l1", "l2"])
    progress = {"l2": LearnerProgress(verified=True, lag_records=0)}
    new = run(config, alive("a", "l2", "x"), progress=progress)
    assert new.members == ("a",) and new.learners == ("l2",)
    assert [c.action for c in added_history(config, new)] == ["learner dropped"]


# ---------------------------------------------------------------------------------------
# Rule 4: promotion


@pytest.mark.parametrize("lag", [0, 1, LAG_OK - 1, LAG_OK])
def test_verified_learner_within_lag_is_promoted_as_tail(lag):
    config = chain(["a", "b"], ["l"], epoch=4)
    new = run(config, alive("a", "b", "l"), progress={"l": LearnerProgress(True, lag)})
    assert new.members == ("a", "b", "l")
    assert new.tail == "l"
    assert new.learners == ()
    assert new.epoch == 5
    assert dict(new.incarnations) == {"a": INC, "b": INC, "l": INC}
    [change] = added_history(config, new)
    assert (change.epoch, change.at_ms, change.action, change.node) == (5, NOW, "promoted", "l")
    assert str(lag) in change.reason
    assert roundtrips(new)


@pytest.mark.parametrize("progress", [
    {},                                                     # manager learned nothing
    {"l": LearnerProgress(False, 0)},                       # not verified
    {"l": LearnerProgress(True, LAG_OK + 1)},               # too far behind
    {"l": LearnerProgress(False, LAG_OK + 1)},
    {"other": LearnerProgress(True, 0)},                    # progress of a non-learner
], ids=["none", "unverified", "lagging", "both", "other"])
def test_learner_not_promoted_unless_verified_and_close(progress):
    config = chain(["a", "b"], ["l"])
    assert run(config, alive("a", "b", "l", "x"), progress=progress) is None


def test_only_one_learner_promoted_per_step_in_learner_order():
    config = chain(["a"], ["l1", "l2", "l3"], epoch=1)
    progress = {n: LearnerProgress(True, 0) for n in ("l2", "l3")}
    live = alive("a", "l1", "l2", "l3")
    step1 = run(config, live, rf=4, progress=progress)
    assert step1.members == ("a", "l2") and step1.learners == ("l1", "l3") and step1.epoch == 2
    step2 = run(step1, live, rf=4, progress=progress)
    assert step2.members == ("a", "l2", "l3") and step2.learners == ("l1",) and step2.epoch == 3
    assert run(step2, live, rf=4, progress=progress) is None


def test_promotion_takes_precedence_over_adding_learners():
    config = chain(["a"], ["l"])
    live = alive("a", "l", "x", "y")
    progress = {"l": LearnerProgress(True, 10)}
    step1 = run(config, live, progress=progress)
    assert step1.members == ("a", "l") and step1.learners == ()
    step2 = run(step1, live, progress=progress)
    assert step2.members == ("a", "l") and step2.learners == ("x",)
    assert step2.epoch == step1.epoch


def test_promotion_keeps_the_replica_count():
    config = chain(["a", "b"], ["l"])
    new = run(config, alive("a", "b", "l"), progress={"l": LearnerProgress(True, 0)})
    assert len(new.members) + len(new.learners) == 3


# ---------------------------------------------------------------------------------------
# Rule 5: learners added up to the replication factor


def test_least_loaded_live_non_holder_added_as_learner():
    config = chain(["a", "b"], epoch=6)
    live = alive("a", "b", "x", "y", "z")
    load = {"a": 0, "b": 0, "x": 5, "y": 2, "z": 3}
    new = run(config, live, rf=3, load=load)
    assert new.learners == ("y",)
    assert new.members == ("a", "b")
    assert new.epoch == 6                        # learners are outside the commit path
    [change] = added_history(config, new)
    assert (change.epoch, change.at_ms, change.action, change.node) == (6, NOW, "learner", "y")
    assert "3" in change.reason
    assert dict(new.incarnations) == {"a": INC, "b": INC, "y": INC}
    assert roundtrips(new)


def test_learners_fill_every_missing_slot_in_load_then_name_order():
    config = chain(["a"])
    live = alive("a", "w", "x", "y", "z")
    new = run(config, live, rf=4, load={"w": 1, "x": 0, "y": 0, "z": 0})
    assert new.learners == ("x", "y", "z")
    assert [c.node for c in added_history(config, new)] == ["x", "y", "z"]


def test_learners_counted_towards_replication_factor():
    config = chain(["a"], ["l"])
    new = run(config, alive("a", "l", "x", "y"), rf=3)
    assert new.learners == ("l", "x")
    assert run(new, alive("a", "l", "x", "y"), rf=3) is None


def test_holders_never_become_candidates_even_when_least_loaded():
    config = chain(["a", "b"], ["l"])
    live = alive("a", "b", "l", "x")
    new = run(config, live, rf=4, load={"a": 0, "b": 0, "l": 0, "x": 99})
    assert new.learners == ("l", "x")


def test_fewer_candidates_than_missing_adds_what_exists():
    config = chain(["a"])
    new = run(config, alive("a", "x"), rf=5)
    assert new.learners == ("x",)
    assert run(new, alive("a", "x"), rf=5) is None


def test_learners_per_node_cap_is_respected():
    config = chain(["a"])
    live = alive("a", "busy", "ok")
    counts = {"busy": limits.LEARNERS_PER_NODE_MAX, "ok": limits.LEARNERS_PER_NODE_MAX - 1}
    new = run(config, live, rf=3, load={"busy": 0, "ok": 50}, counts=Counter(counts))
    assert new.learners == ("ok",)
    # only capped nodes left: nothing to add
    assert run(config, alive("a", "busy"), rf=3, counts=Counter(busy=limits.LEARNERS_PER_NODE_MAX)) is None


def test_learner_counts_default_is_no_cap():
    new = plan(chain(["a"]), alive("a", "x"), 2, Counter(), {}, NOW)
    assert new.learners == ("x",)


def test_no_candidates_is_no_change():
    assert run(chain(["a", "b"]), alive("a", "b"), rf=3) is None


# ---------------------------------------------------------------------------------------
# No change


@pytest.mark.parametrize("members, learners, rf", [
    (("a", "b", "c"), (), 3),
    (("a", "b"), ("c",), 3),
    (("a",), (), 1),
])
def test_healthy_chain_is_no_change(members, learners, rf):
    config = chain(members, learners)
    assert run(config, alive("a", "b", "c", "x", "y"), rf=rf) is None


def test_plan_is_deterministic_and_does_not_touch_its_inputs():
    config = chain(["a", "b", "c"], ["l"])
    live = alive("a", "c", "l", "x")
    load = Counter(x=1)
    progress = {"l": LearnerProgress(True, 0)}
    counts = Counter(l=1)
    first = plan(config, live, 3, load, progress, NOW, counts)
    second = plan(config, live, 3, load, progress, NOW, counts)
    assert first == second
    assert config == chain(["a", "b", "c"], ["l"])
    assert live == alive("a", "c", "l", "x") and load == Counter(x=1) and counts == Counter(l=1)


# ---------------------------------------------------------------------------------------
# History


def _history(n: int) -> tuple[ChainChange, ...]:
    return tuple(ChainChange(i, i, "created", f"n{i}", "old") for i in range(n))


def test_history_is_appended_to_the_existing_entries():
    old = _history(3)
    new = run(chain(["a", "b"], history=old), alive("a"), now=123)
    assert new.history[:3] == old
    assert new.history[3] == ChainChange(8, 123, "removed", "b", GONE)


@pytest.mark.parametrize("existing", [limits.CHAIN_HISTORY_MAX - 1, limits.CHAIN_HISTORY_MAX,
                                      limits.CHAIN_HISTORY_MAX + 3])
def test_history_is_capped_keeping_the_newest(existing):
    old = _history(existing)
    config = chain(["a", "b", "c"], history=old)
    new = run(config, alive("a"))          # two removals
    assert len(new.history) == min(existing + 2, limits.CHAIN_HISTORY_MAX)
    assert new.history == (*old, *new.history[-2:])[-limits.CHAIN_HISTORY_MAX:]
    assert entries(new, 2) == [("removed", "b", GONE), ("removed", "c", GONE)]
    assert roundtrips(new)


def test_history_cap_with_more_changes_than_the_cap_in_one_step():
    n = limits.CHAIN_HISTORY_MAX + 2
    members = [f"m{i:02d}" for i in range(n + 1)]
    config = chain(members, history=_history(4))
    new = run(config, alive(members[0]), rf=1)
    assert new.members == (members[0],)
    assert len(new.history) == limits.CHAIN_HISTORY_MAX
    assert [c.node for c in new.history] == members[-limits.CHAIN_HISTORY_MAX:]


# ---------------------------------------------------------------------------------------
# Serialization


@pytest.mark.parametrize("persistence", list(Persistence))
def test_output_roundtrips_for_every_persistence(persistence):
    config = chain(["a", "b"], ["l"], persistence=persistence, history=_history(2))
    new = run(config, alive("a", "l", "x"))
    assert new.persistence is persistence
    assert roundtrips(new)


# ---------------------------------------------------------------------------------------
# Properties

UNIVERSE = [f"n{i}" for i in range(8)]


@st.composite
def scenarios(draw):
    """A chain with every holder pinned, a live map (some holders gone, some restarted),
    placement inputs and learner progress."""
    nodes = draw(st.permutations(UNIVERSE))
    n_members = draw(st.integers(1, limits.REPLICATION_FACTOR_MAX), label="members")
    n_learners = draw(st.integers(0, 3), label="learners")
    members = tuple(nodes[:n_members])
    learners = tuple(nodes[n_members:n_members + n_learners])
    pinned = {n: draw(st.integers(1, 50), label=f"inc {n}") for n in (*members, *learners)}
    history = tuple(ChainChange(i, i, "created", f"n{i % 8}", "") for i in
                    range(draw(st.integers(0, limits.CHAIN_HISTORY_MAX + 1), label="history")))
    config = ChainConfig(chain_id="s:3", stream="s", ordinal=3,
                         epoch=draw(st.integers(0, 1_000), label="epoch"), members=members,
                         persistence=draw(st.sampled_from(list(Persistence))), learners=learners,
                         incarnations=tuple(sorted(pinned.items())), history=history)
    live = {}
    for n in UNIVERSE:
        state = draw(st.sampled_from(["same", "same", "same", "gone", "restarted"]), label=f"state {n}")
        if state == "gone":
            continue
        live[n] = pinned.get(n, 1) + (100 if state == "restarted" else 0)
    rf = draw(st.integers(1, limits.REPLICATION_FACTOR_MAX), label="rf")
    load = Counter({n: draw(st.integers(0, 20), label=f"load {n}") for n in UNIVERSE})
    counts = Counter({n: draw(st.integers(0, limits.LEARNERS_PER_NODE_MAX + 1), label=f"lc {n}")
                      for n in UNIVERSE})
    progress = {}
    for n in UNIVERSE:      # progress may name any node: promotion only ever reads learners'
        if draw(st.booleans(), label=f"has progress {n}"):
            progress[n] = LearnerProgress(
                verified=draw(st.booleans(), label=f"verified {n}"),
                lag_records=draw(st.sampled_from([0, 1, LAG_OK - 1, LAG_OK, LAG_OK + 1, 10 * LAG_OK]),
                                 label=f"lag {n}"))
    return config, live, rf, load, progress, counts


def _healthy(config: ChainConfig, live: dict[str, int]) -> set[str]:
    """Members that are live in the same incarnation (or live and unpinned)."""
    return {m for m in config.members
            if m in live and config.incarnation_of(m) in (None, live[m])}


def _member_incarnations(config: ChainConfig) -> tuple:
    return tuple((m, config.incarnation_of(m)) for m in config.members)


def _is_subsequence(short: tuple, long: tuple) -> bool:
    it = iter(long)
    return all(x in it for x in short)


def check_step(old: ChainConfig, live: dict[str, int], rf: int, load: Counter,
               progress: dict, counts: Counter, new: ChainConfig | None) -> None:
    """Every invariant of one plan step."""
    failed = failed_members(old, live)
    if new is None:
        # no change only when nothing is left to do
        if any(m in failed for m in old.members):
            assert all(m in failed for m in old.members), "a failed member was left in place"
            assert not any(m in live for m in old.members), "a returned member was not restored"
            return
        assert not any(n in failed for n in old.learners), "a gone learner was not dropped"
        assert not any(progress.get(n) and progress[n].verified
                       and progress[n].lag_records <= LAG_OK for n in old.learners), "promotion missed"
        if len(old.members) + len(old.learners) < rf:
            assert not [n for n in live if not old.holds(n) and counts[n] < limits.LEARNERS_PER_NODE_MAX]
        return

    # no duplicates, no node in both roles, never empty
    assert len(set(new.members)) == len(new.members)
    assert len(set(new.learners)) == len(new.learners)
    assert not set(new.members) & set(new.learners)
    assert new.members
    # epoch: never lower, rises by exactly one, and exactly when the commit path changes
    assert new.epoch in (old.epoch, old.epoch + 1)
    members_changed = new.members != old.members or _member_incarnations(new) != _member_incarnations(old)
    assert (new.epoch == old.epoch + 1) == members_changed
    if new.epoch == old.epoch + 1 and new.members == old.members:
        # only the all-restarted "restored" case raises the epoch with the same members
        assert all(failed.get(m) == "node restarted as a new process" for m in old.members)
    # healthy members are never removed, except those beyond rf once no learner copies
    # (rule 6: exactly down to rf); survivors keep their order
    trimmed = not failed and not old.learners and len(old.members) > rf
    if trimmed:
        assert len(new.members) == rf and set(new.members) < set(old.members) and not new.learners
    else:
        assert _healthy(old, live) <= set(new.members)
    survivors = tuple(m for m in new.members if m in old.members)
    assert _is_subsequence(survivors, old.members)
    joined = [m for m in new.members if m not in old.members]
    assert joined in ([], [new.members[-1]]), "only a promoted learner joins, and as the tail"
    if joined:
        assert joined[0] in old.learners
        p = progress[joined[0]]
        assert p.verified and p.lag_records <= LAG_OK
    # every holder is live and pinned to its live incarnation
    for n in (*new.members, *new.learners):
        assert n in live
        assert new.incarnation_of(n) == live[n]
    assert all(n not in failed for n in new.learners)
    # new learners: live non-holders under the per-node cap, only up to rf
    fresh = [n for n in new.learners if n not in old.learners]
    for n in fresh:
        assert not old.holds(n) and counts[n] < limits.LEARNERS_PER_NODE_MAX
    if fresh:
        assert len(new.members) + len(new.learners) <= rf
        assert new.epoch == old.epoch and new.members == old.members
        skipped = [n for n in live if not old.holds(n) and n not in fresh
                   and counts[n] < limits.LEARNERS_PER_NODE_MAX]
        assert all((load[s], s) > (load[f], f) for s in skipped for f in fresh), "not least loaded"
    assert len(new.members) + len(new.learners) <= max(rf, len(old.members) + len(old.learners))
    # history: the old entries, then at least one new one, capped
    assert 1 <= len(new.history) <= limits.CHAIN_HISTORY_MAX
    added = [c for c in new.history if c not in old.history]    # old entries are all "created"
    assert added, "a change without a history entry"
    assert new.history == (*old.history, *added)[-limits.CHAIN_HISTORY_MAX:]
    for c in added:
        assert c.action in ACTIONS and c.at_ms == NOW and c.epoch == new.epoch and c.reason
    # the config survives the metadata store
    assert ChainConfig.from_bytes(new.to_bytes()) == new
    # the other fields are untouched
    assert (new.chain_id, new.stream, new.ordinal, new.persistence) == \
        (old.chain_id, old.stream, old.ordinal, old.persistence)


@settings(max_examples=1_000)
@given(scenarios())
def test_property_single_step_invariants(scenario):
    config, live, rf, load, progress, counts = scenario
    new = plan(config, live, rf, load, progress, NOW, counts)
    check_step(config, live, rf, load, progress, counts, new)


@settings(max_examples=500)
@given(scenarios())
def test_property_repeated_application_converges(scenario):
    config, live, rf, load, progress, counts = scenario
    # at most one failure step, then each node is promoted or added at most once
    bound = 1 + 2 * len(UNIVERSE)
    steps = 0
    current = config
    epochs = [config.epoch]
    while True:
        new = plan(current, live, rf, load, progress, NOW, counts)
        check_step(current, live, rf, load, progress, counts, new)
        if new is None:
            break
        steps += 1
        assert steps <= bound, f"plan did not converge within {bound} steps"
        current = new
        epochs.append(new.epoch)
    assert epochs == sorted(epochs)
    if steps:
        # the fixpoint is stable and sane: no holder failed, replication restored as far as possible
        assert failed_members(current, live) == {}
        total = len(current.members) + len(current.learners)
        if total < rf:
            assert not [n for n in live if not current.holds(n)
                        and counts[n] < limits.LEARNERS_PER_NODE_MAX]
        # every healthy member of the start survived, in order (rule 6 trims those beyond rf)
        healthy = tuple(m for m in config.members if m in _healthy(config, live))
        if len(healthy) + len(config.learners) <= rf:
            assert _is_subsequence(healthy, current.members)
        else:
            kept = tuple(m for m in current.members if m in healthy)
            assert _is_subsequence(kept, healthy) and len(current.members) >= min(rf, len(healthy))


# --- rules 6 and 7: moves onto new nodes and off draining ones --------------------------

def test_a_draining_member_gets_a_replacement_learner_on_the_least_loaded_node():
    config = chain(["a", "b", "c"])
    new = plan(config, alive("a", "b", "c", "d", "e"), 3, Counter(a=4, b=4, c=4, d=2, e=1), {}, NOW,
               draining=frozenset({"a"}), move=True)
    assert new.learners == ("e",) and new.members == config.members and new.epoch == config.epoch
    assert "draining" in new.history[-1].reason


def test_no_move_without_the_budget_or_without_a_target():
    config = chain(["a", "b", "c"])
    assert plan(config, alive("a", "b", "c", "d"), 3, Counter(a=9, b=9, c=9), {}, NOW,
                draining=frozenset({"a"}), move=False) is None
    # the only other node is draining too
    assert plan(config, alive("a", "b", "c", "d"), 3, Counter(), {}, NOW,
                draining=frozenset({"a", "d"}), move=True) is None


@pytest.mark.parametrize("donor_load, receiver_load, moves", [(5, 0, True), (3, 1, True), (3, 2, False), (2, 2, False)])
def test_a_move_needs_an_imbalance(donor_load, receiver_load, moves):
    config = chain(["a", "b", "c"])
    load = Counter(a=donor_load, b=1, c=1, d=receiver_load)
    new = plan(config, alive("a", "b", "c", "d"), 3, load, {}, NOW, move=True)
    assert (new is not None) == moves
    if moves:
        assert new.learners == ("d",) and "rebalancing: replaces a" in new.history[-1].reason


def test_a_sealed_chain_moves_only_off_a_draining_node():
    config = dataclasses.replace(chain(["a", "b", "c"]), sealed=True)
    assert plan(config, alive("a", "b", "c", "d"), 3, Counter(a=9), {}, NOW, move=True) is None
    assert plan(config, alive("a", "b", "c", "d"), 3, Counter(), {}, NOW,
                draining=frozenset({"b"}), move=True).learners == ("d",)


def test_after_the_learner_joins_the_replaced_member_leaves_with_a_new_epoch():
    config = chain(["a", "b", "c", "d"])            # d just joined as tail
    new = plan(config, alive("a", "b", "c", "d"), 3, Counter(a=2, b=2, c=2, d=1), {}, NOW,
               draining=frozenset({"c"}))
    assert new.members == ("a", "b", "d") and new.epoch == config.epoch + 1
    assert dict(new.incarnations) == {"a": INC, "b": INC, "d": INC}
    assert new.history[-1].action == "removed" and "draining" in new.history[-1].reason
    # without a draining node: the most loaded goes; among equals a middle member, not the new tail
    assert plan(config, alive("a", "b", "c", "d"), 3, Counter(a=5, b=3, c=3, d=1), {}, NOW).members == ("b", "c", "d")
    assert plan(config, alive("a", "b", "c", "d"), 3, Counter(a=3, b=3, c=3, d=3), {}, NOW).members == ("a", "c", "d")


def _settle(configs: list[ChainConfig], live: dict[str, int], rf: int, draining=frozenset(),
            budget: int = limits.REBALANCE_MOVES_MAX, rounds: int = 500) -> list[ChainConfig]:
    """Manager rounds over `configs` with learners that catch up at once, as
    control/manager.py runs them (load updated as changes are made, a move budget)."""
    for r in range(rounds):
        now = NOW + r * limits.REBALANCE_SETTLE_MS          # each round after the last change settled
        load = Counter({n: 0 for n in live})
        learning, heads = Counter(), Counter()
        for c in configs:
            load.update(c.members)
            load.update(c.learners)
            learning.update(c.learners)
            heads[c.handoff or c.head] += 1
        moves = budget - sum(1 for c in configs if len(c.members) + len(c.learners) > rf or c.handoff)
        changed = False
        out = []
        for c in configs:
            progress = {n: LearnerProgress(True, 0) for n in c.learners}
            new = plan(c, live, rf, load, progress, now, learning, None, draining, move=moves > 0,
                       heads=heads, handoff_ready=True)
            if new is None:
                out.append(c)
                continue
            assert len(new.members) >= rf, "a move dropped a chain below its replication factor"
            if not c.learners and new.learners or new.handoff and not c.handoff:
                moves -= 1
            if new.handoff and not c.handoff:
                heads[c.head] -= 1
                heads[new.handoff] += 1
            count_change(load, learning, c, new)
            changed = True
            out.append(new)
        configs = out
        if not changed:
            return configs
    raise AssertionError("moves did not settle")


def _replicas(configs) -> Counter:
    return Counter(n for c in configs for n in c.members)


@pytest.mark.parametrize("nodes, added, chains", [(3, 1, 12), (3, 3, 40), (4, 1, 7), (5, 2, 64)])
def test_a_new_node_takes_its_share_and_moves_settle(nodes, added, chains):
    from control.placement import place
    old = [f"n{i}" for i in range(nodes)]
    configs = [dataclasses.replace(chain(m), chain_id=f"s:{i}", ordinal=i)
               for i, m in enumerate(place(old, chains, 3))]
    live = alive(*old, *(f"m{i}" for i in range(added)))
    final = _settle(configs, live, 3)
    counts = _replicas(final)
    assert all(len(c.members) == 3 and not c.learners for c in final)
    assert max(counts[n] for n in live) - min(counts[n] for n in live) < limits.REBALANCE_IMBALANCE_MIN
    assert all(counts[f"m{i}"] > 0 for i in range(added))
    heads = Counter(c.head for c in final)
    assert max(heads[n] for n in live) - min(heads[n] for n in live) < limits.HEAD_IMBALANCE_MIN + 1
    assert all(heads[f"m{i}"] > 0 for i in range(added)) or chains < len(live)


def test_draining_empties_the_node_and_keeps_every_chain_whole():
    from control.placement import place
    old = ["a", "b", "c", "d"]
    configs = [dataclasses.replace(chain(m), chain_id=f"s:{i}", ordinal=i) for i, m in enumerate(place(old, 10, 3))]
    final = _settle(configs, alive(*old), 3, draining=frozenset({"b"}))
    assert _replicas(final)["b"] == 0 and all(len(c.members) == 3 for c in final)


# --- rule 8: head handoff ----------------------------------------------------------------

def _start(config=None, heads=None, **kw):
    config = config or chain(["a", "b", "c"])
    return plan(config, alive("a", "b", "c"), 3, Counter(a=3, b=3, c=3), {}, NOW,
                heads=Counter(heads or {"a": 5, "b": 1, "c": 3}), move=True, **kw)


def test_a_head_on_a_node_heading_more_chains_hands_over_to_the_member_heading_fewest():
    new = _start()
    assert new.handoff == "b" and new.members == ("a", "b", "c") and new.epoch == 8
    assert new.history[-1].action == "head handoff"
    assert ChainConfig.from_bytes(new.to_bytes()) == new


@pytest.mark.parametrize("why", ["balanced", "no budget", "sealed", "draining target"])
def test_no_handoff(why):
    if why == "balanced":
        assert _start(heads={"a": 2, "b": 1, "c": 1}) is None
    elif why == "no budget":
        assert plan(chain(["a", "b", "c"]), alive("a", "b", "c"), 3, Counter(), {}, NOW,
                    heads=Counter(a=9), move=False) is None
    elif why == "sealed":
        assert _start(dataclasses.replace(chain(["a", "b", "c"]), sealed=True)) is None
    else:
        new = _start(draining=frozenset({"b"}))
        assert new is not None and new.handoff == "c"          # b is draining: not b


def test_the_handoff_completes_when_ready_and_is_called_off_when_late_or_gone():
    started = _start()
    live = alive("a", "b", "c")
    # not ready yet: nothing changes, not even a promotion or a move
    assert plan(started, live, 3, Counter(), {}, NOW + 100, move=True) is None
    done = plan(started, live, 3, Counter(), {}, NOW + 100, handoff_ready=True)
    assert done.members == ("b", "a", "c") and done.handoff == "" and done.epoch == started.epoch + 1
    assert done.history[-1].action == "head moved"
    late = plan(started, live, 3, Counter(), {}, NOW + limits.HANDOFF_TIMEOUT_MS)
    assert late.members == started.members and late.handoff == "" and late.epoch == started.epoch + 1
    assert late.history[-1].action == "head handoff called off"
    # the head fails meanwhile: rule 1 removes it and calls the handoff off
    failed = plan(started, alive("b", "c"), 3, Counter(), {}, NOW + 100)
    assert failed.members == ("b", "c") and failed.handoff == ""


def test_a_chain_changed_lately_is_not_moved_for_balance_but_is_drained():
    recent = chain(["a", "b", "c"], history=[ChainChange(7, NOW - 1, "created", "a", "test")])
    load = Counter(a=9, b=9, c=9, d=0)
    assert plan(recent, alive("a", "b", "c", "d"), 3, load, {}, NOW, move=True, heads=Counter(a=9)) is None
    later = NOW - 1 + limits.REBALANCE_SETTLE_MS
    assert plan(recent, alive("a", "b", "c", "d"), 3, load, {}, later, move=True).learners == ("d",)
    assert plan(recent, alive("a", "b", "c", "d"), 3, load, {}, NOW, move=True,
                draining=frozenset({"a"})).learners == ("d",)


# --- the round's other decisions: learner progress from reports, running counts -------------------

def _report(role, epoch=7, last_sn=100, records=50, verified=True, gated=()):
    from kernel.rpc import ReplicaReport
    return ReplicaReport("s:0", epoch, role, records, verified, last_sn, last_sn, tuple(gated), False, False)


def test_learner_progress_trusts_only_a_learner_of_this_epoch_that_the_tail_gates():
    from control.chains import learner_progress
    config = chain(["a", "b"], ["c", "d", "e", "f"])
    reports = {"b": _report("tail", records=80, gated=("c", "d")),
               "c": _report("learner", records=80),                 # gated, caught up: promotable
               "d": _report("learner", records=30, verified=False),  # gated, not verified at its hello
               "e": _report("learner", epoch=6, records=80),         # not yet at this epoch: no progress
               "f": _report("member", records=80)}                   # an old role: no progress
    assert learner_progress(config, reports) == {
        "c": LearnerProgress(verified=True, lag_records=0),
        "d": LearnerProgress(verified=False, lag_records=50)}
    ungated = {**reports, "b": _report("tail", records=80)}
    assert learner_progress(config, ungated)["c"] == LearnerProgress(verified=False, lag_records=0)
    ahead = {**reports, "c": _report("learner", last_sn=101, records=81)}   # holds more than the tail
    assert "c" not in learner_progress(config, ahead)
    assert learner_progress(config, {k: v for k, v in reports.items() if k != "b"}) == {}   # tail silent


def test_count_change_moves_load_and_learning_as_a_round_goes_on():
    old, new = chain(["a", "b"], ["c"]), chain(["a", "c"], ["d"])
    load, learning = Counter({"a": 1, "b": 1, "c": 1}), Counter({"c": 1})
    count_change(load, learning, old, new)
    assert load == Counter({"a": 1, "b": 0, "c": 1, "d": 1}) and learning == Counter({"c": 1, "d": 1})
