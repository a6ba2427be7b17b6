"""Control leader election: the control process that holds the ephemeral entry
/cluster/control leads; every other control process stands by and tries again when the
entry vanishes (its holder stopped, crashed, or was paused past its session).

The leader runs the chain manager and answers admin calls; a standby answers them with
Unavailable naming the leader, so clients re-resolve and retry. Leadership is not
trusted for safety: every config change is a conditional write, so a deposed leader
that has not yet noticed cannot commit over a change made by its successor.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

from metastore import MetaStore, MetaStoreError, NodeExistsError
from sms import limits, metadata
from kernel.aiotools import raise_if_cancelling, wait_event

log = logging.getLogger(__name__)


class LeaderElection:
    def __init__(self, store: MetaStore, node_id: str, address: str, incarnation: int,
                 on_elected: Callable[[], Awaitable[None]], on_deposed: Callable[[], Awaitable[None]]):
        self.store = store
        self.value = json.dumps({"node_id": node_id, "address": address, "incarnation": incarnation}).encode()
        self.node_id = node_id
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.leader = False
        self.terms = 0
        self._wake = asyncio.Event()
        self._cancel: list = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._cancel.append(self.store.watch(metadata.CLUSTER_CONTROL, self._wake.set))
        self._cancel.append(self.store.on_session_lost(self._wake.set))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="control-election")

    async def stop(self) -> None:
        for cancel in self._cancel:
            cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.leader:
            self.leader = False
            await self.on_deposed()

    async def _holds(self) -> bool:
        entry = await self.store.get(metadata.CLUSTER_CONTROL)
        return entry is not None and entry.value == self.value

    async def _run(self) -> None:
        while True:
            try:
                if self.leader:
                    if not await self._holds():
                        log.warning("control %s lost the leadership", self.node_id)
                        self.leader = False
                        await self.on_deposed()
                        continue
                else:
                    try:
                        await self.store.create(metadata.CLUSTER_CONTROL, self.value, ephemeral=True)
                    except NodeExistsError:
                        pass
                    else:
                        self.leader = True
                        self.terms += 1
                        log.info("control %s is the leader", self.node_id)
                        await self.on_elected()
                        continue
            except MetaStoreError as e:        # session expired or store unreachable: retried
                raise_if_cancelling()
                log.info("control election: %s", e)
                if self.leader:
                    self.leader = False
                    await self.on_deposed()
            await wait_event(self._wake, limits.CONTROL_ELECTION_RETRY_S)
            self._wake.clear()
