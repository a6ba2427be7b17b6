"""Unit tests of storage/link.py, the chain link protocol's sans-IO state machines.

No asyncio, no sockets, no clock: each test feeds a `Sender` or a `Receiver` messages and
a `now` it picks itself, and reads the actions that come back (the liveness bound too: a
hello or batches left unanswered for LINK_ACK_TIMEOUT_S break the link as silent, and the
stream's `Keepalive`). The replica is a fake
`LogView` over a list of real (sequenced, checksum-chained) batches. The last tests wire a
sender to a receiver through in-memory queues and run the protocol to the end: a copy
through the window, a diverged successor reset and copied anew, a batch that does not
chain refused with LogDiverged; they run the real driver (storage/linkdriver.py), whose
own tests are tests/unit/test_linkdriver.py.
"""

from __future__ import annotations

import collections
import enum
import pathlib

import pytest

from sms import limits, seqno, wire
from sms.errors import InvariantViolation, LogDiverged
from sms.metadata import ChainConfig
from sms.types import Persistence
from storage import link
from storage.link import (Ack, Answer, Batch, Close, Commit, End, FinishSending, Hello, Keepalive, KeepaliveState,
                          LearnerAcked, Lost, MarkVerified, Open, Receiver, ReceiverState, Refusal, Reset, ResetLog,
                          Send, Sender, SenderState, SetTimer, Silent, Store, Verified)
from storage.linkdriver import OPENED, Observer, ReceiverDriver, SenderDriver

CHAIN = "s:3"
EPOCH = 4
T = 1000.0        # the drivers' clock: any monotonic seconds


def config(members=("n1", "n2", "n3"), learners=(), epoch=EPOCH) -> ChainConfig:
    return ChainConfig(chain_id=CHAIN, stream="s", ordinal=3, epoch=epoch, members=tuple(members),
                       learners=tuple(learners), persistence=Persistence.MEMORY)


def make_log(count: int, tag: str = "a", start_ms: int = 5_000) -> list[bytes]:
    out, prev = [], 0
    for i in range(count):
        raw = wire.build_batch([wire.encode_entry(f"k{i}".encode(), f"{tag}{i}".encode())])
        batch = wire.sequence(raw, seqno.make(start_ms + i, i + 1, 3), prev)
        prev = wire.read_header(batch).checksum
        out.append(batch)
    return out


class FakeView:
    """A replica as the machines read it (link.LogView), over a list of batches."""

    def __init__(self, node_id: str, cfg: ChainConfig, batches: list[bytes] = ()):
        self.node_id = node_id
        self.config = cfg
        self.generation = 0
        self.active = True
        self.batches = list(batches)
        self.committed_sn = 0
        self.verified = False

    @property
    def last_sn(self) -> int:
        return wire.read_header(self.batches[-1]).last_sn if self.batches else 0

    def last_header(self):
        return wire.read_header(self.batches[-1]) if self.batches else None

    def holds_batch(self, first_sn: int, last_sn: int, checksum: int) -> bool:
        for b in self.batches:
            h = wire.read_header(b)
            if h.first_sn == first_sn:
                return h.last_sn == last_sn and h.checksum == checksum
        return False

    def batches_after(self, after_sn: int, limit: int) -> list[bytes]:
        return [b for b in self.batches if wire.read_header(b).first_sn > after_sn][:limit]

    # what a driver does with the receiver's replica actions (Replica.apply, in memory)
    async def apply(self, action) -> LogDiverged | None:
        if isinstance(action, Store):
            h = wire.read_header(action.batch)
            if h.last_sn <= self.last_sn:
                return None
            last = self.last_header()
            if last is not None and h.prev_checksum != last.checksum:
                return LogDiverged(f"batch {h.first_sn} does not follow {last.checksum:#x}")
            self.batches.append(action.batch)
            if self.config.tail == self.node_id:
                self.committed_sn = self.last_sn
        elif isinstance(action, ResetLog):
            self.batches = []
            self.committed_sn = 0
            self.generation += 1
        elif isinstance(action, MarkVerified):
            self.verified = True
        return None


def sent(actions) -> list:
    return [a.message for a in actions if isinstance(a, Send)]


def shipped(actions) -> list[bytes]:
    return [m.batch for m in sent(actions) if isinstance(m, Batch)]


def answer_of(view: FakeView, epoch: int = EPOCH) -> Answer:
    last = view.last_header()
    return Answer(CHAIN, epoch, view.last_sn, view.committed_sn, last.first_sn if last else 0,
                  last.checksum if last else 0)


def streaming_sender(batches: list[bytes], successor_log: list[bytes] = (), learner: bool = False,
                     cfg: ChainConfig | None = None) -> tuple[Sender, FakeView, list]:
    cfg = cfg or config()
    view = FakeView("n3" if learner else "n1", cfg, batches)
    s = Sender(view, "n4" if learner else "n2", learner=learner)
    s.start(T)
    s.opened(T)
    succ = FakeView("n2", cfg, successor_log)
    actions = s.receive(answer_of(succ), T)
    assert s.state is SenderState.STREAMING
    return s, view, actions


# --- the sender ------------------------------------------------------------------------------

def test_sender_connects_then_says_hello_in_the_replicas_epoch():
    view = FakeView("n1", config())
    s = Sender(view, "n2")
    assert s.state is SenderState.IDLE and not s.due(T)
    assert s.start(T) == [Open()]
    assert s.state is SenderState.CONNECTING
    assert s.start(T) == [] and s.receive(Ack(CHAIN, EPOCH, 1, 1), T) == []    # no stream yet
    assert s.opened(T) == [Send(Hello(CHAIN, EPOCH))]
    assert s.state is SenderState.HELLO_SENT and s.epoch == EPOCH
    assert s.opened(T) == []


def test_sender_verifies_an_empty_successor_and_ships_the_whole_log():
    batches = make_log(3)
    s, view, actions = streaming_sender(batches)
    assert actions[0] == Commit(0)                        # progress before verified
    assert actions[1] == Send(Verified(CHAIN, EPOCH))
    assert shipped(actions) == batches
    assert all(m.committed_sn == view.committed_sn and m.epoch == EPOCH for m in sent(actions)[1:])
    assert s.sent_sn == view.last_sn and s.acked_sn == 0 and len(s.inflight) == 3


def test_sender_resumes_after_the_successors_last_batch():
    batches = make_log(5)
    s, _view, actions = streaming_sender(batches, successor_log=batches[:3])
    assert shipped(actions) == batches[3:]
    assert s.acked_sn == wire.read_header(batches[2]).last_sn


def test_sender_resets_a_successor_whose_last_batch_it_does_not_hold():
    view = FakeView("n1", config(), make_log(3))
    s = Sender(view, "n2")
    s.start(T)
    s.opened(T)
    other = FakeView("n2", config(), make_log(2, tag="b"))      # same SNs, other checksums
    actions = s.receive(answer_of(other), T)
    assert actions == [Send(Reset(CHAIN, EPOCH)), FinishSending(), SetTimer(T + limits.LINK_RESET_TIMEOUT_S)]
    assert s.state is SenderState.RESETTING and s.deadline == T + limits.LINK_RESET_TIMEOUT_S
    assert s.receive(Ack(CHAIN, EPOCH, 0, 0), T + 1) == []        # drained
    assert s.receive(Refusal(CHAIN, EPOCH, "StaleEpoch", "x"), T + 1) == []
    actions = s.receive(End(CHAIN), T + 2)
    assert s.state is SenderState.BROKEN
    assert actions[0] == Close(actions[0].reason, suspect="")      # a wipe is no failure of the peer
    assert actions[1] == SetTimer(T + 2 + limits.LINK_RETRY_INTERVAL_S)


def test_sender_gives_up_a_reset_the_successor_never_ends():
    view = FakeView("n1", config(), make_log(2))
    s = Sender(view, "n2")
    s.start(T)
    s.opened(T)
    s.receive(answer_of(FakeView("n2", config(), make_log(1, tag="b"))), T)
    assert not s.due(T + 1) and s.poll(T + 1) == []
    at = T + limits.LINK_RESET_TIMEOUT_S
    assert s.due(at)
    actions = s.poll(at)
    assert s.state is SenderState.BROKEN and actions[0].suspect == "n2"


def test_broken_sender_reconnects_when_its_timer_is_due():
    s, _view, _ = streaming_sender(make_log(1))
    actions = s.receive(Lost(CHAIN, "connection reset"), T)
    assert s.state is SenderState.BROKEN and actions == [Close(actions[0].reason, "n2"),
                                                         SetTimer(T + limits.LINK_RETRY_INTERVAL_S)]
    assert "connection reset" in s.broken_reason
    assert not s.due(T + limits.LINK_RETRY_INTERVAL_S / 2) and s.poll(T + limits.LINK_RETRY_INTERVAL_S / 2) == []
    assert s.receive(Ack(CHAIN, EPOCH, 9, 9), T + 0.1) == []     # a late message of the old stream
    assert s.due(T + limits.LINK_RETRY_INTERVAL_S)
    assert s.poll(T + limits.LINK_RETRY_INTERVAL_S) == [Open()]
    assert s.state is SenderState.CONNECTING and s.deadline is None
    assert s.opened(T + 1) == [Send(Hello(CHAIN, EPOCH))]


def test_sender_open_failure_retries_later():
    s = Sender(FakeView("n1", config()), "n2")
    assert s.open_failed(T, "no address") == []                  # not connecting
    s.start(T)
    actions = s.open_failed(T, "no address")
    assert s.state is SenderState.BROKEN and actions[0] == Close("no address", "")


@pytest.mark.parametrize("name,suspect", [("StaleEpoch", ""), ("WrongOwner", "n2"), ("LogDiverged", "n2")])
def test_sender_refused_at_hello(name, suspect):
    s = Sender(FakeView("n1", config()), "n2")
    s.start(T)
    s.opened(T)
    actions = s.receive(Refusal(CHAIN, EPOCH, name, "no"), T)
    assert s.state is SenderState.BROKEN and actions[0].suspect == suspect and name in actions[0].reason


def test_sender_retries_soon_after_a_hello_refused_for_its_epoch():
    """One of the two nodes has not applied the new chain config yet (a failover under way):
    the hello goes again after LINK_STALE_RETRY_S, not the full retry interval."""
    s = Sender(FakeView("n1", config()), "n2")
    s.start(T)
    s.opened(T)
    actions = s.receive(Refusal(CHAIN, EPOCH, "StaleEpoch", "epoch 4; this replica is at epoch 3"), T)
    assert actions[1] == SetTimer(T + limits.LINK_STALE_RETRY_S) and limits.LINK_STALE_RETRY_S < limits.LINK_RETRY_INTERVAL_S
    assert s.poll(T + limits.LINK_STALE_RETRY_S) == [Open()]
    # a refusal for another reason waits the full interval
    s.opened(T + 1)
    assert s.receive(Refusal(CHAIN, EPOCH, "WrongOwner", "no replica"), T + 1)[1] == \
        SetTimer(T + 1 + limits.LINK_RETRY_INTERVAL_S)


@pytest.mark.parametrize("event,suspect", [(End(CHAIN), "n2"), (Lost(CHAIN, "reset"), "n2"),
                                           (Ack(CHAIN, EPOCH, 0, 0), "n2"),          # before the answer
                                           (Answer("other:1", EPOCH, 0, 0, 0, 0), "n2")])
def test_sender_breaks_on_a_bad_or_missing_answer(event, suspect):
    s = Sender(FakeView("n1", config()), "n2")
    s.start(T)
    s.opened(T)
    actions = s.receive(event, T)
    assert s.state is SenderState.BROKEN and actions[0].suspect == suspect


def test_sender_drops_an_answer_of_another_epoch():
    view = FakeView("n1", config())
    s = Sender(view, "n2")
    s.start(T)
    s.opened(T)
    actions = s.receive(Answer(CHAIN, EPOCH + 1, 0, 0, 0, 0), T)
    assert s.state is SenderState.BROKEN and actions[0].suspect == ""
    # and an answer in the link's epoch after the replica moved on
    s.poll(T + 1)
    s.opened(T + 1)
    view.config = config(epoch=EPOCH + 1)
    s.receive(Answer(CHAIN, EPOCH, 0, 0, 0, 0), T + 1)
    assert s.state is SenderState.BROKEN


def test_sender_window_in_batches():
    batches = make_log(limits.CHAIN_INFLIGHT_BATCHES_MAX + 4)
    s, view, actions = streaming_sender(batches)
    assert shipped(actions) == batches[:limits.CHAIN_INFLIGHT_BATCHES_MAX]
    assert not s.due(T) and s.poll(T) == []                        # the window is full
    first_two = wire.read_header(batches[1]).last_sn
    actions = s.receive(Ack(CHAIN, EPOCH, first_two, first_two), T)
    assert actions[0] == Commit(first_two)
    assert shipped(actions) == batches[limits.CHAIN_INFLIGHT_BATCHES_MAX:limits.CHAIN_INFLIGHT_BATCHES_MAX + 2]
    assert s.acked_sn == first_two
    # an older ack (a duplicate) does not move acked_sn back
    s.receive(Ack(CHAIN, EPOCH, wire.read_header(batches[0]).last_sn, 0), T)
    assert s.acked_sn == first_two


def test_sender_window_in_bytes(monkeypatch):
    batches = make_log(4)
    monkeypatch.setattr(limits, "CHAIN_INFLIGHT_BYTES_MAX", len(batches[0]) + 1)
    s, _view, actions = streaming_sender(batches)
    assert shipped(actions) == batches[:1]                         # one batch always goes
    actions = s.receive(Ack(CHAIN, EPOCH, wire.read_header(batches[0]).last_sn, 0), T)
    assert shipped(actions) == batches[1:2]


def test_sender_ships_what_the_replica_appends():
    batches = make_log(3)
    s, view, _ = streaming_sender(batches[:1])
    assert not s.due(T)
    view.batches.extend(batches[1:])
    view.committed_sn = 7
    assert s.due(T)
    actions = s.poll(T)
    assert shipped(actions) == batches[1:] and all(m.committed_sn == 7 for m in sent(actions))


@pytest.mark.parametrize("event", [Ack(CHAIN, EPOCH + 1, 0, 0), Answer(CHAIN, EPOCH, 0, 0, 0, 0),
                                   Refusal(CHAIN, EPOCH, "LogDiverged", "x"), End(CHAIN), Lost(CHAIN, "x"),
                                   Ack("other:1", EPOCH, 0, 0)])
def test_streaming_sender_breaks_and_suspects(event):
    s, _view, _ = streaming_sender(make_log(1))
    actions = s.receive(event, T)
    assert s.state is SenderState.BROKEN and actions[0].suspect == "n2" and not s.inflight


def test_streaming_sender_ends_when_its_replica_moves_to_another_epoch():
    s, view, _ = streaming_sender(make_log(1))
    view.config = config(epoch=EPOCH + 1)
    assert s.due(T)
    actions = s.poll(T)
    assert s.state is SenderState.BROKEN and actions[0].suspect == "" and "epoch" in actions[0].reason
    # an ack that arrives in between is not applied either
    s2, view2, _ = streaming_sender(make_log(1))
    view2.config = config(epoch=EPOCH + 1)
    actions = s2.receive(Ack(CHAIN, EPOCH, 5, 5), T)
    assert s2.state is SenderState.BROKEN and not any(isinstance(a, Commit) for a in actions)


def test_streaming_sender_starts_again_when_its_own_log_was_wiped():
    s, view, _ = streaming_sender(make_log(2))
    view.generation += 1
    assert s.due(T)
    actions = s.poll(T)
    assert s.state is SenderState.BROKEN and "wiped" in actions[0].reason and actions[0].suspect == ""


def test_sender_stops_for_good():
    s, view, _ = streaming_sender(make_log(1))
    assert s.stop() == [Close("link stopped")]
    assert s.state is SenderState.STOPPED and s.stop() == []
    assert s.receive(Ack(CHAIN, EPOCH, 1, 1), T) == [] and s.poll(T + 100) == [] and not s.due(T + 100)
    idle = Sender(FakeView("n1", config()), "n2")
    assert idle.stop() == []                                      # no stream to close


def test_sender_stops_when_its_replica_closes():
    s, view, _ = streaming_sender(make_log(1))
    view.active = False
    assert s.due(T)
    assert s.poll(T) == [Close("replica closed")] and s.state is SenderState.STOPPED


def test_tail_to_learner_reports_progress_not_commits():
    batches = make_log(3)
    cfg = config(learners=("n4",))
    s, _view, actions = streaming_sender(batches, successor_log=batches[:1], learner=True, cfg=cfg)
    first = wire.read_header(batches[0]).last_sn
    assert actions[0] == LearnerAcked("n4", first, hello=True)
    assert not any(isinstance(a, Commit) for a in actions)
    last = wire.read_header(batches[2]).last_sn
    assert s.receive(Ack(CHAIN, EPOCH, last, 0), T)[0] == LearnerAcked("n4", last, hello=False)


# --- the sender's liveness bound ----------------------------------------------------------------

BOUND = limits.LINK_ACK_TIMEOUT_S
BATCH_BOUND = limits.LINK_BATCH_ACK_TIMEOUT_S


def _silent_break(s: Sender, actions: list, at: float) -> None:
    assert s.state is SenderState.BROKEN and not s.inflight and s.ack_deadline is None
    assert actions == [Close(actions[0].reason, suspect="n2", silent=True), SetTimer(at + limits.LINK_STALE_RETRY_S)]


def test_sender_breaks_as_silent_when_its_hello_goes_unanswered():
    s = Sender(FakeView("n1", config()), "n2")
    s.start(T)
    s.opened(T)
    assert s.ack_deadline == T + BOUND
    assert not s.due(T + BOUND / 2) and s.poll(T + BOUND / 2) == []
    assert s.due(T + BOUND)
    actions = s.poll(T + BOUND)
    _silent_break(s, actions, T + BOUND)
    assert "answer to the hello" in actions[0].reason
    assert s.poll(T + BOUND + limits.LINK_RETRY_INTERVAL_S) == [Open()]      # and tries again


def test_sender_breaks_as_silent_when_batches_in_flight_go_unacked():
    """Batches owe an ack within the longer LINK_BATCH_ACK_TIMEOUT_S (a successor slow to
    store is not silent: the keepalive hears it); a hello within LINK_ACK_TIMEOUT_S."""
    batches = make_log(3)
    s, _view, _ = streaming_sender(batches)
    assert s.ack_deadline == T + BATCH_BOUND           # the first batch in flight started the wait
    # an ack of part of them starts the wait again
    first = wire.read_header(batches[0]).last_sn
    s.receive(Ack(CHAIN, EPOCH, first, first), T + BATCH_BOUND / 2)
    assert s.ack_deadline == T + BATCH_BOUND / 2 + BATCH_BOUND
    assert not s.due(T + BATCH_BOUND) and s.poll(T + BATCH_BOUND) == []
    at = T + BATCH_BOUND / 2 + BATCH_BOUND
    actions = s.poll(at)
    _silent_break(s, actions, at)
    assert "2 batches in flight" in actions[0].reason


def test_sender_owes_nothing_when_every_batch_is_acked():
    batches = make_log(2)
    s, view, _ = streaming_sender(batches)
    last = wire.read_header(batches[1]).last_sn
    s.receive(Ack(CHAIN, EPOCH, last, last), T + 0.1)
    assert s.ack_deadline is None and not s.due(T + 100) and s.poll(T + 100) == []
    assert s.state is SenderState.STREAMING
    # an append ships a batch, which starts the wait at the time it ships
    view.batches.extend(make_log(3)[2:])
    assert shipped(s.poll(T + 200)) and s.ack_deadline == T + 200 + BATCH_BOUND


def test_sender_breaks_as_silent_when_the_transport_hears_nothing():
    s, _view, _ = streaming_sender(make_log(1))
    actions = s.receive(Silent(CHAIN, "nothing heard for 0.6s"), T + 0.1)
    _silent_break(s, actions, T + 0.1)
    assert "nothing heard" in actions[0].reason
    # a reset in progress too; and nothing once the stream is gone
    r = Sender(FakeView("n1", config(), make_log(2)), "n2")
    r.start(T)
    r.opened(T)
    r.receive(answer_of(FakeView("n2", config(), make_log(1, tag="b"))), T)
    assert r.state is SenderState.RESETTING and r.ack_deadline is None
    assert r.receive(Silent(CHAIN, "x"), T)[0].silent
    assert r.receive(Silent(CHAIN, "x"), T) == []


def test_sender_without_an_ack_bound_never_goes_silent():
    view = FakeView("n1", config(), make_log(2))
    s = Sender(view, "n2", ack_timeout_s=None)
    s.start(T)
    s.opened(T)
    s.receive(answer_of(FakeView("n2", config())), T)
    assert s.inflight and s.ack_deadline is None
    assert not s.due(T + 1000) and s.poll(T + 1000) == [] and s.state is SenderState.STREAMING


def test_a_broken_or_refused_link_is_not_silent():
    s, _view, _ = streaming_sender(make_log(1))
    assert not s.receive(Lost(CHAIN, "reset"), T)[0].silent
    s, _view, _ = streaming_sender(make_log(1))
    assert not s.receive(Refusal(CHAIN, EPOCH, "LogDiverged", "x"), T)[0].silent


# --- the stream's keepalive ------------------------------------------------------------------------

def test_keepalive_pings_at_once_then_every_interval():
    k = Keepalive(T, pings=True)
    assert k.ping_due(T)
    k.pinged(T)
    assert not k.ping_due(T + limits.LINK_KEEPALIVE_INTERVAL_S / 2)
    assert k.ping_due(T + limits.LINK_KEEPALIVE_INTERVAL_S)
    assert not Keepalive(T, pings=False).ping_due(T + 100)          # the successor's end answers only


def test_keepalive_judges_silence_only_once_the_other_end_takes_part():
    k = Keepalive(T, pings=False)
    k.heard(T + 0.1)                                   # a frame of links, no ping: an older predecessor
    assert k.poll(T + 100) is KeepaliveState.WAITING
    k.heard(T + 100, keepalive=True)                   # a ping
    assert k.poll(T + 100 + BOUND / 2) is KeepaliveState.LIVE
    assert k.next_check(T + 100) == T + 100 + BOUND


def test_keepalive_turns_silent_after_the_bound_and_live_again_when_heard():
    k = Keepalive(T, pings=True)
    k.heard(T + 0.05, keepalive=True)                  # the answer to the first ping
    k.heard(T + 0.2)                                   # acks
    assert k.poll(T + 0.2 + BOUND - 0.01) is KeepaliveState.LIVE
    assert k.poll(T + 0.2 + BOUND + 1e-6) is KeepaliveState.SILENT     # (past the bound: no float tie)
    assert k.silent_for(T + 0.2 + BOUND + 1e-6) == pytest.approx(BOUND, abs=1e-5)
    assert k.poll(T + 5) is KeepaliveState.SILENT      # stays so
    k.heard(T + 5)
    assert k.poll(T + 5) is KeepaliveState.LIVE


# --- the receiver ----------------------------------------------------------------------------

def receiver_at(node="n2", cfg=None, batches=()) -> tuple[Receiver, FakeView]:
    view = FakeView(node, cfg or config(), batches)
    return Receiver(node), view


def verified_receiver(batches=()) -> tuple[Receiver, FakeView]:
    r, view = receiver_at(batches=batches)
    r.receive(Hello(CHAIN, EPOCH), view)
    assert r.receive(Verified(CHAIN, EPOCH), view) == [MarkVerified()]
    assert r.state is ReceiverState.STREAMING
    return r, view


def refusal(actions) -> Refusal:
    assert len(actions) == 2 and isinstance(actions[1], Close)
    (message,) = sent(actions)
    assert isinstance(message, Refusal)
    return message


def test_receiver_answers_a_hello_with_its_last_batch():
    batches = make_log(2)
    r, view = receiver_at(batches=batches)
    view.committed_sn = 42
    actions = r.receive(Hello(CHAIN, EPOCH), view)
    last = wire.read_header(batches[1])
    assert actions == [Send(Answer(CHAIN, EPOCH, last.last_sn, 42, last.first_sn, last.checksum))]
    assert r.state is ReceiverState.VERIFYING and r.predecessor == "n1" and r.generation == 0
    assert not r.due(view) and r.poll(view) == []


@pytest.mark.parametrize("case,error", [("no replica", "WrongOwner"), ("closed", "WrongOwner"),
                                        ("epoch", "StaleEpoch"), ("head", "WrongOwner"),
                                        ("not hello", "FailedPrecondition")])
def test_receiver_refuses_a_bad_hello(case, error):
    r, view = receiver_at(node="n1" if case == "head" else "n2")
    message = Hello(CHAIN, EPOCH + 1 if case == "epoch" else EPOCH)
    if case == "closed":
        view.active = False
    if case == "not hello":
        message = Batch(CHAIN, EPOCH, make_log(1)[0], 0)
    actions = r.receive(message, None if case == "no replica" else view)
    assert refusal(actions).error_name == error
    assert r.state is ReceiverState.CLOSED
    assert r.receive(Hello(CHAIN, EPOCH), view) == []              # closed: nothing more


def test_receiver_learner_answers_its_tail():
    r, view = receiver_at(node="n4", cfg=config(learners=("n4",)))
    assert isinstance(sent(r.receive(Hello(CHAIN, EPOCH), view))[0], Answer)
    assert r.predecessor == "n3"


def test_receiver_stores_batches_once_verified():
    r, view = verified_receiver()
    assert r.receive(Verified(CHAIN, EPOCH), view) == []           # a duplicate
    batch = make_log(1)[0]
    assert r.receive(Batch(CHAIN, EPOCH, batch, 9), view) == [Store(batch, 9, 0)]


def test_receiver_refuses_a_batch_before_verified():
    r, view = receiver_at()
    r.receive(Hello(CHAIN, EPOCH), view)
    assert refusal(r.receive(Batch(CHAIN, EPOCH, make_log(1)[0], 0), view)).error_name == "FailedPrecondition"


def test_receiver_wipes_its_log_on_reset_and_ends_the_stream():
    r, view = receiver_at(batches=make_log(1))
    r.receive(Hello(CHAIN, EPOCH), view)
    actions = r.receive(Reset(CHAIN, EPOCH), view)
    assert actions[0] == ResetLog() and isinstance(actions[1], Close) and len(actions) == 2
    assert r.state is ReceiverState.CLOSED
    assert r.receive(Batch(CHAIN, EPOCH, make_log(1)[0], 0), view) == []


@pytest.mark.parametrize("message,error", [(Reset(CHAIN, EPOCH), "FailedPrecondition"),
                                           (Hello(CHAIN, EPOCH), "FailedPrecondition"),
                                           (Verified("other:1", EPOCH), "FailedPrecondition"),
                                           (Batch(CHAIN, EPOCH - 1, b"", 0), "StaleEpoch")])
def test_streaming_receiver_refuses_unexpected_messages(message, error):
    r, view = verified_receiver()
    assert refusal(r.receive(message, view)).error_name == error
    assert r.state is ReceiverState.CLOSED


def test_receiver_refuses_a_batch_after_its_replica_moved_on():
    r, view = verified_receiver()
    view.config = config(epoch=EPOCH + 1)
    assert refusal(r.receive(Batch(CHAIN, EPOCH, make_log(1)[0], 0), view)).error_name == "StaleEpoch"


def test_receiver_acks_progress():
    batches = make_log(2)
    r, view = verified_receiver()
    assert not r.due(view)
    view.batches.append(batches[0])
    view.committed_sn = 3
    assert r.due(view)
    assert r.poll(view) == [Send(Ack(CHAIN, EPOCH, view.last_sn, 3))]
    assert not r.due(view) and r.poll(view) == []


@pytest.mark.parametrize("change,error", [("epoch", "StaleEpoch"), ("wiped", "StaleEpoch"), ("closed", None)])
def test_receiver_ends_when_its_replica_changes(change, error):
    r, view = verified_receiver()
    if change == "epoch":
        view.config = config(epoch=EPOCH + 1)
    elif change == "wiped":
        view.generation += 1
    else:
        view.active = False
    assert r.due(view)
    actions = r.poll(view)
    if error:
        assert refusal(actions).error_name == error
    else:
        assert actions == [Close("replica closed")]
    assert r.state is ReceiverState.CLOSED and not r.due(view)


def test_receiver_store_failure_is_refused_by_name():
    r, view = verified_receiver()
    message = refusal(r.store_failed(LogDiverged("does not follow")))
    assert message.error_name == "LogDiverged" and r.state is ReceiverState.CLOSED
    assert r.store_failed(LogDiverged("again")) == []


def test_receiver_end_and_loss():
    r, view = verified_receiver()
    assert r.receive(End(CHAIN), view) == [Close("the predecessor ended the stream")]
    r, view = verified_receiver()
    actions = r.receive(Lost(CHAIN, "cancelled"), view)
    assert actions == [Close(actions[0].reason, suspect="n1")]
    assert r.receive(Lost(CHAIN, "again"), view) == []


# --- both sides, wired through in-memory streams ----------------------------------------------

def run_now(coro):
    """Run a driver's coroutine that never waits (FakeView applies at once) to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    raise AssertionError("the driver waited on something")


class _ReceiverEnd(Observer):
    """The receiver's transport on the wire: answers go up; a store failure is logged."""

    def __init__(self, wire: "Wire"):
        self.wire = wire

    def send(self, message) -> None:
        self.wire.up.append(message)

    def close(self, action) -> None:
        self.wire.up.append(End(CHAIN))

    def after_apply(self, action, error) -> None:
        if error is not None:
            self.wire.log.append(f"store failed: {error.name}")


class Wire:
    """One stream: the sender's and the receiver's machines, run by the real driver
    (storage/linkdriver.py) with FIFO queues between them as their transport, run to
    quiescence; the receiver's replica actions applied to a FakeView."""

    def __init__(self, sender: Sender, successor: FakeView):
        self.sender, self.successor = sender, successor
        self.driver = SenderDriver(sender, sender.view, self)
        self.receiver: Receiver | None = None
        self.receiving: ReceiverDriver | None = None
        self.down: collections.deque = collections.deque()
        self.up: collections.deque = collections.deque()
        self.now = T
        self.log: list[str] = []

    # the sender's transport (linkdriver.SenderTransport)
    def current(self) -> bool:
        return True

    def open(self) -> object:
        self.receiver = Receiver(self.successor.node_id)
        end = _ReceiverEnd(self)
        self.receiving = ReceiverDriver(self.receiver, self.successor, end, observer=end)
        self.down.clear()
        self.up.clear()
        return OPENED

    def send(self, message) -> None:
        self.down.append(message)

    def close(self, action) -> None:
        self.log.append(f"sender closed: {action.reason}")
        self.receiving.end(Lost(CHAIN, "cancelled"))

    def set_timer(self, at: float) -> None:
        pass

    def sender_do(self, actions) -> None:
        run_now(self.driver.act(actions, self.now))

    def receiver_do(self, actions) -> None:
        run_now(self.receiving.act(actions))

    def run(self, rounds: int = 1000) -> None:
        self.sender_do(self.sender.start(self.now))
        for _ in range(rounds):
            if self.down:
                self.receiver_do(self.receiver.receive(self.down.popleft(), self.successor))
            elif self.up:
                self.sender_do(self.sender.receive(self.up.popleft(), self.now))
            elif self.receiver is not None and self.receiver.due(self.successor):
                self.receiver_do(self.receiver.poll(self.successor))
            elif self.sender.deadline is not None:
                self.now = max(self.now, self.sender.deadline)
                self.sender_do(self.sender.poll(self.now))
            elif self.sender.due(self.now):
                self.sender_do(self.sender.poll(self.now))
            else:
                return
        raise AssertionError("no quiescence")


def test_a_link_copies_a_log_through_its_window():
    batches = make_log(3 * limits.CHAIN_INFLIGHT_BATCHES_MAX + 1)
    cfg = config()
    view = FakeView("n1", cfg, batches)
    w = Wire(Sender(view, "n2"), FakeView("n2", cfg))
    w.run()
    assert w.successor.batches == batches and w.successor.verified
    assert w.sender.state is SenderState.STREAMING and w.sender.acked_sn == view.last_sn and not w.sender.inflight


def test_a_diverged_successor_is_reset_and_copied_anew():
    batches = make_log(4)
    cfg = config()
    successor = FakeView("n2", cfg, make_log(2, tag="other"))
    w = Wire(Sender(FakeView("n1", cfg, batches), "n2"), successor)
    w.run()
    assert successor.batches == batches and successor.generation == 1
    assert any("wiped" in line for line in w.log)


def test_a_batch_that_does_not_chain_is_refused_with_log_diverged():
    """The hello found the logs equal; a bug (here: the predecessor's log changed under the
    stream without a generation bump) ships a batch that does not follow the successor's
    last one: the successor refuses it and the link starts again from a hello, which
    resets the successor."""
    cfg = config()
    ours, rewritten = make_log(2), make_log(2, tag="rewritten")
    view = FakeView("n1", cfg, ours)
    successor = FakeView("n2", cfg, ours[:1])
    w = Wire(Sender(view, "n2"), successor)
    w.sender_do(w.sender.start(w.now))
    w.receiver_do(w.receiver.receive(w.down.popleft(), successor))       # hello -> answer
    view.batches = [ours[0], rewritten[1]]                               # (what a generation bump prevents)
    w.sender_do(w.sender.receive(w.up.popleft(), w.now))                 # verified, ships rewritten[1]
    while w.down:                                                        # verified, the batch
        w.receiver_do(w.receiver.receive(w.down.popleft(), successor))
    assert "store failed: LogDiverged" in w.log and successor.batches == ours[:1]
    assert w.receiver.state is ReceiverState.CLOSED
    view.batches = rewritten
    w.run()
    assert w.sender.broken_reason.startswith("the successor's log was not a prefix")
    assert successor.batches == rewritten and successor.generation == 1


# --- the transition tables ---------------------------------------------------------------------

def test_a_transition_outside_the_table_is_a_bug():
    s = Sender(FakeView("n1", config()), "n2")
    s.start(T)
    with pytest.raises(InvariantViolation, match="connecting -> streaming is not a sender's transition"):
        s._to(SenderState.STREAMING)
    r, _view = receiver_at()
    with pytest.raises(InvariantViolation, match="await_hello -> streaming is not a receiver's transition"):
        r._to(ReceiverState.STREAMING)
    assert link.SENDER_TRANSITIONS[SenderState.STOPPED] == frozenset()
    assert link.RECEIVER_TRANSITIONS[ReceiverState.CLOSED] == frozenset()
    assert set(link.SENDER_TRANSITIONS) == set(SenderState) and set(link.RECEIVER_TRANSITIONS) == set(ReceiverState)


def _documented(title: str, states: type[enum.Enum], with_stream: set) -> set[tuple]:
    """The (from, to) pairs of a state table in docs/architecture.md ("any with a stream"
    and "any" stand for the states they name; a row that stays is no transition)."""
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    rows = text[text.index(title):].split("\n\n")[1].splitlines()[2:]
    by_name = {s.name: s for s in states}
    pairs = set()
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        sources, target = cells[0], cells[2]
        if sources == "any with a stream":
            froms = with_stream
        elif sources == "any":
            froms = {s for s in states if s.name not in ("STOPPED", "CLOSED")}
        else:
            froms = {by_name[n.strip()] for n in sources.split(",")}
        if target in ("same",):
            continue
        pairs |= {(f, by_name[target]) for f in froms if f is not by_name[target]}
    return pairs


def test_the_documented_tables_are_the_code_tables():
    code = {(f, t) for f, ts in link.SENDER_TRANSITIONS.items() for t in ts}
    stream = {SenderState.HELLO_SENT, SenderState.RESETTING, SenderState.STREAMING}
    assert _documented("**The sender**", SenderState, stream) == code
    code = {(f, t) for f, ts in link.RECEIVER_TRANSITIONS.items() for t in ts}
    assert _documented("**The receiver**", ReceiverState, set()) == code
