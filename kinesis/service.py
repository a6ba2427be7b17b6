"""The Kinesis operations, each a translation into the calls a native client makes
(`sms.aio.Client`), made as the key that signed the request: the node's client for the
cluster sends, on each call, a token delegated to that key (control/auth.py `delegate`),
so that the receiving node applies the key's rights, streams, tenant and quotas exactly as
it does for the key's own gRPC calls. Any node answers any operation: the client routes
each call to the node that owns it, inside the cluster.

`handle(operation name, input, Caller)` returns the operation's output as a dict, or
raises a `KinesisError` (engine errors are mapped by kinesis/mapping.py). Operations the
cluster cannot honour answer a clear error, never a silent success.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from control.admin import changed_tags
from kinesis import channels, mapping, queues, settings  # noqa: F401 (channels, queues, settings: they register)
from kinesis.operations import HANDLERS, operation
from kinesis.mapping import shard_id
from kinesis.protocol import KinesisError
from sms import errors, limits, seqno
from sms.aio.transport import CALL_TOKEN
from sms.types import PartitionInfo, PartitionState, StreamInfo, parse_partition_id

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from and where its ARNs live."""
    key_id: str            # "" on a cluster without keys (--insecure)
    region: str
    account: str



# the model's operations this endpoint does not answer yet, and why (docs/kinesis.md)
NOT_SUPPORTED = {
    **{op: "resource policies are not kept: access is by SMS keys (docs/security.md)" for op in (
        "PutResourcePolicy", "GetResourcePolicy", "DeleteResourcePolicy")},
    **{op: "there is no billing on this cluster, and so no minimum throughput commitment or warm throughput"
       for op in ("UpdateAccountSettings", "UpdateStreamWarmThroughput")},
}


class KinesisService:
    """The operations over one node's client of the cluster (`client`: an `sms.aio.Client`
    whose calls carry CALL_TOKEN), `delegate`: key id -> a token for calls on its behalf."""

    def __init__(self, client, delegate: Callable[[str], str] | None, *, replication_factor: int = 0):
        self.client = client
        self.delegate = delegate
        self.replication_factor = replication_factor      # of the streams CreateStream makes (0: min(3, nodes))
        # (stream, consumer, ordinal) subscribed here -> (its start, set when another takes it over)
        self.subscriptions: dict[tuple[str, str, int], tuple[float, asyncio.Event]] = {}
        self.stream_ids: dict[str, str] = {}            # StreamId -> stream name, as last seen
        self.stream_ids_scanned = float("-inf")         # when the streams were last scanned for StreamIds

    async def handle(self, name: str, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        handler = HANDLERS.get(name)
        if handler is None:
            why = NOT_SUPPORTED.get(name, "this operation is not served by this endpoint")
            raise KinesisError("InvalidArgumentException", f"{name}: {why} (docs/kinesis.md)")
        token = CALL_TOKEN.set(self.call_token(caller))
        try:
            return await handler(self, params, caller)
        except errors.SmsError as e:
            raise mapping.error_of(e, caller.account) from None
        finally:
            CALL_TOKEN.reset(token)

    def call_token(self, caller: Caller) -> str | None:
        """The token this request's calls carry: one delegated to the key that signed it
        (None on a cluster without keys)."""
        return self.delegate(caller.key_id) if self.delegate and caller.key_id else None

    # --- helpers ---------------------------------------------------------------------------------
    async def _stream(self, params: dict[str, Any], caller: Caller, refresh: bool = True) -> StreamInfo:
        """The stream an operation names by StreamName, StreamARN or StreamId (any of them
        given together must name the same stream)."""
        wanted = params.get("StreamId")
        if wanted and not (params.get("StreamName") or params.get("StreamARN")):
            name = await self._stream_named_by_id(wanted, caller)
        else:
            name = mapping.stream_of(params, caller.account)
        try:
            info = await self.client.get_stream_info(name, refresh=refresh)
        except errors.StreamNotFound:
            raise KinesisError("ResourceNotFoundException",
                               f"Stream {name} under account {caller.account} not found.") from None
        if wanted and mapping.stream_id(info.name, info.created_ms) != wanted:
            raise KinesisError("ResourceNotFoundException",
                               f"Stream {name} under account {caller.account} has not StreamId {wanted}.")
        return info

    async def _name(self, params: dict[str, Any], caller: Caller) -> str:
        """The name of the stream an operation names (without a metadata read unless by StreamId)."""
        if params.get("StreamId"):
            return (await self._stream(params, caller, refresh=False)).name
        return mapping.stream_of(params, caller.account)

    async def _stream_named_by_id(self, wanted: str, caller: Caller) -> str:
        """The stream whose StreamId is `wanted`: remembered, or found by a scan of the
        streams, at most one scan per KINESIS_STREAM_ID_SCAN_INTERVAL_S (an unknown id in
        between is not found at once: a flood of made-up ids costs one scan a second)."""
        name = self.stream_ids.get(wanted)
        if name is not None:
            return name
        now = time.monotonic()
        if now - self.stream_ids_scanned >= limits.KINESIS_STREAM_ID_SCAN_INTERVAL_S:
            self.stream_ids_scanned = now
            found: dict[str, str] = {}
            for name in await self.client.list_streams():
                try:
                    info = await self.client.get_stream_info(name, refresh=False)
                except errors.StreamNotFound:
                    continue
                found[mapping.stream_id(info.name, info.created_ms)] = info.name
            if wanted in found:
                self.stream_ids[wanted] = found[wanted]
            for stream_id, name in found.items():
                if len(self.stream_ids) >= limits.KINESIS_STREAM_IDS_CACHED_MAX:
                    break
                self.stream_ids[stream_id] = name
        name = self.stream_ids.get(wanted)
        if name is None:
            raise KinesisError("ResourceNotFoundException",
                               f"Stream with StreamId {wanted} under account {caller.account} not found.")
        return name

    async def _replication_factor(self) -> int:
        if self.replication_factor:
            return self.replication_factor
        cluster = await self.client.describe_cluster()
        storage = sum(1 for n in cluster.nodes if "storage" in n.roles)
        return max(1, min(limits.KINESIS_REPLICATION_FACTOR_DEFAULT, storage))


def _shard(p: PartitionInfo) -> dict[str, Any]:
    shard: dict[str, Any] = {
        "ShardId": shard_id(p.ordinal),
        "HashKeyRange": {"StartingHashKey": str(p.hash_lo), "EndingHashKey": str(p.hash_hi - 1)},
        "SequenceNumberRange": {"StartingSequenceNumber": str(seqno.make(p.valid_from_ms, 0, p.ordinal))},
    }
    if p.parents:
        shard["ParentShardId"] = shard_id(p.parents[0])
        if len(p.parents) > 1:
            shard["AdjacentParentShardId"] = shard_id(p.parents[1])
    if p.state is PartitionState.CLOSED and p.ending_sn is not None:
        shard["SequenceNumberRange"]["EndingSequenceNumber"] = str(p.ending_sn or
                                                                   seqno.make(p.valid_to_ms or 0, 0, p.ordinal))
    return shard


def _status(info: StreamInfo) -> str:
    repartitioning = bool(info.repartition) and info.repartition.get("state") not in (None, "", "DONE", "done")
    return mapping.stream_status(info.status.value, repartitioning)


def _created(info: StreamInfo) -> float:
    return info.created_ms / 1000


def _mode(info: StreamInfo) -> dict[str, str]:
    return {"StreamMode": "ON_DEMAND" if info.auto_split_records_per_s else "PROVISIONED"}


def _open(info: StreamInfo) -> list[PartitionInfo]:
    return [p for p in info.partitions if p.state is not PartitionState.CLOSED]


# --- streams ---------------------------------------------------------------------------------------

@operation("CreateStream")
async def create_stream(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = params["StreamName"]
    mode = (params.get("StreamModeDetails") or {}).get("StreamMode", "PROVISIONED")
    shards = params.get("ShardCount")
    if mode == "PROVISIONED" and shards is None:
        raise KinesisError("InvalidArgumentException", "ShardCount is required for a PROVISIONED stream.")
    if mode == "ON_DEMAND" and shards is not None:
        raise KinesisError("InvalidArgumentException", "ShardCount is not taken for an ON_DEMAND stream.")
    tags = params.get("Tags") or {}
    try:
        changed_tags((), tags, None)                  # (checked before the stream is made)
    except errors.SmsError as e:
        raise KinesisError("InvalidArgumentException", e.message) from None
    count = shards if shards is not None else limits.KINESIS_ON_DEMAND_SHARDS
    try:
        # (tags and ON_DEMAND's automatic splitting, docs/repartition-phases.md, are made with
        # the stream: a stream never exists without them)
        await svc.client.create_stream(
            name, partitions=count, replication_factor=await svc._replication_factor(), tags=tags,
            auto_split_records_per_s=limits.KINESIS_ON_DEMAND_SPLIT_RECORDS_PER_S if mode == "ON_DEMAND" else 0)
    except errors.StreamAlreadyExists:
        raise KinesisError("ResourceInUseException",
                           f"Stream {name} under account {caller.account} already exists.") from None
    return {}


@operation("DeleteStream")
async def delete_stream(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream(params, caller)
    if info.consumers and not params.get("EnforceConsumerDeletion"):
        raise KinesisError("ResourceInUseException",
                           f"Stream {info.name} has registered consumers; delete them first, or set "
                           f"EnforceConsumerDeletion.")
    await svc.client.delete_stream(info.name)
    return {}


@operation("DescribeStreamSummary")
async def describe_stream_summary(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream(params, caller)
    return {"StreamDescriptionSummary": {
        "StreamName": info.name, "StreamARN": mapping.stream_arn(caller.region, caller.account, info.name),
        "StreamStatus": _status(info), "StreamModeDetails": _mode(info),
        "RetentionPeriodHours": _retention_hours(info),
        "StreamCreationTimestamp": _created(info),
        "EnhancedMonitoring": [{"ShardLevelMetrics": list(info.shard_metrics)}],
        "EncryptionType": "KMS" if info.encryption != "none" else "NONE",
        **({"KeyId": "sms-master-key"} if info.encryption != "none" else {}),
        "OpenShardCount": len(_open(info)), "ConsumerCount": len(info.consumers),
        "StreamId": mapping.stream_id(info.name, info.created_ms),
        "MaxRecordSizeInKiB": limits.RECORD_DATA_BYTES_MAX // 1024}}


@operation("DescribeStream")
async def describe_stream(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream(params, caller)
    limit = params.get("Limit") or limits.KINESIS_DESCRIBE_SHARDS_MAX
    after = params.get("ExclusiveStartShardId")
    shards = sorted(info.partitions, key=lambda p: p.ordinal)
    if after:
        start = mapping.ordinal_of(after)
        shards = [p for p in shards if p.ordinal > start]
    page = shards[:limit]
    return {"StreamDescription": {
        "StreamName": info.name, "StreamARN": mapping.stream_arn(caller.region, caller.account, info.name),
        "StreamStatus": _status(info), "StreamModeDetails": _mode(info),
        "Shards": [_shard(p) for p in page], "HasMoreShards": len(shards) > len(page),
        "RetentionPeriodHours": _retention_hours(info),
        "StreamCreationTimestamp": _created(info),
        "EnhancedMonitoring": [{"ShardLevelMetrics": list(info.shard_metrics)}],
        "EncryptionType": "KMS" if info.encryption != "none" else "NONE"}}


@operation("ListStreams")
async def list_streams(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    names = sorted(await svc.client.list_streams())
    start = params.get("ExclusiveStartStreamName") or ""
    token = params.get("NextToken")
    if token:
        start = _untoken(token, "ListStreams")
    names = [n for n in names if n > start]
    limit = params.get("Limit") or limits.KINESIS_LIST_STREAMS_MAX
    page, more = names[:limit], len(names) > limit
    summaries = []
    for name in page:
        try:
            info = await svc.client.get_stream_info(name, refresh=False)
        except errors.StreamNotFound:
            continue
        summaries.append({"StreamName": name, "StreamARN": mapping.stream_arn(caller.region, caller.account, name),
                          "StreamStatus": _status(info), "StreamModeDetails": _mode(info),
                          "StreamCreationTimestamp": _created(info)})
    out: dict[str, Any] = {"StreamNames": page, "HasMoreStreams": more, "StreamSummaries": summaries}
    if more:
        out["NextToken"] = _token(page[-1], "ListStreams")
    return out


@operation("ListShards")
async def list_shards(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    token = params.get("NextToken")
    if token:
        # (botocore's paginator sends the first page's StreamName and ShardFilter again with
        # the token: taken when they name the token's stream)
        stream, after = _untoken(token, "ListShards").split("\n", 1)
        named = mapping.stream_of(params, caller.account) if (params.get("StreamName") or params.get("StreamARN")) \
            else stream
        if named != stream or params.get("ExclusiveStartShardId"):
            raise KinesisError("InvalidArgumentException",
                               "NextToken and a StreamName, StreamARN or ExclusiveStartShardId of another listing "
                               "cannot be provided together.")
        params = {"StreamName": stream, "ExclusiveStartShardId": after or None, "ShardFilter": params.get("ShardFilter"),
                  "MaxResults": params.get("MaxResults")}
    info = await svc._stream(params, caller)
    shards = sorted(info.partitions, key=lambda p: p.ordinal)
    after = params.get("ExclusiveStartShardId")
    if after:
        start = mapping.ordinal_of(after)
        shards = [p for p in shards if p.ordinal > start]
    shards = _filtered(shards, params.get("ShardFilter"), info)
    limit = params.get("MaxResults") or limits.KINESIS_LIST_SHARDS_MAX
    page = shards[:limit]
    out: dict[str, Any] = {"Shards": [_shard(p) for p in page]}
    if len(shards) > len(page):
        out["NextToken"] = _token(f"{info.name}\n{shard_id(page[-1].ordinal)}", "ListShards")
    return out


def _filtered(shards: list[PartitionInfo], shard_filter: dict[str, Any] | None,
              info: StreamInfo) -> list[PartitionInfo]:
    """ListShards' ShardFilter: which shards a reader starting there needs."""
    if not shard_filter:
        return shards
    kind = shard_filter["Type"]
    if kind == "AFTER_SHARD_ID":
        start = mapping.ordinal_of(shard_filter.get("ShardId") or "")
        return [p for p in shards if p.ordinal > start]
    if kind in ("AT_LATEST", "FROM_TRIM_HORIZON", "AT_TRIM_HORIZON"):
        if kind == "AT_LATEST":
            return [p for p in shards if p.state is not PartitionState.CLOSED]
        if kind == "AT_TRIM_HORIZON":
            present = {p.ordinal for p in info.partitions}
            return [p for p in shards if not any(q in present for q in p.parents)]
        return shards
    if kind in ("AT_TIMESTAMP", "FROM_TIMESTAMP"):
        at = shard_filter.get("Timestamp")
        if at is None:
            raise KinesisError("InvalidArgumentException", f"ShardFilter {kind} needs a Timestamp.")
        ms = int(at * 1000)
        if kind == "AT_TIMESTAMP":
            return [p for p in shards if p.valid_from_ms <= ms and (p.valid_to_ms is None or ms < p.valid_to_ms)]
        return [p for p in shards if p.valid_to_ms is None or ms < p.valid_to_ms]
    raise KinesisError("InvalidArgumentException", f"ShardFilter type {kind} is not supported.")


def _token(value: str, what: str) -> str:
    return base64.urlsafe_b64encode(f"{what}\n{value}".encode()).decode()


def _untoken(token: str, what: str) -> str:
    try:
        kind, _, value = base64.urlsafe_b64decode(token.encode()).decode().partition("\n")
    except (ValueError, UnicodeDecodeError):
        kind, value = "", ""
    if kind != what:
        raise KinesisError("InvalidArgumentException", f"NextToken {token[:64]} is not one {what} gave.")
    return value


# --- records ---------------------------------------------------------------------------------------

@operation("PutRecord")
async def put_record(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = await svc._name(params, caller)
    key = params.get("PartitionKey")
    if not key:
        raise KinesisError("InvalidArgumentException", "PartitionKey is required.")
    explicit = params.get("ExplicitHashKey")
    result = await svc.client.put_record(name, params["Data"], key,
                                         explicit_hash_key=int(explicit) if explicit is not None else None)
    return {"ShardId": shard_id(result.partition_ordinal), "SequenceNumber": str(result.sn), "EncryptionType": "NONE"}


@operation("PutRecords")
async def put_records(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = await svc._name(params, caller)
    # (the model has checked each entry: Data of at most 1 MiB, a PartitionKey of at most 256
    # characters, an ExplicitHashKey of digits; the client checks them again as for any
    # caller. The model leaves PartitionKey out where the AUTO distribution spreads records:
    # here every record goes by its key)
    entries = params["Records"]
    records = [(r.get("PartitionKey"), r["Data"]) if r.get("ExplicitHashKey") is None
               else (r.get("PartitionKey"), r["Data"], int(r["ExplicitHashKey"])) for r in entries]
    if not all(r[0] for r in records):
        first = next(i for i, r in enumerate(records) if not r[0])
        raise KinesisError("InvalidArgumentException", f"Records[{first}]: PartitionKey is required.")
    result = await svc.client.put_records(name, records)
    out, failed = [], 0
    for r in result.records:
        if r.ok:
            out.append({"SequenceNumber": str(r.sn), "ShardId": shard_id(r.partition_ordinal)})
        else:
            failed += 1
            error = mapping.error_of(errors.from_name(r.error_name, r.error_message), caller.account)
            out.append({"ErrorCode": error.kind, "ErrorMessage": error.message})
    return {"FailedRecordCount": failed, "Records": out, "EncryptionType": "NONE"}


@operation("GetShardIterator")
async def get_shard_iterator(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = await svc._name(params, caller)
    ordinal = mapping.ordinal_of(params["ShardId"])
    kind = params["ShardIteratorType"]
    sn = params.get("StartingSequenceNumber")
    at = params.get("Timestamp")
    if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER") and not sn:
        raise KinesisError("InvalidArgumentException", f"StartingSequenceNumber is required for {kind}.")
    if kind == "AT_TIMESTAMP" and at is None:
        raise KinesisError("InvalidArgumentException", "Timestamp is required for AT_TIMESTAMP.")
    try:
        iterator = await svc.client.get_iterator(name, ordinal, kind, sequence_number=sn,
                                                 timestamp_ms=int(at * 1000) if at is not None else None)
    except errors.PartitionNotFound:
        raise KinesisError("ResourceNotFoundException",
                           f"Shard {shard_id(ordinal)} in stream {name} under account {caller.account} "
                           f"does not exist") from None
    return {"ShardIterator": iterator}


@operation("GetRecords")
async def get_records(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    limit = params.get("Limit") or limits.KINESIS_GET_RECORDS_DEFAULT
    page = await svc.client.get_next_records(params["ShardIterator"], max_records=limit)
    records = [{"SequenceNumber": str(r.sn), "ApproximateArrivalTimestamp": r.arrival_time_ms / 1000,
                "Data": r.data, "PartitionKey": r.partition_key} for r in page.records]
    out: dict[str, Any] = {"Records": records, "MillisBehindLatest": page.millis_behind_latest}
    if page.next_iterator:
        out["NextShardIterator"] = page.next_iterator
    if page.child_partitions:
        stream = svc.client._position(params["ShardIterator"]).stream
        out["ChildShards"] = await _children(svc, stream, page.child_partitions)
    return out


# --- resharding and settings -------------------------------------------------------------------------

@operation("SplitShard")
async def split_shard(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = await svc._name(params, caller)
    await svc.client.split(name, mapping.ordinal_of(params["ShardToSplit"]), at_hash=int(params["NewStartingHashKey"]))
    return {}


@operation("MergeShards")
async def merge_shards(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = await svc._name(params, caller)
    await svc.client.merge(name, mapping.ordinal_of(params["ShardToMerge"]),
                           mapping.ordinal_of(params["AdjacentShardToMerge"]))
    return {}


@operation("UpdateShardCount")
async def update_shard_count(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream(params, caller)
    current = len(_open(info))
    target = params["TargetShardCount"]
    await svc.client.scale(info.name, target)
    return {"StreamName": info.name, "StreamARN": mapping.stream_arn(caller.region, caller.account, info.name),
            "CurrentShardCount": current, "TargetShardCount": target}


def _retention_hours(info: StreamInfo) -> int:
    return max(1, (info.retention_s or info.retention_hours * 3600) // 3600)


async def _change_retention(svc: KinesisService, params: dict[str, Any], caller: Caller, longer: bool) -> None:
    """Increase- or DecreaseStreamRetentionPeriod: the one way each may go, as Kinesis."""
    info = await svc._stream(params, caller)
    hours, current = params["RetentionPeriodHours"], _retention_hours(info)
    if (hours < current) if longer else (hours > current):
        raise KinesisError("InvalidArgumentException",
                           f"Requested retention period ({hours} hours) for stream {info.name} can not be "
                           f"{'shorter' if longer else 'longer'} than existing retention period ({current} hours). "
                           f"Use {'Decrease' if longer else 'Increase'}RetentionPeriod API.")
    await svc.client.update_retention(info.name, hours=hours)


@operation("IncreaseStreamRetentionPeriod")
async def increase_retention(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    await _change_retention(svc, params, caller, longer=True)
    return {}


@operation("DecreaseStreamRetentionPeriod")
async def decrease_retention(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    await _change_retention(svc, params, caller, longer=False)
    return {}


@operation("StartStreamEncryption")
async def start_encryption(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """Encryption at rest with the cluster's master key (docs/security.md): KMS key ids are
    taken and not used; the stream's batches are sealed from now on."""
    name = await svc._name(params, caller)
    await svc.client.update_stream(name, encryption="aes-256-gcm")
    return {}


@operation("StopStreamEncryption")
async def stop_encryption(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    name = await svc._name(params, caller)
    await svc.client.update_stream(name, encryption="none")
    return {}


# --- registered consumers ----------------------------------------------------------------------------

def _consumer(info: StreamInfo, name: str, caller: Caller) -> dict[str, Any]:
    created_s = info.created_ms // 1000
    return {"ConsumerName": name, "ConsumerStatus": "ACTIVE", "ConsumerCreationTimestamp": float(created_s),
            "ConsumerARN": mapping.consumer_arn(caller.region, caller.account, info.name, name, created_s)}


async def _consumer_named(svc: KinesisService, params: dict[str, Any], caller: Caller) -> tuple[StreamInfo, str]:
    if params.get("ConsumerARN"):
        stream, name, _created = mapping.consumer_of(params["ConsumerARN"], caller.account)
        info = await svc._stream({"StreamName": stream}, caller)
    else:
        if not params.get("StreamARN") or not params.get("ConsumerName"):
            raise KinesisError("InvalidArgumentException",
                               "Either ConsumerARN, or StreamARN and ConsumerName, must be provided.")
        info = await svc._stream({"StreamARN": params["StreamARN"]}, caller)
        name = params["ConsumerName"]
    if name not in info.consumers:
        raise KinesisError("ResourceNotFoundException",
                           f"Consumer {name} under stream {info.name} under account {caller.account} not found.")
    return info, name


@operation("RegisterStreamConsumer")
async def register_consumer(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream({"StreamARN": params["StreamARN"]}, caller)
    name = params["ConsumerName"]
    if name in info.consumers:
        raise KinesisError("ResourceInUseException",
                           f"Consumer {name} under stream {info.name} under account {caller.account} already exists.")
    if len(info.consumers) >= limits.KINESIS_CONSUMERS_MAX:
        raise KinesisError("LimitExceededException", f"Stream {info.name} has {len(info.consumers)} registered "
                                                     f"consumers; at most {limits.KINESIS_CONSUMERS_MAX}")
    await svc.client.register_consumer(info.name, name)
    return {"Consumer": _consumer(info, name, caller)}


@operation("DescribeStreamConsumer")
async def describe_consumer(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info, name = await _consumer_named(svc, params, caller)
    return {"ConsumerDescription": {**_consumer(info, name, caller),
                                    "StreamARN": mapping.stream_arn(caller.region, caller.account, info.name)}}


@operation("ListStreamConsumers")
async def list_consumers(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream({"StreamARN": params["StreamARN"]}, caller)
    names = sorted(info.consumers)
    if params.get("NextToken"):
        after = _untoken(params["NextToken"], "ListStreamConsumers")
        names = [n for n in names if n > after]
    limit = params.get("MaxResults") or limits.KINESIS_LIST_CONSUMERS_MAX
    page = names[:limit]
    out: dict[str, Any] = {"Consumers": [_consumer(info, n, caller) for n in page]}
    if len(names) > len(page):
        out["NextToken"] = _token(page[-1], "ListStreamConsumers")
    return out


@operation("DeregisterStreamConsumer")
async def deregister_consumer(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info, name = await _consumer_named(svc, params, caller)
    await svc.client.deregister_consumer(info.name, name)
    return {}


# --- SubscribeToShard: records pushed as they commit ------------------------------------------------

def _before(position_sn: int, ordinal: int) -> int:
    """The greatest SN of the partition below `position_sn` (where a subscription stands
    when it has sent nothing yet): AFTER_SEQUENCE_NUMBER of it resumes there."""
    unit = 1 << seqno.COUNTER_SHIFT
    if position_sn <= ordinal:
        return ordinal
    return ordinal + ((position_sn - 1 - ordinal) // unit) * unit


async def subscribe_to_shard(svc: KinesisService, params: dict[str, Any], caller: Caller,
                             clock: Callable[[], float]) -> AsyncIterator[Any]:
    """SubscribeToShard's events: first an `asyncio.Event`, once the subscription is
    positioned and held (the endpoint answers then: an SDK's call returns before the first
    page), set when another subscription takes this one over (the endpoint then ends it);
    then each a SubscribeToShardEvent's members, for
    KINESIS_SUBSCRIPTION_S (then it ends, and the client subscribes again from its
    ContinuationSequenceNumber, as with Kinesis). The consumer must be registered."""
    token = CALL_TOKEN.set(svc.call_token(caller))
    try:
        stream, consumer, _created = mapping.consumer_of(params["ConsumerARN"], caller.account)
        info = await svc._stream({"StreamName": stream}, caller)
        if consumer not in info.consumers:
            raise KinesisError("ResourceNotFoundException",
                               f"Consumer {consumer} under stream {stream} under account {caller.account} not found.")
        ordinal = mapping.ordinal_of(params["ShardId"])
        if ordinal not in {p.ordinal for p in info.partitions}:
            raise KinesisError("ResourceNotFoundException",
                               f"Shard {shard_id(ordinal)} in stream {stream} under account {caller.account} "
                               f"does not exist")
        start = params["StartingPosition"]
        kind, sn, at = start["Type"], start.get("SequenceNumber"), start.get("Timestamp")
        if kind in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER") and not sn:
            raise KinesisError("InvalidArgumentException", f"StartingPosition {kind} needs a SequenceNumber.")
        if kind == "AT_TIMESTAMP" and at is None:
            raise KinesisError("InvalidArgumentException", "StartingPosition AT_TIMESTAMP needs a Timestamp.")
        iterator = await svc.client.get_iterator(stream, ordinal, kind, sequence_number=sn,
                                                 timestamp_ms=int(at * 1000) if at is not None else None)
        continuation = str(_before(svc.client._position(iterator).position_sn, ordinal))
        until = clock() + limits.KINESIS_SUBSCRIPTION_S
        held = (stream, consumer, ordinal)
        holder = svc.subscriptions.get(held)
        if holder is not None:
            # (as Kinesis: within KINESIS_SUBSCRIPTION_TAKEOVER_S of the last one's start a
            # second subscription is refused; after it, it takes over, and the last one ends
            # with ResourceInUseException. Held per node: docs/kinesis.md)
            if clock() - holder[0] < limits.KINESIS_SUBSCRIPTION_TAKEOVER_S:
                raise KinesisError("ResourceInUseException",
                                   f"Another active subscription exists for consumer {params['ConsumerARN']} "
                                   f"and shard {shard_id(ordinal)}.")
            holder[1].set()
        taken = asyncio.Event()
        mine = (clock(), taken)
        svc.subscriptions[held] = mine
        pages = svc.client.subscribe(stream, ordinal, iterator=iterator)
        try:
            yield taken         # positioned and held: the endpoint answers now, and ends it when this is set
            async for page in pages:
                records = [{"SequenceNumber": str(r.sn), "ApproximateArrivalTimestamp": r.arrival_time_ms / 1000,
                            "Data": r.data, "PartitionKey": r.partition_key} for r in page.records]
                if page.records:
                    continuation = str(page.records[-1].sn)
                event: dict[str, Any] = {"Records": records, "ContinuationSequenceNumber": continuation,
                                         "MillisBehindLatest": page.millis_behind_latest}
                if page.child_partitions:
                    event["ChildShards"] = await _children(svc, stream, page.child_partitions)
                yield event
                if page.child_partitions or clock() >= until:
                    return
        finally:
            if svc.subscriptions.get(held) is mine:
                del svc.subscriptions[held]
            await pages.aclose()
    except errors.SmsError as e:
        raise mapping.error_of(e, caller.account) from None
    finally:
        CALL_TOKEN.reset(token)


async def _children(svc: KinesisService, stream: str, partition_ids) -> list[dict[str, Any]]:
    info = await svc.client.get_stream_info(stream)
    by_ordinal = {p.ordinal: p for p in info.partitions}
    children = []
    for pid in partition_ids:
        child = by_ordinal.get(parse_partition_id(pid))
        if child is not None:
            children.append({"ShardId": shard_id(child.ordinal), "ParentShards": [shard_id(o) for o in child.parents],
                             "HashKeyRange": {"StartingHashKey": str(child.hash_lo),
                                              "EndingHashKey": str(child.hash_hi - 1)}})
    return children


# --- account ---------------------------------------------------------------------------------------

@operation("DescribeLimits")
async def describe_limits(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    streams = await svc.client.list_streams()
    open_shards = 0
    on_demand = 0
    for name in streams:
        try:
            info = await svc.client.get_stream_info(name, refresh=False)
        except errors.StreamNotFound:
            continue
        open_shards += len(_open(info))
        on_demand += bool(info.auto_split_records_per_s)
    return {"ShardLimit": limits.TENANT_PARTITIONS_MAX, "OpenShardCount": open_shards,
            "OnDemandStreamCount": on_demand, "OnDemandStreamCountLimit": limits.TENANT_STREAMS_MAX}

