"""control/auth.py: tokens, and a node's KeyTable, on a real embedded metadata store."""

from __future__ import annotations

import asyncio

import pytest

from control import auth
from metastore import open_metastore
from sms import errors, metadata


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
