"""Encryption at rest through real processes (kernel/encryption.py; docs/security.md).

One cluster (its master key file made by the launcher, DIR/tls/master.key) archives at once
(SMS_ARCHIVE_FLUSH_S=0) to a `file://` store. A stream created with
encryption="aes-256-gcm" stores every batch sealed: a marker put in its records (data,
partition key, header, producer id) is nowhere in the data directory or the archive store,
while the same marker in a stream stored in clear is found there (the search works). Every
reader gets the records as they were put: iterators, read_stream, get_record, a producer's
de-duplication rebuilt after a head restart, the archive. A stream updated to encrypt
seals what comes after, and still reads what came before; one updated back to "none"
still reads what was sealed. Rotating the master key re-wraps every data key and loses
nothing. Data directories are 0700 and files 0600.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys

import pytest

import sms
from kernel.encryption import write_key_file
from metastore import open_metastore
from sms import errors, limits, metadata
from tests.conftest import env_cluster, read_partition, stream_name, wait_until

pytestmark = pytest.mark.integration

ENV = {"SMS_ARCHIVE_FLUSH_S": "0", "SMS_ARCHIVE_CHECK_INTERVAL_S": "0.2"}
SECRET = b"TOPSECRET-7f3a9c"           # the marker searched for at rest


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with env_cluster(tmp_path_factory, ENV, "encryption-cluster") as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster):
    with sms.Client(cluster.address) as c:
        yield c


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("encryption-archive"))


def put_marked(client, stream: str, n: int, tag: str) -> list:
    """n records carrying the marker in their data, key and a header, through a producer
    (its id carries it too)."""
    with client.producer(stream, producer_id=f"{SECRET.decode()}-{tag}") as p:
        futures = [p.send(SECRET + f" {tag} {i}".encode(), f"{SECRET.decode()}-key-{i % 5}",
                          headers={"trace": SECRET + b"-h"}) for i in range(n)]
        return [f.result(timeout=limits.PUT_TIMEOUT_S) for f in futures]


def files_holding(root: str, needle: bytes) -> list[str]:
    found = []
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            try:
                with open(path, "rb") as f:
                    if needle in f.read():
                        found.append(path)
            except OSError:
                pass
    return found


def archived(client, stream: str, store_dir: str) -> bool:
    return any(stream in base and files for base, _d, files in os.walk(store_dir))


def test_nothing_of_an_encrypted_stream_rests_in_clear(cluster, client, store_dir):
    sealed_stream, clear_stream = stream_name("sealed"), stream_name("clear")
    archive = {"archive": f"file://{store_dir}", "archive_after_s": 1, "compression": "none"}
    info = client.create_stream(sealed_stream, partitions=2, replication_factor=3, encryption="aes-256-gcm",
                                **archive)
    assert info.encryption == "aes-256-gcm"
    client.create_stream(clear_stream, partitions=1, replication_factor=3, **archive)
    acked = put_marked(client, sealed_stream, 200, "sealed")
    with client.producer(clear_stream) as p:
        p.put(SECRET + b" in clear", "k")
    wait_until(lambda: archived(client, sealed_stream, store_dir) and archived(client, clear_stream, store_dir),
               30, "both streams archived")
    # every reader gets the records as they were put
    got = {r.sequence_number: r for o in (0, 1) for r in read_partition(client, sealed_stream, o)}
    assert len(got) == 200 and all(got[a.sequence_number].data.startswith(SECRET) for a in acked)
    one = client.get_record(sealed_stream, acked[7].sequence_number)
    assert one.data == SECRET + b" sealed 7" and one.headers == {"trace": SECRET + b"-h"}
    assert sum(1 for _ in client.read_stream(sealed_stream)) == 200
    # at rest: the clear stream's marker is found (the search works); the sealed one's is not
    clear_hits = files_holding(cluster.data_dir, SECRET + b" in clear") + files_holding(store_dir, SECRET + b" in clear")
    assert clear_hits, "the marker of the stream stored in clear is not found: the search does not work"
    sealed_hits = [p for p in files_holding(cluster.data_dir, SECRET) + files_holding(store_dir, SECRET)
                   if p not in clear_hits]
    assert sealed_hits == [], f"the encrypted stream's records rest in clear in {sealed_hits}"
    for needle in (b" sealed ", b"-key-", b"-h"):
        assert not [p for p in files_holding(cluster.data_dir, SECRET + needle) if p not in clear_hits]


def test_a_stream_updated_to_encrypt_keeps_reading_what_came_before(cluster, client):
    name = stream_name("update")
    client.create_stream(name, partitions=1, replication_factor=2)
    before = put_marked(client, name, 10, "before")
    info = client.update_stream(name, encryption="aes-256-gcm")
    assert info.encryption == "aes-256-gcm"
    # heads seal what they sequence once they read the change (ENCRYPTION_CONFIG_REFRESH_S)
    probes = iter(range(1_000))

    def sealed_now() -> bool:
        tag = f"probe{next(probes)}"
        put_marked(client, name, 1, tag)
        return not files_holding(cluster.data_dir, SECRET + f" {tag} ".encode())
    wait_until(sealed_now, 30, "new batches stored sealed")
    after = put_marked(client, name, 10, "after")
    assert not files_holding(cluster.data_dir, SECRET + b" after ")
    assert files_holding(cluster.data_dir, SECRET + b" before ")       # (stored before: in clear, as it was)
    client.update_stream(name, encryption="none")
    put_marked(client, name, 5, "clear-again")
    data = [r.data for r in read_partition(client, name, 0)]
    assert len(before + after) == 20 and len(data) >= 26
    assert data[:10] == [SECRET + f" before {i}".encode() for i in range(10)]
    assert all(SECRET + f" after {i}".encode() in data for i in range(10))
    assert data[-5:] == [SECRET + f" clear-again {i}".encode() for i in range(5)]


def test_a_restarted_head_rebuilds_its_dedup_table_from_sealed_batches(cluster, client):
    name = stream_name("dedup")
    info = client.create_stream(name, partitions=1, replication_factor=3, encryption="aes-256-gcm")
    head = info.partition(0).chain[0].node_id
    with client.producer(name, producer_id="sealed-dedup") as p:
        first = [p.put(f"r{i}".encode(), "k") for i in range(20)]
        cluster.kill(head)
        cluster.restart(head)
        more = [p.put(f"s{i}".encode(), "k") for i in range(20)]
    data = [r.data for r in read_partition(client, name, 0)]
    assert len(data) == 40 and len(set(data)) == 40 and all(r.sn for r in first + more)


def test_a_rebuilt_chain_and_a_split_work_on_sealed_batches(cluster, client):
    """Recovery and repartition on an encrypted stream: a member killed and restarted
    catches up from its predecessor's sealed batches (no key needed to copy them), a
    split makes children that seal under the same data key, and a reader across the
    lineage gets every record, once, in order per key, while nothing of it rests in clear
    on the restarted node."""
    name = stream_name("recovery")
    info = client.create_stream(name, partitions=1, replication_factor=3, encryption="aes-256-gcm")
    tail = info.partition(0).chain[-1].node_id
    first = put_marked(client, name, 30, "before-kill")
    cluster.kill(tail)
    during = put_marked(client, name, 30, "while-down")
    cluster.restart(tail)
    wait_until(lambda: len(client.get_stream_info(name).partition(0).chain) == 3, 60, "the chain whole again")
    client.split(name, 0)
    after = put_marked(client, name, 30, "after-split")
    read = list(client.read_stream(name))          # the lineage: parent to its end, then the children
    assert sorted(r.sn for r in read) == sorted(r.sn for r in first + during + after)
    assert {r.data for r in read} == {SECRET + f" {tag} {i}".encode()
                                      for tag in ("before-kill", "while-down", "after-split") for i in range(30)}
    node_dir = os.path.join(cluster.data_dir, tail)
    assert os.path.isdir(node_dir)
    for tag in ("before-kill", "while-down", "after-split"):      # (other tests' clear streams hold SECRET)
        assert not files_holding(node_dir, SECRET + f" {tag}".encode()), tag


def test_rotating_the_master_key_rewraps_every_data_key(cluster, client):
    name = stream_name("rotate")
    client.create_stream(name, partitions=1, replication_factor=2, encryption="aes-256-gcm")
    put_marked(client, name, 5, "old-master")
    before = _data_key_id(cluster, client, name)
    run = subprocess.run([sys.executable, "-m", "node", "key", "rotate-master", "--data-dir", cluster.data_dir,
                          "--json"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **cluster.client_env()})
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["new_key"] and answer["rewrapped"] >= 1
    after = _data_key_id(cluster, client, name)
    assert (before, after) == ("k1", answer["new_key"])
    put_marked(client, name, 5, "new-master")           # nodes read the new key file when they meet its id
    data = [r.data for r in read_partition(client, name, 0)]
    assert len(data) == 10 and all(d.startswith(SECRET) for d in data)
    # the old key can leave the file now: a node restarted on the new file still reads
    with open(cluster.master_key_file) as f:
        doc = json.load(f)
    doc["keys"] = {answer["new_key"]: doc["keys"][answer["new_key"]]}
    write_key_file(cluster.master_key_file, doc)
    for node_id in [n for n in cluster.procs if n.startswith("n")]:
        cluster.restart(node_id)
    wait_until(lambda: len([r for r in read_partition(client, name, 0)]) == 10, 60, "records read after restarts")


def _data_key_id(cluster, client, name: str) -> str:
    async def read() -> str:
        async with open_metastore(cluster.metastore) as store:
            entry = await store.get(metadata.stream_path(name))
            return metadata.StreamConfig.from_bytes(entry.value).data_key.partition(":")[0]
    return asyncio.run(read())


def test_bad_settings_are_named(client):
    with pytest.raises(errors.InvalidStreamConfig, match="encryption"):
        client.create_stream(stream_name("bad"), encryption="rot13")
    name = stream_name("bad-update")
    client.create_stream(name, partitions=1, replication_factor=1)
    with pytest.raises(errors.InvalidStreamConfig, match="encryption"):
        client.update_stream(name, encryption="des")


def _is_certificate(path: str) -> bool:
    """A public certificate (0644 by design: node/certs.py), not a private key."""
    if not path.endswith(".pem"):
        return False
    with open(path, "rb") as f:
        text = f.read()
    return b"BEGIN CERTIFICATE" in text and b"PRIVATE KEY" not in text


def test_data_directories_are_private(cluster):
    """The data directory is its owner's only (0700), and so is everything in it but the
    public certificates and the directory of the node certificates: records, logs, keys,
    tokens, cluster.json, the master key file."""
    assert stat.S_IMODE(os.stat(cluster.data_dir).st_mode) == 0o700
    certificate_dirs = {os.path.join(cluster.data_dir, "tls", "nodes")}
    bad = []
    for base, dirs, files in os.walk(cluster.data_dir):
        for d in dirs:
            path = os.path.join(base, d)
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & 0o077 and path not in certificate_dirs:
                bad.append(f"{path} {oct(mode)}")
        for f in files:
            path = os.path.join(base, f)
            if os.path.islink(path) or _is_certificate(path):
                continue
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & 0o077:
                bad.append(f"{path} {oct(mode)}")
    assert any(f.endswith("data.mdb") for _b, _d, files in os.walk(cluster.data_dir) for f in files), \
        "the walk found the LMDB files"
    assert bad == [], "readable by others:\n" + "\n".join(bad[:20])
