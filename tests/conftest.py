"""Shared fixtures of the integration tests: a real local cluster, a client, polling.

`cluster` is one `LocalCluster` (control + 3 storage nodes, separate processes, real
LMDB, gRPC over loopback) per test module, always stopped at teardown; tests share it
by using unique stream names (`unique_stream`). `make_cluster` starts a dedicated
cluster for a test that stops, pauses or restarts processes. `wait_until` polls a
predicate against a deadline: no test sleeps and hopes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest
from hypothesis import settings

import sms
from node.launcher import LocalCluster
from sms import security
from sms.types import Record
from tests import credentials

# No per-example deadlines (a loaded 2-core CI machine trips them) and a fixed seed
# sequence, so a run is repeatable; a failure still prints its falsifying example.
settings.register_profile("sms", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("sms")


def _no_local_constants() -> None:
    """Hypothesis (6.131 on) mixes constants from the project's own modules that are
    imported at that moment into what it draws: what a derandomized test generates then
    depends on which other test modules ran first in the same process (xdist's split, -k,
    the file order) and on every edit of the engine's source. Tests that count what a
    generator reaches (tests/unit/test_wire_differential.py's mutation guards, the
    check_records tally) passed or failed by that. Without the pool, a derandomized test
    draws the same examples in any run."""
    try:
        from hypothesis.internal.conjecture import providers
        empty = providers.Constants()
    except (ImportError, AttributeError):
        return                     # (a Hypothesis without the pool, or that moved it)
    if hasattr(providers, "_get_local_constants"):
        providers._get_local_constants = lambda: empty


_no_local_constants()

CLUSTER_NODES = 3
POLL_INTERVAL_S = 0.02
_SESSION_CA_DIR = ""


def pytest_configure(config) -> None:
    """Every cluster of the run is a TLS cluster (secure by default, as `sms up`), its
    node certificates issued by one CA made for this run: $SMS_CA_DIR tells each
    LocalCluster to issue from it, and $SMS_CA_FILE makes every client, in this process
    and in the ones it starts (workers, the CLI, Spark), trust it (sms/security.py);
    every cluster's first admin key has one token, which every client presents
    (tests/credentials.py)."""
    global _SESSION_CA_DIR
    _SESSION_CA_DIR = credentials.make()


def pytest_unconfigure(config) -> None:
    credentials.remove(_SESSION_CA_DIR)


# --- the slowest modules first --------------------------------------------------------------
# Under pytest-xdist (--dist loadfile) a module goes whole to the next free worker, in the
# order collected: the long ones are started first, so that no worker is left with one at
# the end while the others idle. (Measured times: docs/testing.md; the order only matters
# for the wall time, never for a result.)
SLOW_MODULES_FIRST = (
    "tests/netfault/test_netfault.py", "tests/sim/test_chain_sim.py", "tests/diskfault/test_diskfault.py",
    "tests/integration/test_sps_workers.py", "tests/fault/test_failover.py", "tests/integration/test_metrics.py",
    "tests/integration/test_spark_connector.py", "tests/integration/test_sps_state.py",
    "tests/fault/test_repartition_faults.py", "tests/integration/test_archive_faults.py",
    "tests/integration/test_cli.py", "tests/integration/test_rebalance.py", "tests/integration/test_retention.py",
    "tests/integration/test_spark_engine.py", "tests/integration/test_clickstream_example.py",
    "tests/upgrade/test_rolling_upgrade.py", "tests/netfault/test_deployment.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {path: i for i, path in enumerate(SLOW_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))   # (stable: the rest keep their order)


# --- the suite's time budget (docs/testing.md) ------------------------------------------------
# $SMS_SUITE_BUDGET_S (the Makefile sets it for `make test`): a run that takes longer fails,
# with its slowest tests printed, so that CI's time is held where a change makes it grow.
ENV_SUITE_BUDGET = "SMS_SUITE_BUDGET_S"
SLOWEST_PRINTED = 25
_suite_started = time.monotonic()
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:
    # (under pytest-xdist the controller gets every worker's reports: this sees them all)
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus) -> None:
    budget = os.environ.get(ENV_SUITE_BUDGET)
    if not budget or hasattr(session.config, "workerinput"):      # (an xdist worker: the controller judges)
        return
    took = time.monotonic() - _suite_started
    if took <= float(budget):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"the suite took {took:.0f}s, past its budget of {float(budget):.0f}s (${ENV_SUITE_BUDGET}); "
             f"the {SLOWEST_PRINTED} slowest tests (setup, call and teardown):"]
    for nodeid, seconds in sorted(_durations.items(), key=lambda kv: -kv[1])[:SLOWEST_PRINTED]:
        lines.append(f"  {seconds:7.1f}s  {nodeid}")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("=", "over the time budget", red=True)
        for line in lines:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
             grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of a channel."""

    def __init__(self, token: str):
        self.header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        return details._replace(metadata=list(details.metadata or ()) + [self.header])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


def client_channel(address: str, options: list | None = None, token: str | None = None) -> grpc.Channel:
    """A raw synchronous channel to a node's client port, as a client reaches it: TLS
    with the run's CA ($SMS_CA_FILE) and the key's token ($SMS_TOKEN) on every call;
    plaintext and no token when the CA is ""."""
    tls = security.TlsConfig.resolve()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    channel = grpc.secure_channel(address, tls.channel_credentials(), options=options)
    token = security.resolve_token(token)
    return grpc.intercept_channel(channel, _Token(token)) if token else channel


def node_channel(cluster: LocalCluster, address: str, node_id: str = "test-node",
                 options: list | None = None) -> grpc.Channel:
    """A raw synchronous channel to the cluster port of the node whose client port is
    `address`, presenting a node certificate of the run's CA for `node_id`: a test
    speaking the cluster's own protocols as a member would."""
    node = next(n for n in cluster.procs.values() if address in (n.address, n.cluster_address))
    if not cluster.tls:
        return grpc.insecure_channel(node.address, options=options)
    from node import certs
    issued = certs.ensure_node_cert(cluster.ca_dir, os.path.join(cluster.data_dir, "tls", "callers"), node_id)
    tls = security.TlsConfig.from_files(cluster.ca_file, issued.cert_file, issued.key_file)
    return grpc.secure_channel(node.cluster_address, tls.channel_credentials(),
                               options=(options or []) + [("grpc.ssl_target_name_override",
                                                           security.NODE_TARGET_NAME)])


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    """Poll `predicate` until it returns something truthy, which is returned; fail the
    test with `what` if the deadline passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def stream_name(hint: str) -> str:
    """A stream name unique to this run: the hint (sanitised) plus a random suffix."""
    body = re.sub(r"[^A-Za-z0-9_.-]", "-", hint)[:60]
    return f"{body}-{uuid.uuid4().hex[:8]}"


def read_partition(client, stream: str, ordinal: int, *, max_records: int = 10_000,
                   max_calls: int = 1_000) -> list[Record]:
    """Every record of one partition, from TRIM_HORIZON until a read comes back empty."""
    iterator = client.get_iterator(stream, ordinal, "TRIM_HORIZON")
    records: list[Record] = []
    for _ in range(max_calls):
        result = client.get_next_records(iterator, max_records=max_records)
        if not result.records:
            return records
        records.extend(result.records)
        iterator = result.next_iterator
        assert iterator is not None, f"{stream} p{ordinal}: open partition returned no next iterator"
    raise AssertionError(f"{stream} p{ordinal}: not caught up after {max_calls} reads")


def read_stream(client, stream: str) -> dict[int, list[Record]]:
    """Every record of every partition, by partition ordinal."""
    return {p.ordinal: read_partition(client, stream, p.ordinal) for p in client.partitions(stream)}


def assert_all_alive(cluster: LocalCluster) -> None:
    exited = cluster.exited()
    assert not exited, f"cluster processes exited unexpectedly: {exited} (logs in {cluster.data_dir}/logs)"


@contextlib.contextmanager
def env_cluster(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str], name: str,
                nodes: int = CLUSTER_NODES) -> Iterator[LocalCluster]:
    """A cluster whose nodes see `env` (node settings as SMS_<SECTION>_<KEY>), set in this
    process for as long as the cluster runs (a node restarted by a test sees it too)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    local = LocalCluster(str(tmp_path_factory.mktemp(name)), nodes=nodes, port=0)
    try:
        local.start()
        yield local
    finally:
        local.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One local cluster (control + 3 storage nodes) shared by the tests of a module."""
    local = LocalCluster(str(tmp_path_factory.mktemp("cluster")), nodes=CLUSTER_NODES, port=0)
    local.start()          # stops what it started if it fails
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def client(cluster: LocalCluster) -> Iterator[sms.Client]:
    c = sms.Client(cluster.address)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def unique_stream(request: pytest.FixtureRequest) -> str:
    """A stream name no other test uses (the cluster is shared)."""
    return stream_name(request.node.name)


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalCluster]]:
    """Start dedicated clusters for one test; every one is stopped at teardown.

    `make_cluster()` starts a cluster in a fresh directory; `make_cluster(data_dir)`
    starts one on an existing directory (a restart)."""
    started: list[LocalCluster] = []

    def start(data_dir: str | None = None, nodes: int = CLUSTER_NODES, **options) -> LocalCluster:
        local = LocalCluster(data_dir or str(tmp_path_factory.mktemp("dedicated")), nodes=nodes, port=0, **options)
        started.append(local)
        return local.start()

    try:
        yield start
    finally:
        for local in reversed(started):
            local.stop()
