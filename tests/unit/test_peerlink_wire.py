"""Unit tests of what storage/peerlink.py adds to the link protocol: the wire form of link
messages with their chain and session, frames cut at LINK_FRAME_BYTES_MAX, and the bound
on batch bytes in flight shared by every sender of one stream (`link.LinkBudget`)."""

from __future__ import annotations

import pytest

from sms import limits, seqno, wire
from sms.proto import sms_pb2
from storage import link, peerlink
from tests.unit.test_link import EPOCH, FakeView, config, make_log

CHAIN = "s:3"


@pytest.mark.parametrize("message", [
    link.Hello(CHAIN, EPOCH), link.Verified(CHAIN, EPOCH), link.Reset(CHAIN, EPOCH),
    link.Batch(CHAIN, EPOCH, b"\x01batch", seqno.make(9_000, 3, 3)),
])
def test_down_messages_round_trip_with_their_session(message):
    pb = peerlink.down_to_pb(message, session=7)
    assert pb.session == 7 and pb.chain_id == CHAIN
    assert peerlink.down_from_pb(sms_pb2.ReplicateRequest.FromString(pb.SerializeToString())) == message


@pytest.mark.parametrize("message", [
    link.Answer(CHAIN, EPOCH, seqno.make(9_000, 5, 3), seqno.make(9_000, 4, 3), seqno.make(9_000, 5, 3), 0xABCDEF),
    link.Answer(CHAIN, EPOCH, 0, 0, 0, 0),          # an empty log: still an answer, not an ack
    link.Ack(CHAIN, EPOCH, seqno.make(9_000, 5, 3), seqno.make(9_000, 2, 3)),
    link.Refusal(CHAIN, EPOCH, "StaleEpoch", "moved on"),
])
def test_up_messages_round_trip_with_their_session(message):
    pb = peerlink.up_to_pb(message, session=11)
    assert pb.session == 11 and pb.chain_id == CHAIN
    assert peerlink.up_from_pb(sms_pb2.ReplicateAck.FromString(pb.SerializeToString())) == message


def test_end_items_are_ends_of_their_chain_in_both_directions():
    assert peerlink.down_from_pb(sms_pb2.ReplicateRequest(chain_id=CHAIN, session=3, end=True)) == link.End(CHAIN)
    assert peerlink.up_from_pb(sms_pb2.ReplicateAck(chain_id=CHAIN, session=3, end=True)) == link.End(CHAIN)


def test_frames_are_cut_at_the_frame_bound_and_one_item_always_goes():
    big = limits.LINK_FRAME_BYTES_MAX // 3
    items = [sms_pb2.ReplicateRequest(chain_id=f"c{i}", batch=b"x" * big) for i in range(7)]
    out = peerlink.frames(items, lambda part: sms_pb2.LinkFrame(items=part))
    assert [len(f.items) for f in out] == [2, 2, 2, 1]
    assert [i.chain_id for f in out for i in f.items] == [f"c{i}" for i in range(7)]     # in order
    huge = [sms_pb2.ReplicateRequest(chain_id="h", batch=b"x" * (limits.LINK_FRAME_BYTES_MAX + 1))]
    assert [len(f.items) for f in peerlink.frames(huge, lambda part: sms_pb2.LinkFrame(items=part))] == [1]
    acks = [sms_pb2.ReplicateAck(chain_id=f"c{i}") for i in range(1000)]
    assert len(peerlink.frames(acks, lambda part: sms_pb2.LinkAckFrame(items=part))) == 1
    assert peerlink.frames([], lambda part: sms_pb2.LinkFrame(items=part)) == []


def _streaming(sender: link.Sender, now: float = 1.0) -> list:
    """Drive a sender to STREAMING against an empty successor; the batches it ships."""
    sender.start(now)
    sender.opened(now)
    actions = sender.receive(link.Answer(sender.chain_id, EPOCH, 0, 0, 0, 0), now)
    return [a.message for a in actions if isinstance(a, link.Send) and isinstance(a.message, link.Batch)]




def test_senders_of_one_stream_share_its_budget_of_bytes_in_flight():
    batches = make_log(4)
    size = len(batches[0])
    budget = link.LinkBudget(limit=2 * size)         # room for two batches over both chains
    a = link.Sender(FakeView("n1", config(), batches[:2]), "n2", budget=budget)    # a has two to send
    b = link.Sender(FakeView("n1", config(), batches), "n2", budget=budget)
    shipped_a = _streaming(a)
    assert len(shipped_a) == 2 and budget.bytes == 2 * size and not budget.room()
    assert _streaming(b) == [] and not b.due(2.0)     # held back by the other chain's bytes
    # a's successor acks its first batch: one batch's room, which b takes
    a.receive(link.Ack(a.chain_id, EPOCH, wire.read_header(batches[0]).last_sn, 0), 2.0)
    assert budget.bytes == size and b.due(2.0)
    shipped_b = [x.message for x in b.poll(2.0) if isinstance(x, link.Send)]
    assert len(shipped_b) == 1 and budget.bytes == 2 * size
    # a stream that breaks gives its bytes back; a stopped sender too
    a.receive(link.Lost(a.chain_id, "reset"), 3.0)
    assert budget.bytes == size
    b.stop()
    assert budget.bytes == 0


def test_one_batch_always_goes_on_an_idle_stream_whatever_its_size():
    batches = make_log(2)
    budget = link.LinkBudget(limit=1)                # smaller than any batch
    sender = link.Sender(FakeView("n1", config(), batches), "n2", budget=budget)
    assert len(_streaming(sender)) == 1
    assert budget.bytes == len(batches[0])
