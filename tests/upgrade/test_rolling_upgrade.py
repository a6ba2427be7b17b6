"""A rolling upgrade from the previous release to this checkout, under load, and a
downgrade refused (issue 35; docs/operations.md, "Upgrades").

The previous release (`releases.PREVIOUS_RELEASE`, a tag of this repository) is extracted
from git and built in a temporary directory (tests/upgrade/releases.py). A cluster of it
(two control processes, three storage nodes, the embedded metadata store, TLS as `sms up`)
takes a stream of replication factor 3 while producers of this checkout's client write
and a consumer tails it for the whole run. Then, as the documented procedure says, each
process in turn is stopped with SIGTERM (it must exit 0) and started on this checkout's
code with the same id and data directory, and the next one waits until every chain is
whole again (the three storage nodes, the replaced one at its new address, no learner),
this checkout's `sms status` says so, and 300 more records are acknowledged. Both orders
run: the storage nodes first, then the controls (the documented one), and the controls
first. While both releases hold chains, the test waits until a chain has a node of each
release forwarding to one of the other (old -> new when the replaced node joins as tail,
new -> old once the chain manager hands it a head role back), so replication and head
handoffs run across releases under load. Each process is checked to run the tree it
should (its working directory, the compiled codec it mapped).

At the end: every acknowledged record is read back exactly once, at the SN of its ack,
in each producer's per-key order, and the consumer saw a gap-free run of it
(tests/fault/history.py); writes resumed after every step; no process died or logged a
traceback (but for the peer-gone race named at PEER_GONE); every data directory carries
this checkout's format; the previous release's client (its CLI) writes, reads and shows
the status of the upgraded cluster.

The downgrade: a storage node's data directory in a format newer than the previous
release knows (this checkout's, or, while the two share a format, the next one's marker)
makes the previous release's node exit at start with one `DataFormatTooNew` line and its
directory untouched. (That this checkout refuses a directory of a later format is
tests/integration/test_data_format.py's `test_a_newer_format_is_refused_untouched`.)

Skipped, saying why, where the checkout has no git history or not the tag.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

import sms
from sms import errors
from sms.types import PartitionState, StreamInfo
from storage import dataformat
from tests.conftest import assert_all_alive, stream_name, wait_until
from tests.fault.history import check
from tests.fault.workload import Workload, read_back
from tests.upgrade.releases import (NEW, OLD, PREVIOUS_RELEASE, REPO_ROOT, MixedCluster, Release, build_release,
                                    find_release, probe, tree_prefix)

pytestmark = pytest.mark.integration

STORAGE_NODES = 3
CONTROLS = 2
PARTITIONS = 4
REPLICATION_FACTOR = 3
RATE_PER_S = 400                 # records submitted per second, over every producer
ACKS_PER_STEP = 300              # records acked after each step before the next one
ACK_TIMEOUT_S = 60.0
WHOLE_TIMEOUT_S = 90.0           # a replaced node back in every chain, none learning; a head handed back
NODE_STOP_TIMEOUT_S = 30.0       # SIGTERM: a storage node drains and deregisters
CLI_TIMEOUT_S = 60.0
REFUSAL_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
OLD_CLIENT_RECORDS = ("old-client-1", "old-client-2", "old-client-3")


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    commit, why = find_release(PREVIOUS_RELEASE)
    if commit is None:
        pytest.skip(f"the upgrade test needs the previous release's tag: {why}")
    started = time.monotonic()
    release = build_release(PREVIOUS_RELEASE, commit, str(tmp_path_factory.mktemp("release") / PREVIOUS_RELEASE))
    print(f"{release.tag} ({release.commit[:10]}) extracted and built in {time.monotonic() - started:.1f} s "
          f"({release.tree}): data format {release.data_format}, wire codec {release.codec}")
    assert probe(REPO_ROOT)["format"] == dataformat.CURRENT      # (this checkout's nodes import this checkout)
    assert dataformat.CURRENT >= release.data_format, f"this checkout cannot read {release.tag}'s data format"
    return release


@pytest.mark.parametrize("order", ["storage-first", pytest.param("controls-first", marks=pytest.mark.sweep)])
def test_a_rolling_upgrade_under_load_loses_nothing(previous: Release, tmp_path, order: str):
    cluster = MixedCluster(str(tmp_path / "cluster"), previous, nodes=STORAGE_NODES, controls=CONTROLS)
    storage_ids = [n for n in cluster.procs if n not in cluster.control_ids]
    steps = storage_ids + cluster.control_ids if order == "storage-first" else cluster.control_ids + storage_ids
    links: set[tuple[str, str]] = set()       # (release -> release) of chain neighbours seen
    took: dict[str, float] = {}
    with cluster:
        for node_id in cluster.procs:
            cluster.assert_runs(node_id)
        with sms.Client(cluster.address) as client:
            stream = stream_name("upgrade")
            client.create_stream(stream, partitions=PARTITIONS, replication_factor=REPLICATION_FACTOR)
            wait_until(lambda: whole(client, stream, storage_ids), WHOLE_TIMEOUT_S, f"{stream}'s chains whole")
            with pytest.raises(errors.SmsError, match="UNIMPLEMENTED"):    # (a call the previous release lacks)
                client.list_channels()
            controls = [cluster.procs[n].address for n in cluster.control_ids]
            with Workload(controls, stream, producers=3, keys=12, consumers=1, rate_per_s=RATE_PER_S) as load:
                load.wait_acks(ACKS_PER_STEP, ACK_TIMEOUT_S)
                for node_id in steps:
                    started = time.monotonic()
                    load.mark_fault(f"replace {node_id}")
                    code = cluster.replace(node_id, NODE_STOP_TIMEOUT_S)
                    assert code == 0, f"{node_id} of {previous.tag} exited with {code} on SIGTERM"
                    cluster.assert_runs(node_id)
                    replaced = cluster.procs[node_id] if node_id in storage_ids else None
                    wait_chains(lambda: whole(client, stream, storage_ids, replaced), client, stream, cluster,
                                f"{stream}'s chains whole after {node_id}'s replacement")
                    if {cluster.runs[n] for n in storage_ids} == {OLD, NEW}:
                        wait_chains(lambda: both_ways(client, stream, cluster, links), client, stream, cluster,
                                    f"a chain of {stream} replicating from each release to the other")
                    wait_until(lambda: status_whole(cluster, stream), CLI_TIMEOUT_S,
                               f"sms status showing {stream} whole after {node_id}'s replacement")
                    load.wait_acks(load.acked_count() + ACKS_PER_STEP, ACK_TIMEOUT_S)
                    assert_all_alive(cluster)
                    took[node_id] = round(time.monotonic() - started, 1)
                stats = load.stop(STOP_TIMEOUT_S)
            assert set(cluster.runs.values()) == {NEW}
            final = read_back(client, stream, history=load.history)
            assert client.list_channels() == []                # (now every node serves it)
            assert_old_client_works(cluster, client, previous)
        assert_all_alive(cluster)
    result = check(load.history, final)
    print(result.summary())
    print({k: v for k, v in stats.items() if k != "producers"})
    print(f"{order}: seconds per step {took}; links between releases seen {sorted(links)}")
    result.assert_ok()
    assert result.acked >= (len(steps) + 1) * ACKS_PER_STEP, result.summary()
    assert all(r.resumed for r in result.recoveries) and len(result.recoveries) == len(steps), result.summary()
    assert {(OLD, NEW), (NEW, OLD)} <= links, links
    for node_id in storage_ids:
        assert dataformat.read(storage_dir(cluster, node_id)) == dataformat.CURRENT, node_id
    assert_no_traceback(cluster)


def test_a_downgrade_onto_a_newer_format_is_refused_by_name(previous: Release, tmp_path):
    """A data directory this checkout wrote, given to the previous release's node."""
    cluster = MixedCluster(str(tmp_path / "cluster"), previous, nodes=1)
    cluster.runs = {node_id: NEW for node_id in cluster.runs}
    with cluster:
        with sms.Client(cluster.address) as client:
            client.create_stream("kept", partitions=2, replication_factor=1)
            client.put_records("kept", [(f"k{i}", f"v{i}".encode()) for i in range(50)])
    directory = storage_dir(cluster, "n1")
    newer = dataformat.read(directory)
    assert newer == dataformat.CURRENT
    if newer <= previous.data_format:      # (the two share a format: the next one's marker)
        newer = previous.data_format + 1
        with open(os.path.join(directory, dataformat.FILE), "w") as f:
            json.dump({"format": newer, "written_by": "a release after this checkout"}, f)
    before = fingerprint(directory)
    assert any(name.endswith("data.mdb") for name in before), before
    cluster.runs["n1"] = OLD
    cluster.spawn("n1")                    # (alone: the format is checked before anything else)
    proc = cluster.procs["n1"].proc
    try:
        code = proc.wait(timeout=REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{previous.tag} still running {REFUSAL_TIMEOUT_S} s after it started on a "
                             f"directory of format {newer}") from None
    with open(os.path.join(cluster.data_dir, "logs", "n1.out")) as f:
        said = f.read()
    assert code != 0, f"{previous.tag} started on a directory of format {newer}:\n{said}"
    lines = [line for line in said.splitlines() if "DataFormat" in line]
    assert len(lines) == 1 and lines[0].startswith("sms serve: DataFormatTooNew: ") and \
        f"in data format {newer}" in lines[0] and f"formats 1..{previous.data_format}" in lines[0], said
    assert "Traceback" not in said, said
    assert fingerprint(directory) == before


# --- what the steps check ------------------------------------------------------------------------
def whole(client: sms.Client, stream: str, storage_ids: list[str], replaced=None) -> StreamInfo | None:
    """The stream's description if every open partition's chain has every storage node
    (the replaced one at the address it serves now) and no learner."""
    info = client.get_stream_info(stream)
    for p in info.partitions:
        if p.state is PartitionState.CLOSED:
            continue
        members = {m.node_id: m.address for m in p.chain}
        if sorted(members) != sorted(storage_ids) or p.learners:
            return None
        if replaced is not None and members[replaced.node_id] not in (replaced.address, replaced.cluster_address):
            return None
    return info


def wait_chains(predicate, client: sms.Client, stream: str, cluster: MixedCluster, what: str) -> None:
    """wait_until, saying where each chain stands (members and their releases, learners,
    last changes) when it times out."""
    try:
        wait_until(predicate, WHOLE_TIMEOUT_S, what)
    except AssertionError as e:
        lines = [f"{p.partition_id} epoch {p.chain_epoch}: "
                 f"{' -> '.join(f'{m.node_id}({cluster.runs[m.node_id]})' for m in p.chain)} "
                 f"learners {[m.node_id for m in p.learners]} last changes {list(p.history)[-4:]}"
                 for p in client.get_stream_info(stream).partitions]
        raise AssertionError("\n".join([str(e), *lines])) from None


def both_ways(client: sms.Client, stream: str, cluster: MixedCluster, links: set[tuple[str, str]]) -> bool:
    """Adds to `links` the (predecessor's, successor's) releases of every chain's
    neighbours; whether both directions have been seen."""
    for p in client.get_stream_info(stream).partitions:
        ids = [m.node_id for m in p.chain]
        links.update((cluster.runs[a], cluster.runs[b]) for a, b in zip(ids, ids[1:]))
    return {(OLD, NEW), (NEW, OLD)} <= links


def sms_cli(tree: str, data_dir: str, *args: str) -> subprocess.CompletedProcess:
    """The `sms` command of `tree`'s release on the cluster of `data_dir`."""
    return subprocess.run(tree_prefix(tree) + [sys.executable, "-m", "node", *args, "--data-dir", data_dir],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


def status_whole(cluster: MixedCluster, stream: str) -> bool:
    """Whether this checkout's `sms status`, what the documented procedure watches, shows no
    partition short of replicas nor learning; it must work on the cluster as it is."""
    out = sms_cli(REPO_ROOT, cluster.data_dir, "status", "--json")
    assert out.returncode == 0, f"sms status ({cluster.runs}): {out.stdout}{out.stderr}"
    status = json.loads(out.stdout)
    described = next(s for s in status["streams"] if s["name"] == stream)
    return status["under_replicated"] == [] and all(not p["learners"] for p in described["partitions"])


def assert_old_client_works(cluster: MixedCluster, client: sms.Client, previous: Release) -> None:
    """The previous release's CLI (its client library) on the upgraded cluster: status,
    a put and a read of what it put."""
    client.create_stream("old-client", partitions=1, replication_factor=REPLICATION_FACTOR)
    for args in (("status",), ("put", "old-client", *OLD_CLIENT_RECORDS, "--key", "k"),
                 ("read", "old-client", "--json")):
        out = sms_cli(previous.tree, cluster.data_dir, *args)
        assert out.returncode == 0, f"{previous.tag}'s sms {' '.join(args)}: {out.stdout}{out.stderr}"
    read = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["data"] for r in read] == list(OLD_CLIENT_RECORDS), out.stdout
    assert [r.data.decode() for r in client.read_stream("old-client")] == list(OLD_CLIENT_RECORDS)


# A replication stream's server handler writing its acks after the sending peer went away or
# the server stopped (storage/peerlink.py IncomingLinks._write, in both releases): asyncio
# logs "Task exception was never retrieved" with the traceback. A shutdown race of every
# restart, not a message a node could not handle.
PEER_GONE = ("grpc._cython.cygrpc.ExecuteBatchError", "grpc._cython.cygrpc._ServerStoppedError")


def tracebacks(text: str) -> list[tuple[str, str]]:
    """Each traceback in a log: (the frames, the exception's line)."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith(" ")), len(lines) - 1)
            found.append(("\n".join(lines[max(0, i - 2):end]), lines[end]))
    return found


def assert_no_traceback(cluster: MixedCluster) -> None:
    """No process of either release logged a traceback (a message or an entry it could not
    handle), but for the peer-gone race above."""
    for path in sorted(glob.glob(os.path.join(cluster.data_dir, "logs", "*"))):
        with open(path, errors="replace") as f:
            text = f.read()
        for frames, exception in tracebacks(text):
            if "in ReplicateLinks" in frames and exception.startswith(PEER_GONE):
                continue
            raise AssertionError(f"{path}:\n{frames}\n{exception}")


def storage_dir(cluster: MixedCluster, node_id: str) -> str:
    return os.path.join(cluster.data_dir, node_id, "storage")


def fingerprint(directory: str) -> dict[str, tuple[int, int, str]]:
    """Every file under `directory`: (size, mtime, SHA-256)."""
    found = {}
    for parent, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(parent, name)
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            st = os.stat(path)
            found[os.path.relpath(path, directory)] = (st.st_size, st.st_mtime_ns, digest)
    return found
