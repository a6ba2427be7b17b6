"""Repartitioning on the control leader: split, merge and scale while writes go on
(DESIGN section 8), the dropping of closed partitions that retention emptied, and the
optional automatic split of hot partitions.

A repartition request is recorded in the stream's config (`StreamConfig.repartition`,
a conditional write), so whichever control process leads drives it to its end, and a new
leader picks up one that its predecessor left half done. `Repartitioner` takes each
pending request one step at a time (scale is a sequence of splits and merges, each its
own map version):

1. **Seal.** Each parent's chain config is set `sealed` (conditional on its version). Its
   head then refuses new batches -- a resend of a batch it holds is still acknowledged --
   and the flag survives a head failover, since the chain manager keeps it.
2. **Drain.** The driver polls the head (NodeStatus) until it reports the sealed config
   applied, no append in progress, and everything it holds committed: its last SN is the
   parent's ending SN E.
3. **Commit.** One conditional commit writes the new map (the parents CLOSED with E, the
   children valid from a boundary time above E's timestamp), checks that every parent's
   chain config is still the one whose head reported E (a failover meanwhile fails the
   commit and the step starts again), creates the children's chains placed on the
   least-loaded nodes, with `from_ms` = the boundary so their SNs are above every SN of
   the parents, and records the step in the stream config.

Writers that reach a sealed or closed parent are answered PartitionClosed and re-route
by the new map; only the parents' keys pause. A step that cannot be done (too many
partitions, not enough nodes) ends the request with that error and unseals the parents.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace

import grpc

from control import placement
from metastore import reads
from metastore import BadVersionError, Check, Create, Delete, MetaStore, NodeExistsError, NoNodeError, Set
from sms import errors, limits, metadata, retention, rpc, seqno
from sms.aiotools import cancel_and_wait, raise_if_cancelling, wait_event
from sms.errors import InvariantViolation, SmsError
from sms.metadata import ChainChange, ChainConfig, ConsumerRecord, StreamConfig
from sms.partition_map import PartitionMap
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.types import PartitionState, StreamStatus

log = logging.getLogger(__name__)

DAY_MS = 24 * 3600 * 1000


def new_request(op: str, **fields) -> dict:
    return {"id": secrets.token_hex(8), "op": op, "requested_ms": int(time.time() * 1000), **fields}


def in_progress(config: StreamConfig) -> bool:
    return bool(config.repartition) and not config.repartition.get("done")


def next_step(request: dict, pmap: PartitionMap) -> tuple | None:
    """The next split or merge the request needs, or None once it is done."""
    op = request["op"]
    if op == "split":
        e = pmap.entry(request["partition"])
        if e.state is not PartitionState.OPEN:
            return None
        at = request.get("at_hash")
        return ("split", e.ordinal, None if at is None else int(at))
    if op == "merge":
        a, b = (pmap.entry(o) for o in request["partitions"])
        if a.state is not PartitionState.OPEN or b.state is not PartitionState.OPEN:
            return None
        return ("merge", a.ordinal, b.ordinal)
    return pmap.next_scale_step(request["target"])


def apply_step(pmap: PartitionMap, step: tuple, boundary_ms: int, endings: dict[int, int]) -> PartitionMap:
    if step[0] == "split":
        return pmap.split(step[1], step[2], boundary_ms, endings[step[1]])
    return pmap.merge(step[1], step[2], boundary_ms, endings)


def step_parents(step: tuple) -> list[int]:
    return [step[1]] if step[0] == "split" else [step[1], step[2]]


def steps_needed(request: dict, pmap: PartitionMap) -> int:
    """How many splits and merges the request takes (a scale is planned on a copy)."""
    steps = 0
    while (step := next_step(request, pmap)) is not None:
        steps += 1
        fake = {o: 0 for o in step_parents(step)}
        pmap = apply_step(pmap, step, 0, fake)
        if request["op"] != "scale":
            break
    return steps


def recent_repartitions(config: StreamConfig, now_ms: int) -> tuple[int, ...]:
    return tuple(t for t in config.repartitions_ms if t > now_ms - DAY_MS)


def check_request(config: StreamConfig, pmap: PartitionMap, request: dict, now_ms: int) -> int:
    """Named errors for a request that cannot be done; the number of steps it takes."""
    if in_progress(config):
        raise errors.RepartitionInProgress(
            f"stream {config.name!r} is being repartitioned ({config.repartition['op']}); retry when it is done")
    op = request["op"]
    if op == "split":
        pmap.check_split(request["partition"], None if request.get("at_hash") is None else int(request["at_hash"]))
    elif op == "merge":
        pmap.check_merge(*request["partitions"])
    elif op == "scale":
        pmap.next_scale_step(request["target"])     # range check
    else:
        raise errors.InvalidArgument(f"repartition op {op!r}; expected split, merge or scale")
    steps = steps_needed(request, pmap)
    recent = len(recent_repartitions(config, now_ms))
    if recent + steps > limits.REPARTITIONS_PER_DAY_MAX:
        raise errors.RescaleTooSoon(f"stream {config.name!r}: {recent} splits and merges in the last day, this "
                                    f"request needs {steps}; at most {limits.REPARTITIONS_PER_DAY_MAX} a day")
    return steps


class Repartitioner:
    """Drives repartition requests, drops emptied partitions, splits hot ones (leader only)."""

    def __init__(self, store: MetaStore):
        self.store = store
        self._changed = asyncio.Event()
        self._cancel: list = []
        self._task: asyncio.Task | None = None
        self._last_retention = 0.0
        self._last_sample = 0.0
        self._rates: dict[tuple[str, int], tuple[float, int]] = {}   # last (time, record counter)
        self._hot_since: dict[tuple[str, int], float] = {}
        self.steps = 0
        self.dropped = 0

    def start(self) -> None:
        for path in (metadata.STREAMS, metadata.CHAINS):
            self._cancel.append(self.store.watch(path, self._changed.set))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repartitioner")

    def poke(self) -> None:
        """A request was recorded (by this process's admin): take it up now."""
        self._changed.set()

    async def stop(self) -> None:
        for cancel in self._cancel:
            cancel()
        self._cancel.clear()
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            busy = False
            try:
                busy = await self.round()
            except InvariantViolation:
                raise
            except Exception:      # a metadata or network hiccup: the next round retries
                raise_if_cancelling()
                log.exception("repartition round failed")
            interval = limits.REPARTITION_POLL_INTERVAL_S if busy else limits.RETENTION_CHECK_INTERVAL_S
            await wait_event(self._changed, interval)
            self._changed.clear()

    async def _streams(self) -> list[tuple[StreamConfig, int]]:
        try:
            names = await self.store.children(metadata.STREAMS)
        except NoNodeError:
            return []
        out = []
        for name in names:
            entry = await self.store.get(metadata.stream_path(name))
            if entry is not None and entry.value:
                out.append((StreamConfig.from_bytes(entry.value), entry.version))
        return out

    async def round(self) -> bool:
        """One pass over every stream; True while some request is under way."""
        busy = False
        now = time.monotonic()
        retention_due = now - self._last_retention >= limits.RETENTION_CHECK_INTERVAL_S
        sample_due = now - self._last_sample >= limits.AUTO_SPLIT_SAMPLE_INTERVAL_S
        for config, version in await self._streams():
            if config.status is not StreamStatus.ACTIVE:
                continue
            if in_progress(config):
                busy = True
                await self.advance(config, version)
                continue
            if retention_due:
                await self.drop_emptied(config)
            if sample_due and config.auto_split_records_per_s > 0:
                await self.auto_split(config, version)
        if retention_due:
            self._last_retention = now
        if sample_due:
            self._last_sample = now
        return busy

    # --- one step of a request ------------------------------------------------------------
    async def _chain(self, stream: str, ordinal: int) -> tuple[ChainConfig, int] | None:
        entry = await self.store.get(metadata.chain_path(metadata.chain_id(stream, ordinal)))
        if entry is None or not entry.value:
            return None
        return ChainConfig.from_bytes(entry.value), entry.version

    async def _finish(self, config: StreamConfig, version: int, error: SmsError | None = None,
                      unseal: list[tuple[ChainConfig, int]] = ()) -> None:
        done = {**config.repartition, "done": True, "done_ms": int(time.time() * 1000),
                "error": None if error is None else [error.name, error.message]}
        ops = [Set(metadata.stream_path(config.name), replace(config, repartition=done).to_bytes(), version)]
        for chain, chain_version in unseal:
            if chain.sealed:
                ops.append(Set(metadata.chain_path(chain.chain_id), replace(chain, sealed=False).to_bytes(),
                               chain_version))
        if unseal:
            ops.append(Set(metadata.CHAINS, str(int(time.time() * 1000)).encode()))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError):
            return
        if error is not None:
            log.warning("stream %s: repartition %s failed: %s", config.name, config.repartition["op"], error)

    async def advance(self, config: StreamConfig, version: int) -> None:
        request = config.repartition
        map_entry = await self.store.get(metadata.map_path(config.name))
        if map_entry is None:
            return
        pmap = PartitionMap.from_bytes(map_entry.value, version=map_entry.version)
        try:
            step = next_step(request, pmap)
            if step is not None:      # will the step's map be valid? (limits, split point)
                apply_step(pmap, step, 0, {o: 0 for o in step_parents(step)})
        except SmsError as e:
            await self._finish(config, version, e, unseal=[c for o in _parents_of(request, pmap)
                                                          if (c := await self._chain(config.name, o))])
            return
        if step is None:
            await self._finish(config, version)
            return
        parents = step_parents(step)
        chains = {}
        for o in parents:
            chain = await self._chain(config.name, o)
            if chain is None:
                return
            chains[o] = chain
        unsealed = [o for o in parents if not chains[o][0].sealed]
        if unsealed:
            now_ms = int(time.time() * 1000)
            ops = [Set(metadata.chain_path(chains[o][0].chain_id),
                       replace(chains[o][0], sealed=True).to_bytes(), chains[o][1]) for o in unsealed]
            # conditional on the request too: a deposed leader must not seal for a request
            # that the new leader has ended meanwhile
            ops.append(Set(metadata.stream_path(config.name),
                           replace(config, repartition={**request, "sealed_ms": now_ms}).to_bytes(), version))
            ops.append(Set(metadata.CHAINS, str(now_ms).encode()))
            try:
                await self.store.commit(ops)
            except (BadVersionError, NoNodeError):
                pass
            return                      # the next round waits for the heads to drain
        endings = {}
        for o in parents:
            ending = await self._drained(chains[o][0])
            if ending is None:
                sealed_ms = request.get("sealed_ms", int(time.time() * 1000))
                if time.time() * 1000 - sealed_ms > limits.REPARTITION_DRAIN_TIMEOUT_S * 1000:
                    await self._finish(config, version, errors.Timeout(
                        f"p{o:04d}'s head did not drain within {limits.REPARTITION_DRAIN_TIMEOUT_S:.0f} s (its chain "
                        "has no live head); the partitions are unsealed"), unseal=list(chains.values()))
                return
            endings[o] = ending
        await self._commit_step(config, version, pmap, step, chains, endings)

    async def _drained(self, chain: ChainConfig) -> int | None:
        """The head's last SN once it is sealed, idle and has committed all it holds."""
        nodes = await reads.live_storage(self.store)
        head = nodes.get(chain.head)
        if head is None:
            return None
        try:
            async with rpc.aio_channel(head.address) as channel:
                status = await sms_pb2_grpc.StorageStub(channel).NodeStatus(
                    sms_pb2.NodeStatusRequest(chain_ids=[chain.chain_id]), timeout=limits.RPC_TIMEOUT_S)
        except (grpc.aio.AioRpcError, OSError):
            raise_if_cancelling()
            return None
        for r in status.replicas:
            if r.chain_id == chain.chain_id and r.epoch == chain.epoch and r.role.startswith("head") \
                    and r.sealed and r.last_sn == r.committed_sn:
                return int(r.last_sn)
        return None

    async def _commit_step(self, config: StreamConfig, version: int, pmap: PartitionMap, step: tuple,
                           chains: dict[int, tuple[ChainConfig, int]], endings: dict[int, int]) -> None:
        now_ms = int(time.time() * 1000)
        boundary_ms = max([now_ms] + [seqno.timestamp_ms_of(e) + 1 for e in endings.values() if e])
        new_map = apply_step(pmap, step, boundary_ms, endings)
        children = new_map.entries[len(pmap.entries):]
        nodes = await reads.live_storage(self.store)
        replicas, heads = await reads.chain_load(self.store, sealed=False)
        try:
            placed = placement.place(list(nodes), len(children), config.replication_factor, replicas, heads)
        except SmsError as e:
            await self._finish(config, version, e, unseal=list(chains.values()))
            return
        what = (f"split of p{step[1]:04d}" if step[0] == "split"
                else f"merge of p{step[1]:04d} and p{step[2]:04d}")
        ops = [Set(metadata.map_path(config.name), new_map.to_bytes(), pmap.version)]
        ops += [Check(metadata.chain_path(chain.chain_id), v) for chain, v in chains.values()]
        for child, members in zip(children, placed):
            cid = metadata.chain_id(config.name, child.ordinal)
            ops.append(Create(metadata.chain_path(cid), ChainConfig(
                chain_id=cid, stream=config.name, ordinal=child.ordinal, epoch=1, members=members,
                persistence=config.persistence, from_ms=boundary_ms,
                incarnations=tuple(sorted((n, nodes[n].started_ms) for n in members)),
                history=(ChainChange(1, now_ms, "created", members[0],
                                     f"{what}; placed on " + " -> ".join(members)),)).to_bytes()))
        request = {k: v for k, v in config.repartition.items() if k != "sealed_ms"}
        request["steps_done"] = request.get("steps_done", 0) + 1
        recent = recent_repartitions(config, now_ms) + (now_ms,)
        new_config = replace(config, repartition=request, repartitions_ms=recent[-limits.REPARTITION_HISTORY_MAX:])
        ops.append(Set(metadata.stream_path(config.name), new_config.to_bytes(), version))
        ops.append(Set(metadata.CHAINS, str(now_ms).encode()))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError, NodeExistsError) as e:
            log.info("stream %s: %s not committed (%s); the step starts again", config.name, what,
                     type(e).__name__)
            return
        self.steps += 1
        log.warning("stream %s: %s committed, map version %d; ending SNs %s, children %s from %d",
                    config.name, what, pmap.version + 1, endings, [c.ordinal for c in children], boundary_ms)

    # --- retention: closed partitions that hold nothing more ------------------------------
    async def _consumers(self, stream: str) -> list[ConsumerRecord]:
        try:
            names = await self.store.children(metadata.consumers_path(stream))
        except NoNodeError:
            return []
        out = []
        for name in names:
            entry = await self.store.get(metadata.consumer_path(stream, name))
            if entry is not None and entry.value:
                out.append(ConsumerRecord.from_bytes(entry.value))
        return out

    async def drop_emptied(self, config: StreamConfig) -> list[int]:
        map_entry = await self.store.get(metadata.map_path(config.name))
        if map_entry is None:
            return []
        pmap = PartitionMap.from_bytes(map_entry.value, version=map_entry.version)
        gone = retention.droppable(config, pmap, await self._consumers(config.name), int(time.time() * 1000))
        if not gone:
            return []
        ops = [Set(metadata.map_path(config.name), pmap.without(set(gone)).to_bytes(), pmap.version)]
        for o in gone:
            path = metadata.chain_path(metadata.chain_id(config.name, o))
            if await self.store.get(path) is not None:
                ops.append(Delete(path))
        ops.append(Set(metadata.CHAINS, str(int(time.time() * 1000)).encode()))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError):
            return []
        self.dropped += len(gone)
        log.warning("stream %s: dropped closed partitions %s (retention left no record in them)", config.name,
                    ", ".join(f"p{o:04d}" for o in gone))
        return gone

    # --- automatic splitting ------------------------------------------------------------------
    async def auto_split(self, config: StreamConfig, version: int) -> None:
        """Sample each open partition's write rate at its head; split one whose rate stayed
        above the stream's threshold for its period."""
        map_entry = await self.store.get(metadata.map_path(config.name))
        if map_entry is None:
            return
        pmap = PartitionMap.from_bytes(map_entry.value, version=map_entry.version)
        nodes = await reads.live_storage(self.store)
        statuses: dict[str, dict[str, int]] = {}
        now = time.monotonic()
        for e in pmap.open_entries():
            key = (config.name, e.ordinal)
            chain = await self._chain(config.name, e.ordinal)
            if chain is None or chain[0].head not in nodes:
                continue
            head = chain[0].head
            if head not in statuses:
                statuses[head] = await self._counters(nodes[head].address)
            counter = statuses[head].get(chain[0].chain_id)
            if counter is None:
                continue
            last = self._rates.get(key)
            self._rates[key] = (now, counter)
            if last is None or now <= last[0]:
                continue
            rate = (counter - last[1]) / (now - last[0])
            if rate <= config.auto_split_records_per_s:
                self._hot_since.pop(key, None)
                continue
            since = self._hot_since.setdefault(key, last[0])
            if now - since < config.auto_split_period_s:
                continue
            request = new_request("split", partition=e.ordinal, auto=True)
            try:
                check_request(config, pmap, request, int(time.time() * 1000))
            except SmsError as err:
                log.info("stream %s: p%04d is hot (%.0f records/s) but is not split: %s", config.name, e.ordinal,
                         rate, err)
                self._hot_since.pop(key, None)
                continue
            try:
                await self.store.set(metadata.stream_path(config.name),
                                     replace(config, repartition=request).to_bytes(), version)
            except (BadVersionError, NoNodeError):
                return
            log.warning("stream %s: p%04d wrote %.0f records/s for %.0f s (threshold %d): splitting it",
                        config.name, e.ordinal, rate, now - since, config.auto_split_records_per_s)
            self._hot_since.pop(key, None)
            return                   # one request at a time per stream

    async def _counters(self, address: str) -> dict[str, int]:
        """chain id -> the head's record counter (the per-partition counter in its last SN)."""
        try:
            async with rpc.aio_channel(address) as channel:
                status = await sms_pb2_grpc.StorageStub(channel).NodeStatus(sms_pb2.NodeStatusRequest(),
                                                                              timeout=limits.RPC_TIMEOUT_S)
        except (grpc.aio.AioRpcError, OSError):
            raise_if_cancelling()
            return {}
        return {r.chain_id: seqno.counter_of(int(r.last_sn)) for r in status.replicas if r.role.startswith("head")}


def _parents_of(request: dict, pmap: PartitionMap) -> list[int]:
    if request["op"] == "split":
        return [request["partition"]]
    if request["op"] == "merge":
        return list(request["partitions"])
    return [e.ordinal for e in pmap.open_entries()]
