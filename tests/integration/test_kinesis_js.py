"""The Kinesis endpoint with the real AWS SDK for JavaScript v3 (`@aws-sdk/client-kinesis`,
pinned in tests/js/package-lock.json, installed by scripts/node-deps.sh), run by node as a
user runs it: TLS with the cluster's CA (NODE_EXTRA_CA_CERTS), SigV4 with an SMS key's
secret, and the client's default request handler, a NodeHttp2Handler: every operation goes
over HTTP/2 (ALPN h2), each on a connection of its own that the SDK closes with a GOAWAY
as soon as the response headers arrive. tests/js/kinesis_client.mjs does the SDK's side.

PutRecords of binary records read back by the native client and by GetRecords, and
SubscribeToShard pushing records written while the subscription is open."""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import sms
from sms import security
from tests.conftest import stream_name

pytestmark = pytest.mark.integration

JS_DIR = Path(__file__).resolve().parents[1] / "js"
JS_CLIENT = JS_DIR / "kinesis_client.mjs"
NODE = shutil.which("node")
CALL_TIMEOUT_S = 60


def _missing() -> str:
    """Why the SDK cannot run here ("" when it can)."""
    if NODE is None:
        return "node is not installed (scripts/node-deps.sh installs Debian's nodejs and npm)"
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    if not version.startswith("v") or int(version[1:].split(".")[0]) < 20:
        return f"node {version} is older than 20, which the pinned AWS SDK for JavaScript needs"
    if not (JS_DIR / "node_modules" / "@aws-sdk" / "client-kinesis").is_dir():
        return "tests/js/node_modules has no @aws-sdk/client-kinesis (scripts/node-deps.sh installs it)"
    return ""


_MISSING = _missing()
if _MISSING:          # (skipped before the module's cluster starts)
    pytest.skip(_MISSING, allow_module_level=True)


def shard_id(ordinal: int) -> str:
    return f"shardId-{ordinal:012d}"


@pytest.fixture(scope="module")
def js_env(cluster) -> dict[str, str]:
    """The environment of the node processes: the endpoint, the key, the CA."""
    key_id, secret = security.aws_credentials(cluster.admin_token)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "NODE_"))}
    env.update(KINESIS_ENDPOINT=cluster.kinesis_endpoint, AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret,
               AWS_REGION="us-east-1", NODE_EXTRA_CA_CERTS=cluster.ca_file,
               NODE_NO_WARNINGS="1")      # (the SDK warns on stderr that node 20 is old)
    return env


@pytest.fixture(scope="module")
def js(js_env):
    """Run one command of kinesis_client.mjs with a JSON request; its JSON answer."""
    def run(command: str, request: dict) -> dict:
        done = subprocess.run([NODE, str(JS_CLIENT), command], input=json.dumps(request), env=js_env, cwd=JS_DIR,
                              capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
        assert done.returncode == 0, f"node kinesis_client.mjs {command}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        answer = json.loads(done.stdout)
        assert_http2(answer["http"])
        return answer
    return run


def assert_http2(http: dict) -> None:
    """The SDK spoke HTTP/2: its handler is the HTTP/2 one and every session it opened
    negotiated h2 by ALPN over TLS."""
    assert http["handler"] == "NodeHttp2Handler" and http["handlerProtocol"] == "h2", http
    assert http["sessions"], http
    assert all(s["alpnProtocol"] == "h2" and s["encrypted"] for s in http["sessions"]), http["sessions"]


def create_stream(js, hint: str, shards: int) -> str:
    name = stream_name(hint)
    assert js("create", {"StreamName": name, "ShardCount": shards})["StreamStatus"] == "ACTIVE"
    return name


def test_js_put_records_are_read_back_by_the_native_client_and_by_js_get_records(cluster, js):
    name = create_stream(js, "js-records", 2)
    sent = [(f"key-{i}", i.to_bytes(2, "big") + bytes(range(256))[i % 256:] + bytes(range(256)) * 2
             + b"\x00\xff\r\n" * (i % 5)) for i in range(300)]       # (a shard's records: over 64 KiB)
    sent += [("ключ-ü", b"\x00"), ("low", b"to shard 0"), ("high", b"to shard 1")]
    hash_keys = {"low": "0", "high": str(2 ** 128 - 1)}
    request = [{"PartitionKey": k, "Data": base64.b64encode(d).decode()} for k, d in sent]
    for entry in request:
        if entry["PartitionKey"] in hash_keys:
            entry["ExplicitHashKey"] = hash_keys[entry["PartitionKey"]]
    put = js("put", {"StreamName": name, "Records": request})
    assert put["FailedRecordCount"] == 0 and len(put["Records"]) == len(sent)
    acked = {k: (r["ShardId"], r["SequenceNumber"]) for (k, _d), r in zip(sent, put["Records"])}
    assert acked["low"][0] == shard_id(0) and acked["high"][0] == shard_id(1)
    assert len({sn for _shard, sn in acked.values()}) == len(sent)

    # the native client: every record, with the data and the sequence number the SDK was told
    with sms.Client(cluster.address) as native:
        native_by_shard: dict[str, list[tuple[str, str, bytes]]] = {shard_id(0): [], shard_id(1): []}
        for record in native.read_stream(name):
            native_by_shard[shard_id(record.partition_ordinal)].append(
                (record.sequence_number, record.partition_key, record.data))
    assert sorted(r for rs in native_by_shard.values() for r in rs) == sorted(
        (acked[k][1], k, d) for k, d in sent)
    assert all(acked[k] == (shard, sn) for shard, rs in native_by_shard.items() for sn, k, _d in rs)
    assert all(rs for rs in native_by_shard.values())             # (both shards have records)

    # the SDK's GetRecords, shard by shard: the same records in the same order as the native
    # read, in pages of 50, and in one page of each shard (an answer over HTTP/2's initial
    # flow-control window of 64 KiB: sent on as the SDK's WINDOW_UPDATEs come)
    for limit in (50, None):
        got = js("get", {"StreamName": name, "ShardIds": [shard_id(0), shard_id(1)], "Limit": limit})["Shards"]
        for shard, records in native_by_shard.items():
            assert [(r["SequenceNumber"], r["PartitionKey"], base64.b64decode(r["Data"]))
                    for r in got[shard]] == records, f"GetRecords of {shard}, Limit {limit}"
            assert all(r["ApproximateArrivalTimestamp"] > 1_700_000_000_000 for r in got[shard])


class Subscriber:
    """`node kinesis_client.mjs subscribe` running: its JSON lines as they come (read by a
    thread, so node never blocks on a full pipe); closing its stdin stops it."""

    def __init__(self, env: dict[str, str], request: dict):
        self.proc = subprocess.Popen([NODE, str(JS_CLIENT), "subscribe", json.dumps(request)], env=env, cwd=JS_DIR,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict | None] = queue.Queue()
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, name="js-subscriber", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)          # (the process closed its stdout)

    def next(self, deadline: float, what: str) -> dict:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"timed out waiting for the JS subscriber's {what}") from None
        if line is None or line.get("event") == "error":
            self.proc.wait(timeout=10)
            raise AssertionError(f"the JS subscriber ended before its {what}: {line}\n{self.proc.stderr.read()}")
        return line

    def stop(self, timeout_s: float = 15) -> int:
        """Close its stdin (it aborts the subscription and prints its end); kill it when it
        does not exit in time. Its exit status."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise AssertionError("the JS subscriber did not exit once its stdin closed") from None
        self._reader.join(timeout=10)
        self.stderr = self.proc.stderr.read()
        self.proc.stderr.close()
        return self.proc.returncode


def test_js_subscribe_to_shard_over_http2_receives_records_written_while_open(cluster, js, js_env):
    name = create_stream(js, "js-push", 2)
    consumer = js("register", {"StreamName": name, "ConsumerName": "js-reader"})
    assert consumer["ConsumerStatus"] == "ACTIVE" and consumer["ConsumerARN"].startswith(consumer["StreamARN"])
    subscriber = Subscriber(js_env, {"ConsumerARN": consumer["ConsumerARN"], "ShardId": shard_id(0),
                                     "StartingPosition": {"Type": "LATEST"}, "TimeoutMs": 60_000})
    try:
        started = subscriber.next(time.monotonic() + 30, "start")
        assert started["event"] == "started", started
        assert_http2(started["http"])          # SubscribeToShard itself went over HTTP/2

        # written while the subscription is open: by the native client, to both shards
        written = []
        with sms.Client(cluster.address) as native:
            for i in range(40):
                data = f"pushed {i} ".encode() + bytes([i, 0, 255 - i])
                result = native.put_record(name, data, f"push-{i}")
                written.append((result.partition_ordinal, result.sequence_number, f"push-{i}", data))
        expected = [(sn, key, data) for ordinal, sn, key, data in written if ordinal == 0]
        assert expected and len(expected) < len(written)        # (both shards were written)

        received, continuations = [], []
        deadline = time.monotonic() + 30
        while len(received) < len(expected):
            line = subscriber.next(deadline, f"records ({len(received)} of {len(expected)} so far)")
            assert line["event"] == "records", line
            received += [(r["SequenceNumber"], r["PartitionKey"], base64.b64decode(r["Data"])) for r in line["Records"]]
            continuations.append(line["ContinuationSequenceNumber"])
        assert received == expected               # every record of shard 0, in order, nothing else
        assert continuations[-1] == expected[-1][0]
    finally:
        status = subscriber.stop()
    end = list(iter(subscriber.lines.get_nowait, None))
    assert status == 0, f"the JS subscriber exited {status}: {end}\n{subscriber.stderr}"
    assert end and end[-1]["event"] == "end" and end[-1]["reason"] == "stdin closed", end
    assert end[-1]["received"] == len(expected)
    assert_http2(end[-1]["http"])
