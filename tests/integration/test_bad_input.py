"""Bad input against a real cluster: a named error, no change, and the node keeps serving.

Each case is checked three ways (DESIGN.md section 11): the error is exactly the named
class of sms.errors; the streams and the records of a target stream are the same before
and after; and a good put and read on another stream succeed afterwards. The raw gRPC
cases bypass the client's own validation to prove the server rejects the input too, and
the socket cases send bytes that are not gRPC at all.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time

import grpc
import pytest

from metastore import open_metastore
from sms import wire, errors, hashing, limits, metadata, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import ERROR_KEY
from sms.tokens import Position, TokenCodec
from tests.conftest import assert_all_alive, client_channel, node_channel, read_stream, stream_name

pytestmark = pytest.mark.integration

MISSING = "no-such-stream-9f3a1c"


@pytest.fixture(scope="module")
def target(client) -> str:
    """A stream with a few records that no bad input may change."""
    name = stream_name("bad-input-target")
    client.create_stream(name, partitions=2, replication_factor=3)
    result = client.put_records(name, [(f"key-{i}", f"record {i}".encode()) for i in range(20)])
    assert result.failed_record_count == 0
    return name


@pytest.fixture(scope="module")
def canary(client) -> str:
    """The stream the 'still serving' check writes to."""
    name = stream_name("bad-input-canary")
    client.create_stream(name, partitions=1, replication_factor=3)
    return name


def snapshot(client, target: str) -> tuple:
    info = client.get_stream_info(target)
    contents = {o: [(r.sn, r.partition_key, r.data) for r in records]
                for o, records in read_stream(client, target).items()}
    return sorted(client.list_streams()), info, contents


def assert_serving(client, canary: str) -> None:
    acked = client.put_record(canary, f"still serving {time.monotonic_ns()}".encode(), "canary")
    assert client.get_record(canary, acked.sequence_number).sn == acked.sn


def assert_rejected(client, target: str, canary: str, call, expected: type[errors.SmsError]) -> None:
    """`call` raises exactly `expected`, changes nothing, and the cluster keeps serving."""
    before = snapshot(client, target)
    with pytest.raises(errors.SmsError) as caught:
        call()
    assert type(caught.value) is expected, f"{type(caught.value).__name__}: {caught.value.message}"
    assert snapshot(client, target) == before, "bad input changed the streams or the target's records"
    assert_serving(client, canary)


# --- through the client ------------------------------------------------------------------

def _records(n: int, size: int = 1, keys=None):
    return [((keys[i] if keys else "key"), b"x" * size) for i in range(n)]


CLIENT_CASES = {
    # stream that does not exist
    "put to a missing stream": (lambda c, t: c.put_record(MISSING, b"x", "k"), errors.StreamNotFound),
    "describe a missing stream": (lambda c, t: c.get_stream_info(MISSING), errors.StreamNotFound),
    "iterator on a missing stream": (lambda c, t: c.get_iterator(MISSING, 0), errors.StreamNotFound),
    "delete a missing stream": (lambda c, t: c.delete_stream(MISSING), errors.StreamNotFound),
    # stream admin
    "create an existing stream": (lambda c, t: c.create_stream(t, 1, 1), errors.StreamAlreadyExists),
    "empty stream name": (lambda c, t: c.create_stream("", 1, 1), errors.InvalidStreamName),
    "129-char stream name": (lambda c, t: c.create_stream("s" * 129, 1, 1), errors.InvalidStreamName),
    "stream name with a slash": (lambda c, t: c.create_stream("a/b", 1, 1), errors.InvalidStreamName),
    "stream name with a space": (lambda c, t: c.create_stream("sp ace", 1, 1), errors.InvalidStreamName),
    "delete with a bad name": (lambda c, t: c.delete_stream("a/b"), errors.InvalidStreamName),
    "zero partitions": (lambda c, t: c.create_stream(stream_name("zero"), 0, 1), errors.InvalidStreamConfig),
    "too many partitions": (lambda c, t: c.create_stream(stream_name("many"), limits.STREAM_PARTITIONS_MAX + 1, 1),
                            errors.InvalidStreamConfig),
    "replication above node count": (lambda c, t: c.create_stream(stream_name("rf4"), 1, 4), errors.NotEnoughNodes),
    "replication above the max": (lambda c, t: c.create_stream(stream_name("rf6"), 1, limits.REPLICATION_FACTOR_MAX + 1),
                                  errors.InvalidStreamConfig),
    "replication zero": (lambda c, t: c.create_stream(stream_name("rf0"), 1, 0), errors.InvalidStreamConfig),
    "unknown persistence": (lambda c, t: c.create_stream(stream_name("pers"), 1, 1, persistence="tape"),
                            errors.InvalidStreamConfig),
    # records
    "record over 1 MiB": (lambda c, t: c.put_record(t, b"x" * (limits.RECORD_DATA_BYTES_MAX + 1), "k"),
                          errors.RecordTooLarge),
    "empty partition key": (lambda c, t: c.put_record(t, b"x", ""), errors.InvalidPartitionKey),
    "257-char partition key": (lambda c, t: c.put_record(t, b"x", "k" * 257), errors.InvalidPartitionKey),
    "hash key -1": (lambda c, t: c.put_record(t, b"x", "k", explicit_hash_key=-1), errors.InvalidHashKey),
    "hash key 2**128": (lambda c, t: c.put_record(t, b"x", "k", explicit_hash_key=2**128), errors.InvalidHashKey),
    "hash key not a number": (lambda c, t: c.put_record(t, b"x", "k", explicit_hash_key="12ab"), errors.InvalidHashKey),
    "501 records": (lambda c, t: c.put_records(t, _records(501)), errors.RequestTooLarge),
    "no records": (lambda c, t: c.put_records(t, []), errors.RequestTooLarge),
    "over 5 MiB under one key": (lambda c, t: c.put_records(t, _records(6, 1_000_000)), errors.RequestTooLarge),
    "a bad record among good ones": (lambda c, t: c.put_records(t, _records(3) + [("k" * 257, b"x")]),
                                     errors.InvalidPartitionKey),
    # reads
    "sequence number abc": (lambda c, t: c.get_iterator(t, 0, "AT_SEQUENCE_NUMBER", sequence_number="abc"),
                            errors.InvalidSequenceNumber),
    "sequence number -1": (lambda c, t: c.get_iterator(t, 0, "AFTER_SEQUENCE_NUMBER", sequence_number="-1"),
                           errors.InvalidSequenceNumber),
    "sequence number of 50 digits": (lambda c, t: c.get_iterator(t, 0, "AT_SEQUENCE_NUMBER",
                                                                 sequence_number="1" * 50),
                                     errors.InvalidSequenceNumber),
    "sequence number of another partition": (
        lambda c, t: c.get_iterator(t, 0, "AT_SEQUENCE_NUMBER", sequence_number=str(seqno.make(1, 1, 1))),
        errors.InvalidSequenceNumber),
    "get_record of sequence number abc": (lambda c, t: c.get_record(t, "abc"), errors.InvalidSequenceNumber),
    "get_record of 50 digits": (lambda c, t: c.get_record(t, "1" * 50), errors.InvalidSequenceNumber),
    "iterator type SIDEWAYS": (lambda c, t: c.get_iterator(t, 0, "SIDEWAYS"), errors.InvalidIteratorType),
    "missing partition": (lambda c, t: c.get_iterator(t, "p0099"), errors.PartitionNotFound),
    "max_records 0": (lambda c, t: c.get_next_records(c.get_iterator(t, 0), max_records=0), errors.InvalidArgument),
    "max_records 10001": (lambda c, t: c.get_next_records(c.get_iterator(t, 0), max_records=10_001),
                          errors.InvalidArgument),
}


@pytest.mark.parametrize("case", list(CLIENT_CASES))
def test_client_call_rejected(client, target, canary, case):
    call, expected = CLIENT_CASES[case]
    assert_rejected(client, target, canary, lambda: call(client, target), expected)


def test_request_over_5_mib_across_partitions_rejected(client, canary):
    """The client splits a request by ingestion owner; each part alone is under the
    server's limit, so the whole request's size must be checked before the split."""
    stream = stream_name("spread")         # its own stream: a regression would store 6 MB
    info = client.create_stream(stream, partitions=4, replication_factor=3)
    keys = [f"spread-{i}" for i in range(6)]
    assert len({info.open_partition_for_hash(hashing.hash_key_of(k)).ordinal for k in keys}) > 1
    assert_rejected(client, stream, canary, lambda: client.put_records(stream, _records(6, 1_000_000, keys)),
                    errors.RequestTooLarge)


# --- iterator tokens -----------------------------------------------------------------------

def _cluster_secret(cluster) -> bytes:
    async def read() -> bytes:
        store = open_metastore(f"embedded://{cluster.data_dir}/meta.lmdb")
        await store.start()
        try:
            return bytes.fromhex((await store.get(metadata.CLUSTER_SECRET)).value.decode())
        finally:
            await store.close()
    return asyncio.run(read())


def test_expired_iterator(cluster, client, target, canary):
    secret = _cluster_secret(cluster)
    fresh = TokenCodec(secret).encode(Position(target, 0, 0))
    assert client.get_next_records(fresh).records, "a token made with the cluster secret reads"
    an_hour_ago = TokenCodec(secret, clock=lambda: time.time() - 3600).encode(Position(target, 0, 0))
    assert_rejected(client, target, canary, lambda: client.get_next_records(an_hour_ago), errors.ExpiredIterator)


def test_iterator_signed_with_another_secret(client, target, canary):
    forged = TokenCodec(os.urandom(32)).encode(Position(target, 0, 0))
    assert_rejected(client, target, canary, lambda: client.get_next_records(forged), errors.InvalidIterator)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _raw(token: str) -> bytearray:
    return bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


def _flip(offset: int):
    def tamper(token: str) -> str:
        raw = _raw(token)
        raw[offset] ^= 0x01
        return _b64(bytes(raw))
    return tamper


# token layout: version(1) expiry(8) ordinal(4) position(16) stream name, then a 16-byte tag
TAMPERS = {
    "expiry byte flipped": _flip(5),
    "ordinal byte flipped": _flip(12),
    "position byte flipped": _flip(15),
    "tag byte flipped": _flip(-1),
    "character flipped": lambda t: t[:-8] + ("B" if t[-8] == "A" else "A") + t[-7:],
    "truncated to 20 chars": lambda t: t[:20],
    "empty": lambda t: "",
    "not base64": lambda t: "!!!not-base64!!!",
    "over 1024 chars": lambda t: t + "A" * limits.ITERATOR_TOKEN_CHARS_MAX,
}

# the client routes a read by the (unverified) stream name inside the token; when these
# bytes are cut or altered, the error must still be InvalidIterator, not StreamNotFound
NAME_TAMPERS = {
    "last byte cut": lambda t: _b64(bytes(_raw(t)[:-1])),
    "last 4 bytes cut": lambda t: _b64(bytes(_raw(t)[:-4])),
    "tag cut off": lambda t: _b64(bytes(_raw(t)[:-16])),
    "stream name byte flipped": _flip(29),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_tampered_iterator(client, target, canary, tamper):
    token = TAMPERS[tamper](client.get_iterator(target, 0))
    assert_rejected(client, target, canary, lambda: client.get_next_records(token), errors.InvalidIterator)


@pytest.mark.parametrize("tamper", list(NAME_TAMPERS))
def test_tampered_iterator_name_bytes(client, target, canary, tamper):
    token = NAME_TAMPERS[tamper](client.get_iterator(target, 0))
    assert_rejected(client, target, canary, lambda: client.get_next_records(token), errors.InvalidIterator)


# --- raw gRPC: the server's own validation -------------------------------------------------

def _entry(key: str | bytes = "key", data: bytes = b"data", meta: bytes = b"") -> bytes:
    return wire.encode_entry(key.encode() if isinstance(key, str) else key, data, meta)


def _header(name: bytes, value: bytes) -> bytes:
    """One header TLV as a producer could send it, valid or not (sms/wire.py)."""
    body = bytes((len(name),)) + name + value
    return bytes((wire.TAG_HEADER,)) + len(body).to_bytes(2, "big") + body


def _put(count: int, entries: bytes, stream: str | None = None):
    """A raw PutRecords to the target stream (or `stream`)."""
    return lambda stubs: stubs["ingestion"].PutRecords(
        sms_pb2.PutRecordsRequest(stream=stream or stubs["target"], count=count, entries=entries), timeout=30)


def _next(max_records: int = 10, iterator=None):
    def call(stubs):
        token = iterator if iterator is not None else stubs["retrieval"].GetIterator(
            sms_pb2.GetIteratorRequest(stream=stubs["target"], partition_id="p0000",
                                       iterator_type="TRIM_HORIZON"), timeout=10).iterator
        if callable(token):
            token = token(stubs)
        return stubs["retrieval"].GetNextRecords(
            sms_pb2.GetNextRecordsRequest(iterator=token, max_records=max_records), timeout=10)
    return call


def _cut_token(stubs) -> str:
    return stubs["retrieval"].GetIterator(sms_pb2.GetIteratorRequest(
        stream=stubs["target"], partition_id="p0000", iterator_type="TRIM_HORIZON"), timeout=10).iterator[:-4]


RAW_CASES = {
    "PutRecords count 501": (_put(501, _entry() * 501), errors.RequestTooLarge),
    "PutRecords count 0": (_put(0, b""), errors.RequestTooLarge),
    "PutRecords garbage entries": (_put(3, b"\x07\x00garbage \xff\xfe bytes"), errors.InvalidArgument),
    "PutRecords count above entries": (_put(2, _entry()), errors.InvalidArgument),
    "PutRecords trailing bytes": (_put(1, _entry() + b"\x00\x01"), errors.InvalidArgument),
    "PutRecords 257-char key": (_put(1, _entry("k" * 257)), errors.InvalidPartitionKey),
    "PutRecords empty key": (_put(1, _entry("")), errors.InvalidPartitionKey),
    "PutRecords key not UTF-8": (_put(1, _entry(b"\xff\xfe")), errors.InvalidArgument),
    "PutRecords bad key among good ones": (_put(3, _entry() + _entry("k" * 257) + _entry()),
                                           errors.InvalidPartitionKey),
    "PutRecords oversize record": (_put(1, _entry(data=b"x" * (limits.RECORD_DATA_BYTES_MAX + 1))),
                                   errors.RecordTooLarge),
    "PutRecords over 5 MiB": (_put(6, _entry(data=b"x" * 1_000_000) * 6), errors.RequestTooLarge),
    "PutRecords hash key of 3 bytes": (_put(1, _entry(meta=wire.encode_meta(
        {wire.TAG_EXPLICIT_HASH_KEY: b"abc"}))), errors.InvalidArgument),
    "PutRecords truncated meta": (_put(1, _entry(meta=b"\x01\x10abc")), errors.InvalidArgument),
    "PutRecords header name not UTF-8": (_put(1, _entry(meta=_header(b"\xff\xfe", b"v"))),
                                         errors.InvalidRecordHeader),
    "PutRecords header name empty": (_put(1, _entry(meta=_header(b"", b"v"))), errors.InvalidRecordHeader),
    "PutRecords header name of 65 bytes": (_put(1, _entry(meta=_header(b"n" * 65, b"v"))),
                                           errors.InvalidRecordHeader),
    "PutRecords header name longer than the header": (_put(1, _entry(meta=b"\x80\x00\x02\x09a")),
                                                      errors.InvalidRecordHeader),
    "PutRecords header repeated": (_put(1, _entry(meta=_header(b"a", b"1") + _header(b"a", b"2"))),
                                   errors.InvalidRecordHeader),
    "PutRecords 17 headers": (_put(1, _entry(meta=b"".join(_header(b"h%d" % i, b"") for i in range(17)))),
                              errors.InvalidRecordHeader),
    "PutRecords headers over 4 KiB": (_put(1, _entry(meta=_header(b"big", b"x" * 4096))),
                                      errors.InvalidRecordHeader),
    "PutRecords header TLV truncated": (_put(1, _entry(meta=b"\x80\x00")), errors.InvalidArgument),
    "PutRecords missing stream": (_put(1, _entry(), MISSING), errors.StreamNotFound),
    "PutRecords bad stream name": (_put(1, _entry(), "a/b"), errors.InvalidStreamName),
    "GetNextRecords max_records 0": (_next(0), errors.InvalidArgument),
    "GetNextRecords max_records 10001": (_next(10_001), errors.InvalidArgument),
    "GetNextRecords empty iterator": (_next(10, ""), errors.InvalidIterator),
    "GetNextRecords truncated iterator": (_next(10, _cut_token), errors.InvalidIterator),
    "GetIterator bad partition id": (lambda s: s["retrieval"].GetIterator(sms_pb2.GetIteratorRequest(
        stream=s["target"], partition_id="zz", iterator_type="LATEST"), timeout=10), errors.PartitionNotFound),
    "GetIterator negative timestamp": (lambda s: s["retrieval"].GetIterator(sms_pb2.GetIteratorRequest(
        stream=s["target"], partition_id="p0000", iterator_type="AT_TIMESTAMP", timestamp_ms=-5), timeout=10),
        errors.InvalidArgument),
    "GetRecord sequence number abc": (lambda s: s["retrieval"].GetRecord(sms_pb2.GetRecordRequest(
        stream=s["target"], sequence_number="abc"), timeout=10), errors.InvalidSequenceNumber),
    "CreateStream on a storage node": (lambda s: s["storage_control"].CreateStream(sms_pb2.CreateStreamRequest(
        name=stream_name("wrong-node"), partitions=1, replication_factor=1), timeout=10), errors.FailedPrecondition),
    "CreateStream empty name": (lambda s: s["control"].CreateStream(sms_pb2.CreateStreamRequest(
        name="", partitions=1, replication_factor=1), timeout=10), errors.InvalidStreamName),
}


@pytest.fixture(scope="module")
def stubs(cluster, client, target):
    """Raw stubs: ingestion and retrieval on the head of the target's p0000, control; the
    storage stub speaks as the head's own node (only a partition's ingestion owner appends)."""
    owner = client.get_stream_info(target).partition(0).chain[0]
    head = owner.address
    big = [("grpc.max_send_message_length", 64 << 20)]
    with client_channel(head, options=big) as node, \
            node_channel(cluster, head, owner.node_id, options=big) as internal, \
            client_channel(cluster.address) as control:
        yield {"ingestion": sms_pb2_grpc.IngestionStub(node), "retrieval": sms_pb2_grpc.RetrievalStub(node),
               "storage": sms_pb2_grpc.StorageStub(internal), "storage_control": sms_pb2_grpc.ControlStub(node),
               "control": sms_pb2_grpc.ControlStub(control), "target": target}


def raw_error(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    e = caught.value
    return e.code(), dict(e.trailing_metadata() or ()).get(ERROR_KEY, "")


@pytest.mark.parametrize("case", list(RAW_CASES))
def test_server_rejects_raw_request(client, target, canary, stubs, case):
    call, expected = RAW_CASES[case]
    before = snapshot(client, target)
    code, name = raw_error(lambda: call(stubs))
    assert (name, code) == (expected.__name__, expected.code)
    assert snapshot(client, target) == before
    assert_serving(client, canary)


# --- the Storage Append stream: batches from ingestion to the head ----------------------------

def _append(storage_stub, chain_id: str, batch: bytes, epoch: int = 1) -> sms_pb2.AppendAck:
    acks = list(storage_stub.Append(iter([sms_pb2.AppendRequest(chain_id=chain_id, epoch=epoch, batch_id=1,
                                                                    batch=batch)]), timeout=10))
    assert len(acks) == 1
    return acks[0]


def _corrupt_checksum(batch: bytes) -> bytes:
    raw = bytearray(batch)
    raw[-1] ^= 0xFF          # the data, not the header: the stored checksum no longer holds
    return bytes(raw)


def _bad_header(batch: bytes) -> bytes:
    return bytes([wire.BATCH_VERSION + 1]) + batch[1:]   # a version this build does not know


APPEND_CASES = {
    "checksum does not hold": _corrupt_checksum(wire.build_batch([_entry("k", b"good data")])),
    "unknown batch version": _bad_header(wire.build_batch([_entry("k", b"good data")])),
    "shorter than a header": b"short",
    # stored, it would make every later read of the partition fail to decode
    "entries do not parse": wire.build_batch([b"\x00\x01not an entry"]),
}


@pytest.mark.parametrize("batch", list(APPEND_CASES.values()), ids=list(APPEND_CASES))
def test_head_rejects_a_bad_append_batch(cluster, client, canary, batch):
    stream = stream_name("append")
    client.create_stream(stream, partitions=1, replication_factor=3)
    head = client.get_stream_info(stream).partition(0).chain[0]
    acked = client.put_record(stream, b"before", "k")
    with node_channel(cluster, head.address, head.node_id) as channel:      # (as the owner: see test_append_authz)
        ack = _append(sms_pb2_grpc.StorageStub(channel), f"{stream}:0", batch)
    assert ack.error_name == "CorruptBatch", f"the head acked a bad batch: {ack}"
    assert [(r.sn, r.data) for r in read_stream(client, stream)[0]] == [(acked.sn, b"before")]
    assert_serving(client, canary)


def test_append_to_a_chain_not_held_or_of_another_epoch(client, target, canary, stubs):
    before = snapshot(client, target)
    good = wire.build_batch([_entry()])
    assert _append(stubs["storage"], f"{MISSING}:0", good).error_name == "WrongOwner"
    assert _append(stubs["storage"], f"{target}:0", good, epoch=7).error_name == "StaleEpoch"
    assert snapshot(client, target) == before
    assert_serving(client, canary)


# --- bytes that are not gRPC ------------------------------------------------------------------

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GARBAGE = {
    "random bytes": os.urandom(4096),
    "HTTP/1.1 request": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "half an HTTP/2 preface": HTTP2_PREFACE[:11],
    "preface then garbage frames": HTTP2_PREFACE + b"\x00\x00\x10\x07\x00\x00\x00\x00\x00" + os.urandom(512),
    "preface then an oversized frame": HTTP2_PREFACE + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01" + os.urandom(64),
}


def _send(address: str, payload: bytes) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    try:
        sock.sendall(payload)
    except OSError:
        pass   # the server may hang up mid-send
    return sock


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_non_grpc_bytes_do_not_crash_a_node(cluster, client, target, canary, kind):
    before = snapshot(client, target)
    addresses = [cluster.address] + [m.address for m in client.get_stream_info(target).partition(0).chain]
    open_sockets = [_send(address, GARBAGE[kind]) for address in addresses]
    try:
        assert_serving(client, canary)          # served while the bad connections are still open
    finally:
        for sock in open_sockets:
            sock.close()
    assert_all_alive(cluster)
    for node in cluster.procs.values():
        assert node.proc.poll() is None, f"{node.node_id} exited"
    assert snapshot(client, target) == before
    assert_serving(client, canary)
