"""Deterministic simulation of the chain replication protocol (DESIGN sections 5 and 7).

The REAL protocol objects run here: `storage.replica.Replica` over `storage.log.LogStore`
(memory logs), the chain link's state machines (`storage.link.Sender` and `Receiver`)
and their driver (storage/linkdriver.py), the same code the gRPC binding runs,
`control.chains.plan` for every reconfiguration and `storage.service.plan_sync`
(StorageNode.sync's decision, the incarnation rule in it). What is simulated is everything
between them: the network, the processes, the clocks and the control loop. One asyncio
loop runs one event at a time, and a `random.Random(seed)` picks which event happens next, so a seed
replays exactly (`run(seed, steps)`; two runs of one seed give the same trace).

What a step can be (each enabled event has a weight; the seed picks one):

* the link protocol (storage/link.py): each link's real `Sender` and, per stream, the
  successor's real `Receiver`; the simulation only carries their messages (hello, answer,
  reset, verified, batches, acks, refusals, end of stream); their actions (`Replica.apply`
  for store, reset, verified, commit, learner progress) are carried out by the real driver
  (storage/linkdriver.py, which PeerLink and IncomingLinks run too) over the simulation's
  transports (`SimLink`, `SimReceiverEnd`). Events: a link's stream opens (`connect`), a
  message is delivered, the successor's handler polls its replica (acks), the link polls
  its replica (ships batches), and a link's timer fires -- which moves the simulated clock
  to the timer's deadline (the retry after a break; rarely, a reset's drain timeout). With
  `liveness=True` the senders have their ack bound (LINK_ACK_TIMEOUT_S) and retry a hello
  refused for its epoch after LINK_STALE_RETRY_S, and a link that
  waits for an answer may go *silent*: the clock moves to its ack deadline and the sender
  breaks the link as unresponsive (a paused or cut-off successor, as the chain manager
  would then hear of it); off by default, so the pinned seeds replay as they were found.
* a stream is FIFO and exactly-once while it lives (gRPC over TCP). Faults on it:
  *drop* (the connection breaks, everything in flight is lost), *reorder* (it breaks, but
  the request the successor had already taken in is still applied by the old stream's
  handler later, interleaved with the next session's messages: the handler only learns of
  the cancellation at a later step), *duplicate* (a message is delivered twice to its
  handler, which must be harmless, and is processed by the same code path the service
  would use). A broken stream is reconnected with a new hello.
* an ingestion writer (mirror of ingestion/writer.py `PartitionWriter` and the service's
  `Append` handler): batches built with `wire.build_batch` and an origin (id, seq), sent
  over an append stream to the head it resolved (`append_as_head(epoch, batch)`), at most
  APPEND_INFLIGHT_BATCHES_MAX in flight; acked, in request order, once the head replica's
  committed_sn reaches the batch's last SN; on StaleEpoch/PartitionClosed or a broken
  stream it re-resolves the head from its (lagging) view of the config and resends every
  batch in flight. A batch is *acked* when that ack is given; acked batches are recorded
  (origin seq -> SN range and checksum).
* crash (the process dies: replicas, links and streams gone; in the `durable` variant its
  log survives, with the commit watermark a durable store would have written with its last
  append; in the `memory` variant the log is gone too) and restart (a new incarnation that
  recovers its logs and registers again); pause (the process stops: its registration
  expires, it acts on nothing, its streams hold) and resume (it registers again with the
  SAME incarnation, as node/server.py `reregister` does, and carries on from its stale
  state until it syncs).
* a chain manager round (control/manager.py `ChainManager.round`: the simulation gives it
  the live nodes and the load; what it decides is the round's own code:
  `chains.learner_progress` from the replicas' reports, `chains.plan` and
  `chains.count_change` over every chain), and per node a
  config sync (storage/service.py `StorageNode.sync`'s own decision, `plan_sync`: close,
  open or reconfigure the replica, restart links when epoch or membership changed). Nodes and the writer see a
  new config only when their sync/refresh event fires, so stale epochs happen.

Invariants, checked after EVERY step (a violation raises `SimViolation` with the seed,
the replay command and the last events of the trace):

  I1  prefix: along the current config, each member's log is a prefix of its
      predecessor's; a learner whose replica says `verified` in the current epoch holds a
      log that is a prefix of the tail's or has the tail's log as its prefix (no
      divergence).
  I2  no acked loss: every acked batch is in the log of at least one current member; no
      current member (and no verified learner) holds anything else where an acked batch
      is (it holds the batch, or its log ends before it); with `strict`, every acked batch
      is in EVERY current member's log.
  I3  on every live replica committed_sn <= last_sn, and a tail (in its own config) has
      committed_sn == last_sn (gated learners aside) -- unless its chain has fewer members
      than min_in_sync, when it commits nothing new at all; a replica's log is its store's
      log; a log's watermark never goes down.
  I4  no batch is stored twice (same origin) in any log.
  I5  SNs strictly increase along every log.
  I6  commits are final: there is one committed history. Every replica's committed prefix
      (its batches up to its committed_sn) is a prefix of, or extends, the longest one seen
      so far, across all nodes and all time.
  I7  an origin seq is never acked at two SN ranges, and the head replica that acks a batch
      holds it in its log (no phantom ack).

At the end of a run (`heal`), faults stop, every node comes back and the simulation runs
fault-free until the chain is whole (RF members, all logs equal, every batch in flight
acked); not converging within `heal_steps` is a liveness violation.

For diagnosis the simulation also records evidence a violation can be attributed with
(tests/sim/test_chain_sim.py `classify`): what each Replica object went through and
whether it outlived a config in which its node had no place (`survived_removal`);
positions of the committed history put at risk by a promotion or by a tail behind the
manager's epoch (`hazards`); resets under live sessions (`splices`); commit watermarks
taken from an ack of another epoch (`cross_acks`); hello checks that passed on a log that
is not a prefix (`false_verifies`); which nodes held each batch when it was first committed
(`commit_copies`) and which crashes lost a log (`log_losses`), which tell a chain degraded
to one member apart from every copy lost. None of it changes what the run does.

Several chains (`chains=N`, `Chain` each) can share the nodes: one sync and one manager
round cover them all, each keeps its own invariants, a node pair's links share one stream
(a fault on it breaks every chain's session) and, with `link_budget`, one `LinkBudget`
(I8: its count of bytes in flight is exact). tests/sim/README.md, "Several chains".

The chain's `min_in_sync` is an option (`min_in_sync=2`; default 1, the product's default):
the head refuses new batches while its chain has fewer members (NotEnoughReplicas, which
the writer, as the real one, fails rather than resends) and its tail commits nothing new.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import sys
from collections import Counter
from dataclasses import dataclass, field, fields, replace

from sortedcontainers import SortedDict, SortedList

from control import chains
from sms import wire, limits, seqno
from sms.errors import InvariantViolation, PartitionClosed, SmsError, WrongOwner
from sms.metadata import ChainConfig
from kernel.rpc import ReplicaReport
from sms.types import Persistence
from storage import link as chainlink
from storage.linkdriver import PENDING, Observer, ReceiverDriver, SenderDriver
from storage.service import link_targets
from storage.log import LogStore, PartitionLog
from storage.replica import Replica, ReplicaState
from storage.service import SyncPlan, plan_sync

CHAIN_ID = "sim:3"
STREAM, ORDINAL = "sim", 3
T0_MS = 1_700_000_000_000
TRACE_TAIL = 30
RESEND_ERRORS = frozenset({"StaleEpoch", "PartitionClosed"})     # ingestion/writer.py _RESEND_ERRORS


class SimViolation(AssertionError):
    """An invariant failed (or product code raised InvariantViolation) during a run."""

    def __init__(self, seed: int, steps: int, options: "Options", step: int, message: str, trace: list[str],
                 sim: "Simulation | None" = None):
        self.seed, self.steps, self.options, self.step, self.message = seed, steps, options, step, message
        self.trace = trace
        self.sim = sim            # the simulation's state at the violation (for diagnosis)
        tail = "\n".join("    " + line for line in trace[-TRACE_TAIL:])
        super().__init__(f"seed {seed} step {step}: {message}\n  replay: {replay_command(seed, steps, options)}\n"
                         f"  last {min(TRACE_TAIL, len(trace))} events:\n{tail}")


# --- options -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    nodes: int = 5
    rf: int = 3
    min_in_sync: int = 1          # the chain's min_in_sync: while it has fewer members, its head refuses
                                  # new batches (NotEnoughReplicas) and its tail commits nothing new
    durable: bool = True          # a crashed node keeps its log (False: the `memory` persistence variant)
    bound: str = "holder"         # "holder": at most RF-1 nodes down AND a live member holding every acked
                                  # batch always survives; "rf": only at most RF-1 nodes down at once
    strict: bool = False          # I2 strict: every acked batch on every current member after every step
    pauses: bool = True           # pause/resume (session expiry, same incarnation) faults
    chaos: float = 1.0            # multiplier of every fault weight
    promote_lag_records: int | None = None   # override limits.LEARNER_PROMOTE_LAG_RECORDS
    append_inflight: int | None = None       # override limits.APPEND_INFLIGHT_BATCHES_MAX (writer window)
    heal: bool = True             # end with a fault-free phase that must converge
    learner_check: bool = True    # I1 for verified learners (off: let a run go on to show consequences)
    holders: str = "members"      # I2 lost: held by no "members" / no "chain" node (members + learners)
    skip: str = ""                # invariants only logged, not raised ("I1+I6"): to see what follows
    heal_steps: int = 4000
    liveness: bool = False        # senders with their ack bound (LINK_ACK_TIMEOUT_S): links may go silent
    chains: int = 1               # chains over the same nodes: node pairs carry several chains' links
    link_budget: int | None = None   # bytes in flight per node pair's stream, over every chain it carries
                                     # (PeerLink.budget; None: each sender its own, LINK_INFLIGHT_BYTES_MAX)

    def describe(self, base: "Options | None" = None) -> str:
        """The fields that differ from `base` (default: Options()), as 'name=value,...'."""
        base = base if base is not None else Options()
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if getattr(self, f.name) != getattr(base, f.name))

    def parse(self, text: str) -> "Options":
        """This variant with the overrides of 'name=value,...' (the format `describe` prints)."""
        kwargs = {}
        kinds = {f.name: f.type for f in fields(self)}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition("=")
            kind = kinds[name]
            if kind == "bool":
                kwargs[name] = value.lower() in ("1", "true", "yes")
            elif kind == "int":
                kwargs[name] = int(value)
            elif kind == "float":
                kwargs[name] = float(value)
            elif kind == "int | None":
                kwargs[name] = None if value in ("", "None") else int(value)
            else:
                kwargs[name] = value
        return replace(self, **kwargs)


def options_for_seed(seed: int) -> Options:
    """The variant a sweep seed runs: derived from the seed alone, so the seed replays it."""
    pick = random.Random(seed * 7919 + 17)
    return Options(durable=pick.random() < 0.7, chaos=pick.choice((0.4, 1.0, 1.0, 2.0)),
                   pauses=pick.random() < 0.8)


def replay_command(seed: int, steps: int, options: Options) -> str:
    extra = ""
    if options != options_for_seed(seed):
        extra = f" SIM_OPTIONS='{options.describe(options_for_seed(seed))}'"
    return f"SIM_SEED={seed} SIM_STEPS={steps}{extra} .venv/bin/python -m pytest tests/sim -k replay"


# --- storage -----------------------------------------------------------------------------------

class SimLogStore(LogStore):
    """`LogStore` with memory logs only (`LogStore(None)`: no LMDB environment; opening
    them costs ~20 ms, hundreds of times per sweep): every method the simulation reaches
    (open_log, append, set_committed, read, read_batches_from, last_batches, drop_log) is
    LogStore's own memory code path. It also records the commit watermark a durable store
    would have written in each append's transaction (the watermark at that moment: LogStore
    writes `plog.committed_sn` with the batch), which is what a crashed durable node
    recovers."""

    def __init__(self) -> None:
        super().__init__(None)
        self.watermarks: dict[str, int] = {}

    async def append(self, plog: PartitionLog, batch: bytes) -> wire.BatchHeader:
        watermark = plog.committed_sn
        header = await super().append(plog, batch)
        if self.logs.get(plog.name) is plog:
            self.watermarks[plog.name] = watermark
        return header

    async def drop_log(self, name: str) -> None:
        await super().drop_log(name)
        self.watermarks.pop(name, None)


@dataclass
class DiskImage:
    """A crashed durable node's log of the chain: its batches and the stored watermark."""
    batches: list[tuple[int, bytes]]
    watermark: int


def recovered_log(name: str, image: DiskImage) -> PartitionLog:
    """What LogStore._recover makes of a durable log: batches, counts, last SN, and the
    stored watermark capped at the last SN."""
    plog = PartitionLog(name, Persistence.MEMORY, 0)
    for first, batch in image.batches:
        plog.memory[first] = batch
        header = wire.read_header(batch)
        if not plog.first_sn:
            plog.first_sn = header.first_sn
        plog.last_sn = header.last_sn
        plog.batches += 1
        plog.records += header.count
    plog.committed_sn = min(image.watermark, plog.last_sn)
    plog.stored_committed_sn = plog.committed_sn
    return plog


# --- processes and streams ---------------------------------------------------------------------

class SimNode:
    def __init__(self, node_id: str):
        self.id = node_id
        self.up = True
        self.paused = False
        self.incarnation = 0
        self.store: SimLogStore | None = None
        self.replicas: dict[str, Replica] = {}   # chain id -> its replica here
        self.budgets: dict[str, chainlink.LinkBudget] = {}   # successor -> its stream's budget (link_budget)
        self.disk: dict[str, DiskImage] = {}     # while crashed (durable variant)
        self.skew_ms = 0

    @property
    def acts(self) -> bool:
        return self.up and not self.paused

    def state(self) -> str:
        return "up" if self.acts else ("paused" if self.up else "down")


def show(msg) -> str:
    """A link message (storage/link.py) as the trace prints it."""
    if isinstance(msg, chainlink.Hello):
        return f"hello(e{msg.epoch})"
    if isinstance(msg, chainlink.Reset):
        return f"reset(e{msg.epoch})"
    if isinstance(msg, chainlink.Verified):
        return f"verified(e{msg.epoch})"
    if isinstance(msg, chainlink.Batch):
        if not msg.batch:
            return f"empty(e{msg.epoch})"
        h = wire.read_header(msg.batch)
        return f"batch(e{msg.epoch} {sn_range(h.first_sn, h.last_sn)} o{h.origin_seq} c={fmt_sn(msg.committed_sn)})"
    if isinstance(msg, chainlink.Answer):
        return f"answer(e{msg.epoch} last={fmt_sn(msg.last_sn)} c={fmt_sn(msg.committed_sn)})"
    if isinstance(msg, chainlink.Ack):
        return f"ack(e{msg.epoch} last={fmt_sn(msg.last_sn)} c={fmt_sn(msg.committed_sn)})"
    if isinstance(msg, chainlink.Refusal):
        return f"error({msg.error_name})"
    if isinstance(msg, chainlink.End):
        return "EOF"
    return repr(msg)


class Handler:
    """The successor's side of one stream: the real `link.Receiver` and the real driver
    (storage/linkdriver.py `ReceiverDriver`, as storage/peerlink.py IncomingLinks runs it),
    with the replica captured at the hello; `SimReceiverEnd` is its transport."""

    def __init__(self, sim: "Chain", session: "Session", node_id: str, replica: Replica | None):
        self.receiver = chainlink.Receiver(node_id)
        self.replica = replica
        end = SimReceiverEnd(sim, session, self)
        self.driver = ReceiverDriver(self.receiver, replica, end, observer=end)
        self.gone = False               # its process crashed: nothing runs it any more

    @property
    def closed(self) -> bool:
        return self.gone or self.receiver.state is chainlink.ReceiverState.CLOSED


class SimReceiverEnd(Observer):
    """The receiver's transport in the simulation: answers go on the session's up queue
    (lost once the stream broke); the hooks keep the simulation's story and statistics."""

    def __init__(self, sim: "Chain", session: "Session", handler: Handler):
        self.sim, self.session, self.handler = sim, session, handler
        self._before = 0

    def send(self, message) -> None:
        if self.session.connected:
            self.session.up.append(message)
        self.sim.log(f"  {self.session.receiver} answers {show(message)}")

    def close(self, action: chainlink.Close) -> None:
        session = self.session
        if session.connected:
            session.up.append(chainlink.End(self.sim.cid))
        if action.suspect:
            self.sim.stats["suspects"] += 1
        self.sim.log(f"  {session.receiver} ends {session.name()} ({action.reason})"
                     f"{'; suspects ' + action.suspect if action.suspect else ''}")

    def before_apply(self, action) -> None:
        r = self.handler.replica
        self._before = r.last_sn
        if isinstance(action, chainlink.ResetLog):
            self.sim.stats["reset"] += 1
            self.sim.note_reset(self.session, r)

    def after_apply(self, action, error) -> None:
        sim, r, node = self.sim, self.handler.replica, self.session.receiver
        if isinstance(action, chainlink.ResetLog):
            sim.story(r).append("reset")
            sim.log(f"  {node} wipes its log (last was {fmt_sn(self._before)})")
        elif isinstance(action, chainlink.MarkVerified):
            sim.log(f"  {node} verified")
        elif error is not None:
            sim.log(f"  {node} fails: {error.name}: {error.message[:80]}")
        elif r.last_sn != self._before:
            sim.stats["successor_appends"] += 1
            sim.log(f"  {node} appends -> last={fmt_sn(r.last_sn)} c={fmt_sn(r.committed_sn)}")
        else:
            sim.log(f"  {node} already holds it")


class Session:
    """One Replicate stream between a link (predecessor) and its successor."""

    def __init__(self, sid: int, link: "SimLink"):
        self.id = sid
        self.link = link
        self.sender = link.node_id
        self.receiver = link.successor
        self.down: collections.deque = collections.deque()    # link.Hello | Verified | Reset | Batch
        self.up: collections.deque = collections.deque()      # link.Answer | Ack | Refusal | End
        self.connected = True          # the stream holds; else only a lingering handler takes late requests
        self.handler: Handler | None = None

    def name(self) -> str:
        return f"s{self.id}[{self.sender}->{self.receiver}]"


class SimLink(Observer):
    """The predecessor's side: the real `link.Sender` and the real driver
    (storage/linkdriver.py `SenderDriver`, as storage/peerlink.py PeerLink runs it); this
    object is their transport, over the simulated network. It lives in `replica.links`, so
    Replica.stop_links/close stop it."""

    def __init__(self, sim: "Chain", replica: Replica, node_id: str, successor: str, learner: bool,
                 budget: chainlink.LinkBudget | None = None):
        self.sim = sim
        self.replica = replica
        self.node_id = node_id
        self.successor = successor
        self.learner = learner
        # without `liveness`, the timers the pinned seeds were found with: no ack bound, and the
        # plain retry after a hello refused for its epoch
        live = sim.options.liveness
        self.sender = chainlink.Sender(replica, successor, learner, budget,
                                       ack_timeout_s=limits.LINK_ACK_TIMEOUT_S if live else None,
                                       stale_retry_s=limits.LINK_STALE_RETRY_S if live else limits.LINK_RETRY_INTERVAL_S)
        self.driver = SenderDriver(self.sender, replica, self, observer=self)
        self.session: Session | None = None
        self.ack_epoch = 0             # the epoch of the message being taken in (cross_acks)
        self._committed_before = 0

    @property
    def state(self) -> chainlink.SenderState:
        return self.sender.state

    @property
    def acked_sn(self) -> int:
        return self.sender.acked_sn

    async def stop(self) -> None:      # ChainSend.stop: the machine stops, its session ends
        self.sender.stop()
        if self.session is not None:
            self.sim.disconnect(self.session, "link stopped")
        self.session = None

    def name(self) -> str:
        return f"{self.node_id}->{self.successor}{'(L)' if self.learner else ''}"

    # --- the transport (storage/linkdriver.py SenderTransport) -----------------------------
    def current(self) -> bool:
        return self.replica.links.get(self.successor) is self

    def send(self, message) -> None:
        sim = self.sim
        if self.session is not None and self.session.connected:
            self.session.down.append(message)
        if isinstance(message, chainlink.Batch):
            h = wire.read_header(message.batch)
            sim.stats["batches_sent"] += 1
            sim.log(f"  {self.name()} {self.session.name() if self.session else ''} sends "
                    f"{fmt_sn(h.first_sn)}/o{h.origin_seq}")
        else:
            sim.log(f"  {self.name()} sends {show(message)}")

    def open(self) -> object:
        self.sim.log(f"  {self.name()} opens a stream to {self.successor}")
        return PENDING                 # the simulation connects it later (`link_connect`)

    def close(self, action: chainlink.Close) -> None:
        sim = self.sim
        if self.session is not None:
            sim.disconnect(self.session, action.reason)
        self.session = None
        if action.suspect:
            sim.stats["suspects"] += 1
        if action.silent:
            sim.stats["silent_links"] += 1
        sim.log(f"  {self.name()} closes its stream ({action.reason})"
                f"{'; suspects ' + action.suspect if action.suspect else ''}")

    def set_timer(self, at: float) -> None:
        self.sim.log(f"  {self.name()} timer at +{round(at * 1000) - T0_MS}ms")

    def before_apply(self, action) -> None:
        self._committed_before = self.replica.committed_sn

    def after_apply(self, action, error) -> None:
        sim, r = self.sim, self.replica
        if isinstance(action, chainlink.Commit):
            if self.ack_epoch and self.ack_epoch != r.config.epoch and r.committed_sn > self._committed_before:
                sim.cross_acks[self.node_id].append(
                    f"step {sim.step}: {self.node_id} at e{r.config.epoch} committed up to "
                    f"{fmt_sn(r.committed_sn)} on an ack {self.successor} sent at e{self.ack_epoch}")
            sim.log(f"  {self.node_id} c={fmt_sn(r.committed_sn)}")
        else:
            sim.log(f"  {self.node_id} learner {action.learner} acked {fmt_sn(action.sn)} "
                    f"c={fmt_sn(r.committed_sn)}")


@dataclass
class WriterSession:
    sid: int
    head: str
    epoch: int
    queue: collections.deque = field(default_factory=collections.deque)   # origin seqs not yet taken in
    pending: collections.deque = field(default_factory=collections.deque)  # (seq, replica, header, error)


@dataclass(frozen=True)
class Acked:
    seq: int
    first_sn: int
    last_sn: int
    checksum: int


# --- incremental view of one log for the invariants ----------------------------------------------

class LogInfo:
    """Headers of one log, read incrementally (logs only grow; a wiped log is a new one)."""

    def __init__(self, owner: str):
        self.owner = owner
        self.headers: list[tuple[int, int, int]] = []       # (first, last, checksum)
        self.index: dict[int, int] = {}                     # first_sn -> position
        self.origins: set[int] = set()
        self.committed_scanned = 0                          # headers registered as committed (I6)
        self.watermark = 0
        self.acked_seen = 0                                 # acked batches (of Simulation.acked_list) examined
        self.missing = SortedList()                         # (first_sn, seq) of acked batches not held

    @property
    def last_sn(self) -> int:
        return self.headers[-1][1] if self.headers else 0

    def holds(self, a: Acked) -> bool:
        i = self.index.get(a.first_sn)
        return i is not None and self.headers[i] == (a.first_sn, a.last_sn, a.checksum)


def fmt_sn(sn: int) -> str:
    if not sn:
        return "0"
    return f"{seqno.timestamp_ms_of(sn) - T0_MS}.{seqno.counter_of(sn)}"


def sn_range(first: int, last: int) -> str:
    return f"[{fmt_sn(first)}..{fmt_sn(last)}]"


# --- the simulation ----------------------------------------------------------------------------

class Chain:
    """One chain of the simulation (`Options.chains` of them share the nodes): the chain
    manager's config of it, its replicas (one per node, `SimNode.replicas`), its links and
    streams, its ingestion writer, and the state its invariants are checked with. Several
    chains over the same nodes share each node pair's link budget (`link_budget`) and each
    node pair's stream: a stream fault breaks every chain's session on it, as it breaks
    every chain link a PeerLink carries."""

    def __init__(self, sim: "Simulation", index: int):
        self.sim = sim
        self.index = index
        self.cid = CHAIN_ID if index == 0 else f"{STREAM}:{ORDINAL + index}"
        self.ordinal = ORDINAL + index
        self.tag = "" if sim.options.chains == 1 else f"[{self.cid}] "
        self.meta: ChainConfig | None = None          # /chains/<id>: the chain manager's config
        self.sessions: list[Session] = []
        # writer (ingestion) state
        self.origin_id = ((sim.seed * 2654435761 + 12345) % (1 << 62) | 1) + 2 * index
        self.next_seq = 1
        self.inflight: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self.failed: set[int] = set()
        self.writer_view: ChainConfig | None = None
        self.append_window = (self.options.append_inflight if self.options.append_inflight is not None
                              else limits.APPEND_INFLIGHT_BATCHES_MAX)
        self.writer: WriterSession | None = None
        self.acked: dict[int, Acked] = {}
        self.acked_list: list[Acked] = []
        # invariant state
        self.infos: dict[int, tuple[object, LogInfo]] = {}   # id(plog or image) -> (it, info)
        # diagnosis: what each Replica object went through ("e3:head", "reset"), who acked what
        self.replica_story: dict[int, tuple[Replica, list[str]]] = {}
        self.cfg_version = 0                                  # manager config changes so far
        self.born: dict[int, int] = {}                        # id(replica) -> cfg_version at creation
        self.applied: dict[int, list[int]] = collections.defaultdict(list)   # id(replica) -> versions applied
        self.left: dict[str, list[int]] = collections.defaultdict(list)   # node -> versions it held no place
        self.acked_by: dict[int, Replica] = {}
        self.committed_log: list[tuple[int, int, int]] = []  # I6: the one committed history (headers)
        self.committed_from: list[str] = []                  # who first committed each of them
        self.g_index: dict[int, int] = {}                    # first_sn -> position in committed_log
        # diagnosis: positions of the committed history put at risk, and how (see `hazard`)
        self.hazards: dict[int, str] = {}
        self.splices: dict[str, list[str]] = collections.defaultdict(list)   # victim node -> resets
        self.cross_acks: dict[str, list[str]] = collections.defaultdict(list)  # node -> acks across epochs
        self.false_verifies: dict[str, list[str]] = collections.defaultdict(list)  # node -> unsound hellos
        # diagnosis: the nodes whose logs held each batch when it was first committed
        # (first_sn -> (step, nodes)), and the steps at which a node's crash lost its log
        # (the memory variant)
        self.commit_copies: dict[int, tuple[int, tuple[str, ...]]] = {}
        self.log_losses: dict[str, list[int]] = collections.defaultdict(list)
        # I3: each replica object's commit watermark at the last check (id -> (replica, sn))
        self.seen_committed: dict[int, tuple[Replica, int]] = {}

    # --- what the chains share: the simulation's ------------------------------------------------
    SHARED = frozenset({"options", "rng", "nodes", "node_ids", "registered", "stats", "step", "healing"})

    def __getattr__(self, name: str):
        """The simulation's own state (`SHARED`), read through the chain."""
        if name in Chain.SHARED:
            return getattr(self.sim, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def now_ms(self) -> int:
        return self.sim.now_ms

    @now_ms.setter
    def now_ms(self, value: int) -> None:
        self.sim.now_ms = value

    def now(self) -> float:
        return self.sim.now()

    def next_id(self) -> int:
        return self.sim.next_id()

    def wall_clock(self, node: SimNode) -> float:
        return self.sim.wall_clock(node)

    def log(self, text: str) -> None:
        if self.tag:
            body = text.lstrip(" ")
            text = text[:len(text) - len(body)] + self.tag + body
        self.sim.log(text)

    def fail(self, message: str) -> None:
        self.sim.fail(message, self)

    def replica_of(self, node: SimNode) -> Replica | None:
        """The node's replica of this chain."""
        return node.replicas.get(self.cid)

    def story(self, r: Replica) -> list[str]:
        """What this Replica object went through: roles it was configured with, resets."""
        entry = self.replica_story.get(id(r))
        return entry[1] if entry is not None and entry[0] is r else []

    def note_verify(self, link: SimLink, successor_last: int) -> None:
        """Diagnosis: the hello check passed (the predecessor holds the batch the successor
        answered as its last); record it when the successor's log up to that batch is
        nevertheless not a prefix of ours."""
        if not successor_last:
            return
        mine = self._info_for(link.replica.log, link.node_id)
        self._scan_replica(link.replica)
        info = self.info_of(self.nodes[link.successor])
        if info is None or info.last_sn < successor_last:
            return                        # its log was replaced since it answered
        theirs = [h for h in info.headers if h[1] <= successor_last]
        if mine.headers[:len(theirs)] != theirs:
            self.false_verifies[link.successor].append(
                f"step {self.step}: {link.node_id} verified {link.successor} on its last batch "
                f"{sn_range(theirs[-1][0], theirs[-1][1])}, though their logs differ at "
                f"{first_difference(mine.headers, theirs)}")

    def note_reset(self, session: Session, r: Replica) -> None:
        """Diagnosis: a reset that replaces a log under a session that already relies on it
        -- another verified incoming stream (its sender's cursor points into the old log) or
        an outgoing link of this replica (its cursor too) -- splices two logs."""
        for other in self.sessions:
            h = other.handler
            if other is not session and h is not None and not h.closed and h.replica is r \
                    and other.link.state is chainlink.SenderState.STREAMING and other.link.session is other:
                self.splices[r.node_id].append(f"step {self.step}: {r.node_id} wiped by {session.name()} while "
                                               f"{other.name()} streams after {fmt_sn(other.link.sender.sent_sn)}")
        for link in r.links.values():
            if link.state is chainlink.SenderState.STREAMING and link.sender.sent_sn:
                self.splices[link.successor].append(f"step {self.step}: {r.node_id} wiped while its link to "
                                                    f"{link.successor} streams after {fmt_sn(link.sender.sent_sn)}")

    def hazard(self, position: int | None) -> str:
        """' [hazard: ...]' when that position of the committed history had been put at risk."""
        text = self.hazards.get(position) if position is not None else None
        return f" [hazard: {text}]" if text else ""

    def note_promotions(self, old: ChainConfig, new: ChainConfig) -> None:
        """A learner promoted to tail without the whole committed history: record which
        committed batches the new tail lacked (positions of `committed_log`)."""
        for n in new.members:
            if n in old.members:
                continue
            info = self.info_of(self.nodes[n])
            held = 0
            if info is not None:
                while held < len(info.headers) and held < len(self.committed_log) and \
                        info.headers[held] == self.committed_log[held]:
                    held += 1
            if held < len(self.committed_log):
                self.stats["lagging_promotions"] += 1
                for i in range(held, len(self.committed_log)):
                    self.hazards.setdefault(i, f"{n} was promoted to tail at e{new.epoch} (step {self.step}) "
                                               f"holding {held} of the {len(self.committed_log)} committed batches")

    def survived_removal(self, r: Replica | None) -> bool:
        """True when this Replica object outlived a config in which its node held no place
        in the chain (the node never saw it: paused, same incarnation) and was used again:
        it applied a later config, or it is still active while its node holds a place."""
        if r is None or id(r) not in self.born or self.replica_story[id(r)][0] is not r:
            return False
        removals = [v for v in self.left.get(r.node_id, ()) if v > self.born[id(r)]]
        if not removals:
            return False
        if any(a >= min(removals) for a in self.applied.get(id(r), ())):
            return True
        return r.state is ReplicaState.ACTIVE and self.meta.holds(r.node_id)

    # --- config sync (StorageNode.sync carries out plan_sync per chain) ----------------------------
    def setup(self) -> None:
        members = tuple(self.rng.sample(self.node_ids, self.options.rf))
        self.meta = ChainConfig(chain_id=self.cid, stream=STREAM, ordinal=self.ordinal, epoch=1, members=members,
                                persistence=self.sim.persistence, min_in_sync=self.options.min_in_sync,
                                incarnations=tuple(sorted((m, self.registered[m]) for m in members)))
        self.writer_view = self.meta
        self.log(f"chain e1 members={','.join(members)} variant={self.options.describe() or 'default'}")

    async def close_replica(self, node: SimNode) -> None:
        r = node.replicas.pop(self.cid)
        await r.close()
        self.log(f"{node.id} sync e{self.meta.epoch}: closes its replica (not a member)")

    async def open_replica(self, node: SimNode, config: ChainConfig) -> None:
        plog = node.store.open_log(self.cid, config.persistence)
        r = Replica(node.id, config, node.store, plog, clock=lambda node=node: self.wall_clock(node))
        self.replica_story[id(r)] = (r, [f"e{config.epoch}:{config.role_of(node.id)}"])
        self.born[id(r)] = self.cfg_version
        node.replicas[self.cid] = r
        await self._start_links(node, r)
        self.log(f"{node.id} sync e{config.epoch}: opens replica as {config.role_of(node.id)} "
                 f"last={fmt_sn(r.last_sn)} c={fmt_sn(r.committed_sn)}")

    async def reconfigure(self, node: SimNode, config: ChainConfig, relink: bool) -> None:
        r = node.replicas[self.cid]
        if relink:
            await r.stop_links()
        old = r.config.epoch
        r.apply_config(config)
        self.story(r).append(f"e{config.epoch}:{config.role_of(node.id)}")
        self.applied[id(r)].append(self.cfg_version)
        if relink:
            await self._start_links(node, r)
        await r.notify()
        self.log(f"{node.id} sync e{old}->e{config.epoch}: {config.role_of(node.id)} "
                 f"last={fmt_sn(r.last_sn)} c={fmt_sn(r.committed_sn)} verified={r.verified}")

    async def _start_links(self, node: SimNode, r: Replica) -> None:   # StorageNode._start_links
        for successor, learner in link_targets(r.config, node.id):
            link = r.links[successor] = SimLink(self, r, node.id, successor, learner=learner,
                                                budget=self.sim.budget_of(node, successor))
            await link.driver.start(self.now())

    def report_of(self, node_id: str) -> ReplicaReport | None:
        """The node's replica of this chain as NodeStatus reports it (None: the node does
        not answer, or holds no replica of the chain)."""
        node = self.nodes[node_id]
        r = self.replica_of(node)
        if not node.acts or r is None:
            return None
        s = r.status()
        return ReplicaReport(self.cid, s["epoch"], s["role"], s["records"], s["verified"], s["last_sn"],
                             s["committed_sn"], tuple(s["gated"]), s["sealed"], s["frozen"])

    def manager_plan(self, load: Counter, learning: Counter) -> ChainConfig | None:
        """ChainManager.round's plan of this chain (its `learner_progress` and `plan`), with
        the load and learners of every chain as the round counts them."""
        config = self.meta
        live = dict(self.registered)
        reports = {}
        if config.learners and config.tail in live:           # as ChainManager.round asks them
            reports[config.tail] = self.report_of(config.tail)
            for learner in config.learners:
                if learner in live and reports[config.tail] is not None:
                    reports[learner] = self.report_of(learner)
        progress = chains.learner_progress(config, reports)
        return chains.plan(config, live, self.options.rf, load, progress, self.now_ms, learning)

    async def manager_round(self, load: Counter, learning: Counter) -> None:
        new = self.manager_plan(load, learning)
        if new is None:
            self.log("manager: no change")
            return
        old = self.meta
        self.note_promotions(old, new)
        self.meta = new
        self.cfg_version += 1
        for n in self.node_ids:
            if old.holds(n) and not new.holds(n):
                self.left[n].append(self.cfg_version)
        changes = [c for c in new.history if c not in old.history]
        what = "; ".join(f"{c.action} {c.node}" for c in changes) or "incarnations"
        self.stats["reconfig"] += 1
        for c in changes:
            self.stats[f"cfg_{c.action.replace(' ', '_')}"] += 1
        self.log(f"manager: e{old.epoch}->e{new.epoch} members={','.join(new.members)} "
                 f"learners={','.join(new.learners) or '-'} ({what})")

    def disconnect(self, session: Session, why: str, keep_late: bool | None = None) -> None:
        """The stream breaks: the predecessor stops reading; in-flight acks are lost; the
        successor's handler (if any) lingers until it notices, and may still take in the
        one request it had already received (keep_late; seeded when None)."""
        if not session.connected:
            return
        session.connected = False
        session.up.clear()
        if keep_late is None:
            keep_late = self.rng.random() < 0.5
        late = session.down[0] if keep_late and session.down else None
        session.down.clear()
        if late is not None:
            session.down.append(late)
        self.log(f"  {session.name()} disconnected ({why}){' one request still in flight' if late else ''}")

    def links(self) -> list[SimLink]:
        out = []
        for n in self.node_ids:
            r = self.replica_of(self.nodes[n])
            if r is not None:
                out.extend(r.links.values())
        return out

    async def link_connect(self, link: SimLink) -> None:
        """The transport opened the stream the link asked for (its Open action)."""
        self.stats["hello"] += 1
        session = Session(self.next_id(), link)
        self.sessions.append(session)
        link.session = session
        self.log(f"{link.name()} connects {session.name()}")
        await link.driver.opened(self.now())

    async def link_poll(self, link: SimLink) -> None:
        """The link's driver wakes (the replica progressed, or its epoch or log changed)."""
        self.log(f"{link.name()} polls")
        await link.driver.poll(self.now())

    async def link_timer(self, link: SimLink) -> None:
        """The link's timer fires: the simulated clock moves to its deadline."""
        deadline = link.sender.deadline
        while self.now() < deadline:
            self.now_ms = max(self.now_ms + 1, int(deadline * 1000))
        self.log(f"{link.name()} timer ({link.state.value}) at +{self.now_ms - T0_MS}ms")
        await link.driver.poll(self.now())

    async def link_silence(self, link: SimLink) -> None:
        """The successor owes the link an answer and none comes (`liveness`): the simulated
        clock moves to the sender's ack deadline and the sender polls."""
        deadline = link.sender.ack_deadline
        while self.now() < deadline:
            self.now_ms = max(self.now_ms + 1, int(deadline * 1000))
        self.stats["fault_silence"] += 1
        self.log(f"FAULT {link.name()} hears nothing ({link.state.value}) until +{self.now_ms - T0_MS}ms")
        await link.driver.poll(self.now())

    async def deliver_down(self, session: Session, duplicate: bool = False) -> None:
        msg = session.down[0] if duplicate else session.down.popleft()
        node = self.nodes[session.receiver]
        late = "" if session.connected else " (late, old stream)"
        dup = " (duplicate)" if duplicate else ""
        self.log(f"{session.name()} delivers {show(msg)} to {node.id}{late}{dup}")
        h = session.handler
        if h is None:                       # the first request of the stream, whatever it is
            r = self.replica_of(node)
            h = session.handler = Handler(self, session, node.id, r if r is not None and r.active else None)
        elif h.closed:
            self.log("  dropped: the handler no longer reads")
            return
        await h.driver.receive(msg)

    def handler_due(self, session: Session) -> bool:
        h = session.handler
        if h is None or h.closed or not session.connected:
            return False
        return h.driver.due()

    async def handler_tick(self, session: Session) -> None:
        """One turn of IncomingLinks' ack loop."""
        h = session.handler
        self.log(f"{session.name()} handler on {session.receiver} polls")
        h.driver.poll()

    async def deliver_up(self, session: Session, duplicate: bool = False) -> None:
        msg = session.up[0] if duplicate else session.up.popleft()
        link = session.link
        self.log(f"{session.name()} delivers {show(msg)} to {session.sender}"
                 f"{' (duplicate)' if duplicate else ''}")
        before = link.state
        actions = link.sender.receive(msg, self.now())
        if before is chainlink.SenderState.HELLO_SENT and link.state is chainlink.SenderState.STREAMING:
            self.note_verify(link, link.sender.acked_sn)
        link.ack_epoch = getattr(msg, "epoch", 0)
        try:
            await link.driver.act(actions, self.now())
        finally:
            link.ack_epoch = 0

    async def linger_close(self, session: Session) -> None:
        h = session.handler
        session.down.clear()
        self.log(f"{session.name()} handler on {session.receiver} sees the cancellation")
        h.driver.end(chainlink.Lost(self.cid, "call cancelled"))

    def writer_break(self, why: str) -> None:
        if self.writer is not None:
            self.log(f"  writer stream w{self.writer.sid} to {self.writer.head} broken ({why}); "
                     f"{len(self.inflight)} in flight")
        self.writer = None

    async def writer_connect(self) -> None:
        view = self.writer_view
        head = self.nodes[view.head]
        self.stats["writer_sessions"] += 1
        self.writer = WriterSession(self.next_id(), view.head, view.epoch)
        self.writer.queue.extend(self.inflight.keys())
        self.stats["writer_resends"] += len(self.inflight)
        self.log(f"writer connects w{self.writer.sid} to {head.id} at e{view.epoch}, resends "
                 f"{list(self.inflight.keys())}")

    async def writer_new_batch(self) -> None:
        seq = self.next_seq
        self.next_seq += 1
        count = self.rng.choice((1, 1, 2, 3))
        entries = [wire.encode_entry(f"k{seq}".encode(), f"v{seq}.{i}".encode()) for i in range(count)]
        self.inflight[seq] = wire.build_batch(entries, origin_id=self.origin_id, origin_seq=seq)
        self.writer.queue.append(seq)
        self.log(f"writer sends o{seq} ({count} records) on w{self.writer.sid}")

    async def writer_deliver(self) -> None:
        w = self.writer
        seq = w.queue.popleft()
        node = self.nodes[w.head]
        batch = self.inflight.get(seq)
        if batch is None:
            self.log(f"w{w.sid} o{seq}: settled already")
            return
        try:
            r = self.replica_of(node)
            if r is None or r.state is not ReplicaState.ACTIVE:
                raise WrongOwner(f"node {node.id} holds no replica of {self.cid}")
            header = await r.append_as_head(w.epoch, batch)
            w.pending.append((seq, r, header, None))
            self.stats["head_appends"] += 1
            self.log(f"w{w.sid} {node.id} append_as_head o{seq} e{w.epoch} -> "
                     f"{sn_range(header.first_sn, header.last_sn)}")
        except SmsError as e:
            w.pending.append((seq, None, None, e))
            self.log(f"w{w.sid} {node.id} append_as_head o{seq} e{w.epoch} -> {e.name}")

    def writer_acks(self) -> None:
        """The Append handler's ack loop, in request order, and the writer's _read_acks."""
        w = self.writer
        if w is None or not self.nodes[w.head].acts:
            return
        while w.pending and self.writer is w:
            seq, r, header, error = w.pending[0]
            if error is None:
                if r.committed_sn < header.last_sn:
                    if r.state is ReplicaState.ACTIVE:
                        return
                    error = PartitionClosed(f"{self.cid} closed before commit")
            w.pending.popleft()
            if error is not None:
                # StaleEpoch/PartitionClosed: the real writer resends; WrongOwner: the real
                # ingestion node gives the partition up and the producer retries at the new
                # owner -- modelled as the same resend (the head recognises what it holds)
                if (error.name in RESEND_ERRORS or isinstance(error, WrongOwner)) and seq in self.inflight:
                    self.writer_break(f"head answered {error.name} for o{seq}")
                    return
                if self.inflight.pop(seq, None) is not None:
                    self.failed.add(seq)
                    self.stats["writer_failed"] += 1
                    if error.name == "NotEnoughReplicas":
                        self.stats["refused_min_in_sync"] += 1
                    self.log(f"  writer: o{seq} failed ({error.name})")
                continue
            if self.inflight.pop(seq, None) is None:
                continue                     # an ack of a batch resent twice: the first settled it
            a = Acked(seq, header.first_sn, header.last_sn, header.checksum)
            self._scan_replica(r)
            if not self._info_for(r.log, r.node_id).holds(a):
                self.fail(f"I7 o{seq} acked at {sn_range(a.first_sn, a.last_sn)} by {w.head}, whose log "
                          f"does not hold it (its replica went through {self.story(r)}): a phantom ack")
            prior = self.acked.get(seq)
            if prior is not None and prior != a:
                self.fail(f"I7 o{seq} acked twice: {prior} and {a}")
            self.acked[seq] = a
            self.acked_by[seq] = r
            self.acked_list.append(a)
            self.stats["acked"] += 1
            self.log(f"  writer: o{seq} ACKED at {sn_range(a.first_sn, a.last_sn)} by {w.head}")

    def copies_of(self, header: tuple[int, int, int]) -> tuple[str, ...]:
        """Diagnosis: the nodes whose log holds this batch (live, or on the disk of a crashed
        durable node), members or not."""
        out = []
        for n in self.node_ids:
            info = self.info_of(self.nodes[n])
            i = info.index.get(header[0]) if info is not None else None
            if i is not None and info.headers[i] == header:
                out.append(n)
        return tuple(out)

    def holder_survives(self, node: SimNode) -> bool:
        """The holder bound: another live member (pinned incarnation) keeps every acked batch."""
        for m in self.meta.members:
            other = self.nodes[m]
            if m == node.id or not other.acts or self.registered.get(m) != self.meta.incarnation_of(m):
                continue
            info = self.info_of(other)
            if info is not None and not info.missing and info.acked_seen == len(self.acked_list):
                return True
        return False

    async def kill_streams(self, node: SimNode) -> None:
        """The node crashed: its streams, both ways, and its writer's."""
        for s in list(self.sessions):
            if s.receiver == node.id:
                s.connected = False
                s.up.clear()
                s.down.clear()
                if s.handler is not None:
                    s.handler.gone = True
                if s.link.session is s:                 # connection reset
                    await s.link.driver.receive(chainlink.Lost(self.cid, f"connection reset: {node.id} crashed"),
                                                self.now())
            elif s.sender == node.id:
                self.disconnect(s, f"{node.id} crashed")
        if self.writer is not None and self.writer.head == node.id:
            self.writer_break(f"{node.id} crashed")

    def enabled(self, add, chaos: float) -> None:
        """This chain's events (its writer, links and streams), each given to `add`."""
        tag = self.tag
        # writer
        if self.writer is None:
            view = self.writer_view
            if view.head in self.registered and self.nodes[view.head].up:
                add(3, f"{tag}writer-connect", self.writer_connect)
        else:
            w = self.writer
            if not self.healing and len(self.inflight) < self.append_window:
                add(3, f"{tag}writer-new", self.writer_new_batch)
            if w.queue and self.nodes[w.head].acts:
                add(4, f"{tag}writer-deliver", self.writer_deliver)
            add(0.15 * chaos, f"{tag}writer-stream-break", self._writer_fault)
        if self.writer_view != self.meta:
            add(1, f"{tag}writer-refresh", self.writer_refresh)
        # links
        now = self.now()
        for link in self.links():
            node = self.nodes[link.node_id]
            state = link.state
            if not node.acts or state is chainlink.SenderState.STOPPED:
                continue
            if state is chainlink.SenderState.CONNECTING:
                succ = self.nodes[link.successor]
                if link.successor in self.registered and succ.up:
                    add(3, f"connect {link.name()}", lambda link=link: self.link_connect(link))
            elif link.sender.deadline is not None:
                # the retry timer; a reset's drain timeout (10 s) only rarely
                add(3 if state is chainlink.SenderState.BROKEN else 0.05 * chaos, f"timer {link.name()}",
                    lambda link=link: self.link_timer(link))
            if state is chainlink.SenderState.STREAMING and link.session is not None and link.session.connected \
                    and link.sender.due(now):
                add(4, f"send {link.name()}", lambda link=link: self.link_poll(link))
            if link.sender.ack_deadline is not None and state in (chainlink.SenderState.HELLO_SENT,
                                                                  chainlink.SenderState.STREAMING):
                add(0.05 * chaos, f"silence {link.name()}", lambda link=link: self.link_silence(link))
        for s in self.sessions:
            if s.down and self.nodes[s.receiver].acts:
                add(4, f"deliver-down {s.name()}", lambda s=s: self.deliver_down(s))
                add(0.2 * chaos, f"duplicate-down {s.name()}", lambda s=s: self.deliver_down(s, duplicate=True))
            if s.up and s.connected and self.nodes[s.sender].acts:
                add(4, f"deliver-up {s.name()}", lambda s=s: self.deliver_up(s))
                add(0.2 * chaos, f"duplicate-up {s.name()}", lambda s=s: self.deliver_up(s, duplicate=True))
            if self.handler_due(s) and self.nodes[s.receiver].acts:
                add(4, f"handler {s.name()}", lambda s=s: self.handler_tick(s))
            if s.connected:
                add(0.1 * chaos, f"drop {s.name()}", lambda s=s: self.sim.stream_fault(s, keep=False))
                add(0.1 * chaos, f"reorder {s.name()}", lambda s=s: self.sim.stream_fault(s, keep=True))
            elif s.handler is not None and not s.handler.closed and self.nodes[s.receiver].acts:
                add(0.8, f"linger-close {s.name()}", lambda s=s: self.linger_close(s))

    async def writer_refresh(self) -> None:
        """The writer's view of the chain catches up. A head that moved elsewhere ends the
        append stream (the ingestion node that owned the partition retires its writer and
        the producer retries at the new owner: modelled as a resend of what is in flight)."""
        self.writer_view = self.meta
        self.log(f"writer view -> e{self.meta.epoch} head {self.meta.head}")
        if self.writer is not None and self.writer.head != self.meta.head:
            self.writer_break(f"the head moved to {self.meta.head}")

    async def _writer_fault(self) -> None:
        self.stats["fault_writer_break"] += 1
        self.log("FAULT writer stream breaks")
        self.writer_break("connection lost")

    async def break_session(self, session: Session, keep: bool) -> None:
        """A stream fault (`Simulation.stream_fault`) breaks this session: drop, or reorder."""
        link = session.link
        self.disconnect(session, "dropped" if not keep else "broken, old stream lingers", keep_late=keep)
        if link.session is session:
            await link.driver.receive(chainlink.Lost(self.cid, "connection lost"), self.now())

    def why_not_converged(self) -> str | None:
        cfg = self.meta
        want = min(self.options.rf, self.options.nodes)
        if len(cfg.members) != want or cfg.learners:
            return f"config e{cfg.epoch} members={cfg.members} learners={cfg.learners}"
        if self.writer_view != cfg:
            return "writer view stale"
        if self.inflight:
            return f"writer has {len(self.inflight)} batches in flight: {list(self.inflight)[:8]}"
        logs = []
        for m in cfg.members:
            node = self.nodes[m]
            r = self.replica_of(node)
            if r is None or r.config != cfg:
                return f"{m} not synced to e{cfg.epoch}"
            logs.append(self.info_of(node).headers)
        if any(h != logs[0] for h in logs):
            return "member logs differ: " + ", ".join(f"{m}:{len(h)}" for m, h in zip(cfg.members, logs))
        head = self.replica_of(self.nodes[cfg.head])
        if head.committed_sn != head.last_sn:
            return "head not fully committed"
        return None

    def _info_for(self, key_obj: object, owner: str) -> LogInfo:
        entry = self.infos.get(id(key_obj))
        if entry is None or entry[0] is not key_obj:
            entry = (key_obj, LogInfo(owner))
            self.infos[id(key_obj)] = entry
        return entry[1]

    def info_of(self, node: SimNode) -> LogInfo | None:
        """The node's log of the chain as it stands (on disk, for a crashed durable node)."""
        if node.up:
            plog = node.store.logs.get(self.cid)
            if plog is None:
                return None
            info = self._info_for(plog, node.id)
            self._scan(info, plog.memory, node.id)
            return info
        image = node.disk.get(self.cid)
        if image is None:
            return None
        info = self._info_for(image, node.id)
        if not info.headers and image.batches:
            self._scan_list(info, [b for _f, b in image.batches], node.id)
        return info

    def _scan(self, info: LogInfo, memory: SortedDict, owner: str) -> None:
        n = len(memory)
        if n < len(info.headers):
            self.fail(f"log of {owner} shrank from {len(info.headers)} to {n} batches without being replaced")
        if n > len(info.headers):
            self._scan_list(info, memory.values()[len(info.headers):], owner)

    def _scan_list(self, info: LogInfo, batches, owner: str) -> None:
        start = len(info.headers)
        for batch in batches:
            h = wire.read_header(batch)
            if info.headers and h.first_sn <= info.headers[-1][1]:
                self.fail(f"I5 {owner}: batch {sn_range(h.first_sn, h.last_sn)} after "
                          f"{fmt_sn(info.headers[-1][1])}")
            if h.origin_id == self.origin_id:
                if h.origin_seq in info.origins:
                    self.fail(f"I4 {owner}: batch o{h.origin_seq} stored twice")
                info.origins.add(h.origin_seq)
            info.index[h.first_sn] = len(info.headers)
            info.headers.append((h.first_sn, h.last_sn, h.checksum))
        # acked batches now held?
        if info.missing and len(info.headers) > start:
            lo = info.headers[start][0]
            for first, seq in list(info.missing.irange((lo, 0), (info.last_sn, 1 << 62))):
                if info.holds(self.acked[seq]):
                    info.missing.remove((first, seq))

    def _scan_replica(self, r: Replica) -> None:
        """Bring the LogInfo of a replica's own log up to date."""
        self._scan(self._info_for(r.log, r.node_id), r.log.memory, r.node_id)

    def _track_acked(self, info: LogInfo) -> None:
        for a in self.acked_list[info.acked_seen:]:
            if not info.holds(a):
                info.missing.add((a.first_sn, a.seq))
        info.acked_seen = len(self.acked_list)

    def _commit_prefix(self, info: LogInfo, committed_sn: int, where: str, risk: str) -> None:
        """I6: this replica's committed prefix agrees with the one committed history."""
        g, g_from = self.committed_log, self.committed_from
        while info.committed_scanned < len(info.headers) and \
                info.headers[info.committed_scanned][1] <= committed_sn:
            i = info.committed_scanned
            h = info.headers[i]
            if i < len(g):
                if g[i] != h:
                    self.fail(f"I6 {where} committed {sn_range(h[0], h[1])} as batch {i} of its log, where "
                              f"{g_from[i]} committed {sn_range(g[i][0], g[i][1])}: two committed histories"
                              f"{self.hazard(i)}")
                    return
            else:
                self.g_index[h[0]] = len(g)
                self.commit_copies[h[0]] = (self.step, self.copies_of(h))
                if risk:
                    self.hazards.setdefault(len(g), f"{risk} (step {self.step})")
                g.append(h)
                g_from.append(where)
            info.committed_scanned += 1

    def check(self, final: bool = False) -> None:
        cfg = self.meta
        # every log: I4, I5 (in _scan); replicas: I3, I6
        for node in self.nodes.values():
            info = self.info_of(node)
            r = self.replica_of(node)
            if not node.up or r is None or r.state is not ReplicaState.ACTIVE:
                continue
            plog = node.store.logs.get(self.cid)
            if r.log is not plog:
                self.fail(f"I3 {node.id}: its replica's log is not its store's log of {self.cid} "
                          f"(replica last={fmt_sn(r.log.last_sn)} batches={len(r.log.memory)}; store "
                          f"{'none' if plog is None else 'last=' + fmt_sn(plog.last_sn)})")
            if r.committed_sn > r.last_sn:
                self.fail(f"I3 {node.id}: committed {fmt_sn(r.committed_sn)} > last {fmt_sn(r.last_sn)}")
            gate = min([r.learner_acked.get(n, 0) for n in r.gated] + [r.last_sn])
            seen = self.seen_committed.get(id(r))
            if r.is_tail and r.config.below_min_in_sync:
                # a tail of a chain below min_in_sync commits nothing new (not even what it holds)
                if seen is not None and seen[0] is r and r.committed_sn > seen[1]:
                    self.fail(f"I3 {node.id} is tail of e{r.config.epoch} with {len(r.config.members)} member(s), "
                              f"below min_in_sync {r.config.min_in_sync}, yet committed "
                              f"{fmt_sn(seen[1])} -> {fmt_sn(r.committed_sn)}")
            elif r.is_tail and r.committed_sn != gate:
                self.fail(f"I3 {node.id} is tail at e{r.config.epoch} but committed {fmt_sn(r.committed_sn)} "
                          f"!= last {fmt_sn(r.last_sn)} (gated by learners {sorted(r.gated)}: {fmt_sn(gate)})")
            self.seen_committed[id(r)] = (r, r.committed_sn)
            if r.committed_sn < info.watermark:
                self.fail(f"I3 {node.id}: watermark went down {fmt_sn(info.watermark)} -> {fmt_sn(r.committed_sn)}")
            info.watermark = r.committed_sn
            stale = f"; the manager was at e{cfg.epoch}" if r.config.epoch != cfg.epoch else ""
            risk = ""
            if r.is_tail and cfg.tail != node.id:
                risk = (f"{node.id} committed as tail of e{r.config.epoch} while the manager's e{cfg.epoch} "
                        + (f"had promoted {cfg.tail} to tail" if cfg.holds(node.id) else
                           f"had removed {node.id} (a zombie)"))
            self._commit_prefix(info, r.committed_sn, f"{node.id} (step {self.step}, e{r.config.epoch} "
                                                      f"{r.config.role_of(node.id)}{stale})", risk)
        # I1 prefix along the members
        member_infos = []
        for m in cfg.members:
            info = self.info_of(self.nodes[m])
            member_infos.append((m, info))
        for (p, pi), (s, si) in zip(member_infos, member_infos[1:]):
            if pi is None or si is None:
                continue
            if len(si.headers) > len(pi.headers) or pi.headers[:len(si.headers)] != si.headers:
                self.fail(f"I1 {s}'s log ({len(si.headers)} batches, last {fmt_sn(si.last_sn)}) is not a "
                          f"prefix of its predecessor {p}'s ({len(pi.headers)}, last {fmt_sn(pi.last_sn)}) "
                          f"at e{cfg.epoch}; first difference at {first_difference(pi.headers, si.headers)}")
        tail_info = member_infos[-1][1]
        checked = [(m, i) for m, i in member_infos if i is not None]
        for learner in cfg.learners:
            node = self.nodes[learner]
            r = self.replica_of(node)
            if not self.options.learner_check:
                break
            if not node.up or r is None or r.state is not ReplicaState.ACTIVE or not r.verified \
                    or not r.is_learner or tail_info is None:
                continue
            if r.config.epoch != cfg.epoch:
                # verified by the tail of an older epoch, and not synced since (Replica.apply_config
                # clears `verified` when the tail changes): the manager trusts no learner progress
                # but a replica's at its epoch (ChainManager.round), and such a learner may hold
                # what the old tail had and the new one never got
                continue
            li = self.info_of(node)
            a, b = (li.headers, tail_info.headers) if len(li.headers) <= len(tail_info.headers) \
                else (tail_info.headers, li.headers)
            if b[:len(a)] != a:
                self.fail(f"I1 verified learner {learner}'s log ({len(li.headers)} batches, last "
                          f"{fmt_sn(li.last_sn)}) diverges from tail {cfg.tail}'s ({len(tail_info.headers)}, "
                          f"last {fmt_sn(tail_info.last_sn)}); first difference at "
                          f"{first_difference(b, a)}")
            checked.append((learner, li))
        # I2 acked batches
        if not self.acked_list:
            return
        for _m, info in checked:
            self._track_acked(info)
        lost = None
        holders = member_infos
        if self.options.holders == "chain":
            holders = member_infos + [(n, self.info_of(self.nodes[n])) for n in cfg.learners]
            for _n, info in holders[len(member_infos):]:
                if info is not None:
                    self._track_acked(info)
        for m, info in holders:
            missing = set(seq for _f, seq in info.missing) if info is not None else set(self.acked)
            lost = missing if lost is None else lost & missing
        if lost:
            seq = min(lost)
            a = self.acked[seq]
            self.fail(f"I2 acked batch o{seq} {sn_range(a.first_sn, a.last_sn)} is on no "
                      f"{'member' if holders is member_infos else 'member or learner'} of "
                      f"e{cfg.epoch} ({','.join(cfg.members + cfg.learners)}): acked and lost"
                      f"{self.hazard(self.g_index.get(a.first_sn))}")
        for m, info in checked:
            if info.missing:
                first, seq = info.missing[0]
                if first <= info.last_sn:
                    a = self.acked[seq]
                    self.fail(f"I2 {m} (of e{cfg.epoch}) does not hold acked o{seq} "
                              f"{sn_range(a.first_sn, a.last_sn)} though its log reaches {fmt_sn(info.last_sn)}"
                              f"{self.hazard(self.g_index.get(a.first_sn))}")
        if self.options.strict or final:
            for m, info in member_infos:            # (a member whose log is gone is not judged)
                if info is not None and info.missing:
                    seq = info.missing[0][1]
                    a = self.acked[seq]
                    self.fail(f"I2 strict: member {m} of e{cfg.epoch} lacks acked o{seq} "
                              f"{sn_range(a.first_sn, a.last_sn)} (its log ends at {fmt_sn(info.last_sn)})"
                              f"{self.hazard(self.g_index.get(a.first_sn))}")

    def digest(self) -> str:
        parts = []
        for n in self.node_ids:
            info = self.info_of(self.nodes[n])
            parts.append(f"{n}:{len(info.headers) if info else '-'}:{fmt_sn(info.last_sn) if info else '-'}")
        return f"e{self.meta.epoch} {','.join(self.meta.members)} acked={len(self.acked)} " + " ".join(parts)


class Simulation:
    """The nodes, the clock, the seeded choice of each step, and the chains
    (`Options.chains`, each a `Chain`) over those nodes."""

    def __init__(self, seed: int, steps: int, options: Options | None = None):
        self.seed = seed
        self.steps = steps
        self.options = options if options is not None else options_for_seed(seed)
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        self.stats: Counter = Counter()
        self.step = 0
        self.healing = False
        self.now_ms = T0_MS
        self.node_ids = [f"n{i}" for i in range(1, self.options.nodes + 1)]
        self.nodes = {n: SimNode(n) for n in self.node_ids}
        self.registered: dict[str, int] = {}          # /nodes: node -> incarnation
        self.next_incarnation = 100
        self.background = Counter({n: self.rng.randint(0, 3) for n in self.node_ids})
        self.persistence = Persistence.MEMORY
        self.next_sid = 1
        self.chains = [Chain(self, i) for i in range(self.options.chains)]

    def next_id(self) -> int:
        """A stream's number (links' sessions and writers' streams share them)."""
        sid = self.next_sid
        self.next_sid += 1
        return sid

    # --- the clock -----------------------------------------------------------------------------
    def wall_clock(self, node: SimNode) -> float:
        """A node's wall clock (seconds), skewed: what its replicas' sequencer reads
        (Replica(clock=...)); the links read the unskewed `now`."""
        return (self.now_ms + node.skew_ms + 0.5) / 1000.0

    def now(self) -> float:
        """The links' clock (seconds): the simulated time, as loop.time() is PeerLink's."""
        return self.now_ms / 1000.0

    def log(self, text: str) -> None:
        self.trace.append(f"{self.step:5d} {text}")

    def fail(self, message: str, chain: "Chain | None" = None) -> None:
        kind = message.split(" ", 1)[0]
        if kind in self.options.skip.split("+"):
            if self.stats[f"skipped_{kind}"] == 0:
                self.log(f"VIOLATION (not raised: skip={self.options.skip}) {message}")
            self.stats[f"skipped_{kind}"] += 1
            return
        raise SimViolation(self.seed, self.steps, self.options, self.step, message, self.trace,
                           chain if chain is not None else self.chains[0])

    # --- setup ---------------------------------------------------------------------------------
    async def setup(self) -> None:
        for node in self.nodes.values():
            self._boot(node)
        for chain in self.chains:
            chain.setup()
        for node in self.nodes.values():
            await self.sync(node)

    def _boot(self, node: SimNode) -> None:
        node.up, node.paused = True, False
        node.incarnation = self.next_incarnation
        self.next_incarnation += 1
        node.skew_ms = self.rng.choice((0, 0, -1, 1, -3, 5, -20))
        node.store = SimLogStore()
        if self.options.durable:
            for name, image in node.disk.items():
                node.store.logs[name] = recovered_log(name, image)
                node.store.watermarks[name] = image.watermark
        node.disk = {}
        node.replicas = {}
        node.budgets = {}
        self.registered[node.id] = node.incarnation

    # --- config sync (StorageNode.sync) ----------------------------------------------------------
    def sync_plan(self, node: SimNode) -> SyncPlan:
        """StorageNode.sync's decision over every chain (`plan_sync`)."""
        held = {cid: r.config for cid, r in node.replicas.items()}
        return plan_sync(node.id, node.incarnation, held, {c.cid: c.meta for c in self.chains})

    def needs_sync(self, node: SimNode) -> bool:
        return self.sync_plan(node) != SyncPlan()

    async def sync(self, node: SimNode) -> None:
        """StorageNode.sync: the real decision (`plan_sync`, over every chain), carried out
        as the node does: closes, then opens, then reconfigurations."""
        plan = self.sync_plan(node)
        by_id = {c.cid: c for c in self.chains}
        for cid in plan.close:
            await by_id[cid].close_replica(node)
        for cid, config in plan.open:
            await by_id[cid].open_replica(node, config)
        for cid, config, relink in plan.reconfigure:
            await by_id[cid].reconfigure(node, config, relink)
        if plan == SyncPlan():
            if len(self.chains) == 1:
                self.log(f"{node.id} sync e{self.chains[0].meta.epoch}: nothing to do")
            else:
                self.log(f"{node.id} sync: nothing to do")

    # --- chain manager (ChainManager.round) ------------------------------------------------------
    async def manager_round(self) -> None:
        """One round plans every chain, each with the load (places in every chain, and the
        background of chains not simulated) and learners as they stand after the chains
        planned before it, as ChainManager.round counts them."""
        load: Counter = Counter()
        learning: Counter = Counter()
        for chain in self.chains:
            load += Counter(chain.meta.members) + Counter(chain.meta.learners)
            learning.update(chain.meta.learners)
        load = load + self.background
        for chain in self.chains:
            old = chain.meta
            await chain.manager_round(load, learning)
            if chain.meta is not old:
                chains.count_change(load, learning, old, chain.meta)

    # --- link budgets (PeerLink.budget) ----------------------------------------------------------
    def budget_of(self, node: SimNode, successor: str) -> chainlink.LinkBudget | None:
        """The budget of the node's stream to `successor`, which every chain's link to it
        shares (one PeerLink per node pair); None (each sender its own, as with one chain)
        unless `link_budget` is set."""
        if self.options.link_budget is None:
            return None
        budget = node.budgets.get(successor)
        if budget is None:
            budget = node.budgets[successor] = chainlink.LinkBudget(self.options.link_budget)
        return budget

    def links_to(self, node_id: str, successor: str) -> list["SimLink"]:
        """Every chain's links from `node_id` to `successor` (a PeerLink's chains)."""
        node = self.nodes[node_id]
        return [link for r in node.replicas.values() for link in r.links.values() if link.successor == successor]

    # --- faults --------------------------------------------------------------------------------
    def down_count(self) -> int:
        return sum(1 for n in self.nodes.values() if not n.acts)

    def may_take_down(self, node: SimNode) -> bool:
        if self.down_count() + 1 > self.options.rf - 1:
            return False
        if self.options.bound == "rf":
            return True
        return all(chain.holder_survives(node) for chain in self.chains)

    async def crash(self, node: SimNode) -> None:
        self.stats["crash"] += 1
        images = {}
        if self.options.durable and node.store is not None:
            for name, plog in node.store.logs.items():
                images[name] = DiskImage(list(plog.memory.items()), node.store.watermarks.get(name, 0))
        held = " ".join(f"{c.tag}last={fmt_sn(c.replica_of(node).last_sn)}" for c in self.chains
                        if c.replica_of(node) is not None)
        self.log(f"CRASH {node.id} (inc {node.incarnation}, {node.state()}, replica {held or '-'}); "
                 f"{'log kept' if self.options.durable else 'log lost'}")
        for chain in self.chains:
            await chain.kill_streams(node)
        for chain in self.chains:
            if not self.options.durable and node.store is not None and chain.cid in node.store.logs:
                chain.log_losses[node.id].append(self.step)
        for r in node.replicas.values():
            r.state = ReplicaState.CLOSED      # the process is gone: nothing runs it
        node.replicas = {}
        node.budgets = {}
        node.store = None
        node.disk = images
        node.up, node.paused = False, False
        self.registered.pop(node.id, None)

    async def restart(self, node: SimNode) -> None:
        self.stats["restart"] += 1
        self._boot(node)
        self.log(f"RESTART {node.id} as incarnation {node.incarnation} skew={node.skew_ms}ms "
                 f"logs={ {n: fmt_sn(p.last_sn) for n, p in node.store.logs.items()} }")
        await self.sync(node)                   # StorageNode.start syncs at once

    async def pause(self, node: SimNode) -> None:
        self.stats["pause"] += 1
        node.paused = True
        self.registered.pop(node.id, None)      # its session expires
        self.log(f"PAUSE {node.id} (its registration expires)")

    async def resume(self, node: SimNode) -> None:
        self.stats["resume"] += 1
        node.paused = False
        self.registered[node.id] = node.incarnation     # reregister(): same started_ms
        self.log(f"RESUME {node.id} (registers again as incarnation {node.incarnation})")

    async def stream_fault(self, session: "Session", keep: bool) -> None:
        """A fault on the stream that carries `session`: with several chains it is the node
        pair's one stream (PeerLink), so every chain's session on it breaks (`_lost`)."""
        self.stats["fault_drop" if not keep else "fault_reorder"] += 1
        chain = session.link.sim
        chain.log(f"FAULT {'reorder' if keep else 'drop'} on {session.name()}")
        await chain.break_session(session, keep)
        if len(self.chains) > 1:
            for other in self.chains:
                for s in list(other.sessions):
                    if s is not session and s.connected and (s.sender, s.receiver) == (session.sender, session.receiver):
                        other.log(f"  {s.name()} shares the stream")
                        await other.break_session(s, keep)

    # --- scheduling ----------------------------------------------------------------------------
    def enabled(self) -> list[tuple[float, str, object]]:
        out: list[tuple[float, str, object]] = []
        chaos = 0.0 if self.healing else self.options.chaos

        def add(weight, label, fn):
            if weight > 0:
                out.append((weight, label, fn))

        for chain in self.chains:
            chain.enabled(add, chaos)
        # control
        for node in self.nodes.values():
            if node.acts and self.needs_sync(node):
                add(2, f"sync {node.id}", lambda node=node: self.sync(node))
        add(1.2, "manager", self.manager_round)
        # processes
        for node in self.nodes.values():
            if not node.up:
                add(0.5 if not self.healing else 3, f"restart {node.id}", lambda node=node: self.restart(node))
            elif node.paused:
                add(0.5 if not self.healing else 3, f"resume {node.id}", lambda node=node: self.resume(node))
            elif chaos and self.may_take_down(node):
                add(0.06 * chaos, f"crash {node.id}", lambda node=node: self.crash(node))
                if self.options.pauses:
                    add(0.05 * chaos, f"pause {node.id}", lambda node=node: self.pause(node))
        return out

    # --- the run -------------------------------------------------------------------------------
    async def main(self) -> "Result":
        await self.setup()
        self.check()
        for self.step in range(1, self.steps + 1):
            await self.one_step()
        if self.options.heal:
            await self.heal()
        return Result(self.seed, self.steps, self.options, self.trace, self.stats, self.digest())

    async def one_step(self) -> None:
        self.now_ms += self.rng.choice((0, 0, 1, 1, 2, 7))
        choices = self.enabled()
        total = sum(w for w, _, _ in choices)
        x = self.rng.random() * total
        for weight, label, fn in choices:
            x -= weight
            if x < 0:
                break
        self.stats["steps"] += 1
        try:
            await fn()
            for chain in self.chains:
                chain.writer_acks()
        except InvariantViolation as e:
            self.fail(f"product invariant: {e}")
        for chain in self.chains:
            chain.sessions = [s for s in chain.sessions if s.connected or s.down or
                              (s.handler is not None and not s.handler.closed)]
        self.check()

    async def heal(self) -> None:
        self.healing = True
        self.log("HEAL: faults stop; every node comes back")
        start = self.step
        while self.step < start + self.options.heal_steps:
            if self.converged():
                self.stats["heal_steps"] = self.step - start
                self.log("converged")
                self.check(final=True)
                return
            self.step += 1
            await self.one_step()
        self.fail(f"liveness: not converged {self.options.heal_steps} fault-free steps after the faults stopped: "
                  f"{self.why_not_converged()}")

    def converged(self) -> bool:
        return self.why_not_converged() is None

    def why_not_converged(self) -> str | None:
        if any(not n.acts for n in self.nodes.values()):
            return "a node is down"
        for chain in self.chains:
            why = chain.why_not_converged()
            if why is not None:
                return chain.tag + why
        return None

    # --- invariants ----------------------------------------------------------------------------
    def check(self, final: bool = False) -> None:
        for chain in self.chains:
            chain.check(final)
        if self.options.link_budget is not None:
            self.check_budgets()

    def check_budgets(self) -> None:
        """I8 budgets: a node pair's stream budget holds exactly the bytes in flight of the
        senders sharing it (every chain's live link to that successor), never less than 0."""
        for node in self.nodes.values():
            if not node.up:
                continue
            for successor, budget in node.budgets.items():
                inflight = sum(link.sender.inflight_bytes for link in self.links_to(node.id, successor)
                               if link.sender.budget is budget and link.state is not chainlink.SenderState.STOPPED)
                sharing = sum(1 for link in self.links_to(node.id, successor)
                              if link.state is not chainlink.SenderState.STOPPED)
                if sharing > 1:
                    self.stats["shared_stream_checks"] += 1
                    for link in self.links_to(node.id, successor):
                        sender = link.sender
                        if sender.state is chainlink.SenderState.STREAMING and not sender.inflight_bytes \
                                and budget.bytes and sender.view.last_sn > sender.sent_sn:
                            self.stats["held_by_other_chains"] += 1    # another chain's bytes hold it back
                if budget.bytes != inflight or budget.bytes < 0:
                    self.fail(f"I8 {node.id}->{successor}: the stream's budget counts {budget.bytes} bytes in "
                              f"flight, its senders {inflight}")

    def digest(self) -> str:
        return " | ".join(chain.digest() for chain in self.chains)


def first_difference(longer: list, shorter: list) -> str:
    for i, (x, y) in enumerate(zip(longer, shorter)):
        if x != y:
            return f"batch {i}: {sn_range(x[0], x[1])} vs {sn_range(y[0], y[1])}"
    return f"batch {len(shorter)} (length)"


@dataclass
class Result:
    seed: int
    steps: int
    options: Options
    trace: list[str]
    stats: Counter
    digest: str


@contextlib.contextmanager
def patched(sim: Simulation):
    """An optional promotion lag (control.chains.plan reads it from sms.limits); quiet
    product logs. (The clocks need no patch: each Replica is given its node's simulated
    wall clock, and the link machines take `now` from the simulation.)"""
    saved_lag = limits.LEARNER_PROMOTE_LAG_RECORDS
    loggers = [logging.getLogger(n) for n in ("storage.replica", "storage.log", "storage.service")]
    levels = [lg.level for lg in loggers]
    if sim.options.promote_lag_records is not None:
        limits.LEARNER_PROMOTE_LAG_RECORDS = sim.options.promote_lag_records
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        limits.LEARNER_PROMOTE_LAG_RECORDS = saved_lag
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def run(seed: int, steps: int = 300, options: Options | None = None) -> Result:
    """One simulation run; raises SimViolation on the first broken invariant."""
    sim = Simulation(seed, steps, options)
    loop = asyncio.new_event_loop()
    try:
        with patched(sim):
            return loop.run_until_complete(sim.main())
    finally:
        loop.close()


def main(argv: list[str]) -> int:
    """python -m tests.sim.harness SEED [STEPS] [OPTIONS]: print the trace of one run."""
    seed = int(argv[0])
    steps = int(argv[1]) if len(argv) > 1 else 300
    options = options_for_seed(seed).parse(argv[2]) if len(argv) > 2 else None
    try:
        result = run(seed, steps, options)
    except SimViolation as e:
        print("\n".join(e.trace))
        print(str(e).splitlines()[0])
        return 1
    print("\n".join(result.trace))
    print(result.digest, dict(result.stats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or [os.environ.get("SIM_SEED", "1")]))
