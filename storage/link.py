"""The chain link protocol, sans-IO: two state machines, messages in, actions out.

A chain link ships one replica's log to the next node: the predecessor's `Sender` (a
member to its successor, or the tail to a learner) and the successor's `Receiver`. Both
are plain synchronous objects. They never await, never touch a socket or a clock: a
driver feeds them what arrived (`receive`), asks them to look at their replica again
(`poll`, with `now` from the driver's clock for the sender's timers) and carries out the
actions they return, in order. Two drivers run them: the gRPC binding
(storage/peerlink.py: `PeerLink` and `IncomingLinks`, one stream per pair of nodes) and
the simulation (tests/sim/harness.py), which delivers, drops, reorders and duplicates
their messages under a simulated clock.

A machine reads its replica through a `LogView` (the `Replica` itself: its config, its
last and committed SNs, its log generation, and synchronous reads of its log) and changes
nothing there itself: every change is an action (`Commit`, `LearnerAcked`, `Store`,
`ResetLog`, `MarkVerified`).

One machine serves one (chain, successor) pair and knows nothing of the transport; every
message names its chain, so one stream per pair of nodes carries every chain link between
them (storage/peerlink.py): its driver routes by `chain_id`, numbers each hello's
session, and drops what arrives for a session that ended. The senders sharing a stream
share a `LinkBudget`, the bound on the batch bytes they have in flight together.

The protocol (docs/architecture.md, "The chain link protocol"):

    predecessor (Sender)                         successor (Receiver)
    Open ->  transport opens a stream
    Hello(epoch)                    ------>      checks replica, epoch, predecessor
                                    <------      Answer(last batch, committed) | Refusal
    holds the successor's last batch?
      no:  Reset, end of sending    ------>      wipes its log, ends the stream (End)
      yes: Verified                 ------>      marks the log verified
           Batch(batch, committed)* ------>      stores each (Store)
                                    <------      Ack(last, committed)* as they change
    Commit / LearnerAcked on each Ack, more batches as the window frees

Every message carries the epoch of the hello; either side refuses (StaleEpoch) or drops
a message of another epoch. A broken stream is not repaired: the sender waits
LINK_RETRY_INTERVAL_S and starts again with a hello, which resumes after the successor's
last batch (the link is a log-shipping cursor).

Liveness: a successor owes the sender an answer to its hello, and an ack while batches are
in flight, within LINK_ACK_TIMEOUT_S of the moment the sender began to wait (each ack starts
the wait again while batches remain). A sender that waited so long breaks the link as
*silent* (`Close(silent=True)`): the driver reports the link unresponsive to the chain
manager, which can tell that apart from a refused port (a paused process, a cut network).
The transport's own silence (`Silent`: nothing heard on the stream) breaks it the same way.
`Keepalive` is the stream's side of it: one per stream end, it says when the predecessor's
end pings (every LINK_KEEPALIVE_INTERVAL_S) and when either end heard nothing from the other
for LINK_ACK_TIMEOUT_S, which finds a predecessor gone silent (paused, cut off) on an idle
link too.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass
from typing import Protocol

from sms import limits, wire
from sms.errors import FailedPrecondition, PermissionDenied, SmsError, StaleEpoch, WrongOwner, invariant
from sms.metadata import ChainConfig


# --- messages ------------------------------------------------------------------------------
# predecessor -> successor (ReplicateRequest)

@dataclass(frozen=True, slots=True)
class Hello:
    chain_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Verified:
    """After the answer: your log is a prefix of mine; batches follow."""
    chain_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Reset:
    """After the answer: your log is not a prefix of mine; wipe it (I send nothing more)."""
    chain_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Batch:
    chain_id: str
    epoch: int
    batch: bytes
    committed_sn: int        # the predecessor's watermark (a learner adopts it)


# successor -> predecessor (ReplicateAck)

@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to a hello: the successor's log as it stands."""
    chain_id: str
    epoch: int
    last_sn: int
    committed_sn: int
    last_first_sn: int       # its last batch: bounds and checksum, checked by the predecessor
    last_checksum: int


@dataclass(frozen=True, slots=True)
class Ack:
    chain_id: str
    epoch: int
    last_sn: int             # the successor's last stored SN
    committed_sn: int        # the commit watermark of the successor's suffix of the chain


@dataclass(frozen=True, slots=True)
class Refusal:
    """A named error (sms.errors); the stream ends after it."""
    chain_id: str
    epoch: int
    error_name: str
    error_message: str


# events of the transport, either direction

@dataclass(frozen=True, slots=True)
class End:
    """The other side ended the stream (EOF)."""
    chain_id: str


@dataclass(frozen=True, slots=True)
class Lost:
    """The transport lost the stream (connection reset, cancelled call, peer gone)."""
    chain_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Silent:
    """The transport heard nothing from the other end for LINK_ACK_TIMEOUT_S (`Keepalive`),
    or could not write to it so long: the peer is paused, or cut off."""
    chain_id: str
    reason: str


Down = Hello | Verified | Reset | Batch
Up = Answer | Ack | Refusal


# --- actions -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Open:
    """Sender: open a stream to the successor, then call `opened` (or `receive(Lost)`)."""


@dataclass(frozen=True, slots=True)
class Send:
    message: Down | Up


@dataclass(frozen=True, slots=True)
class FinishSending:
    """Sender: half-close the stream (after a Reset: nothing more will be sent)."""


@dataclass(frozen=True, slots=True)
class Close:
    """Close the stream. `suspect`: the peer to report to failure detection
    (StorageNode.suspect), "" when the end says nothing about the peer's health.
    `silent`: the peer did not answer within LINK_ACK_TIMEOUT_S (its port may well accept
    connections): the link is reported unresponsive (StorageNode.link_unresponsive)."""
    reason: str
    suspect: str = ""
    silent: bool = False


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Sender: call `poll` at `at` (the driver's clock) or soon after."""
    at: float


@dataclass(frozen=True, slots=True)
class Commit:
    """Sender: the successor's commit watermark (Replica.on_successor_committed)."""
    sn: int


@dataclass(frozen=True, slots=True)
class LearnerAcked:
    """Sender (the tail): a learner's progress (Replica.on_learner_acked). `hello`: its
    answer to a hello, its whole log, which may hold less than it acked before (it lost
    its log, or it was wiped): then it is not the learner that caught up."""
    learner: str
    sn: int
    hello: bool = False


@dataclass(frozen=True, slots=True)
class Store:
    """Receiver: persist a batch (Replica.append_as_successor); a failure goes back in as
    `store_failed`."""
    batch: bytes
    committed_sn: int
    generation: int          # the log generation the stream was verified against


@dataclass(frozen=True, slots=True)
class ResetLog:
    """Receiver: wipe the log (Replica.reset); it is copied anew."""


@dataclass(frozen=True, slots=True)
class MarkVerified:
    """Receiver: the predecessor found the log a prefix of its own (Replica.verified)."""


Action = Open | Send | FinishSending | Close | SetTimer | Commit | LearnerAcked | Store | ResetLog | MarkVerified


class LogView(Protocol):
    """What a link machine reads of its replica (storage.replica.Replica is one)."""

    node_id: str
    config: ChainConfig
    generation: int

    @property
    def active(self) -> bool: ...

    @property
    def last_sn(self) -> int: ...

    @property
    def committed_sn(self) -> int: ...

    def last_header(self) -> wire.BatchHeader | None: ...

    def holds_batch(self, first_sn: int, last_sn: int, checksum: int) -> bool: ...

    def batches_after(self, after_sn: int, limit: int) -> list[bytes]: ...


def _protocol_error(what: str) -> FailedPrecondition:
    return FailedPrecondition(f"chain link protocol: {what}")


def _kind(message) -> str:
    return type(message).__name__


# --- the predecessor's side ----------------------------------------------------------------

class LinkBudget:
    """Batch bytes in flight on one transport stream, over every sender it carries: a
    sender ships only while the total is under `limit` (one batch always goes when
    nothing at all is in flight)."""

    __slots__ = ("bytes", "limit")

    def __init__(self, limit: int):
        self.bytes = 0
        self.limit = limit

    def room(self) -> bool:
        return self.bytes < self.limit


class SenderState(enum.Enum):
    IDLE = "idle"                  # created; `start` opens the first stream
    CONNECTING = "connecting"      # Open asked of the transport; `opened` follows
    HELLO_SENT = "hello_sent"      # waits for the Answer
    RESETTING = "resetting"        # sent Reset; waits for the successor to end the stream
    STREAMING = "streaming"        # verified: ships batches, takes Acks
    BROKEN = "broken"              # the stream ended; reconnects at `deadline`
    STOPPED = "stopped"            # for good (the link was stopped or its replica closed)


# Every transition a sender may make (`Sender._to` holds it to this table: any other is a
# bug, an InvariantViolation). docs/architecture.md, "The chain link protocol", shows it.
SENDER_TRANSITIONS: dict[SenderState, frozenset[SenderState]] = {
    SenderState.IDLE: frozenset({SenderState.CONNECTING, SenderState.STOPPED}),                  # start, stop
    SenderState.CONNECTING: frozenset({SenderState.HELLO_SENT, SenderState.BROKEN,                # opened, open failed
                                       SenderState.STOPPED}),
    SenderState.HELLO_SENT: frozenset({SenderState.STREAMING, SenderState.RESETTING,              # answered
                                       SenderState.BROKEN, SenderState.STOPPED}),
    SenderState.RESETTING: frozenset({SenderState.BROKEN, SenderState.STOPPED}),                  # the successor ended
    SenderState.STREAMING: frozenset({SenderState.BROKEN, SenderState.STOPPED}),                  # lost, refused, stale
    SenderState.BROKEN: frozenset({SenderState.CONNECTING, SenderState.STOPPED}),                 # the retry timer
    SenderState.STOPPED: frozenset(),
}


class Sender:
    """The predecessor's side of one link: ships `view`'s log to `successor`.

    `learner`: the successor is a learner of the chain (this is its tail); its acks are
    progress for the tail's commit gate, not a commit watermark.
    `ack_timeout_s`: how long the successor may leave a hello or batches in flight
    unanswered before the link breaks as silent (None: no bound, as the simulation's
    default runs). `stale_retry_s`: the retry after a hello refused for its epoch (one of
    the two nodes has not applied a new chain config yet: a failover under way), and after
    a silent break (a stall that is over shows at once as an answered hello, which the
    chain manager looks for before it takes a live successor out)."""

    def __init__(self, view: LogView, successor: str, learner: bool = False, budget: LinkBudget | None = None,
                 ack_timeout_s: float | None = limits.LINK_ACK_TIMEOUT_S,
                 batch_ack_timeout_s: float = limits.LINK_BATCH_ACK_TIMEOUT_S,
                 stale_retry_s: float = limits.LINK_STALE_RETRY_S):
        self.view = view
        self.budget = budget if budget is not None else LinkBudget(limits.LINK_INFLIGHT_BYTES_MAX)
        self.chain_id = view.config.chain_id
        self.successor = successor
        self.learner = learner
        self.state = SenderState.IDLE
        self.deadline: float | None = None      # when `poll` has something to do (a timer)
        self.epoch = 0                          # the replica's epoch at the hello
        self.generation = 0                     # its log generation at the hello
        self.acked_sn = 0                       # the successor's last stored SN (retention keeps it)
        self.sent_sn = 0                        # the last SN shipped on this stream
        self.inflight: collections.deque[tuple[int, int]] = collections.deque()   # (last SN, bytes) unacked
        self.inflight_bytes = 0
        self.broken_reason = ""                 # why the last stream ended
        self.ack_timeout_s = ack_timeout_s
        self.batch_ack_timeout_s = batch_ack_timeout_s
        self.stale_retry_s = stale_retry_s
        self.waiting_since: float | None = None  # an answer is owed since (the hello, or batches in flight)

    def name(self) -> str:
        return f"{self.chain_id} {self.view.node_id}->{self.successor}{' (learner)' if self.learner else ''}"

    # --- events ------------------------------------------------------------------------
    def start(self, now: float) -> list[Action]:
        if self.state is not SenderState.IDLE:
            return []
        self._to(SenderState.CONNECTING)
        return [Open()]

    def opened(self, now: float) -> list[Action]:
        """The transport opened a stream: say hello in the replica's current epoch."""
        if self.state is not SenderState.CONNECTING:
            return []
        self._to(SenderState.HELLO_SENT)
        self.epoch = self.view.config.epoch
        self.generation = self.view.generation
        self.deadline = None
        self.waiting_since = now
        return [Send(Hello(self.chain_id, self.epoch))]

    def open_failed(self, now: float, reason: str) -> list[Action]:
        """The transport could not open a stream (no address known for the successor)."""
        if self.state is not SenderState.CONNECTING:
            return []
        return self._break(now, reason, suspect=False)

    def receive(self, message: Up | End | Lost, now: float) -> list[Action]:
        state = self.state
        if state in (SenderState.IDLE, SenderState.CONNECTING, SenderState.BROKEN, SenderState.STOPPED):
            return []           # no stream, or one already given up: a late message of it
        if isinstance(message, Lost):
            return self._break(now, f"stream lost: {message.reason}", suspect=True)
        if isinstance(message, Silent):
            return self._break(now, f"no answer from {self.successor}: {message.reason}", suspect=True, silent=True,
                               retry_s=self.stale_retry_s)
        if message.chain_id != self.chain_id:
            return self._break(now, f"chain link protocol: {_kind(message)} of {message.chain_id}", suspect=True)
        if state is SenderState.RESETTING:
            if isinstance(message, End):
                return self._break(now, "the successor's log was not a prefix of ours: it was wiped and is "
                                        "copied anew", suspect=False)
            return []           # drained
        if isinstance(message, End):
            return self._break(now, "successor closed the link", suspect=True)
        if isinstance(message, Refusal):
            stale = message.error_name == StaleEpoch.__name__
            return self._break(now, f"{message.error_name}: {message.error_message}", suspect=not stale,
                               retry_s=self.stale_retry_s if stale and state is SenderState.HELLO_SENT else None)
        if state is SenderState.HELLO_SENT:
            if not isinstance(message, Answer):
                return self._break(now, f"chain link protocol: {_kind(message)} before the answer", suspect=True)
            return self._answered(message, now)
        if not isinstance(message, Ack):            # STREAMING
            return self._break(now, f"chain link protocol: {_kind(message)} after the answer", suspect=True)
        if message.epoch != self.epoch:
            return self._break(now, f"ack of epoch {message.epoch} on a link of epoch {self.epoch}", suspect=True)
        if self.view.config.epoch != self.epoch:
            return self._stale(now)
        if message.last_sn > self.acked_sn:
            self.acked_sn = message.last_sn
        while self.inflight and self.inflight[0][0] <= self.acked_sn:
            size = self.inflight.popleft()[1]
            self.inflight_bytes -= size
            self.budget.bytes -= size
        self.waiting_since = now if self.inflight else None     # it answers: the wait starts again
        return [self._progress(message.committed_sn)] + self._ship(now)

    def _answered(self, answer: Answer, now: float) -> list[Action]:
        view = self.view
        if answer.epoch != self.epoch or view.config.epoch != self.epoch:
            return self._break(now, f"{self.chain_id}: hello answered in epoch {answer.epoch}; link of epoch "
                                    f"{self.epoch}", suspect=False)
        if answer.last_sn and not view.holds_batch(answer.last_first_sn, answer.last_sn, answer.last_checksum):
            # its log is not a prefix of ours (a restarted node that had taken writes we never
            # saw, or lost some): it is wiped and copied from the start
            self._to(SenderState.RESETTING)
            self.deadline = now + limits.LINK_RESET_TIMEOUT_S
            self.waiting_since = None
            return [Send(Reset(self.chain_id, self.epoch)), FinishSending(), SetTimer(self.deadline)]
        self._to(SenderState.STREAMING)
        self.acked_sn = self.sent_sn = answer.last_sn
        self._drop_inflight()
        # the progress first: a learner's gate is settled before it hears it is verified
        return [self._progress(answer.committed_sn, hello=True), Send(Verified(self.chain_id, self.epoch))] \
            + self._ship(now)

    def _progress(self, committed_sn: int, hello: bool = False) -> Action:
        if self.learner:
            return LearnerAcked(self.successor, self.acked_sn, hello)
        return Commit(committed_sn)

    @property
    def ack_deadline(self) -> float | None:
        """When the successor's answer is overdue (None: none is owed, or no bound). A
        driver polls the sender then, or soon after. A hello is owed its answer within
        `ack_timeout_s`; batches in flight an ack within the longer `batch_ack_timeout_s`:
        a successor that is alive (the stream's keepalive hears it) but slow to store
        (a loaded machine, a slow disk) is not taken for a silent one."""
        if self.waiting_since is None or self.ack_timeout_s is None:
            return None
        bound = self.ack_timeout_s if self.state is SenderState.HELLO_SENT else self.batch_ack_timeout_s
        return self.waiting_since + bound

    def poll(self, now: float) -> list[Action]:
        """Look at the replica and the timers again: ship what the window allows, end a
        stream of an old epoch or of a wiped log, break a stream whose successor owes an
        answer past LINK_ACK_TIMEOUT_S, reconnect once the retry timer is due."""
        state = self.state
        if state in (SenderState.IDLE, SenderState.STOPPED):
            return []
        if not self.view.active:
            return self.stop("replica closed")
        overdue = self.ack_deadline
        if overdue is not None and now >= overdue and state in (SenderState.HELLO_SENT, SenderState.STREAMING):
            what = "its answer to the hello" if state is SenderState.HELLO_SENT else \
                f"an ack of {len(self.inflight)} batches in flight"
            bound = self.ack_timeout_s if state is SenderState.HELLO_SENT else self.batch_ack_timeout_s
            return self._break(now, f"no answer from {self.successor} for {now - self.waiting_since:.2f}s "
                                    f"(bound {bound}s): {what}", suspect=True, silent=True,
                               retry_s=self.stale_retry_s)
        if self.deadline is not None and now >= self.deadline:
            if state is SenderState.BROKEN:
                self.deadline = None
                self._to(SenderState.CONNECTING)
                return [Open()]
            if state is SenderState.RESETTING:
                return self._break(now, f"the successor did not end the stream within "
                                        f"{limits.LINK_RESET_TIMEOUT_S}s of a reset", suspect=True)
        if state is SenderState.STREAMING:
            if self.view.config.epoch != self.epoch:
                return self._stale(now)
            if self.view.generation != self.generation:
                return self._break(now, f"{self.chain_id}: our log was wiped; the successor starts again",
                                   suspect=False)
            return self._ship(now)
        return []

    def due(self, now: float) -> bool:
        """True when `poll` has something to do now (what a driver waits for)."""
        state = self.state
        if state in (SenderState.IDLE, SenderState.STOPPED):
            return False
        view = self.view
        if not view.active or (self.deadline is not None and now >= self.deadline):
            return True
        overdue = self.ack_deadline
        if overdue is not None and now >= overdue:
            return True
        if state is SenderState.STREAMING:
            return (view.config.epoch != self.epoch or view.generation != self.generation
                    or (view.last_sn > self.sent_sn and self._room()))
        return False

    def stop(self, reason: str = "link stopped") -> list[Action]:
        """Stop for good (the chain config changed, or the replica closed)."""
        if self.state is SenderState.STOPPED:
            return []
        had_stream = self.state in (SenderState.HELLO_SENT, SenderState.RESETTING, SenderState.STREAMING)
        self._to(SenderState.STOPPED)
        self.deadline = None
        self._drop_inflight()
        return [Close(reason)] if had_stream else []

    # --- helpers -----------------------------------------------------------------------
    def _to(self, state: SenderState) -> None:
        invariant(state in SENDER_TRANSITIONS[self.state],
                  f"link {self.name()}: {self.state.value} -> {state.value} is not a sender's transition")
        self.state = state

    def _room(self) -> bool:
        return len(self.inflight) < limits.CHAIN_INFLIGHT_BATCHES_MAX and \
            self.inflight_bytes < limits.CHAIN_INFLIGHT_BYTES_MAX and self.budget.room()

    def _drop_inflight(self) -> None:
        self.budget.bytes -= self.inflight_bytes
        self.inflight.clear()
        self.inflight_bytes = 0
        self.waiting_since = None

    def _ship(self, now: float) -> list[Action]:
        """Batches after `sent_sn`, as many as the window (batches and bytes) allows; the
        first batch in flight starts the wait for an ack."""
        view = self.view
        if self.state is not SenderState.STREAMING or view.last_sn <= self.sent_sn or not self._room():
            return []
        out: list[Action] = []
        idle = not self.inflight
        committed = view.committed_sn
        for batch in view.batches_after(self.sent_sn, limits.CHAIN_INFLIGHT_BATCHES_MAX - len(self.inflight)):
            if self.inflight and self.inflight_bytes + len(batch) > limits.CHAIN_INFLIGHT_BYTES_MAX:
                break           # (one batch always goes: a batch is at most BATCH_BYTES_MAX)
            if self.budget.bytes and self.budget.bytes + len(batch) > self.budget.limit:
                break           # the stream's bound, over every chain it carries
            self.sent_sn = wire.read_header(batch).last_sn
            self.inflight.append((self.sent_sn, len(batch)))
            self.inflight_bytes += len(batch)
            self.budget.bytes += len(batch)
            out.append(Send(Batch(self.chain_id, self.epoch, batch, committed)))
        if idle and self.inflight:
            self.waiting_since = now
        return out

    def _stale(self, now: float) -> list[Action]:
        return self._break(now, f"{self.chain_id}: moved to epoch {self.view.config.epoch}; link of epoch "
                                f"{self.epoch}", suspect=False)

    def _break(self, now: float, reason: str, suspect: bool, silent: bool = False,
               retry_s: float | None = None) -> list[Action]:
        self._to(SenderState.BROKEN)
        self.broken_reason = reason
        self.deadline = now + (limits.LINK_RETRY_INTERVAL_S if retry_s is None else retry_s)
        self._drop_inflight()
        close = Close(reason, self.successor, silent=True) if silent else Close(reason, self.successor if suspect else "")
        return [close, SetTimer(self.deadline)]


# --- the successor's side ------------------------------------------------------------------

class ReceiverState(enum.Enum):
    AWAIT_HELLO = "await_hello"    # a stream opened; its first message must be a Hello
    VERIFYING = "verifying"        # answered; waits for Verified or Reset
    STREAMING = "streaming"        # verified: stores batches, acks progress
    CLOSED = "closed"              # the stream ends (or ended)


# Every transition a receiver may make (`Receiver._to` holds it to this table).
RECEIVER_TRANSITIONS: dict[ReceiverState, frozenset[ReceiverState]] = {
    ReceiverState.AWAIT_HELLO: frozenset({ReceiverState.VERIFYING, ReceiverState.CLOSED}),     # answered, refused
    ReceiverState.VERIFYING: frozenset({ReceiverState.STREAMING, ReceiverState.CLOSED}),       # verified, reset
    ReceiverState.STREAMING: frozenset({ReceiverState.CLOSED}),
    ReceiverState.CLOSED: frozenset(),
}


class Receiver:
    """The successor's side of one incoming stream (one hello). It has no timers: its
    predecessor's sender reconnects, and the stream ends with the transport."""

    def __init__(self, node_id: str, sender: str = ""):
        self.node_id = node_id
        # the node at the other end, as its certificate names it (a TLS cluster's cluster
        # port); "": not authenticated (a plaintext cluster), and not checked
        self.sender = sender
        self.state = ReceiverState.AWAIT_HELLO
        self.chain_id = ""
        self.epoch = 0
        self.generation = 0            # the log generation answered at the hello
        self.predecessor = ""          # reported to failure detection when the stream is lost
        self.sent = (0, 0)             # (last SN, committed SN) last told the predecessor

    def receive(self, message: Down | End | Lost, view: LogView | None) -> list[Action]:
        """A message from the predecessor. `view`: this node's replica of the message's
        chain (None: none here, or closed)."""
        state = self.state
        if state is ReceiverState.CLOSED:
            return []
        if isinstance(message, Lost):
            return self._close(f"stream lost: {message.reason}", suspect=self.predecessor)
        if isinstance(message, End):
            return self._close("the predecessor ended the stream")
        if state is ReceiverState.AWAIT_HELLO:
            return self._hello(message, view)
        if message.chain_id != self.chain_id:
            return self._refuse(_protocol_error(f"{_kind(message)} of {message.chain_id} on a stream of "
                                                f"{self.chain_id}"))
        if view is None or not view.active:
            return self._close("replica closed")
        if message.epoch != self.epoch or view.config.epoch != self.epoch:
            return self._refuse(StaleEpoch(f"{self.chain_id}: epoch {message.epoch} != {view.config.epoch}"))
        if isinstance(message, Batch):
            if state is not ReceiverState.STREAMING:
                return self._refuse(_protocol_error("a batch before verified"))
            return [Store(message.batch, message.committed_sn, self.generation)]
        if isinstance(message, Verified):
            if state is ReceiverState.STREAMING:
                return []                       # (a duplicate: harmless)
            self._to(ReceiverState.STREAMING)
            return [MarkVerified()]
        if isinstance(message, Reset) and state is ReceiverState.VERIFYING:
            self._to(ReceiverState.CLOSED)
            return [ResetLog(), Close("log wiped at the predecessor's request; it copies anew")]
        return self._refuse(_protocol_error(f"{_kind(message)} in state {state.value}"))

    def _hello(self, message, view: LogView | None) -> list[Action]:
        self.chain_id = message.chain_id
        if not isinstance(message, Hello):
            return self._refuse(_protocol_error(f"{_kind(message)} before hello"))
        self.epoch = message.epoch
        if view is None or not view.active:
            return self._refuse(WrongOwner(f"node {self.node_id} holds no replica of {message.chain_id}"))
        config = view.config
        if message.epoch != config.epoch:
            return self._refuse(StaleEpoch(f"{config.chain_id}: epoch {message.epoch}; this replica is at "
                                           f"epoch {config.epoch}"))
        predecessor = config.predecessor_of(self.node_id)
        if predecessor is None:
            return self._refuse(WrongOwner(f"{config.chain_id}: {self.node_id} has no predecessor"))
        if self.sender and self.sender != predecessor:
            return self._refuse(PermissionDenied(f"{config.chain_id}: {self.node_id} takes this chain's log only "
                                                 f"from its predecessor {predecessor}, not from node {self.sender}"))
        self._to(ReceiverState.VERIFYING)
        self.predecessor = predecessor
        self.generation = view.generation
        self.sent = (view.last_sn, view.committed_sn)
        last = view.last_header()
        return [Send(Answer(self.chain_id, self.epoch, self.sent[0], self.sent[1],
                            last.first_sn if last else 0, last.checksum if last else 0))]

    def store_failed(self, error: SmsError) -> list[Action]:
        """A `Store` failed with a named error (LogDiverged, StaleEpoch, CorruptBatch, ...)."""
        if self.state is ReceiverState.CLOSED:
            return []
        return self._refuse(error)

    def due(self, view: LogView) -> bool:
        """True when `poll` has something to send (what a driver waits for)."""
        if self.state not in (ReceiverState.VERIFYING, ReceiverState.STREAMING):
            return False
        return (not view.active or view.config.epoch != self.epoch or view.generation != self.generation
                or (view.last_sn, view.committed_sn) != self.sent)

    def poll(self, view: LogView) -> list[Action]:
        """Look at the replica again: ack its progress, or end the stream when the replica
        closed, moved to another epoch (acks of a newer epoch's log must not reach a
        predecessor of the old one: it would commit batches of its own that no other node
        holds) or had its log wiped by another stream."""
        if self.state not in (ReceiverState.VERIFYING, ReceiverState.STREAMING):
            return []
        if not view.active:
            return self._close("replica closed")
        if view.config.epoch != self.epoch:
            return self._refuse(StaleEpoch(f"{self.chain_id}: moved from epoch {self.epoch} to "
                                           f"{view.config.epoch}"))
        if view.generation != self.generation:
            return self._refuse(StaleEpoch(f"{self.chain_id}: the log on {self.node_id} was wiped after this "
                                           f"stream began"))
        now = (view.last_sn, view.committed_sn)
        if now == self.sent:
            return []
        self.sent = now
        return [Send(Ack(self.chain_id, self.epoch, now[0], now[1]))]

    def _to(self, state: ReceiverState) -> None:
        invariant(state in RECEIVER_TRANSITIONS[self.state],
                  f"receiver of {self.chain_id or '?'} on {self.node_id}: {self.state.value} -> {state.value} is "
                  "not a receiver's transition")
        self.state = state

    def _refuse(self, error: SmsError) -> list[Action]:
        self._to(ReceiverState.CLOSED)
        return [Send(Refusal(self.chain_id, self.epoch, error.name, error.message)),
                Close(f"refused: {error.name}: {error.message}")]

    def _close(self, reason: str, suspect: str = "") -> list[Action]:
        self._to(ReceiverState.CLOSED)
        return [Close(reason, suspect)]


# --- either end of a stream: is the other end still there? ---------------------------------

class KeepaliveState(enum.Enum):
    WAITING = "waiting"            # the other end has not shown that it pings or answers: not judged
    LIVE = "live"                  # heard from within LINK_ACK_TIMEOUT_S
    SILENT = "silent"              # nothing heard for LINK_ACK_TIMEOUT_S


class Keepalive:
    """One end of a replication stream watching the other, sans-IO (the driver passes `now`).

    The predecessor's end (`pings=True`) sends a ping when `ping_due` (at once, then every
    LINK_KEEPALIVE_INTERVAL_S), whatever else it sends; the successor's end answers each
    ping at once. Either end calls `heard` for every frame that comes in (`keepalive=True`
    for a ping or the answer to one). Silence is judged only once the other end has shown
    that it takes part (a node of an older version neither pings nor answers); from then on
    `poll` turns SILENT when nothing came for LINK_ACK_TIMEOUT_S -- the other end is paused,
    or the network between the two drops what they send -- and anything heard makes it LIVE
    again.

    | state   | on                                   | to      |
    |---------|--------------------------------------|---------|
    | WAITING | `heard(keepalive=True)`              | LIVE    |
    | LIVE    | `poll`: nothing heard for the bound  | SILENT  |
    | SILENT  | `heard`                              | LIVE    |
    """

    def __init__(self, now: float, pings: bool, timeout_s: float = limits.LINK_ACK_TIMEOUT_S,
                 interval_s: float = limits.LINK_KEEPALIVE_INTERVAL_S):
        self.pings = pings
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.state = KeepaliveState.WAITING
        self.heard_at = now                # the last frame from the other end (the stream's start before)
        self.next_ping = now

    def heard(self, now: float, keepalive: bool = False) -> None:
        self.heard_at = max(self.heard_at, now)
        if keepalive or self.state is KeepaliveState.SILENT:
            self.state = KeepaliveState.LIVE

    def ping_due(self, now: float) -> bool:
        return self.pings and now >= self.next_ping

    def pinged(self, now: float) -> None:
        self.next_ping = now + self.interval_s

    def silent_for(self, now: float) -> float:
        return max(0.0, now - self.heard_at)

    def poll(self, now: float) -> KeepaliveState:
        if self.state is KeepaliveState.LIVE and now - self.heard_at >= self.timeout_s:
            self.state = KeepaliveState.SILENT
        return self.state

    def next_check(self, now: float) -> float:
        """When `poll` or `ping_due` may next change (what a driver waits for)."""
        at = self.heard_at + self.timeout_s if self.state is KeepaliveState.LIVE else now + self.interval_s
        return min(at, self.next_ping) if self.pings else at
