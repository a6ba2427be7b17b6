"""`sms stream export` / `import` (node/backup.py) on a real cluster: a stream that was
split while written (lineage), with binary data and headers, goes to Parquet files and
stream.json, every partition's file holding exactly its records in SN order; imported
into a new stream, every key's records come back in their order, with data and headers
equal; an existing stream, a non-empty directory and a directory that is not an export
are refused by name."""

from __future__ import annotations

import asyncio
import json
import os
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from node import backup
from node.launcher import LocalCluster
from sms import aio, errors

pytestmark = pytest.mark.integration

KEYS = 40


def records(first: int, n: int) -> list[dict]:
    out = []
    for i in range(first, first + n):
        r = {"partition_key": f"user-{i % KEYS}", "data": bytes([i % 256, 0xDE, 0xAD]) + str(i).encode()}
        if i % 3 == 0:
            r["headers"] = {"kind": b"third", "n": str(i).encode()}
        out.append(r)
    return out


def per_key(rows) -> dict[str, list]:
    out = defaultdict(list)
    for key, data, headers in rows:
        out[key].append((bytes(data), dict(headers or {})))
    return dict(out)


async def scenario(cluster: LocalCluster, tmp_path) -> None:
    async with aio.Client(cluster.address, **cluster.client_options()) as client:
        await client.create_stream("orders", 2, 2)
        sent = records(0, 600)
        await client.put_records("orders", sent[:300])
        await client.split("orders", "p0000")
        await client.put_records("orders", sent[300:])
        original = [r async for r in client.read_stream("orders")]
        assert len(original) == len(sent)

        out = str(tmp_path / "export")
        seen = []
        doc = await backup.export_stream(client, "orders", out, progress=seen.append)
        assert doc["records"] == len(sent) and seen and seen[-1] == len(sent)
        with open(os.path.join(out, "stream.json")) as f:
            assert json.load(f) == doc
        parts = {p["partition_id"]: p for p in doc["partitions"]}
        assert set(parts) == {"p0000", "p0001", "p0002", "p0003"}
        assert parts["p0000"]["state"] == "CLOSED" and parts["p0000"]["children"] == [2, 3]
        assert parts["p0002"]["parents"] == [0]
        assert [p["partition_id"] for p in doc["partitions"]].index("p0000") < \
            [p["partition_id"] for p in doc["partitions"]].index("p0002")
        # each file: exactly its partition's records, in SN order, as read_stream gave them
        by_partition = defaultdict(list)
        for r in original:
            by_partition[r.partition_id].append(r)
        for pid, p in parts.items():
            table = pq.read_table(os.path.join(out, f"{pid}.parquet"))
            assert table.num_rows == p["records"] == len(by_partition[pid]), pid
            want = sorted(by_partition[pid], key=lambda r: r.sn)
            assert table.column("sequence_number").to_pylist() == [r.sequence_number for r in want]
            assert table.column("data").to_pylist() == [r.data for r in want]
            assert [dict(h or {}) for h in table.column("headers").to_pylist()] == [r.headers for r in want]

        result = await backup.import_stream(client, out, "orders-restored")
        assert result == {"stream": "orders-restored", "partitions": 3, "records": len(sent)}
        restored = [r async for r in client.read_stream("orders-restored")]
        assert per_key((r.partition_key, r.data, r.headers) for r in restored) == \
            per_key((r.partition_key, r.data, r.headers) for r in sorted(original, key=lambda r: r.sn)) == \
            per_key((r["partition_key"], r["data"], r.get("headers")) for r in sent)

        with pytest.raises(errors.StreamAlreadyExists):
            await backup.import_stream(client, out, "orders-restored")
        with pytest.raises(errors.InvalidArgument, match="is not empty"):
            await backup.export_stream(client, "orders", out)
        os.makedirs(tmp_path / "empty")
        with pytest.raises(errors.InvalidArgument, match="holds no stream.json"):
            await backup.import_stream(client, str(tmp_path / "empty"), "nothing")


def test_export_and_import_keep_every_record_and_each_keys_order(tmp_path):
    with LocalCluster(str(tmp_path / "c"), nodes=2) as cluster:
        asyncio.run(scenario(cluster, tmp_path))
