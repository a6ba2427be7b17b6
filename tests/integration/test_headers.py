"""Record headers end to end: named attributes (name -> bytes) that a record carries from
every producing path (put_record, put_records, the de-duplicating producer, the CLI),
stored with it on every replica and read back by iterators, read_stream and `sms read`;
and a put whose headers break a limit is refused by name, storing nothing."""

from __future__ import annotations

import json

import pytest

from sms import errors, limits
from tests.conftest import read_stream
from tests.integration.test_cli import ok, sms_cmd

pytestmark = pytest.mark.integration


def _by_data(client, stream: str) -> dict[bytes, dict[str, bytes]]:
    return {r.data: r.headers for records in read_stream(client, stream).values() for r in records}


def test_headers_travel_from_every_put_path_and_read_back(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=2, replication_factor=3)
    client.put_record(unique_stream, b"one", "k1", headers={"trace-id": b"\x00\x01", "kind": "click"})
    out = client.put_records(unique_stream, [
        {"partition_key": "k2", "data": b"two", "headers": {"a": b"1", "b": b""}},
        ("k3", b"three", None, {"ünïcode-名": b"v"}),
        ("k4", b"plain"),
    ])
    assert out.failed_record_count == 0
    with client.producer(unique_stream, "headers-producer") as producer:
        producer.send(b"produced", "k5", headers={"via": b"producer"}).result(timeout=30)
        producer.send_batch([{"partition_key": "k6", "data": b"batched", "headers": {"via": b"batch"}}]) \
            .result(timeout=30)
    assert _by_data(client, unique_stream) == {
        b"one": {"trace-id": b"\x00\x01", "kind": b"click"},
        b"two": {"a": b"1", "b": b""},
        b"three": {"ünïcode-名": b"v"},
        b"plain": {},
        b"produced": {"via": b"producer"},
        b"batched": {"via": b"batch"},
    }
    streamed = {r.data: r.headers for r in client.read_stream(unique_stream)}
    assert streamed[b"one"] == {"trace-id": b"\x00\x01", "kind": b"click"}


def test_headers_are_stored_on_every_replica(cluster, client, unique_stream):
    client.create_stream(unique_stream, partitions=1, replication_factor=3)
    client.put_record(unique_stream, b"replicated", "k", headers={"h": b"v"})
    info = client.get_stream_info(unique_stream)
    for member in info.partition(0).chain:
        # each replica serves the record with its headers (reads pick a replica per call)
        it = client.get_iterator(unique_stream, 0, "TRIM_HORIZON")
        page = client.get_next_records(it, max_records=10)
        assert [r.headers for r in page.records] == [{"h": b"v"}], member


@pytest.mark.parametrize("headers, error", [
    ({"": b"v"}, errors.InvalidRecordHeader),
    ({"n" * (limits.RECORD_HEADER_NAME_BYTES_MAX + 1): b"v"}, errors.InvalidRecordHeader),
    ({f"h{i}": b"" for i in range(limits.RECORD_HEADERS_MAX + 1)}, errors.InvalidRecordHeader),
    ({"big": b"x" * limits.RECORD_HEADERS_BYTES_MAX}, errors.InvalidRecordHeader),
    ({"n": 7}, errors.InvalidRecordHeader),
    ([("n", b"v")], errors.InvalidRecordHeader),
])
def test_headers_over_their_limits_are_refused_by_name(cluster, client, unique_stream, headers, error):
    client.create_stream(unique_stream, partitions=1, replication_factor=1)
    with pytest.raises(error):
        client.put_record(unique_stream, b"refused", "k", headers=headers)
    with pytest.raises(error):
        client.put_records(unique_stream, [("ok", b"fine"), {"partition_key": "k", "data": b"x", "headers": headers}])
    with client.producer(unique_stream, "bad-headers") as producer:
        with pytest.raises(error):
            producer.send(b"refused", "k", headers=headers)
    assert _by_data(client, unique_stream) == {}


def test_cli_puts_and_shows_headers(cluster, client, unique_stream):
    data_dir = cluster.data_dir
    ok(sms_cmd(data_dir, "stream", "create", unique_stream, "--partitions", "1", "--replication-factor", "1"))
    ok(sms_cmd(data_dir, "put", unique_stream, "hello", "--key", "k", "--header", "source=cli",
               "--header", "empty="))
    lines = ok(sms_cmd(data_dir, "read", unique_stream, "--json")).splitlines()
    assert [json.loads(line)["headers"] for line in lines] == [{"source": "cli", "empty": ""}]
    human = ok(sms_cmd(data_dir, "read", unique_stream))
    assert "[source=cli, empty=]" in human
    bad = sms_cmd(data_dir, "put", unique_stream, "x", "--header", "no-equals-sign")
    assert bad.returncode != 0 and "InvalidRecordHeader" in bad.stdout + bad.stderr
