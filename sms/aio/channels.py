"""The asyncio client's channels (docs/channels.md): create, describe, list, update, delete."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from sms import errors
from sms.convert import channel_from_pb, destination_to_pb
from sms.aio.queues import Queues
from sms.proto import sms_pb2
from sms.types import ChannelDestination, ChannelInfo


def parse_destination(spec: str | Mapping[str, Any] | ChannelDestination) -> ChannelDestination:
    """A destination from a url (`file:///dir`, `s3://bucket/prefix`: Parquet files;
    `iceberg://namespace.table`: a table of the cluster's catalog), a dict of
    ChannelDestination's fields, or one."""
    if isinstance(spec, ChannelDestination):
        return spec
    if isinstance(spec, str):
        if spec.startswith("iceberg://"):
            namespace, _, table = spec[len("iceberg://"):].partition(".")
            return ChannelDestination(kind="ICEBERG", namespace=namespace, table=table)
        return ChannelDestination(kind="FILES", url=spec)
    if isinstance(spec, Mapping):
        fields = dict(spec)
        if "kind" not in fields:
            fields["kind"] = "ICEBERG" if "table" in fields else "FILES"
        try:
            return ChannelDestination(**fields)
        except TypeError as e:
            raise errors.InvalidArgument(f"destination: {e}") from None
    raise errors.InvalidArgument(f"destination {spec!r}: expected a url, a dict or a ChannelDestination")


class Channels(Queues):
    """The channels part of `sms.aio.Client` (sms/aio/__init__.py), after queues."""

    async def create_channel(self, stream: str, name: str, destination: str | Mapping[str, Any] | ChannelDestination,
                             *, data_freshness_s: int | None = None, starting_position: str = "TRIM_HORIZON",
                             record_format: str = "BYTES", schema: Iterable[tuple[str, str]] | Mapping[str, str] = (),
                             dead_letter_url: str = "") -> ChannelInfo:
        """A channel delivering `stream` into `destination` (docs/channels.md): Parquet files
        under a `file:///dir` or `s3://bucket/prefix` url (a dict for compression and
        key_template), or an Iceberg table (`iceberg://namespace.table`, or a dict with
        catalog_uri, warehouse, namespace, table, compression, partition_by_hour).
        `data_freshness_s`: a record reaches the destination within about this (1-900,
        60 unless given). `record_format` JSON parses data into the columns of `schema`
        ({name: type} of string, long, double, boolean, timestamp, binary); records that do
        not parse go to `dead_letter_url`.

        Raises:
            ChannelAlreadyExists, StreamNotFound, InvalidArgument, LimitExceeded."""
        d = parse_destination(destination)
        if isinstance(schema, Mapping):
            schema = list(schema.items())
        request = sms_pb2.CreateChannelRequest(
            name=name, stream=stream, start=starting_position, record_format=record_format,
            dead_letter_url=dead_letter_url, schema=[sms_pb2.ChannelColumn(name=str(n), type=str(t)) for n, t in schema],
            destination=destination_to_pb(d))
        if data_freshness_s is not None:
            request.data_freshness_s = _seconds(data_freshness_s)
        return channel_from_pb(await self._admin_call("CreateChannel", request))

    async def describe_channel(self, name: str) -> ChannelInfo:
        """The channel with each partition's progress, and its lag in records (counted here
        from the partition's commit point). Raises ChannelNotFound."""
        info = channel_from_pb(await self._discovery_call("DescribeChannel", sms_pb2.ChannelRequest(name=name)))
        partitions = []
        for p in info.partitions:
            lag = None
            if p.position:
                try:
                    lag = await self.checkpoint_lag(info.stream, p.ordinal, p.position)
                except errors.SmsError:                # (the partition gone, its replicas away: not said)
                    lag = None
            partitions.append(dataclasses.replace(p, lag_records=None if lag is None else lag[0]))
        return dataclasses.replace(info, partitions=tuple(partitions))

    async def list_channels(self, stream: str = "") -> list[ChannelInfo]:
        """The channels (of `stream` when given), by name, with no progress (describe has it)."""
        answer = await self._discovery_call("ListChannels", sms_pb2.ListChannelsRequest(stream=stream))
        return [channel_from_pb(c) for c in answer.channels]

    async def update_channel(self, name: str, *, data_freshness_s: int | None = None) -> ChannelInfo:
        """A new data freshness (from each partition's next buffer on). Raises ChannelNotFound,
        InvalidArgument."""
        request = sms_pb2.UpdateChannelRequest(name=name)
        if data_freshness_s is not None:
            request.data_freshness_s = _seconds(data_freshness_s)
        return channel_from_pb(await self._discovery_call("UpdateChannel", request))

    async def delete_channel(self, name: str) -> None:
        """The channel and its progress; what it delivered stays. Raises ChannelNotFound."""
        await self._admin_call("DeleteChannel", sms_pb2.ChannelRequest(name=name))


def _seconds(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise errors.InvalidArgument(f"data_freshness_s {value!r}; expected an int")
    return value
