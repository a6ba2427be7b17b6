"""kinesis/eventstream.py against botocore's own event-stream reader: what the endpoint
frames, botocore reads back message by message, whatever the chunks it arrives in."""

from __future__ import annotations

import json

import pytest

botocore = pytest.importorskip("botocore")
from botocore.eventstream import EventStreamBuffer  # noqa: E402

from kinesis import eventstream  # noqa: E402


def _read(chunks):
    buffer = EventStreamBuffer()
    out = []
    for chunk in chunks:
        buffer.add_data(chunk)
        out += list(buffer)
    return out


def test_botocore_reads_what_is_framed_in_any_chunking():
    payload = json.dumps({"Records": [], "ContinuationSequenceNumber": "123", "MillisBehindLatest": 0}).encode()
    stream = (eventstream.event("initial-response", b"{}", "application/x-amz-json-1.1")
              + eventstream.event("SubscribeToShardEvent", payload, "application/x-amz-json-1.1")
              + eventstream.exception("ResourceInUseException", b'{"message": "x"}', "application/x-amz-json-1.1"))
    for size in (1, 7, 64, len(stream)):
        messages = _read([stream[i:i + size] for i in range(0, len(stream), size)])
        assert [m.headers[":message-type"] for m in messages] == ["event", "event", "exception"]
        assert messages[0].headers[":event-type"] == "initial-response" and messages[0].payload == b"{}"
        assert json.loads(messages[1].payload)["ContinuationSequenceNumber"] == "123"
        assert messages[2].headers[":exception-type"] == "ResourceInUseException"


def test_a_damaged_message_is_refused_by_the_reader():
    frame = bytearray(eventstream.event("SubscribeToShardEvent", b"{}", "application/x-amz-json-1.1"))
    frame[-6] ^= 0xFF
    with pytest.raises(Exception, match="(?i)checksum|crc"):
        _read([bytes(frame)])
