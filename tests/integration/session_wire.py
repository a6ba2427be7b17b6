"""Producer sessions spoken directly on the wire, for the de-duplication tests.

`RawSession` sends PutRecords over a raw (synchronous) gRPC IngestionStub with every
session field explicit: the producer id, each record's SSSN, submit time and optional
dedup key, and the HWM map. It routes each record to the ingestion owner (the chain
head) of its partition, as `client.get_stream_info` names it, and answers per record
(SN, duplicate flag, error name) plus the SSSNs the node reported missing. It does not
use `sms/producer.py` on purpose: the tests check the server's side of the protocol,
so nothing between them and the wire may fix anything up. `stored_session_records`
reads the session fields back from stored records (wire meta TAG_PRODUCER_ID /
TAG_SSSN / TAG_DEDUP_KEY).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc

from sms import wire, errors, hashing, limits, rpc, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import Record, StreamInfo
from tests.conftest import client_channel

RETRY_INTERVAL_S = 0.05            # pause between two attempts of one request
SETTLE_TIMEOUT_S = 60.0            # put_until_settled gives up after this


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Submit:
    """One record of a producer session, as the producer submits (and resubmits) it."""

    sssn: int
    key: str
    data: bytes
    submit_ms: int
    dedup_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """The node's answer for one record."""

    sn: int                   # 0: failed, or a duplicate whose SN was pruned
    duplicate: bool
    error_name: str           # "" when the record was acknowledged
    error_message: str = ""
    ordinal: int = -1

    @property
    def ok(self) -> bool:
        return not self.error_name

    @property
    def retriable(self) -> bool:
        cls = errors.registry().get(self.error_name)
        return bool(self.error_name) and (cls is None or cls.retriable)


@dataclass(frozen=True, slots=True)
class Answer:
    acks: tuple[Ack, ...]                      # one per submitted record, in order
    missing: dict[int, tuple[int, ...]]        # partition ordinal -> SSSNs never received

    @property
    def retriable(self) -> bool:
        return any(a.retriable for a in self.acks)


@dataclass(frozen=True, slots=True)
class StoredSession:
    """A stored record with its session fields."""

    producer_id: bytes
    sssn: int
    dedup_key: bytes | None
    sn: int
    key: str
    data: bytes


def encode(s: Submit, *, fields: Mapping[int, bytes] | None = None) -> bytes:
    """The wire entry of a session record; `fields` replaces the meta TLVs (bad input)."""
    if fields is None:
        fields = {wire.TAG_SSSN: s.sssn.to_bytes(8, "big"), wire.TAG_SUBMIT_MS: s.submit_ms.to_bytes(8, "big")}
        if s.dedup_key is not None:
            fields = {**fields, wire.TAG_DEDUP_KEY: s.dedup_key}
    return wire.encode_entry(s.key.encode("utf-8"), s.data, wire.encode_meta(dict(fields)))


class Channels:
    """Synchronous gRPC channels by address, shared by many sessions (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> sms_pb2_grpc.IngestionStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = client_channel(address, options=rpc.CHANNEL_OPTIONS)
            return sms_pb2_grpc.IngestionStub(channel)

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


def send_entries(channels: Channels, address: str, stream: str, producer_id: bytes, entries: Sequence[bytes],
                 hwm: Mapping[int, int] | None = None, timeout_s: float = limits.PUT_TIMEOUT_S,
                 epoch: int = 0, session_ordinals: Sequence[int] | None = None) -> Answer:
    """One PutRecords of already-encoded entries to `address` (of the producer's `epoch`,
    0: none; with each record's session partition in `session_ordinals`, as the producer
    sends them, when given); a whole-request error (gRPC status) is raised as its named
    SmsError."""
    request = sms_pb2.PutRecordsRequest(stream=stream, count=len(entries), entries=b"".join(entries),
                                        producer_id=producer_id, hwm=dict(hwm or {}), producer_epoch=epoch,
                                        session_ordinals=wire.encode_session_ordinals(session_ordinals or ()))
    try:
        resp = channels.stub(address).PutRecords(request, timeout=timeout_s)
    except grpc.RpcError as e:
        raise rpc.to_sms_error(e) from None
    failed = {e.index: e for e in resp.errors}
    duplicates = set(resp.duplicates)
    assert len(resp.sequence_numbers) == 16 * len(entries), "one 16-byte SN per record"
    assert not duplicates & failed.keys(), f"records {duplicates & failed.keys()} both duplicate and failed"
    acks = []
    for i in range(len(entries)):
        err = failed.get(i)
        acks.append(Ack(sn=seqno.from_bytes(resp.sequence_numbers[16 * i:16 * i + 16]), duplicate=i in duplicates,
                        error_name=err.name if err else "", error_message=err.message if err else "",
                        ordinal=int.from_bytes(resp.ordinals[4 * i:4 * i + 4], "little")))
        if err is not None:
            assert acks[-1].sn == 0, f"record {i} failed with {err.name} yet carries SN {acks[-1].sn}"
    return Answer(tuple(acks), {m.ordinal: tuple(m.sssns) for m in resp.missing})


class RawSession:
    """One producer (id) writing to one stream, every session field chosen by the test."""

    def __init__(self, client, stream: str, producer_id: bytes, *, channels: Channels | None = None,
                 epoch: int = 0, session_ordinals: bool = False):
        self.client = client                   # sms.Client (sync): stream info only
        self.stream = stream
        self.producer_id = producer_id
        self.epoch = epoch                     # the producer's epoch on every request (0: none)
        # send each record's session partition (its partition now), as sms.Producer does: the
        # owner then takes a request in the usual form as runs (ingestion's fast path)
        self.session_ordinals = session_ordinals
        self._own_channels = channels is None
        self.channels = channels or Channels()
        self.info: StreamInfo = client.get_stream_info(stream)

    def close(self) -> None:
        if self._own_channels:
            self.channels.close()

    def __enter__(self) -> "RawSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- routing ------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the stream's map (a restarted head listens on another address)."""
        self.info = self.client.get_stream_info(self.stream)

    def ordinal_of(self, key: str) -> int:
        return self.info.open_partition_for_hash(hashing.hash_key_of(key)).ordinal

    def owner(self, ordinal: int) -> str:
        owner = self.info.partition(ordinal).ingestion_owner
        if owner is None or not owner.address:
            raise errors.Unavailable(f"{self.stream} p{ordinal}: no ingestion owner registered")
        return owner.address

    # --- sending ------------------------------------------------------------------------
    def put(self, records: Sequence[Submit], hwm: Mapping[int, int] | None = None, *,
            address: str | None = None, timeout_s: float = limits.PUT_TIMEOUT_S) -> Answer:
        """Send the records (one request per ingestion owner, in order within each) and
        answer per record. `address` sends everything to that node instead. A whole-request
        error is raised as its named SmsError."""
        groups: dict[str, list[int]] = {}
        for i, s in enumerate(records):
            groups.setdefault(address or self.owner(self.ordinal_of(s.key)), []).append(i)
        acks: list[Ack | None] = [None] * len(records)
        missing: dict[int, tuple[int, ...]] = {}
        for owner, indexes in groups.items():
            answer = send_entries(self.channels, owner, self.stream, self.producer_id,
                                  [encode(records[i]) for i in indexes], hwm, timeout_s, self.epoch,
                                  [self.ordinal_of(records[i].key) for i in indexes] if self.session_ordinals
                                  else None)
            for i, ack in zip(indexes, answer.acks):
                acks[i] = ack
            for ordinal, sssns in answer.missing.items():
                missing[ordinal] = tuple(sorted(set(missing.get(ordinal, ())) | set(sssns)))
        return Answer(tuple(acks), missing)

    def put_until_settled(self, records: Sequence[Submit], hwm: Mapping[int, int] | None = None, *,
                          timeout_s: float = SETTLE_TIMEOUT_S) -> "Settled":
        """Send the same request (same SSSNs, submit times and HWM) until no record is
        answered with a retriable error, refreshing the map between attempts. Returns the
        final answer, every answer received on the way (to check that they agree) and the
        number of attempts (whole-request failures included)."""
        deadline = time.monotonic() + timeout_s
        answers: list[Answer] = []
        attempts = 0
        last: object = None
        while True:
            attempts += 1
            try:
                answer = self.put(records, hwm)
                answers.append(answer)
                if not answer.retriable:
                    return Settled(answer, answers, attempts)
                last = [(a.error_name, a.error_message) for a in answer.acks if a.retriable][:3]
            except errors.SmsError as e:
                if not e.retriable:
                    raise
                last = e
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.producer_id!r}: request of SSSNs {[r.sssn for r in records][:5]}... "
                                     f"still answered retriable after {timeout_s}s ({attempts} attempts): {last}")
            time.sleep(RETRY_INTERVAL_S)
            try:
                self.refresh()
            except errors.SmsError as e:
                if not e.retriable:
                    raise


@dataclass(frozen=True, slots=True)
class Settled:
    answer: Answer                 # the final answer: no record retriable
    answers: list[Answer]          # every answer received, the final one last
    attempts: int                  # requests sent, including those that failed whole


# --- helpers ---------------------------------------------------------------------------------

def key_for_ordinal(info: StreamInfo, ordinal: int, prefix: str) -> str:
    """A partition key (starting with `prefix`) whose records land in partition `ordinal`."""
    for i in range(100_000):
        key = f"{prefix}-{i}"
        if info.open_partition_for_hash(hashing.hash_key_of(key)).ordinal == ordinal:
            return key
    raise AssertionError(f"no key with prefix {prefix!r} routes to p{ordinal}")


def cumulative_hwm(acked: Iterable[int], hwm: int = -1) -> int:
    """The highest SSSN h such that h and every SSSN below it (above `hwm`) are acked."""
    acked = set(acked)
    while hwm + 1 in acked:
        hwm += 1
    return hwm


def stored_session_records(records: Iterable[Record]) -> list[StoredSession]:
    """The stored records that carry producer-session meta, in storage order."""
    out = []
    for r in records:
        if not r.meta:
            continue
        meta = wire.decode_meta(r.meta)
        if wire.TAG_PRODUCER_ID not in meta:
            continue
        assert wire.TAG_SSSN in meta, f"record {r.sn} has a producer id but no SSSN"
        out.append(StoredSession(meta[wire.TAG_PRODUCER_ID], int.from_bytes(meta[wire.TAG_SSSN], "big"),
                                 meta.get(wire.TAG_DEDUP_KEY), r.sn, r.partition_key, r.data))
    return out
