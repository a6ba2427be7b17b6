"""Partition keys to the 128-bit hash space, and checksums.

As in Kinesis, a partition key maps to an unsigned 128-bit integer by MD5 of its UTF-8
bytes, so an `explicit_hash_key` means what it means there. Checksums of stored batches
and dedup signatures use xxh3 (fast, not cryptographic).
"""

from __future__ import annotations

import hashlib

import xxhash

from sms import limits
from sms.errors import InvalidHashKey, InvalidPartitionKey

HASH_SPACE = 1 << 128


def validate_partition_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidPartitionKey(f"partition key of type {type(key).__name__}; expected str")
    if not limits.PARTITION_KEY_CHARS_MIN <= len(key) <= limits.PARTITION_KEY_CHARS_MAX:
        raise InvalidPartitionKey(
            f"partition key of {len(key)} chars; expected "
            f"{limits.PARTITION_KEY_CHARS_MIN}..{limits.PARTITION_KEY_CHARS_MAX}")
    return key


_hash_cache: dict[bytes, int] = {}


def hash_key_of_bytes(key: bytes) -> int:
    """The hash key of a partition key given as UTF-8 bytes. Keys repeat (users, devices,
    sessions), so the last `HASH_CACHE_KEYS_MAX` distinct ones are remembered: a cache
    hit is a dict lookup instead of an MD5 and an int conversion."""
    h = _hash_cache.get(key)
    if h is None:
        h = int.from_bytes(hashlib.md5(key).digest(), "big")
        if len(_hash_cache) >= limits.HASH_CACHE_KEYS_MAX:
            _hash_cache.clear()
        _hash_cache[key] = h
    return h


def hash_key_of(partition_key: str) -> int:
    return hash_key_of_bytes(partition_key.encode("utf-8"))


def parse_explicit_hash_key(value: str | int) -> int:
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit() and len(value) <= 39):
            raise InvalidHashKey(f"explicit hash key {value[:64]!r}; expected a decimal 0..2^128-1")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limits.HASH_KEY_MAX:
        raise InvalidHashKey(f"explicit hash key {value!r}; expected 0 <= key < 2^128")
    return value


def checksum(data: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def signature(data: bytes | memoryview) -> bytes:
    return xxhash.xxh3_128_digest(data)
