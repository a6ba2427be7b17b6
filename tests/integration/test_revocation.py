"""Revocation within a second, failing closed (issue 30 item 1; control/auth.py KeyTable,
revoke_key; node/tls.py).

The attack of the issue, on the suite's TLS cluster (real processes, real TLS): an admin
key is used steadily, on every node, and revoked with the bootstrap admin key. Once
`revoke_key` (or `sms key revoke`) returns, every node's client port (the control
node's and every storage node's) refuses the key with Unauthenticated: for create_key
too, however recently the key was used. No call that begins after the revocation
returned is admitted anywhere, and a subscription of the key gets no event of a record
written after it. (The unit tests of KeyTable, tests/unit/test_keytable.py, hold the
time bounds on a test clock: KEY_CACHE_TTL_S, and KEY_STALE_MAX_S for a node cut off
from the metadata store.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest

import sms
from sms import errors, limits
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel, wait_until

pytestmark = pytest.mark.integration

STEADY_EVERY_S = 0.05
CALL_TIMEOUT_S = 10.0


def _addresses(cluster) -> dict[str, str]:
    """Every node's client port, by node id."""
    return {node_id: proc.address for node_id, proc in cluster.procs.items()}


def _refusal(call) -> str | None:
    """The named error that refused `call()` (its sms-error), "UNIMPLEMENTED" for a call
    the node does not serve, or None if it was admitted: answered, or refused by its
    handler with an error that is not a credential's."""
    try:
        call()
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return "UNIMPLEMENTED"
        name = dict(e.trailing_metadata() or ()).get("sms-error", e.code().name)
        return name if name in ("Unauthenticated", "PermissionDenied", "UNAUTHENTICATED") else None
    return None


def _calls(channel) -> dict[str, object]:
    """Calls that need the key's rights: an admin one (create_key: what the attacker of
    the issue used to make a key of its own) and data ones."""
    control, ingestion = sms_pb2_grpc.ControlStub(channel), sms_pb2_grpc.IngestionStub(channel)
    return {
        "CreateKey": lambda: control.CreateKey(sms_pb2.CreateKeyRequest(role="admin", name="the attacker's"),
                                               timeout=CALL_TIMEOUT_S),
        "ListKeys": lambda: control.ListKeys(sms_pb2.Empty(), timeout=CALL_TIMEOUT_S),
        "DescribeCluster": lambda: control.DescribeCluster(sms_pb2.Empty(), timeout=CALL_TIMEOUT_S),
        "PutRecords": lambda: ingestion.PutRecords(sms_pb2.PutRecordsRequest(stream="no-such-stream-r"),
                                                   timeout=CALL_TIMEOUT_S),
    }


class SteadyUse(threading.Thread):
    """Uses a token every STEADY_EVERY_S on every node, round robin, with admin and data
    calls; records (when the call began, node, method, refusal or None)."""

    def __init__(self, addresses: dict[str, str], token: str):
        super().__init__(daemon=True, name="steady-use")
        self.channels = {node: client_channel(address, token=token) for node, address in addresses.items()}
        self.log: list[tuple[float, str, str, str | None]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        calls = [(node, method, call) for node, channel in self.channels.items()
                 for method, call in _calls(channel).items() if method != "CreateKey"]
        # (a call a node does not serve answers UNIMPLEMENTED: not an admission)
        i = 0
        while not self.stopped.is_set():
            node, method, call = calls[i % len(calls)]
            began = time.monotonic()
            self.log.append((began, node, method, _refusal(call)))
            i += 1
            self.stopped.wait(STEADY_EVERY_S)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=30)
        for channel in self.channels.values():
            channel.close()


def _revoke_under_steady_use(cluster, client, revoke) -> None:
    info, token = client.create_key("admin", name="used, then revoked")
    addresses = _addresses(cluster)
    channels = {node: client_channel(address, token=token) for node, address in addresses.items()}
    try:
        served = {}                                 # good everywhere: admitted by every node
        for node, channel in channels.items():
            served[node] = [m for m, call in _calls(channel).items() if m == "CreateKey" or _refusal(call) is None]
            assert "DescribeCluster" in served[node] and "ListKeys" in served[node], (node, served[node])
        assert any("PutRecords" in methods for methods in served.values())
        steady = SteadyUse(addresses, token)
        steady.start()
        try:
            wait_until(lambda: len({n for _t, n, _m, r in steady.log if r is None}) == len(addresses), 30.0,
                       "the key admitted on every node by the steady user")
            for node, channel in channels.items():      # used 0 s before the revocation, on every node
                assert _refusal(_calls(channel)["ListKeys"]) is None, node
            began = time.monotonic()
            revoke(info["key_id"])
            returned = time.monotonic()
            # as soon as it returns: every node refuses the key, for an admin call and a data call
            for node, channel in channels.items():
                calls = _calls(channel)
                for method in served[node]:
                    assert _refusal(calls[method]) == "Unauthenticated", (node, method)
            wait_until(lambda: any(t > returned + 0.5 for t, *_ in steady.log), 30.0, "steady use after the revocation")
        finally:
            steady.stop()
        admitted_late = [(round(t - returned, 3), n, m) for t, n, m, r in steady.log if t >= returned and r is None]
        assert not admitted_late, f"calls that began after revoke_key returned and were admitted: {admitted_late}"
        assert any(t < began and r is None for t, _n, _m, r in steady.log)       # (it was in use until then)
        assert returned - began >= limits.KEY_CACHE_TTL_S      # (revoke_key waits the verdicts out)
    finally:
        for channel in channels.values():
            channel.close()
    assert all(k["key_id"] != info["key_id"] for k in client.list_keys())
    assert not [k for k in client.list_keys() if k["name"] == "the attacker's"]


def test_a_revoked_admin_key_in_steady_use_is_refused_by_every_node_once_revoke_returns(cluster, client):
    _revoke_under_steady_use(cluster, client, client.revoke_key)


def test_sms_key_revoke_returns_only_once_no_node_admits_the_key(cluster, client):
    def cli_revoke(key_id: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "node", "key", "revoke", key_id, "--address", cluster.address],
                              capture_output=True, text=True, timeout=60, env=dict(os.environ))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    _revoke_under_steady_use(cluster, client, cli_revoke)


def test_a_subscription_of_a_revoked_key_gets_nothing_written_after_revoke_returns(cluster, client):
    """A subscription read as fast as it answers, while records are written every 50 ms
    (each tagged with when its put began) and the key is used on every node: no record
    whose put began after revoke_key returned reaches the revoked key; the stream ends
    with Unauthenticated."""
    stream = "revocation-subscribe"
    client.create_stream(stream, partitions=1, replication_factor=1)
    info, token = client.create_key("consumer", name="subscriber, then revoked")
    client.put_record(stream, b"before", "k")
    with sms.Client(cluster.address, ca_file=cluster.ca_file, token=token) as c:
        pages = c.subscribe(stream, 0, "TRIM_HORIZON")
        seen: list[bytes] = []
        ended: list[BaseException] = []

        def read() -> None:
            try:
                for page in pages:
                    seen.extend(r.data for r in page.records)
            except BaseException as e:      # (the test asserts which)
                ended.append(e)
        reader = threading.Thread(target=read, daemon=True, name="subscriber")
        reader.start()
        wait_until(lambda: b"before" in seen, 30.0, "the first record's event")
        stop = threading.Event()

        def write_steadily() -> None:
            while not stop.is_set():
                client.put_record(stream, repr(time.monotonic()).encode(), "k")
                stop.wait(STEADY_EVERY_S)
        writer = threading.Thread(target=write_steadily, daemon=True, name="writer")
        writer.start()
        steady = SteadyUse(_addresses(cluster), token)     # (keeps the key's verdict fresh on every node)
        steady.start()
        try:
            wait_until(lambda: len(seen) > 5 and len(steady.log) > 2 * len(cluster.procs), 30.0,
                       "the key in steady use")
            client.revoke_key(info["key_id"])
            returned = time.monotonic()
            wait_until(lambda: ended, 30.0, "the revoked key's subscription ended")
        finally:
            stop.set()
            writer.join(timeout=30)
            steady.stop()
        reader.join(timeout=30)
    assert isinstance(ended[0], errors.Unauthenticated), repr(ended[0])
    tagged = [float(d) for d in seen if d != b"before"]
    assert tagged and min(tagged) < returned
    late = [round(t - returned, 3) for t in tagged if t >= returned]
    assert not late, f"records written after revoke_key returned reached the revoked key: {late}"
