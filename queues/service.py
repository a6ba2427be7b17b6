"""The `Queues` gRPC service of a node (docs/queues.md): receives and settles (acks,
visibility changes, restores) for the partitions whose chain head this node is, each
served by its `PartitionOwner` (queues/owner.py), made at the first call and closed when
the partition's head moves away or the queue is deleted.

A receive names the partitions to take from (the client routes by the stream's map); the
node takes from them in turn, starting one further each call, so that every partition is
served; a partition it does not own is answered in `not_owned`. With nothing visible it
waits up to `wait_ms` (long polling) for a partition to have records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from control import auth
from control.queues import from_bytes as queue_from_bytes, validate_queue_name
from kernel.aiotools import cancel_and_wait
from kernel.rpc import rpc_errors
from metastore import MetaStoreError
from metastore.view import ClusterView, bounded
from queues.owner import PartitionOwner
from queues.state import HandleError, parse_handle
from sms import errors, limits, metadata, seqno
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import QueueInfo

log = logging.getLogger(__name__)

SETTLE_OPS = {"ack": False, "visibility": False, "ack_dead": True, "visibility_dead": True, "restore": True}


class QueueService(sms_pb2_grpc.QueuesServicer):
    def __init__(self, node_id: str, view: ClusterView, client: Any):
        self.node_id = node_id
        self.view = view
        self.client = client               # sms.aio.Client, internal: the owners' own client of the cluster
        self.owners: dict[tuple[str, int, int], PartitionOwner] = {}
        self._queues: dict[str, tuple[float, QueueInfo]] = {}
        self._turn: dict[str, int] = {}
        self._checker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._checker = asyncio.get_running_loop().create_task(self._check_loop(), name="queue-owners")

    async def close(self) -> None:
        await cancel_and_wait(self._checker)
        for owner in list(self.owners.values()):
            await owner.close("the node stops")
        self.owners.clear()
        await self.client.close()

    # --- owners ---------------------------------------------------------------------------
    async def _queue(self, name: str, fresh: bool = False) -> QueueInfo:
        validate_queue_name(name)
        cached = self._queues.get(name)
        if cached is not None and not fresh and time.monotonic() - cached[0] < limits.QUEUE_CONFIG_CACHE_S:
            return cached[1]
        entry = await bounded(self.view.store.get(metadata.queue_path(name)), f"queue {name[:64]!r}")
        if entry is None:
            self._queues.pop(name, None)
            raise errors.QueueNotFound(f"queue {name!r} does not exist")
        queue = queue_from_bytes(entry.value)
        self._queues[name] = (time.monotonic(), queue)
        return queue

    async def _owner(self, queue: QueueInfo, ordinal: int) -> PartitionOwner | None:
        """The owner of the queue's partition here (made and started at first use), or None
        when this node is not the partition's head. A running owner is taken as it is: the
        check loop looks at its partition's head every QUEUE_OWNER_CHECK_S, and until it
        closes it, an owner whose partition moved serves nothing a new owner serves (its
        writes are fenced, its lease waited out: queues/owner.py)."""
        key = (queue.name, queue.uid, ordinal)
        owner = self.owners.get(key)
        if owner is not None and not owner.closed:
            if owner.queue != queue:
                owner.queue = queue                  # (new settings: visibility, max receive count)
            return owner
        view = await bounded(self.view.stream(queue.stream), f"stream {queue.stream[:64]!r}")
        chain = view.chains.get(ordinal)
        if chain is None or chain.head != self.node_id:
            return None
        if owner is not None:
            del self.owners[key]                     # (it stopped: a new one takes over again)
        owner = self.owners[key] = PartitionOwner(queue, ordinal, self.client, self.view)
        owner.start()
        return owner

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.QUEUE_OWNER_CHECK_S)
            for key, owner in list(self.owners.items()):
                try:
                    queue = await self._queue(owner.queue.name, fresh=True)
                    view = await self.view.stream(queue.stream)
                    chain = view.chains.get(owner.ordinal)
                    keep = queue.uid == owner.queue.uid and chain is not None and chain.head == self.node_id
                except (errors.QueueNotFound, errors.StreamNotFound):
                    keep = False
                except (errors.SmsError, MetaStoreError, TimeoutError):
                    continue                         # (the metadata store is away: look again later)
                except Exception:                    # (never the end of this check: logged, again later)
                    log.exception("queue owners: checking %s failed", owner.queue.name)
                    continue
                if not keep or owner.closed:
                    self.owners.pop(key, None)
                    await owner.close()

    @staticmethod
    def _caller_sees(queue: QueueInfo) -> None:
        caller = auth.CURRENT.get()
        if caller is not None and not caller.sees(auth.unqualify(queue.stream)):
            raise errors.QueueNotFound(f"queue {auth.unqualify(queue.name)!r} does not exist")

    # --- calls ----------------------------------------------------------------------------
    @rpc_errors
    async def Receive(self, request, context):
        if not 1 <= request.limit <= limits.QUEUE_RECEIVE_RECORDS_MAX:
            raise errors.InvalidArgument(f"limit {request.limit}; expected 1..{limits.QUEUE_RECEIVE_RECORDS_MAX}")
        if request.wait_ms > limits.QUEUE_WAIT_S_MAX * 1000:
            raise errors.InvalidArgument(f"wait {request.wait_ms} ms; at most {limits.QUEUE_WAIT_S_MAX * 1000}")
        if len(request.ordinals) > limits.STREAM_PARTITIONS_MAX:
            raise errors.InvalidArgument(f"{len(request.ordinals)} partitions; at most {limits.STREAM_PARTITIONS_MAX}")
        queue = await self._queue(request.queue)
        self._caller_sees(queue)
        visibility = request.visibility_s if request.HasField("visibility_s") else queue.visibility_s
        if visibility > limits.QUEUE_VISIBILITY_S_MAX:
            raise errors.InvalidArgument(f"visibility timeout {visibility} s; at most {limits.QUEUE_VISIBILITY_S_MAX}")
        owners: list[PartitionOwner] = []
        not_owned = []
        for ordinal in dict.fromkeys(request.ordinals):
            owner = await self._owner(queue, ordinal)
            if owner is None:
                not_owned.append(ordinal)
            else:
                owners.append(owner)
        answer = sms_pb2.QueueReceiveResponse(not_owned=not_owned)
        if not owners:
            return answer
        turn = self._turn.get(queue.name, 0)
        self._turn[queue.name] = turn + 1
        owners = owners[turn % len(owners):] + owners[:turn % len(owners)]
        deadline = time.monotonic() + request.wait_ms / 1000
        while True:
            for owner in owners:
                if len(answer.records) >= request.limit:
                    break
                if not owner.ready.is_set():
                    continue
                owner.available.clear()
                for delivery, record in await owner.receive(request.limit - len(answer.records), visibility,
                                                            request.dead):
                    answer.records.append(sms_pb2.QueueRecord(
                        handle=delivery.handle, sn=seqno.to_bytes(delivery.sn), ordinal=owner.ordinal,
                        partition_key=record.partition_key, data=record.data, meta=record.meta,
                        first_receive_ms=delivery.first_receive_ms, receive_count=delivery.receive_count))
            left = deadline - time.monotonic()
            if answer.records or left <= 0:
                return answer
            await _any_set([o.available for o in owners] + [o.ready for o in owners if not o.ready.is_set()],
                           min(left, limits.QUEUE_POLL_INTERVAL_MS / 1000))

    @rpc_errors
    async def Settle(self, request, context):
        if not 1 <= len(request.entries) <= limits.QUEUE_RECEIVE_RECORDS_MAX:
            raise errors.InvalidArgument(f"{len(request.entries)} entries; expected 1.."
                                         f"{limits.QUEUE_RECEIVE_RECORDS_MAX}")
        queue = await self._queue(request.queue)
        self._caller_sees(queue)
        results = [sms_pb2.QueueSettleResult() for _ in request.entries]
        waits: list[tuple[int, asyncio.Future[None]]] = []
        for i, entry in enumerate(request.entries):
            outcome = await self._settle_one(queue, entry)
            if isinstance(outcome, asyncio.Future):
                waits.append((i, outcome))
            else:
                results[i].error_name, results[i].error_message = outcome
        for i, fut in waits:
            try:
                await fut
            except errors.SmsError as e:       # (not in the log: the owner stopped; the caller retries)
                results[i].error_name, results[i].error_message = e.name, e.message
        return sms_pb2.QueueSettleResponse(results=results)

    async def _settle_one(self, queue: QueueInfo, entry) -> tuple[str, str] | asyncio.Future[None]:
        """One entry of a Settle: its (error name, message), or a future that resolves once
        its change is in the log."""
        dead = SETTLE_OPS.get(entry.op)
        if dead is None:
            return "InvalidArgument", f"op {entry.op[:32]!r}; expected one of {', '.join(SETTLE_OPS)}"
        if entry.visibility_s > limits.QUEUE_VISIBILITY_S_MAX:
            return "InvalidArgument", (f"visibility timeout {entry.visibility_s} s; at most "
                                       f"{limits.QUEUE_VISIBILITY_S_MAX}")
        try:
            handle = parse_handle(entry.handle)
        except errors.InvalidArgument as e:
            return e.name, e.message
        if handle.queue_uid != queue.uid:
            return (HandleError.EXPIRED.value,
                    "the receipt handle is of another queue, or of this queue before it was made again")
        if handle.dead != dead:
            return HandleError.NOT_DEAD.value, ("a dead letter's handle is for the dead-letter calls, and only it"
                                                if handle.dead else
                                                "the dead-letter calls take the handles of dead-letter receives")
        try:
            owner = await self._owner(queue, handle.ordinal)
            if owner is None:
                raise errors.WrongOwner(f"p{handle.ordinal:04d} of {auth.unqualify(queue.stream)!r} is not "
                                        f"served here; refresh the stream's map")
            if not owner.ready.is_set():
                await asyncio.wait_for(owner.ready.wait(), limits.RPC_TIMEOUT_S)
            error, fut = owner.settle(handle, entry.op.removesuffix("_dead"), entry.visibility_s)
        except TimeoutError:
            return "Unavailable", "the queue's owner is not ready"
        except errors.SmsError as e:
            return e.name, e.message
        if error is HandleError.EXPIRED:
            return error.value, "the record was received again, acknowledged or restored since this handle was issued"
        if error is not None:
            return error.value, "not a dead letter's handle"
        assert fut is not None
        return fut

    def status(self) -> list[dict[str, Any]]:
        return [owner.status() for owner in self.owners.values()]


async def _any_set(events: list[asyncio.Event], timeout_s: float) -> None:
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
