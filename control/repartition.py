"""Repartitioning on the control leader: split, merge and scale while writes go on
(DESIGN section 8), the dropping of closed partitions that retention emptied, and the
optional automatic split of hot partitions.

A repartition request (`phases.RepartitionRequest`: split / merge / scale, the parents
or the target, its id) is recorded in the stream's config (`StreamConfig.repartition`,
a conditional write) together with its phase, so whichever control process leads drives
it to its end, and a new leader resumes one that its predecessor left half done from the
recorded phase. Each round `Repartitioner.advance` reads the stream's config, map and
what the pure `phases.decide` asks for (the parents' chain configs, their heads'
NodeStatus, the live nodes), executes the action it returns, and records the phase that
action leads to in the same conditional commit (docs/repartition-phases.md). A scale is
a sequence of splits and merges, each its own map version and its own pass through the
phases:

- **REQUESTED** (or **COMMITTED**, between the steps of a scale) -> *Seal*: each
  parent's chain config is set `sealed` (conditional on its version) and SEALED is
  recorded with `sealed_ms` (conditional on the request too: a deposed leader must not
  seal for a request the new leader has ended). The head then refuses new batches -- a
  resend of a batch it holds is still acknowledged -- and the flag survives a head
  failover, since the chain manager keeps it.
- **SEALED** -> *Wait* while a head drains: the driver polls each head (NodeStatus)
  until it reports the sealed config applied, no append in progress, and everything it
  holds committed: its last SN is the parent's ending SN E. Not recorded: it holds only
  for the chain config whose head reported it.
- **SEALED** -> *Commit* -> **COMMITTED**: one conditional commit writes the new map
  (the parents CLOSED with E, the children valid from a boundary time above E's
  timestamp), checks that every parent's chain config is still the one whose head
  reported E (a failover meanwhile fails the commit and the step starts again in
  SEALED), creates the children's chains placed on the least-loaded nodes, with
  `from_ms` = the boundary so their SNs are above every SN of the parents, and records
  COMMITTED with `steps_done + 1`.
- no step left -> *Finish* -> **DONE**. A step that cannot be done (too many partitions,
  not enough nodes, a head that did not drain within REPARTITION_DRAIN_TIMEOUT_S) ->
  *Fail* -> **FAILED** with that error, unsealing the open parents in the same commit.

Writers that reach a sealed or closed parent are answered PartitionClosed and re-route
by the new map; only the parents' keys pause.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import replace


from archive import cleanup
from control import phases, quotas
from control.phases import (Action, Commit, DAY_MS, Facts, Fail, Finish, HeadReport, Kind, Phase, ProbeHeads,
                            ReadChains, ReadNodes, RepartitionRequest, RepartitionState, Seal, Wait,
                            check_request, in_progress, recent_repartitions, steps_needed)
from metastore import reads
from metastore import BadVersionError, Check, Create, Delete, MetaStore, NodeExistsError, NoNodeError, Set
from sms import limits, metadata, seqno
from kernel import retention, rpc
from kernel.aiotools import background, cancel_and_wait, raise_if_cancelling, wait_event
from sms.errors import InvariantViolation, SmsError
from sms.metadata import ChainConfig, ConsumerRecord, StreamConfig
from sms.partition_map import PartitionMap
from sms.types import PartitionState, StreamStatus

log = logging.getLogger(__name__)

__all__ = ["DAY_MS", "Kind", "Phase", "RepartitionRequest", "RepartitionState", "Repartitioner", "check_request",
           "in_progress", "new_request", "recent_repartitions", "steps_needed"]

OBSERVATIONS_MAX = 4      # decide() asks for chains, heads and nodes at most once each, then acts


def _now_ms() -> int:
    return int(time.time() * 1000)


def new_request(kind: Kind | str, *, parents: tuple[int, ...] | list[int] = (), target: int = 0,
                at_hash: int | None = None, request_id: str | None = None, auto: bool = False) -> RepartitionRequest:
    """A new request with a fresh id (or the client's) and the time it was asked."""
    return RepartitionRequest(id=request_id or secrets.token_hex(8), kind=Kind(kind), parents=tuple(parents),
                              target=target, at_hash=at_hash, requested_ms=_now_ms(), auto=auto)


class Repartitioner:
    """Drives repartition requests, drops emptied partitions, splits hot ones (leader only)."""

    def __init__(self, store: MetaStore, channels: rpc.NodeChannels | None = None):
        self.store = store
        self.channels = channels or rpc.NodeChannels()      # to the nodes' cluster ports, with this node's TLS
        self._changed = asyncio.Event()
        self._cancel: list = []
        self._task: asyncio.Task | None = None
        self._last_retention = 0.0
        self._last_sample = 0.0
        self._rates: dict[tuple[str, int], tuple[float, int]] = {}   # last (time, record counter)
        self._hot_since: dict[tuple[str, int], float] = {}
        self.steps = 0
        self.dropped = 0
        # stream configs and maps decoded once per value: the round reads every stream
        # each second, which at thousands of partitions was most of an idle control's CPU
        self._decoded = reads.DecodedReads(store)

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
            got = await self._decoded.get(metadata.stream_path(name), StreamConfig.from_bytes)
            if got is not None:
                out.append(got)
        if len(self._decoded) > 2 * (2 * len(names) + 64):       # streams deleted meanwhile
            known = set(names)
            self._decoded.retain(lambda path: path.split("/")[2] in known)
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

    # --- one action of a request ----------------------------------------------------------
    async def _chain(self, stream: str, ordinal: int) -> tuple[ChainConfig, int] | None:
        entry = await self.store.get(metadata.chain_path(metadata.chain_id(stream, ordinal)))
        if entry is None or not entry.value:
            return None
        return ChainConfig.from_bytes(entry.value), entry.version

    async def advance(self, config: StreamConfig, version: int) -> Action | None:
        """Decide the request's next action from what the store and the heads show, and
        execute it; the action (None: nothing done)."""
        try:
            state = RepartitionState.from_record(config.repartition)
        except SmsError as e:       # (a record of a newer version, say: left as it is, for it)
            log.warning("stream %s: repartition record %r not understood (%s); left as it is", config.name,
                        config.repartition, e)
            return None
        map_entry = await self.store.get(metadata.map_path(config.name))
        if map_entry is None:
            return None
        pmap = PartitionMap.from_bytes(map_entry.value, version=map_entry.version)
        facts = Facts(config=config, pmap=pmap, now_ms=_now_ms())
        chains: dict[int, tuple[ChainConfig, int]] = {}      # what was read, with the store versions
        for _ in range(OBSERVATIONS_MAX):
            action = phases.decide(state, facts)
            if isinstance(action, ReadChains):
                for o in action.ordinals:
                    if (got := await self._chain(config.name, o)) is not None:
                        chains[o] = got
                facts = replace(facts, chains={o: chains[o][0] if o in chains else None for o in action.ordinals})
            elif isinstance(action, ProbeHeads):
                nodes = await reads.live_storage(self.store)
                facts = replace(facts, heads={o: await self._head_reports(facts.chains[o], nodes)
                                              for o in action.ordinals})
            elif isinstance(action, ReadNodes):
                # children go to live nodes that are not draining (unless every one is)
                nodes = await reads.live_storage(self.store)
                draining = await reads.draining(self.store)
                nodes = {n: info for n, info in nodes.items() if n not in draining} or nodes
                replicas, heads = await reads.chain_load(self.store)
                facts = replace(facts, nodes={n: info.started_ms for n, info in nodes.items()},
                                replicas=replicas, head_load=heads)
            else:
                break
            facts = replace(facts, now_ms=_now_ms())
        else:
            log.error("stream %s: the repartition decision kept asking for facts (%s); the next round retries",
                      config.name, action)
            return None
        await self._execute(config, version, state, pmap, chains, action)
        return action

    async def _execute(self, config: StreamConfig, version: int, state: RepartitionState, pmap: PartitionMap,
                       chains: dict[int, tuple[ChainConfig, int]], action: Action) -> None:
        if isinstance(action, Wait):
            return
        if isinstance(action, (Finish, Fail)):
            await self._finish(config, version, state, action)
        elif isinstance(action, Seal):
            await self._seal(config, version, state, chains, action)
        elif isinstance(action, Commit):
            await self._commit_step(config, version, state, pmap, chains, action)
        else:
            raise InvariantViolation(f"stream {config.name}: no driver for {action}")

    async def _seal(self, config: StreamConfig, version: int, state: RepartitionState,
                    chains: dict[int, tuple[ChainConfig, int]], action: Seal) -> None:
        ops = [Set(metadata.chain_path(chains[o][0].chain_id), replace(chains[o][0], sealed=True).to_bytes(),
                   chains[o][1]) for o in action.seal]
        # conditional on the request too: a deposed leader must not seal for a request
        # that the new leader has ended meanwhile
        ops.append(Set(metadata.stream_path(config.name), phases.config_after(config, state, action).to_bytes(),
                       version))
        if action.seal:
            ops.append(Set(metadata.CHAINS, metadata.chains_note(chains[o][0].chain_id for o in action.seal)))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError):
            pass
        # the next round waits for the heads to drain

    async def _finish(self, config: StreamConfig, version: int, state: RepartitionState,
                      action: Finish | Fail) -> None:
        ops = [Set(metadata.stream_path(config.name), phases.config_after(config, state, action).to_bytes(),
                   version)]
        unsealed = []
        for o in action.unseal:
            if (got := await self._chain(config.name, o)) is not None and got[0].sealed:
                ops.append(Set(metadata.chain_path(got[0].chain_id), replace(got[0], sealed=False).to_bytes(),
                               got[1]))
                unsealed.append(got[0].chain_id)
        if unsealed:
            ops.append(Set(metadata.CHAINS, metadata.chains_note(unsealed)))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError):
            return
        if isinstance(action, Fail):
            log.warning("stream %s: repartition %s failed: %s", config.name, state.request.kind.value, action.error)

    async def _head_reports(self, chain: ChainConfig, nodes: dict) -> tuple[HeadReport, ...]:
        """What the chain's head reports of it (nothing if the head is not live or not reached)."""
        head = nodes.get(chain.head)
        if head is None:
            return ()
        status = await self.channels.node_status(head.internal_address, [chain.chain_id])
        if status is None:
            return ()
        return tuple(HeadReport(chain_id=r.chain_id, epoch=r.epoch, role=r.role, sealed=r.sealed,
                                last_sn=r.last_sn, committed_sn=r.committed_sn)
                     for r in status.replicas if r.chain_id == chain.chain_id)

    async def _commit_step(self, config: StreamConfig, version: int, state: RepartitionState, pmap: PartitionMap,
                           chains: dict[int, tuple[ChainConfig, int]], action: Commit) -> None:
        what = action.step.describe()
        ops = [Set(metadata.map_path(config.name), action.new_map.to_bytes(), pmap.version)]
        ops += [Check(metadata.chain_path(chains[o][0].chain_id), chains[o][1]) for o in action.step.parents]
        ops += [Create(metadata.chain_path(child.chain_id), child.to_bytes()) for child in action.children]
        ops.append(Set(metadata.stream_path(config.name), phases.config_after(config, state, action).to_bytes(),
                       version))
        ops.append(Set(metadata.CHAINS, metadata.chains_note(
            [*(chains[o][0].chain_id for o in action.step.parents), *(c.chain_id for c in action.children)])))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError, NodeExistsError) as e:
            log.info("stream %s: %s not committed (%s); the step starts again", config.name, what,
                     type(e).__name__)
            return
        self.steps += 1
        log.info("stream %s: %s committed, map version %d; ending SNs %s, children %s from %d",
                 config.name, what, pmap.version + 1, dict(action.endings),
                 [c.ordinal for c in action.children], action.boundary_ms)

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
        cached = await self._decoded.get(metadata.map_path(config.name), PartitionMap.from_bytes)
        if cached is None or not any(e.state is PartitionState.CLOSED for e in cached[0].entries):
            return []          # no closed partition: nothing to drop (and no consumers to read)
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
        ops.append(Set(metadata.CHAINS, metadata.chains_note(metadata.chain_id(config.name, o) for o in gone)))
        try:
            await self.store.commit(ops)
        except (BadVersionError, NoNodeError):
            return []
        self.dropped += len(gone)
        log.info("stream %s: dropped closed partitions %s (retention left no record in them)", config.name,
                 ", ".join(f"p{o:04d}" for o in gone))
        if config.archive:
            background(cleanup.drop_partitions(self.store, config, gone))
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
                statuses[head] = await self._counters(nodes[head].internal_address)
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
            request = new_request(Kind.SPLIT, parents=(e.ordinal,), auto=True)
            try:
                check_request(config, pmap, request, _now_ms())
                await quotas.admit_open_partitions(self.store, config.name, len(pmap.open_entries()) + 1)
            except SmsError as err:
                log.info("stream %s: p%04d is hot (%.0f records/s) but is not split: %s", config.name, e.ordinal,
                         rate, err)
                self._hot_since.pop(key, None)
                continue
            try:
                await self.store.set(metadata.stream_path(config.name),
                                     replace(config, repartition=request.record()).to_bytes(), version)
            except (BadVersionError, NoNodeError):
                return
            log.info("stream %s: p%04d wrote %.0f records/s for %.0f s (threshold %d): splitting it",
                     config.name, e.ordinal, rate, now - since, config.auto_split_records_per_s)
            self._hot_since.pop(key, None)
            return                   # one request at a time per stream

    async def _counters(self, address: str) -> dict[str, int]:
        """chain id -> the head's record counter (the per-partition counter in its last SN)."""
        status = await self.channels.node_status(address)
        if status is None:
            return {}
        return {r.chain_id: seqno.counter_of(r.last_sn) for r in status.replicas if r.role.startswith("head")}

