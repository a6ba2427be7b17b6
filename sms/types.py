"""Domain types of the public API: frozen, slotted dataclasses, apart from protobuf.

Sequence numbers are ints inside the library and decimal strings at the API surface
(`Record.sequence_number`), as in Kinesis. Partitions are named `p0000`-style ids with
an integer ordinal that is also the low 32 bits of every SN they assign.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from sms import seqno
from sms.errors import InvalidArgument, PartitionNotFound

if TYPE_CHECKING:
    from sms.batch import RecordBatch
    from sms.payloads import PayloadRef

# A record's headers as a writer gives them: name -> value (str values are sent as UTF-8).
Headers: TypeAlias = Mapping[str, bytes | str]
# One record of a put, in the shapes `put_records` and the producer's `send_batch` take:
# (partition_key, data[, explicit_hash_key[, headers]]), or a dict with those names.
RecordInput: TypeAlias = (tuple[str, bytes] | tuple[str, bytes, int | str | None]
                          | tuple[str, bytes, int | str | None, Headers | None] | Mapping[str, Any])


class Persistence(str, enum.Enum):
    DISK = "disk"              # fsync per batch (group commit)
    DISK_ASYNC = "disk_async"  # written per batch, flushed by the OS
    MEMORY = "memory"          # ephemeral: lost when the node restarts


class IngestionPolicy(str, enum.Enum):
    AT_LEAST_ONCE_NO_DUP = "at_least_once_no_dup"
    AT_LEAST_ONCE_DUP_PERMITTED = "at_least_once_dup_permitted"
    BEST_EFFORT = "best_effort"


class IteratorType(str, enum.Enum):
    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_SEQUENCE_NUMBER = "AT_SEQUENCE_NUMBER"
    AFTER_SEQUENCE_NUMBER = "AFTER_SEQUENCE_NUMBER"
    AT_TIMESTAMP = "AT_TIMESTAMP"


SHARD_END = "SHARD_END"          # a checkpoint: the partition was read to its end


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where reading a partition starts: an iterator type with what it needs, or SHARD_END
    (it was read to its end: nothing is left). The one parser and printer of positions:
    consumer groups and SPS leases store one as their checkpoint (`encode`), clients take
    one as a start (`of`), and each turns it into a GetIterator call (`iterator`).

    Its text form: "TRIM_HORIZON", "LATEST", "SHARD_END", "AT_TIMESTAMP:<ms>",
    "AT_SEQUENCE_NUMBER:<sn>", or a bare SN, which reads after it (AFTER_SEQUENCE_NUMBER:
    the checkpoint of what was processed last)."""

    kind: str                           # an IteratorType's value, or SHARD_END
    sequence_number: int = 0            # AT_ / AFTER_SEQUENCE_NUMBER
    timestamp_ms: int = 0               # AT_TIMESTAMP

    KINDS = tuple(t.value for t in IteratorType) + (SHARD_END,)

    @classmethod
    def of(cls, kind: "str | IteratorType", *, sequence_number: "int | str | None" = None,
           timestamp_ms: int | None = None) -> "StartPosition":
        """A position from its parts, as a caller names them; InvalidArgument when they do
        not go together."""
        kind = kind.value if isinstance(kind, IteratorType) else str(kind).upper()
        if kind not in cls.KINDS:
            raise InvalidArgument(f"position {kind[:40]!r}; expected one of {', '.join(cls.KINDS)}")
        needs_sn = kind in (IteratorType.AT_SEQUENCE_NUMBER.value, IteratorType.AFTER_SEQUENCE_NUMBER.value)
        if needs_sn != (sequence_number not in (None, "")):
            raise InvalidArgument(f"position {kind} {'needs' if needs_sn else 'takes no'} sequence number")
        if (kind == IteratorType.AT_TIMESTAMP.value) != (timestamp_ms is not None):
            raise InvalidArgument(f"position {kind} {'needs' if kind == 'AT_TIMESTAMP' else 'takes no'} timestamp")
        if timestamp_ms is not None and (isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int)
                                         or timestamp_ms < 0):
            raise InvalidArgument(f"timestamp {timestamp_ms!r}; expected >= 0 ms since the epoch")
        sn = seqno.parse(sequence_number) if needs_sn and sequence_number is not None else 0
        return cls(kind, sn, timestamp_ms or 0)

    @classmethod
    def parse(cls, text: str, ordinal: int | None = None) -> "StartPosition":
        """A stored checkpoint or a position's text form; with `ordinal`, an SN must be one
        of that partition. InvalidArgument, naming what was expected, otherwise."""
        if not isinstance(text, str):
            raise InvalidArgument(f"position {text!r}; expected text")
        if text.isascii() and text.isdigit():
            sn = cls._sn(text, ordinal)
            return cls(IteratorType.AFTER_SEQUENCE_NUMBER.value, sn)
        kind, colon, value = text.partition(":")
        if kind == IteratorType.AT_TIMESTAMP.value and colon:
            if not (value.isascii() and value.isdigit() and len(value) <= 16):
                raise InvalidArgument(f"position {text[:60]!r}; expected AT_TIMESTAMP:<ms>")
            return cls(kind, 0, int(value))
        if kind == IteratorType.AT_SEQUENCE_NUMBER.value and colon:
            return cls(kind, cls._sn(value, ordinal))
        if not colon and kind in (IteratorType.TRIM_HORIZON.value, IteratorType.LATEST.value, SHARD_END):
            return cls(kind)
        raise InvalidArgument(f"position {text[:60]!r}; expected an SN, TRIM_HORIZON, LATEST, SHARD_END, "
                              "AT_TIMESTAMP:<ms> or AT_SEQUENCE_NUMBER:<sn>")

    @staticmethod
    def _sn(text: str, ordinal: int | None) -> int:
        if not (text.isascii() and text.isdigit()) or len(text) > seqno.SN_DIGITS_MAX:
            raise InvalidArgument(f"position {text[:60]!r}; expected a sequence number")
        sn = int(text)
        if ordinal is not None and seqno.ordinal_of(sn) != ordinal:
            raise InvalidArgument(f"position {text[:60]} is not an SN of partition {ordinal}")
        return sn

    def encode(self) -> str:
        """The text form (what `parse` reads back)."""
        if self.kind == IteratorType.AFTER_SEQUENCE_NUMBER.value:
            return str(self.sequence_number)
        if self.kind == IteratorType.AT_SEQUENCE_NUMBER.value:
            return f"{self.kind}:{self.sequence_number}"
        if self.kind == IteratorType.AT_TIMESTAMP.value:
            return f"{self.kind}:{self.timestamp_ms}"
        return self.kind

    @property
    def ended(self) -> bool:
        return self.kind == SHARD_END

    @property
    def after_sn(self) -> int | None:
        """The SN a checkpoint says was processed last (None: none named)."""
        return self.sequence_number if self.kind == IteratorType.AFTER_SEQUENCE_NUMBER.value else None

    def iterator(self) -> tuple[str, dict[str, Any]]:
        """(iterator type, keyword arguments) of the GetIterator call that starts here; not
        for SHARD_END, where there is nothing to read."""
        if self.kind == SHARD_END:
            raise InvalidArgument("SHARD_END: the partition was read to its end; nothing starts there")
        if self.kind == IteratorType.AT_TIMESTAMP.value:
            return self.kind, {"timestamp_ms": self.timestamp_ms}
        if self.sequence_number:
            return self.kind, {"sequence_number": str(self.sequence_number)}
        return self.kind, {}


class PartitionState(str, enum.Enum):
    OPEN = "OPEN"
    CLOSED = "CLOSED"


class StreamStatus(str, enum.Enum):
    CREATING = "CREATING"
    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


def partition_id(ordinal: int) -> str:
    return f"p{ordinal:04d}"


def parse_partition_id(text: str) -> int:
    """The ordinal of a partition id like `p0003` (or `3`); PartitionNotFound otherwise."""
    body = text[1:] if text[:1] in ("p", "P") else text
    if not (body.isascii() and body.isdigit() and 0 < len(body) <= 10):
        raise PartitionNotFound(f"partition {text[:64]!r}; expected an id like p0003")
    return int(body)


class Record(NamedTuple):
    """One record read back. A named tuple, not a dataclass: reads make millions of
    these, and a tuple is built about four times faster than a frozen dataclass."""

    partition_key: str
    data: bytes
    sn: int
    partition_ordinal: int
    meta: bytes = b""

    @property
    def sequence_number(self) -> str:
        return str(self.sn)

    @property
    def arrival_time_ms(self) -> int:
        return seqno.timestamp_ms_of(self.sn)

    @property
    def payload(self) -> "PayloadRef | None":
        """Where the record's payload is, when it was stored by reference (a record over
        RECORD_DATA_BYTES_MAX: docs/api.md "Payloads by reference"); None for any other.
        `Client.open_payload(record)` streams it."""
        if not self.meta or b"sms-payload" not in self.meta:
            return None
        from sms import payloads
        if payloads.HEADER not in self.headers:
            return None
        return payloads.PayloadRef.from_bytes(self.headers[payloads.HEADER])

    @property
    def headers(self) -> dict[str, bytes]:
        """The record's headers (name -> value), as its producer gave them; {} if none."""
        if not self.meta:
            return {}
        from sms import wire     # (sms.wire imports this module)
        return wire.decode_headers(self.meta)

    @property
    def partition_id(self) -> str:
        return partition_id(self.partition_ordinal)


class PutRecordResult(NamedTuple):
    """One record's outcome; `error_name` is empty when it was stored. (A named tuple:
    a put makes one per record.)"""

    sn: int = 0
    partition_ordinal: int = -1
    error_name: str = ""
    error_message: str = ""

    @property
    def ok(self) -> bool:
        return not self.error_name

    @property
    def sequence_number(self) -> str:
        return str(self.sn) if self.ok else ""

    @property
    def partition_id(self) -> str:
        return partition_id(self.partition_ordinal) if self.partition_ordinal >= 0 else ""


@dataclass(frozen=True, slots=True)
class PutRecordsResult:
    records: tuple[PutRecordResult, ...]

    @property
    def failed_record_count(self) -> int:
        return sum(1 for r in self.records if not r.ok)


@dataclass(frozen=True, slots=True)
class ChainMember:
    node_id: str
    address: str
    role: str          # head / middle / tail / head+tail


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    ordinal: int
    hash_lo: int                      # inclusive
    hash_hi: int                      # exclusive (2^128 for the last partition)
    valid_from_ms: int
    valid_to_ms: int | None
    state: PartitionState
    parents: tuple[int, ...]
    children: tuple[int, ...]
    chain_epoch: int
    chain: tuple[ChainMember, ...]
    ingestion_owner: ChainMember | None
    learners: tuple[ChainMember, ...] = ()      # copying the tail's log before joining
    history: tuple[dict[str, Any], ...] = ()              # the chain's last changes {epoch, at_ms, action, node, reason}
    ending_sn: int | None = None                # closed: its last SN (0: it held nothing)
    sealed: bool = False                        # its head takes no new records (closing or closed)

    @property
    def partition_id(self) -> str:
        return partition_id(self.ordinal)


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    status: StreamStatus
    replication_factor: int
    persistence: Persistence
    ingestion_policy: IngestionPolicy
    retention_hours: int
    map_version: int
    created_ms: int
    partitions: tuple[PartitionInfo, ...]
    dedup_window_s: int = 300
    retention_s: int = 0                        # the retention in force, in seconds
    protect_unread: bool = False                # registered consumers' unread records are kept
    auto_split_records_per_s: int = 0           # 0: off
    auto_split_period_s: int = 0
    repartition: dict[str, Any] | None = None             # the split / merge / scale under way (or last done)
    consumers: tuple[str, ...] = ()
    min_in_sync: int = 1                        # a partition takes new records only while its chain
                                                # has at least this many members
    write_records_per_s: int = 0                # per-partition limits; 0: none
    write_bytes_per_s: int = 0
    read_bytes_per_s: int = 0
    archive: str = ""                           # the archive tier's store ("": none)
    archive_after_s: int = 0                    # records older go to the archive
    local_retention_s: int = 0                  # replicas keep records so long, once archived
    compression: str = "zstd"                   # of archive fragments
    payload_prefix: str = ""                    # payloads by reference go under this in the archive store
    encryption: str = "none"                    # "aes-256-gcm": its batches are stored sealed
    tags: tuple[tuple[str, str], ...] = ()      # (key, value), by key
    shard_metrics: tuple[str, ...] = ()         # the shard-level metrics a Kinesis client enabled

    def lineage(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        """ordinal -> (parents, children) of every partition the map still holds."""
        return {p.ordinal: (p.parents, p.children) for p in self.partitions}

    def partitions_at(self, ts_ms: int) -> list[PartitionInfo]:
        """The partitions that governed SN time ts_ms (their validity range holds it)."""
        return [p for p in self.partitions
                if p.valid_from_ms <= ts_ms and (p.valid_to_ms is None or ts_ms < p.valid_to_ms)]

    def roots(self) -> list[PartitionInfo]:
        """Partitions with no parent left in the map: where a read from the start begins."""
        present = {p.ordinal for p in self.partitions}
        return [p for p in self.partitions if not any(q in present for q in p.parents)]

    def open_partition_for_hash(self, hash_key: int) -> PartitionInfo:
        for p in self.partitions:
            if p.state is PartitionState.OPEN and p.hash_lo <= hash_key < p.hash_hi:
                return p
        raise LookupError(f"no open partition of {self.name} covers hash {hash_key}")

    def partition(self, ordinal: int) -> PartitionInfo:
        for p in self.partitions:
            if p.ordinal == ordinal:
                return p
        raise LookupError(ordinal)


class Routes:
    """The open partitions of one stream map sorted by hash range: a record's partition
    by bisect instead of a walk over the map (the put paths look one up per record)."""

    __slots__ = ("info", "los", "partitions")

    def __init__(self, info: StreamInfo):
        self.info = info
        opened = sorted((p for p in info.partitions if p.state is PartitionState.OPEN), key=lambda p: p.hash_lo)
        self.los = [p.hash_lo for p in opened]
        self.partitions = opened

    def partition_for(self, hash_key: int) -> PartitionInfo:
        """The open partition covering the hash key; LookupError if none does."""
        i = bisect.bisect_right(self.los, hash_key) - 1
        if i >= 0:
            p = self.partitions[i]
            if p.hash_lo <= hash_key < p.hash_hi:
                return p
        raise LookupError(f"no open partition of {self.info.name} covers hash {hash_key}")

    def owner_address(self, hash_key: int) -> str:
        """The ingestion owner's address of that partition ("" if none, or no owner yet)."""
        try:
            p = self.partition_for(hash_key)
        except LookupError:
            return ""
        return p.ingestion_owner.address if p.ingestion_owner else ""


@dataclass(frozen=True, slots=True)
class GetRecordsResult:
    records: list[Record]
    next_iterator: str | None
    millis_behind_latest: int
    child_partitions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GetRecordBatchResult:
    batch: RecordBatch
    next_iterator: str | None
    millis_behind_latest: int
    child_partitions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    address: str                 # the client port
    roles: tuple[str, ...]
    pid: int
    started_ms: int
    cluster_address: str = ""    # the cluster port of a secure node (mutual TLS); "": the client port
    metrics_address: str = ""    # its Prometheus endpoint, HOST:PORT (node/metrics.py); "": none
    kinesis_address: str = ""    # its Kinesis Data Streams endpoint, a URL (kinesis/); "": none

    @property
    def internal_address(self) -> str:
        """Where other nodes call this one (append, replication, node status)."""
        return self.cluster_address or self.address


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A storage node's share of the cluster's chains (`list_nodes`, `sms node list`)."""
    node_id: str
    address: str
    live: bool
    draining: bool
    replicas: int
    heads: int
    learners: int


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    control_address: str
    nodes: tuple[NodeInfo, ...] = field(default_factory=tuple)


class _Fields:
    """Read a description's fields by name too (`d["partitions"]`), as the dicts that
    describe_group returned before its results were typed."""
    __slots__ = ()

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None


@dataclass(frozen=True, slots=True)
class GroupMember(_Fields):
    """A member of a consumer group (`describe_group`): its id, where it runs, and how long
    ago it last heartbeat."""
    member: str
    host: str
    pid: int
    heartbeat_age_ms: int


@dataclass(frozen=True, slots=True)
class GroupPartition(_Fields):
    """One partition of a consumer group's lease table (`describe_group`).

    checkpoint: the SN of the last record processed, "SHARD_END" (a closed partition read to
    its end) or "" (nothing checkpointed yet: the group starts at its `start`).
    records: records processed under the current lease.
    lag_records: committed records past the checkpoint (0 at the end; from the oldest record
    kept when nothing is checkpointed); None where the partition is gone (DROPPED).
    lag_ms: the age of the newest committed record past the checkpoint, by the SNs' times."""
    partition_id: str
    ordinal: int
    state: str                     # OPEN, CLOSED, or DROPPED (no longer in the stream's map)
    owner: str                     # the member holding the lease, "" when none
    checkpoint: str
    records: int
    lag_records: int | None
    lag_ms: int


@dataclass(frozen=True, slots=True)
class GroupDescription(_Fields):
    """A consumer group (`describe_group`, `sms consumer describe`): members and, per
    partition, owner, checkpoint and lag in records and in time."""
    stream: str
    group: str
    members: tuple[GroupMember, ...]
    partitions: tuple[GroupPartition, ...]

    @property
    def lag_records(self) -> int:
        """The group's lag over all its partitions, in records."""
        return sum(p.lag_records or 0 for p in self.partitions)


class QueueStatus(str, enum.Enum):
    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue on a stream (docs/queues.md): `create_queue`, `describe_queue`, `list_queues`.
    `max_receive_count` 0: dead letters off (a record goes round until acknowledged or
    trimmed). `uid`: the queue's id, which its receipt handles carry (a queue deleted and
    made again under its name takes none of the old handles)."""
    name: str
    stream: str
    status: QueueStatus
    created_ms: int
    start: str                     # LATEST, TRIM_HORIZON or AT_TIMESTAMP
    timestamp_ms: int              # AT_TIMESTAMP's
    visibility_s: int
    max_receive_count: int
    uid: int


class ChannelStatus(str, enum.Enum):
    ACTIVE = "ACTIVE"
    DELETING = "DELETING"


@dataclass(frozen=True, slots=True)
class ChannelDestination:
    """Where a channel delivers (docs/channels.md). `kind` FILES: Parquet files under `url`
    (file:///dir or s3://bucket/prefix), named by `key_template`, compressed by
    `compression` (NONE, GZIP, ZSTD). `kind` ICEBERG: the table `namespace`.`table` of the
    catalog at `catalog_uri` (sqlite:///path.db or an http(s):// REST catalog), files
    under `warehouse`; compression NONE, ZSTD or SNAPPY; `partition_by_hour`: the table is
    partitioned by the hour of arrival_time."""
    kind: str
    url: str = ""
    compression: str = "ZSTD"
    key_template: str = ""
    catalog_uri: str = ""
    warehouse: str = ""
    namespace: str = ""
    table: str = ""
    partition_by_hour: bool = False


@dataclass(frozen=True, slots=True)
class ChannelPartition:
    """A partition's delivery by a channel: `position` the SN of the last record delivered
    ("" none yet, SHARD_END: a closed partition delivered to its end), when it last
    committed, how many records it has delivered, the node working on it and its last
    error ("" when the last attempt succeeded). `lag_records`: committed records past
    `position` (`describe_channel` counts them; None where the position does not say)."""
    ordinal: int
    position: str = ""
    last_commit_ms: int = 0
    records: int = 0
    files: int = 0
    dead_letters: int = 0
    node: str = ""
    error: str = ""
    lag_ms: int = 0
    lag_records: int | None = None


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """A channel: a stream delivered into files or an Iceberg table (docs/channels.md).
    `record_format` BYTES (the data column as it is) or JSON (data parsed into the columns
    of `schema`, a tuple of (name, type); records that do not parse go to
    `dead_letter_url`). `uid`: the channel's id (its registered consumer's name)."""
    name: str
    stream: str
    status: ChannelStatus
    created_ms: int
    destination: ChannelDestination
    data_freshness_s: int
    start: str                     # TRIM_HORIZON or LATEST
    record_format: str = "BYTES"
    schema: tuple[tuple[str, str], ...] = ()
    dead_letter_url: str = ""
    uid: int = 0
    partitions: tuple[ChannelPartition, ...] = ()
