"""Every node's Prometheus endpoint (node/metrics.py, kernel/metrics.py) on a real cluster:
scraped over HTTPS with the cluster CA (plain HTTP on a plaintext cluster), its address
in the node's registration and cluster.json, and its figures equal to what was done:
records and bytes written per partition, records read, errors by name, each replica's
epoch and records, LMDB and disk sizes, de-dup tables, the chains as the control leader
sees them, and a channel's delivery on the node that delivers it (its partition's head),
failing while its destination cannot be written."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sms
from node.launcher import LocalCluster
from tests.conftest import env_cluster
from sms import errors

pytestmark = pytest.mark.integration

SCRAPE_TIMEOUT_S = 10
STREAM = "metered"
PARTITIONS = 2
RECORDS = 300


def scrape(url: str, ca_file: str = "", token: str = "") -> dict[str, list]:
    """{sample name: [(labels, value)]} of one scrape (`token`: a key that may read
    /metrics, which a secure node wants: node/metrics.py)."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    text = urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context,
                                  timeout=SCRAPE_TIMEOUT_S).read().decode()
    out: dict[str, list] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((sample.labels, sample.value))
    return out


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for have, v in samples.get(name, []) if all(have.get(k) == x for k, x in labels.items()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # consumer lag computed every second, not every ten (node/config.py metrics.lag_refresh_s):
    # the lag tests wait for it five times
    with env_cluster(tmp_path_factory, {"SMS_METRICS_LAG_REFRESH_S": "1"}, "metrics", nodes=3) as c:
        yield c


@pytest.fixture(scope="module")
def worked(cluster):
    """A stream written (in three calls) and read back whole, and one failing call."""
    with sms.Client(cluster.address, **cluster.client_options()) as client:
        client.create_stream(STREAM, partitions=PARTITIONS, replication_factor=2)
        sent = [(f"key-{i}", b"v" * (i % 7 + 1)) for i in range(RECORDS)]
        for i in range(0, RECORDS, 100):
            client.put_records(STREAM, sent[i:i + 100])
        read = sum(1 for _ in client.read_stream(STREAM))
        with pytest.raises(errors.StreamNotFound):
            client.put_records("no-such-stream", [("k", b"v")])
    return sent, read


def scrapes(cluster) -> dict[str, dict]:
    return {node_id: scrape(f"https://{node.metrics_address}/metrics", cluster.ca_file, cluster.admin_token)
            for node_id, node in cluster.procs.items()}


def test_addresses_are_registered_and_in_cluster_json(cluster):
    with open(os.path.join(cluster.data_dir, "cluster.json")) as f:
        listed = {n["node_id"]: n["metrics_address"] for n in json.load(f)["nodes"]}
    assert listed == {node_id: node.metrics_address for node_id, node in cluster.procs.items()}
    assert all(a and a.rsplit(":", 1)[1] != "0" for a in listed.values()), listed
    with sms.Client(cluster.address, **cluster.client_options()) as client:
        registered = {n.node_id: n.metrics_address for n in client.describe_cluster().nodes}
    assert registered == listed


def test_it_is_https_with_the_cluster_ca(cluster):
    node = cluster.procs["n1"]
    with pytest.raises(urllib.error.URLError) as e:
        urllib.request.urlopen(f"https://{node.metrics_address}/metrics", timeout=SCRAPE_TIMEOUT_S)
    assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    assert scrape(f"https://{node.metrics_address}/metrics", cluster.ca_file, cluster.admin_token)["sms_node_info"]


def test_writes_reads_and_errors_are_counted(cluster, worked):
    sent, read = worked
    assert read == RECORDS
    by_node = scrapes(cluster)
    written = sum(total(s, "sms_put_records_total", stream=STREAM) for s in by_node.values())
    assert written == RECORDS, {n: s.get("sms_put_records_total") for n, s in by_node.items()}
    per_partition = defaultdict(float)
    for s in by_node.values():
        for labels, v in s.get("sms_put_records_total", []):
            if labels["stream"] == STREAM:
                per_partition[labels["partition"]] += v
    assert len(per_partition) == PARTITIONS
    assert sum(total(s, "sms_put_bytes_total", stream=STREAM) for s in by_node.values()) == \
        sum(len(k) + len(v) for k, v in sent)
    assert sum(total(s, "sms_read_records_total", stream=STREAM) for s in by_node.values()) >= RECORDS
    assert sum(total(s, "sms_commit_seconds_count", stream=STREAM) for s in by_node.values()) >= 3
    assert sum(total(s, "sms_rpc_errors_total", error="StreamNotFound") for s in by_node.values()) >= 1
    storage = [s for n, s in by_node.items() if n.startswith("n")]
    assert sum(total(s, "sms_storage_commit_seconds_count", persistence="disk") for s in storage) >= 1


def test_what_nodes_hold_is_read_at_scrape_time(cluster, worked):
    by_node = scrapes(cluster)
    storage = {n: s for n, s in by_node.items() if n.startswith("n")}
    # each partition: replication factor 2, so two replicas, one head, each holding every record
    replicas = defaultdict(list)
    for s in storage.values():
        for labels, v in s.get("sms_replica_records", []):
            if labels["stream"] == STREAM:
                replicas[labels["partition"]].append(v)
    assert len(replicas) == PARTITIONS and all(len(v) == 2 for v in replicas.values()), replicas
    assert sum(max(v) for v in replicas.values()) == RECORDS
    heads = [labels for s in storage.values() for labels, _v in s.get("sms_replica_epoch", [])
             if labels["stream"] == STREAM and labels["role"] == "head"]
    assert len(heads) == PARTITIONS
    assert all(total(s, "sms_lmdb_used_bytes") > 0 and total(s, "sms_disk_free_bytes") > 0
               for s in storage.values())
    assert sum(len([x for x in s.get("sms_dedup_entries", []) if x[0]["stream"] == STREAM])
               for s in storage.values()) == PARTITIONS       # one table per partition, on its head
    control = by_node["control"]
    for name, want in (("sms_chain_members", 2), ("sms_chain_replication_factor", 2), ("sms_chain_learners", 0)):
        values = [v for labels, v in control.get(name, []) if labels["stream"] == STREAM]
        assert values == [want] * PARTITIONS, (name, control.get(name))
    assert total(control, "sms_scrape_errors_total") == 0


def test_a_plaintext_cluster_serves_plain_http(tmp_path):
    with LocalCluster(str(tmp_path), nodes=1, tls=False) as cluster:
        samples = scrape(f"http://{cluster.procs['n1'].metrics_address}/metrics")
    assert [labels for labels, _v in samples["sms_node_info"]] == [{"node": "n1",
                                                                     "roles": "storage,ingestion,retrieval"}]


def test_counters_move_under_load(cluster, worked):
    """Scraped while a producer writes: the head's counters rise between two scrapes."""
    import threading

    stop = threading.Event()

    def load() -> None:
        with sms.Client(cluster.address, **cluster.client_options()) as client:
            i = 0
            while not stop.is_set():
                client.put_records(STREAM, [(f"load-{i}-{j}", b"x" * 20) for j in range(50)])
                i += 1

    writer = threading.Thread(target=load, daemon=True)
    writer.start()
    try:
        def written() -> float:
            return sum(total(s, "sms_put_records_total", stream=STREAM) for s in scrapes(cluster).values())
        first = written()
        from tests.conftest import wait_until
        wait_until(lambda: written() >= first + 500, 60, "sms_put_records_total rising under load")
        commits = sum(total(s, "sms_storage_commit_seconds_count") for s in scrapes(cluster).values())
        wait_until(lambda: sum(total(s, "sms_storage_commit_seconds_count") for s in scrapes(cluster).values())
                   > commits, 60, "LMDB commits counted under load")
    finally:
        stop.set()
        writer.join(timeout=60)


def test_times_are_seconds_and_no_created_series(cluster, worked):
    """Prometheus's conventions: gauges of time in seconds, no `_created` series; and a TLS
    node says when its certificate and its CA expire."""
    import time as _time
    from cryptography import x509
    for node_id, samples in scrapes(cluster).items():
        assert not [n for n in samples if n.endswith("_created")], node_id
        assert not [n for n in samples if n.startswith("sms_") and n.endswith("_ms")], node_id
        expiry = {labels["certificate"]: v for labels, v in samples.get("sms_tls_certificate_expiry_timestamp_seconds", [])}
        with open(cluster.ca_file, "rb") as f:
            ca_expiry = x509.load_pem_x509_certificate(f.read()).not_valid_after_utc.timestamp()
        assert expiry["ca"] == ca_expiry and expiry["node"] > _time.time(), (node_id, expiry)
    storage = [s for n, s in scrapes(cluster).items() if n.startswith("n")]
    firsts = [v for s in storage for labels, v in s.get("sms_replica_local_first_timestamp_seconds", [])
              if labels["stream"] == STREAM]
    assert firsts and all(_time.time() - 3600 < v <= _time.time() for v in firsts), firsts


def test_consumer_lag_on_each_head(cluster):
    """A registered consumer's lag per partition, on the partition's head: every record,
    then what is left after a checkpoint mid-partition, then none."""
    from tests.conftest import wait_until

    stream = "lagging"
    with sms.Client(cluster.address, **cluster.client_options()) as client:
        client.create_stream(stream, partitions=1, replication_factor=2)
        client.put_records(stream, [(f"k{i}", b"v") for i in range(100)])
        client.register_consumer(stream, "audit")
        records = list(client.read_stream(stream))

        def lag() -> list[tuple[dict, float]]:
            return [(labels, v) for s in scrapes(cluster).values() for labels, v in s.get("sms_consumer_lag_records", [])
                    if labels["stream"] == stream]
        wait_until(lambda: [v for _l, v in lag()] == [100], 30, f"a lag of 100 on the head: {lag()}")
        (labels, _v), = lag()
        assert labels == {"stream": stream, "partition": "p0000", "consumer": "audit", "kind": "consumer"}
        client.checkpoint_consumer(stream, "audit", {0: records[59].sn})
        wait_until(lambda: [v for _l, v in lag()] == [40], 30, f"a lag of 40 after the checkpoint: {lag()}")
        client.checkpoint_consumer(stream, "audit", {0: records[-1].sn})
        wait_until(lambda: [v for _l, v in lag()] == [0], 30, f"no lag: {lag()}")

        # a consumer group: its lease's checkpoint, once it has read everything
        with client.consumer(stream, "billing") as consumer:
            got = 0
            for batch in consumer:
                got += len(batch.records)
                if got >= 100:
                    break

        def group_lag() -> list[float]:
            return [v for labels, v in lag() if labels["kind"] == "group" and labels["consumer"] == "billing"]
        wait_until(lambda: group_lag() == [0], 30, f"the group's lag 0 once it checkpointed: {lag()}")
        client.put_records(stream, [(f"more{i}", b"v") for i in range(7)])
        wait_until(lambda: group_lag() == [7], 30, f"the group's lag 7 after 7 more records: {lag()}")


def test_a_channel_on_the_head_that_delivers_it(cluster, tmp_path):
    """A channel's partition is delivered by the partition's head: its records delivered,
    commits and lag there, labelled channel, stream, partition; a channel whose
    destination cannot be written (its directory's parent is a regular file) is failing,
    its failures counted."""
    from tests.conftest import wait_until

    stream, records = "channelled", 120
    with sms.Client(cluster.address, **cluster.client_options()) as client:
        client.create_stream(stream, partitions=1, replication_factor=2)
        client.put_records(stream, [(f"k{i}", b"v") for i in range(records)])
        client.create_channel(stream, "metered-files", f"file://{tmp_path / 'out'}", data_freshness_s=1)
        head = client.get_stream_info(stream).partition(0).chain[0].node_id
        node = cluster.procs[head]

        def on_head() -> dict:
            return scrape(f"https://{node.metrics_address}/metrics", cluster.ca_file, cluster.admin_token)

        def of(samples: dict, name: str, channel: str) -> list[tuple[dict, float]]:
            return [(labels, v) for labels, v in samples.get(name, []) if labels["channel"] == channel]

        samples = wait_until(lambda: (lambda s: s if total(s, "sms_channel_records_total", channel="metered-files")
                                      == records else None)(on_head()),
                             60, f"sms_channel_records_total {records} on the head {head}")
        assert sum(p.records for p in client.describe_channel("metered-files").partitions) == records
        want = {"channel": "metered-files", "stream": stream, "partition": "p0000"}
        for name in ("sms_channel_records_total", "sms_channel_commits_total", "sms_channel_lag_seconds",
                     "sms_channel_dead_letters_total", "sms_channel_failures_total",
                     "sms_channel_last_commit_timestamp_seconds", "sms_channel_failing"):
            assert [labels for labels, _v in of(samples, name, "metered-files")] == [want], (name, samples.get(name))
        assert [v for _l, v in of(samples, "sms_channel_failing", "metered-files")] == [0]
        assert [v for _l, v in of(samples, "sms_channel_failures_total", "metered-files")] == [0]
        assert [v for _l, v in of(samples, "sms_channel_dead_letters_total", "metered-files")] == [0]
        assert total(samples, "sms_channel_commits_total", channel="metered-files") >= 1
        assert total(samples, "sms_channel_last_commit_timestamp_seconds", channel="metered-files") > 0
        assert total(samples, "sms_channel_lag_seconds", channel="metered-files") >= 0
        # only the head delivers it
        others = {n: of(s, "sms_channel_records_total", "metered-files") for n, s in scrapes(cluster).items()
                  if n != head}
        assert all(v == [] for v in others.values()), others

        blocker = tmp_path / "blocker"
        blocker.write_bytes(b"not a directory")
        client.create_channel(stream, "metered-broken", f"file://{blocker}/out", data_freshness_s=1)

        def broken() -> dict | None:
            s = on_head()
            failing = [v for _l, v in of(s, "sms_channel_failing", "metered-broken")]
            return s if failing == [1] and total(s, "sms_channel_failures_total", channel="metered-broken") > 0 \
                else None
        samples = wait_until(broken, 60, f"metered-broken failing on the head {head}")
        assert [labels for labels, _v in of(samples, "sms_channel_failing", "metered-broken")] == [
            {"channel": "metered-broken", "stream": stream, "partition": "p0000"}]
        assert total(samples, "sms_channel_records_total", channel="metered-broken") == 0
        assert [v for _l, v in of(samples, "sms_channel_failing", "metered-files")] == [0]
        error = wait_until(lambda: "".join(p.error for p in client.describe_channel("metered-broken").partitions),
                           30, "metered-broken's error recorded")
        assert "ArchiveUnavailable" in error, error
        for name in ("metered-broken", "metered-files"):
            client.delete_channel(name)


def test_a_silent_client_does_not_stop_the_others(cluster):
    """A connection that never starts its TLS handshake holds only its own thread: scrapes
    go on meanwhile."""
    import socket

    node = cluster.procs["n1"]
    host, port = node.metrics_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=SCRAPE_TIMEOUT_S):
        assert scrape(f"https://{node.metrics_address}/metrics", cluster.ca_file, cluster.admin_token)["sms_node_info"]


def test_a_restarted_node_keeps_its_metrics_address(cluster):
    """Prometheus's targets stay right: `sms up` restarts a node on its metrics address, and a
    node on a port of its choosing serves /metrics on that port + METRICS_PORT_OFFSET."""
    from node.server import metrics_listen_for
    assert metrics_listen_for("10.0.0.1:7401") == "10.0.0.1:8401"
    assert metrics_listen_for("10.0.0.1:0") == "10.0.0.1:0"
    assert metrics_listen_for("[::1]:65000") == "[::1]:0"                 # (past the last port: any)
    before = cluster.procs["n3"].metrics_address
    cluster.restart("n3")
    assert cluster.procs["n3"].metrics_address == before
    assert "sms_node_info" in scrape(f"https://{before}/metrics", cluster.ca_file, cluster.admin_token)
