"""The sync client (sms/client.py) mirrors every coroutine method of the asyncio client,
also those it does not write out: a new RPC's client method is declared once, in
sms/aio/ (docs/contributing.md). No server: the method here is planted."""

from __future__ import annotations

import pytest

import sms
from sms import aio


def test_a_coroutine_method_of_the_asyncio_client_is_one_of_the_sync_client(monkeypatch):
    async def echo_for_test(self, value, *, twice=False):
        """An RPC's client method."""
        return (value, value) if twice else value

    monkeypatch.setattr(aio.Client, "echo_for_test", echo_for_test, raising=False)
    with sms.Client("127.0.0.1:1") as client:          # (no call reaches a node here)
        assert client.echo_for_test(7) == 7 and client.echo_for_test("x", twice=True) == ("x", "x")
        assert client.echo_for_test.__doc__ == "An RPC's client method."
        assert "echo_for_test" in dir(client) and "describe_cluster" in dir(client)
        with pytest.raises(AttributeError, match="no attribute 'no_such_method'"):
            client.no_such_method
        with pytest.raises(AttributeError):
            client._run_private_for_test
    monkeypatch.setattr(aio.Client, "plain_for_test", lambda self: 1, raising=False)
    with sms.Client("127.0.0.1:1") as client:
        with pytest.raises(AttributeError):
            client.plain_for_test           # (not a coroutine method: a sync wrapper is written out, or none)
