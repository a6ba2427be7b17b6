"""The Kinesis endpoint through boto3, against boto3's own ceiling, in one run.

A TLS `LocalCluster` of `--nodes` storage nodes; one boto3 client in one thread (the
issue's reference loop): `put_records` of `--batch` records of `--size` bytes until
`--records` are in, then `get_records` of the shard's records back. The same boto3 loop
against a *null endpoint* (an HTTP server on loopback that answers every PutRecords at
once with a canned answer of the right shape) gives the ceiling of any server: boto3's
own cost. Reports records/s of each and the ratio endpoint / ceiling (issue 32's goal:
at least 0.6). kinesalite, the npm emulator, is not measured here yet (issue 32). Prints
JSON; never asserts a timing.

    .venv/bin/python bench/kinesis.py [--records 100000] [--nodes 3]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402

from node.launcher import LocalCluster  # noqa: E402
from sms import security  # noqa: E402


class _Null(http.server.BaseHTTPRequestHandler):
    """Answers every request at once: PutRecords with `count` successes, anything else {}."""
    protocol_version = "HTTP/1.1"
    answers: dict[int, bytes] = {}

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # no Nagle stall per answer

    def do_POST(self) -> None:          # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        target = self.headers.get("X-Amz-Target", "")
        if target.endswith(".PutRecords"):
            count = body.count(b'"PartitionKey"')
            answer = self.answers.get(count)
            if answer is None:
                answer = self.answers[count] = json.dumps({"FailedRecordCount": 0, "Records": [
                    {"SequenceNumber": "1", "ShardId": "shardId-000000000000"}] * count}).encode()
        else:
            answer = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


def _client(endpoint: str, key_id: str, secret: str, verify):
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                        aws_secret_access_key=secret, verify=verify,
                        config=Config(retries={"max_attempts": 10, "mode": "standard"}))


def _put(kinesis, stream: str, records: int, batch: int, size: int) -> dict:
    data = b"x" * size
    start = time.perf_counter()
    failed = 0
    for first in range(0, records, batch):
        answer = kinesis.put_records(StreamName=stream, Records=[{"PartitionKey": f"k{i % 1000}", "Data": data}
                                                                 for i in range(first, min(first + batch, records))])
        failed += answer["FailedRecordCount"]
    seconds = time.perf_counter() - start
    return {"records": records, "failed": failed, "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds)}


def run(args) -> dict:
    out: dict = {"bench": "kinesis", "records": args.records, "batch": args.batch, "size": args.size}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Null)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        null = _client(f"http://127.0.0.1:{server.server_address[1]}", "a", "b", False)
        out["null_endpoint_put"] = _put(null, "s", args.records, args.batch, args.size)
    finally:
        server.shutdown()
    with tempfile.TemporaryDirectory(prefix="sms-bench-kinesis-") as d:
        cluster = LocalCluster(d, nodes=args.nodes, port=0).start()
        try:
            key_id, secret = security.aws_credentials(cluster.admin_token)
            kinesis = _client(cluster.kinesis_endpoint, key_id, secret, cluster.ca_file)
            kinesis.create_stream(StreamName="bench", ShardCount=args.shards)
            kinesis.get_waiter("stream_exists").wait(StreamName="bench", WaiterConfig={"Delay": 1})
            _put(kinesis, "bench", args.batch * 4, args.batch, args.size)          # warm up
            out["endpoint_put"] = _put(kinesis, "bench", args.records, args.batch, args.size)
            start, read = time.perf_counter(), 0
            for shard in kinesis.list_shards(StreamName="bench")["Shards"]:
                iterator = kinesis.get_shard_iterator(StreamName="bench", ShardId=shard["ShardId"],
                                                      ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
                while iterator:
                    page = kinesis.get_records(ShardIterator=iterator, Limit=10_000)
                    read += len(page["Records"])
                    iterator = page.get("NextShardIterator") if page["Records"] else None
            seconds = time.perf_counter() - start
            out["endpoint_get"] = {"records": read, "seconds": round(seconds, 3),
                                   "records_per_s": round(read / seconds)}
        finally:
            cluster.stop()
    ceiling = out["null_endpoint_put"]["records_per_s"]
    out["put_of_ceiling"] = round(out["endpoint_put"]["records_per_s"] / ceiling, 3)
    out["goal_put_of_ceiling"] = 0.6
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--shards", type=int, default=4)
    print(json.dumps(run(p.parse_args()), indent=2))


if __name__ == "__main__":
    main()
