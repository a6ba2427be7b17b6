"""Unit tests of sms.tokens: signed, expiring iterator tokens and the unsigned peek."""

from __future__ import annotations

import base64
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import limits, seqno
from sms.errors import ExpiredIterator, InvalidArgument, InvalidIterator
from sms.tokens import Position, TokenCodec, peek

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))
T0_S = 1_700_000_000.0
B64URL = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"   # in value order


class FakeClock:
    def __init__(self, now_s: float = T0_S):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def codec_at(now_s: float = T0_S, secret: bytes = SECRET) -> tuple[TokenCodec, FakeClock]:
    clock = FakeClock(now_s)
    return TokenCodec(secret, clock=clock), clock


positions = st.builds(
    Position,
    stream=st.text(alphabet=string.ascii_letters + string.digits + "_.-", min_size=1, max_size=128),
    ordinal=st.integers(min_value=0, max_value=seqno.ORDINAL_MAX),
    position_sn=st.integers(min_value=0, max_value=seqno.SN_MAX),
)

POS = Position("orders", 7, seqno.make(1_700_000_000_000, 42, 7))


@settings(max_examples=200)
@given(positions)
def test_encode_decode_round_trip(pos):
    tokens, _clock = codec_at()
    token = tokens.encode(pos)
    assert isinstance(token, str) and 0 < len(token) <= limits.ITERATOR_TOKEN_CHARS_MAX
    assert set(token) <= set(B64URL)
    assert tokens.decode(token) == pos


@settings(max_examples=100)
@given(positions)
def test_peek_reads_the_position_without_the_secret(pos):
    tokens, _clock = codec_at()
    assert peek(tokens.encode(pos)) == pos


def test_any_codec_with_the_same_secret_decodes():
    a, _ = codec_at()
    b, _ = codec_at()
    assert b.decode(a.encode(POS)) == POS


def test_token_from_another_secret_is_invalid():
    ours, _ = codec_at()
    theirs, _ = codec_at(secret=OTHER_SECRET)
    with pytest.raises(InvalidIterator):
        ours.decode(theirs.encode(POS))


def test_short_secret_is_refused():
    with pytest.raises(AssertionError):
        TokenCodec(b"short")


def test_every_changed_char_is_rejected_or_means_the_same_position():
    tokens, _ = codec_at()
    for stream in ("a", "ab", "abc", "orders"):
        pos = Position(stream, 3, 12345)
        token = tokens.encode(pos)
        for i in range(len(token)):
            for ch in B64URL:
                if ch == token[i]:
                    continue
                altered = token[:i] + ch + token[i + 1:]
                try:
                    got = tokens.decode(altered)
                except InvalidIterator:
                    continue
                # never a different position: only padding bits of the last char are unchecked
                assert got == pos, f"{altered!r} decoded to {got}"
                assert i == len(token) - 1


@pytest.mark.parametrize("stream", ["orders", "a", "ab"])
def test_changed_char_before_the_last_is_invalid(stream):
    tokens, _ = codec_at()
    token = tokens.encode(Position(stream, 1, 99))
    for i in range(len(token) - 1):
        altered = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1:]
        with pytest.raises(InvalidIterator):
            tokens.decode(altered)


def test_non_canonical_tokens_are_invalid():
    tokens, _ = codec_at()
    token = tokens.encode(Position("abc", 3, 12345))     # 64 chars: no padding
    short = tokens.encode(Position("a", 3, 12345))       # last char carries 4 padding bits
    last = short[-1]
    spare = next(c for c in B64URL if c != last and (B64URL.index(c) >> 4) == (B64URL.index(last) >> 4))
    for altered in (token[:5] + "!" + token[5:], " " + token, token + "==", short[:-1] + spare):
        with pytest.raises(InvalidIterator):
            tokens.decode(altered)


def test_truncated_token_is_invalid():
    tokens, _ = codec_at()
    token = tokens.encode(POS)
    for n in range(len(token)):
        with pytest.raises(InvalidIterator):
            tokens.decode(token[:n])


def test_extended_token_is_invalid():
    tokens, _ = codec_at()
    token = tokens.encode(POS)
    for extra in ("A", "AAAA", "Zm9v"):
        with pytest.raises(InvalidIterator):
            tokens.decode(token + extra)


@pytest.mark.parametrize("bad", [
    "",
    "!!!!",
    "not base64 at all %%%",
    "A",                         # one base64 char cannot be a whole byte
    "AAAAA",
    "====",
    "\u00e9\u00e9\u00e9\u00e9",
    "x" * (limits.ITERATOR_TOKEN_CHARS_MAX + 1),
    "A" * (limits.ITERATOR_TOKEN_CHARS_MAX + 1),
    None,
    b"bytes",
    123,
])
def test_garbage_is_invalid(bad):
    tokens, _ = codec_at()
    with pytest.raises(InvalidIterator) as info:
        tokens.decode(bad)
    assert isinstance(info.value, InvalidArgument)


def test_over_long_token_of_a_valid_prefix_is_invalid():
    tokens, _ = codec_at()
    long_stream = Position("s" * 900, 0, 0)
    token = tokens.encode(long_stream)
    assert len(token) > limits.ITERATOR_TOKEN_CHARS_MAX
    with pytest.raises(InvalidIterator):
        tokens.decode(token)


def test_forged_body_with_a_reused_tag_is_invalid():
    tokens, _ = codec_at()
    raw = base64.urlsafe_b64decode(tokens.encode(POS) + "==")
    body, tag = bytearray(raw[:-16]), raw[-16:]
    body[-1] ^= 0x01                                  # another stream name, same tag
    forged = base64.urlsafe_b64encode(bytes(body) + tag).decode().rstrip("=")
    with pytest.raises(InvalidIterator):
        tokens.decode(forged)


def test_token_expires_after_the_ttl():
    tokens, clock = codec_at()
    token = tokens.encode(POS)
    clock.now_s = T0_S + limits.ITERATOR_TTL_S - 0.01
    assert tokens.decode(token) == POS
    clock.now_s = T0_S + limits.ITERATOR_TTL_S + 0.01
    with pytest.raises(ExpiredIterator):
        tokens.decode(token)
    clock.now_s = T0_S + 10 * limits.ITERATOR_TTL_S
    with pytest.raises(ExpiredIterator):
        tokens.decode(token)


def test_expired_check_comes_after_the_signature():
    ours, clock = codec_at()
    theirs, _ = codec_at(secret=OTHER_SECRET)
    token = theirs.encode(POS)
    clock.now_s = T0_S + 10 * limits.ITERATOR_TTL_S
    with pytest.raises(InvalidIterator) as info:
        ours.decode(token)
    assert not isinstance(info.value, ExpiredIterator)


def test_peek_ignores_expiry_and_secret():
    theirs, _ = codec_at(now_s=0.0, secret=OTHER_SECRET)
    assert peek(theirs.encode(POS)) == POS


@pytest.mark.parametrize("bad", ["", "!!!!", "A", "AAAA", "====", None, 123])
def test_peek_of_garbage_is_invalid(bad):
    with pytest.raises(InvalidIterator):
        peek(bad)


def test_peek_of_a_token_too_short_for_stream_and_tag_is_invalid():
    tokens, _ = codec_at()
    token = tokens.encode(POS)
    with pytest.raises(InvalidIterator):
        tokens.decode(token[:40])
    with pytest.raises(InvalidIterator):
        peek(token[:40])
