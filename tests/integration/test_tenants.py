"""Tenants (issue 15 item 4; control/auth.py scope_request, node/tls.py): each sees,
lists and touches only its own streams, under its own names. Real TLS cluster, real keys.

- Two tenants each have a stream called `orders`; neither ever sees the other's records.
- A stream of another tenant answers exactly as one that does not exist.
- An iterator of another tenant's stream is refused as invalid.
- A tenant's admin manages its own keys only; tenants are managed by admins of the
  default tenant.
- A tenant with streams cannot be deleted; deleting one removes its keys.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import sms
from sms import aio, errors, limits
from tests.conftest import read_stream, wait_until

pytestmark = pytest.mark.integration


def _with(cluster, token: str) -> sms.Client:
    return sms.Client(cluster.address, ca_file=cluster.ca_file, token=token)


@pytest.fixture(scope="module")
def tenants(cluster, client):
    for name in ("acme", "globex"):
        client.create_tenant(name)
    tokens = {name: client.create_key("admin", tenant=name, name=f"{name} admin")[1] for name in ("acme", "globex")}
    return tokens


def test_two_tenants_each_have_their_own_orders(cluster, client, tenants):
    with _with(cluster, tenants["acme"]) as acme, _with(cluster, tenants["globex"]) as globex:
        for c, tag in ((acme, b"acme"), (globex, b"globex")):
            info = c.create_stream("orders", partitions=2, replication_factor=3)
            assert info.name == "orders"
            assert c.put_records("orders", [(f"k{i}", tag + b"-%d" % i) for i in range(50)]).failed_record_count == 0
        for c, tag in ((acme, b"acme"), (globex, b"globex")):
            assert c.list_streams() == ["orders"]
            assert c.get_stream_info("orders").name == "orders"
            got = [r.data for rs in read_stream(c, "orders").values() for r in rs]
            assert sorted(got) == sorted(tag + b"-%d" % i for i in range(50))
            assert [r.data for r in c.read_stream("orders")] and all(r.data.startswith(tag)
                                                                    for r in c.read_stream("orders"))
    assert "orders" not in client.list_streams()          # the default tenant has none of them


def test_another_tenants_stream_looks_like_no_stream(cluster, tenants):
    with _with(cluster, tenants["acme"]) as acme, _with(cluster, tenants["globex"]) as globex:
        acme.create_stream("acme-only", partitions=1)
        answers = []
        for name in ("acme-only", "never-made"):
            with pytest.raises(errors.StreamNotFound) as e:
                globex.get_stream_info(name)
            answers.append(str(e.value).replace(name, "NAME"))
            with pytest.raises(errors.SmsError) as e:
                globex.put_record(name, b"x", "k")
        assert answers[0] == answers[1]
        it = acme.get_iterator("acme-only", 0, "TRIM_HORIZON")
        with pytest.raises(errors.InvalidIterator):
            globex.get_next_records(it)


def test_names_with_the_tenant_separator_are_refused(cluster, tenants):
    with _with(cluster, tenants["acme"]) as acme:
        with pytest.raises(errors.InvalidStreamName):
            acme.create_stream("globex~orders", partitions=1)
        with pytest.raises(errors.InvalidStreamName):
            acme.get_stream_info("globex~orders")


def test_a_tenants_admin_manages_its_own_keys_only(cluster, client, tenants):
    with _with(cluster, tenants["acme"]) as acme:
        info, token = acme.create_key("producer", streams=["orders"], name="acme writer")
        assert info["tenant"] == "acme"
        assert {k["tenant"] for k in acme.list_keys()} == {"acme"}
        with pytest.raises(errors.PermissionDenied):
            acme.create_key("admin", tenant="globex")
        with pytest.raises(errors.PermissionDenied):
            acme.list_tenants()
        with pytest.raises(errors.PermissionDenied):
            acme.create_tenant("initech")
        globex_key = next(k for k in client.list_keys() if k["tenant"] == "globex")
        with pytest.raises(errors.KeyNotFound):
            acme.revoke_key(globex_key["key_id"])            # another tenant's key: not found
        with _with(cluster, token) as writer:
            writer.put_record("orders", b"by the acme writer", "k")
    assert {"acme", "globex", "default"} <= set(client.list_tenants())


def test_deleting_a_tenant(cluster, client):
    client.create_tenant("short-lived")
    _info, token = client.create_key("admin", tenant="short-lived")
    with _with(cluster, token) as t:
        t.create_stream("s", partitions=1)
        with pytest.raises(errors.FailedPrecondition, match="delete them first"):
            client.delete_tenant("short-lived")
        t.delete_stream("s")
        wait_until(lambda: "s" not in t.list_streams(), 30.0, "the tenant's stream deleted")
    client.delete_tenant("short-lived")
    assert "short-lived" not in client.list_tenants()
    with _with(cluster, token) as t:
        wait_until(lambda: _refused(t), 10.0, "the deleted tenant's key refused")
    with pytest.raises(errors.TenantNotFound):
        client.delete_tenant("short-lived")
    with pytest.raises(errors.TenantNotFound):
        client.create_key("admin", tenant="short-lived")


def _refused(c: sms.Client) -> bool:
    try:
        c.list_streams()
    except errors.Unauthenticated:
        return True
    return False


@pytest.mark.parametrize("name", ["", "Upper", "a" * 33, "under_score", "default"])
def test_bad_tenant_names_are_named(client, name):
    with pytest.raises(errors.InvalidArgument):
        client.create_tenant(name)


def test_the_clusters_own_state_is_for_the_default_tenants_admins(cluster, client, tenants):
    """Node status and node lists name every tenant's replicas: a tenant's admin gets
    PermissionDenied; the cluster's admins see them."""
    with _with(cluster, tenants["acme"]) as acme:
        for call in (acme.list_nodes, lambda: acme.node_status(cluster.address),
                     lambda: acme.drain_node("n1")):
            with pytest.raises(errors.PermissionDenied):
                call()
    assert client.list_nodes()


TENANT_RATE = 300               # records/s over all the limited tenant's partitions
LOAD_S = 3.0
BATCH = 50


async def _hammer(c, stream: str, deadline: float) -> tuple[int, float]:
    acked, i, t0 = 0, 0, time.monotonic()
    while time.monotonic() < deadline:
        out = await c.put_records(stream, [(f"k{i}-{j}", b"x" * 20) for j in range(BATCH)])
        acked += sum(1 for r in out.records if not r.error_name)
        i += 1
    return acked, time.monotonic() - t0


def test_a_tenants_limit_holds_while_another_tenant_keeps_going(cluster, client, tenants):
    """A tenant limited to TENANT_RATE records/s over all its partitions takes at most the
    limiter's bound (its share on each of the live ingestion nodes, one second's burst
    each), while another tenant beside it keeps its throughput."""
    assert client.update_tenant("acme", write_records_per_s=TENANT_RATE)["write_records_per_s"] == TENANT_RATE
    assert {t["name"]: t for t in client.describe_tenants()}["acme"]["write_records_per_s"] == TENANT_RATE
    nodes = sum(1 for n in client.describe_cluster().nodes if "ingestion" in n.roles)
    try:
        async def run():
            async with aio.Client(cluster.address, ca_file=cluster.ca_file, token=tenants["acme"]) as acme, \
                    aio.Client(cluster.address, ca_file=cluster.ca_file, token=tenants["globex"]) as globex:
                await acme.create_stream("busy", partitions=3, replication_factor=1)
                await globex.create_stream("busy", partitions=3, replication_factor=1)
                deadline = time.monotonic() + LOAD_S
                return await asyncio.gather(_hammer(acme, "busy", deadline), _hammer(globex, "busy", deadline))
        (acme_acked, acme_s), (globex_acked, _s) = asyncio.run(run())
    finally:
        client.update_tenant("acme", write_records_per_s=0)
    share = -(-TENANT_RATE // nodes)
    bound = nodes * share * (acme_s + limits.PARTITION_LIMIT_BURST_S) + nodes * BATCH
    print(f"\nacme (limited to {TENANT_RATE}/s over {nodes} nodes): {acme_acked} in {acme_s:.1f} s "
          f"(bound {bound:.0f}); globex: {globex_acked}")
    assert acme_acked <= bound
    assert globex_acked > bound


@pytest.mark.parametrize("limits_given, error", [
    ({"write_records_per_s": -2}, errors.InvalidArgument),
    ({"write_bytes_per_s": 10 ** 15}, errors.InvalidArgument),
])
def test_an_absurd_tenant_limit_is_refused(client, tenants, limits_given, error):
    before = {t["name"]: t for t in client.describe_tenants()}["acme"]
    with pytest.raises(error):
        client.update_tenant("acme", **limits_given)
    assert {t["name"]: t for t in client.describe_tenants()}["acme"] == before


def test_the_default_tenant_has_no_limits_to_set(client):
    with pytest.raises(errors.TenantNotFound):
        client.update_tenant("default", write_records_per_s=10)


def test_a_key_limited_to_streams_manages_nothing_else(cluster, client, tenants):
    """An admin key limited to streams cannot mint keys (which could be unlimited),
    revoke others, or reach the cluster's calls."""
    with _with(cluster, tenants["acme"]) as acme:
        _info, scoped_token = acme.create_key("admin", streams=["orders"], name="orders only")
    with _with(cluster, scoped_token) as scoped:
        assert scoped.get_stream_info("orders").name == "orders"
        for call in (lambda: scoped.create_key("admin"), scoped.list_keys, scoped.list_tenants):
            with pytest.raises(errors.PermissionDenied):
                call()


def test_no_stream_or_key_in_a_tenant_being_deleted_or_gone(cluster, client):
    client.create_tenant("gone")
    _info, token = client.create_key("admin", tenant="gone")
    client.delete_tenant("gone")
    with pytest.raises(errors.TenantNotFound):
        client.create_key("producer", tenant="gone")
    # a key made before, were one to survive, could make no stream in it
    with _with(cluster, token) as t:
        with pytest.raises((errors.Unauthenticated, errors.TenantNotFound)):
            t.create_stream("late", partitions=1)


def _tenant(client, name: str, **limits_given) -> str:
    """A new tenant with these limits set before anything of it runs, and its admin's token."""
    client.create_tenant(name)
    if limits_given:
        client.update_tenant(name, **limits_given)
    return client.create_key("admin", tenant=name)[1]


def test_a_tenant_holds_at_most_its_streams_and_partitions(cluster, client):
    """streams_max and partitions_max (open partitions over all its streams) refuse a
    creation, split or scale past them by name, and change nothing; merging frees room."""
    token = _tenant(client, "capped", streams_max=2, partitions_max=4)
    with _with(cluster, token) as t:
        t.create_stream("a", partitions=3, replication_factor=1)
        with pytest.raises(errors.TenantLimitExceeded, match="partitions_max"):
            t.create_stream("b", partitions=2, replication_factor=1)
        assert t.list_streams() == ["a"]
        t.create_stream("b", partitions=1, replication_factor=1)
        with pytest.raises(errors.TenantLimitExceeded, match="streams_max"):
            t.create_stream("c", partitions=1, replication_factor=1)
        with pytest.raises(errors.TenantLimitExceeded, match="partitions_max"):
            t.split("b", "p0000")
        with pytest.raises(errors.TenantLimitExceeded, match="partitions_max"):
            t.scale("a", 4)
        assert sorted(p.partition_id for p in t.get_stream_info("b").partitions) == ["p0000"]
        t.merge("a", "p0000", "p0001")             # 2 + 1 open: room for one more
        t.split("b", "p0000")
        assert len([p for p in t.get_stream_info("b").partitions if p.state.value == "OPEN"]) == 2
        # a cap lowered below what it holds refuses more, and lets it come back under
        client.update_tenant("capped", partitions_max=3)
        with pytest.raises(errors.TenantLimitExceeded, match="partitions_max"):
            t.scale("b", 3)
        opened = [p.partition_id for p in t.get_stream_info("b").partitions if p.state.value == "OPEN"]
        t.merge("b", *opened)
    assert {x["name"]: x for x in client.describe_tenants()}["capped"]["partitions_max"] == 3


def test_a_tenants_retention_cap_bounds_its_streams(cluster, client):
    """A stream of a tenant with retention_hours_max keeps records at most so long: a
    retention past it is refused, a stream made without one gets the cap, protect_unread
    holds unread records no longer, and a lower cap shortens retention at once."""
    token = _tenant(client, "brief", retention_hours_max=6)
    with _with(cluster, token) as t:
        t.create_stream("kept", partitions=1, replication_factor=1)
        assert t.get_stream_info("kept").retention_hours == 6
        with pytest.raises(errors.TenantLimitExceeded, match="retention_hours_max"):
            t.create_stream("long", partitions=1, replication_factor=1, retention_hours=24)
        with pytest.raises(errors.TenantLimitExceeded, match="retention_hours_max"):
            t.update_stream("kept", retention_hours=7)
        assert t.get_stream_info("kept").retention_hours == 6 and t.list_streams() == ["kept"]
        t.update_stream("kept", protect_unread=True)
        client.update_tenant("brief", retention_hours_max=2)
        wait_until(lambda: t.get_stream_info("kept").retention_hours == 2, 10.0, "retention lowered to the new cap")
        assert t.get_stream_info("kept").protect_unread


def test_a_tenants_read_limit_slows_its_readers_and_loses_nothing(cluster, client):
    """read_bytes_per_s over all a tenant's partitions, an even share on each retrieval
    node: a reader of one partition (one replica, so one node) reads at its share."""
    nodes = sum(1 for n in client.describe_cluster().nodes if "retrieval" in n.roles)
    rate = 100_000 * nodes                      # each node's share: 100 KB/s
    token = _tenant(client, "readers", read_bytes_per_s=rate)
    payload = b"y" * 1000
    with _with(cluster, token) as t:
        t.create_stream("log", partitions=1, replication_factor=1)
        for _ in range(4):
            assert t.put_records("log", [(f"k{i}", payload) for i in range(100)]).failed_record_count == 0
        t0 = time.monotonic()
        got = []
        it = t.get_iterator("log", 0, "TRIM_HORIZON")
        while it and len(got) < 400:
            page = t.get_next_records(it, max_records=50)
            got.extend(page.records)
            it = page.next_iterator
        took = time.monotonic() - t0
    print(f"\n400 records of 1 KB read in {took:.2f} s at a tenant limit of {rate:,} bytes/s over {nodes} nodes")
    assert len(got) == 400 and len({r.sequence_number for r in got}) == 400
    # the limiter's arithmetic: 400 KB (plus headers) at the share after a burst of one second's share
    assert took >= (400_000 - 100_000 - 50 * 1100) / 100_000
