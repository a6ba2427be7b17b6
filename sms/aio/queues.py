"""The asyncio client's queues (docs/queues.md): create, describe, list, update, delete."""

from __future__ import annotations

from sms import errors
from typing import TYPE_CHECKING, cast

from sms.aio.groups import Groups
from sms.proto import sms_pb2
from sms.queue import Queue
from sms.types import QueueInfo, QueueStatus

if TYPE_CHECKING:
    from sms.aio import Client

_STARTS = ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP")


def queue_from_pb(pb: sms_pb2.QueueDescription) -> QueueInfo:
    return QueueInfo(name=pb.name, stream=pb.stream, status=QueueStatus(pb.status), created_ms=pb.created_ms,
                     start=pb.start, timestamp_ms=pb.timestamp_ms, visibility_s=pb.visibility_s,
                     max_receive_count=pb.max_receive_count, uid=int(pb.uid, 16))


def _settings(request: sms_pb2.CreateQueueRequest | sms_pb2.UpdateQueueRequest, visibility_timeout_s: int | None,
              max_receive_count: int | None) -> None:
    """The settings given (the server checks their ranges; here only that each is an int)."""
    for field, value in (("visibility_s", visibility_timeout_s), ("max_receive_count", max_receive_count)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
            raise errors.InvalidArgument(f"{field} {value!r}; expected an int 0..{2**32 - 1}")
        setattr(request, field, value)


class Queues(Groups):
    """The queues part of `sms.aio.Client` (sms/aio/__init__.py), after groups."""

    async def create_queue(self, stream: str, name: str, *, starting_position: str = "LATEST",
                           timestamp_ms: int = 0, visibility_timeout_s: int | None = None,
                           max_receive_count: int | None = None) -> QueueInfo:
        """A queue on `stream` (docs/queues.md). `starting_position`: LATEST (what is
        written from now on), TRIM_HORIZON (everything the stream holds) or AT_TIMESTAMP
        (`timestamp_ms`). `visibility_timeout_s`: 0-43,200, 30 unless given.
        `max_receive_count`: receives before a record becomes a dead letter, 1-1,000, 6
        unless given; 0: no dead letters.

        Raises:
            QueueAlreadyExists, StreamNotFound, InvalidArgument, LimitExceeded."""
        if starting_position not in _STARTS:
            raise errors.InvalidArgument(f"starting position {str(starting_position)[:32]!r}; expected one of "
                                         f"{', '.join(_STARTS)}")
        request = sms_pb2.CreateQueueRequest(name=name, stream=stream, start=starting_position,
                                             timestamp_ms=timestamp_ms)
        _settings(request, visibility_timeout_s, max_receive_count)
        return queue_from_pb(await self._admin_call("CreateQueue", request))

    async def describe_queue(self, name: str) -> QueueInfo:
        """Raises QueueNotFound."""
        return queue_from_pb(await self._discovery_call("DescribeQueue", sms_pb2.QueueRequest(name=name)))

    async def list_queues(self, stream: str = "") -> list[QueueInfo]:
        """The queues (on `stream` when given), by name."""
        answer = await self._discovery_call("ListQueues", sms_pb2.ListQueuesRequest(stream=stream))
        return [queue_from_pb(q) for q in answer.queues]

    async def update_queue(self, name: str, *, visibility_timeout_s: int | None = None,
                           max_receive_count: int | None = None) -> QueueInfo:
        """New settings; what is not given stays. A visibility timeout applies to records
        received from now on. Raises QueueNotFound, InvalidArgument."""
        request = sms_pb2.UpdateQueueRequest(name=name)
        _settings(request, visibility_timeout_s, max_receive_count)
        return queue_from_pb(await self._discovery_call("UpdateQueue", request))

    def queue(self, name: str) -> Queue:
        """A worker's handle on the queue `name`: receive, ack, change_visibility and the
        dead-letter calls (sms/queue.py). Makes no call until it is used."""
        return Queue(cast("Client", self), name)

    async def delete_queue(self, name: str) -> None:
        """The queue and its delivery state; the stream and its records stay. Raises
        QueueNotFound."""
        await self._admin_call("DeleteQueue", sms_pb2.QueueRequest(name=name))
