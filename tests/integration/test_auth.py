"""Credentials on a TLS cluster (issue 15 item 3; control/auth.py, node/tls.py).

Real processes and real TLS. Every client call carries a key's token; the suite's
clients carry the cluster's first admin key ($SMS_TOKEN, tests/conftest.py). Here other
keys are made with `create_key` and each role is held to its rights:
- no, malformed, unknown, wrong-secret or revoked tokens: Unauthenticated;
- a producer writes and describes, never reads or administers; a consumer reads;
- a key limited to streams sees and touches only those: PermissionDenied elsewhere,
  with the same answer whether the other stream exists or not;
- the store holds a key's hash, never its secret;
- every refusal changes nothing, and the node keeps serving.
"""

from __future__ import annotations

import pytest

import sms
from control import auth
from metastore import open_metastore
from sms import errors
from tests.conftest import read_stream, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def streams(client) -> tuple[str, str]:
    for name in ("auth-a", "auth-b"):
        client.create_stream(name, partitions=1, replication_factor=1)
        client.put_record(name, b"first", "k")
    return "auth-a", "auth-b"


def _with(cluster, token: str) -> sms.Client:
    return sms.Client(cluster.address, ca_file=cluster.ca_file, token=token)


@pytest.mark.parametrize("token, message", [
    ("", "no credential"),
    ("hunter2", "malformed credential"),
    ("sms_0123_abc", "malformed credential"),
    ("sms_" + "x" * 300, "malformed credential"),
    ("sms_0123456789abcdef_notthesecret", "unknown or revoked key"),
])
def test_a_call_without_a_valid_token_is_unauthenticated(cluster, client, streams, token, message):
    with _with(cluster, token) as c:
        with pytest.raises(errors.Unauthenticated, match=message):
            c.list_streams()
        with pytest.raises(errors.Unauthenticated):
            c.put_record(streams[0], b"x", "k")
    assert [r.data for r in read_stream(client, streams[0])[0]] == [b"first"]


def test_a_wrong_secret_of_a_real_key_is_unauthenticated(cluster, client, streams):
    _info, token = client.create_key("consumer")
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with _with(cluster, forged) as c:
        with pytest.raises(errors.Unauthenticated, match="unknown or revoked key"):
            c.list_streams()


def test_each_role_has_its_rights(cluster, client, streams):
    a, _b = streams
    _p, producer_token = client.create_key("producer", name="writer")
    _c, consumer_token = client.create_key("consumer", name="reader")
    with _with(cluster, producer_token) as producer, _with(cluster, consumer_token) as consumer:
        written = producer.put_record(a, b"by the producer", "k")
        assert a in producer.list_streams()
        for refused in (lambda: producer.get_iterator(a, 0, "TRIM_HORIZON"),
                        lambda: producer.create_stream("auth-p", partitions=1),
                        lambda: producer.delete_stream(a),
                        lambda: producer.create_key("admin")):
            with pytest.raises(errors.PermissionDenied):
                refused()
        assert written.sn in {r.sn for r in read_stream(consumer, a)[0]}
        with pytest.raises(errors.PermissionDenied):
            consumer.put_record(a, b"by the consumer", "k")
        with pytest.raises(errors.PermissionDenied):
            consumer.list_keys()
    assert "auth-p" not in client.list_streams()
    assert [r.data for r in read_stream(client, a)[0]] == [b"first", b"by the producer"]


def test_a_key_limited_to_streams_sees_only_those(cluster, client, streams):
    a, b = streams
    _info, token = client.create_key("admin", streams=[a])
    with _with(cluster, token) as scoped:
        assert scoped.list_streams() == [a]
        scoped.put_record(a, b"scoped", "k")
        refusals = []
        for name in (b, "auth-no-such-stream"):
            with pytest.raises(errors.PermissionDenied) as e:
                scoped.get_stream_info(name)
            refusals.append(str(e.value).replace(name, "NAME"))
            with pytest.raises(errors.PermissionDenied):
                scoped.put_record(name, b"x", "k")
        assert refusals[0] == refusals[1]          # a stream that exists and one that does not: one answer
    assert [r.data for r in read_stream(client, b)[0]] == [b"first"]


def test_a_revoked_key_stops_working(cluster, client, streams):
    info, token = client.create_key("producer", name="to revoke")
    with _with(cluster, token) as c:
        c.put_record(streams[0], b"before revoking", "k")
        client.revoke_key(info["key_id"])
        assert info["key_id"] not in {k["key_id"] for k in client.list_keys()}

        def refused() -> bool:
            try:
                c.put_record(streams[0], b"after revoking", "k")
            except errors.Unauthenticated:
                return True
            return False
        wait_until(refused, 10.0, "the revoked key refused")
    with pytest.raises(errors.KeyNotFound):
        client.revoke_key(info["key_id"])


def test_the_store_keeps_a_hash_never_the_secret(cluster, client):
    info, token = client.create_key("consumer", name="hashed")
    listed = {k["key_id"]: k for k in client.list_keys()}[info["key_id"]]
    assert set(listed) == {"key_id", "tenant", "role", "streams", "name", "created_ms"}
    secret = auth.parse_token(token)[1]

    async def stored() -> bytes:
        store = open_metastore(cluster.metastore)
        await store.start()
        try:
            return (await store.get(auth.key_path(info["key_id"]))).value
        finally:
            await store.close()
    import asyncio
    raw = asyncio.run(stored())
    assert secret.encode() not in raw and auth.hash_secret(secret).encode() in raw


@pytest.mark.parametrize("call, error", [
    (lambda c: c.create_key("root"), errors.InvalidArgument),
    (lambda c: c.create_key("producer", streams=["bad name!"]), errors.InvalidStreamName),
    (lambda c: c.revoke_key("not-a-key"), errors.InvalidArgument),
    (lambda c: c.revoke_key("0123456789abcdef"), errors.KeyNotFound),
])
def test_bad_key_requests_are_named(client, call, error):
    before = client.list_keys()
    with pytest.raises(error):
        call(client)
    assert client.list_keys() == before


def test_a_plaintext_cluster_asks_for_no_token(make_cluster):
    plain = make_cluster(nodes=1, tls=False)
    with sms.Client(plain.address, ca_file="", token="anything") as c:
        c.create_stream("open", partitions=1)
        assert c.list_streams() == ["open"]


def test_a_key_revoked_during_a_subscription_ends_it(cluster, client, streams):
    """A subscription's key is checked again before each event once KEY_CACHE_TTL_S has
    passed: revoking it ends the stream with Unauthenticated, not after the server
    session (SUBSCRIBE_SESSION_S)."""
    a = streams[0]
    info, token = client.create_key("consumer", name="subscriber")
    with _with(cluster, token) as c:
        pages = c.subscribe(a, 0, "TRIM_HORIZON")
        assert next(pages).records                 # the first page, while the key is good
        client.revoke_key(info["key_id"])

        def ended() -> bool:
            client.put_record(a, b"to push an event", "k")
            try:
                next(pages)
            except errors.Unauthenticated:
                return True
            return False
        wait_until(ended, 30.0, "the subscription of a revoked key ended")
