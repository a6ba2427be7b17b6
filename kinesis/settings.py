"""The Kinesis operations on a stream's settings and labels: tags, the capacity mode, the
shard-level metrics, the record size, and the account's settings (docs/kinesis.md,
"Operations"). Each keeps what it sets in the stream's config, through the same
`update_stream` a native client calls, or answers a clear error for what the cluster
cannot honour: never a silent success.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kinesis import mapping
from kinesis.operations import operation
from kinesis.protocol import KinesisError
from sms import limits
from sms.types import StreamInfo

if TYPE_CHECKING:
    from kinesis.service import Caller, KinesisService


# the metrics EnableEnhancedMonitoring names; "ALL" stands for all seven
SHARD_METRICS = ("IncomingBytes", "IncomingRecords", "OutgoingBytes", "OutgoingRecords",
                 "WriteProvisionedThroughputExceeded", "ReadProvisionedThroughputExceeded",
                 "IteratorAgeMilliseconds")
MAX_RECORD_KIB = limits.RECORD_DATA_BYTES_MAX // 1024


# --- tags ------------------------------------------------------------------------------------------

async def _tag(svc: KinesisService, info: StreamInfo, tags: dict[str, str], caller: Caller) -> None:
    if len(tags) > limits.KINESIS_TAGS_PER_CALL_MAX:
        raise KinesisError("InvalidArgumentException",
                           f"Failed to add tags to stream {info.name} under account {caller.account}: "
                           f"at most {limits.KINESIS_TAGS_PER_CALL_MAX} tags can be added in one call.")
    if len(set(dict(info.tags)) | set(tags)) > limits.STREAM_TAGS_MAX:
        raise KinesisError("LimitExceededException",
                           f"Failed to add tags to stream {info.name}: a stream has at most "
                           f"{limits.STREAM_TAGS_MAX} tags.")
    await svc.client.update_stream(info.name, tags=tags)


async def _resource(svc: KinesisService, params: dict[str, Any], caller: Caller) -> StreamInfo:
    """The stream a TagResource, UntagResource or ListTagsForResource names. Tags are kept on
    streams only: a consumer's ARN (or a queue's, a channel's) answers a clear error."""
    arn = params["ResourceARN"]
    if "/consumer/" in arn:
        raise KinesisError("InvalidArgumentException",
                           f"ResourceARN {arn[:200]}: tags are kept on streams only, not on consumers "
                           f"(docs/kinesis.md)")
    if ":queue/" in arn or ":channel/" in arn:
        raise KinesisError("InvalidArgumentException",
                           f"ResourceARN {arn[:200]}: tags are kept on streams only, not on queues or channels "
                           f"(docs/kinesis.md)")
    return await svc._stream({"StreamARN": arn, "StreamId": params.get("StreamId")}, caller)


@operation("AddTagsToStream")
async def add_tags_to_stream(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    await _tag(svc, await svc._stream(params, caller), params["Tags"], caller)
    return {}


@operation("TagResource")
async def tag_resource(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    await _tag(svc, await _resource(svc, params, caller), params["Tags"], caller)
    return {}


@operation("RemoveTagsFromStream")
async def remove_tags_from_stream(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream(params, caller)
    await svc.client.update_stream(info.name, untag=list(params["TagKeys"]))
    return {}


@operation("UntagResource")
async def untag_resource(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await _resource(svc, params, caller)
    await svc.client.update_stream(info.name, untag=list(params["TagKeys"]))
    return {}


@operation("ListTagsForStream")
async def list_tags_for_stream(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await svc._stream(params, caller)
    after = params.get("ExclusiveStartTagKey") or ""
    tags = [(k, v) for k, v in info.tags if k > after]
    limit = params.get("Limit") or limits.STREAM_TAGS_MAX
    return {"Tags": [{"Key": k, "Value": v} for k, v in tags[:limit]], "HasMoreTags": len(tags) > limit}


@operation("ListTagsForResource")
async def list_tags_for_resource(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    info = await _resource(svc, params, caller)
    return {"Tags": [{"Key": k, "Value": v} for k, v in info.tags]}


# --- the capacity mode, monitoring, record size ------------------------------------------------------

@operation("UpdateStreamMode")
async def update_stream_mode(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """ON_DEMAND is the engine's automatic splitting (a shard that takes more than
    KINESIS_ON_DEMAND_SPLIT_RECORDS_PER_S is split); PROVISIONED turns it off. The shards
    stay as they are, as with Kinesis."""
    info = await svc._stream(params, caller)
    if params.get("WarmThroughputMiBps"):
        raise KinesisError("InvalidArgumentException", "WarmThroughputMiBps needs a MinimumThroughputBillingCommitment, "
                                                       "which this cluster has not (docs/kinesis.md)")
    mode = params["StreamModeDetails"]["StreamMode"]
    rate = limits.KINESIS_ON_DEMAND_SPLIT_RECORDS_PER_S if mode == "ON_DEMAND" else 0
    await svc.client.update_stream(info.name, auto_split_records_per_s=rate)
    return {}


def _metrics(names: list[str]) -> set[str]:
    return set(SHARD_METRICS) if "ALL" in names else set(names)


async def _monitoring(svc: KinesisService, params: dict[str, Any], caller: Caller, enable: bool) -> dict[str, Any]:
    """Enable- or DisableEnhancedMonitoring: the stream keeps the shard-level metrics asked
    for, and DescribeStream shows them. Every node exports per-partition metrics to
    Prometheus whatever is set (docs/kinesis.md): there is no CloudWatch to send them to."""
    info = await svc._stream(params, caller)
    wanted = sorted(_metrics(params["ShardLevelMetrics"]))
    # (added or taken away by the control node, merged with the stored set: two calls at
    # once keep each other's change)
    after = await svc.client.update_stream(info.name, **{"shard_metrics_add" if enable else "shard_metrics_remove":
                                                         wanted})
    return {"StreamName": info.name, "StreamARN": mapping.stream_arn(caller.region, caller.account, info.name),
            "CurrentShardLevelMetrics": sorted(info.shard_metrics), "DesiredShardLevelMetrics": sorted(after.shard_metrics)}


@operation("EnableEnhancedMonitoring")
async def enable_enhanced_monitoring(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _monitoring(svc, params, caller, enable=True)


@operation("DisableEnhancedMonitoring")
async def disable_enhanced_monitoring(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    return await _monitoring(svc, params, caller, enable=False)


@operation("UpdateMaxRecordSize")
async def update_max_record_size(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """A record holds at most RECORD_DATA_BYTES_MAX (1024 KiB) on this cluster: that size is
    taken (nothing changes), a larger one is refused. (Larger payloads go by reference,
    through the native client and the archive tier: docs/operations.md.)"""
    info = await svc._stream(params, caller)
    wanted = params["MaxRecordSizeInKiB"]
    if wanted != MAX_RECORD_KIB:
        raise KinesisError("InvalidArgumentException",
                           f"MaxRecordSizeInKiB {wanted}: records of stream {info.name} hold at most {MAX_RECORD_KIB} "
                           f"KiB on this cluster; larger payloads go by reference through the native client "
                           f"(docs/kinesis.md)")
    return {}


@operation("UpdateStreamRecordDistributionStrategy")
async def update_record_distribution(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """Records go to shards by their partition key's hash: USER_PARTITION_KEY, which is
    taken; AUTO (the service spreading hot keys) is refused."""
    info = await svc._stream(params, caller)
    if params["RecordDistributionStrategy"] != "USER_PARTITION_KEY":
        raise KinesisError("InvalidArgumentException",
                           f"RecordDistributionStrategy {params['RecordDistributionStrategy']} for stream "
                           f"{info.name}: records go by their partition key's hash only (USER_PARTITION_KEY)")
    return {}


# --- the account -----------------------------------------------------------------------------------

@operation("DescribeAccountSettings")
async def describe_account_settings(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """There is no billing: no minimum throughput commitment."""
    return {"MinimumThroughputBillingCommitment": {"Status": "DISABLED"}}
