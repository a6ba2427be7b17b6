"""The `application/vnd.amazon.eventstream` framing, which SubscribeToShard answers in:
a stream of messages, each a prelude (total length, headers length, CRC32 of those
eight bytes), headers (name, type 7 = string, value), a payload, and a CRC32 of all
before it. Over HTTP/1.1 the messages go as the body's chunks, over HTTP/2 as DATA
frames; the SDKs read them as they come.

SubscribeToShard sends an `initial-response` event first (its payload the operation's
other output members: `{}`), then `SubscribeToShardEvent`s, and ends with an exception
message when the subscription fails after it started."""

from __future__ import annotations

import struct
import zlib

_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")
STRING = 7


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return bytes([len(raw_name)]) + raw_name + bytes([STRING]) + struct.pack(">H", len(raw_value)) + raw_value


def message(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One message of the stream."""
    head = b"".join(_header(n, v) for n, v in headers)
    total = _PRELUDE.size + _CRC.size + len(head) + len(payload) + _CRC.size
    prelude = _PRELUDE.pack(total, len(head))
    body = prelude + _CRC.pack(zlib.crc32(prelude)) + head + payload
    return body + _CRC.pack(zlib.crc32(body))


def event(event_type: str, payload: bytes, content_type: str) -> bytes:
    return message([(":message-type", "event"), (":event-type", event_type), (":content-type", content_type)],
                   payload)


def exception(kind: str, payload: bytes, content_type: str) -> bytes:
    return message([(":message-type", "exception"), (":exception-type", kind), (":content-type", content_type)],
                   payload)
