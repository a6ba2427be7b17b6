"""A node's channel workers (docs/channels.md): every CHANNEL_CHECK_S it looks at each
channel's stream and runs a `PartitionWorker` for each partition whose chain head it is,
and stops those whose partition's head moved away or whose channel was deleted. Channel
work is spread as the chains' heads are (the control plane balances them over the nodes),
and moves with them; the destinations' commits keep a moved partition from being written
twice (delivery/destinations.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from control.channels import from_bytes as channel_from_bytes
from delivery.worker import PartitionWorker
from kernel.aiotools import cancel_and_wait
from metastore import MetaStoreError, NoNodeError
from metastore.view import ClusterView
from sms import errors, limits, metadata
from sms.types import ChannelInfo

log = logging.getLogger("sms.channels")


def _import_pyiceberg() -> None:
    import importlib
    try:
        importlib.import_module("pyiceberg.catalog.sql")
        importlib.import_module("pyiceberg.io.pyarrow")
    except ImportError:
        pass                       # (the worker names it when it needs it)


class ChannelManager:
    def __init__(self, node_id: str, view: ClusterView, client: Any) -> None:
        self.node_id = node_id
        self.view = view
        self.client = client
        self.workers: dict[tuple[str, int, int], PartitionWorker] = {}
        self.finished: set[tuple[str, int, int]] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._unwatch: Any = None
        self._imported = False
        self._known: list[ChannelInfo] = []       # the channels as last read ...
        self._read_at = float("-inf")             # ... then (monotonic)
        self._stale = True                        # (one was made or deleted since)

    def start(self) -> None:
        # (a channel made or deleted is looked at at once, not at the next check)
        self._unwatch = self.view.store.watch(metadata.CHANNELS, self._channels_changed)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="channel-workers")

    async def close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        await cancel_and_wait(self._task)
        for worker in list(self.workers.values()):
            await worker.close()
        self.workers.clear()
        await self.client.close()

    def _channels_changed(self) -> None:
        self._stale = True
        self._wake.set()

    async def _channels(self) -> list[ChannelInfo]:
        """The channels, read again when one was made or deleted (the watch), else at most
        every CHANNEL_CONFIG_REFRESH_S (a new data freshness): not a read of each per check."""
        if not self._stale and time.monotonic() - self._read_at < limits.CHANNEL_CONFIG_REFRESH_S:
            return self._known
        self._stale = False                       # (a change during the read makes it stale again)
        read_at = time.monotonic()
        try:
            try:
                names = await self.view.store.children(metadata.CHANNELS)
            except NoNodeError:
                names = []
            out: list[ChannelInfo] = []
            for name in names:
                entry = await self.view.store.get(metadata.channel_path(name))
                if entry is not None:
                    out.append(channel_from_bytes(entry.value))
        except BaseException:
            self._stale = True                    # (read again at the next check)
            raise
        self._known, self._read_at = out, read_at
        return out

    async def _loop(self) -> None:
        while True:
            try:
                await self.check()
            except errors.SmsError as e:          # (the metadata store is away: look again later)
                log.info("channel workers: %s: %s", e.name, e.message)
            except (MetaStoreError, TimeoutError) as e:
                log.info("channel workers: the metadata store: %s: %s", type(e).__name__, e)
            except Exception:                     # (never the end of this node's channel work: logged, again)
                log.exception("channel workers: the check failed; again in %g s", limits.CHANNEL_CHECK_S)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), limits.CHANNEL_CHECK_S)
            except TimeoutError:
                pass

    async def check(self) -> None:
        wanted: dict[tuple[str, int, int], tuple[ChannelInfo, int]] = {}
        for channel in await self._channels():
            try:
                view = await self.view.stream(channel.stream)
            except errors.StreamNotFound:
                continue
            for ordinal, chain in view.chains.items():
                if chain.head == self.node_id:
                    wanted[(channel.name, channel.uid, ordinal)] = (channel, ordinal)
        for key, worker in list(self.workers.items()):
            if key not in wanted or worker.done:
                del self.workers[key]
                if worker.ended:
                    self.finished.add(key)
                await worker.close()
            elif wanted[key][0].data_freshness_s != worker.channel.data_freshness_s:
                worker.channel = wanted[key][0]           # (a new freshness: from the next buffer on)
        if not self._imported and any(c.destination.kind == "ICEBERG" for c, _o in wanted.values()):
            # (pyiceberg's first import takes a few tenths of a second: meanwhile the workers read)
            self._imported = True
            asyncio.get_running_loop().run_in_executor(None, _import_pyiceberg)
        for key, (channel, ordinal) in wanted.items():
            if key in self.workers or key in self.finished:
                continue
            worker = self.workers[key] = PartitionWorker(channel, ordinal, self.client, self.view, self.node_id)
            worker.start()
        self.finished &= set(wanted)

    def status(self) -> list[dict[str, Any]]:
        return [w.status() for w in self.workers.values()]
