"""The Kinesis endpoint through boto3 against kinesalite and boto3's own ceiling, in one run
(issue 32; `make bench`'s Kinesis section).

One boto3 client in one thread, the issue's reference loop: `put_records` of `batch`
(500) records of `size` (100) bytes, one call at a time, against each server below: after
`warmup_calls` calls, `rounds` rounds of `records` records (kinesalite:
`kinesalite_records`), the servers taken in turns within a round (reversed every other
round: the drift of a shared machine falls on all alike; every server is up meanwhile,
idle when not measured); records/s is the median of the rounds. Then `get_records`
(Limit `limit`, 10,000) of everything each stored, every shard from TRIM_HORIZON in
turn until a page comes back empty. The servers:

- **the endpoint**: a TLS `LocalCluster` of `nodes` storage nodes, a stream of `shards`
  shards, boto3 trusting the cluster's CA;
- **a null endpoint**, boto3's ceiling, the limit of any server: a threaded http.server in
  a process of its own (TCP_NODELAY) that parses nothing but the operation (and the count
  of records of a PutRecords, the Limit of a GetRecords) and answers at once with a canned
  answer of the right shape: PutRecords with as many successes, GetRecords with Limit
  records of `size` bytes (its get loop stops at the records put). The same transport as
  the endpoint: HTTPS with a certificate issued by the cluster's CA for 127.0.0.1, the
  TLS settings of the endpoint's Hypercorn (TLS >= 1.2, ECDHE+AESGCM); the same over
  plain HTTP as extra information;
- **the engine itself**, the floor of the endpoint's figure: the same put loop through the
  native `sms.Client.put_records` in one thread, on the same cluster (`native_client`; the
  ratio `endpoint_put_of_native_client` is the endpoint's share);
- **kinesalite** (npm, in memory; bench/js, installed by scripts/bench-deps.sh; run by
  Debian's nodejs through bench/js/kinesalite-server.js) over plain HTTP, its default and
  how the issue's reference figures were taken, which the goals compare with; and over
  HTTPS with a certificate from the cluster's CA (`kinesalite_tls`: the endpoint's own
  transport), as extra information. Without node or bench/js/node_modules it is skipped
  with a message. kinesalite has no SubscribeToShard.

Then **SubscribeToShard latency**: a consumer registered on another stream of `shards`
shards, one boto3 `subscribe_to_shard` per shard (StartingPosition LATEST), each
EventStream read in a thread of its own; `put_records` of `subscribe_rate` *
`subscribe_interval_ms` / 1000 records every `subscribe_interval_ms` (1,000 records/s:
10 every 10 ms) for `subscribe_s` seconds, open loop (each call starts at its scheduled
time on one of `subscribe_senders` threads, whether or not earlier calls came back),
after a warm-up at the same pace until every subscription has delivered an event. Each
record carries its call's scheduled send time; a latency runs from it to the event's
arrival in the reading thread (a late send counts against its records: no coordinated
omission). p50 / p99 / p99.9 / max in ms, and the put calls' own latency beside them.

The goals (issue 32), each met / missed / n/a under "goals": put >= 0.6 of the ceiling
(HTTPS null endpoint), put >= 3x kinesalite, get >= 3x kinesalite, subscribe p99 <= 50
ms. Records failed, miscounted or never delivered are listed under "problems". Prints
JSON on stdout, progress on stderr; never asserts a timing.

    .venv/bin/python bench/kinesis.py [--preset smoke|quick|full] [--records N] [--nodes 3] [--shards 4]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.server
import json
import os
import re
import select
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JS_DIR = os.path.join(HERE, "js")
KINESALITE_SERVER = os.path.join(JS_DIR, "kinesalite-server.js")
KINESALITE_PACKAGE = os.path.join(JS_DIR, "node_modules", "kinesalite", "package.json")

PRESETS = {       # records and kinesalite_records: per round
    "smoke": {"records": 2_000, "kinesalite_records": 2_000, "rounds": 1, "subscribe_s": 1.0},
    "quick": {"records": 40_000, "kinesalite_records": 10_000, "rounds": 3, "subscribe_s": 5.0},
    "full": {"records": 200_000, "kinesalite_records": 50_000, "rounds": 5, "subscribe_s": 20.0},
}
DEFAULTS = {"nodes": 3, "shards": 4, "batch": 500, "size": 100, "limit": 10_000, "warmup_calls": 4,
            "subscribe_rate": 1_000, "subscribe_interval_ms": 10.0, "subscribe_senders": 8, "kinesalite_tls": True}

GOAL_PUT_OF_CEILING = 0.6            # endpoint put_records / the null endpoint's (HTTPS), at least
GOAL_PUT_VS_KINESALITE = 3.0         # endpoint put_records / kinesalite's, at least
GOAL_GET_VS_KINESALITE = 3.0         # endpoint get_records / kinesalite's, at least
GOAL_SUBSCRIBE_P99_MS = 50.0         # put to a subscriber's receipt, p99, at most
PUT_OF_CEILING = "Kinesis endpoint put_records / boto3's ceiling (null endpoint, HTTPS)"
PUT_VS_KINESALITE = "Kinesis endpoint put_records / kinesalite"
GET_VS_KINESALITE = "Kinesis endpoint get_records / kinesalite"
SUBSCRIBE_P99 = "Kinesis SubscribeToShard put-to-receive p99 (ms)"

SERVER_START_TIMEOUT_S = 30          # a null endpoint or kinesalite printing its URL
STREAM_ACTIVE_TIMEOUT_S = 60
SUBSCRIBE_WARMUP_MIN_S = 0.5         # the subscription warm-up: at least this long, and until
SUBSCRIBE_WARMUP_MAX_S = 30.0        # every subscription has delivered an event (else an error)
SUBSCRIBE_DRAIN_S = 10.0             # after the last put: the longest wait for records still on their way
STOP_JOIN_S = 10.0
NULL_SEQUENCE_NUMBER = "49" + "6" * 54      # a Kinesis-length sequence number, in the null endpoint's answers
STAMP = struct.Struct("<dIB")        # a subscribed record's data: scheduled send time, serial, phase
WARMUP, MEASURED, WAKE = 0, 1, 2


# --- the null endpoint: boto3's ceiling ------------------------------------------------------------
_LIMIT = re.compile(rb'"Limit"\s*:\s*(\d+)')
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.1\r\nContent-Length: %d\r\n\r\n"


class _Null(http.server.BaseHTTPRequestHandler):
    """Answers every request at once with a canned answer of the right shape, parsing
    nothing but the operation and, for PutRecords, the count of records (GetRecords:
    Limit). One write per answer."""
    protocol_version = "HTTP/1.1"
    size = 100
    answers: dict[tuple[str, int], bytes] = {}

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # no Nagle stall per answer

    def do_POST(self) -> None:          # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        operation = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
        if operation == "PutRecords":
            key = (operation, body.count(b'"PartitionKey"'))
        elif operation == "GetRecords":
            m = _LIMIT.search(body)
            key = (operation, int(m.group(1)) if m else 10_000)
        else:
            key = (operation, 0)
        answer = self.answers.get(key)
        if answer is None:
            answer = self.answers[key] = json.dumps(_null_answer(*key, self.size)).encode()
        self.wfile.write(_HEAD % len(answer) + answer)

    def log_message(self, *args) -> None:
        pass


def _null_answer(operation: str, count: int, size: int) -> dict:
    if operation == "PutRecords":
        return {"FailedRecordCount": 0, "Records": [{"SequenceNumber": NULL_SEQUENCE_NUMBER,
                                                     "ShardId": "shardId-000000000000"}] * count}
    if operation == "GetRecords":
        record = {"SequenceNumber": NULL_SEQUENCE_NUMBER, "ApproximateArrivalTimestamp": 1.7e9,
                  "Data": base64.b64encode(b"x" * size).decode(), "PartitionKey": "k1"}
        return {"Records": [record] * count, "NextShardIterator": "A" * 200, "MillisBehindLatest": 0}
    if operation == "GetShardIterator":
        return {"ShardIterator": "A" * 200}
    if operation == "ListShards":
        return {"Shards": [{"ShardId": "shardId-000000000000",
                            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2 ** 128 - 1)},
                            "SequenceNumberRange": {"StartingSequenceNumber": "0"}}]}
    return {}


def serve_null(size: int, cert_file: str = "", key_file: str = "") -> None:
    """The null endpoint (its own process: `--serve-null`): prints {"url": ...} once it
    listens, serves until killed. With a certificate: HTTPS with the TLS settings of the
    endpoint's Hypercorn (kinesis/server.py), HTTP/1.1 only (boto3 offers nothing else)."""
    _Null.size = size
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Null)
    server.daemon_threads = True
    if cert_file:
        from hypercorn.config import Config
        config = Config()
        config.certfile, config.keyfile = cert_file, key_file
        config.alpn_protocols = ["http/1.1"]
        server.socket = config.create_ssl_context().wrap_socket(server.socket, server_side=True)
    scheme = "https" if cert_file else "http"
    print(json.dumps({"url": f"{scheme}://127.0.0.1:{server.server_address[1]}"}), flush=True)
    server.serve_forever()


# --- servers of the bench's own: a null endpoint, kinesalite ------------------------------------------
class _Server:
    """A process that prints one JSON line ({"url": ...}) once it listens; always stopped."""

    def __init__(self, argv: list[str], log_path: str, what: str):
        self.what, self.log_path = what, log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True)
        self.info = self._first_line()

    def _first_line(self) -> dict:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line:
                    return json.loads(line)
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"{self.what} did not start: {self._tail()}")

    def _tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-2000:].decode(errors="replace").strip() or "(no output)"
        except OSError:
            return "(no log)"

    @property
    def url(self) -> str:
        return self.info["url"]

    def stop(self) -> None:
        common.stop_process(self.proc)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _null_server(workdir: str, size: int, cert=None) -> _Server:
    argv = [sys.executable, os.path.abspath(__file__), "--serve-null", "--size", str(size)]
    if cert:
        argv += ["--cert-file", cert.cert_file, "--key-file", cert.key_file]
    return _Server(argv, os.path.join(workdir, f"null-{'tls' if cert else 'http'}.log"), "the null endpoint")


def kinesalite_missing() -> str:
    """Why kinesalite cannot run here ("" when it can)."""
    if not shutil.which("node"):
        return "node not found (scripts/bench-deps.sh installs Debian's nodejs and kinesalite)"
    if not os.path.exists(KINESALITE_PACKAGE):
        return "kinesalite not installed: bench/js/node_modules missing (scripts/bench-deps.sh runs npm ci there)"
    return ""


# --- boto3 loops ----------------------------------------------------------------------------------
def _client(endpoint: str, key_id: str = "bench", secret: str = "bench", verify=False, pool: int = 10):
    import boto3
    from botocore.config import Config
    return boto3.client("kinesis", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                        aws_secret_access_key=secret, verify=verify,
                        config=Config(retries={"max_attempts": 10, "mode": "standard"},
                                      max_pool_connections=max(10, pool)))


def _put(kinesis, stream: str, records: int, batch: int, size: int, first_key: int = 0) -> dict:
    """The reference loop: put_records of `batch` records of `size` bytes, one call at a time."""
    data = b"x" * size
    start = time.perf_counter()
    failed = 0
    for first in range(first_key, first_key + records, batch):
        answer = kinesis.put_records(StreamName=stream, Records=[{"PartitionKey": f"k{i}", "Data": data}
                                                                 for i in range(first, min(first + batch,
                                                                                           first_key + records))])
        failed += answer["FailedRecordCount"]
    seconds = time.perf_counter() - start
    return {"records": records, "failed": failed, "seconds": round(seconds, 3),
            "records_per_s": round(records / seconds)}


def _get(kinesis, stream: str, limit: int, expected: int | None = None, stop_at: int | None = None) -> dict:
    """get_records (Limit `limit`) of every shard from TRIM_HORIZON, one shard after the
    other, until a page comes back empty (or `stop_at` records are read: the null endpoint)."""
    start, read, calls = time.perf_counter(), 0, 0
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:
        iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator and (stop_at is None or read < stop_at):
            page = kinesis.get_records(ShardIterator=iterator, Limit=limit)
            calls += 1
            read += len(page["Records"])
            iterator = page.get("NextShardIterator") if page["Records"] else None
    seconds = time.perf_counter() - start
    out = {"records": read, "calls": calls, "seconds": round(seconds, 3), "records_per_s": round(read / seconds)}
    if expected is not None:
        out.update(expected=expected, count_matches=read == expected)
    return out


def _create(kinesis, stream: str, shards: int) -> None:
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    deadline = time.monotonic() + STREAM_ACTIVE_TIMEOUT_S
    while kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream} not ACTIVE after {STREAM_ACTIVE_TIMEOUT_S} s")
        time.sleep(0.05)


class _Target:
    """One server the boto3 loops run against: its client, its stream, what it has put."""

    def __init__(self, name: str, what: str, transport: str, client, records: int, info: dict | None = None):
        self.name, self.what, self.transport, self.client, self.records = name, what, transport, client, records
        self.info = info or {}
        self.null = name.startswith("null")
        self.stream = "null" if self.null else "bench"
        self.stored = 0                   # records acknowledged, to read back
        self.puts: list[dict] = []
        self.get: dict | None = None
        self.error: str | None = None

    def put(self, records: int, batch: int, size: int) -> dict:
        out = _put(self.client, self.stream, records, batch, size, first_key=self.stored)
        self.stored += records - out["failed"]
        return out

    def summary(self) -> dict:
        out: dict = {"what": self.what, "transport": self.transport, **self.info}
        if self.puts:
            rates = [r["records_per_s"] for r in self.puts]
            out["put"] = {"records_per_s": round(statistics.median(rates)), "best_records_per_s": max(rates),
                          "rounds_records_per_s": rates, "records_per_round": self.records,
                          "failed": sum(r["failed"] for r in self.puts),
                          "seconds": round(sum(r["seconds"] for r in self.puts), 3)}
        if self.get is not None:
            out["get"] = self.get
        if self.error:
            out["error"] = self.error
        return out


class _NativeTarget(_Target):
    """The engine itself, through the native client in one thread (`sms.Client.put_records`
    of the same records in the same loop): what a call costs before any endpoint, the floor
    of the endpoint's figure."""

    reads = False

    def put(self, records: int, batch: int, size: int) -> dict:
        data = b"x" * size
        start, failed = time.perf_counter(), 0
        for first in range(self.stored, self.stored + records, batch):
            result = self.client.put_records(self.stream, [(f"k{i % 1000}", data)
                                                           for i in range(first, min(first + batch,
                                                                                     self.stored + records))])
            failed += sum(1 for r in result.records if not r.ok)
        seconds = time.perf_counter() - start
        self.stored += records - failed
        return {"records": records, "failed": failed, "seconds": round(seconds, 3),
                "records_per_s": round(records / seconds)}


# --- SubscribeToShard: put to receive ---------------------------------------------------------------
class _Receivers:
    """One thread per shard reading its subscription's EventStream; the latencies of the
    measured records, from their scheduled send time to their event's arrival."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.serials: list[int] = []
        self.warmup_records = 0
        self.events: dict[str, int] = {}
        self.streams: list = []
        self.errors: list[str] = []

    def receive(self, client, consumer_arn: str, shard_id: str) -> None:
        try:
            answer = client.subscribe_to_shard(ConsumerARN=consumer_arn, ShardId=shard_id,
                                               StartingPosition={"Type": "LATEST"})
            events = answer["EventStream"]
            self.streams.append(events)
            self.events[shard_id] = 0
            for event in events:
                now = time.perf_counter()
                shard_event = event.get("SubscribeToShardEvent")
                if shard_event is None:
                    continue
                for r in shard_event["Records"]:
                    sent, serial, phase = STAMP.unpack_from(r["Data"])
                    if phase == MEASURED:
                        self.latencies.append(now - sent)
                        self.serials.append(serial)
                    elif phase == WARMUP:
                        self.warmup_records += 1
                self.events[shard_id] += 1
                if self.stop.is_set():
                    break
        except Exception as e:           # noqa: BLE001 (reported in the JSON)
            if not self.stop.is_set():
                self.errors.append(f"{shard_id}: {e!r}"[:300])

    def close(self) -> None:
        self.stop.set()
        for events in list(self.streams):
            try:
                events.close()
            except Exception:            # noqa: BLE001 (closing a stream another thread reads)
                pass


class _Sender:
    """put_records of the subscription load, open loop: each call starts at its scheduled
    time on one of `senders` threads, whether or not earlier calls came back."""

    def __init__(self, kinesis, stream: str, per_batch: int, size: int, senders: int):
        from concurrent.futures import ThreadPoolExecutor
        self.kinesis, self.stream, self.per_batch = kinesis, stream, per_batch
        self.pad = b"x" * max(0, size - STAMP.size)
        self.pool = ThreadPoolExecutor(max_workers=senders, thread_name_prefix="subscribe-sender")
        self.futures: list = []
        self.calls: list[float] = []          # measured calls: scheduled start to answer
        self.errors: list[str] = []
        self.failures: list[int] = []         # failed records per call (appended by the sender threads)

    def _put(self, scheduled: float, phase: int, first_serial: int) -> None:
        records = [{"PartitionKey": f"k{first_serial + i}",
                    "Data": STAMP.pack(scheduled, first_serial + i, phase) + self.pad} for i in range(self.per_batch)]
        try:
            answer = self.kinesis.put_records(StreamName=self.stream, Records=records)
        except Exception as e:           # noqa: BLE001 (counted, the first reported)
            self.errors.append(repr(e)[:300])
            if phase == MEASURED:
                self.failures.append(self.per_batch)
            return
        if phase == MEASURED:
            self.calls.append(time.perf_counter() - scheduled)
            self.failures.append(answer["FailedRecordCount"])

    def paced(self, interval: float, phase: int, first_serial: int, until) -> tuple[int, float]:
        """Calls every `interval` s until `until(k, elapsed)`; returns (calls, seconds)."""
        t0 = time.perf_counter()
        k = 0
        while not until(k, time.perf_counter() - t0):
            scheduled = t0 + k * interval
            time.sleep(max(0.0, scheduled - time.perf_counter()))
            self.futures.append(self.pool.submit(self._put, scheduled, phase, first_serial + k * self.per_batch))
            k += 1
        return k, time.perf_counter() - t0

    def wait(self) -> None:
        for f in self.futures:
            f.result()
        self.futures = []

    def wake(self, shards: list[dict]) -> None:
        """One record into each shard (its ExplicitHashKey), so that every reader sees
        an event now, and with it the stop flag, rather than at the next heartbeat."""
        try:
            self.kinesis.put_records(StreamName=self.stream, Records=[
                {"PartitionKey": "wake", "ExplicitHashKey": s["HashKeyRange"]["StartingHashKey"],
                 "Data": STAMP.pack(0.0, 0, WAKE) + self.pad} for s in shards])
        except Exception as e:           # noqa: BLE001 (then the readers stop at the next heartbeat)
            self.errors.append(f"wake-up records: {e!r}"[:300])

    @property
    def failed(self) -> int:
        return sum(self.failures)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _subscribe_latency(make_client, params: dict) -> dict:
    senders = params["subscribe_senders"]
    kinesis = make_client(pool=senders)
    stream = "bench-subscribe"
    _create(kinesis, stream, params["shards"])
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    consumer = kinesis.register_stream_consumer(StreamARN=arn, ConsumerName="bench")["Consumer"]["ConsumerARN"]
    deadline = time.monotonic() + STREAM_ACTIVE_TIMEOUT_S
    while kinesis.describe_stream_consumer(ConsumerARN=consumer)["ConsumerDescription"]["ConsumerStatus"] != "ACTIVE":
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumer not ACTIVE after {STREAM_ACTIVE_TIMEOUT_S} s")
        time.sleep(0.05)
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    receivers = _Receivers()
    threads = [threading.Thread(target=receivers.receive, args=(make_client(), consumer, s["ShardId"]),
                                name=f"subscriber-{s['ShardId']}", daemon=True) for s in shards]
    for t in threads:
        t.start()
    interval = params["subscribe_interval_ms"] / 1000
    per_batch = max(1, round(params["subscribe_rate"] * interval))
    sender = _Sender(kinesis, stream, per_batch, params["size"], senders)
    try:
        def warm(k: int, elapsed: float) -> bool:       # until every subscription has delivered an event
            delivered = dict(receivers.events)          # (a copy: the readers add to it)
            if elapsed > SUBSCRIBE_WARMUP_MAX_S or receivers.errors:
                raise RuntimeError(f"subscriptions not all delivering after {elapsed:.1f} s: "
                                   f"events {delivered}, errors {receivers.errors}")
            return elapsed >= SUBSCRIBE_WARMUP_MIN_S and len(delivered) == len(shards) and all(delivered.values())
        _, warmup_s = sender.paced(interval, WARMUP, 10_000_000, warm)
        sender.wait()
        common.progress(f"kinesis: {len(shards)} subscriptions delivering after {warmup_s:.1f} s; "
                        f"{params['subscribe_rate']:,} records/s for {params['subscribe_s']} s")
        batches = max(1, round(params["subscribe_s"] / interval))
        calls, put_s = sender.paced(interval, MEASURED, 0, lambda k, _elapsed: k >= batches)
        sender.wait()
        sent = calls * per_batch
        expected = sent - sender.failed
        deadline = time.monotonic() + SUBSCRIBE_DRAIN_S
        while len(receivers.serials) < expected and time.monotonic() < deadline and not receivers.errors:
            time.sleep(0.01)
        receivers.stop.set()
        sender.wake(shards)
    finally:
        receivers.stop.set()
        sender.close()
        for t in threads:
            t.join(timeout=STOP_JOIN_S)
        receivers.close()
    unique = len(set(receivers.serials))
    latency = common.percentiles_ms(receivers.latencies)
    common.progress(f"kinesis: subscribe put to receive p50 {latency.get('p50_ms')} ms, p99 {latency.get('p99_ms')} "
                    f"ms, max {latency.get('max_ms')} ms ({unique:,} of {expected:,} records)")
    return {"shards": len(shards), "offered_records_per_s": params["subscribe_rate"],
            "records_per_call": per_batch, "interval_ms": params["subscribe_interval_ms"], "senders": senders,
            "warmup_s": round(warmup_s, 2), "put_s": round(put_s, 2),
            "achieved_records_per_s": round(sent / put_s), "records_sent": sent, "records_failed": sender.failed,
            "records_received": unique, "missing": expected - unique,
            "duplicates": len(receivers.serials) - unique, "put_errors": len(sender.errors),
            "first_put_error": sender.errors[0] if sender.errors else None, "reader_errors": receivers.errors,
            "latency": latency, "put_call_latency": common.percentiles_ms(sender.calls)}


# --- the run --------------------------------------------------------------------------------------
def _servers(stack: contextlib.ExitStack, workdir: str, params: dict, cert, ca_file: str) -> tuple[list, dict]:
    """The null endpoints (HTTPS, plain HTTP) and kinesalite (plain HTTP, HTTPS when
    kinesalite_tls), started; (their targets, the outcome of those that could not start)."""
    started, skipped = [], {}
    for name, c in (("null_endpoint", cert), ("null_endpoint_plain_http", None)):
        argv = [sys.executable, os.path.abspath(__file__), "--serve-null", "--size", str(params["size"])]
        if c:
            argv += ["--cert-file", c.cert_file, "--key-file", c.key_file]
        server = stack.enter_context(_Server(argv, os.path.join(workdir, f"{name}.log"), "the null endpoint"))
        started.append(_Target(name, "boto3's ceiling: an endpoint that answers at once, parsing nothing",
                               "https" if c else "http", _client(server.url, verify=ca_file if c else False),
                               params["records"]))
    missing = kinesalite_missing()
    for name, c in (("kinesalite", None), ("kinesalite_tls", cert)):
        if missing:
            skipped[name] = {"skipped": missing}
            continue
        if c is not None and not params["kinesalite_tls"]:
            continue
        argv = ["node", KINESALITE_SERVER, "--shardLimit", str(max(1000, params["shards"] * 2)),
                "--createStreamMs", "0"]
        if c:
            argv += ["--cert", c.cert_file, "--key", c.key_file]
        try:
            server = stack.enter_context(_Server(argv, os.path.join(workdir, f"{name}.log"), "kinesalite"))
            target = _Target(name, "kinesalite, in memory", "https" if c else "http",
                             _client(server.url, verify=ca_file if c else False), params["kinesalite_records"],
                             {"version": server.info.get("kinesalite"), "node": server.info.get("node")})
            _create(target.client, target.stream, params["shards"])
            started.append(target)
        except Exception as e:        # noqa: BLE001 (a peer that fails is reported, not fatal)
            skipped[name] = {"error": repr(e)[:500]}
    if missing:
        common.progress(f"kinesis: kinesalite skipped: {missing}")
    return started, skipped


def _measure(servers: list[_Target], params: dict) -> None:
    """Warm-up calls, then `rounds` rounds of the put loop taking the servers in turns
    (reversed every other round: drift of a shared machine falls on all alike), then one
    get loop of each."""
    batch, size = params["batch"], params["size"]
    for t in servers:
        try:
            t.put(batch * params["warmup_calls"], batch, size)
        except Exception as e:        # noqa: BLE001 (that target is out; the others go on)
            t.error = f"warm-up: {e!r}"[:500]
    for r in range(params["rounds"]):
        live = [t for t in servers if not t.error]
        for t in (live if r % 2 == 0 else live[::-1]):
            try:
                t.puts.append(t.put(t.records, batch, size))
            except Exception as e:    # noqa: BLE001
                t.error = f"put round {r + 1}: {e!r}"[:500]
        common.progress(f"kinesis: put round {r + 1}: " + ", ".join(
            f"{t.name} {t.puts[-1]['records_per_s']:,}" for t in live if len(t.puts) == r + 1) + " records/s")
    for t in servers:
        if t.error or not getattr(t, "reads", True):
            continue
        try:
            t.get = _get(t.client, t.stream, params["limit"], stop_at=t.stored) if t.null else \
                _get(t.client, t.stream, params["limit"], expected=t.stored)
        except Exception as e:        # noqa: BLE001
            t.error = f"get: {e!r}"[:500]
    common.progress("kinesis: get: " + ", ".join(f"{t.name} {t.get['records_per_s']:,}" for t in servers
                                                  if t.get) + " records/s")


def run(params: dict) -> dict:
    from node import certs
    from node.launcher import LocalCluster
    from sms import security
    t_start = time.perf_counter()
    out: dict = {"bench": "kinesis", "parameters": dict(params)}
    workdir = tempfile.mkdtemp(prefix="sms-bench-kinesis-")
    try:
        with contextlib.ExitStack() as stack:
            common.progress(f"kinesis: a TLS cluster of {params['nodes']} storage nodes, the null endpoints, "
                            f"kinesalite")
            cluster = LocalCluster(os.path.join(workdir, "cluster"), nodes=params["nodes"], port=0).start()
            clients: list = []

            def stop_cluster() -> None:
                for client in clients:     # (an open connection holds a stopping node for its grace period)
                    client.close()
                t0 = time.perf_counter()
                cluster.stop()
                common.progress(f"kinesis: cluster stopped in {time.perf_counter() - t0:.1f} s")
            stack.callback(stop_cluster)
            key_id, secret = security.aws_credentials(cluster.admin_token)
            ca_file = cluster.ca_file

            def make_client(pool: int = 10):
                clients.append(_client(cluster.kinesis_endpoint, key_id, secret, ca_file, pool))
                return clients[-1]
            endpoint = _Target("endpoint", "the SMS Kinesis endpoint (HTTPS, the cluster's CA)", "https",
                               make_client(), params["records"], {"storage_nodes": params["nodes"],
                                                                  "shards": params["shards"]})
            _create(endpoint.client, endpoint.stream, params["shards"])
            # the same transport as the endpoint: a certificate from the cluster's CA for 127.0.0.1
            cert = certs.issue(cluster.ca_dir, os.path.join(workdir, "bench-certs"), node="bench-null")
            others, skipped = _servers(stack, workdir, params, cert, ca_file)
            import sms
            native_client = stack.enter_context(sms.Client(cluster.address, **cluster.client_options()))
            native = _NativeTarget("native_client", "the engine itself: sms.Client.put_records of the same "
                                   "records, one thread (no endpoint)", "grpc+tls", native_client,
                                   params["records"])
            native.stream = "bench-native"          # (a stream of its own, made as CreateStream makes one)
            native_client.create_stream(native.stream, partitions=params["shards"],
                                        replication_factor=min(3, params["nodes"]))
            measured = [endpoint, native, *others]
            _measure(measured, params)
            for t in measured:
                out[t.name] = t.summary()
            out.update(skipped)
            if params["subscribe_s"] <= 0:
                out["subscribe"] = {"skipped": "subscribe_s is 0"}
            else:
                try:
                    out["subscribe"] = _subscribe_latency(make_client, params)
                except Exception as e:        # noqa: BLE001 (the rest of the run goes on)
                    out["subscribe"] = {"error": repr(e)[:500]}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.update(_ratios(out))
    out["goals"] = targets(out)
    out["problems"] = problems(out)
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    return out


def _rate(d, *path) -> float | None:
    return common.dig(d, *path, "records_per_s")


def _ratios(out: dict) -> dict:
    put, get = _rate(out, "endpoint", "put"), _rate(out, "endpoint", "get")
    return {"ratios": {
        "put_of_ceiling": common.ratio(put, _rate(out, "null_endpoint", "put")),
        "put_of_ceiling_plain_http": common.ratio(put, _rate(out, "null_endpoint_plain_http", "put")),
        "get_of_ceiling": common.ratio(get, _rate(out, "null_endpoint", "get")),
        "put_vs_kinesalite": common.ratio(put, _rate(out, "kinesalite", "put")),
        "get_vs_kinesalite": common.ratio(get, _rate(out, "kinesalite", "get")),
        "put_vs_kinesalite_tls": common.ratio(put, _rate(out, "kinesalite_tls", "put")),
        "get_vs_kinesalite_tls": common.ratio(get, _rate(out, "kinesalite_tls", "get")),
        "endpoint_put_of_native_client": common.ratio(_rate(out, "endpoint", "put"),
                                                      _rate(out, "native_client", "put")),
        "null_endpoint_put_https_to_plain_http": common.ratio(_rate(out, "null_endpoint", "put"),
                                                              _rate(out, "null_endpoint_plain_http", "put")),
    }}


def _why(d, what: str) -> str:
    if not isinstance(d, dict):
        return f"{what}: not measured"
    if d.get("skipped"):
        return f"{what} skipped: {d['skipped']}"
    if d.get("error"):
        return f"{what} failed: {d['error']}"
    return f"{what}: figure missing"


def _versus(name: str, goal: float, out: dict, op: str, peer: str, detail: str) -> dict:
    """The endpoint's records/s of `op` ("put" / "get") / `peer`'s, at least `goal`."""
    mine, theirs = _rate(out, "endpoint", op), _rate(out, peer, op)
    if not mine:
        return common.target(name, None, goal, detail=_why(out.get("endpoint"), f"kinesis endpoint {op}"))
    if not theirs:
        return common.target(name, None, goal, detail=_why(out.get(peer), f"{peer} {op}"))
    return common.target(name, mine / theirs, goal, detail=f"{mine:,} records/s vs {theirs:,} records/s; {detail}")


GOALS = ((PUT_OF_CEILING, GOAL_PUT_OF_CEILING), (PUT_VS_KINESALITE, GOAL_PUT_VS_KINESALITE),
         (GET_VS_KINESALITE, GOAL_GET_VS_KINESALITE), (SUBSCRIBE_P99, GOAL_SUBSCRIBE_P99_MS))


def targets(result) -> list[dict]:
    """Issue 32's goals of the Kinesis endpoint, each met / missed / n/a."""
    out = result if isinstance(result, dict) else {}
    if "endpoint" not in out:                    # the bench did not run: every goal n/a
        why = _why(result, "kinesis bench")
        return [common.target(name, None, goal, higher_is_better=goal != GOAL_SUBSCRIBE_P99_MS, detail=why)
                for name, goal in GOALS]
    rounds = f"median of {common.dig(out, 'parameters', 'rounds')} rounds taken in turns"
    put = f"boto3 put_records of 500 x 100 B, one thread, {rounds}"
    ks = f"kinesalite over {common.dig(out, 'kinesalite', 'transport') or 'http'}"
    plain = _rate(out, "null_endpoint_plain_http", "put")
    goals = [
        _versus(PUT_OF_CEILING, GOAL_PUT_OF_CEILING, out, "put", "null_endpoint",
                f"{put}; over plain HTTP the null endpoint takes {f'{plain:,}' if plain else '-'} records/s"),
        _versus(PUT_VS_KINESALITE, GOAL_PUT_VS_KINESALITE, out, "put", "kinesalite", f"{put}; {ks}"),
        _versus(GET_VS_KINESALITE, GOAL_GET_VS_KINESALITE, out, "get", "kinesalite",
                f"boto3 get_records, Limit 10,000, of every shard in turn; {ks}"),
    ]
    sub = out.get("subscribe")
    p99 = common.dig(sub, "latency", "p99_ms")
    if p99 is None:
        goals.append(common.target(SUBSCRIBE_P99, None, GOAL_SUBSCRIBE_P99_MS, higher_is_better=False,
                                   detail=_why(sub, "kinesis subscribe")))
    else:
        goals.append(common.target(SUBSCRIBE_P99, p99, GOAL_SUBSCRIBE_P99_MS, higher_is_better=False,
                                   detail=f"{sub['offered_records_per_s']:,} records/s in calls of "
                                          f"{sub['records_per_call']} every {sub['interval_ms']} ms over "
                                          f"{sub['shards']} subscribed shards; p50 {sub['latency']['p50_ms']} ms, "
                                          f"max {sub['latency']['max_ms']} ms, {sub['records_received']:,} records"))
    return goals


def problems(out: dict) -> list[str]:
    """What the endpoint failed, miscounted or never delivered (each makes bench/run.py
    exit 1). kinesalite's troubles are its own: in its entry, not here."""
    found = []
    ep = out.get("endpoint") or {}
    if ep.get("error"):
        found.append(f"endpoint: {ep['error']}")
    if common.dig(ep, "put", "failed"):
        found.append(f"endpoint put_records: {ep['put']['failed']} records failed")
    get = ep.get("get")
    if isinstance(get, dict) and get.get("count_matches") is False:
        found.append(f"endpoint get_records: read {get['records']:,} records, expected {get['expected']:,}")
    sub = out.get("subscribe")
    if isinstance(sub, dict) and (sub.get("missing") or sub.get("duplicates") or sub.get("reader_errors")
                                  or sub.get("records_failed") or sub.get("put_errors")):
        found.append(f"subscribe: {sub['missing']} acknowledged records never received, {sub['duplicates']} "
                     f"duplicated, {sub['records_failed']} failed puts ({sub['put_errors']} calls failed, first: "
                     f"{sub['first_put_error']}), reader errors {sub['reader_errors']}")
    return found


def run_preset(preset: str = "quick") -> dict:
    """bench/run.py's extra: the defaults at one of PRESETS."""
    return run({**DEFAULTS, **PRESETS[preset], "preset": preset})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick", help="record counts and durations")
    p.add_argument("--records", type=int, help="put through the endpoint and the null endpoints, per round")
    p.add_argument("--kinesalite-records", type=int, help="put through kinesalite (slower), per round")
    p.add_argument("--rounds", type=int, help="put rounds, the targets taken in turns")
    p.add_argument("--subscribe-s", type=float, help="seconds of SubscribeToShard load (0: none)")
    p.add_argument("--subscribe-rate", type=int, default=DEFAULTS["subscribe_rate"])
    p.add_argument("--batch", type=int, default=DEFAULTS["batch"])
    p.add_argument("--size", type=int, default=DEFAULTS["size"])
    p.add_argument("--nodes", type=int, default=DEFAULTS["nodes"])
    p.add_argument("--shards", type=int, default=DEFAULTS["shards"])
    p.add_argument("--no-kinesalite-tls", action="store_true", help="kinesalite over plain HTTP only")
    p.add_argument("--serve-null", action="store_true", help=argparse.SUPPRESS)     # the null endpoint's process
    p.add_argument("--cert-file", help=argparse.SUPPRESS)
    p.add_argument("--key-file", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_null:
        serve_null(a.size, a.cert_file or "", a.key_file or "")
        return 0
    preset = PRESETS[a.preset]
    params = {**DEFAULTS, **preset, "preset": a.preset, "batch": a.batch, "size": max(a.size, STAMP.size),
              "nodes": a.nodes, "shards": a.shards, "subscribe_rate": a.subscribe_rate,
              "kinesalite_tls": not a.no_kinesalite_tls}
    for key in ("records", "kinesalite_records", "rounds", "subscribe_s"):
        if getattr(a, key) is not None:
            params[key] = getattr(a, key)
    if a.records is not None and a.kinesalite_records is None:
        params["kinesalite_records"] = min(a.records, preset["kinesalite_records"])
    common.tune_gc()
    result = run(params)
    print(json.dumps(result, indent=2, default=str))
    common.print_verdicts(result["goals"], result["problems"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
