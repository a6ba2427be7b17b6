"""control/auth.py: tokens, and a node's KeyTable: on a real embedded metadata store, and
on a fake one (only `get`) with a test clock for its time bounds (issue 30 item 1)."""

from __future__ import annotations

import asyncio

import pytest

from control import auth
from metastore import ConnectionLossError, Entry, open_metastore
from sms import errors, limits, metadata


@pytest.mark.parametrize("token", [
    "sms_0123456789ABCDEF_secret",       # upper-case hex: not an id revoke_key could name
    "sms_aaaaaaaaaaaaaaa/_secret",       # a path separator in the id
    "sms_0123456789abcdef_",             # no secret
    "sms_0123456789abcdef_a/b",          # a secret outside the token alphabet
    "bearer-token",
])
def test_malformed_tokens_are_refused_by_name(token):
    with pytest.raises(errors.Unauthenticated, match="malformed credential"):
        auth.parse_token(token)


def test_a_new_token_parses():
    key_id, token = auth.new_token()
    assert auth.parse_token(token)[0] == key_id and auth.is_key_id(key_id)


def _run(tmp_path, body):
    async def main():
        store = open_metastore(f"embedded://{tmp_path / 'meta.lmdb'}")
        await store.start()
        try:
            await store.create("/cluster")
            await store.create(metadata.KEYS)
            await body(store)
        finally:
            await store.close()
    asyncio.run(main())


def test_malformed_tokens_neither_read_the_store_nor_fill_the_cache(tmp_path):
    async def body(store):
        table = auth.KeyTable(store)
        entry, token = await auth.create_key(store, "producer", [])
        assert (await table.authenticate(token)).key_id == entry.key_id
        for i in range(50):
            with pytest.raises(errors.Unauthenticated):
                await table.authenticate(f"junk-{i}")
        assert list(table._known) == [token] and not table._refused
        for i in range(5):           # well-formed unknown keys: remembered apart from the good ones
            with pytest.raises(errors.Unauthenticated, match="unknown or revoked"):
                await table.authenticate(auth.new_token()[1])
        assert list(table._known) == [token] and len(table._refused) == 5
    _run(tmp_path, body)


def test_the_first_admin_key_is_made_once_with_its_marker(tmp_path):
    async def body(store):
        _id, token = auth.new_token()
        assert await auth.bootstrap_admin_key(store, token)
        assert await store.get(metadata.CLUSTER_BOOTSTRAPPED) is not None
        assert (await auth.KeyTable(store).authenticate(token)).role == "admin"
        await auth.revoke_key(store, auth.parse_token(token)[0])
        assert not await auth.bootstrap_admin_key(store, token)      # a revoked one does not come back
        with pytest.raises(errors.Unauthenticated):
            await auth.KeyTable(store).authenticate(token)
    _run(tmp_path, body)


def test_an_unreadable_key_entry_is_refused_not_crashed(tmp_path):
    async def body(store):
        key_id, token = auth.new_token()
        await store.create(auth.key_path(key_id), b"{not json")
        with pytest.raises(errors.Unauthenticated, match="unknown or revoked"):
            await auth.KeyTable(store).authenticate(token)
    _run(tmp_path, body)



# --- KeyTable's bounds, on a fake store (only `get`) and a test clock ------------------------
# The store answers from a dict. It can be made to raise MetaStoreError, to hang, or to
# answer `latency` seconds of the test clock after it read (a loaded store: what it
# answers is what it saw when the read began). The test moves the clock by hand; the waits
# the table makes on the loop (METADATA_READ_WAIT_S) are shortened where the store hangs.

TTL = limits.KEY_CACHE_TTL_S
START = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class FakeStore:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.values: dict[str, bytes] = {}
        self.read_at: list[float] = []        # the clock when each get began
        self.failing = False                  # raise MetaStoreError
        self.hanging = False                  # never answer
        self.latency = 0.0                    # answer once the clock has moved this far
        self.gate: asyncio.Event | None = None     # answer once it is set

    async def get(self, path: str) -> Entry | None:
        began = self.clock()
        self.read_at.append(began)
        if self.failing:
            raise ConnectionLossError("the metadata store does not answer")
        if self.hanging:
            await asyncio.Event().wait()
        value = self.values.get(path)
        gate = self.gate
        while self.clock() < began + self.latency:
            await asyncio.sleep(0)
        if gate is not None:
            await gate.wait()
        return None if value is None else Entry(value, 0, False)

    def add_key(self, role: str = "admin") -> tuple[str, str]:
        key_id, token = auth.new_token()
        entry = auth.KeyEntry(key_id=key_id, tenant=auth.DEFAULT_TENANT, role=role, streams=(),
                              sha256=auth.hash_secret(auth.parse_token(token)[1]), created_ms=0)
        self.values[auth.key_path(key_id)] = entry.to_bytes()
        return key_id, token

    def delete_key(self, key_id: str) -> None:
        del self.values[auth.key_path(key_id)]


@pytest.fixture
def short_waits(monkeypatch):
    monkeypatch.setattr(limits, "METADATA_READ_WAIT_S", 0.05)


def _table():
    clock = Clock()
    store = FakeStore(clock)
    return auth.KeyTable(store, clock=clock), store, clock


async def _settle() -> None:
    """Lets the table's reads that can answer now finish."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_verdict_is_used_within_the_ttl_and_read_again_after():
    async def main():
        table, store, clock = _table()
        _id, token = store.add_key()
        assert (await table.authenticate(token)).role == "admin"
        assert len(store.read_at) == 1
        clock.now += TTL * 0.4                    # young: no read at all
        await table.authenticate(token)
        await _settle()
        assert len(store.read_at) == 1
        clock.now += TTL * 0.2                    # past half the TTL: admitted, read again in the background
        await table.authenticate(token)
        await _settle()
        assert store.read_at == [START, clock.now]
        clock.now += TTL                          # that read's verdict has run out: read before admitting
        await table.authenticate(token)
        assert store.read_at[-1] == clock.now and len(store.read_at) == 3
    asyncio.run(main())


@pytest.mark.parametrize("latency", [0.0, 0.3, 0.7, 0.95])
def test_a_deleted_key_is_refused_once_the_read_that_admitted_it_is_ttl_old_however_often_used(latency):
    """The bound revoke_key relies on: a key used every 10 ms, deleted at some moment, is
    admitted by no call that begins KEY_CACHE_TTL_S or more after the start of the last
    read that saw it (which began before the deletion), so by none that begins
    KEY_CACHE_TTL_S after the deletion. The store answers `latency` late; a call that
    finds no verdict it may trust waits for a read, while the clock runs on."""
    async def main():
        table, store, clock = _table()
        key_id, token = store.add_key()
        store.latency = latency
        step = 0.01
        deleted_at = None
        admitted: list[float] = []          # when each admitted call began
        refused_at = None
        while refused_at is None and clock.now < START + 5 * TTL:
            if deleted_at is None and clock.now >= START + 1.37 * TTL:
                store.delete_key(key_id)
                deleted_at = clock.now
            began = clock.now
            call = asyncio.ensure_future(table.authenticate(token))
            await _settle()
            while not call.done():          # waiting for a read
                clock.now = round(clock.now + step, 6)
                await _settle()
            try:
                call.result()
                admitted.append(began)
            except errors.Unauthenticated:
                refused_at = began
            clock.now = round(clock.now + step, 6)
            await _settle()
        assert deleted_at is not None and refused_at is not None, (deleted_at, refused_at)
        last_saw_it = max(t for t in store.read_at if t < deleted_at)
        assert max(admitted) < last_saw_it + TTL <= deleted_at + TTL
        assert refused_at <= deleted_at + TTL + 2 * latency + step     # (and it was found out, not only waited)
        for _ in range(3):                  # and from then on, every call
            clock.now += step
            with pytest.raises(errors.Unauthenticated, match="unknown or revoked"):
                await table.authenticate(token)
    asyncio.run(main())


@pytest.mark.parametrize("outage", ["failing", "hanging"])
def test_a_cut_off_node_fails_closed_for_admin_calls_and_stale_for_data_calls_for_a_bound(short_waits, outage):
    """Cut off from the store, a node refuses every admin call with Unavailable once the
    key's verdict is older than KEY_CACHE_TTL_S; a data call (stale_ok) is admitted on
    the key's last good verdict, a revoked key's too, until it is KEY_STALE_MAX_S old."""
    async def main():
        table, store, clock = _table()
        key_id, token = store.add_key()
        confirmed = clock.now
        await table.authenticate(token)
        setattr(store, outage, True)
        clock.now += TTL                           # the verdict has run out, and the store does not answer
        with pytest.raises(errors.Unavailable, match="cannot be checked"):
            await table.authenticate(token)        # an admin call (create_key, revoke_key, ...)
        for _ in range(200):                       # (a hung read gives up just after the call did)
            if table.unreachable:
                break
            await asyncio.sleep(0.01)
        assert table.unreachable
        store.delete_key(key_id)                   # revoked meanwhile: the cut-off node cannot know
        reads = len(store.read_at)
        for at in (TTL * 1.5, limits.KEY_STALE_MAX_S / 2, limits.KEY_STALE_MAX_S - 0.01):
            clock.now = confirmed + at             # a data call: the last good verdict, at once
            assert (await table.authenticate(token, stale_ok=True)).key_id == key_id
            await _settle()
            with pytest.raises(errors.Unavailable):
                await table.authenticate(token)
        assert len(store.read_at) > reads          # (each tried the store again)
        clock.now = confirmed + limits.KEY_STALE_MAX_S
        for stale_ok in (True, False):             # past the bound: nothing is admitted
            with pytest.raises(errors.Unavailable):
                await table.authenticate(token, stale_ok=stale_ok)
    asyncio.run(main())


def test_a_node_that_reaches_the_store_again_refuses_a_key_revoked_meanwhile(short_waits):
    async def main():
        table, store, clock = _table()
        key_id, token = store.add_key()
        await table.authenticate(token)
        store.failing = True
        clock.now += 2 * TTL
        assert (await table.authenticate(token, stale_ok=True)).key_id == key_id
        store.delete_key(key_id)
        store.failing = False
        await table.authenticate(token, stale_ok=True)     # (may be admitted: its read goes on meanwhile)
        await _settle()
        assert not table.unreachable
        for stale_ok in (True, False):
            with pytest.raises(errors.Unauthenticated):
                await table.authenticate(token, stale_ok=stale_ok)
    asyncio.run(main())


def test_a_read_that_began_before_a_newer_one_does_not_overwrite_it():
    """Two reads of one key overlap: the older saw the key, the newer its deletion, and the
    older answers last. The newer verdict stands."""
    async def main():
        table, store, clock = _table()
        key_id, token = store.add_key()
        _id, secret = auth.parse_token(token)
        held = store.gate = asyncio.Event()
        older = asyncio.ensure_future(table._read_now(token, key_id, secret))
        await _settle()                           # it has read the key and holds its answer
        store.delete_key(key_id)
        store.gate = None
        clock.now += 0.3
        assert await table._read_now(token, key_id, secret)      # the newer: the key is gone
        held.set()
        assert await older
        clock.now += 0.1
        with pytest.raises(errors.Unauthenticated, match="unknown or revoked"):
            await table.authenticate(token)
        assert len(store.read_at) == 2            # (the newer verdict, not a read)
    asyncio.run(main())


def test_malformed_tokens_never_read_the_store():
    async def main():
        table, store, _clock = _table()
        for token in ("", "junk", "sms_0123456789ABCDEF_secret", "sms_0123456789abcdef_", "sms_" + "a" * 300,
                      "sms_0123456789abcdef_a/b"):
            for stale_ok in (False, True):
                with pytest.raises(errors.Unauthenticated):
                    await table.authenticate(token, stale_ok=stale_ok)
        assert store.read_at == [] and not table._known and not table._refused
    asyncio.run(main())


def test_data_calls_are_the_ones_that_may_use_a_stale_verdict():
    assert auth.may_use_stale("/sms.v1.Ingestion/PutRecords")
    assert auth.may_use_stale("/sms.v1.Retrieval/Subscribe")
    assert auth.may_use_stale("/sms.v1.Control/DescribeStream")
    for method in ("/sms.v1.Control/CreateKey", "/sms.v1.Control/RevokeKey", "/sms.v1.Control/CreateStream",
                   "/sms.v1.Control/ListNodes", "/sms.v1.Control/NoSuchCall"):
        assert not auth.may_use_stale(method), method


# --- calls made on a key's behalf (the Kinesis endpoint): delegated tokens, wrapped AWS secrets ----

def _masters(*ids):
    from kernel import encryption
    return encryption.MasterKeys({i: bytes([n + 1]) * 32 for n, i in enumerate(ids)}, current=ids[0])


def test_a_delegated_token_speaks_for_its_key_until_it_expires():
    masters = _masters("m1")
    token = auth.delegate(masters, "0123456789abcdef", now_s=1000.0)
    assert token.startswith(auth.DELEGATED_PREFIX)
    assert auth.delegated_key(masters, token, now_s=1000.0 + limits.KEY_DELEGATION_TTL_S - 1) == "0123456789abcdef"
    with pytest.raises(errors.Unauthenticated, match="expired"):
        auth.delegated_key(masters, token, now_s=1000.0 + limits.KEY_DELEGATION_TTL_S + 1)
    with pytest.raises(errors.Unauthenticated, match="cannot verify"):
        auth.delegated_key(_masters("m2"), token, now_s=1000.0)        # another cluster's master key
    with pytest.raises(errors.Unauthenticated, match="cannot verify"):
        auth.delegated_key(None, token, now_s=1000.0)
    forged = token.replace("0123456789abcdef", "fedcba9876543210")
    with pytest.raises(errors.Unauthenticated, match="cannot verify"):
        auth.delegated_key(masters, forged, now_s=1000.0)
    for junk in ("smsd.", "smsd.x.y.z.w", "smsd.0123456789abcdef.soon.00.m1"):
        with pytest.raises(errors.Unauthenticated, match="malformed"):
            auth.delegated_key(masters, junk)
    with pytest.raises(errors.InvalidArgument):
        auth.delegate(None, "0123456789abcdef")


def test_a_key_table_admits_a_delegated_token_as_its_key_and_not_once_the_key_is_gone(tmp_path):
    masters = _masters("m1")

    async def body(store):
        table = auth.KeyTable(store, master_keys=masters)
        entry, _token = await auth.create_key(store, "producer", ["s1"], master_keys=masters)
        principal = await table.authenticate(auth.delegate(masters, entry.key_id))
        assert (principal.key_id, principal.role, principal.streams) == (entry.key_id, "producer", ("s1",))
        await store.delete(auth.key_path(entry.key_id))
        with pytest.raises(errors.Unauthenticated, match="unknown or revoked"):
            await auth.KeyTable(store, master_keys=masters).authenticate(auth.delegate(masters, entry.key_id))
        with pytest.raises(errors.Unauthenticated):
            await auth.KeyTable(store).authenticate(auth.delegate(masters, entry.key_id))   # no master key here
    _run(tmp_path, body)


def test_a_new_key_keeps_its_aws_secret_wrapped_and_bound_to_it(tmp_path):
    from sms import security
    masters = _masters("m1")

    async def body(store):
        entry, token = await auth.create_key(store, "consumer", [], master_keys=masters)
        key_id, secret = security.aws_credentials(token)
        assert key_id == entry.key_id and len(secret) == 40
        stored = auth.KeyEntry.from_bytes(entry.key_id, (await store.get(auth.key_path(entry.key_id))).value)
        assert secret not in stored.sigv4 and stored.sigv4.startswith("m1:")
        assert masters.unwrap(auth.sigv4_aad(key_id), stored.sigv4).decode() == secret
        with pytest.raises(errors.SmsError):                 # bound to its key: not another's
            masters.unwrap(auth.sigv4_aad("fedcba9876543210"), stored.sigv4)
        plain, _t = await auth.create_key(store, "consumer", [])
        assert plain.sigv4 == ""                             # no master key: no Kinesis secret kept
    _run(tmp_path, body)
