"""Fault trials of chain failover and repartitioning: one fault injected into a real
cluster under load.

A trial starts a cluster of separate processes (2 control processes that elect a
leader, 4 storage nodes) on one metadata backend (the embedded store, or a real
ZooKeeper server), creates a stream with replication factor 3 and de-duplication on,
runs de-duplicating producers and tailing consumers (tests/fault/workload.py), injects
one fault while they run, waits until writes resume and the replication factor is
restored, stops the load, reads the whole stream back and runs the history checker
(tests/fault/history.py): every acked record read once at its acked SN and in order, no
reader saw a record that was later missing, writes resumed.

Kinds:
  kill_head / kill_middle / kill_tail   kill -9 that member of partition 0's chain
  kill_ingestion                        kill -9 the node owning ingestion of the most partitions
  kill_control                          kill -9 the control leader (a standby takes over), then a head
  pause                                 SIGSTOP a head past its session timeout, then SIGCONT (on the
                                        embedded store, never while it holds the store's writer
                                        lock: see _pause)
  expire_session                        expire a head's ZooKeeper session (zk backend only)
  restart                               kill -9 a head and restart it on its data
  kill_producer                         kill -9 a producer process (tests/fault/producer_proc.py) and
                                        start it again with the same producer id while the others
                                        run; its log counts every record it was told was acked

Repartition kinds (REPARTITION_KINDS): the trial asks for a split, merge or scale of the
stream while the load runs, and injects the fault during the switch -- once a parent is
seen sealed (a scale: once its first step is committed); the notes say which phase the
fault actually hit (`sealed`, `committed` when the switch was quicker than the poll,
`step N`):
  split_kill_head        split p0; kill -9 p0's head (taken from get_stream_info first)
  split_kill_control     split p0; kill -9 the control leader: the standby finishes it
  split_pause_head       split p0; SIGSTOP p0's head until the chain drops it (past its
                         session), then SIGCONT (as `pause`)
  split_expire_control   split p0; expire the control leader's ZooKeeper session (zk only)
  merge_kill_head        merge p0 + p1; kill -9 p0's head
  scale_kill_control     scale 4 -> 6 partitions (3 splits, 3 merges), kill -9 the control
                         leader after the first step: the standby does the rest
The request's call may fail when its control process dies; the trial then waits until
the stream config shows the request done (re-issuing it if it was never recorded). After
the fault writes must resume on the parents' keys (the first ack, in a parent or a
descendant, of a record submitted after the fault; a scale: on the partitions the fault
left sealed), the replication factor come back, and then: the map shows the request
done (parents CLOSED with their children, or, if the request ended with an error, the
parents OPEN and unsealed); no OPEN partition is left sealed; a record put to every
open partition is stored there; `read_stream` (the lineage walk) yields what the
per-partition read-back holds, parents before children, each key's SNs increasing; and
the history checker passes (the consumers follow the lineage too). The notes name the
control process that committed each step, and product bugs known by their log lines.

`python -m tests.fault.trials [--trials N] [--backend embedded|zk|both] [--seed S] [KIND ...]`
runs the full set (every kind above) and prints the table of trials; pytest runs one
trial of each kind (tests/fault/test_failover.py, tests/fault/test_repartition_faults.py).
Trial i of a kind runs with seed S + i (the workload's key choices); a failure names it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import threading
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest

import sms
from sms import errors, limits
from sms.hashing import HASH_SPACE
from node.launcher import LocalCluster
from sms.types import PartitionState, StreamInfo
from tests import credentials
from tests.conftest import wait_until as _wait
from tests.fault.history import CheckResult, History, ReadRecord, check, format_table
from tests.fault import producer_proc
from tests.fault.workload import Workload, read_back, read_lineage

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KINDS = ("kill_head", "kill_middle", "kill_tail", "kill_ingestion", "kill_control", "pause", "expire_session",
         "restart", "kill_producer")
REPARTITION_KINDS = ("split_kill_head", "split_kill_control", "split_pause_head", "split_expire_control",
                     "merge_kill_head", "scale_kill_control")
ALL_KINDS = KINDS + REPARTITION_KINDS
ZK_ONLY = frozenset({"expire_session", "split_expire_control"})
# `make test` runs every kind on ZooKeeper (the production backend) and these on the embedded
# store; the rest of the embedded matrix is a sweep (`make test-full`), to keep CI in budget
EMBEDDED_IN_CI = frozenset({"kill_head", "pause", "split_kill_head", "kill_producer"})


def case_marks(kind: str, backend: str) -> tuple:
    """pytest marks of one trial of the matrix: `sweep` for those `make test` leaves out."""
    return (pytest.mark.sweep,) if backend == "embedded" and kind not in EMBEDDED_IN_CI else ()
BACKENDS = ("embedded", "zk")

STORAGE_NODES = 4
CONTROLS = 2
PARTITIONS = 4
REPLICATION = 3
PRODUCERS = 4
KEYS = 32
RATE_PER_S = 1_500.0
WARMUP_ACKS = 600             # acked before the fault
AFTER_ACKS = 600              # acked after it, on top
ACK_TIMEOUT_S = 45.0
HEAL_TIMEOUT_S = 60.0         # the replication factor is back within this
PROCESS_ACKS = 150            # kill_producer: acks of the producer process before the kill, and after its restart
PROCESS_RATE_PER_S = 300.0
STOP_TIMEOUT_S = 45.0

# repartition trials
SCALE_TARGET = 6              # 4 -> 6 even ranges: split, split, merge, split, split, merge
PHASE_TIMEOUT_S = 15.0        # the request reaches the phase the fault waits for within this
PHASE_POLL_S = 0.005
DONE_TIMEOUT_S = 90.0         # the request is done (the config says so) within this after the fault
DONE_POLL_S = 0.05
REISSUES_MAX = 3              # re-issues of a request that the failed call never recorded
CALL_JOIN_S = 15.0            # the request's call returns within this once the config says done
LINEAGE_TIMEOUT_S = 20.0      # read_stream holds what the per-partition read-back holds by then
USABLE_TIMEOUT_S = 15.0       # an open partition takes a record within this, after everything healed
PAUSE_PROBE_TIMEOUT_S = 1.0   # a paused victim holds the embedded store's writer lock if no write begins by then
PAUSE_RETRIES_MAX = 10
REPARTITION_VIOLATION = "repartition"   # the request's outcome is not what the map shows
LINEAGE_VIOLATION = "lineage"           # read_stream disagrees with the read-back, or its order
UNUSABLE_VIOLATION = "unusable"         # an open partition refused a record afterwards


@dataclass
class Trial:
    kind: str
    backend: str
    result: CheckResult
    victim: str
    healed_s: float | None
    notes: str = ""
    seed: int = 0
    history: History | None = field(default=None, repr=False)    # the workload's, for a post-mortem
    phase: str = ""                    # repartition kinds: where the request was when the fault hit
    call_error: str | None = None      # ... and the error its (first) call ended with; None: it returned
    committers: tuple[str, ...] = ()   # ... and the control process that committed each step, in order


def _info(client: sms.Client, stream: str):
    return client.get_stream_info(stream)


def _healed(client: sms.Client, stream: str, victim: str | None = None) -> bool:
    """Every chain back at full length, no learner pending (and, if given, the victim
    is no longer in its old place or has rejoined properly)."""
    try:
        info = _info(client, stream)
    except errors.SmsError:
        return False
    return all(len(p.chain) == REPLICATION and not p.learners and all(m.address for m in p.chain)
               for p in info.partitions)


def _removed(client: sms.Client, stream: str, victim: str, ordinal: int) -> bool:
    try:
        p = _info(client, stream).partition(ordinal)
    except errors.SmsError:
        return False
    return victim not in [m.node_id for m in p.chain]


def _leader(cluster: LocalCluster, client: sms.Client) -> str:
    address = client.describe_cluster().control_address
    for node_id in cluster.control_ids:
        if cluster.procs[node_id].address == address:
            return node_id
    raise AssertionError(f"control leader {address} is none of {cluster.control_ids}")



class _WriterLockProbe:
    """Whether a write transaction on the cluster's embedded metadata store (one LMDB
    file shared by every process) can begin: LMDB has one writer at a time, so it cannot
    while a stopped process holds the writer lock. The probe opens the file in this
    process (which opens it nowhere else), only ever begins a write and aborts it."""

    def __init__(self, cluster: LocalCluster):
        import lmdb
        path = cluster.metastore.removeprefix("embedded://")
        self.env = lmdb.open(path, subdir=False, map_size=limits.METASTORE_MAP_BYTES,
                             max_readers=limits.LMDB_MAX_READERS, max_dbs=5, lock=True)
        self._threads: list[threading.Thread] = []

    def free(self, timeout_s: float) -> bool:
        began = threading.Event()

        def attempt() -> None:
            txn = self.env.begin(write=True)        # blocks while another process holds the lock
            txn.abort()
            began.set()
        thread = threading.Thread(target=attempt, name="writer-lock-probe", daemon=True)
        self._threads.append(thread)
        thread.start()
        return began.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        for thread in self._threads:                # a blocked attempt ends once the lock is free
            thread.join(timeout_s)
        if not any(t.is_alive() for t in self._threads):
            self.env.close()


def _pause(cluster: LocalCluster, backend: str, victim: str, until, what: str) -> int:
    """SIGSTOP `victim` until `until()` holds (its session expired, the chain dropped it),
    then SIGCONT it. On the embedded backend a process stopped while it holds the store's
    LMDB writer lock stalls every other process's metadata writes, heartbeats included,
    until it runs again (a limit the store documents, metastore/embedded.py); past
    the session TTL every session then expires at once when it resumes. That is not the
    fault under test, so such a pause is undone at once (well within the TTL) and tried
    again a moment later. Returns how many pauses were undone so."""
    probe = _WriterLockProbe(cluster) if backend == "embedded" else None
    retries = 0
    try:
        while True:
            cluster.signal(victim, signal.SIGSTOP)
            if probe is None or probe.free(PAUSE_PROBE_TIMEOUT_S):
                break
            cluster.signal(victim, signal.SIGCONT)
            retries += 1
            if retries > PAUSE_RETRIES_MAX:
                raise AssertionError(f"{victim} held the metadata store's writer lock at each of "
                                     f"{retries} pauses")
            time.sleep(random.uniform(0.01, 0.1))
        try:
            _wait(until, HEAL_TIMEOUT_S, what)
        finally:
            cluster.signal(victim, signal.SIGCONT)
    finally:
        if probe is not None:
            probe.close()
    return retries


@contextlib.contextmanager
def backend_store(backend: str, directory: str):
    """The metastore URL of a trial: None (the cluster's embedded store) or a prefix on
    a ZooKeeper server started for it."""
    if backend == "embedded":
        yield None, None
        return
    from tests.zkserver import ZkServer
    server = ZkServer(os.path.join(directory, "zk")).start()
    try:
        yield server.url(f"/sms-{uuid.uuid4().hex[:8]}"), server
    finally:
        server.stop()


def run_trial(kind: str, backend: str, directory: str, seed: int = 0) -> Trial:
    if kind not in ALL_KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(ALL_KINDS)}")
    if kind in ZK_ONLY and backend != "zk":
        raise ValueError(f"{kind} needs the zk backend")
    os.makedirs(directory, exist_ok=True)
    with backend_store(backend, directory) as (url, zk):
        cluster = LocalCluster(os.path.join(directory, "cluster"), nodes=STORAGE_NODES, port=0, metastore=url,
                               controls=CONTROLS, expose_sessions=zk is not None)
        cluster.start()
        try:
            if kind in REPARTITION_KINDS:
                return _run_repartition(kind, backend, cluster, zk, seed)
            return _run(kind, backend, cluster, zk)
        finally:
            cluster.stop()


def _run(kind: str, backend: str, cluster: LocalCluster, zk) -> Trial:
    addresses = [cluster.procs[n].address for n in cluster.control_ids]
    notes = ""
    with sms.Client(cluster.address) as client:
        stream = f"fault-{kind}".replace("_", "-")
        info = client.create_stream(stream, partitions=PARTITIONS, replication_factor=REPLICATION)
        p0 = info.partition(0)
        roles = {m.role: m.node_id for m in p0.chain}
        victim = {"kill_head": roles["head"], "kill_middle": roles["middle"], "kill_tail": roles["tail"],
                  "pause": roles["head"], "expire_session": roles["head"], "restart": roles["head"],
                  "kill_control": roles["head"]}.get(kind)
        if kind == "kill_ingestion":
            owners = Counter(p.ingestion_owner.node_id for p in info.partitions)
            victim = owners.most_common(1)[0][0]
        if kind == "kill_producer":
            return _run_kill_producer(backend, cluster, client, stream, addresses)
        affected = [p.ordinal for p in info.partitions if victim in [m.node_id for m in p.chain]]
        heads = [p.ordinal for p in info.partitions if p.chain[0].node_id == victim]
        with Workload(addresses, stream, producers=PRODUCERS, keys=KEYS, consumers=1, rate_per_s=RATE_PER_S,
                      name=kind[:4]) as load:
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            if kind == "kill_control":
                leader = _leader(cluster, client)
                load.mark_fault("kill_control_leader", partitions=heads or affected)
                cluster.kill(leader)
                notes = f"leader {leader} killed, then head {victim}"
                cluster.kill(victim)          # the new leader must carry out the failover
                # no config lost, and admin calls reach the new leader
                assert client.get_stream_info(stream).partition(0).hash_hi == p0.hash_hi
                client.create_stream(stream + "-after", partitions=1, replication_factor=2)
            elif kind in ("kill_head", "kill_middle", "kill_tail", "kill_ingestion"):
                load.mark_fault(kind, partitions=heads or affected)
                cluster.kill(victim)
            elif kind == "restart":
                load.mark_fault(kind, partitions=heads or affected)
                cluster.kill(victim)
                cluster.restart(victim)
            elif kind == "pause":
                load.mark_fault(kind, partitions=heads or affected)
                retries = _pause(cluster, backend, victim, lambda: _removed(client, stream, victim, 0),
                                 f"{victim} removed from p0 while paused")
                if retries:
                    notes = f"paused {retries + 1} times: it held the embedded store's writer lock"
            elif kind == "expire_session":
                from tests.zkserver import expire_session
                creds = _session_credentials(cluster, victim)
                load.mark_fault(kind, partitions=heads or affected)
                expire_session(zk.hosts, creds[0], creds[1])
            before = load.acked_count()
            load.wait_acks(before + AFTER_ACKS, ACK_TIMEOUT_S)
            started = time.monotonic()
            _wait(lambda: _healed(client, stream), HEAL_TIMEOUT_S, "replication factor restored")
            healed_s = time.monotonic() - started
            load.wait_acks(load.acked_count() + AFTER_ACKS // 2, ACK_TIMEOUT_S)
            load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=load.history)
    result = check(load.history, final)
    return Trial(kind, backend, result, victim, healed_s, notes)


# --- the producer-restart trial ----------------------------------------------------------------
class _ProducerProcess:
    """The producer process of `kill_producer` (tests/fault/producer_proc.py): one log file
    per incarnation, each start with the same producer id."""

    def __init__(self, address: str, stream: str, directory: str):
        self.address, self.stream, self.directory = address, stream, directory
        self.producer_id = f"restarted-{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen | None = None
        self.incarnation = 0

    def log(self, incarnation: int) -> str:
        return os.path.join(self.directory, f"producer-proc-{incarnation}.log")

    def start(self) -> None:
        self.incarnation += 1
        with open(self.log(self.incarnation) + ".err", "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.fault.producer_proc", "--address", self.address, "--stream",
                 self.stream, "--producer-id", self.producer_id, "--name", "px", "--incarnation",
                 str(self.incarnation), "--log", self.log(self.incarnation), "--rate", str(PROCESS_RATE_PER_S)],
                cwd=_REPO_ROOT, stdout=subprocess.DEVNULL, stderr=err)

    def wait_acks(self, n: int) -> None:
        def enough() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                with open(self.log(self.incarnation) + ".err") as err:
                    raise AssertionError(f"the producer process exited with {self.proc.returncode}: "
                                         f"{err.read()[-2000:]}")
            return producer_proc.count_acks(self.log(self.incarnation)) >= n
        _wait(enough, ACK_TIMEOUT_S, f"{n} acks of producer process #{self.incarnation}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM: it stops sending, flushes and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def load(self, history: History) -> str:
        """Every incarnation's log into the history; a note of what each was told."""
        notes = []
        for i in range(1, self.incarnation + 1):
            acks, unsettled = producer_proc.load_log(self.log(i), history, self.stream, f"px#{i}")
            notes.append(f"#{i}: {acks} acked, {unsettled} in flight at its end")
        return "producer process " + "; ".join(notes)


def _run_kill_producer(backend: str, cluster: LocalCluster, client: sms.Client, stream: str,
                       addresses: list[str]) -> Trial:
    """kill_producer: the process writes beside the workload's producers; it is killed with
    SIGKILL and started again under the same producer id (a new epoch); both incarnations'
    acks must be in the read-back, once, at their SNs."""
    directory = os.path.join(cluster.data_dir, "producer-proc")
    os.makedirs(directory, exist_ok=True)
    proc = _ProducerProcess(cluster.address, stream, directory)
    proc.start()
    try:
        with Workload(addresses, stream, producers=PRODUCERS, keys=KEYS, consumers=1, rate_per_s=RATE_PER_S,
                      name="kprd") as load:
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            proc.wait_acks(PROCESS_ACKS)
            load.mark_fault("kill_producer")
            proc.kill()
            proc.start()                        # the same id: a new epoch
            proc.wait_acks(PROCESS_ACKS)
            load.wait_acks(load.acked_count() + AFTER_ACKS // 2, ACK_TIMEOUT_S)
            proc.stop()
            load.stop(STOP_TIMEOUT_S)
        notes = proc.load(load.history)
        final = read_back(client, stream, history=load.history)
    finally:
        proc.stop()
    return Trial("kill_producer", backend, check(load.history, final), "producer process", 0.0, notes)


# --- repartition trials ------------------------------------------------------------------------
@dataclass(frozen=True)
class RepartitionPlan:
    op: str                     # split / merge / scale
    fault: str                  # kill_head / kill_control / pause_head / expire_control
    parents: tuple[int, ...]    # the partitions the request closes first (a scale: every open one)
    target: int = 0             # scale only

    def call(self, client: sms.Client, stream: str) -> StreamInfo:
        if self.op == "split":
            return client.split(stream, self.parents[0])
        if self.op == "merge":
            return client.merge(stream, *self.parents)
        return client.scale(stream, self.target)


REPARTITION_PLANS = {
    "split_kill_head": RepartitionPlan("split", "kill_head", (0,)),
    "split_kill_control": RepartitionPlan("split", "kill_control", (0,)),
    "split_pause_head": RepartitionPlan("split", "pause_head", (0,)),
    "split_expire_control": RepartitionPlan("split", "expire_control", (0,)),
    "merge_kill_head": RepartitionPlan("merge", "kill_head", (0, 1)),
    "scale_kill_control": RepartitionPlan("scale", "kill_control", tuple(range(PARTITIONS)), SCALE_TARGET),
}
assert set(REPARTITION_PLANS) == set(REPARTITION_KINDS)


class _Call:
    """One repartition call on a thread of its own (it blocks until the request is done),
    with its own client: the trial goes on polling and injecting meanwhile."""

    def __init__(self, address: str, stream: str, plan: RepartitionPlan):
        self.address, self.stream, self.plan = address, stream, plan
        self.info: StreamInfo | None = None
        self.error: BaseException | None = None
        self.started_s = time.monotonic()
        self.ended_s: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, name=f"repartition-{stream}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            with sms.Client(self.address) as client:
                self.info = self.plan.call(client, self.stream)
        except BaseException as e:              # reported by the trial
            self.error = e
        finally:
            self.ended_s = time.monotonic()
            self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    @property
    def error_name(self) -> str | None:
        if self.error is None:
            return None
        return getattr(self.error, "name", type(self.error).__name__)

    def join(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s)

    def outcome(self) -> str:
        if not self.finished:
            return "still waiting"
        return f"{self.error_name or 'ok'} after {self.ended_s - self.started_s:.1f}s"


def _phase(info: StreamInfo, plan: RepartitionPlan, before_id: str | None) -> str | None:
    """Where the request is, as the map shows it: None (not started), sealed, committed,
    `step N` (a scale: N steps committed), done."""
    rp = info.repartition or {}
    ours = rp.get("id") not in (None, before_id)
    if ours and rp.get("done"):
        return "done"
    if plan.op == "scale":
        steps = rp.get("steps_done", 0) if ours else 0
        return f"step {steps}" if steps else None
    by = {p.ordinal: p for p in info.partitions}
    if any(o in by and by[o].state is PartitionState.CLOSED for o in plan.parents):
        return "committed"
    if any(o in by and by[o].sealed for o in plan.parents):
        return "sealed"
    return None


def _wait_phase(client: sms.Client, stream: str, plan: RepartitionPlan, before_id: str | None,
                call: _Call) -> str:
    """Poll until the switch is under way (a parent sealed; a scale: its first step
    committed), or it is past that; the phase seen."""
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    while True:
        try:
            phase = _phase(client.get_stream_info(stream), plan, before_id)
        except errors.SmsError:
            phase = None
        if phase is not None:
            return phase
        if call.finished:
            return f"call ended first ({call.outcome()})"
        if time.monotonic() > deadline:
            return f"not started after {PHASE_TIMEOUT_S}s"
        time.sleep(PHASE_POLL_S)


def _finish_request(client: sms.Client, addresses: str, stream: str, plan: RepartitionPlan,
                    before_id: str | None, call: _Call) -> tuple[dict, StreamInfo, list[str]]:
    """Wait until the stream config shows the request done; if the call failed and no
    request of ours is recorded, issue it again. Returns the config's record of it, the
    stream, and notes of what happened to the calls."""
    notes = []
    calls = [call]
    deadline = time.monotonic() + DONE_TIMEOUT_S
    while True:
        try:
            info = client.get_stream_info(stream)
        except errors.SmsError:
            info = None
        rp = (info.repartition or {}) if info is not None else {}
        ours = rp.get("id") not in (None, before_id)
        if ours and rp.get("done"):
            break
        last = calls[-1]
        if info is not None and not ours and last.finished and last.error is not None:
            if len(calls) > REISSUES_MAX:
                raise AssertionError(f"{stream}: the {plan.op} was never recorded after {len(calls)} calls: "
                                     f"{[c.outcome() for c in calls]}")
            notes.append(f"re-issued after {last.outcome()}")
            calls.append(_Call(addresses, stream, plan))
        if time.monotonic() > deadline:
            raise AssertionError(f"{stream}: the {plan.op} is not done {DONE_TIMEOUT_S}s after the fault; "
                                 f"its record {rp}; calls {[c.outcome() for c in calls]}")
        time.sleep(DONE_POLL_S)
    for c in calls:
        c.join(CALL_JOIN_S)
    notes.append("call " + ", then ".join(c.outcome() for c in calls))
    return rp, info, notes


def _committers(cluster: LocalCluster, stream: str) -> list[str]:
    """Which control process committed each step of the stream's repartitions, in order,
    from the control logs ("stream S: split of p0000 committed, ...")."""
    steps = []
    for node_id in cluster.control_ids:
        path = os.path.join(cluster.data_dir, "logs", f"{node_id}.log")
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    if f" stream {stream}: " in line and " committed, map version " in line:
                        steps.append((" ".join(line.split()[:2]), node_id))
        except OSError:
            continue
    return [node_id for _, node_id in sorted(steps)]


def _check_outcome(result: CheckResult, info: StreamInfo, plan: RepartitionPlan, rp: dict) -> str:
    """The map agrees with how the request ended; the outcome for the notes."""
    by = {p.ordinal: p for p in info.partitions}

    def bad(message: str) -> None:
        result.add(REPARTITION_VIOLATION, f"{info.name}: {message}; request {rp}")

    for p in info.partitions:
        if p.state is PartitionState.OPEN and p.sealed:
            bad(f"p{p.ordinal} is OPEN but sealed after the request ended: its keys take no writes")
    if rp.get("error"):
        for o in plan.parents:
            p = by.get(o)
            if p is None or p.state is not PartitionState.OPEN or p.sealed:
                bad(f"the request failed, yet parent p{o} is "
                    f"{'gone' if p is None else f'{p.state.value} sealed={p.sealed}'}")
        return f"ended with error {rp['error']}"
    closed = [p for p in info.partitions if p.state is PartitionState.CLOSED]
    steps = len({p.children for p in closed})
    if rp.get("steps_done") != steps:
        bad(f"steps_done {rp.get('steps_done')} but the map shows {steps} splits and merges")
    if plan.op == "split":
        p = by[plan.parents[0]]
        kids = [by.get(c) for c in p.children]
        if p.state is not PartitionState.CLOSED or len(kids) != 2 or None in kids:
            bad(f"split done, yet p{p.ordinal} is {p.state.value} with children {p.children}")
        else:
            a, b = sorted(kids, key=lambda k: k.hash_lo)
            if (a.hash_lo, a.hash_hi, b.hash_hi) != (p.hash_lo, b.hash_lo, p.hash_hi) or \
                    any(k.state is not PartitionState.OPEN or k.parents != (p.ordinal,) for k in kids):
                bad(f"split children {[(k.ordinal, k.hash_lo, k.hash_hi, k.state.value, k.parents) for k in kids]} "
                    f"do not cover p{p.ordinal} [{p.hash_lo}, {p.hash_hi})")
    elif plan.op == "merge":
        a, b = (by[o] for o in plan.parents)
        if a.state is not PartitionState.CLOSED or b.state is not PartitionState.CLOSED or \
                len(a.children) != 1 or a.children != b.children or a.children[0] not in by:
            bad(f"merge done, yet p{a.ordinal} {a.state.value} -> {a.children}, "
                f"p{b.ordinal} {b.state.value} -> {b.children}")
        else:
            c = by[a.children[0]]
            if c.state is not PartitionState.OPEN or (c.hash_lo, c.hash_hi) != (a.hash_lo, b.hash_hi) or \
                    sorted(c.parents) != sorted(plan.parents):
                bad(f"merge child p{c.ordinal} {c.state.value} [{c.hash_lo}, {c.hash_hi}) parents {c.parents}")
    else:
        opened = sorted((p for p in info.partitions if p.state is PartitionState.OPEN), key=lambda p: p.hash_lo)
        want = [i * HASH_SPACE // plan.target for i in range(plan.target)] + [HASH_SPACE]
        got = [p.hash_lo for p in opened] + [opened[-1].hash_hi if opened else 0]
        if got != want:
            bad(f"scale to {plan.target} done, yet the open partitions are "
                f"{[(p.ordinal, p.hash_lo, p.hash_hi) for p in opened]}")
    return f"done in {steps} step{'s' if steps != 1 else ''}"


def _sealed_now(client: sms.Client, stream: str) -> list[int]:
    """The OPEN partitions whose heads take no writes right now (sealed for a step)."""
    try:
        info = client.get_stream_info(stream)
    except errors.SmsError:
        return []
    return sorted(p.ordinal for p in info.partitions if p.state is PartitionState.OPEN and p.sealed)


def _scope(info: StreamInfo, parents: list[int]) -> list[int] | None:
    """The partitions whose acks show that the parents' keys are written again: the
    parents and their descendants (None, every partition, if no parent is known)."""
    if not parents:
        return None
    by = {p.ordinal: p for p in info.partitions}
    out, todo = set(), list(parents)
    while todo:
        o = todo.pop()
        if o not in out:
            out.add(o)
            todo.extend(by[o].children if o in by else ())
    return sorted(out)


def _check_lineage(result: CheckResult, client: sms.Client, info: StreamInfo, final: list[ReadRecord]) -> None:
    """read_stream (the lineage walk) yields exactly the read-back's records, a parent's
    before any of its children's, and each key's SNs increase along it."""
    want = Counter((r.partition, r.sn, r.payload) for r in final)
    deadline = time.monotonic() + LINEAGE_TIMEOUT_S
    while True:                     # a replica may serve a closed parent a moment behind: read again
        rows = read_lineage(client, info.name, timeout_s=max(1.0, deadline - time.monotonic()))
        got = Counter((r.partition, r.sn, r.payload) for r in rows)
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    prefix = f"{info.name}: read_stream"
    for (o, sn, payload), n in sorted((want - got).items())[:5]:
        result.add(LINEAGE_VIOLATION, f"{prefix} misses {payload} p{o} SN {sn} (read-back has it) "
                                      f"[{sum((want - got).values())} missing in all]")
    for (o, sn, payload), n in sorted((got - want).items())[:5]:
        result.add(LINEAGE_VIOLATION, f"{prefix} yields {payload} p{o} SN {sn} x{n} beyond the read-back "
                                      f"[{sum((got - want).values())} extra in all]")
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, r in enumerate(rows):
        first.setdefault(r.partition, i)
        last[r.partition] = i
    for p in info.partitions:
        for parent in p.parents:
            if p.ordinal in first and parent in last and last[parent] > first[p.ordinal]:
                result.add(LINEAGE_VIOLATION, f"{prefix} yielded a record of p{p.ordinal} (#{first[p.ordinal]}) "
                                              f"before the last of its parent p{parent} (#{last[parent]})")
    by_key: dict[str, ReadRecord] = {}
    bad = 0
    for r in rows:
        before = by_key.get(r.partition_key)
        if before is not None and r.sn <= before.sn:
            bad += 1
            if bad <= 5:
                result.add(LINEAGE_VIOLATION, f"{prefix} key {r.partition_key!r}: {r.payload} p{r.partition} SN "
                                              f"{r.sn} after {before.payload} p{before.partition} SN {before.sn}")
        by_key[r.partition_key] = r


def _check_usable(result: CheckResult, client: sms.Client, stream: str) -> int:
    """A record put into every open partition (by explicit hash key) is stored there;
    the number of partitions probed. Run after the read-back: the checker never sees
    these records."""
    info = _retry(lambda: client.get_stream_info(stream))
    opened = [p for p in info.partitions if p.state is PartitionState.OPEN]
    for p in opened:
        try:
            r = _retry(lambda: client.put_record(stream, f"probe-{p.ordinal}".encode(), f"probe-{p.ordinal}",
                                                 explicit_hash_key=p.hash_lo), USABLE_TIMEOUT_S)
        except errors.SmsError as e:
            result.add(UNUSABLE_VIOLATION, f"{stream}: p{p.ordinal} refused a record: {e.name}: {e.message}")
            continue
        if r.partition_ordinal != p.ordinal:
            result.add(UNUSABLE_VIOLATION, f"{stream}: a record for hash {p.hash_lo} went to p{r.partition_ordinal}, "
                                           f"not the open partition p{p.ordinal} covering it")
    return len(opened)


def _retry(call, timeout_s: float = ACK_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except errors.SmsError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def producer_key_inversions(history: History, stream: str) -> int:
    """How many of the checker's reorderings are a producer's records of one partition
    key acked at SNs out of submission order (check() (c), counted the same way), told
    apart from other reorderings: how the producer's per-key order bug across a
    repartition showed (tests/fault/test_repartition_faults.py
    test_producer_keeps_key_order_when_a_parent_had_unsent_records)."""
    first: dict[str, object] = {}
    for a in history.acks:
        if a.stream == stream and a.payload not in first:
            first[a.payload] = a
    sessions: dict[tuple[str, str], list] = defaultdict(list)
    for a in first.values():
        if a.producer and a.seq >= 0 and a.sn is not None:
            sessions[(a.producer, a.partition_key)].append(a)
    count = 0
    for acks in sessions.values():
        acks.sort(key=lambda a: a.seq)
        count += sum(1 for before, after in zip(acks, acks[1:]) if after.sn <= before.sn)
    return count


# product bugs that trials run into, by what they leave in the node logs
LOG_SIGNATURES = {
    "RuntimeError: Lock is not acquired.":
        "a replica's progress lock leaked in Replica.wait_committed (tests/fault/test_repartition_faults.py "
        "test_replica_closes_after_a_wait_committed_cancelled_at_its_timeout); that node's chain sync hangs",
}


def known_bugs_in_logs(data_dir: str) -> list[str]:
    """The LOG_SIGNATURES found in a cluster's node logs, as "node: what"."""
    found = []
    logs = os.path.join(data_dir, "logs")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else ():
        try:
            with open(os.path.join(logs, name), errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        found += [f"{name.removesuffix('.log')}: {what}" for sig, what in LOG_SIGNATURES.items() if sig in text]
    return found


def _run_repartition(kind: str, backend: str, cluster: LocalCluster, zk, seed: int) -> Trial:
    plan = REPARTITION_PLANS[kind]
    # every node as a seed: the first control process may be the one that dies
    addresses = ",".join(cluster.procs[n].address for n in cluster.procs)
    control_addresses = [cluster.procs[n].address for n in cluster.control_ids]
    notes = [f"seed {seed}"]
    with sms.Client(addresses) as client:
        stream = kind.replace("_", "-")
        client.create_stream(stream, partitions=PARTITIONS, replication_factor=REPLICATION)
        with Workload(control_addresses, stream, producers=PRODUCERS, keys=KEYS, consumers=1,
                      rate_per_s=RATE_PER_S, name=kind[:2] + kind.rsplit("_", 1)[-1][:2], seed=seed) as load:
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            # the victim, as the cluster stands right before the request
            info = client.get_stream_info(stream)
            before_id = (info.repartition or {}).get("id")
            head = info.partition(plan.parents[0]).chain[0].node_id
            leader = _leader(cluster, client)
            victim = head if plan.fault in ("kill_head", "pause_head") else leader
            creds = _session_credentials(cluster, leader) if plan.fault == "expire_control" else None
            call = _Call(addresses, stream, plan)
            phase = _wait_phase(client, stream, plan, before_id, call)
            fault_s = load.history.now()
            if plan.fault in ("kill_head", "kill_control"):
                cluster.kill(victim)
            elif plan.fault == "pause_head":
                retries = _pause(cluster, backend, victim,
                                 lambda: _removed(client, stream, victim, plan.parents[0]),
                                 f"{victim} removed from p{plan.parents[0]} while paused")
                if retries:
                    notes.append(f"paused {retries + 1} times: it held the embedded store's writer lock")
            elif plan.fault == "expire_control":
                from tests.zkserver import expire_session
                expire_session(zk.hosts, creds[0], creds[1])
            notes.append(f"{plan.fault} {victim} at phase {phase}")
            # a split or merge: its parents' keys; a scale: those of the step under way (the
            # partitions the fault left sealed), every partition if it hit between steps
            stalled = list(plan.parents) if plan.op != "scale" else _sealed_now(client, stream)
            if plan.op == "scale":
                notes[-1] += f" (sealed then: {stalled or 'none'})"
            rp, info, call_notes = _finish_request(client, addresses, stream, plan, before_id, call)
            call_error = call.error_name if call.finished else "still waiting"
            notes += call_notes
            # writes of the parents' keys resumed: acks in the parents or their children of
            # records submitted after the fault (known now that the request is done)
            load.history.mark_fault(kind, time_s=fault_s, stream=stream, partitions=_scope(info, stalled))
            before = load.acked_count()
            load.wait_acks(before + AFTER_ACKS, ACK_TIMEOUT_S)
            started = time.monotonic()
            _wait(lambda: _healed(client, stream), HEAL_TIMEOUT_S, "replication factor restored")
            healed_s = time.monotonic() - started
            load.wait_acks(load.acked_count() + AFTER_ACKS // 2, ACK_TIMEOUT_S)
            load.stop(STOP_TIMEOUT_S)
        final = read_back(client, stream, history=load.history)
        result = check(load.history, final)
        inversions = producer_key_inversions(load.history, stream)
        if inversions:
            notes.append(f"{inversions} of {result.reorderings} reorderings are a producer's key out of order")
        info = _retry(lambda: client.get_stream_info(stream))
        notes.append(_check_outcome(result, info, plan, rp))
        _check_lineage(result, client, info, final)
        probed = _check_usable(result, client, stream)
        notes.append(f"{probed} open partitions took a probe")
        committers = _committers(cluster, stream)
        if plan.fault in ("kill_control", "expire_control"):
            notes.append(f"steps committed by {', '.join(committers) or 'nobody (per the logs)'}"
                         + ("" if any(c != leader for c in committers) else
                            f": the fault came after the switch ({leader} did it all)"))
        stats = load.statistics()
        if stats["errors"]:
            notes.append(f"producer errors {stats['errors']}")
        notes += [f"known bug: {b}" for b in known_bugs_in_logs(cluster.data_dir)]
    return Trial(kind, backend, result, victim, healed_s, "; ".join(notes), seed, load.history, phase, call_error,
                 tuple(committers))


def _session_credentials(cluster: LocalCluster, node_id: str) -> tuple[int, bytes]:
    """The node's ZooKeeper session id and password, which it writes (test clusters
    only) next to its ready file."""
    path = os.path.join(cluster.data_dir, "run", f"{node_id}.session")
    _wait(lambda: os.path.exists(path), 10.0, f"{path}")
    with open(path) as f:
        d = json.load(f)
    return int(d["session_id"]), bytes.fromhex(d["password"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chain failover and repartition fault trials")
    parser.add_argument("kinds", nargs="*", default=list(ALL_KINDS), metavar="KIND",
                        help=f"default: all of {', '.join(ALL_KINDS)}")
    parser.add_argument("--trials", type=int, default=3, help="trials per kind and backend")
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--seed", type=int, default=0, help="trial i of a kind runs with seed SEED + i")
    parser.add_argument("--dir", help="keep trial directories here (default: a temp dir)")
    args = parser.parse_args(argv)
    unknown = [k for k in args.kinds if k not in ALL_KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; expected some of {', '.join(ALL_KINDS)}")
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    with credentials.for_this_run():        # (pytest makes them in tests/conftest.py)
        return _run_kinds(args, backends)


def _run_kinds(args, backends) -> int:
    rows, failures = [], []
    base = args.dir or tempfile.mkdtemp(prefix="sms-fault-")
    for backend in backends:
        for kind in args.kinds:
            if kind in ZK_ONLY and backend != "zk":
                continue
            for i in range(args.trials):
                seed = args.seed + i
                directory = os.path.join(base, f"{backend}-{kind}-{i}")
                t0 = time.monotonic()
                try:
                    trial = run_trial(kind, backend, directory, seed=seed)
                except Exception as e:          # a trial that could not finish is a failed trial
                    failures.append(f"{backend} {kind} #{i} (seed {seed}): {e!r}; logs in {directory}")
                    print(f"{backend:<8} {kind:<20} #{i}: ERROR {e!r}", flush=True)
                    continue
                rows.append((f"{kind} ({backend})", trial.result))
                healed = f"{trial.healed_s:.1f}s" if trial.healed_s is not None else "-"
                print(f"{backend:<8} {kind:<20} #{i}: {'ok' if trial.result.ok else 'FAILED'} "
                      f"acked {trial.result.acked} lost {trial.result.lost} dup {trial.result.duplicates} "
                      f"resume {[round(r.recovery_s, 2) if r.recovery_s else None for r in trial.result.recoveries]} "
                      f"rf restored after {healed} ({time.monotonic() - t0:.0f}s) {trial.notes}", flush=True)
                if not trial.result.ok:
                    failures.append(f"{backend} {kind} #{i} (seed {seed}): {trial.result.summary()}; "
                                    f"logs in {directory}")
    print()
    print(format_table(rows))
    for f in failures:
        print("FAILED:", f)
    print(f"session TTL {limits.METASTORE_SESSION_TTL_S}s; trial dirs in {base}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
