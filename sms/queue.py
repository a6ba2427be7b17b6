"""A worker's handle on a queue (docs/queues.md): `client.queue(name)`.

    q = client.queue("fulfil")
    for record in await q.receive(10, wait_s=20):
        handle(record.data)
        await q.ack([record])

A receive goes to the nodes that own the queue's partitions (each partition's chain head),
one after another, starting one further each call; a settle (ack, visibility, restore) goes
to the owner of each handle's partition. The answer of a settle is per record, as
Kinesis's: check `failed`.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from sms import errors, limits, seqno, wire
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import QueueInfo, partition_id

if TYPE_CHECKING:
    from sms.aio import Client


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A record as a queue delivers it. `handle`: this delivery's receipt handle (ack it,
    change its visibility, restore it); `record_id`: the record's SN, the same in every
    queue of the stream and at every delivery; `receive_count`: receives so far, this one
    included."""
    handle: str
    record_id: str
    partition_id: str
    partition_key: str
    data: bytes
    headers: dict[str, bytes]
    arrival_ms: int
    first_receive_ms: int
    receive_count: int

    @property
    def sequence_number(self) -> str:
        return self.record_id


@dataclass(frozen=True, slots=True)
class SettleResult:
    """Per handle given: `successful` handles, and `failed` ones as (handle, error name,
    message). Error names: ReceiptHandleExpired (received again, acknowledged or restored
    since), InvalidDeadLetterHandle, InvalidArgument, or the error of the owner's node
    (Unavailable: try again)."""
    successful: list[str]
    failed: list[tuple[str, str, str]]


# --- receipt handles (the owners make them: queues/state.py) --------------------------------

_HANDLE = struct.Struct(">BQIQQQB")   # version, queue uid, ordinal, sn hi, sn lo, nonce, dead
_HANDLE_VERSION = 1


class Handle(NamedTuple):
    queue_uid: int
    ordinal: int
    sn: int
    nonce: int
    dead: bool


def make_handle(queue_uid: int, ordinal: int, sn: int, nonce: int, dead: bool) -> str:
    raw = _HANDLE.pack(_HANDLE_VERSION, queue_uid, ordinal, sn >> 64, sn & (2**64 - 1), nonce, 1 if dead else 0)
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def parse_handle(text: str) -> Handle:
    """A receipt handle's fields, or InvalidArgument naming what is wrong with it."""
    if not isinstance(text, str) or not 0 < len(text) <= limits.QUEUE_HANDLE_CHARS_MAX:
        raise errors.InvalidArgument("a receipt handle is a non-empty string this queue issued")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise errors.InvalidArgument("the receipt handle is not one this queue issued (not base64url)") from None
    if len(raw) != _HANDLE.size or raw[0] != _HANDLE_VERSION:
        raise errors.InvalidArgument("the receipt handle is not one this queue issued")
    _v, uid, ordinal, hi, lo, nonce, dead = _HANDLE.unpack(raw)
    if dead > 1 or nonce == 0:
        raise errors.InvalidArgument("the receipt handle is not one this queue issued")
    return Handle(uid, ordinal, (hi << 64) | lo, nonce, bool(dead))


Handles = Sequence["str | QueueRecord"]


def _handles(handles: Handles) -> list[str]:
    out = [h.handle if isinstance(h, QueueRecord) else h for h in handles]
    if not 1 <= len(out) <= limits.QUEUE_RECEIVE_RECORDS_MAX:
        raise errors.InvalidArgument(f"{len(out)} handles; expected 1..{limits.QUEUE_RECEIVE_RECORDS_MAX} a call")
    if not all(isinstance(h, str) for h in out):
        raise errors.InvalidArgument("a handle is a str a receive gave (or the QueueRecord itself)")
    return out


def _check_visibility(seconds: int) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 <= seconds <= limits.QUEUE_VISIBILITY_S_MAX:
        raise errors.InvalidArgument(f"visibility_timeout_s {seconds!r}; expected 0..{limits.QUEUE_VISIBILITY_S_MAX}")


def _ordinal_of(handle: str) -> int | None:
    try:
        return parse_handle(handle).ordinal
    except errors.InvalidArgument:
        return None


class Queue:
    """A queue, as its workers use it (`sms.aio.Client.queue`)."""

    def __init__(self, client: "Client", name: str, *, shared: bool = False):
        """`shared`: the client serves callers of several tenants (the Kinesis endpoint's),
        whose names it must not cache across them: every call reads the queue and its
        stream's map afresh."""
        self.client = client
        self.name = name
        self.shared = shared
        self._info: tuple[float, QueueInfo] | None = None
        self._turn = 0

    async def info(self, fresh: bool = False) -> QueueInfo:
        if self._info is None or fresh or self.shared \
                or time.monotonic() - self._info[0] > limits.QUEUE_CONFIG_CACHE_S * 10:
            self._info = (time.monotonic(), await self.client.describe_queue(self.name))
        return self._info[1]

    async def _owners(self, refresh: bool = False) -> list[tuple[str, list[int]]]:
        """(owner address, its partitions) for every partition that may hold records."""
        info = await self.info(fresh=refresh)        # (made again on another stream, meanwhile)
        stream = await self.client.get_stream_info(info.stream, refresh=refresh or self.shared)
        by: dict[str, list[int]] = {}
        for p in stream.partitions:
            if p.ingestion_owner is None:
                continue
            by.setdefault(p.ingestion_owner.address, []).append(p.ordinal)
        return sorted(by.items())

    # --- receiving ------------------------------------------------------------------------
    async def receive(self, limit: int = limits.QUEUE_RECEIVE_RECORDS_MAX, *, wait_s: float = 0,
                      visibility_timeout_s: int | None = None) -> list[QueueRecord]:
        """Up to `limit` (1-10) visible records, each now in flight for the queue's
        visibility timeout (or `visibility_timeout_s`). `wait_s` (0-20): wait that long for
        one when none is visible (long polling).

        Raises:
            QueueNotFound, InvalidArgument."""
        return await self._receive(limit, wait_s, visibility_timeout_s, dead=False)

    async def receive_dead_letters(self, limit: int = limits.QUEUE_RECEIVE_RECORDS_MAX, *, wait_s: float = 0,
                                   visibility_timeout_s: int | None = None) -> list[QueueRecord]:
        """As `receive`, from the dead letters (records received max_receive_count times
        and never acknowledged)."""
        return await self._receive(limit, wait_s, visibility_timeout_s, dead=True)

    async def _receive(self, limit: int, wait_s: float, visibility_timeout_s: int | None,
                       dead: bool) -> list[QueueRecord]:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= limits.QUEUE_RECEIVE_RECORDS_MAX:
            raise errors.InvalidArgument(f"limit {limit!r}; expected 1..{limits.QUEUE_RECEIVE_RECORDS_MAX}")
        if not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= limits.QUEUE_WAIT_S_MAX:
            raise errors.InvalidArgument(f"wait_s {wait_s!r}; expected 0..{limits.QUEUE_WAIT_S_MAX}")
        if visibility_timeout_s is not None:
            _check_visibility(visibility_timeout_s)
        deadline = time.monotonic() + wait_s
        refresh = False
        out: list[QueueRecord] = []
        waited = False
        while True:
            owners = await self._owners(refresh)
            refresh = False
            if not owners:
                return out
            self._turn += 1
            start = self._turn % len(owners)
            order = owners[start:] + owners[:start]
            # every owner once without waiting; only when none had a record, a long poll at
            # one of them (with several owners, a slice at a time: records may turn up at
            # another), then every owner again
            left = deadline - time.monotonic()
            polls = [(address, ordinals, 0) for address, ordinals in order]
            if waited and left > 0:
                slice_s = min(left, limits.QUEUE_CLIENT_WAIT_SLICE_MS / 1000) if len(owners) > 1 else left
                polls = [(order[0][0], order[0][1], int(slice_s * 1000))]
            for address, ordinals, wait_ms in polls:
                if len(out) >= limit:
                    break
                request = sms_pb2.QueueReceiveRequest(queue=self.name, ordinals=ordinals, limit=limit - len(out),
                                                      wait_ms=wait_ms, dead=dead)
                if visibility_timeout_s is not None:
                    request.visibility_s = visibility_timeout_s
                try:
                    answer = await self.client._call(address, sms_pb2_grpc.QueuesStub, "Receive", request,
                                                     timeout_s=self.client.timeout_s + wait_ms / 1000)
                except (errors.Unavailable, errors.Timeout):
                    refresh = True                 # (that node is away: its partitions move)
                    continue
                refresh = refresh or bool(answer.not_owned)
                out += [_record(r) for r in answer.records]
            if out or time.monotonic() >= deadline:
                return out
            waited = not waited
            if refresh:
                await asyncio.sleep(limits.QUEUE_POLL_INTERVAL_MS / 1000)

    # --- settling -------------------------------------------------------------------------
    async def ack(self, handles: Handles) -> SettleResult:
        """The records are done: not delivered again. Answered once it is durable."""
        return await self._settle(handles, "ack")

    async def change_visibility(self, handles: Handles, visibility_timeout_s: int) -> SettleResult:
        """New deadlines, from now; 0: visible at once (the receive count stays)."""
        return await self._settle(handles, "visibility", visibility_timeout_s)

    async def ack_dead_letters(self, handles: Handles) -> SettleResult:
        """Dead letters (handles of `receive_dead_letters`) discarded."""
        return await self._settle(handles, "ack_dead")

    async def change_dead_letter_visibility(self, handles: Handles, visibility_timeout_s: int) -> SettleResult:
        return await self._settle(handles, "visibility_dead", visibility_timeout_s)

    async def restore_dead_letters(self, handles: Handles) -> SettleResult:
        """Dead letters back in the queue, their receive count 0."""
        return await self._settle(handles, "restore")

    async def _settle(self, handles: Handles, op: str, visibility_s: int = 0) -> SettleResult:
        texts = _handles(handles)
        _check_visibility(visibility_s)
        results: dict[int, tuple[str, str]] = {}
        todo = list(range(len(texts)))
        deadline = time.monotonic() + limits.QUEUE_CLIENT_RETRY_S
        refresh = False
        while todo:
            # a handle whose owner moved (WrongOwner) or did not answer (its node died: the
            # partition's new head takes over) goes again, to the owner the map names now,
            # until QUEUE_CLIENT_RETRY_S; an ack that did land answers success again
            owners = {o: address for address, ordinals in await self._owners(refresh) for o in ordinals}
            groups: dict[str, list[int]] = {}
            for i in todo:
                ordinal = _ordinal_of(texts[i])
                if ordinal is None:
                    results[i] = ("InvalidArgument", "not a receipt handle of a queue")
                elif ordinal not in owners:
                    results[i] = ("ReceiptHandleExpired", "the record's partition is gone")
                else:
                    groups.setdefault(owners[ordinal], []).append(i)
            todo = []
            for address, indexes in groups.items():
                request = sms_pb2.QueueSettleRequest(queue=self.name, entries=[
                    sms_pb2.QueueSettleEntry(handle=texts[i], op=op, visibility_s=visibility_s) for i in indexes])
                try:
                    answer = await self.client._call(address, sms_pb2_grpc.QueuesStub, "Settle", request)
                    outcomes = [(r.error_name, r.error_message) for r in answer.results]
                except (errors.Unavailable, errors.Timeout) as e:
                    outcomes = [(e.name, e.message)] * len(indexes)
                for i, (name, message) in zip(indexes, outcomes):
                    results[i] = (name, message)
                    if name in _RETRIED:
                        todo.append(i)
            if not todo or time.monotonic() >= deadline:
                break
            refresh = True
            await asyncio.sleep(limits.QUEUE_POLL_INTERVAL_MS / 1000)
        # (every handle has its outcome from the first round: "" names no error)
        return SettleResult([texts[i] for i in range(len(texts)) if not results[i][0]],
                            [(texts[i], *results[i]) for i in range(len(texts)) if results[i][0]])


_RETRIED = frozenset({"WrongOwner", "Unavailable", "Timeout"})


def _record(pb: Any) -> QueueRecord:
    sn = seqno.from_bytes(pb.sn)
    return QueueRecord(handle=pb.handle, record_id=str(sn), partition_id=partition_id(pb.ordinal),
                       partition_key=pb.partition_key, data=pb.data, headers=wire.decode_headers(pb.meta),
                       arrival_ms=seqno.timestamp_ms_of(sn), first_receive_ms=pb.first_receive_ms,
                       receive_count=pb.receive_count)
