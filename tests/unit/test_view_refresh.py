"""metastore/view.py ClusterView: a stream's view is read again when it is older than asked
(`max_age_s`), which retrieval uses for a partition its cached map lacks (a new partition
a client learned of from a fresher map). A real embedded store, no server."""

from __future__ import annotations

import asyncio
import urllib.parse

from metastore import open_metastore
from metastore.view import ClusterView
from sms import metadata
from sms.metadata import StreamConfig
from sms.partition_map import PartitionMap
from sms.types import IngestionPolicy, Persistence


def test_a_view_older_than_asked_is_read_again(tmp_path):
    async def body():
        async with open_metastore("embedded://" + urllib.parse.quote(str(tmp_path / "meta.lmdb"))) as store:
            await store.create(metadata.STREAMS, b"")
            await store.create(metadata.stream_path("s"), StreamConfig("s", 1, 1, Persistence.DISK,
                                                                        IngestionPolicy.BEST_EFFORT, 24, 0).to_bytes())
            await store.create(metadata.map_path("s"), PartitionMap.even(1, 0).to_bytes())
            view = ClusterView(store)              # (not started: no watch drops the cache)
            first = await view.stream("s")
            assert len(first.map.entries) == 1
            entry = await store.get(metadata.map_path("s"))
            await store.set(metadata.map_path("s"), PartitionMap.even(2, 0).to_bytes(), entry.version)
            assert len((await view.stream("s")).map.entries) == 1          # cached: young enough
            assert len((await view.stream("s", max_age_s=0.0)).map.entries) == 2
            assert len((await view.stream("s")).map.entries) == 2          # and kept
    asyncio.run(body())
