"""The Kinesis queue operations (docs/queues.md, docs/kinesis.md): each a call of the native
client's queues (`create_queue`, `client.queue(name).receive`, ...), as the key that signed
the request. Queue ARNs are `arn:aws:kinesis:<region>:<account>:queue/<name>`; a queue
reads one stream (StreamConfigurationList of one entry); the per-entry answers are the
model's Successful and Failed lists.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from kinesis import mapping
from kinesis.operations import operation
from kinesis.protocol import KinesisError
from sms import errors, limits
from sms.queue import Queue
from sms.types import QueueInfo

if TYPE_CHECKING:
    from kinesis.service import Caller, KinesisService

_QUEUE_ARN = re.compile(r"arn:aws[a-z-]*:kinesis:([a-z0-9-]*):(\d{12}):queue/([a-zA-Z0-9_.-]{1,128})")


def queue_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:queue/{name}"


def _queue_named(params: dict[str, Any], caller: Caller) -> str:
    arn = params.get("QueueARN", "")
    m = _QUEUE_ARN.fullmatch(arn)
    if m is None:
        raise KinesisError("InvalidArgumentException", f"QueueARN {arn[:200]} is not a queue ARN of the form "
                                                       f"arn:aws:kinesis:<region>:<account>:queue/<name>")
    if m.group(2) != caller.account:
        raise KinesisError("AccessDeniedException", f"QueueARN {arn[:200]} belongs to account {m.group(2)}, "
                                                    f"not this cluster's {caller.account}")
    return m.group(3)


def _queue(svc: KinesisService, params: dict[str, Any], caller: Caller) -> Queue:
    """The queue the request's QueueARN names, as the endpoint's shared client sees it (no
    name cached across callers: sms/queue.py, `shared`)."""
    return Queue(svc.client, _queue_named(params, caller), shared=True)


def _description(q: QueueInfo, caller: Caller) -> dict[str, Any]:
    position: dict[str, Any] = {"Type": q.start}
    if q.start == "AT_TIMESTAMP":
        position["Timestamp"] = q.timestamp_ms / 1000
    dead: dict[str, Any] = ({"TargetType": "BUILT_IN", "MaxReceiveCount": q.max_receive_count}
                            if q.max_receive_count else {"TargetType": "NONE"})
    return {"QueueName": q.name, "QueueARN": queue_arn(caller.region, caller.account, q.name),
            "QueueStatus": q.status.value, "QueueCreationTimestamp": q.created_ms / 1000,
            "StreamConfigurationList": [{"StreamARN": mapping.stream_arn(caller.region, caller.account, q.stream),
                                         "StartingPosition": position}],
            "QueueAttributes": {"VisibilityTimeoutSeconds": q.visibility_s, "DeadLetterConfiguration": dead}}


def _settings(attributes: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(visibility s, max receive count) of QueueAttributes (None: not given; 0 receives: NONE)."""
    attributes = attributes or {}
    dead = attributes.get("DeadLetterConfiguration")
    receives = None
    if dead is not None:
        if dead.get("TargetType") == "NONE":
            if "MaxReceiveCount" in dead:
                raise KinesisError("InvalidArgumentException", "MaxReceiveCount is for TargetType BUILT_IN")
            receives = 0
        else:
            if "MaxReceiveCount" not in dead:
                raise KinesisError("InvalidArgumentException",
                                   "DeadLetterConfiguration with TargetType BUILT_IN needs MaxReceiveCount")
            receives = dead["MaxReceiveCount"]
    return attributes.get("VisibilityTimeoutSeconds"), receives


@operation("CreateQueue")
async def create_queue(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    streams = params["StreamConfigurationList"]
    if len(streams) != 1:
        raise KinesisError("InvalidArgumentException", f"a queue here reads one stream; {len(streams)} given "
                                                       "(docs/queues.md)")
    stream = mapping.stream_of({"StreamARN": streams[0]["StreamARN"]}, caller.account)
    position = streams[0].get("StartingPosition") or {"Type": "LATEST"}
    timestamp_ms = int(position["Timestamp"] * 1000) if position.get("Timestamp") is not None else 0
    visibility, receives = _settings(params.get("QueueAttributes"))
    if params.get("Tags"):
        raise KinesisError("InvalidArgumentException", "queues here keep no tags (docs/queues.md)")
    try:
        q = await svc.client.create_queue(stream, params["QueueName"], starting_position=position["Type"],
                                          timestamp_ms=timestamp_ms, visibility_timeout_s=visibility,
                                          max_receive_count=receives)
    except errors.StreamNotFound:
        raise KinesisError("ResourceNotFoundException",
                           f"Stream {stream} under account {caller.account} not found.") from None
    return {"QueueDescription": _description(q, caller)}


@operation("DescribeQueue")
async def describe_queue(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    q = await svc.client.describe_queue(_queue_named(params, caller))
    return {"QueueDescription": _description(q, caller)}


@operation("UpdateQueue")
async def update_queue(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    visibility, receives = _settings(params.get("QueueAttributes"))
    q = await svc.client.update_queue(_queue_named(params, caller), visibility_timeout_s=visibility,
                                      max_receive_count=receives)
    return {"QueueDescription": _description(q, caller)}


@operation("DeleteQueue")
async def delete_queue(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    await svc.client.delete_queue(_queue_named(params, caller))
    return {}


@operation("ListQueues")
async def list_queues(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    wanted = [mapping.stream_of({"StreamARN": f["StreamARN"]}, caller.account) for f in params.get("StreamFilter") or []]
    queues = [q for q in await svc.client.list_queues() if not wanted or q.stream in wanted]
    start = 0
    if params.get("NextToken"):
        after = params["NextToken"]
        start = next((i for i, q in enumerate(queues) if q.name > after), len(queues))
    page = queues[start:start + (params.get("MaxResults") or limits.KINESIS_LIST_CONSUMERS_MAX)]
    answer: dict[str, Any] = {"QueueSummaries": [
        {"QueueName": q.name, "QueueARN": queue_arn(caller.region, caller.account, q.name),
         "QueueStatus": q.status.value, "QueueCreationTimestamp": q.created_ms / 1000,
         "Streams": [{"StreamARN": mapping.stream_arn(caller.region, caller.account, q.stream),
                      "StreamCreationTimestamp": await _stream_created(svc, q.stream)}]}
        for q in page]}
    if start + len(page) < len(queues):
        answer["NextToken"] = page[-1].name
    return answer


async def _stream_created(svc: KinesisService, stream: str) -> float:
    try:
        return (await svc.client.get_stream_info(stream, refresh=False)).created_ms / 1000
    except errors.StreamNotFound:
        return time.time()


def _records(records) -> list[dict[str, Any]]:
    return [{"ReceiptHandle": r.handle, "RecordId": r.record_id, "PartitionKey": r.partition_key, "Data": r.data,
             "ApproximateArrivalTimestamp": r.arrival_ms / 1000, "FirstReceiveTimestamp": r.first_receive_ms / 1000,
             "ReceiveCount": r.receive_count} for r in records]


async def _receive(svc: KinesisService, params: dict[str, Any], caller: Caller, dead: bool) -> dict[str, Any]:
    q = _queue(svc, params, caller)
    call = q.receive_dead_letters if dead else q.receive
    got = await call(params.get("Limit") or limits.QUEUE_RECEIVE_RECORDS_MAX, wait_s=params.get("WaitTimeSeconds") or 0,
                     visibility_timeout_s=params.get("VisibilityTimeoutSeconds"))
    return {"QueueRecords": _records(got)}


def _settled(result) -> dict[str, Any]:
    return {"Successful": [{"ReceiptHandle": h} for h in result.successful],
            "Failed": [{"ReceiptHandle": h, "ErrorCode": code, "ErrorMessage": message}
                       for h, code, message in result.failed]}


@operation("ReceiveQueueRecords")
async def receive_queue_records(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _receive(svc, params, caller, dead=False)


@operation("ReceiveDeadLetterQueueRecords")
async def receive_dead_letters(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _receive(svc, params, caller, dead=True)


async def _handles(svc: KinesisService, params: dict[str, Any], caller: Caller, call) -> dict[str, Any]:
    """An operation on the entries' receipt handles: `call`, a Queue method."""
    return _settled(await call(_queue(svc, params, caller), [e["ReceiptHandle"] for e in params["Entries"]]))


@operation("AcknowledgeQueueRecords")
async def acknowledge(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _handles(svc, params, caller, Queue.ack)


@operation("AcknowledgeDeadLetterQueueRecords")
async def acknowledge_dead_letters(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _handles(svc, params, caller, Queue.ack_dead_letters)


@operation("RestoreDeadLetterQueueRecords")
async def restore_dead_letters(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _handles(svc, params, caller, Queue.restore_dead_letters)


async def _visibility(svc: KinesisService, params: dict[str, Any], caller: Caller, dead: bool) -> dict[str, Any]:
    q = _queue(svc, params, caller)
    call = q.change_dead_letter_visibility if dead else q.change_visibility
    by_timeout: dict[int, list[str]] = {}
    for e in params["Entries"]:
        by_timeout.setdefault(e["VisibilityTimeoutSeconds"], []).append(e["ReceiptHandle"])
    successful, failed = [], []
    for seconds, handles in by_timeout.items():
        result = _settled(await call(handles, seconds))
        successful += result["Successful"]
        failed += result["Failed"]
    return {"Successful": successful, "Failed": failed}


@operation("UpdateQueueRecordsVisibility")
async def update_visibility(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _visibility(svc, params, caller, dead=False)


@operation("UpdateDeadLetterQueueRecordsVisibility")
async def update_dead_letter_visibility(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _visibility(svc, params, caller, dead=True)
