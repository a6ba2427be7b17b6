"""The Kinesis channel operations (docs/kinesis.md, "Channels"; docs/channels.md): each a call
of the native client's channels (`create_channel`, `describe_channel`, ...), as the key that
signed the request.

- A channel's ARN is `arn:aws:kinesis:<region>:<account>:channel/<name>`; its ChannelId is
  the native uid in hex.
- A channel delivers one stream (a StreamConfigurationList of one entry), as BYTES: the
  record formats BYTE_ARRAY and STRING are the data as it is; JSON needs a schema, which
  only the native API takes (`record_format="JSON"`, `schema=`).
- S3DestinationConfiguration is a FILES destination on `s3://<bucket>`;
  S3TablesDestinationConfiguration an ICEBERG table of the cluster's default catalog.
- Nothing beyond the native channel is kept: a description is derived from it alone, so
  CreateChannel, DescribeChannel and UpdateChannel answer the same for one channel
  (the role, the table bucket and the logging shown are derived; see `_description`).
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any

from kinesis import mapping
from kinesis.operations import operation
from kinesis.protocol import KinesisError
from kinesis.queues import _stream_created
from sms import errors, limits
from sms.types import ChannelDestination, ChannelInfo

if TYPE_CHECKING:
    from kinesis.service import Caller, KinesisService

_CHANNEL_ARN = re.compile(r"arn:aws[a-z-]*:kinesis:([a-z0-9-]*):(\d{12}):channel/([a-zA-Z0-9_.-]{1,128})")
_BUCKET_ARN = re.compile(r"arn:aws[-a-z0-9]*:s3:::([a-z0-9._-]{3,63})")
ROLE = "sms-channels"               # the ServiceExecutionRoleARN a description shows (none is kept)
NO_LOGGING = {"CloudWatchLogs": {"Enabled": False}}
TIME_HOUR_SOURCE = "arrival_time"   # the one column a PartitionSpec's TIME_HOUR may name


def channel_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:channel/{name}"


def _invalid(message: str) -> KinesisError:
    return KinesisError("InvalidArgumentException", message)


def _channel_named(params: dict[str, Any], caller: Caller) -> str:
    arn = params.get("ChannelARN", "")
    m = _CHANNEL_ARN.fullmatch(arn)
    if m is None:
        raise _invalid(f"ChannelARN {arn[:200]} is not a channel ARN of the form "
                       f"arn:aws:kinesis:<region>:<account>:channel/<name>")
    if m.group(2) != caller.account:
        raise KinesisError("AccessDeniedException", f"ChannelARN {arn[:200]} belongs to account {m.group(2)}, "
                                                    f"not this cluster's {caller.account}")
    return m.group(3)


# --- the request's destination, as the native channel's ------------------------------------------

def _bucket(arn: str, what: str) -> str:
    m = _BUCKET_ARN.fullmatch(arn)
    if m is None:
        raise _invalid(f"{what} {arn[:200]} is not a bucket ARN of the form arn:aws:s3:::<bucket>")
    return m.group(1)


def _dead_letter_url(given: dict[str, Any] | None) -> str:
    """DeadLetterQueueS3Configuration as the native dead_letter_url (ExpectedBucketOwner: taken,
    not checked)."""
    if not given:
        return ""
    bucket = _bucket(given["BucketARN"], "DeadLetterQueueS3Configuration.BucketARN")
    prefix = (given.get("ErrorOutputPrefix") or "").strip("/")
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def _files(s3: dict[str, Any]) -> ChannelDestination:
    storage = s3["StorageConfiguration"]             # (StorageClass, ExpectedBucketOwner: taken, not used)
    bucket = _bucket(storage["BucketARN"], "StorageConfiguration.BucketARN")
    return ChannelDestination(kind="FILES", url=f"s3://{bucket}", compression=storage["CompressionType"],
                              key_template=storage.get("OutputKeyTemplate", ""))


def _table(tables: dict[str, Any]) -> ChannelDestination:
    """An ICEBERG destination of the cluster's default catalog (TableBucketARN: taken, it
    selects no catalog)."""
    entries = tables["S3TablesConfigurationList"]
    if len(entries) != 1:
        raise _invalid(f"a channel here delivers into one table; S3TablesConfigurationList has {len(entries)} "
                       "entries (docs/kinesis.md)")
    t = entries[0]
    by_hour = False
    if t.get("PartitionSpec") is not None:
        fields = t["PartitionSpec"]["PartitionFields"]
        if len(fields) != 1 or fields[0]["Transform"] != "TIME_HOUR" or fields[0]["SourceName"] != TIME_HOUR_SOURCE:
            raise _invalid(f"a table here is partitioned by one field only: Transform TIME_HOUR of SourceName "
                           f"{TIME_HOUR_SOURCE} (the record's arrival time); "
                           f"{', '.join(f['Transform'] + ' of ' + f['SourceName'] for f in fields)} given")
        by_hour = True
    return ChannelDestination(kind="ICEBERG", namespace=t["Namespace"], table=t["TableName"],
                              compression=t["CompressionType"], partition_by_hour=by_hour)


# --- the native channel, as a description ---------------------------------------------------------

def _s3(bucket: str, account: str, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": account}
    if prefix:
        out["ErrorOutputPrefix"] = prefix
    return out


def _s3_parts(url: str) -> tuple[str, str] | None:
    """(bucket, prefix) of an s3:// url; None for any other."""
    if not url.startswith("s3://"):
        return None
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return bucket, prefix


def _dead_letters(c: ChannelInfo, account: str, fallback: str) -> dict[str, Any] | None:
    """The model's DeadLetterQueueS3Configuration (which a description must have) of the
    channel's dead-letter url; without one (a BYTES channel: no record is ever a dead letter),
    the bucket `fallback`; None when it cannot be shown (a file:// url)."""
    parts = _s3_parts(c.dead_letter_url)
    if parts is not None:
        return _s3(parts[0], account, parts[1])
    if not c.dead_letter_url and fallback:
        return _s3(fallback, account)
    return None


def table_bucket_arn(region: str, account: str, catalog_uri: str) -> str:
    """The TableBucketARN a description shows for a catalog: one name per catalog, derived
    from its uri (the one given to CreateChannel is not kept)."""
    name = hashlib.blake2b(catalog_uri.encode(), digest_size=6).hexdigest()
    return f"arn:aws:s3tables:{region}:{account}:bucket/sms-{name}"


def _destination(c: ChannelInfo, caller: Caller) -> tuple[str, dict[str, Any]] | str:
    """(the description's member, its value) of the channel's destination, or why the model
    cannot show it."""
    d = c.destination
    if d.kind == "FILES":
        parts = _s3_parts(d.url)
        dead = _dead_letters(c, caller.account, parts[0] if parts else "")
        if parts is None or dead is None:
            return (f"delivers to {d.url}, dead letters to {c.dead_letter_url or 'none'}: not an S3 bucket, "
                    "so the native describe_channel shows its destination (docs/kinesis.md)")
        bucket, prefix = parts
        storage = {"BucketARN": f"arn:aws:s3:::{bucket}", "ExpectedBucketOwner": caller.account,
                   # (a prefix of the url is the same keys as a template that begins with it)
                   "OutputKeyTemplate": f"{prefix}/{d.key_template}" if prefix else d.key_template,
                   "CompressionType": d.compression}
        return "S3DestinationConfiguration", {"DataFreshnessInSeconds": c.data_freshness_s,
                                              "DeadLetterQueueS3Configuration": dead, "StorageConfiguration": storage}
    warehouse = _s3_parts(d.warehouse)
    dead = _dead_letters(c, caller.account, warehouse[0] if warehouse else "")
    if dead is None:
        return (f"delivers to the Iceberg table {d.namespace}.{d.table}, dead letters to "
                f"{c.dead_letter_url or 'none'}: not an S3 bucket, so the native describe_channel shows its "
                "destination (docs/kinesis.md)")
    table: dict[str, Any] = {"TableBucketARN": table_bucket_arn(caller.region, caller.account, d.catalog_uri),
                             "Namespace": d.namespace, "TableName": d.table, "CompressionType": d.compression}
    if d.partition_by_hour:
        table["PartitionSpec"] = {"PartitionFields": [{"Transform": "TIME_HOUR", "SourceName": TIME_HOUR_SOURCE}]}
    return "S3TablesDestinationConfiguration", {"DataFreshnessInSeconds": c.data_freshness_s,
                                                "DeadLetterQueueS3Configuration": dead,
                                                "S3TablesConfigurationList": [table]}


def _record_format(c: ChannelInfo) -> str:
    return "BYTE_ARRAY" if c.record_format == "BYTES" else "JSON"


async def _description(svc: KinesisService, c: ChannelInfo, caller: Caller) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ChannelName": c.name, "ChannelARN": channel_arn(caller.region, caller.account, c.name),
        "ChannelId": f"{c.uid:016x}", "ChannelStatus": c.status.value,
        "ChannelCreationTimestamp": c.created_ms / 1000,
        "ServiceExecutionRoleARN": f"arn:aws:iam::{caller.account}:role/{ROLE}",
        "StreamConfigurationList": [{"StreamARN": mapping.stream_arn(caller.region, caller.account, c.stream),
                                     "StreamCreationTimestamp": await _stream_created(svc, c.stream),
                                     "RecordConfiguration": {"RecordFormatType": _record_format(c)}}],
        "LoggingConfiguration": NO_LOGGING}
    destination = _destination(c, caller)
    if isinstance(destination, str):
        out["ChannelStatusReason"] = destination
    else:
        out[destination[0]] = destination[1]
    return out


# --- the operations --------------------------------------------------------------------------------

@operation("CreateChannel")
async def create_channel(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    # every check before the one native call: a refused request changes nothing
    streams = params["StreamConfigurationList"]
    if len(streams) != 1:
        raise _invalid(f"a channel here delivers one stream; StreamConfigurationList has {len(streams)} entries "
                       "(docs/kinesis.md)")
    stream = mapping.stream_of({"StreamARN": streams[0]["StreamARN"]}, caller.account)
    record = streams[0]["RecordConfiguration"]
    if record["RecordFormatType"] in ("JSON", "GSR_JSON"):
        raise _invalid(f"RecordFormatType {record['RecordFormatType']} needs a schema, which this cluster cannot "
                       "read from AWS Glue: use BYTE_ARRAY or STRING (the data as it is), or the native API's "
                       "create_channel(..., record_format=\"JSON\", schema=[(name, type), ...]) (docs/kinesis.md)")
    if record.get("GSRSchemaARN"):
        raise _invalid("GSRSchemaARN is for RecordFormatType GSR_JSON, which is not served (docs/kinesis.md)")
    s3, tables = params.get("S3DestinationConfiguration"), params.get("S3TablesDestinationConfiguration")
    if (s3 is None) == (tables is None):
        raise _invalid("a channel needs exactly one of S3DestinationConfiguration and "
                       "S3TablesDestinationConfiguration")
    if params.get("Tags"):
        raise _invalid("channels here keep no tags (TagResource takes stream ARNs only; docs/kinesis.md)")
    given = s3 if s3 is not None else tables
    destination = _files(s3) if s3 is not None else _table(tables)
    dead_letter_url = _dead_letter_url(given.get("DeadLetterQueueS3Configuration"))
    try:
        c = await svc.client.create_channel(stream, params["ChannelName"], destination,
                                            data_freshness_s=given.get("DataFreshnessInSeconds"),
                                            record_format="BYTES", dead_letter_url=dead_letter_url)
    except errors.StreamNotFound:
        raise KinesisError("ResourceNotFoundException",
                           f"Stream {stream} under account {caller.account} not found.") from None
    return {"ChannelDescription": await _description(svc, c, caller)}


@operation("DescribeChannel")
async def describe_channel(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    c = await svc.client.describe_channel(_channel_named(params, caller))
    return {"ChannelDescription": await _description(svc, c, caller)}


@operation("UpdateChannel")
async def update_channel(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """DataFreshnessInSeconds, under the destination the channel has (LoggingConfiguration:
    taken, not kept)."""
    name = _channel_named(params, caller)
    s3, tables = params.get("S3DestinationConfiguration"), params.get("S3TablesDestinationConfiguration")
    if s3 is not None and tables is not None:
        raise _invalid("a channel has one destination: give S3DestinationConfiguration or "
                       "S3TablesDestinationConfiguration, not both")
    c = await svc.client.describe_channel(name)
    given = s3 if s3 is not None else tables
    if given is not None:
        kind, member = ("FILES", "S3DestinationConfiguration") if s3 is not None else \
            ("ICEBERG", "S3TablesDestinationConfiguration")
        if c.destination.kind != kind:
            raise _invalid(f"channel {name} delivers to "
                           f"{'an Iceberg table' if c.destination.kind == 'ICEBERG' else 'files'}: "
                           f"{member} does not apply to it")
        c = await svc.client.update_channel(name, data_freshness_s=given["DataFreshnessInSeconds"])
    return {"ChannelDescription": await _description(svc, c, caller)}


@operation("DeleteChannel")
async def delete_channel(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    await svc.client.delete_channel(_channel_named(params, caller))
    return {}


@operation("ListChannels")
async def list_channels(svc: KinesisService, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """Channels by name, of the streams StreamFilter names (StreamCreationTimestamp: not
    compared); NextToken: the last name of the page before, as ListQueues."""
    wanted = [mapping.stream_of({"StreamARN": f["StreamARN"]}, caller.account)
              for f in params.get("StreamFilter") or []]
    listed = await svc.client.list_channels(stream=wanted[0] if len(set(wanted)) == 1 else "")
    channels = sorted((c for c in listed if not wanted or c.stream in wanted), key=lambda c: c.name)
    start = 0
    if params.get("NextToken"):
        after = params["NextToken"]
        start = next((i for i, c in enumerate(channels) if c.name > after), len(channels))
    page = channels[start:start + (params.get("MaxResults") or limits.KINESIS_LIST_CONSUMERS_MAX)]
    created: dict[str, float] = {}
    for c in page:
        if c.stream not in created:
            created[c.stream] = await _stream_created(svc, c.stream)
    answer: dict[str, Any] = {"ChannelSummaries": [
        {"ChannelName": c.name, "ChannelARN": channel_arn(caller.region, caller.account, c.name),
         "ChannelId": f"{c.uid:016x}", "ChannelStatus": c.status.value,
         "ChannelCreationTimestamp": c.created_ms / 1000,
         "ChannelDestinationType": "S3_TABLES" if c.destination.kind == "ICEBERG" else "S3",
         "Streams": [{"StreamARN": mapping.stream_arn(caller.region, caller.account, c.stream),
                      "StreamCreationTimestamp": created[c.stream]}]}
        for c in page]}
    if start + len(page) < len(channels):
        answer["NextToken"] = page[-1].name
    return answer
