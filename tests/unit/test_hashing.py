"""Unit tests of sms.hashing: Kinesis MD5 key mapping, key validation, checksums."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import hashing, limits
from sms.errors import InvalidArgument, InvalidHashKey, InvalidPartitionKey

partition_keys = st.text(min_size=limits.PARTITION_KEY_CHARS_MIN, max_size=limits.PARTITION_KEY_CHARS_MAX)


@settings(max_examples=300)
@given(partition_keys)
def test_hash_key_matches_kinesis_md5_mapping(key):
    expected = int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16)
    assert hashing.hash_key_of(key) == expected
    assert 0 <= hashing.hash_key_of(key) < hashing.HASH_SPACE


@pytest.mark.parametrize("key, expected_hex", [
    # md5 test vectors (RFC 1321)
    ("a", "0cc175b9c0f1b6a831c399e269772661"),
    ("abc", "900150983cd24fb0d6963f7d28e17f72"),
    ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
])
def test_hash_key_of_known_vectors(key, expected_hex):
    assert hashing.hash_key_of(key) == int(expected_hex, 16)


def test_hash_key_of_non_ascii_key_uses_utf8():
    key = "ключ-\u00e9-\U0001f600"
    assert hashing.hash_key_of(key) == int(hashlib.md5(key.encode("utf-8")).hexdigest(), 16)


@pytest.mark.parametrize("key", [
    "a",
    "x" * limits.PARTITION_KEY_CHARS_MAX,
    "\u00e9" * limits.PARTITION_KEY_CHARS_MAX,       # 256 chars, 512 UTF-8 bytes: chars count
    "with space",
])
def test_validate_partition_key_accepts_1_to_256_chars(key):
    assert hashing.validate_partition_key(key) is key


@pytest.mark.parametrize("key", [
    "",
    "x" * (limits.PARTITION_KEY_CHARS_MAX + 1),
    None,
    b"bytes",
    1,
    ["a"],
])
def test_validate_partition_key_rejects_bad_keys(key):
    with pytest.raises(InvalidPartitionKey) as info:
        hashing.validate_partition_key(key)
    assert isinstance(info.value, InvalidArgument)


def test_limits_of_partition_keys_are_kinesis_limits():
    assert limits.PARTITION_KEY_CHARS_MIN == 1
    assert limits.PARTITION_KEY_CHARS_MAX == 256


@pytest.mark.parametrize("value, expected", [
    ("0", 0),
    ("42", 42),
    ("000042", 42),
    (str(limits.HASH_KEY_MAX), limits.HASH_KEY_MAX),
    (0, 0),
    (limits.HASH_KEY_MAX, limits.HASH_KEY_MAX),
])
def test_parse_explicit_hash_key_accepts_0_to_2_128_minus_1(value, expected):
    assert hashing.parse_explicit_hash_key(value) == expected


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=limits.HASH_KEY_MAX))
def test_parse_explicit_hash_key_round_trips_decimal(value):
    assert hashing.parse_explicit_hash_key(str(value)) == value
    assert hashing.parse_explicit_hash_key(value) == value


@pytest.mark.parametrize("value", [
    "",
    "-1",
    "abc",
    " 1",
    "1.5",
    "0x1f",
    "1" * 40,
    "9" * 39,                           # 39 digits above 2^128 - 1
    str(limits.HASH_KEY_MAX + 1),
    "\u0663",                           # a non-ASCII digit
    -1,
    limits.HASH_KEY_MAX + 1,
    2 ** 200,
    True,
    False,
    1.0,
    None,
    b"1",
])
def test_parse_explicit_hash_key_rejects_out_of_range_and_non_decimal(value):
    with pytest.raises(InvalidHashKey):
        hashing.parse_explicit_hash_key(value)


def test_checksum_and_signature_are_deterministic_and_sensitive():
    assert hashing.checksum(b"abc") == hashing.checksum(memoryview(b"abc"))
    assert hashing.checksum(b"abc") != hashing.checksum(b"abd")
    assert len(hashing.signature(b"abc")) == 16
    assert hashing.signature(b"abc") != hashing.signature(b"abd")
