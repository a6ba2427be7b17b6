"""Named errors that a client can see, each bound to a gRPC status code.

Every class carries its gRPC status, whether a retry may succeed (`retriable`) and
whether the caller should refresh its stream map first (`refresh_map`). Servers raise
these; one decorator (`kernel.rpc.rpc_errors`) turns them into gRPC status + a machine-
readable name in the trailing metadata; the client rebuilds the same class from the
registry here (`from_name`). `invariant()` is for programmer errors: it raises even
under `python -O` and is never caught by the error mapping.
"""

from __future__ import annotations

from typing import Any

import grpc

_REGISTRY: dict[str, type["SmsError"]] = {}


class SmsError(Exception):
    """Base of every error a client can see."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    retriable: bool = False
    refresh_map: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @property
    def name(self) -> str:
        return type(self).__name__


# NOT_FOUND
class StreamNotFound(SmsError):
    code = grpc.StatusCode.NOT_FOUND


class PartitionNotFound(SmsError):
    code = grpc.StatusCode.NOT_FOUND


class NodeNotFound(SmsError):
    """No storage node of that id is registered or holds any replica."""
    code = grpc.StatusCode.NOT_FOUND


class TenantNotFound(SmsError):
    """No tenant of that name (`sms tenant create` makes one)."""
    code = grpc.StatusCode.NOT_FOUND


class KeyNotFound(SmsError):
    """No key of that id (revoked already, or never made)."""
    code = grpc.StatusCode.NOT_FOUND


class GroupNotFound(SmsError):
    code = grpc.StatusCode.NOT_FOUND


class RecordNotFound(SmsError):
    code = grpc.StatusCode.NOT_FOUND


class QueueNotFound(SmsError):
    """No queue of that name (docs/queues.md)."""
    code = grpc.StatusCode.NOT_FOUND


class ChannelNotFound(SmsError):
    """No channel of that name (docs/channels.md)."""
    code = grpc.StatusCode.NOT_FOUND


# ALREADY_EXISTS
class StreamAlreadyExists(SmsError):
    code = grpc.StatusCode.ALREADY_EXISTS


class QueueAlreadyExists(SmsError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ChannelAlreadyExists(SmsError):
    code = grpc.StatusCode.ALREADY_EXISTS


# INVALID_ARGUMENT
class InvalidArgument(SmsError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidStreamName(InvalidArgument):
    pass


class InvalidPartitionKey(InvalidArgument):
    pass


class InvalidHashKey(InvalidArgument):
    pass


class PartitionsNotAdjacent(InvalidArgument):
    """A merge of two partitions whose hash ranges do not touch."""


class InvalidSplitPoint(InvalidArgument):
    """A split hash outside the partition's range (or on its lower bound)."""


class RecordTooLarge(InvalidArgument):
    pass


class RequestTooLarge(InvalidArgument):
    pass


class InvalidRecordHeader(InvalidArgument):
    """A record header whose name, value, count or total size breaks its limits."""


class InvalidSequenceNumber(InvalidArgument):
    pass


class InvalidIteratorType(InvalidArgument):
    pass


class InvalidIterator(InvalidArgument):
    """A forged, truncated or garbled iterator token."""


class ExpiredIterator(InvalidArgument):
    pass


class StateError(InvalidArgument):
    """An SPS state spec that cannot run, or result rows the state cannot take: the
    message says which and why (sps/state.py)."""


class InvalidGraph(InvalidArgument):
    """An SPS graph file or stage spec that cannot run: the message names where and why
    (sps/graph.py)."""


class InvalidStreamConfig(InvalidArgument):
    pass


# FAILED_PRECONDITION
class FailedPrecondition(SmsError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class WrongOwner(FailedPrecondition):
    """This node does not own the partition: refresh the stream map and re-route."""

    retriable = True
    refresh_map = True


class PartitionClosed(FailedPrecondition):
    retriable = True
    refresh_map = True


class PartitionSealed(FailedPrecondition):
    """The partition's head is sealed for a split or merge: the batch was not stored.
    (Between ingestion and the head; a producer is answered PartitionClosed.)"""


class StaleEpoch(FailedPrecondition):
    retriable = True
    refresh_map = True


class HeadMoving(FailedPrecondition):
    """The chain's head role is moving to another member (rebalancing heads): the batch
    was not stored; the ingestion writer resends it to the new head."""


class LogDiverged(FailedPrecondition):
    """Between storage nodes: a replicated batch does not follow this replica's last batch
    (its prev_checksum is not the checksum of the batch this log ends with). The stream
    ends; the predecessor's next hello finds the divergence and has the log copied anew."""


class PartitionNotOpen(FailedPrecondition):
    """A split or merge of a partition that is closed (already split or merged)."""


class LeaseLost(FailedPrecondition):
    """A conditional write on a consumer group's lease failed: another member took it (or
    the group was reset). Stop processing that partition."""


class RepartitionInProgress(FailedPrecondition):
    """A split or merge of a partition that is being changed right now."""

    retriable = True


class NotEnoughNodes(FailedPrecondition):
    """A replication factor above the number of live storage nodes."""


class NodeLive(FailedPrecondition):
    """`remove_node` of a node that is running (registered): stop it first."""


class NodeNotDrained(FailedPrecondition):
    """`remove_node` of a node that still holds replicas: drain it first."""


class StreamNotActive(FailedPrecondition):
    retriable = True


class StreamInUse(FailedPrecondition):
    """The stream has queues (docs/queues.md): delete them first, as Kinesis asks."""


class ProducerClosed(FailedPrecondition):
    """send() after close() began, or a record still un-settled when the producer stopped."""


class ProducerFenced(FailedPrecondition):
    """A write of a producer epoch older than the id's current one: another instance of
    the producer opened since (ingestion/fencing.py). Never stored; not retriable: this
    instance must stop (or open a new producer, which takes a new epoch)."""


# de-duplication (ingestion/dedup.py; docs/dedup.md)
class StaleSubmission(InvalidArgument):
    """submit_ms is older than the stream's dedup window: the table may have forgotten
    the record, so it can neither be de-duplicated nor stored."""


class SubmissionInFuture(InvalidArgument):
    """submit_ms is ahead of the ingestion node's clock by more than the skew tolerance."""


class InvalidDedupKey(InvalidArgument):
    pass


class DedupKeyTooLarge(InvalidDedupKey):
    pass


class InvalidSession(InvalidArgument):
    """Producer session fields that cannot be right."""


class InvalidProducerId(InvalidSession):
    pass


class InvalidSssn(InvalidSession):
    pass


class InvalidHwm(InvalidSession):
    pass


class SessionConflict(InvalidSession):
    """The same (producer, SSSN) came back with another record: a producer bug."""



# RESOURCE_EXHAUSTED
class Throttled(SmsError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retriable = True


class TableFull(Throttled):
    """A dedup table is at one of its bounds; retry once acks (HWM) or the window prune it."""


class StorageFull(Throttled):
    """A storage node's disk (or its LMDB map) is full: the batch was not stored, and
    nothing of it was acknowledged. Retriable: writes go on once space returns."""


class RecordsTrimmed(SmsError):
    """Records after the reader's position were deleted (retention or a trim) before it
    read them: reading on would skip them silently. Read from TRIM_HORIZON, or ask to go
    on from the oldest record left (`skip_trimmed=True`)."""
    code = grpc.StatusCode.OUT_OF_RANGE


class FragmentCorrupt(SmsError):
    """A fragment of the stream's archive failed its checksum (or could not be decoded)
    after it was read from the fragment store, and no replica holds its records any
    more: they cannot be read. While a replica still holds them, the archiver rewrites
    the fragment from it and readers never see this (docs/operations.md, "The archive")."""
    code = grpc.StatusCode.DATA_LOSS


class FragmentMissing(FragmentCorrupt):
    """A fragment the archive's index names is absent from the fragment store (deleted
    outside SMS, or a store restored from an older copy)."""


class LimitExceeded(SmsError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class TooManyPartitions(LimitExceeded):
    """A repartition that would leave more open partitions than STREAM_PARTITIONS_MAX."""


class TenantLimitExceeded(LimitExceeded):
    """A change that would take a tenant past one of its caps (streams, open partitions,
    retention): `sms tenant update` raises them."""


class RescaleTooSoon(LimitExceeded):
    """More repartitions of one stream in a day than REPARTITIONS_PER_DAY_MAX."""


# DEADLINE_EXCEEDED / UNAVAILABLE / auth
class Timeout(SmsError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED
    retriable = True


class Unavailable(SmsError):
    code = grpc.StatusCode.UNAVAILABLE
    retriable = True
    refresh_map = True


class EncryptionUnavailable(Unavailable):
    """This node holds no master key that unwraps the stream's data key (its key file or
    $SMS_MASTER_KEY lacks it): it can neither seal nor open the stream's batches.
    Retriable: another node may hold it, or this one once its key file is fixed."""


class ArchiveUnavailable(Unavailable):
    """The stream's fragment store could not be reached, refused a write or is full.
    Reads of archived records are retriable; local data is kept until the archive
    takes it, so writes go on while local space allows."""
    refresh_map = False


class NotEnoughReplicas(SmsError):
    """The partition's chain has fewer members than the stream's `min_in_sync` (nodes
    failed and their replacements are still copying): the head takes no new batch, so
    nothing is acknowledged that fewer nodes hold (Kafka's min.insync.replicas). The
    batch was not stored. Retriable: writes go on once the chain has enough members
    again; the owner stays the same, so no map refresh is needed."""
    code = grpc.StatusCode.UNAVAILABLE
    retriable = True


class StorageFailed(Unavailable):
    """A storage node's disk failed a write or an fsync (an I/O error, not a full disk):
    what reached the disk is unknown, so the batch was not acknowledged, and the node
    refuses every write to its durable logs until it is restarted (docs/operations.md,
    "A failing disk"). Retriable: the chain goes on once the node restarts."""


class TlsHandshakeFailed(Unavailable):
    """The connection's TLS handshake failed: a TLS client met a plaintext port, a
    plaintext client a TLS one, or the server's certificate is not from the CA the client
    trusts (or has expired). Not retriable: the same settings fail again."""
    retriable = False
    refresh_map = False


class Unauthenticated(SmsError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SmsError):
    code = grpc.StatusCode.PERMISSION_DENIED


class InternalError(SmsError):
    code = grpc.StatusCode.INTERNAL


class CorruptBatch(InternalError):
    """A stored or received batch whose checksum or framing does not hold (sms/wire.py)."""


class InvariantViolation(AssertionError):
    """A programmer error: the process should crash, not answer."""


def invariant(condition: object, message: str) -> None:
    """Assert that survives `python -O`."""
    if not condition:
        raise InvariantViolation(message)


def from_name(name: str, message: str) -> SmsError:
    """Rebuild a server-side error on the client from its registered name."""
    cls = _REGISTRY.get(name, InternalError)
    return cls(message)


def registry() -> dict[str, type[SmsError]]:
    return dict(_REGISTRY)
