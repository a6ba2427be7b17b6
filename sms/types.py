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
from sms.errors import PartitionNotFound

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
