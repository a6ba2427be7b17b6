"""The worker's rounds: its member heartbeat, the lease table's entries per input
partition, and claiming, taking, renewing and releasing leases (sms/leases.py), each
lease write conditional on the version last seen (sps/worker/__init__.py tells the whole)."""

from __future__ import annotations

import asyncio
import logging
import time

from sms import aio, errors, limits
from kernel.aiotools import cancel_and_wait, raise_if_cancelling
from sms.types import PartitionState
from sms.consumer import Membership, StreamsLeases
from sms.leases import LATEST, SHARD_END, TRIM_HORIZON, LeaseLost, LeaseTable, lease_key, plan_takes
from sps.worker.parts import Owned

log = logging.getLogger("sps.worker")


class LeaseRounds:
    """The rounds of a `Worker` (its state is made in its __init__)."""

    # --- the round ----------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self.client = aio.Client(self.address, **self.client_options)
        # the stage is a consumer group of each input stream, named as the stage
        self.table = LeaseTable(StreamsLeases(self.client, self.stage.inputs, self.stage.name), self.stage.name)
        self.membership = Membership(self.client, self.stage.inputs[0], self.stage.name, self.worker_id,
                                     self.stage.failover_s)
        loop_task = None
        try:
            await asyncio.to_thread(self.engine.start)      # (before claiming: a JVM takes seconds)
            await asyncio.to_thread(self.engine.warm_up, self.operation)
            loop_task = asyncio.get_running_loop().create_task(self._micro_batches(), name=f"sps-{self.stage.name}")
            interval = self.stage.failover_s / 3
            while not stop.is_set():
                if loop_task.done():
                    loop_task.result()          # (it never ends by itself: an error of this worker's own)
                try:
                    await self.round()
                except LeaseLost:
                    pass
                except (errors.SmsError, ConnectionError) as e:
                    raise_if_cancelling()
                    if isinstance(e, errors.SmsError) and not e.retriable:
                        raise           # (a stream deleted, a key revoked: the worker stops and says why)
                    log.info("%s: round failed, retrying: %r", self.worker_id, e)
                self._wake.clear()
                waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait()), loop_task]
                await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters[:2]:
                    w.cancel()
            if loop_task.done():
                loop_task.result()
            await self.release_all()
            self._report()
            try:
                await self.membership.leave()
            except errors.SmsError:
                pass
        finally:
            await cancel_and_wait(loop_task)
            for owned in list(self.owned.values()):
                await self._finish(owned)
            await self.client.close()
            if self.own_engine:
                self.engine.close()

    async def _workers(self) -> list[str]:
        return await self.membership.heartbeat()

    async def refresh_partitions(self) -> None:
        """An entry per input partition in the lease table (existing ones are kept)."""
        start = TRIM_HORIZON if self.stage.recovery == "checkpoint" else LATEST
        known = set(await self.table.all())
        for stream in self.stage.inputs:
            info = await self.client.get_stream_info(stream)
            for p in info.partitions:
                if lease_key(stream, p.ordinal) in known:
                    continue
                # a best-effort stage does not read closed partitions' pasts
                first = start if p.state is PartitionState.OPEN or start == TRIM_HORIZON else SHARD_END
                await self.table.ensure(stream, p.ordinal, tuple(p.parents), first)
        self._refresh_at = time.monotonic() + limits.SPS_PARTITION_REFRESH_S

    async def round(self) -> None:
        workers = await self._workers()      # (first: a slow round must not make this worker look dead)
        if time.monotonic() >= self._refresh_at:
            await self.refresh_partitions()
        leases = await self.table.all()
        for lease in leases.values():
            self.clock.observe(lease)
        claims, releases = plan_takes(leases, self.worker_id, workers, self.clock)
        # a lease still this worker's that it no longer processes (a write answered late, a
        # release that failed, a restart under the same id): taken up again from its checkpoint
        dropped = [lease for key, lease in leases.items()
                   if lease.owner == self.worker_id and key not in self.owned and not lease.done]
        now = time.monotonic()
        claims = [lease for lease in dropped + [c for c in claims if c.key not in {d.key for d in dropped}]
                  if self._backoff.get(lease.key, (0.0, 0.0))[0] <= now]
        for lease in claims:
            try:
                mine = await self.table.claim(lease, self.worker_id)
            except LeaseLost:
                continue
            log.info("%s: claimed %s at %s (from %s)", self.worker_id, lease.key, mine.checkpoint,
                     lease.owner or "nobody")
            self.owned[mine.key] = Owned(mine)
            self._work.set()
        for lease in releases:
            owned = self.owned.get(lease.key)
            if owned is not None:
                owned.stopping = True        # checkpointed and released at its next batch boundary
                self._work.set()
        for key, owned in list(self.owned.items()):
            if time.monotonic() - owned.last_write >= self.stage.failover_s / 3:
                try:
                    async with owned.lock:
                        owned.lease = await self.table.renew(owned.lease)
                        owned.last_write = time.monotonic()
                except LeaseLost:
                    if self._holds(owned):
                        await self._lose(owned)
        if self.stage.state is not None and time.monotonic() >= self._protect_at:
            self._protect_at = time.monotonic() + limits.SPS_PARTITION_REFRESH_S
            try:
                await self._protect_changelog(leases)
            except (errors.SmsError, ConnectionError) as e:
                raise_if_cancelling()
                log.warning("%s: stage %s: could not move its changelog's retention hold (retrying in %.0f s): %r",
                            self.worker_id, self.stage.name, limits.SPS_PARTITION_REFRESH_S, e)

    def _report(self) -> None:
        """A line with the micro-batches' figures so far (every SPS_REPORT_S, and at the end)."""
        self._report_at = time.monotonic() + limits.SPS_REPORT_S
        log.info("%s: stage %s: %s", self.worker_id, self.stage.name,
                 ", ".join(f"{k} {round(v, 2)}" for k, v in sorted(self.timings.items())))

    def _forget(self, key: str) -> None:
        owned = self.owned.pop(key, None)
        if owned is not None:
            owned.finished.set()
            if owned.read is not None:
                owned.read.cancel()

    async def _finish(self, owned: Owned) -> None:
        """This worker is done with the lease (released, lost, ended or failed)."""
        if self.owned.get(owned.lease.key) is owned:
            self._forget(owned.lease.key)
        owned.finished.set()
        await cancel_and_wait(owned.read)
        owned.read = None
        if owned.writer is not None:
            writer, owned.writer = owned.writer, None
            # (a replay of what it did not finish is answered by de-duplication)
            await writer.close(flush=False)
        self._wake.set()

    async def release_all(self) -> None:
        for owned in list(self.owned.values()):
            owned.stopping = True
        self._work.set()
        waits = [asyncio.ensure_future(o.finished.wait()) for o in list(self.owned.values())]
        if waits:
            await asyncio.wait(waits, timeout=self.stage.checkpoint_interval_s * 2 + 5)
            for w in waits:
                w.cancel()

