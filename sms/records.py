"""Client-side checks of one record before it is sent: the same named errors the
ingestion node would answer, raised before anything is queued. Used by
`Client.put_records` and by the producer."""

from __future__ import annotations

from dataclasses import dataclass

from sms import codec, errors, hashing, limits


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    key: bytes                      # partition key, UTF-8
    data: bytes
    hash_key: int                   # where the record routes in the 128-bit space
    meta: dict[int, bytes]          # codec meta fields the record carries (explicit hash key)


def prepare_record(partition_key: str, data: bytes, explicit_hash_key: int | str | None) -> PreparedRecord:
    hashing.validate_partition_key(partition_key)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise errors.InvalidArgument(f"record data of type {type(data).__name__}; expected bytes")
    data = bytes(data)
    if len(data) > limits.RECORD_DATA_BYTES_MAX:
        raise errors.RecordTooLarge(f"record of {len(data)} bytes; at most {limits.RECORD_DATA_BYTES_MAX}")
    meta: dict[int, bytes] = {}
    if explicit_hash_key is not None:
        hash_key = hashing.parse_explicit_hash_key(explicit_hash_key)
        meta[codec.TAG_EXPLICIT_HASH_KEY] = hash_key.to_bytes(16, "big")
    else:
        hash_key = hashing.hash_key_of(partition_key)
    return PreparedRecord(partition_key.encode("utf-8"), data, hash_key, meta)
