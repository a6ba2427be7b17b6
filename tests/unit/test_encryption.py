"""Encryption at rest, one module (kernel/encryption.py): batches sealed and opened, master
keys parsed, data keys wrapped to their stream, rotation. The cluster-level behaviour
(nothing in clear on disk, every reader served) is tests/integration/test_encryption.py."""

from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import given, settings, strategies as st

from kernel import encryption
from sms import seqno, wire
from sms.errors import EncryptionUnavailable, InvalidStreamConfig

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


def clear_batch(n: int = 3, marker: bytes = b"secret", first_sn: int | None = None) -> bytes:
    entries = [wire.encode_entry(f"key-{i}".encode(), marker + b" %d" % i) for i in range(n)]
    sn = seqno.make(1_700_000_000_000, 5, 3) if first_sn is None else first_sn
    return wire.sequence(wire.build_batch(entries, origin_id=7, origin_seq=9), sn, prev_checksum=1234)


@settings(max_examples=60)
@given(st.integers(1, 50), st.binary(min_size=0, max_size=200))
def test_a_sealed_batch_opens_to_the_batch_it_was(n, marker):
    batch = clear_batch(n, marker)
    sealed = encryption.seal_batch(batch, KEY)
    assert encryption.is_sealed(sealed) and not encryption.is_sealed(batch)
    header, sealed_header = wire.verify(batch), wire.verify(sealed)     # the chain checks hold on either
    assert (sealed_header.first_sn, sealed_header.count, sealed_header.origin_id, sealed_header.origin_seq,
            sealed_header.prev_checksum) == (header.first_sn, header.count, header.origin_id,
                                             header.origin_seq, header.prev_checksum)
    assert encryption.open_batch(sealed, KEY) == batch
    long_marker = b"TOPSECRET-7f3a9c-" + marker       # (a short one may turn up in ciphertext by chance)
    assert long_marker not in encryption.seal_batch(clear_batch(n, long_marker), KEY)


def test_two_seals_of_one_batch_differ():
    """A salt per batch: a key of its own per batch (no nonce reuse), nothing to compare."""
    batch = clear_batch()
    assert encryption.seal_batch(batch, KEY) != encryption.seal_batch(batch, KEY)


def test_readers_refuse_a_sealed_batch_by_name():
    sealed = encryption.seal_batch(clear_batch(), KEY)
    for decode in (wire.decode_records, wire.session_fields):
        with pytest.raises(wire.CorruptBatch, match="sealed"):
            decode(sealed)


def test_a_wrong_key_or_a_flipped_byte_does_not_open():
    sealed = encryption.seal_batch(clear_batch(), KEY)
    with pytest.raises(wire.CorruptBatch, match="does not open"):
        encryption.open_batch(sealed, OTHER)
    for offset in (wire.HEADER_BYTES, wire.HEADER_BYTES + 20, len(sealed) - 1):
        damaged = bytearray(sealed)
        damaged[offset] ^= 0x40
        with pytest.raises(wire.CorruptBatch):
            encryption.open_batch(bytes(damaged), KEY)


def test_a_sealed_body_is_bound_to_its_place():
    """The body moved under another header (another SN, origin or predecessor), with a
    checksum made to match, does not open."""
    sealed = encryption.seal_batch(clear_batch(), KEY)
    h = wire.read_header(sealed)
    body = sealed[wire.HEADER_BYTES:]
    for moved in (wire.seal(h.count, h.first_sn + seqno.COUNTER_UNIT * 100, body, h.origin_id, h.origin_seq,
                            h.prev_checksum, flags=wire.FLAG_SEALED),
                  wire.seal(h.count, h.first_sn, body, h.origin_id + 1, h.origin_seq, h.prev_checksum,
                            flags=wire.FLAG_SEALED),
                  wire.seal(h.count, h.first_sn, body, h.origin_id, h.origin_seq, h.prev_checksum + 1,
                            flags=wire.FLAG_SEALED)):
        with pytest.raises(wire.CorruptBatch):
            encryption.open_batch(moved, KEY)


def test_the_sealed_flag_is_covered_by_the_checksum():
    """A clear batch claimed sealed, or a sealed one claimed clear, fails its checksum."""
    batch, sealed = clear_batch(), encryption.seal_batch(clear_batch(), KEY)
    for b in (batch, sealed):
        flipped = bytearray(b)
        flipped[1] ^= wire.FLAG_SEALED
        with pytest.raises(wire.CorruptBatch, match="checksum"):
            wire.verify(bytes(flipped))


def test_data_keys_are_wrapped_to_their_stream():
    masters = encryption.MasterKeys({"k1": KEY}, "k1", "test")
    wrapped = masters.wrap("orders", OTHER)
    assert wrapped.startswith("k1:") and OTHER.hex() not in wrapped
    assert masters.unwrap("orders", wrapped) == OTHER
    with pytest.raises(InvalidStreamConfig, match="does not open"):
        masters.unwrap("payments", wrapped)               # moved to another stream's config
    with pytest.raises(EncryptionUnavailable, match="k9"):
        masters.unwrap("orders", "k9:" + wrapped.partition(":")[2])
    with pytest.raises(InvalidStreamConfig, match="master key"):
        encryption.MasterKeys.none().wrap("orders", OTHER)


@pytest.mark.parametrize("text, message", [
    ("{", "expected JSON"),
    ('{"current": "k2", "keys": {"k1": "%s"}}' % KEY.hex(), "not among"),
    ('{"current": "k1", "keys": {"k1": "abc"}}', "64 hex"),
    ('{"current": "a:b", "keys": {"a:b": "%s"}}' % KEY.hex(), "no ':'"),
    ("zz" * 32, "64 hex"),
])
def test_bad_master_keys_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        encryption.MasterKeys.load(env={encryption.ENV_MASTER_KEY: text})


def test_master_keys_from_the_environment_and_from_a_file(tmp_path):
    assert encryption.MasterKeys.load(env={encryption.ENV_MASTER_KEY: KEY.hex()}).keys == {"k1": KEY}
    assert encryption.MasterKeys.load(env={}).current == ""
    with pytest.raises(ValueError, match="master key file"):
        encryption.MasterKeys.load(str(tmp_path / "missing.key"), env={})
    path = str(tmp_path / "master.key")
    encryption.new_key_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = encryption.MasterKeys.load(path)
    encryption.new_key_file(path)                      # kept: never a second key by accident
    assert encryption.MasterKeys.load(path) == first


def test_rotation_keeps_the_old_key_until_rewrapped(tmp_path):
    path = str(tmp_path / "master.key")
    encryption.new_key_file(path)
    before = encryption.MasterKeys.load(path)
    wrapped = before.wrap("orders", OTHER)
    new_id = encryption.add_master_key(path)
    after = encryption.MasterKeys.load(path)
    assert after.current == new_id != before.current
    assert after.unwrap("orders", wrapped) == OTHER     # the old data key still opens
    rewrapped = after.wrap("orders", after.unwrap("orders", wrapped))
    assert rewrapped.startswith(new_id + ":")
    assert json.load(open(path))["keys"].keys() == {before.current, new_id}


def test_validate_algorithm():
    assert encryption.validate_algorithm(None) is None
    assert encryption.validate_algorithm("none") == "none"
    assert encryption.validate_algorithm("aes-256-gcm") == "aes-256-gcm"
    with pytest.raises(InvalidStreamConfig, match="rot13"):
        encryption.validate_algorithm("rot13")
