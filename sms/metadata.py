"""The layout of the metadata store: paths and the records stored at them.

Every role reads these; only the control role writes stream and chain configs, only a
node writes its own registration. Values are JSON.

    /cluster/secret              HMAC key for iterator tokens (hex), made once
    /cluster/control             ephemeral: the control leader {node_id, address}
    /nodes/<node_id>             ephemeral: NodeRecord of a live process
    /streams/<name>              StreamConfig
    /streams/<name>/map          PartitionMap (its store version is the map version)
    /streams/<name>/consumers/<c> ConsumerRecord: checkpoints that protect unread records
    /streams/<name>/archive/<ordinal>        ArchiveState of a partition (archive/index.py)
    /streams/<name>/archive/<ordinal>/<frag> one archived fragment, named by its SN range
    /streams/<name>/producers/<id hex>       ProducerEpoch of a named producer (metastore/producers.py)
    /chains/<stream>:<ordinal>   ChainConfig {epoch, members head..tail, sealed}
"""

from __future__ import annotations

from collections.abc import Iterable

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from sms import limits
from sms.errors import InvalidStreamName
from sms.types import IngestionPolicy, NodeInfo, Persistence, StreamStatus

CLUSTER_SECRET = "/cluster/secret"
CLUSTER_CONTROL = "/cluster/control"
CLUSTER_BOOTSTRAPPED = "/cluster/bootstrapped"   # the first admin key was made (control/auth.py)
NODES = "/nodes"
STREAMS = "/streams"
CHAINS = "/chains"
DRAINING = "/draining"      # storage nodes being emptied (`sms node drain`), one child each
REVOKED_CERTS = "/revoked_certs"   # certificate serials (hex) no cluster port serves (control/revocation.py)
DISK_FAILED = "/disk_failed"   # storage nodes whose disk failed, each child holding the incarnation
KEYS = "/keys"              # credentials (control/auth.py): one child per key, never its secret
TENANTS = "/tenants"        # tenants besides "default" (control/auth.py), one child each
TENANT_SEP = "~"            # a tenant's stream "orders" is stored as "<tenant>~orders" ("default": "orders")
QUEUES = "/queues"          # queues on streams (control/queues.py), one child each by stored name
CHANNELS = "/channels"      # channels of streams (control/channels.py), one child each by stored name
SUSPECTS = "/suspects"      # storage nodes report peers that refused connections (control/detector.py)

_STREAM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,%d}" % limits.STREAM_NAME_CHARS_MAX)
# the stored form: a tenant's streams carry its name in front (control/auth.py qualifies
# what a caller names; a caller can never name the separator itself)
_STORED_NAME = re.compile(r"(?:[a-z0-9-]{1,%d}~)?[A-Za-z0-9_.-]{1,%d}" % (limits.TENANT_NAME_CHARS_MAX,
                                                                          limits.STREAM_NAME_CHARS_MAX))

# a stream's name is a path component in the metadata store and on disk, where these two
# name the directory itself or its parent: refused, with or without a tenant's prefix
_RELATIVE_NAMES = (".", "..")

DEFAULT_TENANT = "default"


def tenant_of(stored: str) -> str:
    """The tenant of a stream's stored name."""
    tenant, sep, _name = stored.partition(TENANT_SEP)
    return tenant if sep else DEFAULT_TENANT


def tenant_path(name: str) -> str:
    return f"{TENANTS}/{name}"


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """A tenant's entry (0: no limit). Throughput over all its partitions, shared evenly
    by the live nodes that serve it (kernel/tenants.py), and caps on what it may hold
    (control/quotas.py): streams, open partitions, and how long its records may be kept
    (retention, and what protect_unread holds)."""
    created_ms: int = 0
    write_records_per_s: int = 0
    write_bytes_per_s: int = 0
    deleting: bool = False        # being deleted: no new streams or keys
    read_bytes_per_s: int = 0
    streams_max: int = 0
    partitions_max: int = 0       # open partitions over all its streams
    retention_hours_max: int = 0

    LIMITS = ("write_records_per_s", "write_bytes_per_s", "read_bytes_per_s", "streams_max", "partitions_max",
              "retention_hours_max")

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "TenantConfig":
        d = json.loads(raw)
        return cls(created_ms=int(d.get("created_ms", 0)), deleting=bool(d.get("deleting", False)),
                   **{f: int(d.get(f, 0)) for f in cls.LIMITS})

    def limits(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.LIMITS}


def validate_stream_name(name: object, stored: bool = True) -> str:
    """A stream name as stored (`stored`: a tenant's prefix allowed), or as a caller of a
    secure cluster gives it (no prefix)."""
    pattern = _STORED_NAME if stored else _STREAM_NAME
    if not isinstance(name, str) or not pattern.fullmatch(name):
        shown = repr(name)[:80]
        raise InvalidStreamName(f"stream name {shown}; expected [A-Za-z0-9_.-]{{1,{limits.STREAM_NAME_CHARS_MAX}}}")
    if name.rpartition(TENANT_SEP)[2] in _RELATIVE_NAMES:
        raise InvalidStreamName(f"stream name {name!r} is reserved: '.' and '..' name no stream (relative path "
                                f"components)")
    return name


def node_path(node_id: str) -> str:
    return f"{NODES}/{node_id}"


def chains_note(changed: Iterable[str]) -> bytes:
    """The value every writer of chain configs sets on /chains in the same commit: the
    chain ids it created, changed or deleted. A reader that saw the version before can
    re-read just those (metastore/reads.py ChainConfigs); too many ids: null, read all."""
    ids = sorted(set(changed))
    return json.dumps({"changed": ids if len(ids) <= limits.CHAINS_NOTE_IDS_MAX else None}).encode()


def parse_chains_note(raw: bytes) -> list[str] | None:
    """The chain ids of a /chains note, or None when it names none (an older writer's
    timestamp, or too many): then every config is read."""
    try:
        note = json.loads(raw)
    except ValueError:
        return None
    ids = note.get("changed") if isinstance(note, dict) else None
    return ids if isinstance(ids, list) and all(isinstance(i, str) for i in ids) else None


def disk_failed_path(node_id: str) -> str:
    return f"{DISK_FAILED}/{node_id}"


def draining_path(node_id: str) -> str:
    return f"{DRAINING}/{node_id}"


def suspect_path(node_id: str) -> str:
    return f"{SUSPECTS}/{node_id}"


def stream_path(name: str) -> str:
    return f"{STREAMS}/{name}"


def map_path(name: str) -> str:
    return f"{STREAMS}/{name}/map"


def consumers_path(name: str) -> str:
    return f"{STREAMS}/{name}/consumers"


def consumer_path(name: str, consumer: str) -> str:
    return f"{STREAMS}/{name}/consumers/{consumer}"


def producers_path(name: str) -> str:
    return f"{STREAMS}/{name}/producers"


def producer_path(name: str, producer_id: bytes) -> str:
    """A named producer's epoch entry (metastore/producers.py): its id in hex."""
    return f"{STREAMS}/{name}/producers/{producer_id.hex()}"


def queue_path(name: str) -> str:
    """A queue's entry (control/queues.py): its stored name, a tenant's prefix in front."""
    return f"{QUEUES}/{name}"


def channel_path(name: str) -> str:
    """A channel's entry (control/channels.py): its stored name, a tenant's prefix in front;
    its partitions' progress are children of it (channel_partition_path)."""
    return f"{CHANNELS}/{name}"


def channel_partition_path(name: str, ordinal: int) -> str:
    return f"{CHANNELS}/{name}/p{ordinal:04d}"


QUEUE_STATE_PREFIX = "queue-state."    # the state log of a queue (docs/queues.md): no one else's stream name


def queue_state_stream(queue: str, uid: int) -> str:
    """The stored name of the state log of the queue of stored name `queue` and id `uid`:
    in the queue's tenant."""
    tenant, sep, _name = queue.rpartition(TENANT_SEP)
    return f"{tenant}{sep}{QUEUE_STATE_PREFIX}{uid:016x}"


def is_queue_state(stream: str) -> bool:
    return stream.rpartition(TENANT_SEP)[2].startswith(QUEUE_STATE_PREFIX)


def archive_path(name: str, ordinal: int) -> str:
    """A partition's archive state (archive/index.py); its children are its fragments."""
    return f"{STREAMS}/{name}/archive/{ordinal}"


def chain_id(stream: str, ordinal: int) -> str:
    return f"{stream}:{ordinal}"


def chain_name(cid: str) -> str:
    """A chain as people read it, in logs and `sms status`: `clicks/p0000`, the partition's
    id as everywhere else (the chain id `clicks:0` stays the metadata store's key)."""
    stream, _, ordinal = cid.rpartition(":")
    return f"{stream}/p{int(ordinal):04d}" if ordinal.isdigit() else cid


def chain_path(cid: str) -> str:
    return f"{CHAINS}/{cid}"


def parse_chain_id(cid: str) -> tuple[str, int]:
    stream, _, ordinal = cid.rpartition(":")
    return stream, int(ordinal)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    name: str
    partitions: int
    replication_factor: int
    persistence: Persistence
    ingestion_policy: IngestionPolicy
    retention_hours: int
    created_ms: int
    status: StreamStatus = StreamStatus.ACTIVE
    tenant: str = "default"
    dedup_window_ms: int = limits.DEDUP_WINDOW_MS_DEFAULT
    retention_s: int = 0                  # > 0: overrides retention_hours (update_retention(seconds=))
    protect_unread: bool = False          # keep records registered consumers have not read
    trim_before_ms: int = 0               # trim_stream(before_time): records older are deleted
    trim_before_sns: tuple[tuple[int, int], ...] = ()   # trim_stream(before_sn): per partition ordinal
    auto_split_records_per_s: int = 0     # 0: off; else the chain manager splits a partition
    auto_split_period_s: int = limits.AUTO_SPLIT_PERIOD_S_DEFAULT   # whose rate stays above it so long
    repartition: dict[str, Any] | None = None  # the change under way: {"op": split|merge|scale, "phase": ...}
                                          # (control/phases.py RepartitionState reads and writes it)
    repartitions_ms: tuple[int, ...] = () # when recent splits and merges committed (rate limit)
    min_in_sync: int = 1                  # a chain takes and commits new batches only while it has
                                          # at least this many members (1..replication_factor)
    # per-partition limits (0: none; kernel/ratelimit.py): writes over them get Throttled,
    # reads over them wait
    write_records_per_s: int = 0
    write_bytes_per_s: int = 0
    read_bytes_per_s: int = 0
    unread_hold_max_s: int = 0            # > 0: protect_unread keeps records at most so long (its
                                          # tenant's retention cap, control/quotas.py)
    # the archive tier (archive/; docs/operations.md "The archive"): committed batches older
    # than archive_after_s go to fragments in the store at `archive`; local copies are deleted
    # after local_retention_s, once archived; retention (retention_s/hours) is then the archive's
    archive: str = ""                     # "": no archive; file:///path or s3://bucket/prefix
    archive_after_s: int = 0
    local_retention_s: int = 0
    compression: str = "zstd"             # of fragments: "zstd" or "none"
    # encryption at rest (kernel/encryption.py): new batches are sealed while `encryption` is
    # "aes-256-gcm"; `data_key` is the stream's data key wrapped by a master key, kept once
    # made (batches sealed before a change back to "none" still open with it)
    encryption: str = "none"
    data_key: str = ""
    # labels for operators and their tools (Kinesis's stream tags); the shard-level metrics a
    # Kinesis client asked for (EnableEnhancedMonitoring: every node exports them anyway)
    tags: tuple[tuple[str, str], ...] = ()
    shard_metrics: tuple[str, ...] = ()

    @property
    def retention_ms(self) -> int:
        return (self.retention_s or self.retention_hours * 3600) * 1000

    @property
    def local_retention_ms(self) -> int:
        """How long replicas keep records locally: the retention, or with an archive, the
        local tier's (never less than archive_after_s: nothing leaves before it is archived)."""
        if not self.archive:
            return self.retention_ms
        return min(self.retention_ms, max(self.local_retention_s, self.archive_after_s) * 1000)

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["persistence"] = self.persistence.value
        d["ingestion_policy"] = self.ingestion_policy.value
        d["status"] = self.status.value
        d["trim_before_sns"] = {str(o): str(sn) for o, sn in self.trim_before_sns}
        d["repartitions_ms"] = list(self.repartitions_ms)
        d["tags"] = dict(self.tags)
        d["shard_metrics"] = list(self.shard_metrics)
        return json.dumps(d).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "StreamConfig":
        d = json.loads(raw)
        d["persistence"] = Persistence(d["persistence"])
        d["ingestion_policy"] = IngestionPolicy(d["ingestion_policy"])
        d["status"] = StreamStatus(d["status"])
        d["trim_before_sns"] = tuple(sorted((int(o), int(sn)) for o, sn in d.get("trim_before_sns", {}).items()))
        d["repartitions_ms"] = tuple(d.get("repartitions_ms", ()))
        d["tags"] = tuple(sorted(d.get("tags", {}).items()))
        d["shard_metrics"] = tuple(d.get("shard_metrics", ()))
        return cls(**d)

    def with_status(self, status: StreamStatus) -> "StreamConfig":
        return replace(self, status=status)


@dataclass(frozen=True, slots=True)
class ChainChange:
    """One reconfiguration of a chain, kept in its config for operators (`sms status`)."""

    epoch: int
    at_ms: int
    action: str            # "created" / "removed" / "learner" / "promoted" / "restored"
    node: str = ""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "at_ms": self.at_ms, "action": self.action, "node": self.node,
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ChainConfig:
    """One partition's replication chain: members[0] is the head, members[-1] the tail.

    The head's node also owns ingestion for the partition. `learners` are nodes copying
    the tail's log before they join as the new tail (they serve no reads and commit
    nothing). `incarnations` pins each member and learner to the process incarnation
    (its registration's started_ms) that joined: a restarted process is a new
    incarnation, so it does not act on the old one's place until the chain manager has
    verified or replaced it. `history` keeps the last few changes."""

    chain_id: str
    stream: str
    ordinal: int
    epoch: int
    members: tuple[str, ...]
    persistence: Persistence
    learners: tuple[str, ...] = ()
    incarnations: tuple[tuple[str, int], ...] = ()
    history: tuple[ChainChange, ...] = ()
    # set when the partition is being split or merged: the head takes no new batches
    # (a resend of a batch it holds is still acknowledged); it stays set once closed
    sealed: bool = False
    # a child partition's SNs start at or after this time (its parents' boundary)
    from_ms: int = 0
    # the member that becomes head once every member holds the same log: meanwhile the
    # head takes no new batches (control/chains.py rule 8)
    handoff: str = ""
    # the stream's min_in_sync: while fewer members than this remain (learners do not
    # count), the head takes no new batches (NotEnoughReplicas; a resend of a batch it
    # holds is still answered) and the tail commits nothing new
    min_in_sync: int = 1

    @property
    def head(self) -> str:
        return self.members[0]

    @property
    def tail(self) -> str:
        return self.members[-1]

    def incarnation_of(self, node_id: str) -> int | None:
        return dict(self.incarnations).get(node_id)

    def successor_of(self, node_id: str) -> str | None:
        i = self.members.index(node_id)
        return self.members[i + 1] if i + 1 < len(self.members) else None

    def predecessor_of(self, node_id: str) -> str | None:
        """The node that ships its log to node_id: the previous member, or the tail for a learner."""
        if node_id in self.learners:
            return self.tail
        i = self.members.index(node_id)
        return self.members[i - 1] if i > 0 else None

    def role_of(self, node_id: str) -> str:
        if node_id in self.learners:
            return "learner"
        if node_id not in self.members:
            raise ValueError(f"{node_id} is not a member of chain {self.chain_id}")
        if len(self.members) == 1:
            return "head+tail"
        if node_id == self.head:
            return "head"
        if node_id == self.tail:
            return "tail"
        return "middle"

    @property
    def below_min_in_sync(self) -> bool:
        """Fewer members than min_in_sync (learners do not count): the head takes no new
        batches and the tail commits nothing new."""
        return len(self.members) < self.min_in_sync

    def holds(self, node_id: str) -> bool:
        return node_id in self.members or node_id in self.learners

    def to_bytes(self) -> bytes:
        return json.dumps({"chain_id": self.chain_id, "stream": self.stream, "ordinal": self.ordinal,
                           "epoch": self.epoch, "members": list(self.members),
                           "persistence": self.persistence.value, "learners": list(self.learners),
                           "incarnations": dict(self.incarnations),
                           "history": [c.to_dict() for c in self.history],
                           "sealed": self.sealed, "from_ms": self.from_ms,
                           **({"handoff": self.handoff} if self.handoff else {}),
                           **({"min_in_sync": self.min_in_sync} if self.min_in_sync != 1 else {})}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "ChainConfig":
        d = json.loads(raw)
        return cls(chain_id=d["chain_id"], stream=d["stream"], ordinal=d["ordinal"], epoch=d["epoch"],
                   members=tuple(d["members"]), persistence=Persistence(d["persistence"]),
                   learners=tuple(d.get("learners", ())),
                   incarnations=tuple(sorted(d.get("incarnations", {}).items())),
                   history=tuple(ChainChange(**c) for c in d.get("history", ())),
                   sealed=d.get("sealed", False), from_ms=d.get("from_ms", 0), handoff=d.get("handoff", ""),
                   min_in_sync=d.get("min_in_sync", 1))


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """A registered consumer of a stream: per partition ordinal, the SN of the last record
    it has processed (SHARD_END_SN once it read a closed partition to its end). While the
    stream protects unread records, nothing after a consumer's checkpoint is trimmed."""

    name: str
    checkpoints: tuple[tuple[int, int], ...] = ()

    SHARD_END_SN = (1 << 128) - 1

    def to_bytes(self) -> bytes:
        return json.dumps({"name": self.name, "checkpoints": {str(o): str(sn) for o, sn in self.checkpoints}}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "ConsumerRecord":
        d = json.loads(raw)
        return cls(d["name"], tuple(sorted((int(o), int(sn)) for o, sn in d.get("checkpoints", {}).items())))


def node_to_bytes(node: NodeInfo) -> bytes:
    return json.dumps({"node_id": node.node_id, "address": node.address, "roles": list(node.roles),
                       "pid": node.pid, "started_ms": node.started_ms,
                       "cluster_address": node.cluster_address, "metrics_address": node.metrics_address,
                       "kinesis_address": node.kinesis_address}).encode()


def node_from_bytes(raw: bytes) -> NodeInfo:
    d = json.loads(raw)
    return NodeInfo(node_id=d["node_id"], address=d["address"], roles=tuple(d["roles"]),
                    pid=d["pid"], started_ms=d["started_ms"], cluster_address=d.get("cluster_address", ""),
                    metrics_address=d.get("metrics_address", ""), kinesis_address=d.get("kinesis_address", ""))
