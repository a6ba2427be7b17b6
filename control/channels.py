"""Channels on the server: their definitions and progress in the metadata store
(docs/channels.md). Any node answers; each change is one write of the channel's entry.

    /channels/<channel>           ChannelInfo as JSON (its stored name: a tenant's prefix in front)
    /channels/<channel>/pNNNN     a partition's progress (ChannelPartition as JSON), written by
                                  the worker that delivers it (delivery/worker.py)

What a channel has delivered is, first of all, in its destination: each commit there records
the stream positions it covers (delivery/destinations.py). The progress here is a hint that
a worker starts from, what `describe` shows, and, once a closed partition is delivered to
its end (SHARD_END), what lets its children begin.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from string import Formatter

from metastore import BadVersionError, Create, MetaStore, NodeExistsError, NoNodeError, Set
from metastore.view import ClusterView, bounded
from sms import limits, metadata, objectstore
from sms.errors import (ChannelAlreadyExists, ChannelNotFound, InvalidArgument, LimitExceeded, PermissionDenied,
                        StreamNotFound, Unavailable)
from sms.types import ChannelDestination, ChannelInfo, ChannelPartition, ChannelStatus, StreamStatus

_CHANNEL = re.compile(r"[a-zA-Z0-9_.-]{1,%d}" % limits.CHANNEL_NAME_CHARS_MAX)
_STORED = re.compile(r"(?:[a-z0-9-]{1,%d}%s)?[a-zA-Z0-9_.-]{1,%d}" % (
    limits.TENANT_NAME_CHARS_MAX, re.escape(metadata.TENANT_SEP), limits.CHANNEL_NAME_CHARS_MAX))
_IDENT = re.compile(r"[a-z0-9_]{1,255}")                 # an Iceberg namespace or table (the Kinesis model's)
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
KINDS = ("FILES", "ICEBERG")
STARTS = ("TRIM_HORIZON", "LATEST")
FORMATS = ("BYTES", "JSON")
COMPRESSION = {"FILES": ("NONE", "GZIP", "ZSTD"), "ICEBERG": ("NONE", "ZSTD", "SNAPPY")}
COLUMN_TYPES = ("string", "long", "double", "boolean", "timestamp", "binary")
TEMPLATE_FIELDS = ("stream", "partition", "start", "year", "month", "day", "hour")
DEFAULT_TEMPLATE = "{stream}/{partition}/{year}/{month}/{day}/{hour}/{start}.parquet"
RESERVED_COLUMNS = ("partition_key", "sequence_number", "arrival_time", "partition_id", "headers")


def validate_channel_name(name: object, stored: bool = True) -> str:
    pattern = _STORED if stored else _CHANNEL
    if not isinstance(name, str) or not pattern.fullmatch(name) or name.rpartition(metadata.TENANT_SEP)[2] in (".", ".."):
        raise InvalidArgument(f"channel name {str(name)[:80]!r}; expected [a-zA-Z0-9_.-]{{1,"
                              f"{limits.CHANNEL_NAME_CHARS_MAX}}}, not '.' or '..'")
    return name


def validate_freshness(seconds: int) -> int:
    if not limits.CHANNEL_FRESHNESS_S_MIN <= seconds <= limits.CHANNEL_FRESHNESS_S_MAX:
        raise InvalidArgument(f"data freshness {seconds} s; expected {limits.CHANNEL_FRESHNESS_S_MIN}.."
                              f"{limits.CHANNEL_FRESHNESS_S_MAX}")
    return seconds


def validate_template(template: str) -> str:
    """A files destination's key template: names made of `{field}`s of TEMPLATE_FIELDS, which
    must hold {partition} and {start} (a file's name is what fences two writers of one
    partition: delivery/destinations.py), and the store's name characters."""
    if not template or len(template) > limits.CHANNEL_TEMPLATE_CHARS_MAX:
        raise InvalidArgument(f"key template must have 1..{limits.CHANNEL_TEMPLATE_CHARS_MAX} chars")
    try:
        fields = [f for _, f, spec, conv in Formatter().parse(template) if f is not None]
        specs = [(spec, conv) for _, f, spec, conv in Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise InvalidArgument(f"key template {template[:80]!r}: {e}") from None
    unknown = sorted(set(fields) - set(TEMPLATE_FIELDS))
    if unknown or any(spec or conv for spec, conv in specs):
        raise InvalidArgument(f"key template {template[:80]!r}: unknown field {unknown[0] if unknown else ''!r}; "
                              f"expected plain fields of {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}")
    if "partition" not in fields or "start" not in fields:
        raise InvalidArgument(f"key template {template[:80]!r} must hold {{partition}} and {{start}}: a file's "
                              "name is what keeps two workers of one partition from writing a record twice")
    sample = template.format(stream="s", partition="p0000", start="1", year="2026", month="01", day="01", hour="00")
    objectstore.check_name(sample)
    return template


def validate_destination(d: ChannelDestination, defaults: dict[str, str]) -> ChannelDestination:
    """`d` checked, with what it leaves out filled in (`defaults`: the answering node's
    catalog_uri and warehouse, for ICEBERG). Raises InvalidArgument."""
    if d.kind not in KINDS:
        raise InvalidArgument(f"destination kind {d.kind[:32]!r}; expected FILES or ICEBERG")
    compression = d.compression or "ZSTD"
    if compression not in COMPRESSION[d.kind]:
        raise InvalidArgument(f"compression {compression[:32]!r} for {d.kind}; expected one of "
                              f"{', '.join(COMPRESSION[d.kind])}")
    if d.kind == "FILES":
        if d.catalog_uri or d.warehouse or d.namespace or d.table or d.partition_by_hour:
            raise InvalidArgument("a FILES destination takes url, compression and key_template only")
        url = _url(d.url, "destination url")
        return ChannelDestination(kind="FILES", url=url, compression=compression,
                                  key_template=validate_template(d.key_template or DEFAULT_TEMPLATE))
    if d.url or d.key_template:
        raise InvalidArgument("an ICEBERG destination takes catalog_uri, warehouse, namespace, table, compression "
                              "and partition_by_hour")
    for what, value in (("namespace", d.namespace), ("table", d.table)):
        if not _IDENT.fullmatch(value):
            raise InvalidArgument(f"Iceberg {what} {value[:80]!r}; expected [a-z0-9_]{{1,255}}")
    catalog = d.catalog_uri or defaults.get("catalog_uri", "")
    if not (catalog.startswith("sqlite:////") or catalog.startswith(("http://", "https://"))) or len(catalog) > 1024:
        raise InvalidArgument(f"catalog uri {catalog[:80]!r}; expected sqlite:////absolute/path.db or an "
                              "http(s):// REST catalog")
    warehouse = d.warehouse or defaults.get("warehouse", "")
    if warehouse or not catalog.startswith("http"):
        warehouse = _url(warehouse, "warehouse")
    return ChannelDestination(kind="ICEBERG", compression=compression, catalog_uri=catalog, warehouse=warehouse,
                              namespace=d.namespace, table=d.table, partition_by_hour=d.partition_by_hour)


def _url(url: str, what: str) -> str:
    try:
        return objectstore.check_url(url)
    except InvalidArgument as e:
        raise InvalidArgument(f"{what}: {e.message.replace('archive url', 'url')}") from None


def validate_schema(record_format: str, schema: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    if record_format not in FORMATS:
        raise InvalidArgument(f"record format {record_format[:32]!r}; expected BYTES or JSON")
    if record_format == "BYTES":
        if schema:
            raise InvalidArgument("a schema is for record format JSON")
        return ()
    if len(schema) > limits.CHANNEL_SCHEMA_COLUMNS_MAX:
        raise InvalidArgument(f"a JSON schema has at most {limits.CHANNEL_SCHEMA_COLUMNS_MAX} (name, type) columns "
                              "(none: inferred from the records)")
    seen = set()
    for name, type_ in schema:
        if not _COLUMN.fullmatch(name) or name in RESERVED_COLUMNS or name in seen:
            raise InvalidArgument(f"schema column {name[:80]!r}: expected a new [A-Za-z_][A-Za-z0-9_]* name, "
                                  f"none of {', '.join(RESERVED_COLUMNS)}")
        if type_ not in COLUMN_TYPES:
            raise InvalidArgument(f"schema column {name!r}: type {type_[:32]!r}; expected one of "
                                  f"{', '.join(COLUMN_TYPES)}")
        seen.add(name)
    return tuple(schema)


def check_tenant_locations(locations: list[str], allowed: str) -> None:
    """A tenant's channel writes where the operator lets tenants write: the nodes write a
    channel's files with their own file system and credentials (and reach its catalog), so a
    key of a tenant (not the cluster's admin) names only locations under one of `allowed`
    (the setting channels.tenant_url_prefixes, comma-separated), or none: the cluster's
    default catalog and warehouse. Raises PermissionDenied."""
    prefixes = [p.strip() for p in allowed.split(",") if p.strip()]
    for location in filter(None, locations):
        if not any(location == p.rstrip("/") or location.startswith(p.rstrip("/") + "/") for p in prefixes):
            raise PermissionDenied(
                f"{location[:120]!r}: a tenant's channel writes only under the locations the operator allows "
                f"(channels.tenant_url_prefixes: {', '.join(prefixes) or 'none'}); give no url, catalog or warehouse "
                "to use the cluster's own catalog (docs/channels.md)")


def check_tenant_namespace(tenant: str, namespace: str) -> None:
    """In the cluster's catalog, a tenant's tables are in namespaces of its own: named
    `<tenant>_...` (its name with '_' for '-'). Raises PermissionDenied."""
    own = tenant.replace("-", "_") + "_"
    if not namespace.startswith(own) or namespace == own:
        raise PermissionDenied(f"Iceberg namespace {namespace[:80]!r}: a tenant's tables in the cluster's catalog are "
                               f"in namespaces named {own}... (docs/channels.md)")


def consumer_name(channel: ChannelInfo) -> str:
    """The registered consumer a channel is on its stream: what it has not delivered is kept
    while the stream protects unread records."""
    return f"channel.{channel.uid:016x}"


def to_bytes(c: ChannelInfo) -> bytes:
    d = dataclasses.asdict(c)
    d["status"] = c.status.value
    d["uid"] = str(c.uid)
    d.pop("partitions")
    return json.dumps(d).encode()


def from_bytes(raw: bytes) -> ChannelInfo:
    d = json.loads(raw)
    return ChannelInfo(name=d["name"], stream=d["stream"], status=ChannelStatus(d["status"]),
                       created_ms=d["created_ms"], destination=ChannelDestination(**d["destination"]),
                       data_freshness_s=d["data_freshness_s"], start=d["start"], record_format=d["record_format"],
                       schema=tuple(tuple(c) for c in d["schema"]), dead_letter_url=d["dead_letter_url"],
                       uid=int(d["uid"]))


def progress_to_bytes(p: ChannelPartition) -> bytes:
    return json.dumps(dataclasses.asdict(p)).encode()


def progress_from_bytes(raw: bytes) -> ChannelPartition:
    d = json.loads(raw)
    return ChannelPartition(**{f.name: d[f.name] for f in dataclasses.fields(ChannelPartition) if f.name in d})


class Channels:
    def __init__(self, store: MetaStore, view: ClusterView, defaults: dict[str, str] | None = None):
        self.store = store
        self.view = view
        self.defaults = defaults or {}

    async def create(self, name: str, stream: str, destination: ChannelDestination, *, start: str = "",
                     data_freshness_s: int | None = None, record_format: str = "", schema=(),
                     dead_letter_url: str = "", register=None) -> ChannelInfo:
        """A new channel of `stream` (both stored names). `register(channel)` makes it a
        registered consumer of its stream before its entry is written (ControlService).
        Raises ChannelAlreadyExists, StreamNotFound, InvalidArgument, LimitExceeded."""
        validate_channel_name(name)
        metadata.validate_stream_name(stream)
        if metadata.tenant_of(name) != metadata.tenant_of(stream):
            raise InvalidArgument("a channel reads a stream of its own tenant")
        start = start or "TRIM_HORIZON"
        if start not in STARTS:
            raise InvalidArgument(f"starting position {start[:32]!r}; expected TRIM_HORIZON or LATEST")
        freshness = validate_freshness(limits.CHANNEL_FRESHNESS_S_DEFAULT if data_freshness_s is None
                                       else data_freshness_s)
        record_format = record_format or "BYTES"
        schema = validate_schema(record_format, tuple(tuple(c) for c in schema))
        destination = validate_destination(destination, self.defaults)
        if dead_letter_url:
            dead_letter_url = _url(dead_letter_url, "dead-letter url")
        elif record_format == "JSON":
            raise InvalidArgument("record format JSON needs a dead-letter url for records that do not parse")
        view = await bounded(self.view.stream(stream, max_age_s=0), f"the config of stream {stream[:64]!r}")
        if view.config.status is StreamStatus.DELETING or metadata.is_queue_state(stream):
            raise StreamNotFound(f"stream {stream!r} is being deleted" if view.config.status is StreamStatus.DELETING
                                 else f"stream {stream!r} is a queue's state log")
        existing = await self._all()
        if sum(1 for c in existing if c.stream == stream) >= limits.CHANNELS_PER_STREAM_MAX:
            raise LimitExceeded(f"stream {stream!r} has {limits.CHANNELS_PER_STREAM_MAX} channels; delete one first")
        if len(existing) >= limits.CHANNELS_MAX:
            raise LimitExceeded(f"the cluster has {limits.CHANNELS_MAX} channels; delete one first")
        if destination.kind == "ICEBERG":
            for c in existing:
                d = c.destination
                if (d.kind, d.catalog_uri, d.namespace, d.table) == ("ICEBERG", destination.catalog_uri,
                                                                     destination.namespace, destination.table):
                    raise InvalidArgument(f"channel {c.name!r} delivers into {d.namespace}.{d.table} of that catalog")
        created = int(time.time() * 1000)
        channel = ChannelInfo(name=name, stream=stream, status=ChannelStatus.ACTIVE, created_ms=created,
                              destination=destination, data_freshness_s=freshness, start=start,
                              record_format=record_format, schema=schema, dead_letter_url=dead_letter_url,
                              uid=secrets.randbits(63) + 1)
        if await self.store.get(metadata.channel_path(name)) is not None:
            raise ChannelAlreadyExists(f"channel {name!r} exists")
        try:
            await self.store.commit([Create(metadata.CHANNELS)])
        except NodeExistsError:
            pass
        if register is not None:
            await register(channel)
        try:
            await self.store.commit([Create(metadata.channel_path(name), to_bytes(channel))])
        except NodeExistsError:
            raise ChannelAlreadyExists(f"channel {name!r} exists") from None
        return channel

    async def describe(self, name: str) -> ChannelInfo:
        """The channel with its partitions' progress."""
        validate_channel_name(name)
        entry = await self.store.get(metadata.channel_path(name))
        if entry is None:
            raise ChannelNotFound(f"channel {name!r} does not exist")
        channel = from_bytes(entry.value)
        return dataclasses.replace(channel, partitions=tuple(await self.progress(name)))

    async def progress(self, name: str) -> list[ChannelPartition]:
        try:
            children = await self.store.children(metadata.channel_path(name))
        except NoNodeError:
            return []
        out = []
        for child in sorted(children):
            entry = await self.store.get(f"{metadata.channel_path(name)}/{child}")
            if entry is not None:
                out.append(progress_from_bytes(entry.value))
        return out

    async def list(self, tenant: str, stream: str = "") -> list[ChannelInfo]:
        return sorted((c for c in await self._all() if metadata.tenant_of(c.name) == tenant
                       and (not stream or c.stream == stream)), key=lambda c: c.name)

    async def update(self, name: str, data_freshness_s: int | None = None) -> ChannelInfo:
        validate_channel_name(name)
        if data_freshness_s is not None:
            validate_freshness(data_freshness_s)
        path = metadata.channel_path(name)
        for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
            entry = await self.store.get(path)
            if entry is None:
                raise ChannelNotFound(f"channel {name!r} does not exist")
            channel = from_bytes(entry.value)
            changed = dataclasses.replace(channel, data_freshness_s=channel.data_freshness_s
                                          if data_freshness_s is None else data_freshness_s)
            if changed == channel:
                return channel
            try:
                await self.store.commit([Set(path, to_bytes(changed), entry.version)])
                return changed
            except BadVersionError:
                continue
            except NoNodeError:
                raise ChannelNotFound(f"channel {name!r} does not exist") from None
        raise Unavailable(f"channel {name!r} kept changing under this update; try again")

    async def delete(self, name: str, deregister=None) -> None:
        """The channel's entry and progress, then (`deregister(channel)`) its registered
        consumer. What it delivered stays in the destination."""
        channel = await self.describe(name)
        try:
            await self.store.delete(metadata.channel_path(name), recursive=True)
        except NoNodeError:
            raise ChannelNotFound(f"channel {name!r} does not exist") from None
        if deregister is not None:
            await deregister(channel)

    async def on_stream(self, stream: str) -> list[ChannelInfo]:
        return [c for c in await self._all() if c.stream == stream]

    async def _all(self) -> list[ChannelInfo]:
        try:
            children = await self.store.children(metadata.CHANNELS)
        except NoNodeError:
            return []
        out = []
        for child in children:
            entry = await self.store.get(metadata.channel_path(child))
            if entry is not None:
                out.append(from_bytes(entry.value))
        return out
