"""Producer epochs and fencing through real processes (DESIGN section 13, docs/dedup.md).

A named producer takes a new epoch when it opens: a restarted producer stores what it
sends (before epochs its records were answered as duplicates of its earlier instance's,
with sn=None, and not stored; sent together they failed with SessionConflict), and an
earlier instance that writes after its successor opened is refused with ProducerFenced,
which it reports to its caller. On the wire: an epoch below the register is refused, a
duplicate is always answered with the SN of the record it duplicates, and bad
InitProducer calls are named errors.
"""

from __future__ import annotations

import pytest

from sms import errors, limits
from sms.producer import ProducerState
from tests.conftest import read_partition, stream_name
from tests.integration.session_wire import RawSession, Submit, now_ms

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stream(client) -> str:
    name = stream_name("epochs")
    client.create_stream(name, partitions=1, replication_factor=2)
    return name


def stored_data(client, stream: str) -> list[bytes]:
    return [r.data for r in read_partition(client, stream, 0)]


def test_a_restarted_producer_stores_what_it_sends(client):
    name = stream_name("restart")
    client.create_stream(name, partitions=1, replication_factor=2)
    with client.producer(name, producer_id="checkout-1") as p:
        first = [p.put(f"a{i}".encode(), "k") for i in range(5)]
    with client.producer(name, producer_id="checkout-1") as p:          # the restart
        second = [p.put(f"b{i}".encode(), "k") for i in range(3)]
    with client.producer(name, producer_id="checkout-1") as p:          # and five futures at once
        futures = [p.send(f"c{i}".encode(), "k") for i in range(5)]
        third = [f.result(timeout=limits.PUT_TIMEOUT_S) for f in futures]
    results = first + second + third
    assert all(r.sn is not None and not r.duplicate for r in results), results
    assert [r.sssn for r in second] == [0, 1, 2]                      # a new session
    assert len({r.sn for r in results}) == 13
    assert stored_data(client, name) == [f"a{i}".encode() for i in range(5)] + \
        [f"b{i}".encode() for i in range(3)] + [f"c{i}".encode() for i in range(5)]


def test_an_earlier_instance_is_fenced_and_says_so(client, stream):
    zombie = client.producer(stream, producer_id="zombie-test")
    before = zombie.put(b"zombie before", "k")
    successor = client.producer(stream, producer_id="zombie-test")
    successor.put(b"successor", "k")                      # opens: a new epoch, answered after the verdicts ran out
    assert successor._producer.epoch > zombie._producer.epoch
    late = zombie.send(b"zombie after", "k")
    with pytest.raises(errors.ProducerFenced, match="fenced by epoch"):
        late.result(timeout=limits.PUT_TIMEOUT_S)
    assert zombie._producer.state is ProducerState.FENCED
    with pytest.raises(errors.ProducerFenced):
        zombie.send(b"zombie again", "k")
    with pytest.raises(errors.ProducerFenced):
        zombie.flush()
    zombie.close()
    successor.put(b"successor 2", "k")
    successor.close()
    data = stored_data(client, stream)
    assert b"zombie after" not in data and b"zombie again" not in data
    assert {b"zombie before", b"successor", b"successor 2"} <= set(data)
    assert before.sn is not None


def test_an_old_epoch_on_the_wire_is_refused_and_stores_nothing(client, stream):
    old = client.init_producer(stream, b"wire-producer")
    new = client.init_producer(stream, b"wire-producer")
    assert new > old > 0
    with RawSession(client, stream, b"wire-producer", epoch=old) as zombie:
        with pytest.raises(errors.ProducerFenced):
            zombie.put([Submit(0, "k", b"from the old epoch", now_ms())])
    with RawSession(client, stream, b"wire-producer", epoch=new) as current:
        answer = current.put([Submit(0, "k", b"from the new epoch", now_ms())])
        assert answer.acks[0].ok and answer.acks[0].sn
    data = stored_data(client, stream)
    assert b"from the old epoch" not in data and b"from the new epoch" in data


def test_a_duplicate_always_carries_the_sn_it_duplicates(client, stream):
    epoch = client.init_producer(stream, b"dup-sn")
    t = now_ms()
    with RawSession(client, stream, b"dup-sn", epoch=epoch) as s:
        first = s.put([Submit(0, "k", b"r0", t), Submit(1, "k", b"r1", t)])
        assert all(a.ok and a.sn for a in first.acks)
        retry = s.put([Submit(1, "k", b"r1", t)], {0: 0})        # a lost ack: the same SSSN again
        assert retry.acks[0].duplicate and retry.acks[0].sn == first.acks[1].sn
        s.put([Submit(2, "k", b"r2", t)], {0: 1})                  # prunes SSSNs 0 and 1
        # below the HWM this session sent (it promised never to resend it): before, an
        # acknowledgement without an SN (sn 0); now a named error, and nothing stored
        below = s.put([Submit(0, "k", b"r0", t)])
        assert below.acks[0].error_name == "InvalidSssn" and below.acks[0].sn == 0
    # writers without an epoch replay below the HWM by design: "stored", without the SN
    with RawSession(client, stream, b"pinned-writer") as pinned:
        pinned.put([Submit(0, "k", b"p0", t), Submit(1, "k", b"p1", t)])
        pinned.put([Submit(2, "k", b"p2", t)], {0: 1})
        replay = pinned.put([Submit(0, "k", b"p0", t)])
        assert replay.acks[0].ok and replay.acks[0].duplicate
    assert stored_data(client, stream).count(b"r0") == 1 and stored_data(client, stream).count(b"p0") == 1


def test_init_producer_names_bad_calls(client, stream):
    with pytest.raises(errors.InvalidProducerId):
        client.init_producer(stream, b"")
    with pytest.raises(errors.InvalidProducerId):
        client.init_producer(stream, b"x" * (limits.PRODUCER_ID_BYTES_MAX + 1))
    with pytest.raises(errors.StreamNotFound):
        client.init_producer(stream_name("never-made"), b"p")
    with pytest.raises(errors.StreamNotFound):
        client.producer(stream_name("never-made"), producer_id="p").put(b"x", "k")
    with RawSession(client, stream, b"bad-epoch", epoch=limits.PRODUCER_EPOCH_MAX + 1) as s:
        with pytest.raises(errors.InvalidArgument):
            s.put([Submit(0, "k", b"x", now_ms())])
