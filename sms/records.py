"""Client-side checks of one record before it is sent: the same named errors the
ingestion node would answer, raised before anything is queued. Used by
`Client.put_records` (through `wire.encode_puts`, whose lean path handles plain
(partition_key, data) pairs and hands every other shape to `encode_put`) and by the
producer."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sms import errors, hashing, limits, wire


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    key: bytes                      # partition key, UTF-8
    data: bytes
    hash_key: int                   # where the record routes in the 128-bit space
    extra: bytes                    # wire meta TLVs it carries: explicit hash key, headers


def prepare_record(partition_key: str, data: bytes | str, explicit_hash_key: int | str | None = None,
                   headers: Mapping[str, bytes | str] | None = None) -> PreparedRecord:
    """`data` is bytes, or a str stored as its UTF-8 (as boto3 does with Kinesis's Data);
    a reader gets bytes back either way."""
    hashing.validate_partition_key(partition_key)
    try:
        key = partition_key.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidPartitionKey("partition key is not valid Unicode (lone surrogates)") from None
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.InvalidArgument("record data is a str that is not valid Unicode (lone surrogates)") from None
    elif isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
    else:
        raise errors.InvalidArgument(f"record data of type {type(data).__name__}; expected bytes or str")
    if len(data) > limits.RECORD_DATA_BYTES_MAX:
        raise errors.RecordTooLarge(f"record of {len(data)} bytes; at most {limits.RECORD_DATA_BYTES_MAX}")
    extra = wire.encode_headers(headers)
    if explicit_hash_key is not None:
        hash_key = hashing.parse_explicit_hash_key(explicit_hash_key)
        extra = bytes((wire.TAG_EXPLICIT_HASH_KEY, 16)) + hash_key.to_bytes(16, "big") + extra
    else:
        hash_key = hashing.hash_key_of_bytes(key)
    return PreparedRecord(key, data, hash_key, extra)


def _fields(r: object) -> tuple[Any, Any, Any, Any]:
    """(partition_key, data, explicit_hash_key, headers) of one record of a put."""
    if isinstance(r, dict):
        unknown = set(r) - {"partition_key", "data", "explicit_hash_key", "headers"}
        if unknown:
            raise errors.InvalidArgument(f"record fields {sorted(map(str, unknown))} unknown; expected "
                                         "partition_key, data, explicit_hash_key, headers")
        return r.get("partition_key"), r.get("data"), r.get("explicit_hash_key"), r.get("headers")
    if isinstance(r, (tuple, list)) and 2 <= len(r) <= 4:
        return (*r, *(None,) * (4 - len(r)))
    raise errors.InvalidArgument("a record is a dict {partition_key, data[, explicit_hash_key][, headers]} "
                                 "or a tuple (partition_key, data[, explicit_hash_key[, headers]])")


def prepare(r: object) -> PreparedRecord:
    """One record of a put in any accepted shape, checked."""
    return prepare_record(*_fields(r))


def record_fields(r: object) -> tuple[Any, Any, Any, Any]:
    """(partition_key, data, explicit_hash_key, headers) of a record in any accepted shape."""
    return _fields(r)


def needs_reference(r: object) -> bool:
    """Whether a record's data goes by reference (sms/payloads.py): over the inline
    limit, or a binary file object."""
    try:
        data = _fields(r)[1]
    except errors.SmsError:
        return False
    if isinstance(data, (bytes, bytearray, memoryview)):
        return len(data) > limits.RECORD_DATA_BYTES_MAX
    return callable(getattr(data, "read", None))


def encode_put(r: object) -> tuple[bytes, int]:
    """(PutRecords entry, hash key) of one record in any accepted shape: the fallback of
    `wire.encode_puts`."""
    p = prepare(r)
    return wire.encode_entry(p.key, p.data, p.extra), p.hash_key


def prepare_records(records: Iterable[object]) -> list[tuple[bytes, bytes, int, bytes]]:
    """(key bytes, data, hash key, extra meta) per record of a put: (partition_key, data)
    or (partition_key, data, explicit_hash_key[, headers]) tuples, or dicts with those
    names. The usual shape, a (str, bytes) pair, takes a lean path; anything else goes
    through `prepare_record`, which names what is wrong. Used by `send_batch`."""
    out = []
    key_min, key_max = limits.PARTITION_KEY_CHARS_MIN, limits.PARTITION_KEY_CHARS_MAX
    data_max, hash_of = limits.RECORD_DATA_BYTES_MAX, hashing.hash_key_of_bytes
    for r in records:
        if type(r) is tuple and len(r) == 2:
            key, data = r
            if type(key) is str and type(data) is bytes and key_min <= len(key) <= key_max \
                    and len(data) <= data_max and key.isascii():
                kb = key.encode()
                out.append((kb, data, hash_of(kb), b""))
                continue
        p = prepare(r)
        out.append((p.key, p.data, p.hash_key, p.extra))
    return out
