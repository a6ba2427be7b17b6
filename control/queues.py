"""Queues on the server: their definitions in the metadata store (docs/queues.md). Any node
answers; each change is one write of the queue's entry. What a queue has delivered is not
here: that is per partition, with the partition's owner, in the queue's state log.

    /queues/<queue>     QueueInfo as JSON (its stored name: a tenant's prefix in front)

Queue names are the Kinesis model's ([a-zA-Z0-9_.-]{1,128}), one namespace per tenant as
Kinesis has one per account; a queue reads one stream of its tenant.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time

from metastore import BadVersionError, Create, MetaStore, NodeExistsError, NoNodeError, Set
from metastore.view import ClusterView, bounded
from sms import limits, metadata, seqno
from sms.errors import InvalidArgument, LimitExceeded, QueueAlreadyExists, QueueNotFound, StreamNotFound, Unavailable
from sms.types import QueueInfo, QueueStatus, StreamStatus

_QUEUE = re.compile(r"[a-zA-Z0-9_.-]{1,%d}" % limits.QUEUE_NAME_CHARS_MAX)
_STORED = re.compile(r"(?:[a-z0-9-]{1,%d}%s)?[a-zA-Z0-9_.-]{1,%d}" % (
    limits.TENANT_NAME_CHARS_MAX, re.escape(metadata.TENANT_SEP), limits.QUEUE_NAME_CHARS_MAX))
STARTS = ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP")


def validate_queue_name(name: object, stored: bool = True) -> str:
    """A queue name as stored (`stored`: a tenant's prefix allowed), or as a caller gives it."""
    pattern = _STORED if stored else _QUEUE
    if not isinstance(name, str) or not pattern.fullmatch(name) or name.rpartition(metadata.TENANT_SEP)[2] in (".", ".."):
        raise InvalidArgument(f"queue name {str(name)[:80]!r}; expected [a-zA-Z0-9_.-]{{1,"
                              f"{limits.QUEUE_NAME_CHARS_MAX}}}, not '.' or '..'")
    return name


def validate_visibility(seconds: int) -> int:
    if not 0 <= seconds <= limits.QUEUE_VISIBILITY_S_MAX:
        raise InvalidArgument(f"visibility timeout {seconds} s; expected 0..{limits.QUEUE_VISIBILITY_S_MAX}")
    return seconds


def validate_max_receive_count(count: int) -> int:
    if not 0 <= count <= limits.QUEUE_MAX_RECEIVE_COUNT_MAX:
        raise InvalidArgument(f"max receive count {count}; expected 1..{limits.QUEUE_MAX_RECEIVE_COUNT_MAX}, "
                              "or 0 for no dead letters")
    return count


def consumer_name(queue: QueueInfo) -> str:
    """The registered consumer a queue is on its stream (docs/queues.md): what it has not
    acknowledged is kept while the stream protects unread records."""
    return f"queue.{queue.uid:016x}"


def start_cursor(queue: QueueInfo) -> int:
    """Where a partition's delivery begins when its log says nothing yet: LATEST is what was
    written from the queue's creation on (so it does not move with the first receive)."""
    if queue.start == "TRIM_HORIZON":
        return 0
    return seqno.lower_bound_for_time(queue.timestamp_ms if queue.start == "AT_TIMESTAMP" else queue.created_ms)


def to_bytes(q: QueueInfo) -> bytes:
    d = dataclasses.asdict(q)
    d["status"] = q.status.value
    d["uid"] = str(q.uid)
    return json.dumps(d).encode()


def from_bytes(raw: bytes) -> QueueInfo:
    d = json.loads(raw)
    return QueueInfo(name=d["name"], stream=d["stream"], status=QueueStatus(d["status"]), created_ms=d["created_ms"],
                     start=d["start"], timestamp_ms=d["timestamp_ms"], visibility_s=d["visibility_s"],
                     max_receive_count=d["max_receive_count"], uid=int(d["uid"]))


class Queues:
    def __init__(self, store: MetaStore, view: ClusterView):
        self.store = store
        self.view = view

    async def create(self, name: str, stream: str, start: str = "", timestamp_ms: int = 0,
                     visibility_s: int | None = None, max_receive_count: int | None = None,
                     make_log=None, drop_log=None) -> QueueInfo:
        """A new queue on `stream` (both stored names). `make_log(queue, stream view)` makes
        its state log before its entry is written, `drop_log(queue)` removes it again when
        the entry cannot be (the control leader's StreamAdmin; ControlService.CreateQueue).
        Raises QueueAlreadyExists, StreamNotFound, InvalidArgument, LimitExceeded."""
        validate_queue_name(name)
        metadata.validate_stream_name(stream)
        if metadata.tenant_of(name) != metadata.tenant_of(stream):
            raise InvalidArgument("a queue reads a stream of its own tenant")
        start = start or "LATEST"
        if start not in STARTS:
            raise InvalidArgument(f"starting position {start[:32]!r}; expected one of {', '.join(STARTS)}")
        if start == "AT_TIMESTAMP":
            if not 0 < timestamp_ms <= seqno.TS_MAX:
                raise InvalidArgument(f"AT_TIMESTAMP needs a timestamp (ms since the epoch); {timestamp_ms} given")
        elif timestamp_ms:
            raise InvalidArgument(f"a timestamp is for AT_TIMESTAMP, not {start}")
        visibility = validate_visibility(limits.QUEUE_VISIBILITY_S_DEFAULT if visibility_s is None else visibility_s)
        receives = validate_max_receive_count(limits.QUEUE_MAX_RECEIVE_COUNT_DEFAULT if max_receive_count is None
                                              else max_receive_count)
        view = await bounded(self.view.stream(stream, max_age_s=0), f"the config of stream {stream[:64]!r}")
        if view.config.status is StreamStatus.DELETING or metadata.is_queue_state(stream):
            raise StreamNotFound(f"stream {stream!r} is being deleted" if view.config.status is StreamStatus.DELETING
                                 else f"stream {stream!r} is a queue's state log, not a stream to queue")
        existing = await self._all()
        if sum(1 for q in existing if q.stream == stream) >= limits.QUEUES_PER_STREAM_MAX:
            raise LimitExceeded(f"stream {stream!r} has {limits.QUEUES_PER_STREAM_MAX} queues; delete one first")
        if len(existing) >= limits.QUEUES_MAX:
            raise LimitExceeded(f"the cluster has {limits.QUEUES_MAX} queues; delete one first")
        queue = QueueInfo(name=name, stream=stream, status=QueueStatus.ACTIVE, created_ms=int(time.time() * 1000),
                          start=start, timestamp_ms=timestamp_ms, visibility_s=visibility,
                          max_receive_count=receives, uid=secrets.randbits(63) + 1)
        if await self.store.get(metadata.queue_path(name)) is not None:
            raise QueueAlreadyExists(f"queue {name!r} exists")
        try:
            await self.store.commit([Create(metadata.QUEUES)])
        except NodeExistsError:
            pass
        if make_log is not None:
            await make_log(queue, view)
        try:
            await self.store.commit([Create(metadata.queue_path(name), to_bytes(queue))])
        except NodeExistsError:
            if drop_log is not None:
                await drop_log(queue)
            raise QueueAlreadyExists(f"queue {name!r} exists") from None
        return queue

    async def describe(self, name: str) -> QueueInfo:
        validate_queue_name(name)
        entry = await self.store.get(metadata.queue_path(name))
        if entry is None:
            raise QueueNotFound(f"queue {name!r} does not exist")
        return from_bytes(entry.value)

    async def list(self, tenant: str, stream: str = "") -> list[QueueInfo]:
        """The tenant's queues (on `stream`, a stored name, when given), by name."""
        return sorted((q for q in await self._all() if metadata.tenant_of(q.name) == tenant
                       and (not stream or q.stream == stream)), key=lambda q: q.name)

    async def update(self, name: str, visibility_s: int | None = None,
                     max_receive_count: int | None = None) -> QueueInfo:
        """New settings: a visibility timeout applies to records received from now on, a
        max receive count to records whose deadline passes from now on."""
        validate_queue_name(name)
        if visibility_s is not None:
            validate_visibility(visibility_s)
        if max_receive_count is not None:
            validate_max_receive_count(max_receive_count)
        path = metadata.queue_path(name)
        for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
            entry = await self.store.get(path)
            if entry is None:
                raise QueueNotFound(f"queue {name!r} does not exist")
            queue = from_bytes(entry.value)
            changed = dataclasses.replace(
                queue, visibility_s=queue.visibility_s if visibility_s is None else visibility_s,
                max_receive_count=queue.max_receive_count if max_receive_count is None else max_receive_count)
            if changed == queue:
                return queue
            try:
                await self.store.commit([Set(path, to_bytes(changed), entry.version)])
                return changed
            except BadVersionError:
                continue                   # changed meanwhile: again, on what it is now
            except NoNodeError:
                raise QueueNotFound(f"queue {name!r} does not exist") from None
        raise Unavailable(f"queue {name!r} kept changing under this update; try again")

    async def delete(self, name: str, drop_log=None) -> None:
        """The queue's entry, then (`drop_log(queue)`) its state log."""
        queue = await self.describe(name)
        try:
            await self.store.delete(metadata.queue_path(name), recursive=True)     # (its snapshots' SNs too)
        except NoNodeError:
            raise QueueNotFound(f"queue {name!r} does not exist") from None
        if drop_log is not None:
            await drop_log(queue)

    async def on_stream(self, stream: str) -> list[QueueInfo]:
        """The queues on `stream` (a stored name): a stream with queues is not deleted."""
        return [q for q in await self._all() if q.stream == stream]

    async def _all(self) -> list[QueueInfo]:
        try:
            children = await self.store.children(metadata.QUEUES)
        except NoNodeError:
            return []
        out = []
        for child in children:
            entry = await self.store.get(metadata.queue_path(child))
            if entry is not None:
                out.append(from_bytes(entry.value))
        return out
