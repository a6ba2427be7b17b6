"""Repartition requests as typed values, the phases they pass through, and the pure
function that decides each request's next action (docs/repartition-phases.md).

No I/O and no clock here: the driver (`control.repartition.Repartitioner`) reads the
metadata store and the parents' heads, passes what it saw and the time in (`Facts`),
executes the `Action` that `decide` returns, and records the phase the action leads to
in the stream config (`RepartitionState.after`, `config_after`).

Phases of one request (stored as `StreamConfig.repartition["phase"]`):

    REQUESTED --Seal--> SEALED --Commit--> COMMITTED --Seal--> SEALED --Commit--> ...
                        |    ^                                  (a scale: one pass per step)
                        +----+ Seal again (a parent found unsealed), Wait (heads drain)

    REQUESTED | SEALED | COMMITTED --Finish (no step left)--> DONE
    REQUESTED | SEALED | COMMITTED --Fail (error; unseal the open parents)--> FAILED

- REQUESTED: recorded (admin or automatic split); nothing sealed for it yet.
- SEALED: the current step's parents are sealed (`ChainConfig.sealed`, written in the
  same conditional commit as the phase, with `sealed_ms`); their heads are draining.
  Whether a head has drained is observed each round (`ProbeHeads`), never recorded: a
  drain is valid only for the chain config whose head reported it, which the commit
  checks.
- COMMITTED: a step's map, the children's chains and `steps_done + 1` were committed
  together; a scale has its next step still to seal.
- DONE / FAILED: ended (`done`, `done_ms`, `error`); FAILED unseals the open parents in
  the same commit.

The stored record keeps the keys that the code before this module wrote and read (`op`,
`partition`/`partitions`/`target`, `sealed_ms`, `steps_done`, `done`, `error`): admin
calls, clients (`StreamInfo.repartition`) and the fault trials read them, and a record
written before `phase` existed is read by deriving the phase from them (they win when an
older control process advanced a request without updating `phase`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from control import placement
from sms import errors, limits, seqno
from sms.errors import SmsError
from sms.metadata import ChainChange, ChainConfig, StreamConfig, chain_id
from sms.partition_map import PartitionMap
from sms.types import PartitionState

DAY_MS = 24 * 3600 * 1000


class Kind(str, enum.Enum):
    SPLIT = "split"
    MERGE = "merge"
    SCALE = "scale"


class Phase(str, enum.Enum):
    REQUESTED = "requested"     # recorded; nothing sealed for it yet
    SEALED = "sealed"           # the current step's parents sealed; their heads drain
    COMMITTED = "committed"     # a step committed; the next one (if any) not sealed yet
    DONE = "done"               # every step committed
    FAILED = "failed"           # ended with an error; the open parents unsealed

    @property
    def ended(self) -> bool:
        return self in (Phase.DONE, Phase.FAILED)


# every phase change an action can make (an action that changes nothing stays put)
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.REQUESTED: frozenset({Phase.SEALED, Phase.DONE, Phase.FAILED}),
    Phase.SEALED: frozenset({Phase.SEALED, Phase.COMMITTED, Phase.DONE, Phase.FAILED}),
    Phase.COMMITTED: frozenset({Phase.SEALED, Phase.DONE, Phase.FAILED}),
    Phase.DONE: frozenset(),
    Phase.FAILED: frozenset(),
}


# --- the request ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RepartitionRequest:
    """What was asked: split one partition (at a hash, or its middle), merge two adjacent
    ones, or scale the stream to `target` even ranges (a sequence of splits and merges)."""

    id: str
    kind: Kind
    parents: tuple[int, ...] = ()      # split: (p,); merge: (a, b) as asked; scale: ()
    target: int = 0                    # scale only
    at_hash: int | None = None         # split only; None: the middle of the range
    requested_ms: int = 0
    auto: bool = False                 # a split the leader asked for (a hot partition)

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        object.__setattr__(self, "parents", tuple(int(o) for o in self.parents))
        want = {Kind.SPLIT: 1, Kind.MERGE: 2, Kind.SCALE: 0}[self.kind]
        if len(self.parents) != want:
            raise errors.InvalidArgument(f"a {self.kind.value} names {want} partitions; {len(self.parents)} given")
        if self.at_hash is not None and self.kind is not Kind.SPLIT:
            raise errors.InvalidArgument(f"a {self.kind.value} has no split point")

    @classmethod
    def split(cls, id: str, partition: int, at_hash: int | None = None, *, requested_ms: int = 0,
              auto: bool = False) -> "RepartitionRequest":
        return cls(id, Kind.SPLIT, (partition,), at_hash=at_hash, requested_ms=requested_ms, auto=auto)

    @classmethod
    def merge(cls, id: str, a: int, b: int, *, requested_ms: int = 0) -> "RepartitionRequest":
        return cls(id, Kind.MERGE, (a, b), requested_ms=requested_ms)

    @classmethod
    def scale(cls, id: str, target: int, *, requested_ms: int = 0) -> "RepartitionRequest":
        return cls(id, Kind.SCALE, target=target, requested_ms=requested_ms)

    def to_fields(self) -> dict:
        """The request's part of the stored record (the keys written before phases existed)."""
        d: dict = {"id": self.id, "op": self.kind.value, "requested_ms": self.requested_ms}
        if self.kind is Kind.SPLIT:
            d["partition"] = self.parents[0]
            d["at_hash"] = None if self.at_hash is None else str(self.at_hash)
        elif self.kind is Kind.MERGE:
            d["partitions"] = list(self.parents)
        else:
            d["target"] = self.target
        if self.auto:
            d["auto"] = True
        return d

    @classmethod
    def from_fields(cls, d: Mapping) -> "RepartitionRequest":
        op = d.get("op")
        if op not in {k.value for k in Kind}:
            raise errors.InvalidArgument(f"repartition op {op!r}; expected split, merge or scale")
        kind = Kind(op)
        common = {"id": str(d.get("id", "")), "requested_ms": int(d.get("requested_ms", 0) or 0)}
        try:
            if kind is Kind.SPLIT:
                at = d.get("at_hash")
                return cls(kind=kind, parents=(int(d["partition"]),), at_hash=None if at is None else int(at),
                           auto=bool(d.get("auto", False)), **common)
            if kind is Kind.MERGE:
                return cls(kind=kind, parents=tuple(int(o) for o in d["partitions"]), **common)
            return cls(kind=kind, target=int(d["target"]), **common)
        except (KeyError, TypeError, ValueError) as e:
            raise errors.InvalidArgument(f"repartition {op} request {dict(d)!r}: {e}") from None

    def record(self) -> dict:
        """The record a new request is stored as (phase REQUESTED)."""
        return RepartitionState(self).to_record()

    def describe(self) -> str:
        if self.kind is Kind.SPLIT:
            return f"split of p{self.parents[0]:04d}"
        if self.kind is Kind.MERGE:
            return f"merge of p{self.parents[0]:04d} and p{self.parents[1]:04d}"
        return f"scale to {self.target}"


# --- the request's recorded progress ----------------------------------------------------------
_KNOWN_KEYS = frozenset({"id", "op", "requested_ms", "partition", "at_hash", "partitions", "target", "auto",
                         "phase", "steps_done", "sealed_ms", "done", "done_ms", "error"})


def derived_phase(record: Mapping) -> Phase:
    """The phase the keys written before `phase` existed imply."""
    if record.get("done"):
        return Phase.FAILED if record.get("error") else Phase.DONE
    if record.get("sealed_ms") is not None:
        return Phase.SEALED
    if record.get("steps_done", 0):
        return Phase.COMMITTED
    return Phase.REQUESTED


def recorded_phase(record: Mapping | None) -> Phase | None:
    """The phase of a stored record, old form or new (None: no request recorded). The
    legacy keys win over a `phase` that disagrees: an older control process advanced the
    request without knowing the field."""
    if not record:
        return None
    derived = derived_phase(record)
    try:
        stored = Phase(record["phase"])
    except (KeyError, ValueError):
        return derived
    return stored if stored is derived else derived


@dataclass(frozen=True)
class RepartitionState:
    """A request and where it is: what the stream config records (`to_record`)."""

    request: RepartitionRequest
    phase: Phase = Phase.REQUESTED
    steps_done: int = 0
    sealed_ms: int | None = None                  # SEALED: when the current step's parents were sealed
    done_ms: int | None = None                    # DONE / FAILED
    error: tuple[str, str] | None = None          # FAILED: (error name, message)
    extra: tuple[tuple[str, Any], ...] = ()       # keys of a newer version, kept as read

    @classmethod
    def from_record(cls, record: Mapping) -> "RepartitionState":
        phase = recorded_phase(record)
        error = record.get("error")
        return cls(request=RepartitionRequest.from_fields(record), phase=phase,
                   steps_done=int(record.get("steps_done", 0) or 0),
                   sealed_ms=int(record["sealed_ms"]) if phase is Phase.SEALED else None,
                   done_ms=(int(record.get("done_ms") or 0) if phase.ended else None),
                   error=(str(error[0]), str(error[1])) if phase is Phase.FAILED else None,
                   extra=tuple((k, v) for k, v in record.items() if k not in _KNOWN_KEYS))

    def to_record(self) -> dict:
        d = self.request.to_fields()
        d["phase"] = self.phase.value
        d["steps_done"] = self.steps_done
        if self.phase is Phase.SEALED:
            d["sealed_ms"] = self.sealed_ms
        if self.phase.ended:
            d["done"] = True
            d["done_ms"] = self.done_ms
            d["error"] = None if self.error is None else list(self.error)
        for k, v in self.extra:
            d.setdefault(k, v)
        return d

    def after(self, action: "Action") -> "RepartitionState":
        """The state the action leads to once its commit succeeds."""
        if isinstance(action, Seal):
            return replace(self, phase=Phase.SEALED, sealed_ms=action.at_ms)
        if isinstance(action, Commit):
            return replace(self, phase=Phase.COMMITTED, sealed_ms=None, steps_done=self.steps_done + 1)
        if isinstance(action, Finish):
            return replace(self, phase=Phase.DONE, sealed_ms=None, done_ms=action.at_ms, error=None)
        if isinstance(action, Fail):
            return replace(self, phase=Phase.FAILED, sealed_ms=None, done_ms=action.at_ms,
                           error=(action.error.name, action.error.message))
        return self


def in_progress(config: StreamConfig) -> bool:
    phase = recorded_phase(config.repartition)
    return phase is not None and not phase.ended


def recent_repartitions(config: StreamConfig, now_ms: int) -> tuple[int, ...]:
    return tuple(t for t in config.repartitions_ms if t > now_ms - DAY_MS)


# --- steps ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One split or merge: one new map version."""

    kind: Kind                          # SPLIT or MERGE
    parents: tuple[int, ...]
    at_hash: int | None = None

    @classmethod
    def of(cls, step: tuple) -> "Step":
        """From PartitionMap.next_scale_step's ("split", o, at) / ("merge", a, b)."""
        if step[0] == "split":
            return cls(Kind.SPLIT, (step[1],), step[2])
        return cls(Kind.MERGE, (step[1], step[2]))

    def apply(self, pmap: PartitionMap, boundary_ms: int, endings: Mapping[int, int]) -> PartitionMap:
        if self.kind is Kind.SPLIT:
            return pmap.split(self.parents[0], self.at_hash, boundary_ms, endings[self.parents[0]])
        return pmap.merge(self.parents[0], self.parents[1], boundary_ms, dict(endings))

    def describe(self) -> str:
        if self.kind is Kind.SPLIT:
            return f"split of p{self.parents[0]:04d}"
        return f"merge of p{self.parents[0]:04d} and p{self.parents[1]:04d}"


def next_step(request: RepartitionRequest, pmap: PartitionMap) -> Step | None:
    """The next split or merge the request needs, or None once it is done."""
    if request.kind is Kind.SPLIT:
        e = pmap.entry(request.parents[0])
        if e.state is not PartitionState.OPEN:
            return None
        return Step(Kind.SPLIT, (e.ordinal,), request.at_hash)
    if request.kind is Kind.MERGE:
        a, b = (pmap.entry(o) for o in request.parents)
        if a.state is not PartitionState.OPEN or b.state is not PartitionState.OPEN:
            return None
        return Step(Kind.MERGE, (a.ordinal, b.ordinal))
    step = pmap.next_scale_step(request.target)
    return None if step is None else Step.of(step)


def steps_needed(request: RepartitionRequest, pmap: PartitionMap) -> int:
    """How many splits and merges the request takes (a scale is planned on a copy)."""
    steps = 0
    while (step := next_step(request, pmap)) is not None:
        steps += 1
        pmap = step.apply(pmap, 0, {o: 0 for o in step.parents})
        if request.kind is not Kind.SCALE:
            break
    return steps


def opened_after(request: RepartitionRequest | Mapping, pmap: PartitionMap) -> int:
    """How many open partitions the stream has once the request is done."""
    if not isinstance(request, RepartitionRequest):
        request = RepartitionRequest.from_fields(request)
    opened = len(pmap.open_entries())
    if request.kind is Kind.SCALE:
        return request.target
    return opened + 1 if request.kind is Kind.SPLIT else opened - 1


def check_request(config: StreamConfig, pmap: PartitionMap, request: RepartitionRequest | Mapping,
                  now_ms: int) -> int:
    """Named errors for a request that cannot be done; the number of steps it takes."""
    if in_progress(config):
        raise errors.RepartitionInProgress(
            f"stream {config.name!r} is being repartitioned ({config.repartition.get('op')}); retry when it is done")
    if not isinstance(request, RepartitionRequest):
        request = RepartitionRequest.from_fields(request)
    if request.kind is Kind.SPLIT:
        pmap.check_split(request.parents[0], request.at_hash)
    elif request.kind is Kind.MERGE:
        pmap.check_merge(*request.parents)
    else:
        pmap.next_scale_step(request.target)     # range check
    steps = steps_needed(request, pmap)
    recent = len(recent_repartitions(config, now_ms))
    if recent + steps > limits.REPARTITIONS_PER_DAY_MAX:
        raise errors.RescaleTooSoon(f"stream {config.name!r}: {recent} splits and merges in the last day, this "
                                    f"request needs {steps}; at most {limits.REPARTITIONS_PER_DAY_MAX} a day")
    return steps


def parents_of(request: RepartitionRequest, pmap: PartitionMap) -> tuple[int, ...]:
    """The partitions a request may have sealed (a scale: any open one)."""
    if request.kind is Kind.SCALE:
        return tuple(e.ordinal for e in pmap.open_entries())
    return request.parents


# --- what the driver observed -----------------------------------------------------------------
@dataclass(frozen=True)
class HeadReport:
    """One replica's state as its node reports it (NodeStatus)."""

    chain_id: str
    epoch: int
    role: str
    sealed: bool
    last_sn: int
    committed_sn: int


def ending_of(chain: ChainConfig, reports: tuple[HeadReport, ...]) -> int | None:
    """The parent's ending SN: the last SN of its head once the head runs the chain's
    epoch, has applied the seal, appends nothing and has committed all it holds."""
    for r in reports:
        if r.chain_id == chain.chain_id and r.epoch == chain.epoch and r.role.startswith("head") \
                and r.sealed and r.last_sn == r.committed_sn:
            return r.last_sn
    return None


@dataclass(frozen=True)
class Facts:
    """What the driver saw this round; a field left None was not observed yet (`decide`
    asks for it with an `Observe` action)."""

    config: StreamConfig
    pmap: PartitionMap
    now_ms: int
    chains: Mapping[int, ChainConfig | None] | None = None     # the step's parents (None: no config)
    heads: Mapping[int, tuple[HeadReport, ...]] | None = None  # what each parent's head reports
    nodes: Mapping[str, int] | None = None                     # live storage node -> its started_ms
    replicas: Mapping[str, int] = field(default_factory=dict)  # replicas per node (unsealed chains)
    head_load: Mapping[str, int] = field(default_factory=dict)  # heads per node (unsealed chains)


# --- actions ----------------------------------------------------------------------------------
class Action:
    """What the driver does next. `phase` is where a successful commit of it leads (None:
    the phase does not change)."""

    phase: ClassVar[Phase | None] = None


class Observe(Action):
    """Read more facts, then decide again (no write)."""


@dataclass(frozen=True)
class ReadChains(Observe):
    ordinals: tuple[int, ...]


@dataclass(frozen=True)
class ProbeHeads(Observe):
    ordinals: tuple[int, ...]


@dataclass(frozen=True)
class ReadNodes(Observe):
    """Live storage nodes and the chain load, to place the children."""


@dataclass(frozen=True)
class Wait(Action):
    """Nothing to write this round (a head still drains, a chain config is missing, the
    request ended)."""

    reason: str


@dataclass(frozen=True)
class Seal(Action):
    """Set `sealed` on these parents' chain configs (conditional on their versions) and
    record SEALED with `sealed_ms` (conditional on the stream config's version). An empty
    `seal` records the phase of parents found sealed already."""

    step: Step
    seal: tuple[int, ...]
    at_ms: int
    phase: ClassVar[Phase] = Phase.SEALED


@dataclass(frozen=True)
class Commit(Action):
    """One conditional commit: the new map, a check that each parent's chain config is the
    one whose head reported its ending SN, the children's chains, COMMITTED."""

    step: Step
    endings: tuple[tuple[int, int], ...]          # (parent ordinal, ending SN)
    boundary_ms: int
    new_map: PartitionMap
    children: tuple[ChainConfig, ...]
    at_ms: int
    phase: ClassVar[Phase] = Phase.COMMITTED


@dataclass(frozen=True)
class Finish(Action):
    """No step left: record DONE (and unseal these open partitions, if sealed)."""

    at_ms: int
    unseal: tuple[int, ...] = ()
    phase: ClassVar[Phase] = Phase.DONE


@dataclass(frozen=True)
class Fail(Action):
    """End the request with the error: record FAILED and, in the same commit, unseal
    these open partitions whose chains are sealed."""

    error: SmsError
    unseal: tuple[int, ...]
    at_ms: int
    phase: ClassVar[Phase] = Phase.FAILED


# --- the decision -----------------------------------------------------------------------------
def _open_only(pmap: PartitionMap, ordinals) -> tuple[int, ...]:
    present = {e.ordinal: e for e in pmap.entries}
    return tuple(o for o in ordinals if o in present and present[o].state is PartitionState.OPEN)


def decide(state: RepartitionState, facts: Facts) -> Action:
    """The next action for the request in its phase, given what was observed. Pure."""
    request, pmap, now_ms = state.request, facts.pmap, facts.now_ms
    if state.phase.ended:
        return Wait(f"the request is {state.phase.value}")
    try:
        step = next_step(request, pmap)
        if step is not None:           # will the step's map be valid? (limits, split point)
            step.apply(pmap, 0, {o: 0 for o in step.parents})
    except (SmsError, KeyError) as e:
        if isinstance(e, KeyError):     # a partition the request names left the map
            e = errors.PartitionNotFound(f"no partition {e.args[0]!r} in the map")
        return Fail(e, _open_only(pmap, parents_of(request, pmap)), now_ms)
    if step is None:
        unseal = _open_only(pmap, parents_of(request, pmap)) if state.phase is Phase.SEALED else ()
        return Finish(now_ms, unseal)
    parents = step.parents
    if facts.chains is None or any(o not in facts.chains for o in parents):
        return ReadChains(parents)
    chains = {o: facts.chains[o] for o in parents}
    missing = [o for o in parents if chains[o] is None]
    if missing:
        return Wait(f"p{missing[0]:04d} has no chain config")
    unsealed = tuple(o for o in parents if not chains[o].sealed)
    if unsealed or state.phase is not Phase.SEALED or state.sealed_ms is None:
        # (parents found sealed without the phase: record it, so the drain timeout runs)
        return Seal(step, unsealed, now_ms)
    if facts.heads is None or any(o not in facts.heads for o in parents):
        return ProbeHeads(parents)
    endings = {}
    for o in parents:
        ending = ending_of(chains[o], tuple(facts.heads[o]))
        if ending is None:
            if now_ms - state.sealed_ms > limits.REPARTITION_DRAIN_TIMEOUT_S * 1000:
                return Fail(errors.Timeout(
                    f"p{o:04d}'s head did not drain within {limits.REPARTITION_DRAIN_TIMEOUT_S:.0f} s (its chain "
                    "has no live head); the partitions are unsealed"), _open_only(pmap, parents), now_ms)
            return Wait(f"p{o:04d}'s head is draining")
        endings[o] = ending
    boundary_ms = max([now_ms] + [seqno.timestamp_ms_of(e) + 1 for e in endings.values() if e])
    try:
        new_map = step.apply(pmap, boundary_ms, endings)
    except SmsError as e:
        return Fail(e, _open_only(pmap, parents), now_ms)
    if facts.nodes is None:
        return ReadNodes()
    born = new_map.entries[len(pmap.entries):]
    try:
        placed = placement.place(list(facts.nodes), len(born), facts.config.replication_factor,
                                 dict(facts.replicas), dict(facts.head_load))
    except SmsError as e:
        return Fail(e, _open_only(pmap, parents), now_ms)
    what = step.describe()
    children = []
    for child, members in zip(born, placed):
        cid = chain_id(facts.config.name, child.ordinal)
        children.append(ChainConfig(
            chain_id=cid, stream=facts.config.name, ordinal=child.ordinal, epoch=1, members=members,
            persistence=facts.config.persistence, from_ms=boundary_ms, min_in_sync=facts.config.min_in_sync,
            incarnations=tuple(sorted((n, facts.nodes[n]) for n in members)),
            history=(ChainChange(1, now_ms, "created", members[0], f"{what}; placed on " + " -> ".join(members)),)))
    return Commit(step, tuple(sorted(endings.items())), boundary_ms, new_map, tuple(children), now_ms)


def config_after(config: StreamConfig, state: RepartitionState, action: Action) -> StreamConfig:
    """The stream config that records the phase the action leads to (a commit also counts
    toward the daily limit)."""
    new = replace(config, repartition=state.after(action).to_record())
    if isinstance(action, Commit):
        recent = recent_repartitions(config, action.at_ms) + (action.at_ms,)
        new = replace(new, repartitions_ms=recent[-limits.REPARTITION_HISTORY_MAX:])
    return new
