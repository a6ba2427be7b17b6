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


def prepare_records(records) -> list[tuple[bytes, bytes, int, dict[int, bytes]]]:
    """(key bytes, data, hash key, meta fields) per record of a put: (partition_key, data)
    or (partition_key, data, explicit_hash_key) tuples, or dicts with those names. The
    usual shape, a (str, bytes) pair, takes a lean path; anything else goes through
    `prepare_record`, which names what is wrong. Used by `put_records` and `send_batch`."""
    out = []
    key_min, key_max = limits.PARTITION_KEY_CHARS_MIN, limits.PARTITION_KEY_CHARS_MAX
    data_max, hash_of = limits.RECORD_DATA_BYTES_MAX, hashing.hash_key_of_bytes
    for r in records:
        if type(r) is tuple and len(r) == 2:
            key, data = r
            if type(key) is str and type(data) is bytes and key_min <= len(key) <= key_max \
                    and len(data) <= data_max:
                kb = key.encode("utf-8")
                out.append((kb, data, hash_of(kb), {}))
                continue
        if isinstance(r, dict):
            key, data, explicit = r.get("partition_key"), r.get("data"), r.get("explicit_hash_key")
        elif isinstance(r, (tuple, list)) and len(r) in (2, 3):
            key, data, explicit = r[0], r[1], r[2] if len(r) == 3 else None
        else:
            raise errors.InvalidArgument("a record is a dict {partition_key, data[, explicit_hash_key]} "
                                         "or a tuple (partition_key, data[, explicit_hash_key])")
        prepared = prepare_record(key, data, explicit)
        out.append((prepared.key, prepared.data, prepared.hash_key, dict(prepared.meta)))
    return out
