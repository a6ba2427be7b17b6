"""Iterator tokens: opaque, HMAC-signed, expiring positions in a partition.

Every iterator type reduces to one position: the lowest SN the next read may return
(TRIM_HORIZON is 0, AFTER_SEQUENCE_NUMBER is sn + 1, AT_TIMESTAMP is the SN lower bound
of that millisecond). A token carries (stream, partition ordinal, position, expiry)
signed with the cluster's secret, so any retrieval node can serve it and nobody can
forge or alter one. Layout before base64url: version, expiry ms, ordinal, position,
stream name, then a 16-byte HMAC-SHA256 tag.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from sms import limits, seqno
from sms.errors import ExpiredIterator, InvalidIterator

_BODY = struct.Struct(">BQI16s")
_VERSION = 1
_TAG_BYTES = 16
_ALPHABET = re.compile(r"[A-Za-z0-9_-]+")


def _unpack(token: object) -> bytes:
    """The raw bytes of a canonical unpadded base64url token; InvalidIterator otherwise."""
    if not isinstance(token, str) or not 0 < len(token) <= limits.ITERATOR_TOKEN_CHARS_MAX:
        raise InvalidIterator("iterator token missing or too long")
    if not _ALPHABET.fullmatch(token):
        raise InvalidIterator("iterator token is not base64url")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise InvalidIterator("iterator token is not base64url") from None
    if base64.urlsafe_b64encode(raw).decode().rstrip("=") != token:
        raise InvalidIterator("iterator token is not canonical base64url")
    if len(raw) < _BODY.size + _TAG_BYTES + 1:
        raise InvalidIterator("iterator token truncated")
    return raw


@dataclass(frozen=True, slots=True)
class Position:
    stream: str
    ordinal: int
    position_sn: int


class TokenCodec:
    def __init__(self, secret: bytes, clock: Callable[[], float] = time.time) -> None:
        assert len(secret) >= 16
        self.secret = secret
        self.clock = clock

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self.secret, body, hashlib.sha256).digest()[:_TAG_BYTES]

    def encode(self, pos: Position) -> str:
        expiry_ms = int((self.clock() + limits.ITERATOR_TTL_S) * 1000)
        body = _BODY.pack(_VERSION, expiry_ms, pos.ordinal, seqno.to_bytes(pos.position_sn)) + pos.stream.encode()
        return base64.urlsafe_b64encode(body + self._tag(body)).decode().rstrip("=")

    def decode(self, token: str) -> Position:
        raw = _unpack(token)
        body, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(body)):
            raise InvalidIterator("iterator token signature does not match (forged, altered or truncated)")
        version, expiry_ms, ordinal, raw_sn = _BODY.unpack_from(body)
        if version != _VERSION:
            raise InvalidIterator(f"iterator token version {version}; expected {_VERSION}")
        if expiry_ms < self.clock() * 1000:
            raise ExpiredIterator("iterator expired; get a new one with get_iterator")
        return Position(body[_BODY.size:].decode(), ordinal, seqno.from_bytes(raw_sn))


def peek(token: str) -> Position:
    """The position a token names, without checking its signature or expiry.

    Clients use it to route a read to a replica of the right partition; the server
    verifies the token before it serves anything."""
    raw = _unpack(token)
    try:
        _version, _expiry, ordinal, raw_sn = _BODY.unpack_from(raw)
        stream = raw[_BODY.size:-_TAG_BYTES].decode()
    except (struct.error, UnicodeDecodeError):
        raise InvalidIterator("iterator token is not one this cluster issued") from None
    return Position(stream, ordinal, seqno.from_bytes(raw_sn))
