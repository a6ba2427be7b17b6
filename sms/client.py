"""The synchronous client: `sms.Client(address)`, the asyncio client on a private loop.

Each method runs the matching `sms.aio.Client` coroutine on an event loop owned by a
daemon thread of this client and waits for it, so sync and async clients behave alike.
"""

from __future__ import annotations

import asyncio
import threading

from sms import aio, security
from sms.consumer import SyncGroupConsumer


class Client:
    def __init__(self, address: str, **kwargs):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sms-client", daemon=True)
        self._thread.start()
        self._aio = self._run(self._make(address, kwargs))

    async def _make(self, address, kwargs) -> aio.Client:
        return aio.Client(address, **kwargs)

    @classmethod
    def from_cluster_file(cls, path: str, **kwargs) -> "Client":
        """A client of the cluster `sms up` runs: its DIR/cluster.json (or DIR) names the
        address, the CA and the admin token (see `sms.aio.Client`)."""
        address, options = security.cluster_file_options(path)
        return cls(address, **{**options, **kwargs})

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._aio.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def describe_cluster(self):
        return self._run(self._aio.describe_cluster())

    def create_stream(self, name, partitions=1, replication_factor=1, **kwargs):
        return self._run(self._aio.create_stream(name, partitions, replication_factor, **kwargs))

    def create_key(self, role, *, streams=(), name="", tenant=""):
        return self._run(self._aio.create_key(role, streams=streams, name=name, tenant=tenant))

    def create_tenant(self, name):
        return self._run(self._aio.create_tenant(name))

    def list_tenants(self):
        return self._run(self._aio.list_tenants())

    def describe_tenants(self):
        return self._run(self._aio.describe_tenants())

    def update_tenant(self, name, **limits):
        return self._run(self._aio.update_tenant(name, **limits))

    def delete_tenant(self, name):
        return self._run(self._aio.delete_tenant(name))

    def revoke_certificate(self, certificate, reason=""):
        return self._run(self._aio.revoke_certificate(certificate, reason))

    def list_revoked_certificates(self):
        return self._run(self._aio.list_revoked_certificates())

    def list_keys(self):
        return self._run(self._aio.list_keys())

    def revoke_key(self, key_id):
        return self._run(self._aio.revoke_key(key_id))

    def delete_stream(self, name):
        return self._run(self._aio.delete_stream(name))

    def list_streams(self):
        return self._run(self._aio.list_streams())

    def get_stream_info(self, name, *, refresh=True):
        return self._run(self._aio.get_stream_info(name, refresh=refresh))

    def put_record(self, stream, data, partition_key, *, explicit_hash_key=None, headers=None):
        return self._run(self._aio.put_record(stream, data, partition_key, explicit_hash_key=explicit_hash_key,
                                              headers=headers))

    def put_records(self, stream, records):
        return self._run(self._aio.put_records(stream, records))

    def get_iterator(self, stream, partition_id, iterator_type="TRIM_HORIZON", *, sequence_number=None,
                     timestamp_ms=None):
        return self._run(self._aio.get_iterator(stream, partition_id, iterator_type,
                                                sequence_number=sequence_number, timestamp_ms=timestamp_ms))

    def get_next_records(self, iterator, max_records=1000, wait_ms=0, *, skip_trimmed=False):
        return self._run(self._aio.get_next_records(iterator, max_records, wait_ms, skip_trimmed=skip_trimmed))

    def get_next_record_batch(self, iterator, max_records=1000, wait_ms=0, *, skip_trimmed=False):
        return self._run(self._aio.get_next_record_batch(iterator, max_records, wait_ms, skip_trimmed=skip_trimmed))

    def get_record(self, stream, sequence_number):
        return self._run(self._aio.get_record(stream, sequence_number))

    def partitions(self, stream):
        return self._run(self._aio.partitions(stream))

    def node_status(self, address):
        return self._run(self._aio.node_status(address))

    def ingestion_status(self, address):
        return self._run(self._aio.ingestion_status(address))

    def producer(self, stream, producer_id=None, **options):
        """A de-duplicating producer for `stream`; send() returns concurrent futures."""
        from sms.producer import SyncProducer
        return SyncProducer(self, stream, producer_id, **options)

    # --- repartitioning, retention, consumers (see sms.aio.Client) ---------------------------
    def repartition_stream(self, name, op, **kwargs):
        return self._run(self._aio.repartition_stream(name, op, **kwargs))

    def split(self, name, partition, at_hash=None):
        return self._run(self._aio.split(name, partition, at_hash))

    def merge(self, name, partition_a, partition_b):
        return self._run(self._aio.merge(name, partition_a, partition_b))

    def scale(self, name, target_partitions):
        return self._run(self._aio.scale(name, target_partitions))

    def update_stream(self, name, **kwargs):
        return self._run(self._aio.update_stream(name, **kwargs))

    def update_retention(self, name, *, hours=None, seconds=None):
        return self._run(self._aio.update_retention(name, hours=hours, seconds=seconds))

    def trim_stream(self, name, *, before_sn=None, before_time_ms=None):
        return self._run(self._aio.trim_stream(name, before_sn=before_sn, before_time_ms=before_time_ms))

    def list_nodes(self):
        """Every storage node that is live or holds a replica, with its share of chains."""
        return self._run(self._aio.list_nodes())

    def drain_node(self, node_id, *, undo=False):
        """Move every replica off a storage node (see `sms.aio.Client.drain_node`)."""
        return self._run(self._aio.drain_node(node_id, undo=undo))

    def consumer(self, stream, group, **options):
        """A member of the consumer group `group` of `stream` (sms/consumer.py): `with` it
        and iterate for ConsumerBatch-es; options as sms.aio.Client.consumer."""
        return SyncGroupConsumer(self, self._aio.consumer(stream, group, **options))

    def list_groups(self, stream):
        return self._run(self._aio.list_groups(stream))

    def describe_group(self, stream, group):
        return self._run(self._aio.describe_group(stream, group))

    def reset_group(self, stream, group, **kwargs):
        return self._run(self._aio.reset_group(stream, group, **kwargs))

    def delete_group(self, stream, group):
        return self._run(self._aio.delete_group(stream, group))

    def register_consumer(self, stream, consumer):
        return self._run(self._aio.register_consumer(stream, consumer))

    def checkpoint_consumer(self, stream, consumer, checkpoints):
        return self._run(self._aio.checkpoint_consumer(stream, consumer, checkpoints))

    def deregister_consumer(self, stream, consumer):
        return self._run(self._aio.deregister_consumer(stream, consumer))

    def read_stream(self, stream, **kwargs):
        """A generator over every record of the stream, lineage in order (sms.aio.Client.read_stream)."""
        return self._iterate(self._aio.read_stream(stream, **kwargs))

    def subscribe(self, stream, partition_id, iterator_type="LATEST", **kwargs):
        """A generator of pages pushed as records commit (sms.aio.Client.subscribe)."""
        return self._iterate(self._aio.subscribe(stream, partition_id, iterator_type, **kwargs))

    def _iterate(self, agen):

        async def step():
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return _END

        try:
            while (item := self._run(step())) is not _END:
                yield item
        finally:
            self._run(agen.aclose())


_END = object()
