"""Network-fault trials: one network fault injected into a real cluster on test hosts
(network namespaces, tests/netfault/hosts.py) under load.

Topology of a trial (10 hosts on a private /24, one bridge, the test process in the
root namespace at .1):
  z1 z2 z3   a three-server ZooKeeper ensemble (tests/netfault/zkensemble.py)
  c1 c2      two control processes (they elect a leader)
  n1..n4     four storage nodes (storage, ingestion, retrieval)
  px         a delaying TCP proxy (tests/netfault/proxy.py), used by the `delay` kind
The stream has 4 partitions of replication factor 3 and de-duplication on; the load is
tests/fault/workload.py (4 de-duplicating producers, 1 tailing consumer, 1,500 records/s)
from the root namespace. Victims are taken from the chain (head, middle, tail) of partition
pT, T = the trial's seed mod 4, so trials 0..3 of a kind hit different nodes.

Kinds:
  node_node_cut          cut pT's head from its successor, both ways, NODE_CUT_HOLD_S; heal
  node_zk_cut            cut pT's middle from all three ZooKeeper servers until the chain
                         manager removes it (its session expired), then heal
  client_head_cut        cut the root namespace (every client) from pT's head, CLIENT_CUT_HOLD_S; heal
  zk_minority            cut the ZooKeeper leader from the two other servers (they keep
                         quorum and elect a new leader), ZK_MINORITY_HOLD_S; heal. During the
                         cut a stream is created (the metadata store must take writes)
  asymmetric             drop one direction only between pT's head and its successor
                         (trial seed even: head -> successor; odd: successor -> head), ASYM_HOLD_S
  head_isolated_from_zk  cut pT's head from ZooKeeper (clients still reach it) until the
                         chain manager removed it; then one PutRecords is sent straight to
                         the old head (a *fence probe*): it must not be acknowledged while the
                         head is isolated; writes must resume through the new head; heal
  packet_loss            drop LOSS_PROBABILITIES[seed] of the packets each way between every
                         two members of pT's chain, LOSS_HOLD_S; heal
  delay                  every connection from one storage node to another runs through the
                         proxy (iptables DNAT in the source host, set up before the stream is
                         created); the proxy adds DELAYS_MS[seed] one-way delay each way for
                         DELAY_HOLD_S, then none. Checked: the proxied links carried bytes under
                         delay, and the ack latency rose by at least the one-way delay
  node_pause             SIGSTOP pT's middle until the chain manager removed it from pT, then
                         SIGCONT. Its links stop answering (no acks to its predecessor, no
                         pings to its successor) and the manager's NodeStatus probe times out:
                         it leaves pT well before its session (3 s) would expire
  head_pause             the same with pT's head: found by its successor, whose stream from
                         it goes silent. The producers' requests held by the paused head are
                         given up once their map names the new head (PRODUCER_OWNER_CHECK_S)
                         and go there under the same SSSNs

The cuts between two nodes that both still reach ZooKeeper (`node_node_cut`, `asymmetric`)
and the pauses are found by link liveness (storage/link.py, LINK_ACK_TIMEOUT_S): the pytest
checks want the chain changed by a link report (its reason says "unresponsive"), not by
the session's expiry. How fast (pT's write pause, `max gap`, and the time to the removal)
are figures the trials print, to be read against LINK_FAULT_PAUSE_MAX_S; a timing is never
a test's assertion.

Each trial runs the load, injects the fault, heals, waits until writes resume and the
replication factor is back, stops the load, reads everything back and runs the history
checker (tests/fault/history.py): every acked record read once at its SN, nothing
duplicated, no reader saw a record that later vanished, writes resumed. The write pause
is measured two ways, from the moment every rule of the fault is in place: `fault->ack`
(the checker's: from then to the first ack of a record submitted after it, on the
partitions the fault touches) and `max gap` (the longest time one of those partitions
went without any ack, from the fault until it acked a record submitted after the heal):
a head cut from ZooKeeper keeps acking until the chain drops it, so only the second shows
the pause of the failover.

`python -m tests.netfault.trials [--trials N] [--seed S] [--dir D] [--hold S] [KIND ...]` runs them
(every kind by default) and prints the table; pytest runs a slice
(tests/netfault/test_netfault.py). Needs root, iproute2, iptables, java and Debian's
zookeeper (the trials say what is missing).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import sms
import sms.aio
from sms import errors, limits
from tests import credentials
from tests.conftest import wait_until as _wait
from tests.fault.history import CheckResult, History, check, format_table
from tests.fault.trials import _healed, _removed, _retry, known_bugs_in_logs
from tests.fault.workload import Workload, encode_payload, read_back
from tests.netfault.cluster import NetCluster
from tests.netfault.hosts import ROOT, Testbed, unavailable_reason
from tests.netfault.proxy import ProxyProcess
from tests.netfault.zkensemble import ZkEnsemble

KINDS = ("node_node_cut", "node_zk_cut", "client_head_cut", "zk_minority", "asymmetric",
         "head_isolated_from_zk", "packet_loss", "delay", "node_pause", "head_pause")
LINK_KINDS = ("node_node_cut", "asymmetric", "node_pause", "head_pause")    # found by link liveness
BOUNDED_KINDS = LINK_KINDS         # pT's write pause is read against LINK_FAULT_PAUSE_MAX_S

ZK_HOSTS = ("z1", "z2", "z3")
CONTROL_HOSTS = ("c1", "c2")
STORAGE_NODES = 4
HOSTS = (*ZK_HOSTS, *CONTROL_HOSTS, *(f"n{i}" for i in range(1, STORAGE_NODES + 1)), "px")
CONTROLS = len(CONTROL_HOSTS)
PARTITIONS = 4
REPLICATION = 3
PRODUCERS = 4
KEYS = 32
RATE_PER_S = 1_500.0
WARMUP_ACKS = 600
AFTER_ACKS = 600
ACK_TIMEOUT_S = 60.0            # a cut can stall a producer's partitions for its hold and more
HEAL_TIMEOUT_S = 60.0
REMOVE_TIMEOUT_S = 30.0         # a node cut from ZooKeeper leaves its chains within this (TTL 3 s)
STOP_TIMEOUT_S = 60.0
ZK_SERVING_TIMEOUT_S = 30.0

NODE_CUT_HOLD_S = 8.0           # past the session TTL: only link liveness finds this cut
LINK_FAULT_PAUSE_MAX_S = 1.5    # LINK_KINDS: pT's writes should pause at most this long (detection, probe, new epoch)
CLIENT_CUT_HOLD_S = 8.0
ASYM_HOLD_S = 8.0
ZK_MINORITY_HOLD_S = 6.0        # after the majority serves again
ZK_CUT_EXTRA_HOLD_S = 1.0       # after the victim left its chains
LOSS_HOLD_S = 10.0
DELAY_HOLD_S = 8.0
LOSS_PROBABILITIES = (0.10, 0.15, 0.20)
DELAYS_MS = (50, 100, 150, 200)
LATENCY_WINDOW_S = 3.0          # acks of records sent this long before the delay: the baseline
FENCE_PROBE_TIMEOUT_S = limits.APPEND_TIMEOUT_S + 5.0

STALE_ACK = "stale_ack"                 # the fence probe was acked by a head the chain had removed
DELAY_NOT_APPLIED = "delay_not_applied"  # the proxied links carried nothing, or latency did not rise
ZK_UNAVAILABLE = "zk_unavailable"       # the ensemble did not serve with a majority


@dataclass
class Trial:
    kind: str
    result: CheckResult
    victim: str
    healed_s: float | None
    hold_s: float = 0.0
    max_gap_s: float | None = None
    notes: list[str] = field(default_factory=list)
    seed: int = 0
    facts: dict = field(default_factory=dict)     # what the fault did, for tests to check
    directory: str = ""
    history: History | None = field(default=None, repr=False)

    @property
    def pause_s(self) -> float | None:
        """fault -> first ack of a record submitted after it (the checker's recovery)."""
        times = [r.recovery_s for r in self.result.recoveries]
        return None if not times or None in times else max(times)


@dataclass
class Env:
    bed: Testbed
    zk: ZkEnsemble
    cluster: NetCluster
    directory: str
    proxy: ProxyProcess | None = None


def skip_reason() -> str | None:
    """Why the trials cannot run here (None: they can)."""
    from tests.zkserver import skip_reason as zk_skip, zk_available
    reason = unavailable_reason()
    if reason:
        return reason
    if not zk_available():
        return zk_skip()
    return None


@contextlib.contextmanager
def environment(directory: str) -> Iterator[Env]:
    """Hosts, the ZooKeeper ensemble and the cluster on them; everything healed and
    stopped at the end, whatever happened."""
    os.makedirs(directory, exist_ok=True)
    with Testbed(HOSTS) as bed:
        with ZkEnsemble([bed[h] for h in ZK_HOSTS], os.path.join(directory, "zk")) as zk:
            cluster = NetCluster(os.path.join(directory, "cluster"), bed, nodes=STORAGE_NODES, controls=CONTROLS,
                                 metastore=zk.url(f"/sms-{uuid.uuid4().hex[:8]}"))
            cluster.start()
            env = Env(bed, zk, cluster, directory)
            try:
                yield env
            finally:
                bed.heal_all()
                try:
                    cluster.stop()
                finally:
                    if env.proxy is not None:
                        env.proxy.stop()


def run_trial(kind: str, directory: str, seed: int = 0, hold_s: float | None = None) -> Trial:
    """One trial; `hold_s` overrides the kind's hold (its *_HOLD_S)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    with environment(directory) as env:
        trial = _run(kind, env, seed, hold_s)
    trial.directory = directory
    return trial


# --- helpers -----------------------------------------------------------------------------------
def _chains(client: sms.Client, stream: str) -> dict[int, tuple[str, ...]]:
    info = _retry(lambda: client.get_stream_info(stream))
    return {p.ordinal: tuple(m.node_id for m in p.chain) for p in info.partitions}


def _adjacent(chain: tuple[str, ...], a: str, b: str) -> bool:
    return any({x, y} == {a, b} for x, y in zip(chain, chain[1:]))


def _hold(load: Workload, seconds: float) -> None:
    """Keep a fault on for `seconds` (its duration is the point), watching the load."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        load._raise_if_crashed()
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _acked_after(history: History, stream: str, partitions, since_s: float) -> bool:
    return any(a.stream == stream and a.partition in partitions and a.sent_s is not None and a.sent_s >= since_s
               for a in history.acks)


def write_pause(history: History, stream: str, partitions, start_s: float, healed_s: float) -> float | None:
    """The longest time any one partition of `partitions` (None: every partition) went
    without an ack, from the fault (start_s) until writes flowed again after the heal:
    until that partition's first ack of a record submitted after `healed_s`. None if a
    partition never acked such a record."""
    by: dict[int, list[float]] = {}
    resumed: dict[int, float] = {}
    for a in history.acks:
        if a.stream != stream or a.producer == "fence" or (partitions is not None and a.partition not in partitions):
            continue
        if a.time_s >= start_s:
            by.setdefault(a.partition, []).append(a.time_s)
        if a.sent_s is not None and a.sent_s >= healed_s:
            resumed[a.partition] = min(a.time_s, resumed.get(a.partition, a.time_s))
    worst = 0.0
    for partition in (partitions if partitions is not None else sorted(by)):
        if partition not in resumed:
            return None
        last = start_s
        for t in sorted(by.get(partition, ())):
            if t > resumed[partition]:
                break
            worst = max(worst, t - last)
            last = t
    return worst


def _latency_p50(history: History, stream: str, sent_from: float, sent_to: float) -> float | None:
    lat = [a.time_s - a.sent_s for a in history.acks
           if a.stream == stream and a.sent_s is not None and sent_from <= a.sent_s < sent_to and not a.duplicate]
    return statistics.median(lat) if lat else None


def _fence_probe(address: str, stream: str, hash_key: int, history: History, timeout_s: float) -> tuple[str, float]:
    """One PutRecords with one record for the partition of `hash_key`, straight to the
    node at `address` (no routing, no retry). Recorded in the history as a submit of
    producer "fence" and its ack or failure; returns (outcome, answer time on the
    history's clock): "acked SN ..." or the error's name."""
    from sms.aio import _encode_puts
    from sms.proto import sms_pb2
    payload = f"fence-{uuid.uuid4().hex[:6]}"
    key = "fence-probe"
    encoded = _encode_puts([(key, encode_payload(payload, 48), hash_key)])
    request = sms_pb2.PutRecordsRequest(stream=stream, count=1, entries=encoded[0][0])
    history.record_submit(stream, "fence", 0, key, payload)
    sent = history.now()

    async def call():
        client = sms.aio.Client(address)
        try:
            return await client.send_put_records(address, request, timeout_s=timeout_s)
        finally:
            await client.close()
    import asyncio
    try:
        resp = asyncio.run(call())
    except errors.SmsError as e:
        history.record_error(e.name, payload, producer="fence", stream=stream, message=e.message)
        return e.name, history.now()
    except Exception as e:                        # a transport failure is no ack either
        history.record_error(type(e).__name__, payload, producer="fence", stream=stream, message=str(e))
        return type(e).__name__, history.now()
    from sms import wire
    if resp.errors:
        e = resp.errors[0]
        history.record_error(e.name, payload, producer="fence", stream=stream, message=e.message)
        return e.name, history.now()
    sns, ordinals = wire.decode_put_results(resp.sequence_numbers, resp.ordinals, 1)
    history.record_ack(stream, ordinals[0], key, payload, sns[0], producer="fence", seq=0, sent_s=sent)
    return f"acked SN {sns[0]}", history.now()


# --- the trial ------------------------------------------------------------------------------
def _run(kind: str, env: Env, seed: int, hold_override: float | None = None) -> Trial:
    bed, cluster, zk = env.bed, env.cluster, env.zk
    host = lambda node_id: cluster.placement[node_id]            # noqa: E731 -- node id -> host name
    addresses = [cluster.procs[n].address for n in cluster.control_ids]
    notes: list[str] = [f"seed {seed}"]
    facts: dict = {}
    stream = f"net-{kind}".replace("_", "-")
    if kind == "delay":
        env.proxy = ProxyProcess(os.path.join(env.directory, "proxy"), bed["px"]).start()
        routes = {}
        for a in cluster.storage_ids:
            for b in cluster.storage_ids:
                if a != b:
                    # nodes call each other at the cluster port (plaintext: the one port)
                    ip, port = (cluster.procs[b].cluster_address or cluster.procs[b].address).rsplit(":", 1)
                    via = env.proxy.add(f"{a}->{b}", f"{ip}:{port}")
                    bed.redirect(host(a), (ip, int(port)), via)
                    routes[(a, b)] = f"{a}->{b}"
    with sms.Client(",".join(addresses)) as client:
        info = client.create_stream(stream, partitions=PARTITIONS, replication_factor=REPLICATION)
        target = seed % PARTITIONS                 # the partition whose chain the victims come from
        pt = info.partition(target)
        head, middle, tail = (m.node_id for m in pt.chain)
        notes.append(f"p{target} {head}-{middle}-{tail}")
        chains0 = _chains(client, stream)
        holding = lambda node: [o for o, c in chains0.items() if node in c]            # noqa: E731
        victim = head
        delay_check = None
        with Workload(addresses, stream, producers=PRODUCERS, keys=KEYS, consumers=1, rate_per_s=RATE_PER_S,
                      name=kind[:3], seed=seed, delivery_timeout_s=120.0) as load:
            history = load.history
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            scope: list[int] | None
            fault_s = 0.0

            def mark(partitions: list[int] | None) -> None:
                """The fault is on (every rule in place): the time writes are measured from."""
                nonlocal fault_s
                fault_s = history.now()
                history.mark_fault(kind, time_s=fault_s, stream=stream, partitions=partitions)
            if kind in ("node_node_cut", "asymmetric"):
                victim = f"{head}<->{middle}"
                scope = [o for o, c in chains0.items() if _adjacent(c, head, middle)]
                direction = "both"
                if kind == "asymmetric":
                    direction = "a->b" if seed % 2 == 0 else "b->a"
                    victim = f"{head}->{middle}" if direction == "a->b" else f"{middle}->{head}"
                with bed.cut(host(head), host(middle), direction) as cut:
                    mark(scope)
                    _hold(load, hold_override or (NODE_CUT_HOLD_S if kind == "node_node_cut" else ASYM_HOLD_S))
                    facts["dropped_packets"] = cut.packets()
            elif kind in ("node_pause", "head_pause"):
                victim = middle if kind == "node_pause" else head
                scope = [target]
                cluster.signal(victim, signal.SIGSTOP)
                try:
                    mark(scope)
                    _wait(lambda: _removed(client, stream, victim, target), REMOVE_TIMEOUT_S,
                          f"{victim} removed from p{target} while paused")
                    removed_s = history.now()
                finally:
                    cluster.signal(victim, signal.SIGCONT)
                notes.append(f"{victim} ({'head' if victim == head else 'middle'}) left p{target} "
                             f"{removed_s - fault_s:.2f}s after the pause")
                facts["removed_after_s"] = removed_s - fault_s
            elif kind == "client_head_cut":
                scope = [o for o, c in chains0.items() if c[0] == head]
                with bed.cut(ROOT, host(head)) as cut:
                    mark(scope)
                    _hold(load, hold_override or CLIENT_CUT_HOLD_S)
                    facts["dropped_packets"] = cut.packets()
            elif kind in ("node_zk_cut", "head_isolated_from_zk"):
                victim = middle if kind == "node_zk_cut" else head
                scope = holding(victim)
                cuts = [bed.cut(host(victim), z) for z in ZK_HOSTS]
                try:
                    mark(scope)
                    _wait(lambda: _removed(client, stream, victim, target), REMOVE_TIMEOUT_S,
                          f"{victim} removed from p{target} once cut from ZooKeeper")
                    removed_s = history.now()
                    notes.append(f"{victim} left p{target} {removed_s - fault_s:.1f}s after the cut")
                    facts["removed_after_s"] = removed_s - fault_s
                    if kind == "head_isolated_from_zk":
                        outcome, answered_s = _fence_probe(cluster.procs[victim].address, stream, pt.hash_lo,
                                                           history, FENCE_PROBE_TIMEOUT_S)
                        notes.append(f"fence probe to the old head: {outcome} after {answered_s - removed_s:.1f}s")
                        facts["fence_probe"] = outcome
                        _wait(lambda: _acked_after(history, stream, [target], removed_s), ACK_TIMEOUT_S,
                              f"p{target} acks a record sent after the old head was removed (through the new head)")
                        new_head = _chains(client, stream)[target][0]
                        notes.append(f"p{target} writes resumed through {new_head}")
                        facts["new_head"] = new_head
                    else:
                        _hold(load, hold_override or ZK_CUT_EXTRA_HOLD_S)
                    facts["dropped_packets"] = sum(c.packets() for c in cuts)
                finally:
                    for c in cuts:
                        c.heal()
            elif kind == "zk_minority":
                leader = zk.leader()
                if leader is None:
                    raise AssertionError(f"no ZooKeeper leader before the fault: {zk.modes()}")
                victim = f"zk {leader.name} (leader)"
                others = [bed[z] for z in ZK_HOSTS if z != leader.name]
                scope = None
                cuts = [bed.cut(leader.name, o.name) for o in others]
                try:
                    mark(None)
                    t0 = time.monotonic()
                    modes = zk.wait_serving(ZK_SERVING_TIMEOUT_S, others)
                    _wait(lambda: zk.modes()[leader.name] is None, ZK_SERVING_TIMEOUT_S,
                          f"the cut-off server {leader.name} stops serving")
                    notes.append(f"majority serving after {time.monotonic() - t0:.1f}s, new leader "
                                 f"{[n for n, m in modes.items() if m == 'leader']}")
                    t0 = time.monotonic()
                    _retry(lambda: client.create_stream(stream + "-during", partitions=1, replication_factor=2),
                           ZK_SERVING_TIMEOUT_S)
                    notes.append(f"created a stream during the cut in {time.monotonic() - t0:.1f}s")
                    facts["created_during_cut_s"] = time.monotonic() - t0
                    facts["isolated_mode"] = zk.modes()[leader.name]
                    _hold(load, hold_override or ZK_MINORITY_HOLD_S)
                    facts["dropped_packets"] = sum(c.packets() for c in cuts)
                finally:
                    for c in cuts:
                        c.heal()
                zk.wait_serving(ZK_SERVING_TIMEOUT_S)
            elif kind == "packet_loss":
                p = LOSS_PROBABILITIES[seed % len(LOSS_PROBABILITIES)]
                victim = f"{head},{middle},{tail} loss {p:.2f}"
                scope = [o for o, c in chains0.items()
                         if any(_adjacent(c, a, b) for a, b in ((head, middle), (middle, tail), (head, tail)))]
                faults = [bed.loss(host(a), host(b), p) for a, b in ((head, middle), (middle, tail), (head, tail))]
                try:
                    mark(scope)
                    _hold(load, hold_override or LOSS_HOLD_S)
                    facts["dropped_packets"] = sum(f.packets() for f in faults)
                finally:
                    for f in faults:
                        f.heal()
            elif kind == "delay":
                d_ms = DELAYS_MS[seed % len(DELAYS_MS)]
                victim = f"node links +{d_ms}ms each way"
                scope = None
                before = env.proxy.stats()
                env.proxy.set("*", up_ms=d_ms, down_ms=d_ms)
                try:
                    mark(None)
                    _hold(load, hold_override or DELAY_HOLD_S)
                finally:
                    env.proxy.set("*", up_ms=0, down_ms=0)
                end_s = history.now()
                after = env.proxy.stats()
                link = routes[(head, middle)]
                delayed = after[link]["delayed_bytes"]["up"] - before[link]["delayed_bytes"]["up"]
                accepted = sum(r["accepted"] for r in after.values())
                base = _latency_p50(history, stream, fault_s - LATENCY_WINDOW_S, fault_s)
                during = _latency_p50(history, stream, fault_s + 1.0, end_s - 0.5)
                notes.append(f"{accepted} proxied connections; {delayed} bytes {link} under delay; ack latency "
                             f"p50 {_ms(base)} before, {_ms(during)} during")
                delay_check = (delayed, base, during, d_ms)
                facts.update(delay_ms=d_ms, delayed_bytes=delayed, latency_before_s=base, latency_during_s=during)
            else:
                raise AssertionError(kind)
            healed_at = history.now()
            hold_s = healed_at - fault_s
            # writes resume, the replication factor comes back
            before = load.acked_count()
            load.wait_acks(before + AFTER_ACKS, ACK_TIMEOUT_S)
            started = time.monotonic()
            _wait(lambda: _healed(client, stream), HEAL_TIMEOUT_S, "replication factor restored")
            healed_s = time.monotonic() - started
            load.wait_acks(load.acked_count() + AFTER_ACKS // 2, ACK_TIMEOUT_S)
            stats = load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=history)
        chains1 = _chains(client, stream)
        facts["removals"] = [(c["node"], c["reason"]) for c in _retry(lambda: client.get_stream_info(stream))
                             .partition(target).history if c["action"] == "removed"]
    result = check(history, final)
    gap = write_pause(history, stream, scope, fault_s, healed_at)
    changed = {o: (chains0[o], chains1.get(o)) for o in chains0 if chains1.get(o) != chains0[o]}
    facts["chains_changed"] = sorted(changed)
    if "dropped_packets" in facts:
        notes.append(f"{facts['dropped_packets']} packets dropped")
    notes.append("chains unchanged" if not changed else
                 "chains changed: " + ", ".join(f"p{o} {'-'.join(a)} -> {'-'.join(b or ())}"
                                                for o, (a, b) in sorted(changed.items())))
    if kind == "head_isolated_from_zk":
        for a in history.acks:
            if a.producer == "fence":
                result.add(STALE_ACK, f"the fence probe sent to {victim} after the chain manager removed it "
                                      f"was acked (p{a.partition} SN {a.sn})")
    if kind == "delay":
        delayed, base, during, d_ms = delay_check
        if delayed <= 0:
            result.add(DELAY_NOT_APPLIED, f"no byte crossed the proxied link {head}->{middle} under delay")
        if base is None or during is None or during - base < d_ms / 1000:
            result.add(DELAY_NOT_APPLIED, f"ack latency p50 {_ms(base)} before, {_ms(during)} during a delay of "
                                          f"{d_ms} ms each way: expected a rise of at least {d_ms} ms")
    if stats["errors"]:
        notes.append(f"errors {stats['errors']}")
    notes += [f"known bug: {b}" for b in known_bugs_in_logs(cluster.data_dir)]
    return Trial(kind, result, victim, healed_s, hold_s, gap, notes, seed, facts, history=history)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


# --- the table ------------------------------------------------------------------------------
def pause_table(trials: list[Trial]) -> str:
    """Per kind: the fault held (s), the checker's fault->ack (p50, max), the longest ack
    gap on the touched partitions (p50, max), and for BOUNDED_KINDS how many trials kept it
    within LINK_FAULT_PAUSE_MAX_S (a figure to read, not a pass/fail)."""
    by: dict[str, list[Trial]] = {}
    for t in trials:
        by.setdefault(t.kind, []).append(t)
    head = ("fault", "trials", "ok", "hold s", "fault->ack p50", "max", "max gap p50", "max",
            f"gap <= {LINK_FAULT_PAUSE_MAX_S}s")
    lines = [head]
    for kind, ts in by.items():
        pauses = [t.pause_s for t in ts]
        gaps = [t.max_gap_s for t in ts]

        def fmt(values, f):
            known = [v for v in values if v is not None]
            if not known:
                return "-"
            return "never" if None in values and f is max else f"{f(known):.2f}"
        lines.append((kind, str(len(ts)), str(sum(t.result.ok for t in ts)),
                      f"{statistics.median(t.hold_s for t in ts):.1f}",
                      fmt(pauses, statistics.median), fmt(pauses, max), fmt(gaps, statistics.median), fmt(gaps, max),
                      f"{sum(g is not None and g <= LINK_FAULT_PAUSE_MAX_S for g in gaps)}/{len(ts)}"
                      if kind in BOUNDED_KINDS else "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join([line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:])]).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="network-fault trials on network-namespace test hosts")
    parser.add_argument("kinds", nargs="*", default=list(KINDS), metavar="KIND",
                        help=f"default: all of {', '.join(KINDS)}")
    parser.add_argument("--trials", type=int, default=3, help="trials per kind")
    parser.add_argument("--seed", type=int, default=0, help="trial i of a kind runs with seed SEED + i")
    parser.add_argument("--dir", help="keep trial directories here (default: a temp dir)")
    parser.add_argument("--hold", type=float, help="hold every fault this long (s) instead of its kind's *_HOLD_S")
    args = parser.parse_args(argv)
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; expected some of {', '.join(KINDS)}")
    reason = skip_reason()
    if reason:
        print(f"cannot run network-fault trials: {reason}", file=sys.stderr)
        return 2
    with credentials.for_this_run():        # (pytest makes them in tests/conftest.py)
        return _run_kinds(args)


def _run_kinds(args) -> int:
    trials, failures = [], []
    base = args.dir or tempfile.mkdtemp(prefix="sms-netfault-")
    for kind in args.kinds:
        for i in range(args.trials):
            seed = args.seed + i
            directory = os.path.join(base, f"{kind}-{i}")
            t0 = time.monotonic()
            try:
                trial = run_trial(kind, directory, seed=seed, hold_s=args.hold)
            except Exception as e:          # a trial that could not finish is a failed trial
                failures.append(f"{kind} #{i} (seed {seed}): {e!r}; logs in {directory}")
                print(f"{kind:<22} #{i}: ERROR {e!r}", flush=True)
                continue
            trials.append(trial)
            r = trial.result
            healed = f"{trial.healed_s:.1f}s" if trial.healed_s is not None else "-"
            print(f"{kind:<22} #{i}: {'ok' if r.ok else 'FAILED'} acked {r.acked} lost {r.lost} dup {r.duplicates} "
                  f"failed {r.failed} victim {trial.victim} hold {trial.hold_s:.1f}s "
                  f"fault->ack {_s(trial.pause_s)} max gap {_s(trial.max_gap_s)} rf restored after {healed} "
                  f"({time.monotonic() - t0:.0f}s); {'; '.join(trial.notes)}", flush=True)
            if not r.ok:
                failures.append(f"{kind} #{i} (seed {seed}): {r.summary()}; logs in {directory}")
    print()
    print(format_table([(t.kind, t.result) for t in trials]))
    print()
    print(pause_table(trials))
    for f in failures:
        print("FAILED:", f)
    print(f"session TTL {limits.METASTORE_SESSION_TTL_S}s; trial dirs in {base}")
    return 1 if failures else 0


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}s"


if __name__ == "__main__":
    sys.exit(main())
