"""The chain manager: runs on the control leader, keeps every chain whole.

Each round (at once when /nodes, /chains or /suspects change; every CHAIN_MANAGER_INTERVAL_S
while learners copy or right after a change; else every CHAIN_MANAGER_IDLE_ROUND_S) it
reads the live storage nodes and every chain config (`reads.ChainConfigs`: from memory
unless /chains changed), asks each chain's learners how
far they have copied (NodeStatus), and writes the config `control.chains.plan` returns,
as a conditional set on the version it read: a config changed meanwhile -- by another
control process that also believes it leads -- fails the write, and the next round
starts from the new config. Two leaders can therefore never both commit a change to
one chain.

Failure detection faster than the session TTL: a storage node whose chain link to a peer
breaks probes the peer's port and, if the connection is refused (nothing listens: the
process is gone), reports it under /suspects. The manager, watching /suspects, probes the
suspect itself (FAILURE_PROBE_ATTEMPTS refused connects in a row) and then takes that
incarnation of the node as failed: it is removed from its chains at once, though its
ephemeral entry lives until its session expires.

Unresponsive links: a paused process still accepts connections (its kernel does), and a
cut-off one does not answer at all, so neither refuses. Their chain links go unanswered
instead (storage/link.py: no ack, or nothing heard, for LINK_ACK_TIMEOUT_S), and the node at
the other end reports the link: reporter, peer, direction and chains (with each link's
epoch). The manager probes both ends with NodeStatus (LINK_PROBE_TIMEOUT_S: an
application-level answer, which a paused process cannot give) and takes one end out of
each reported chain whose link is still that one in that epoch: the end that did not
answer, else (both answer: the network between them fails) the link's successor; neither
answering, nothing. It does so per chain, by leaving the node out of that chain's live
nodes (`link_out`) for LINK_REMOVAL_INTERVAL_S: `chains.plan` removes it, with a new epoch
that fences it, and restores the replication factor with a learner elsewhere (the node
comes back to the chain no sooner). Guards against flapping: never the chain's last
member, no more than a minority of its members (at least one) within the interval, and a
link that took a node out of a chain removes nobody else from it within the interval.
Removal of a live node is safe (the epoch fences it); it costs a copy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter

import grpc

from control import chains
from metastore import reads
from metastore import BadVersionError, MetaStore, NoNodeError, Set
from sms import limits, metadata
from kernel import metrics, rpc
from kernel.aiotools import background, cancel_and_wait, raise_if_cancelling, wait_event
from sms.errors import InvariantViolation
from sms.metadata import ChainConfig, StreamConfig, chain_name
from sms.types import NodeInfo, StreamStatus

log = logging.getLogger(__name__)


class ChainManager:
    def __init__(self, store: MetaStore, channels: rpc.NodeChannels | None = None):
        self.store = store
        self.channels = channels or rpc.NodeChannels()      # to the nodes' cluster ports, with this node's TLS
        self._changed = asyncio.Event()
        self._cancel: list = []
        self._task: asyncio.Task | None = None
        self.changes = 0
        # node -> (the incarnation (started_ms) that refused the manager's probes, or whose
        # disk failed, and why): failed, although still registered (until its session
        # expires, or until it restarts)
        self.down: dict[str, tuple[int, str]] = {}
        self.configs: reads.ChainConfigs | None = None
        self._stream_configs = reads.DecodedReads(store)      # stream configs, decoded once per value
        self._busy = True                  # learners copying, or a change last round: look again soon
        self._handing_off = False          # a head handoff waits for its member: look again sooner still
        self.rounds = 0
        # chain id -> {node: (incarnation, why, until (monotonic), was a member)}: left out of
        # that chain's live nodes, because a link report took it out (see the module docstring)
        self.link_out: dict[str, dict[str, tuple[int, str, float, bool]]] = {}
        # (chain id, the link's two nodes) -> until: that link took a node out of the chain
        self._link_removals: dict[tuple[str, frozenset[str]], float] = {}
        # node -> (answered, when (monotonic)): a probe's answer stands for LINK_ACK_TIMEOUT_S,
        # so the reports of one fault from several nodes cost one probe of each end
        self._probed: dict[str, tuple[bool, float]] = {}
        # {reporter, peer} -> (their link works again, when): `_link_recovered`'s verdict
        self._recovered: dict[frozenset[str], tuple[bool, float]] = {}
        self.link_reports = 0
        self._probe_channels: dict[str, grpc.aio.Channel] = {}   # address -> the probes' channel to it

    def start(self) -> None:
        for path in (metadata.NODES, metadata.CHAINS, metadata.SUSPECTS, metadata.DRAINING, metadata.DISK_FAILED):
            self._cancel.append(self.store.watch(path, self._changed.set))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="chain-manager")

    async def stop(self) -> None:
        for cancel in self._cancel:
            cancel()
        self._cancel.clear()
        await cancel_and_wait(self._task)
        self._task = None
        channels, self._probe_channels = list(self._probe_channels.values()), {}
        for channel in channels:
            await channel.close()
        if self.configs is not None:
            self.configs.close()
            self.configs = None

    async def _run(self) -> None:
        while True:
            try:
                await self.round()
            except InvariantViolation:
                raise
            except Exception:      # a metadata or network hiccup: the next round retries
                raise_if_cancelling()
                log.exception("chain manager round failed")
            # while learners copy (their progress is polled) or after a change, soon; else
            # only when /nodes, /chains or /suspects change, with an idle round now and then
            await wait_event(self._changed, limits.HANDOFF_POLL_S if self._handing_off
                             else limits.CHAIN_MANAGER_INTERVAL_S if self._busy else limits.CHAIN_MANAGER_IDLE_ROUND_S)
            self._changed.clear()

    async def _live_storage(self) -> dict[str, NodeInfo]:
        return await reads.live_storage(self.store)

    async def confirm_suspects(self, nodes: dict[str, NodeInfo]) -> int:
        """Probe every node reported under /suspects; one whose port refused every probe
        is down (in this incarnation). Each report is deleted once looked at. Returns how
        many nodes were found down."""
        try:
            names = await self.store.children(metadata.SUSPECTS)
        except NoNodeError:
            return 0
        found = 0
        probes: dict[str, asyncio.Task] = {}          # node -> its NodeStatus probe, once a round
        for name in names[:limits.SUSPECTS_MAX]:
            if "~" in name:
                await self._link_report(name, nodes, probes)
                continue
            info = nodes.get(name)
            if info is not None and self._down_incarnation(name) != info.started_ms and await _refuses(info.internal_address):
                self.down[name] = (info.started_ms,
                                   "node refuses connections (its process is gone); confirmed by probes")
                found += 1
                log.warning("node %s refuses connections at %s: taken as failed before its session expires",
                            name, info.address)
            try:
                await self.store.delete(metadata.suspect_path(name))
            except NoNodeError:
                pass
        return found

    async def _link_report(self, name: str, nodes: dict[str, NodeInfo], probes: dict[str, asyncio.Task]) -> None:
        """One report of unresponsive chain links (StorageNode.link_unresponsive): probe
        both ends, choose the one to take out, and take it out of each reported chain the
        guards allow. The report is deleted once looked at."""
        path = metadata.suspect_path(name)
        try:
            entry = await self.store.get(path)
            report = json.loads(entry.value) if entry is not None else None
            if isinstance(report, dict) and report.get("kind") == "unresponsive":
                await self._act_on_link_report(report, nodes, probes)
        except (ValueError, KeyError, TypeError) as e:      # a report that does not parse: dropped
            log.warning("link report %s dropped: %s", name, e)
        finally:
            try:
                await self.store.delete(path)
            except NoNodeError:
                pass

    async def _act_on_link_report(self, report: dict, nodes: dict[str, NodeInfo],
                                  probes: dict[str, asyncio.Task]) -> None:
        reporter, peer, direction = str(report["reporter"]), str(report["peer"]), str(report["direction"])
        if direction not in ("successor", "predecessor"):
            raise ValueError(f"direction {direction!r}")
        if reporter not in nodes or peer not in nodes:
            return                         # gone already: the session (or a refused probe) handles it
        self.link_reports += 1
        started = now = time.monotonic()
        for node in (peer, reporter):
            known = self._probed.get(node)
            if node not in probes and (known is None or now - known[1] >= limits.LINK_ACK_TIMEOUT_S):
                probes[node] = asyncio.get_running_loop().create_task(
                    _answers(self.channels, nodes[node].internal_address, self._probe_channels))
        for node in (peer, reporter):
            if node in probes:
                self._probed[node] = (await probes[node], time.monotonic())
        peer_ok, reporter_ok = self._probed[peer][0], self._probed[reporter][0]
        predecessor, successor = (reporter, peer) if direction == "successor" else (peer, reporter)
        why = f"link {predecessor}->{successor} unresponsive ({report.get('reason', '')}); "
        if not peer_ok and reporter_ok:
            out, why = peer, why + f"{peer} did not answer the chain manager's probe"
        elif peer_ok and not reporter_ok:
            out, why = reporter, why + f"{reporter} did not answer the chain manager's probe"
        elif peer_ok and reporter_ok:
            if await self._link_recovered(nodes[reporter], peer, started):
                log.info("link %s->%s reported unresponsive, and it works again (one end stalled a moment): "
                         "nobody leaves", predecessor, successor)
                return
            out, why = successor, why + "both ends answer the chain manager: the successor leaves"
        else:
            log.warning("link %s->%s reported unresponsive, and neither end answers the chain manager: "
                        "left to their sessions", predecessor, successor)
            return
        configs = {c.chain_id: c for c, _v in await self._chains()}
        now = time.monotonic()
        for item in report["links"]:
            config = configs.get(str(item["chain_id"]))
            if config is None or config.epoch != int(item["epoch"]):
                continue                   # changed since the link broke: that link is gone
            if self._may_take_out(config, predecessor, successor, out, nodes, now):
                self.link_out.setdefault(config.chain_id, {})[out] = (
                    nodes[out].started_ms, why, now + limits.LINK_REMOVAL_INTERVAL_S, out in config.members)
                self._link_removals[(config.chain_id, frozenset((predecessor, successor)))] = \
                    now + limits.LINK_REMOVAL_INTERVAL_S
                log.warning("chain %s epoch %d: %s leaves: %s", chain_name(config.chain_id), config.epoch, out, why)

    async def _link_recovered(self, reporter: NodeInfo, peer: str, started: float) -> bool:
        """Both ends of a reported link answer the manager: the network between them fails,
        or one of them stalled a moment (a loaded machine) and runs again. The reporter is
        asked, every LINK_RECOVERY_POLL_S for up to LINK_RECOVERY_GRACE_S, when it last heard
        from the peer: a frame since this report was taken up means the link works again (a
        link broken as silent says hello again at once), and nobody leaves. The verdict
        stands for LINK_ACK_TIMEOUT_S, for the other reports of the same fault."""
        key = frozenset((reporter.node_id, peer))     # (either end's report of one fault: one look)
        known = self._recovered.get(key)
        if known is not None and time.monotonic() - known[1] < limits.LINK_ACK_TIMEOUT_S:
            return known[0]
        recovered = False
        deadline = time.monotonic() + limits.LINK_RECOVERY_GRACE_S
        while True:
            status = await _status(self.channels, reporter.internal_address, self._probe_channels)
            since = time.monotonic() - started
            heard = [ago for link_peer, _outgoing, ago in (status.peers_heard_ago_s if status is not None else ())
                     if link_peer == peer and ago >= 0]
            recovered = bool(heard) and min(heard) < since
            if recovered or time.monotonic() >= deadline:
                break
            await asyncio.sleep(limits.LINK_RECOVERY_POLL_S)
        self._recovered[key] = (recovered, time.monotonic())
        return recovered

    def _may_take_out(self, config: ChainConfig, predecessor: str, successor: str, out: str,
                      nodes: dict[str, NodeInfo], now: float) -> bool:
        """The guards: the link is still one of the chain's (the predecessor ships to the
        successor: its next member, or, as tail, a learner), it took nobody out of this chain
        lately, `out` is not the last member left, and the chain has lost no more than a
        minority of its members (at least one) to link reports lately."""
        adjacent = config.successor_of(predecessor) == successor if predecessor in config.members \
            and predecessor != config.tail else (predecessor == config.tail and successor in config.learners)
        if not adjacent or out in self.link_out.get(config.chain_id, {}):
            return False
        if self._link_removals.get((config.chain_id, frozenset((predecessor, successor))), 0.0) > now:
            return False
        if out not in config.members:
            return True                    # a learner: outside the commit path
        outs = self.link_out.get(config.chain_id, {})
        taken = {n for n, o in outs.items() if o[3]}          # members taken out lately
        stays = [m for m in config.members if m != out and m in nodes and m not in outs]
        before = len(set(config.members) | taken)
        return bool(stays) and len(taken) + 1 <= max(1, (before - 1) // 2)

    def _live_for(self, config: ChainConfig, live: dict[str, int], reasons: dict[str, str]
                  ) -> tuple[dict[str, int], dict[str, str]]:
        """The live nodes and the reasons `plan` sees for one chain: less the nodes a link
        report took out of it."""
        outs = self.link_out.get(config.chain_id)
        if not outs:
            return live, reasons
        return ({n: inc for n, inc in live.items() if n not in outs},
                {**reasons, **{n: o[1] for n, o in outs.items()}})

    def _expire_link_outs(self, nodes: dict[str, NodeInfo]) -> None:
        now = time.monotonic()
        kept: dict[str, dict[str, tuple[int, str, float, bool]]] = {}
        for cid, outs in self.link_out.items():
            left = {n: o for n, o in outs.items() if o[2] > now and n in nodes and nodes[n].started_ms == o[0]}
            if left:
                kept[cid] = left
        self.link_out = kept
        self._link_removals = {k: t for k, t in self._link_removals.items() if t > now}
        self._probed = {n: p for n, p in self._probed.items() if now - p[1] < limits.LINK_ACK_TIMEOUT_S}
        self._recovered = {k: r for k, r in self._recovered.items() if now - r[1] < limits.LINK_ACK_TIMEOUT_S}

    async def disk_failures(self, nodes: dict[str, NodeInfo]) -> int:
        """Nodes that reported under /disk_failed that their disk failed (storage/log.py
        StorageHealth): that incarnation is down, although it still answers: it refuses
        every write until it is restarted, so its chains go on without it. A report of an
        earlier incarnation is deleted (the node restarted)."""
        try:
            names = await self.store.children(metadata.DISK_FAILED)
        except NoNodeError:
            return 0
        found = 0
        for name in names[:limits.SUSPECTS_MAX]:
            entry = await self.store.get(metadata.disk_failed_path(name))
            try:
                incarnation = int(entry.value) if entry is not None else None
            except ValueError:
                incarnation = None
            info = nodes.get(name)
            if info is not None and info.started_ms == incarnation:
                if self._down_incarnation(name) != incarnation:
                    self.down[name] = (incarnation, "its disk failed a write (StorageFailed); restart it to rejoin")
                    found += 1
                    log.warning("node %s reports a failed disk: taken out of its chains", name)
            elif info is not None or entry is None or incarnation is None:
                try:       # a restarted node's old report (or a bad one): no longer true
                    await self.store.delete(metadata.disk_failed_path(name))
                except NoNodeError:
                    pass
        return found

    def _down_incarnation(self, node: str) -> int | None:
        return self.down[node][0] if node in self.down else None

    async def _chains(self) -> list[tuple[ChainConfig, int]]:
        if self.configs is None:
            self.configs = reads.ChainConfigs(self.store)
        return list((await self.configs.all()).values())

    async def _stream(self, name: str, cache: dict) -> StreamConfig | None:
        if name not in cache:
            got = await self._stream_configs.get(metadata.stream_path(name), StreamConfig.from_bytes)
            cache[name] = got[0] if got is not None else None
        return cache[name]

    async def _handoff_ready(self, config: ChainConfig, nodes: dict[str, NodeInfo], statuses: dict) -> bool:
        """The head takes no batch (frozen at this epoch) and the handoff's member holds
        the same log: every member between them does too."""
        if config.head not in nodes or config.handoff not in nodes:
            return False
        head = (await self._replica_status(nodes[config.head], statuses)).get(config.chain_id)
        target = (await self._replica_status(nodes[config.handoff], statuses)).get(config.chain_id)
        return (head is not None and target is not None and head.epoch == config.epoch == target.epoch
                and head.frozen and head.last_sn == target.last_sn)

    async def _moves_under_way(self, configs: list[tuple[ChainConfig, int]], streams: dict) -> int:
        """Chains holding more replicas than their factor (a move copying or finishing);
        a chain short of replicas counts as the whole budget: restoring comes first."""
        under_way = 0
        for config, _v in configs:
            stream = await self._stream(config.stream, streams)
            if stream is None:
                continue
            held = len(config.members) + len(config.learners)
            if held < stream.replication_factor:
                return limits.REBALANCE_MOVES_MAX
            if held > stream.replication_factor:
                under_way += 1
        return under_way

    async def _replica_status(self, node: NodeInfo, cache: dict) -> dict[str, rpc.ReplicaReport]:
        """chain id -> the node's replica of it; {} when the node does not answer (an
        unreachable node tells us nothing this round)."""
        if node.node_id not in cache:
            report = await self.channels.node_status(node.internal_address,
                                                     timeout_s=limits.CHAIN_MANAGER_INTERVAL_S * 4)
            cache[node.node_id] = report.by_chain() if report is not None else {}
        return cache[node.node_id]

    async def round(self, configs: list[tuple[ChainConfig, int]] | None = None) -> int:
        """One pass over every chain; returns the number of configs changed. `configs`
        (each with the store version it was read at) are read from the store unless
        given: a caller may decide on an earlier read, as a deposed leader would."""
        nodes = await self._live_storage()
        await self.confirm_suspects(nodes)
        await self.disk_failures(nodes)
        self._expire_link_outs(nodes)
        self.down = {n: d for n, d in self.down.items() if n in nodes and nodes[n].started_ms == d[0]}
        nodes = {n: info for n, info in nodes.items() if self._down_incarnation(n) != info.started_ms}
        live = {n: info.started_ms for n, info in nodes.items()}
        down_reasons = {n: why for n, (_inc, why) in self.down.items()}
        if configs is None:
            configs = await self._chains()
        draining = await reads.draining(self.store)
        self.rounds += 1
        load, heads = reads.load_of(c for c, _v in configs)     # as placement counts them
        learning = Counter()
        for config, _v in configs:
            load.update(config.learners)
            learning.update(config.learners)
        for n in nodes:
            load[n] += 0          # a live node with nothing yet counts, as the least loaded
        streams: dict = {}
        # moves (rebalancing onto new nodes, off draining ones) only while no chain is
        # short of replicas and no node is down, and only so many at once
        moves = 0 if self.down else limits.REBALANCE_MOVES_MAX - await self._moves_under_way(configs, streams)
        statuses: dict = {}
        changed = 0
        handoff_started = False
        restoring = False
        now_ms = int(time.time() * 1000)
        for config, version in configs:
            stream = await self._stream(config.stream, streams)
            if stream is None or stream.status is StreamStatus.DELETING:
                continue
            reports = {}
            if config.learners and config.tail in nodes:
                reports[config.tail] = (await self._replica_status(nodes[config.tail], statuses)).get(config.chain_id)
                for learner in config.learners:
                    if learner in nodes and reports[config.tail] is not None:
                        reports[learner] = (await self._replica_status(nodes[learner], statuses)).get(config.chain_id)
            progress = chains.learner_progress(config, reports)
            ready = bool(config.handoff) and await self._handoff_ready(config, nodes, statuses)
            live_here, reasons_here = self._live_for(config, live, down_reasons)
            new = chains.plan(config, live_here, stream.replication_factor, load, progress, now_ms, learning,
                              reasons_here, draining, move=moves > 0, heads=heads, handoff_ready=ready)
            if new is None:
                # (a chain waiting for the rest of its members after a whole-cluster restart:
                # look again soon, so it is restored when its wait ends, not at an idle round)
                restoring = restoring or chains.restore_waits(config, live_here, now_ms)
                continue
            moving = len(new.members) + len(new.learners) > stream.replication_factor
            if not config.learners and new.learners and moving or new.handoff and not config.handoff:
                moves -= 1
            try:
                # the chain's config, and /chains itself, so that every watcher of /chains
                # (storage nodes, metadata views) hears of the change at once
                await self.store.commit([Set(metadata.chain_path(config.chain_id), new.to_bytes(), version),
                                         Set(metadata.CHAINS, metadata.chains_note([config.chain_id]))])
            except (BadVersionError, NoNodeError):
                continue        # changed or deleted meanwhile: the next round sees the new state
            changed += 1
            self.changes += 1
            handoff_started = handoff_started or bool(new.handoff)
            for change in new.history[len(new.history) - _new_changes(config, new):]:
                metrics.CHAIN_CHANGES.labels(change.action).inc()
                # (routine steps, a replica copied in or a head handed over, at INFO; a member lost,
                # at WARNING: an operator's attention)
                log.log(logging.INFO if change.action in chains.ROUTINE_ACTIONS else logging.WARNING,
                        "chain %s epoch %d: %s %s (%s)", chain_name(config.chain_id), change.epoch, change.action,
                        change.node, change.reason)
            chains.count_change(load, learning, config, new)
            if not config.sealed:      # heads as reads.load_of counts them, so one round moves no more
                heads[config.handoff or config.head] -= 1
                heads[new.handoff or new.head] += 1
        # (the configs read this round, or a handoff started in it)
        self._handing_off = handoff_started or any(c.handoff for c, _v in configs)
        self._busy = bool(changed or learning or self.down or self._handing_off or restoring)
        if len(self._stream_configs) > 2 * len(streams) + 64:      # streams deleted meanwhile
            self._stream_configs.retain(lambda path: path.rpartition("/")[2] in streams)
        return changed


def _new_changes(old: ChainConfig, new: ChainConfig) -> int:
    seen = {(c.epoch, c.at_ms, c.action, c.node) for c in old.history}
    return sum(1 for c in new.history if (c.epoch, c.at_ms, c.action, c.node) not in seen)


async def _status(node_channels: rpc.NodeChannels, address: str,
                  channels: dict[str, grpc.aio.Channel]) -> rpc.NodeReport | None:
    """The node's NodeStatus without replicas (its peer links), within LINK_PROBE_TIMEOUT_S,
    on the manager's own long-lived channel to it (`channels`: no handshake in the bound);
    None when it does not answer in time."""
    channel = channels.get(address)
    if channel is None:
        if len(channels) >= limits.PROBE_CHANNELS_MAX:
            old = channels.pop(next(iter(channels)))
            background(old.close())
        channel = channels[address] = node_channels.peer_channel(address)
    return await node_channels.node_status(address, rpc.NO_REPLICAS, limits.LINK_PROBE_TIMEOUT_S, channel=channel)


async def _answers(node_channels: rpc.NodeChannels, address: str, channels: dict[str, grpc.aio.Channel]) -> bool:
    """True when the node at `address` answers a NodeStatus within LINK_PROBE_TIMEOUT_S: a
    paused process cannot, though its kernel accepts the connection."""
    return await _status(node_channels, address, channels) is not None


async def _refuses(address: str) -> bool:
    """True when FAILURE_PROBE_ATTEMPTS connects in a row are refused."""
    for attempt in range(limits.FAILURE_PROBE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(limits.FAILURE_PROBE_INTERVAL_S)
        if await rpc.probe_port(address, limits.FAILURE_PROBE_TIMEOUT_S) != rpc.PROBE_REFUSED:
            return False
    return True
