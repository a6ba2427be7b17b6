"""Chain reconfiguration rules (DESIGN section 7): pure functions, no I/O.

The chain manager (control/manager.py) gathers the facts -- which nodes are live and in
which incarnation, each chain's config, how far each learner has copied -- and asks
`plan` what the chain's next config is. Rules, in order:

1. A member whose node is gone, or is registered by a new process (a restart), is
   removed and the epoch rises, which fences it: every replica rejects messages of any
   other epoch. Head gone: its successor becomes head. Tail gone: its predecessor
   becomes tail and commits what it holds. Middle gone: its predecessor ships to its
   successor from the successor's last SN. Removal keeps the prefix invariant, because
   each remaining node's successor held a prefix of what it holds.
2. If every member is gone, nothing is removed (there is no other copy); members that
   come back are taken back as they are ("restored"), in their old order. A whole-cluster
   restart brings them back one after another, so the chain waits for the others until
   CHAIN_RESTORE_WAIT_MS after the first one back started (by its incarnation, the
   node's clock: a clock off by more than that restores at once). Restoring the first
   alone would leave the others to copy the chain again, or to no place at all when no
   node can take them. The members not back by then are left out, each "removed" in the
   history; one back later joins as a learner (rule 5) like any node, and its log, if
   a prefix of the tail's, is kept and completed.
3. A learner whose node is gone is dropped.
4. A learner that has verified its log against the tail and copied to within
   LEARNER_PROMOTE_LAG_RECORDS of it joins as the new tail (new epoch).
5. While members + learners are fewer than the replication factor, the least-loaded
   live storage node that holds nothing of the chain joins as a learner: it copies the
   tail's log while writes go on, so replication is restored without stopping them.
6. More members than the replication factor (a moved replica's learner has joined, or
   the factor was lowered): one leaves, with a new epoch that fences it. A draining
   node leaves first, then the member on the most loaded node; among equals a middle
   member, then the head, and the tail (which has just joined) last. The chain never
   drops below its factor.
7. Moves (`move=True`, given while the manager's budget of moves allows): a chain with
   exactly its factor of members and no learner on a draining node takes a learner on
   the least-loaded live node that is not draining; so does a chain with a member on a
   node holding at least REBALANCE_IMBALANCE_MIN more replicas than that node, once the
   chain has not changed for REBALANCE_SETTLE_MS. Rule 4
   promotes it and rule 6 removes the member it replaces: the replication factor never
   falls below its setting, and writes pause only for the epoch switch.
8. Heads (`move=True` too): when a chain's head is on a node heading at least
   HEAD_IMBALANCE_MIN more open chains than another member's node, and the chain has
   not changed for REBALANCE_SETTLE_MS, the head role is handed to that member. It takes two epochs. First `handoff` names the member, and the head
   stops taking new batches (HeadMoving: the ingestion writer resends them later).
   Once the manager sees the head frozen and the member's log equal to the head's
   (`handoff_ready`), every member holds the same log. Any order is then a valid
   chain, so the member becomes head and the others keep their order. A handoff that is
   not ready within HANDOFF_TIMEOUT_MS is called off. A member removal (rule 1) also
   calls it off.

Learner changes do not change the epoch: learners are outside the commit path.

An *incarnation* is a node process's registration started_ms. A config pins each member
and learner to the incarnation that joined, so a restarted process (a new incarnation)
does not act on the old one's place until a rule takes it back: as a restored member
(rule 2), or as a learner (rule 5) once rule 1 removed it.

`under_replicated` says which chains are short of their factor, as `sms status`, `sms up`,
the console and the metrics (`sms_under_replicated_partitions`) count them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sms import limits
from sms.metadata import ChainChange, ChainConfig


@dataclass(frozen=True, slots=True)
class LearnerProgress:
    verified: bool             # its log matched the tail's (or was wiped) at the link's hello
    lag_records: int           # tail's records minus the learner's


def learner_progress(config: ChainConfig, reports: Mapping[str, Any]) -> dict[str, LearnerProgress]:
    """What ChainManager.round tells `plan` of each learner, from the replicas' reports
    (node -> its replica of this chain as NodeStatus reports it, a kernel.rpc.ReplicaReport;
    absent or None: no answer, or no replica there). Only a replica that knows it is this
    chain's learner at the current epoch, and holds no more than the tail, reports progress;
    it is promotable ("verified" in the planner's terms) only once the tail gates its
    commits on it, and then holds every committed batch."""
    tail = reports.get(config.tail)
    progress: dict[str, LearnerProgress] = {}
    if tail is None:
        return progress
    for learner in config.learners:
        mine = reports.get(learner)
        if mine is not None and mine.role == "learner" and mine.epoch == config.epoch \
                and mine.last_sn <= tail.last_sn:
            gated = tail.epoch == config.epoch and learner in tail.gated_learners
            progress[learner] = LearnerProgress(verified=mine.verified and gated,
                                                lag_records=tail.records - mine.records)
    return progress


def count_change(load: Counter, learning: Counter, old: ChainConfig, new: ChainConfig) -> None:
    """A round's running counts after it changed one chain: each node's places (`load`, as
    placement counts them) and the chains it is learning (`learning`), so that the chains
    planned after it see them."""
    for n in set(new.members) | set(new.learners):
        if not old.holds(n):
            load[n] += 1
    for n in set(old.members) | set(old.learners):
        if not new.holds(n):
            load[n] -= 1
    for n in set(new.learners) - set(old.learners):
        learning[n] += 1


def failed_members(config: ChainConfig, live: dict[str, int], down: dict[str, str] | None = None) -> dict[str, str]:
    """Members and learners that are gone, with the reason (`down`: why a node that is
    not in `live` is known to have failed, when there is more to say than its session)."""
    out = {}
    for node in (*config.members, *config.learners):
        incarnation = config.incarnation_of(node)
        if node not in live:
            out[node] = (down or {}).get(node) or "node is not registered (crashed, paused past its session, or stopped)"
        elif incarnation is not None and live[node] != incarnation:
            out[node] = "node restarted as a new process"
    return out


RESTORED = "every member had failed; its log is the only copy"


def restore_waits(config: ChainConfig, live: dict[str, int], now_ms: int) -> bool:
    """Rule 2's wait: every member failed, some are back but not all, and the first one
    back started less than CHAIN_RESTORE_WAIT_MS ago (its incarnation is its clock's: one
    further off than that, ahead or behind, does not wait)."""
    back = [live[m] for m in config.members if m in live]
    if not back or len(back) == len(config.members):
        return False
    return abs(now_ms - min(back)) < limits.CHAIN_RESTORE_WAIT_MS


def under_replicated(members, replication_factor: int, registered=None) -> bool:
    """A chain short of its replication factor: fewer members than the factor, counting
    only members on `registered` nodes when given (learners still copying do not count).
    `sms status`, `sms up`, the console and the metrics all count this way."""
    held = [m for m in members if registered is None or m in registered]
    return len(held) < replication_factor


def _change(config: ChainConfig, epoch: int, now_ms: int, action: str, node: str, reason: str) -> ChainConfig:
    history = (*config.history, ChainChange(epoch, now_ms, action, node, reason))
    return replace(config, history=history[-limits.CHAIN_HISTORY_MAX:])


def _incarnations(config: ChainConfig, live: dict[str, int], keep: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    inc = {n: live[n] for n in keep if n in live}
    return tuple(sorted(inc.items()))


def plan(config: ChainConfig, live: dict[str, int], replication_factor: int, load: Counter,
         progress: dict[str, LearnerProgress], now_ms: int,
         learner_counts: Counter | None = None, down: dict[str, str] | None = None,
         draining: frozenset[str] = frozenset(), move: bool = False, heads: Counter | None = None,
         handoff_ready: bool = False) -> ChainConfig | None:
    """The chain's next config, or None when it needs no change.

    live: storage node id -> incarnation (registration started_ms) of every live node.
    load: replicas (members + learners) per node over all chains, for placement.
    progress: what the manager learned of each learner of this chain.
    down: reasons for nodes known to have failed (not in `live`), for the history.
    draining: live nodes being emptied (`sms node drain`): they take no new replica.
    move: whether this chain may start a move (rules 7 and 8) this round.
    heads: chains headed per node, for rule 8.
    handoff_ready: the head is frozen and the handoff's member holds the same log (rule 8)."""
    new = config
    failed = failed_members(config, live, down)
    gone_members = [m for m in config.members if m in failed]
    if gone_members:
        survivors = tuple(m for m in config.members if m not in failed)
        epoch = config.epoch + 1
        if survivors:
            new = replace(new, epoch=epoch, members=survivors, handoff="")
            for m in gone_members:
                new = _change(new, epoch, now_ms, "removed", m, failed[m])
        else:
            back = tuple(m for m in config.members if m in live)
            if not back or restore_waits(config, live, now_ms):
                return None      # no copy anywhere, or the others may be back in a moment: wait
            new = replace(new, epoch=epoch, members=back, handoff="")
            for m in back:
                new = _change(new, epoch, now_ms, "restored", m, RESTORED)
            for m in config.members:
                if m not in back:
                    new = _change(new, epoch, now_ms, "removed", m,
                                  f"not back within {limits.CHAIN_RESTORE_WAIT_MS / 1000:g} s of the other members "
                                  f"after every member had failed: {failed[m]}; it may rejoin as a learner")
        keep = tuple(n for n in new.members if n in live)
        new = replace(new, learners=tuple(n for n in new.learners if n not in failed),
                      incarnations=_incarnations(new, live, keep + tuple(n for n in new.learners if n not in failed)))
        for n in config.learners:
            if n in failed:
                new = _change(new, new.epoch, now_ms, "learner dropped", n, failed[n])
        return new
    gone_learners = [n for n in config.learners if n in failed]
    if gone_learners:
        new = replace(new, learners=tuple(n for n in config.learners if n not in failed))
        new = replace(new, incarnations=_incarnations(new, live, new.members + new.learners))
        for n in gone_learners:
            new = _change(new, new.epoch, now_ms, "learner dropped", n, failed[n])
        return new
    if config.handoff:
        return _handoff(config, now_ms, handoff_ready)
    for learner in config.learners:
        p = progress.get(learner)
        if p is not None and p.verified and p.lag_records <= limits.LEARNER_PROMOTE_LAG_RECORDS:
            epoch = config.epoch + 1
            new = replace(config, epoch=epoch, members=(*config.members, learner),
                          learners=tuple(n for n in config.learners if n != learner))
            return _change(new, epoch, now_ms, "promoted", learner,
                           f"copied to within {p.lag_records} records of the tail; joins as tail")
    if len(config.members) > replication_factor and not config.learners:
        return _remove_extra(config, replication_factor, load, draining, now_ms)
    missing = replication_factor - len(config.members) - len(config.learners)
    counts = learner_counts or Counter()
    if missing <= 0:
        if not move or missing:
            return None
        return (_move(config, live, replication_factor, load, draining, counts, now_ms)
                or _start_handoff(config, heads or Counter(), draining, now_ms))
    candidates = sorted((n for n in live if not config.holds(n) and n not in draining
                         and counts[n] < limits.LEARNERS_PER_NODE_MAX),
                        key=lambda n: (load[n], n))
    if not candidates:
        return None
    added = tuple(candidates[:missing])
    new = replace(config, learners=(*config.learners, *added))
    new = replace(new, incarnations=_incarnations(new, live, new.members + new.learners))
    for n in added:
        new = _change(new, new.epoch, now_ms, "learner", n,
                      f"restoring replication factor {replication_factor}; copies the tail's log")
    return new


def _remove_extra(config: ChainConfig, replication_factor: int, load: Counter, draining: frozenset[str],
                  now_ms: int) -> ChainConfig:
    """Rule 6: the members beyond the replication factor leave (draining ones first, then
    the most loaded; the tail only when nothing else is as loaded)."""
    extra = len(config.members) - replication_factor
    # among equals a middle member goes first: no head switch, and not the tail just joined
    order = sorted(config.members, key=lambda n: (n not in draining, -load[n], n == config.tail, n == config.head, n))
    leaving = set(order[:extra])
    epoch = config.epoch + 1
    members = tuple(m for m in config.members if m not in leaving)
    new = replace(config, epoch=epoch, members=members,
                  incarnations=tuple((n, i) for n, i in config.incarnations if n not in leaving))
    for n in order[:extra]:
        why = ("the node is draining" if n in draining
               else f"its replica moved to a less loaded node ({load[n]} replicas on {n})")
        new = _change(new, epoch, now_ms, "removed", n,
                      f"{why}; the chain keeps replication factor {replication_factor}")
    return new


def settled(config: ChainConfig, now_ms: int) -> bool:
    """No change to the chain for REBALANCE_SETTLE_MS: a chain just created, moved or
    repaired is not moved again for balance (a burst of new streams, or a move that has
    just finished, would otherwise make churn)."""
    last = max((c.at_ms for c in config.history), default=0)
    return now_ms - last >= limits.REBALANCE_SETTLE_MS


def imbalance(donor_load: int, receiver_load: int) -> bool:
    """Whether moving one replica from a node with `donor_load` replicas to one with
    `receiver_load` makes the cluster more even (never a swap back and forth)."""
    return donor_load - receiver_load >= limits.REBALANCE_IMBALANCE_MIN


def _move(config: ChainConfig, live: dict[str, int], replication_factor: int, load: Counter,
          draining: frozenset[str], counts: Counter, now_ms: int) -> ChainConfig | None:
    """Rule 7: a learner that will replace a member on a draining or overloaded node."""
    if config.learners:
        return None
    candidates = [n for n in live if not config.holds(n) and n not in draining
                  and counts[n] < limits.LEARNERS_PER_NODE_MAX]
    if not candidates:
        return None
    receiver = min(candidates, key=lambda n: (load[n], n))
    leaving = [m for m in config.members if m in draining]
    if leaving:
        reason = f"replaces {leaving[0]}, which is draining; copies the tail's log"
    elif config.sealed:
        return None       # a partition being split or merged (or closed) moves only off a draining node
    elif not settled(config, now_ms):
        return None
    else:
        donor = max(config.members, key=lambda n: (load[n], n != config.tail, n))
        if not imbalance(load[donor], load[receiver]):
            return None
        # (no replica counts: a stream's history is shown to its tenant; the cluster's
        # load is for its administrators, `sms node list`)
        reason = f"rebalancing: replaces {donor} on {receiver}, which holds fewer replicas; copies the tail's log"
    new = replace(config, learners=(receiver,))
    new = replace(new, incarnations=_incarnations(new, live, new.members + new.learners))
    return _change(new, new.epoch, now_ms, "learner", receiver, reason)


HANDOFF_ACTION = "head handoff"
# the chain changes that are the cluster working as meant (logged at INFO; the others, a member
# removed or a learner dropped, are failures and logged at WARNING)
ROUTINE_ACTIONS = frozenset({"created", "learner", "promoted", "restored", HANDOFF_ACTION, "head moved"})


def _start_handoff(config: ChainConfig, heads: Counter, draining: frozenset[str], now_ms: int) -> ChainConfig | None:
    """Rule 8, first step: name the member that takes the head role over."""
    if config.sealed or config.learners or len(config.members) < 2 or not settled(config, now_ms):
        return None
    head = config.head
    target = min((m for m in config.members[1:] if m not in draining), key=lambda m: (heads[m], m), default=None)
    if target is None or heads[head] - heads[target] < limits.HEAD_IMBALANCE_MIN:
        return None
    epoch = config.epoch + 1
    new = replace(config, epoch=epoch, handoff=target)
    return _change(new, epoch, now_ms, HANDOFF_ACTION, target,
                   f"{head} heads {heads[head]} chains, {target} {heads[target]}: {head} takes no new batch "
                   f"until {target} holds its log, then {target} becomes head")


def _handoff(config: ChainConfig, now_ms: int, ready: bool) -> ChainConfig | None:
    """Rule 8, second step: the named member becomes head once it holds the head's log;
    called off if that takes longer than HANDOFF_TIMEOUT_MS or the member has gone."""
    target = config.handoff
    epoch = config.epoch + 1
    if target in config.members[1:] and ready:
        members = (target, *(m for m in config.members if m != target))
        new = replace(config, epoch=epoch, members=members, handoff="")
        return _change(new, epoch, now_ms, "head moved", target,
                       f"took over from {config.head}: every member held the same log")
    started = max((c.at_ms for c in config.history if c.action == HANDOFF_ACTION and c.node == target), default=0)
    if target in config.members[1:] and now_ms - started < limits.HANDOFF_TIMEOUT_MS:
        return None
    new = replace(config, epoch=epoch, handoff="")
    return _change(new, epoch, now_ms, "head handoff called off", target,
                   f"{target} did not catch up with the head within {limits.HANDOFF_TIMEOUT_MS} ms"
                   if target in config.members else f"{target} is no longer a member")
