"""The loops that keep a node's channel workers (delivery/manager.py) and queue owners
(queues/service.py) in step with the chains never end on an error: a metadata store that
is away (its own errors, not SmsError: a session that expired while the node was starved
of CPU) or anything unexpected is logged and looked at again at the next check. The
channel loop once died so, silently, and a node that became a partition's head never
started its workers (the flake of test_spark_connector's channel test, docs/testing.md)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from delivery.manager import ChannelManager
from metastore import SessionExpiredError
from sms import limits


class _Store:
    """The metadata store as the manager reads it: channels' children, failing as told."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.reads = 0

    def watch(self, path, callback):
        return lambda: None

    async def children(self, path):
        self.reads += 1
        if self.failures:
            raise self.failures.pop(0)
        return []

    async def get(self, path):
        return None


class _View:
    def __init__(self, store) -> None:
        self.store = store


class _Client:
    async def close(self) -> None:
        pass


@pytest.mark.parametrize("failure", [SessionExpiredError("session expired"), TimeoutError(), KeyError("bug")])
def test_the_channel_loop_survives_a_failed_check(monkeypatch, caplog, failure):
    monkeypatch.setattr(limits, "CHANNEL_CHECK_S", 0.01)
    monkeypatch.setattr(limits, "CHANNEL_CONFIG_REFRESH_S", 0.0)
    store = _Store([failure, failure])

    async def scenario() -> None:
        manager = ChannelManager("n1", _View(store), _Client())
        manager.start()
        try:
            deadline = asyncio.get_running_loop().time() + 10
            while store.reads < 4 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert store.reads >= 4 and not manager._task.done(), "the loop ended on a failed check"
        finally:
            await manager.close()

    with caplog.at_level(logging.INFO, logger="sms.channels"):
        asyncio.run(scenario())
    assert any("channel workers" in r.getMessage() for r in caplog.records)
