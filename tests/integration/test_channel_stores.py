"""Channels and their stores (issue 34; delivery/destinations.py, docs/channels.md): `s3://`
against moto's S3 server, a store that becomes unavailable and comes back, and a store that
fills up and is given room. Real nodes, a real moto process, a real tmpfs (root only).

In each, the channel's partitions show the failure as their error while it lasts (and the
records wait in the stream: the channel is a registered consumer), then deliver every
record exactly once when the store is back.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import uuid

import pytest

from sms import limits
from tests.conftest import env_cluster, read_stream, wait_until
from tests.motoserver import MotoServer

pytestmark = pytest.mark.integration

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

DELIVERED_WITHIN_S = 60.0
ERROR_SHOWN_WITHIN_S = 30.0 + limits.CHANNEL_RETRY_S_MAX


@pytest.fixture(scope="module")
def moto():
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def aws_cluster(tmp_path_factory, moto):
    """A cluster whose nodes (and this process) reach S3 at moto's server."""
    env = {"AWS_ENDPOINT_URL": moto.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    with env_cluster(tmp_path_factory, env, "channel-stores") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(aws_cluster):
    import sms
    with sms.Client(aws_cluster.address, **aws_cluster.client_options()) as c:
        yield c


def _put(client, stream: str, n: int, start: int = 0, size: int = 0) -> None:
    for lo in range(start, start + n, 250):
        batch = [{"data": (b"r%d-" % i) + (os.urandom(size) if size else b""), "partition_key": f"k{i}"}
                 for i in range(lo, min(start + n, lo + 250))]
        assert not client.put_records(stream, batch).failed_record_count


def _bucket_sns(moto, bucket: str, prefix: str = "") -> list[int]:
    s3 = moto.s3()
    sns = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            sns += [int(s) for s in pq.read_table(io.BytesIO(body)).column("sequence_number").to_pylist()]
    return sns


def _dir_sns(directory: str) -> list[int]:
    files = [f for f in glob.glob(f"{directory}/**/*.parquet", recursive=True) if "/." not in f]
    return [int(s) for f in files for s in pq.read_table(f, columns=["sequence_number"]).column(0).to_pylist()]


def _stream_sns(client, stream: str) -> list[int]:
    return sorted(r.sn for records in read_stream(client, stream).values() for r in records)


def _errors(client, name: str) -> list[str]:
    return [p.error for p in client.describe_channel(name).partitions if p.error]


def test_s3_destination_exactly_once(client, moto):
    bucket = f"chan-{uuid.uuid4().hex[:10]}"
    moto.s3().create_bucket(Bucket=bucket)
    client.create_stream("to-s3", partitions=2, replication_factor=3)
    ch = client.create_channel("to-s3", "s3-files", {"url": f"s3://{bucket}/lake", "compression": "GZIP",
                                                     "key_template": "{stream}/{partition}/dt={year}-{month}-{day}/"
                                                                     "{start}.parquet"}, data_freshness_s=1)
    assert ch.destination.url == f"s3://{bucket}/lake"
    _put(client, "to-s3", 2000)
    expected = _stream_sns(client, "to-s3")
    wait_until(lambda: sorted(_bucket_sns(moto, bucket)) == expected, DELIVERED_WITHIN_S,
               "every record in the bucket once")
    keys = [item["Key"] for item in moto.s3().list_objects_v2(Bucket=bucket)["Contents"]]
    assert all(k.startswith("lake/to-s3/p000") and "/dt=" in k for k in keys), keys
    body = moto.s3().get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    assert pq.ParquetFile(io.BytesIO(body)).metadata.row_group(0).column(0).compression == "GZIP"
    client.delete_channel("s3-files")
    client.delete_stream("to-s3")


def test_s3_unavailable_then_back(client, moto):
    """moto stops (connections refused): the error shows and records wait; a new moto with the
    bucket made again takes every record written since the last commit, once."""
    bucket = f"chan-{uuid.uuid4().hex[:10]}"
    moto.s3().create_bucket(Bucket=bucket)
    client.create_stream("s3-outage", partitions=1, replication_factor=3)
    client.create_channel("s3-outage", "outage", f"s3://{bucket}", data_freshness_s=1)
    _put(client, "s3-outage", 500)
    wait_until(lambda: len(_bucket_sns(moto, bucket)) == 500, DELIVERED_WITHIN_S, "the first 500 records")
    before = int(client.describe_channel("outage").partitions[0].position)
    moto.stop()
    try:
        _put(client, "s3-outage", 500, start=500)
        errors_ = wait_until(lambda: _errors(client, "outage"), ERROR_SHOWN_WITHIN_S, "the store's error shown")
        assert "ArchiveUnavailable" in errors_[0] and bucket in errors_[0], errors_
    finally:
        moto.start()                           # (an empty moto: what was delivered before is gone with it)
    moto.s3().create_bucket(Bucket=bucket)
    later = [sn for sn in _stream_sns(client, "s3-outage") if sn > before]
    assert len(later) == 500
    wait_until(lambda: sorted(_bucket_sns(moto, bucket)) == later, DELIVERED_WITHIN_S + limits.CHANNEL_RETRY_S_MAX,
               "the records since the outage in the bucket once")
    wait_until(lambda: not _errors(client, "outage"), 30, "the error cleared")
    client.delete_channel("outage")
    client.delete_stream("s3-outage")


def test_file_store_unavailable_then_back(client, tmp_path):
    """The destination's directory goes away (an unmounted share: a file in its place), then
    comes back: the error shows meanwhile; every record ends up there once."""
    out = tmp_path / "share" / "out"
    client.create_stream("file-outage", partitions=2, replication_factor=3)
    client.create_channel("file-outage", "share", f"file://{out}", data_freshness_s=1)
    _put(client, "file-outage", 400)
    wait_until(lambda: len(_dir_sns(str(out))) == 400, DELIVERED_WITHIN_S, "the first 400 records")
    aside = tmp_path / "aside"
    os.rename(tmp_path / "share", aside)
    (tmp_path / "share").write_bytes(b"not a directory")
    try:
        _put(client, "file-outage", 400, start=400)
        errors_ = wait_until(lambda: _errors(client, "share"), ERROR_SHOWN_WITHIN_S, "the store's error shown")
        assert "ArchiveUnavailable" in errors_[0], errors_
    finally:
        os.unlink(tmp_path / "share")
        os.rename(aside, tmp_path / "share")
    expected = _stream_sns(client, "file-outage")
    wait_until(lambda: sorted(_dir_sns(str(out))) == expected, DELIVERED_WITHIN_S + limits.CHANNEL_RETRY_S_MAX,
               "every record in the directory once")
    client.delete_channel("share")
    client.delete_stream("file-outage")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs")
def test_full_store_then_room(client, tmp_path):
    """The destination is a tmpfs of 1 MiB that fills: "is full" shows; given room, every
    record is delivered once."""
    out = tmp_path / "small"
    out.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(out)], check=True)
    try:
        client.create_stream("file-full", partitions=1, replication_factor=3)
        client.create_channel("file-full", "full", {"url": f"file://{out}", "compression": "NONE"},
                              data_freshness_s=1)
        _put(client, "file-full", 1000, size=2000)           # ~2 MB of incompressible data
        errors_ = wait_until(lambda: _errors(client, "full"), ERROR_SHOWN_WITHIN_S, "the store's error shown")
        assert "is full" in errors_[0], errors_
        subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)
        expected = _stream_sns(client, "file-full")
        wait_until(lambda: sorted(_dir_sns(str(out))) == expected, DELIVERED_WITHIN_S + limits.CHANNEL_RETRY_S_MAX,
                   "every record in the store once")
        assert not glob.glob(f"{out}/**/.*.tmp-*", recursive=True)     # (a failed put leaves no temp file)
        client.delete_channel("full")
        client.delete_stream("file-full")
    finally:
        subprocess.run(["umount", "-l", str(out)], check=False)
