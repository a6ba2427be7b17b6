"""The synchronous client: `sms.Client(address)`, the asyncio client on a private loop.

Each method runs the matching `sms.aio.Client` coroutine on an event loop owned by a
daemon thread of this client and waits for it, so sync and async clients behave alike:
the same arguments, results and named errors (`sms.errors`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Coroutine, Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sms import aio, limits, security
from sms.queue import Handles, Queue, QueueRecord, SettleResult
from sms.limits import AUDIT_READ_EVENTS_MAX
from sms.consumer import SyncGroupConsumer
from sms.payloads import PayloadReader, PayloadRef
from sms.types import (ChannelInfo, ClusterInfo, GetRecordBatchResult, GetRecordsResult, GroupDescription, Headers,
                       IteratorType, NodeLoad, QueueInfo, PartitionInfo, PutRecordResult, PutRecordsResult, Record,
                       RecordInput, StreamInfo)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from sms.producer import SyncProducer

_T = TypeVar("_T")

class Client:
    """A synchronous client of the cluster at `address` ("host:port[,host:port...]").

    Options and errors as `sms.aio.Client`: every method raises the named errors of its
    `sms.aio.Client` counterpart (`sms.errors`), and any call may raise Unavailable,
    Timeout, TlsHandshakeFailed, Unauthenticated, PermissionDenied or Throttled. Close it
    (or use `with`) to stop its loop thread."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        """A client of the nodes at `address`; `kwargs` as `sms.aio.Client` (timeout_s,
        ca_file, cert_file, key_file, token). Raises InvalidArgument for a TLS file that
        cannot be read."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sms-client", daemon=True)
        self._thread.start()
        self._aio = self._run(self._make(address, kwargs))

    async def _make(self, address: str, kwargs: dict[str, Any]) -> aio.Client:
        return aio.Client(address, **kwargs)

    @classmethod
    def from_cluster_file(cls, path: str, **kwargs: Any) -> "Client":
        """A client of the cluster `sms up` runs: its DIR/cluster.json (or DIR) names the
        address, the CA and the admin token (see `sms.aio.Client`); `kwargs` override
        them. Raises InvalidArgument when the file cannot be read or names no address."""
        address, options = security.cluster_file_options(path)
        return cls(address, **{**options, **kwargs})

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        """A coroutine method of `sms.aio.Client` that this class does not write out: the
        same call, run to its end on the client's loop. A new RPC's client method is
        declared once, in sms/aio/; the methods written out here add only their
        docstrings and types for editors (docs/contributing.md)."""
        method = getattr(aio.Client, name, None) if not name.startswith("_") else None
        if method is None or not inspect.iscoroutinefunction(method):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        bound = getattr(self._aio, name)

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(bound(*args, **kwargs))
        return call

    def __dir__(self) -> list[str]:
        mirrored = [n for n, m in vars(aio.Client).items() if not n.startswith("_") and inspect.iscoroutinefunction(m)]
        return sorted(set(super().__dir__()) | set(mirrored))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channels and stop the loop thread. Idempotent; raises nothing."""
        if self._loop.is_running():
            self._run(self._aio.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def describe_cluster(self) -> ClusterInfo:
        """The cluster's nodes and control leader (`sms.aio.Client.describe_cluster`)."""
        return self._run(self._aio.describe_cluster())

    def create_stream(self, name: str, partitions: int = 1, replication_factor: int = 1,
                      **kwargs: Any) -> StreamInfo:
        """Create a stream and wait until it is ACTIVE; returns its map. `kwargs`:
        persistence, ingestion_policy, retention_hours, retention_s, dedup_window_s,
        min_in_sync, archive, archive_after_s, local_retention_s, compression, encryption, tags,
        auto_split_records_per_s
        (`sms.aio.Client.create_stream`).

        Raises:
            StreamAlreadyExists, InvalidStreamName, InvalidStreamConfig, NotEnoughNodes,
            TooManyPartitions, TenantLimitExceeded."""
        return self._run(self._aio.create_stream(name, partitions, replication_factor, **kwargs))

    def create_key(self, role: str, *, streams: Iterable[str] = (), name: str = "",
                   tenant: str = "") -> tuple[dict[str, Any], str]:
        """A new key of `role` ("admin", "producer" or "consumer"), limited to `streams`
        when given: (its description, its token); the token is shown this once.

        Raises:
            InvalidArgument (an unknown role), TenantNotFound, PermissionDenied."""
        return self._run(self._aio.create_key(role, streams=streams, name=name, tenant=tenant))

    def create_tenant(self, name: str) -> None:
        """Create a tenant (admins of the default tenant only).

        Raises:
            InvalidArgument, PermissionDenied."""
        return self._run(self._aio.create_tenant(name))

    def list_tenants(self) -> list[str]:
        """The names of every tenant. Raises PermissionDenied for a non-admin key."""
        return self._run(self._aio.list_tenants())

    def describe_tenants(self) -> list[dict[str, Any]]:
        """Every tenant with its limits (`sms.aio.Client.describe_tenants`). Raises
        PermissionDenied for a non-admin key."""
        return self._run(self._aio.describe_tenants())

    def update_tenant(self, name: str, **limits: int | None) -> dict[str, Any]:
        """Change a tenant's limits (None: unchanged, 0 removes one); returns the tenant.

        Raises:
            TypeError (an unknown limit), TenantNotFound, TenantLimitExceeded, InvalidArgument."""
        return self._run(self._aio.update_tenant(name, **limits))

    def delete_tenant(self, name: str) -> None:
        """Delete a tenant and its keys.

        Raises:
            TenantNotFound, FailedPrecondition (it still has streams)."""
        return self._run(self._aio.delete_tenant(name))

    def revoke_certificate(self, certificate: str, reason: str = "") -> str:
        """Revoke a certificate (its serial in hex, or a PEM file's path); returns its
        serial in hex. Raises InvalidArgument for neither a serial nor a readable
        certificate."""
        return self._run(self._aio.revoke_certificate(certificate, reason))

    def list_revoked_certificates(self) -> list[dict[str, Any]]:
        """Every revoked certificate: {serial, revoked_ms, reason}."""
        return self._run(self._aio.list_revoked_certificates())

    def list_keys(self) -> list[dict[str, Any]]:
        """Every key the caller may see (never a token)."""
        return self._run(self._aio.list_keys())

    def read_audit(self, since_ms: int = 0, limit: int = AUDIT_READ_EVENTS_MAX) -> dict[str, Any]:
        """Every node's audit events at or after `since_ms`, merged by time, the newest
        `limit`: {events, truncated, unanswered} (`sms.aio.Client.read_audit`). Raises
        InvalidArgument, PermissionDenied."""
        return self._run(self._aio.read_audit(since_ms, limit))

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key: returns once no node admits its token any more (about
        KEY_CACHE_TTL_S). Raises KeyNotFound."""
        return self._run(self._aio.revoke_key(key_id))

    def delete_stream(self, name: str) -> None:
        """Delete a stream and every record of it. Raises StreamNotFound."""
        return self._run(self._aio.delete_stream(name))

    def list_streams(self) -> list[str]:
        """The names of the streams the caller may see."""
        return self._run(self._aio.list_streams())

    def get_stream_info(self, name: str, *, refresh: bool = True) -> StreamInfo:
        """The stream's map (`refresh=False`: from this client's cache when it holds it).
        Raises StreamNotFound."""
        return self._run(self._aio.get_stream_info(name, refresh=refresh))

    def init_producer(self, stream: str, producer_id: str | bytes) -> int:
        """A new epoch for the named producer of `stream` (`sms.aio.Client.init_producer`);
        the producers call it themselves when they open.

        Raises:
            StreamNotFound, StreamNotActive, InvalidProducerId, PermissionDenied."""
        from sms.producer import producer_id_bytes
        return self._run(self._aio.init_producer(stream, producer_id_bytes(producer_id)))

    def put_record(self, stream: str, data: bytes, partition_key: str, *,
                   explicit_hash_key: int | str | None = None,
                   headers: Headers | None = None) -> PutRecordResult:
        """Store one record; returns its result (`sms.aio.Client.put_record`).

        Raises:
            InvalidPartitionKey, InvalidHashKey, RecordTooLarge, InvalidRecordHeader,
            InvalidArgument, StreamNotFound, and the record's own error after retries."""
        return self._run(self._aio.put_record(stream, data, partition_key, explicit_hash_key=explicit_hash_key,
                                              headers=headers))

    def open_payload(self, record: Record | PayloadRef, offset: int = 0, *,
                     stream: str | None = None) -> PayloadReader:
        """A record's payload stored by reference as a binary file object, read chunk by
        chunk from `offset`; `stream`: check it is that stream's (`sms.aio.Client.open_payload`).

        Raises:
            InvalidArgument; its reads raise FragmentCorrupt, FragmentMissing, ArchiveUnavailable."""
        return self._aio.open_payload(record, offset, stream=stream)

    def put_records(self, stream: str, records: Iterable[RecordInput]) -> PutRecordsResult:
        """Store 1..500 records: (partition_key, data[, explicit_hash_key[, headers]])
        tuples or dicts; one result per record, in order, a failed record naming its error.

        Raises:
            RequestTooLarge, InvalidArgument, InvalidPartitionKey, InvalidHashKey,
            RecordTooLarge, InvalidRecordHeader, StreamNotFound."""
        return self._run(self._aio.put_records(stream, records))

    def get_iterator(self, stream: str, partition_id: str | int,
                     iterator_type: str | IteratorType = "TRIM_HORIZON", *,
                     sequence_number: str | int | None = None, timestamp_ms: int | None = None) -> str:
        """An iterator at a position of one partition (`sms.aio.Client.get_iterator`).

        Raises:
            StreamNotFound, PartitionNotFound, InvalidIteratorType, InvalidSequenceNumber."""
        return self._run(self._aio.get_iterator(stream, partition_id, iterator_type,
                                                sequence_number=sequence_number, timestamp_ms=timestamp_ms))

    def get_next_records(self, iterator: str, max_records: int = 1000, wait_ms: int = 0, *,
                         skip_trimmed: bool = False) -> GetRecordsResult:
        """The next records after the iterator's position, and the next iterator
        (`sms.aio.Client.get_next_records`).

        Raises:
            InvalidIterator, ExpiredIterator, RecordsTrimmed, StreamNotFound,
            PartitionNotFound, InvalidArgument."""
        return self._run(self._aio.get_next_records(iterator, max_records, wait_ms, skip_trimmed=skip_trimmed))

    def get_next_record_batch(self, iterator: str, max_records: int = 1000, wait_ms: int = 0, *,
                              skip_trimmed: bool = False) -> GetRecordBatchResult:
        """get_next_records as one columnar `RecordBatch`. Errors as get_next_records."""
        return self._run(self._aio.get_next_record_batch(iterator, max_records, wait_ms, skip_trimmed=skip_trimmed))

    def get_record(self, stream: str, sequence_number: str | int) -> Record:
        """The record of that sequence number.

        Raises:
            InvalidSequenceNumber, StreamNotFound, PartitionNotFound, RecordNotFound,
            RecordsTrimmed."""
        return self._run(self._aio.get_record(stream, sequence_number))

    def partitions(self, stream: str) -> list[PartitionInfo]:
        """The stream's partitions, from a fresh map. Raises StreamNotFound."""
        return self._run(self._aio.partitions(stream))

    def node_settings(self, address: str) -> tuple[str, list[dict[str, Any]]]:
        """(node id, settings) of the node at `address` (`sms.aio.Client.node_settings`)."""
        return self._run(self._aio.node_settings(address))

    def node_status(self, address: str) -> dict[str, Any]:
        """Replicas held by the storage node at `address`. Raises Unavailable when that
        node does not answer."""
        return self._run(self._aio.node_status(address))

    def ingestion_status(self, address: str) -> dict[str, Any]:
        """Dedup tables and queues of the ingestion node at `address`. Raises
        Unavailable when that node does not answer."""
        return self._run(self._aio.ingestion_status(address))

    def producer(self, stream: str, producer_id: str | bytes | None = None, *,
                 linger_ms: float = limits.PRODUCER_LINGER_MS,
                 max_pending_per_partition: int = limits.PRODUCER_PENDING_PER_PARTITION_MAX,
                 max_pending_bytes: int = limits.PRODUCER_PENDING_BYTES_MAX,
                 retry_backoff_ms: float = limits.PRODUCER_RETRY_BACKOFF_MS,
                 retry_backoff_max_ms: float = limits.PRODUCER_RETRY_BACKOFF_MS_CAP,
                 delivery_timeout_s: float = limits.PRODUCER_DELIVERY_TIMEOUT_S,
                 epochs: bool = True) -> SyncProducer:
        """A de-duplicating producer for `stream`; send() returns concurrent futures.

        Args:
            stream: the stream it writes to.
            producer_id: its identity across restarts (None: a random one).
            linger_ms: how long a record of send() may wait for others to fill a request
                (PRODUCER_LINGER_MS).
            max_pending_per_partition: un-settled records per partition before send() waits.
            max_pending_bytes: un-settled bytes in all before send() waits.
            retry_backoff_ms, retry_backoff_max_ms: the first and the longest wait before a
                resend.
            delivery_timeout_s: a record not stored by then fails with Timeout.
            epochs: with a `producer_id`, open a new epoch of it, fencing off an earlier
                instance (True); False keeps the id's one session (`sms.producer.Producer`).

        Raises:
            InvalidProducerId, InvalidArgument (an option out of range)."""
        from sms.producer import SyncProducer
        return SyncProducer(self, stream, producer_id, linger_ms=linger_ms, max_pending_per_partition=max_pending_per_partition,
                        max_pending_bytes=max_pending_bytes, retry_backoff_ms=retry_backoff_ms,
                        retry_backoff_max_ms=retry_backoff_max_ms, delivery_timeout_s=delivery_timeout_s, epochs=epochs)

    # --- repartitioning, retention, consumers (see sms.aio.Client) ---------------------------
    def repartition_stream(self, name: str, op: str, **kwargs: Any) -> StreamInfo:
        """split / merge / scale a stream while it runs (`kwargs`: partitions, at_hash,
        target_partitions); returns the map once committed.

        Raises:
            StreamNotFound, PartitionNotFound, PartitionNotOpen, PartitionsNotAdjacent,
            InvalidSplitPoint, RepartitionInProgress, TooManyPartitions, RescaleTooSoon,
            InvalidArgument."""
        return self._run(self._aio.repartition_stream(name, op, **kwargs))

    def split(self, name: str, partition: int | str, at_hash: int | str | None = None) -> StreamInfo:
        """Split an open partition (at its middle by default); returns the new map.
        Raises as `repartition_stream`."""
        return self._run(self._aio.split(name, partition, at_hash))

    def merge(self, name: str, partition_a: int | str, partition_b: int | str) -> StreamInfo:
        """Merge two adjacent open partitions; returns the new map. Raises as
        `repartition_stream`."""
        return self._run(self._aio.merge(name, partition_a, partition_b))

    def scale(self, name: str, target_partitions: int) -> StreamInfo:
        """Split and merge toward `target_partitions` even ranges; returns the map.
        Raises as `repartition_stream`."""
        return self._run(self._aio.scale(name, target_partitions))

    def update_stream(self, name: str, **kwargs: Any) -> StreamInfo:
        """Change retention, protection, auto-splitting, per-partition limits, encryption
        or the archive (`sms.aio.Client.update_stream`); returns the map.

        Raises:
            StreamNotFound, InvalidStreamConfig, TenantLimitExceeded."""
        return self._run(self._aio.update_stream(name, **kwargs))

    def rewrap_data_keys(self) -> int:
        """Master key rotation, step two: every encrypted stream's data key wrapped by the
        current key of the control leader's key file (`sms.aio.Client.rewrap_data_keys`)."""
        return self._run(self._aio.rewrap_data_keys())

    def update_retention(self, name: str, *, hours: int | None = None, seconds: int | None = None) -> StreamInfo:
        """Change the retention, in hours or seconds; returns the map.

        Raises:
            StreamNotFound, InvalidStreamConfig, TenantLimitExceeded."""
        return self._run(self._aio.update_retention(name, hours=hours, seconds=seconds))

    def trim_stream(self, name: str, *, before_sn: int | str | None = None,
                    before_time_ms: int | None = None) -> None:
        """Delete records before an SN or older than a time, in the background.

        Raises:
            StreamNotFound, InvalidSequenceNumber, InvalidArgument."""
        return self._run(self._aio.trim_stream(name, before_sn=before_sn, before_time_ms=before_time_ms))

    def list_nodes(self) -> list[NodeLoad]:
        """Every storage node that is live or holds a replica, with its share of chains."""
        return self._run(self._aio.list_nodes())

    def drain_node(self, node_id: str, *, undo: bool = False) -> list[NodeLoad]:
        """Move every replica off a storage node (see `sms.aio.Client.drain_node`).

        Raises:
            NodeNotFound, NotEnoughNodes."""
        return self._run(self._aio.drain_node(node_id, undo=undo))

    def remove_node(self, node_id: str) -> list[NodeLoad]:
        """Forget a drained, stopped storage node (see `sms.aio.Client.remove_node`).

        Raises:
            NodeNotFound, NodeLive, NodeNotDrained."""
        return self._run(self._aio.remove_node(node_id))

    def consumer(self, stream: str, group: str, *, member_id: str | None = None, start: str = "TRIM_HORIZON",
                 timestamp_ms: int | None = None, auto_checkpoint: bool = True,
                 failover_s: float = limits.CONSUMER_FAILOVER_S_DEFAULT, max_records: int = 1000,
                 wait_ms: int = 1000, skip_trimmed: bool = False) -> SyncGroupConsumer:
        """A member of the consumer group `group` of `stream` (sms/consumer.py): `with` it
        and iterate for ConsumerBatch-es.

        Args:
            member_id: this member's id in the group (None: host-pid-random).
            start: where the group starts in a partition it has not read yet: TRIM_HORIZON,
                LATEST, or AT_TIMESTAMP with `timestamp_ms`.
            auto_checkpoint: checkpoint each batch once the next one is asked for (True);
                False: call `checkpoint()` yourself.
            failover_s: a member silent this long loses its leases to the others.
            max_records, wait_ms: the most records per batch, and how long a read waits for
                new ones.
            skip_trimmed: go on from the oldest record kept when retention deleted records
                before they were read (False: RecordsTrimmed).

        Raises:
            InvalidArgument (a bad option); StreamNotFound when it is opened."""
        return SyncGroupConsumer(self, self._aio.consumer(stream, group, member_id=member_id, start=start, timestamp_ms=timestamp_ms,
                             auto_checkpoint=auto_checkpoint, failover_s=failover_s, max_records=max_records,
                             wait_ms=wait_ms, skip_trimmed=skip_trimmed))

    def list_groups(self, stream: str) -> list[str]:
        """The names of the stream's consumer groups. Raises StreamNotFound."""
        return self._run(self._aio.list_groups(stream))

    def describe_group(self, stream: str, group: str) -> GroupDescription:
        """The group's members and per-partition owners, checkpoints and lag in records and
        ms (`sms.aio.Client.describe_group`).

        Raises:
            GroupNotFound, StreamNotFound."""
        return self._run(self._aio.describe_group(stream, group))

    def reset_group(self, stream: str, group: str, **kwargs: Any) -> None:
        """Move the group's checkpoints (`kwargs`: to, timestamp_ms, sequence_numbers;
        `sms.aio.Client.reset_group`).

        Raises:
            StreamNotFound, GroupNotFound, InvalidArgument, InvalidSequenceNumber."""
        return self._run(self._aio.reset_group(stream, group, **kwargs))

    def delete_group(self, stream: str, group: str) -> None:
        """Delete a consumer group. Raises GroupNotFound, StreamNotFound."""
        return self._run(self._aio.delete_group(stream, group))

    # --- queues (docs/queues.md) ---------------------------------------------------------
    def create_queue(self, stream: str, name: str, *, starting_position: str = "LATEST", timestamp_ms: int = 0,
                     visibility_timeout_s: int | None = None, max_receive_count: int | None = None) -> QueueInfo:
        """A queue on `stream`; as `sms.aio.Client.create_queue`.

        Raises:
            QueueAlreadyExists, StreamNotFound, InvalidArgument, LimitExceeded."""
        return self._run(self._aio.create_queue(stream, name, starting_position=starting_position,
                                                timestamp_ms=timestamp_ms, visibility_timeout_s=visibility_timeout_s,
                                                max_receive_count=max_receive_count))

    def describe_queue(self, name: str) -> QueueInfo:
        """Raises QueueNotFound."""
        return self._run(self._aio.describe_queue(name))

    def list_queues(self, stream: str = "") -> list[QueueInfo]:
        """The queues (on `stream` when given), by name."""
        return self._run(self._aio.list_queues(stream))

    def update_queue(self, name: str, *, visibility_timeout_s: int | None = None,
                     max_receive_count: int | None = None) -> QueueInfo:
        """New settings; what is not given stays. Raises QueueNotFound, InvalidArgument."""
        return self._run(self._aio.update_queue(name, visibility_timeout_s=visibility_timeout_s,
                                                max_receive_count=max_receive_count))

    def delete_queue(self, name: str) -> None:
        """Raises QueueNotFound."""
        return self._run(self._aio.delete_queue(name))

    # --- channels (docs/channels.md) -----------------------------------------------------
    def create_channel(self, stream: str, name: str, destination: Any, *, data_freshness_s: int | None = None,
                       starting_position: str = "TRIM_HORIZON", record_format: str = "BYTES",
                       schema: Any = (), dead_letter_url: str = "") -> ChannelInfo:
        """A channel delivering `stream` into files or an Iceberg table; as
        `sms.aio.Client.create_channel`.

        Raises:
            ChannelAlreadyExists, StreamNotFound, InvalidArgument, LimitExceeded."""
        return self._run(self._aio.create_channel(stream, name, destination, data_freshness_s=data_freshness_s,
                                                  starting_position=starting_position, record_format=record_format,
                                                  schema=schema, dead_letter_url=dead_letter_url))

    def describe_channel(self, name: str) -> ChannelInfo:
        """The channel with each partition's progress. Raises ChannelNotFound."""
        return self._run(self._aio.describe_channel(name))

    def list_channels(self, stream: str = "") -> list[ChannelInfo]:
        """The channels (of `stream` when given), by name."""
        return self._run(self._aio.list_channels(stream))

    def update_channel(self, name: str, *, data_freshness_s: int | None = None) -> ChannelInfo:
        """A new data freshness. Raises ChannelNotFound, InvalidArgument."""
        return self._run(self._aio.update_channel(name, data_freshness_s=data_freshness_s))

    def delete_channel(self, name: str) -> None:
        """Raises ChannelNotFound."""
        return self._run(self._aio.delete_channel(name))

    def queue(self, name: str) -> "SyncQueue":
        """A worker's handle on the queue `name` (sms/queue.py): receive, ack,
        change_visibility, and the dead-letter calls."""
        return SyncQueue(self, self._aio.queue(name))

    def register_consumer(self, stream: str, consumer: str) -> None:
        """Register a consumer whose unread records retention keeps (when the stream
        protects unread records). Raises StreamNotFound."""
        return self._run(self._aio.register_consumer(stream, consumer))

    def checkpoint_consumer(self, stream: str, consumer: str,
                            checkpoints: Mapping[int, int | str] | Mapping[str, int | str]) -> None:
        """Record, per partition (ordinal or id), the SN of the last record processed, or
        "SHARD_END".

        Raises:
            StreamNotFound, PartitionNotFound, InvalidSequenceNumber."""
        return self._run(self._aio.checkpoint_consumer(stream, consumer, checkpoints))

    def deregister_consumer(self, stream: str, consumer: str) -> None:
        """Forget a registered consumer. Raises StreamNotFound."""
        return self._run(self._aio.deregister_consumer(stream, consumer))

    def read_stream(self, stream: str, **kwargs: Any) -> Generator[Record, None, None]:
        """A generator over every record of the stream, lineage in order
        (sms.aio.Client.read_stream: start, timestamp_ms, sequence_number, follow,
        max_records, wait_ms, skip_trimmed). Errors are raised as it iterates:
        StreamNotFound, InvalidSequenceNumber, RecordsTrimmed, a partition's read error."""
        return self._iterate(self._aio.read_stream(stream, **kwargs))

    def subscribe(self, stream: str, partition_id: str | int, iterator_type: str | IteratorType = "LATEST",
                  **kwargs: Any) -> Generator[GetRecordsResult, None, None]:
        """A generator of pages pushed as records commit (sms.aio.Client.subscribe).
        Errors are raised as it iterates: StreamNotFound, PartitionNotFound,
        InvalidIteratorType, InvalidSequenceNumber, InvalidIterator, RecordsTrimmed."""
        return self._iterate(self._aio.subscribe(stream, partition_id, iterator_type, **kwargs))

    def _iterate(self, agen: AsyncGenerator[_T, None]) -> Generator[_T, None, None]:

        async def step() -> _T | object:
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return _END

        try:
            while (item := self._run(step())) is not _END:
                yield cast(_T, item)        # (not _END: an item of the generator)
        finally:
            self._run(agen.aclose())


_END = object()


class SyncQueue:
    """`sms.queue.Queue` for threads: each call runs on the client's loop."""

    def __init__(self, client: Client, queue: Queue) -> None:
        self._client = client
        self._queue = queue
        self.name = queue.name

    def receive(self, limit: int = limits.QUEUE_RECEIVE_RECORDS_MAX, *, wait_s: float = 0,
                visibility_timeout_s: int | None = None) -> list[QueueRecord]:
        """Up to `limit` (1-10) visible records, each now in flight; `wait_s` (0-20) long
        polls. Raises QueueNotFound, InvalidArgument."""
        return self._client._run(self._queue.receive(limit, wait_s=wait_s, visibility_timeout_s=visibility_timeout_s))

    def ack(self, handles: Handles) -> SettleResult:
        """The records are done (answered once durable); check `failed`."""
        return self._client._run(self._queue.ack(handles))

    def change_visibility(self, handles: Handles, visibility_timeout_s: int) -> SettleResult:
        return self._client._run(self._queue.change_visibility(handles, visibility_timeout_s))

    def receive_dead_letters(self, limit: int = limits.QUEUE_RECEIVE_RECORDS_MAX, *, wait_s: float = 0,
                             visibility_timeout_s: int | None = None) -> list[QueueRecord]:
        return self._client._run(self._queue.receive_dead_letters(limit, wait_s=wait_s,
                                                                  visibility_timeout_s=visibility_timeout_s))

    def ack_dead_letters(self, handles: Handles) -> SettleResult:
        return self._client._run(self._queue.ack_dead_letters(handles))

    def change_dead_letter_visibility(self, handles: Handles, visibility_timeout_s: int) -> SettleResult:
        return self._client._run(self._queue.change_dead_letter_visibility(handles, visibility_timeout_s))

    def restore_dead_letters(self, handles: Handles) -> SettleResult:
        return self._client._run(self._queue.restore_dead_letters(handles))
