"""SPS workers as real processes: lease balance, failover, fencing, splits, Spark.

Every test runs stage workers as `python -m node graph run GRAPH --stage S` processes
(each in a process group of its own, always stopped at teardown) against the module's
LocalCluster, with the stage's operations in tests/integration/sps_ops.py. A stage is a
consumer group of its input (sms/consumer.py; its lease table and members kept below the
stream by the cluster, control/groups.py), and the workers use the cluster's API only. A
`LeaseWatch` polls that lease table and the members from a thread of its own every
WATCH_INTERVAL_S, so the tests see how leases move (and time it) without touching the
workers; a `Feeder` writes input records continuously from another thread. Nothing
sleeps and hopes: every wait is `wait_until` on the lease table, the output, or a log.

What the tests check (the acceptance list of the SPS issue):

1. three workers share 8 input partitions evenly (2 or 3 leases each, stable), as the
   lease table and `sms graph status --json` both say;
2. kill -9 of one of them: its leases move to the others within the failover time plus
   a round (the time is measured and printed), and with input written before, during and
   after the kill, the output holds each expected record exactly once;
3. a worker SIGSTOPped inside a batch (held at a gate in its operation, after the lease
   write that names the batch as pending, before its outputs) until a peer has taken the
   lease and gone past that batch, then SIGCONTed: it never writes the lease table again
   (no snapshot owned by it, no peer loses a lease), its log says it lost the lease, and
   the output is still exactly once;
4. a split of the input during processing: the children's leases are claimed only after
   the parent's reached SHARD_END, and per key the outputs come in the inputs' order;
5. (slow) the Spark engine (real PySpark, local[1]) in two worker processes, one of them
   kill -9'd midway: the output is exactly once.

The payloads of tests 1-5 are `KEY:SEQ` with a zero-padded SEQ, so per key they sort in
input order. Two product bugs these tests found are fixed and kept as regressions:
`test_per_key_order_with_unsorted_payloads` (the worker sorted a batch's outputs by key
and data, so payloads that do not sort in input order came out reordered within a batch)
and `test_status_reports_records_done` (the lease's `records` stayed 0 for an open
partition).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import sms
from metastore import NoNodeError, open_metastore
from sms import limits
from sms.hashing import hash_key_of
from sms.types import PartitionState, Record
from control.groups import group_path
from sms.leases import SHARD_END, TRIM_HORIZON, Lease, lease_key
from tests.conftest import stream_name, wait_until
from tests.integration import sps_ops

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OPS = "tests.integration.sps_ops"

FAILOVER_S = 3.0                   # the stages' failover time (short, so failover tests are quick)
ROUND_S = FAILOVER_S / 3           # a worker's round
MOVE_SLACK_S = 2.0                 # scheduling on a loaded 2-core machine
WATCH_INTERVAL_S = 0.05
WORKER_START_S = 30.0              # interpreter start, imports, registration
BALANCE_S = 30.0                   # to even lease counts (a few rounds; takes are one per round)
STABLE_S = 2.0                     # "balanced" must hold this long (two rounds)
SPARK_START_S = 240.0              # two SparkSessions starting on a (possibly loaded) 2-core machine
DONE_S = 90.0                      # every input processed once input stopped
STOP_S = 20.0                      # SIGTERM to exit (a final checkpoint and release)
LOST_LINE = re.compile(r"(\S+): lost (\S+) to a peer")


# --- processes ---------------------------------------------------------------------------

def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def sms_cli(cluster, *args: str, timeout_s: float = 60.0) -> str:
    proc = subprocess.run([sys.executable, "-m", "node", *args, "--address", cluster.address,
                           "--metastore", cluster.metastore], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"sms {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


class Workers:
    """The worker processes of one stage; each is the leader of its own process group (a
    Spark worker's JVM is in it too), so teardown ends exactly what was started."""

    def __init__(self, cluster, graph: Path, stage: str, log_dir: Path):
        self.cluster, self.graph, self.stage, self.log_dir = cluster, graph, stage, log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, worker_id: str, env: dict[str, str] | None = None, master: str = "local[1]") -> None:
        with open(self.log_path(worker_id), "wb") as log:
            self.procs[worker_id] = subprocess.Popen(
                [sys.executable, "-m", "node", "graph", "run", str(self.graph), "--stage", self.stage,
                 "--worker-id", worker_id, "--address", self.cluster.address, "--metastore", self.cluster.metastore,
                 "--master", master],
                cwd=ROOT, env=_env(env), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def log_path(self, worker_id: str) -> Path:
        return self.log_dir / f"{worker_id}.log"

    def log(self, worker_id: str) -> str:
        return self.log_path(worker_id).read_text(errors="replace")

    def alive(self, worker_id: str) -> bool:
        return self.procs[worker_id].poll() is None

    def signal(self, worker_id: str, sig: int) -> None:
        os.kill(self.procs[worker_id].pid, sig)

    def kill9(self, worker_id: str) -> None:
        """kill -9 the worker and everything in its group (its JVM, if it runs Spark)."""
        proc = self.procs[worker_id]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self, worker_id: str) -> int:
        """SIGTERM (it checkpoints and releases its leases), SIGKILL after STOP_S."""
        proc = self.procs[worker_id]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pass
        self._kill_group(proc)
        return proc.wait()

    @staticmethod
    def _kill_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # the worker's own group: it and its children
        except (ProcessLookupError, PermissionError):
            pass

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._kill_group(proc)
            proc.wait()


# --- the lease table, watched -----------------------------------------------------------

@dataclass
class Snapshot:
    t: float                              # time.monotonic() when the poll ended
    leases: dict[str, Lease]
    workers: list[str]

    def owners(self) -> Counter:
        return Counter(lease.owner for lease in self.leases.values() if lease.owner and not lease.done)


@dataclass
class LeaseWatch:
    """Polls one stage's lease table and registered workers every WATCH_INTERVAL_S from a
    thread of its own (its own metastore client and event loop) and keeps every snapshot.

    It reads the entries itself rather than through `LeaseTable.all()`, for the order:
    each poll reads the leases of higher ordinals first: a child partition (a higher
    ordinal than its parents) is read before its parents, so a child seen claimed while a
    parent read after it is not at SHARD_END is a real violation of parents-first order
    (recorded in `order_violations`)."""

    metastore: str
    stage: str
    source: str                      # the stage's input: its lease table is the stage's group of it
    snapshots: list[Snapshot] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._store = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="lease-watch", daemon=True)

    def start(self) -> "LeaseWatch":
        self._thread.start()
        assert self._ready.wait(30), f"the lease watch did not start: {self.errors}"
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _main(self) -> None:
        try:
            self._store = open_metastore(self.metastore)
            await self._store.start()
        except Exception as e:  # noqa: BLE001
            self.errors.append(repr(e))
            self._ready.set()
            return
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        try:
            while not self._stop.is_set():
                try:
                    await self._poll()
                except Exception as e:  # noqa: BLE001 (a read racing a write; the next poll sees it)
                    self.errors.append(repr(e))
                await asyncio.sleep(WATCH_INTERVAL_S)
        finally:
            await self._store.close()

    async def _poll(self) -> None:
        group = group_path(self.source, self.stage)
        try:
            names = await self._store.children(f"{group}/leases")
        except NoNodeError:
            names = []
        leases: dict[str, Lease] = {}
        for name in sorted(names, key=int, reverse=True):
            entry = await self._store.get(f"{group}/leases/{name}")
            if entry is not None and entry.value:
                leases[lease_key(self.source, int(name))] = Lease.from_bytes(entry.value, entry.version)
        try:
            workers = sorted(await self._store.children(f"{group}/members"))
        except NoNodeError:
            workers = []
        snap = Snapshot(time.monotonic(), leases, workers)
        for lease in leases.values():
            if lease.counter == 0:
                continue                    # never claimed
            for p in lease.parents:
                parent = leases.get(lease_key(lease.stream, p))
                if parent is not None and not parent.done:
                    self.order_violations.append(
                        f"{lease.key} claimed (owner {lease.owner!r}, counter {lease.counter}) while its parent "
                        f"{parent.key} was at {parent.checkpoint!r} (owner {parent.owner!r})")
        with self._lock:
            self.snapshots.append(snap)

    # --- reading what was seen ---
    def latest(self) -> Snapshot | None:
        with self._lock:
            return self.snapshots[-1] if self.snapshots else None

    def since(self, t: float) -> list[Snapshot]:
        with self._lock:
            return [s for s in self.snapshots if s.t >= t]

    def until(self, predicate, timeout_s: float, what: str) -> Snapshot:
        """wait_until a snapshot taken from now on satisfies predicate(snapshot)."""
        start = time.monotonic()

        def check():
            snap = self.latest()
            return snap if snap is not None and snap.t >= start and predicate(snap) else None
        return wait_until(check, timeout_s, what)

    def stable(self, predicate, hold_s: float, timeout_s: float, what: str) -> Snapshot:
        """wait_until predicate has held in every snapshot of the last hold_s seconds."""
        start = time.monotonic()

        def check():
            now = time.monotonic()
            if now - start < hold_s:
                return None
            window = self.since(now - hold_s)
            return window[-1] if window and all(predicate(s) for s in window) else None
        return wait_until(check, timeout_s, what)

    def run(self, make_coro, timeout_s: float):
        """Run make_coro(store) on the watch's loop; the concurrent future."""
        return asyncio.run_coroutine_threadsafe(make_coro(self._store), self._loop)


# --- input -------------------------------------------------------------------------------

def pick_keys(ranges: list[tuple[int, int]], per_range: int) -> list[str]:
    """Keys such that every [lo, hi) hash range holds at least per_range of them."""
    need = {r: per_range for r in ranges}
    keys: list[str] = []
    for i in range(100_000):
        key = f"key-{i:04d}"
        h = hash_key_of(key)
        for (lo, hi), n in need.items():
            if n and lo <= h < hi:
                need[(lo, hi)] -= 1
                keys.append(key)
                break
        if not any(need.values()):
            return keys
    raise AssertionError(f"no keys cover {ranges}")


def partition_keys(client, stream: str, per_partition: int, split_halves: bool = False) -> list[str]:
    ranges = []
    for p in client.partitions(stream):
        if split_halves:
            mid = (p.hash_lo + p.hash_hi) // 2
            ranges += [(p.hash_lo, mid), (mid, p.hash_hi)]
        else:
            ranges.append((p.hash_lo, p.hash_hi))
    return pick_keys(ranges, per_partition)


class Feeder:
    """Writes `KEY:SEQ` records (SEQ zero-padded, unique) round-robin over keys, per_tick
    records every tick_s, from a thread; every record is retried until acknowledged."""

    def __init__(self, address: str, stream: str, keys: list[str], per_tick: int = 10, tick_s: float = 0.1):
        self.address, self.stream, self.keys = address, stream, keys
        self.per_tick, self.tick_s = per_tick, tick_s
        self.sent: list[tuple[str, bytes]] = []
        self.errors: list[str] = []
        self.seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = sms.Client(address)

    def _next(self, n: int) -> list[tuple[str, bytes]]:
        out = []
        for _ in range(n):
            key = self.keys[self.seq % len(self.keys)]
            out.append((key, f"{key}:{self.seq:07d}".encode()))
            self.seq += 1
        return out

    def write(self, n: int) -> None:
        """Write n records now (from the calling thread), in chunks of at most 500."""
        with self._lock:
            for start in range(0, n, 500):
                self._put(self._next(min(500, n - start)))

    def _put(self, records: list[tuple[str, bytes]]) -> None:
        todo = records
        deadline = time.monotonic() + 60
        while todo:
            result = self._client.put_records(self.stream, todo)
            failed = [(rec, r) for rec, r in zip(todo, result.records) if not r.ok]
            self.sent.extend(rec for rec, r in zip(todo, result.records) if r.ok)
            todo = [rec for rec, _ in failed]
            if todo and time.monotonic() > deadline:
                raise AssertionError(f"{len(todo)} input records not acknowledged: {failed[0][1]}")

    def count(self) -> int:
        return len(self.sent)

    def start(self) -> "Feeder":
        def loop():
            while not self._stop.is_set():
                try:
                    self.write(self.per_tick)
                except Exception as e:  # noqa: BLE001
                    self.errors.append(repr(e))
                    return
                self._stop.wait(self.tick_s)
        self._thread = threading.Thread(target=loop, name="feeder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=90)
        assert not self.errors, f"the feeder failed: {self.errors}"

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=90)
        self._client.close()


# --- stage graphs and checks ---------------------------------------------------------------

def write_graph(path: Path, stage: str, source: str, sink: str, *, partitions: int, out_partitions: int = 2,
                operation: str = f"{OPS}:upper", engine: str = "python", checkpoint_records: int = 50,
                checkpoint_interval_s: float = 0.5, failover_s: float = FAILOVER_S) -> Path:
    doc = {"streams": {source: {"partitions": partitions}, sink: {"partitions": out_partitions}},
           "stages": {stage: {"inputs": [source], "operation": operation, "engine": engine,
                              "outputs": [{"stream": sink, "key": "partition_key"}], "recovery": "checkpoint",
                              "checkpoint_records": checkpoint_records,
                              "checkpoint_interval_s": checkpoint_interval_s, "failover_s": failover_s}}}
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Setup:
    stage: str
    source: str
    sink: str
    graph: Path
    workers: Workers
    watch: LeaseWatch


@contextlib.contextmanager
def stage_maker(cluster, tmp_path, write, also_created: tuple[str, ...] = ()):
    """make(*args, **options) -> Setup: a fresh graph (its own streams and stage) written by
    write(path, stage, source, sink, *args, **options), applied with `sms graph apply` (which
    creates the streams, the dead-letter stream and `<stage>-<name>` for each of
    also_created), a LeaseWatch on it and its Workers; make.feeder(...) -> Feeder. All
    stopped when the context ends."""
    made: list[Setup] = []
    feeders: list[Feeder] = []

    def make(*args, **options) -> Setup:
        stage, source, sink = stream_name("stage"), stream_name("in"), stream_name("out")
        graph = write(tmp_path / f"{stage}.yaml", stage, source, sink, *args, **options)
        applied = json.loads(sms_cli(cluster, "graph", "apply", str(graph), "--json"))
        assert applied["stages_registered"] == [stage]
        assert sorted(applied["streams_created"]) == sorted([source, sink, f"{stage}-dead-letters",
                                                             *(f"{stage}-{name}" for name in also_created)])
        setup = Setup(stage, source, sink, graph, Workers(cluster, graph, stage, tmp_path),
                      LeaseWatch(cluster.metastore, stage, source).start())
        made.append(setup)
        return setup

    def feeder(*args, **kwargs) -> Feeder:
        f = Feeder(cluster.address, *args, **kwargs)
        feeders.append(f)
        return f

    make.feeder = feeder
    try:
        yield make
    finally:
        for f in feeders:
            f.close()
        for setup in made:
            setup.workers.stop_all()
            setup.watch.stop()


@pytest.fixture
def sps_stage(cluster, tmp_path):
    """make(**graph options) -> Setup (write_graph's options; `stage_maker`)."""
    with stage_maker(cluster, tmp_path, write_graph) as make:
        yield make


def read_all(client, stream: str) -> list[Record]:
    return list(client.read_stream(stream))


def checked_inputs(client, setup: Setup, feeder: Feeder) -> list[Record]:
    """The input stream as stored: exactly what the feeder had acknowledged."""
    inputs = read_all(client, setup.source)
    stored = Counter((r.partition_key, bytes(r.data)) for r in inputs)
    assert stored == Counter(feeder.sent), "the input stream does not hold exactly the records written"
    return inputs


def wait_processed(client, setup: Setup, inputs: list[Record], timeout_s: float = DONE_S) -> Snapshot:
    """wait_until every input partition's lease says its records are done: an open one
    checkpointed at its last SN with no batch pending, a closed one at SHARD_END."""
    last: dict[int, int] = {}
    for r in inputs:
        last[r.partition_ordinal] = max(last.get(r.partition_ordinal, 0), r.sn)
    closed = {p.ordinal for p in client.partitions(setup.source) if p.state is PartitionState.CLOSED}

    def done(snap: Snapshot) -> bool:
        for p in client_partitions:
            lease = snap.leases.get(lease_key(setup.source, p))
            if lease is None:
                return False
            if p in closed:
                want = SHARD_END
            else:
                want = str(last[p]) if p in last else TRIM_HORIZON
            if lease.checkpoint != want or (want != SHARD_END and lease.pending_end):
                return False
        return True

    client_partitions = [p.ordinal for p in client.partitions(setup.source)]
    return setup.watch.until(done, timeout_s, f"stage {setup.stage} to process every input record")


def assert_exactly_once(client, setup: Setup, inputs: list[Record]) -> list[Record]:
    outputs = read_all(client, setup.sink)
    got = Counter((r.partition_key, bytes(r.data)) for r in outputs)
    want = Counter(sps_ops.expected_output(r.partition_key, bytes(r.data)) for r in inputs)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"output of {setup.stage} is not exactly once: {sum(missing.values())} missing (e.g. "
        f"{list(missing)[:3]}), {sum(extra.values())} extra/duplicated (e.g. {list(extra.items())[:3]})")
    return outputs


def assert_per_key_order(inputs: list[Record], outputs: list[Record]) -> None:
    """Per key, the outputs (in SN order, lineage first) are the inputs' outputs in order."""
    want: dict[str, list[bytes]] = defaultdict(list)
    for r in inputs:
        key, data = sps_ops.expected_output(r.partition_key, bytes(r.data))
        want[key].append(data)
    got: dict[str, list[bytes]] = defaultdict(list)
    for r in outputs:
        got[r.partition_key].append(bytes(r.data))
    for key in want:
        if got[key] != want[key]:
            i = next(i for i, (a, b) in enumerate(zip(got[key], want[key])) if a != b)
            raise AssertionError(f"key {key}: outputs out of input order at index {i}: got "
                                 f"{got[key][i:i + 5]}, expected {want[key][i:i + 5]}")


def lost_lines(text: str) -> list[tuple[str, str]]:
    return LOST_LINE.findall(text)


def balanced(n_leases: int, workers: list[str]):
    """Every lease owned by a live worker, each of the workers holds n//w or n//w + 1."""
    lo, hi = n_leases // len(workers), -(-n_leases // len(workers))

    def check(snap: Snapshot) -> bool:
        owners = snap.owners()
        return (len(snap.leases) == n_leases and sum(owners.values()) == n_leases
                and set(owners) == set(workers) and all(lo <= owners[w] <= hi for w in workers)
                and set(workers) <= set(snap.workers))
    return check


# --- 1. balance ----------------------------------------------------------------------------

def test_three_workers_share_eight_partitions_evenly(cluster, client, sps_stage):
    setup = sps_stage(partitions=8)
    feeder = sps_stage.feeder(setup.source, partition_keys(client, setup.source, 2), per_tick=16).start()
    ids = ["w1", "w2", "w3"]
    for w in ids:
        setup.workers.start(w)
    started = time.monotonic()
    snap = setup.watch.stable(balanced(8, ids), STABLE_S, BALANCE_S + WORKER_START_S,
                              "3 workers to hold 2 or 3 of the 8 leases each")
    print(f"\nbalanced in {snap.t - started:.1f} s after the workers started: {dict(snap.owners())}")
    assert sorted(snap.owners().values()) == [2, 3, 3]
    # (balancing takes leases from busy peers, which log the loss; none once balanced)
    lost_when_balanced = {w: lost_lines(setup.workers.log(w)) for w in ids}

    # the same as `sms graph status --json` reports it
    status = json.loads(sms_cli(cluster, "graph", "status", str(setup.graph), "--json"))
    (stage,) = [s for s in status if s["stage"] == setup.stage]
    assert sorted(stage["workers"]) == ids
    assert len(stage["partitions"]) == 8
    by_owner = Counter(p["owner"] for p in stage["partitions"])
    assert set(by_owner) == set(ids) and sorted(by_owner.values()) == [2, 3, 3], stage["partitions"]

    # and it is real work: records flow through every partition
    setup.watch.until(lambda s: all(lease.checkpoint.isdigit() for lease in s.leases.values()), 30,
                      "every partition to have a checkpoint")
    feeder.stop()
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs)
    assert_exactly_once(client, setup, inputs)
    assert {w: lost_lines(setup.workers.log(w)) for w in ids} == lost_when_balanced, \
        "a worker lost a lease once the leases were balanced, with no failure"


def test_status_reports_records_done(cluster, client, sps_stage):
    setup = sps_stage(partitions=1, out_partitions=1)
    feeder = sps_stage.feeder(setup.source, ["k1", "k2", "k3"])
    feeder.write(150)
    setup.workers.start("w1")
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs)
    assert_exactly_once(client, setup, inputs)                # the work is done: only its count is wrong
    status = json.loads(sms_cli(cluster, "graph", "status", str(setup.graph), "--json"))
    (row,) = [s for s in status if s["stage"] == setup.stage][0]["partitions"]
    assert row["lag_ms"] == 0 and row["lag_records"] == 0 and row["checkpoint"] == str(inputs[-1].sn), row
    assert row["records"] == len(inputs), f"`sms graph status` says {row['records']} records done of {len(inputs)}"


def test_a_poison_record_goes_to_the_dead_letter_stream_and_the_partition_goes_on(cluster, client, sps_stage):
    """issue 16 item 4: a record whose operation always fails is retried a bounded number
    of times, then written to the stage's dead-letter stream with its error and position;
    the batch's other records go on, exactly once, and the worker never releases the
    partition (no claim, fail, release cycle)."""
    setup = sps_stage(partitions=1, out_partitions=1, operation=f"{OPS}:poisoned_upper")
    records = [(f"k{i % 5}", b"poison-%d" % i if i in (17, 60) else b"r%d" % i) for i in range(100)]
    assert client.put_records(setup.source, records).failed_record_count == 0
    setup.workers.start("w1")
    good = Counter(sps_ops.expected_output(k, d) for k, d in records if not d.startswith(b"poison"))
    wait_until(lambda: Counter((r.partition_key, bytes(r.data)) for r in read_all(client, setup.sink)) == good,
               DONE_S, "the 98 good records processed")
    dead_stream = f"{setup.stage}-dead-letters"
    wait_until(lambda: len(read_all(client, dead_stream)) == 2, DONE_S, "the 2 poison records dead-lettered")
    dead = sorted(read_all(client, dead_stream), key=lambda r: r.data)
    assert [bytes(r.data) for r in dead] == [b"poison-17", b"poison-60"]
    inputs = {bytes(r.data): r for r in read_all(client, setup.source)}
    for r in dead:
        assert b"ValueError: cannot digest" in r.headers["sms-error"]
        assert r.headers["sms-source"] == f"p0000/{inputs[bytes(r.data)].sequence_number}".encode()
        assert r.headers["sms-stage"] == setup.stage.encode()
    setup.watch.until(lambda s: all(lease.checkpoint == str(max(r.sn for r in inputs.values()))
                                    for lease in s.leases.values()), DONE_S, "the partition checkpointed to its end")
    status = json.loads(sms_cli(cluster, "graph", "status", str(setup.graph), "--json"))
    (stage,) = [st for st in status if st["stage"] == setup.stage]
    assert (stage["dead_letters"], stage["dead_letter_stream"]) == (2, dead_stream), stage
    assert stage["failures"] >= 2 and "ValueError" in stage["partitions"][0]["last_error"], stage
    assert "failed; releasing" not in setup.workers.log("w1")            # it never let the partition go


# --- 2. kill -9 ----------------------------------------------------------------------------

def test_kill9_moves_leases_within_failover_and_output_is_exactly_once(client, sps_stage):
    setup = sps_stage(partitions=8)
    feeder = sps_stage.feeder(setup.source, partition_keys(client, setup.source, 2), per_tick=16).start()
    ids = ["w1", "w2", "w3"]
    for w in ids:
        setup.workers.start(w)
    snap = setup.watch.stable(balanced(8, ids), STABLE_S, BALANCE_S + WORKER_START_S, "3 workers balanced")
    setup.watch.until(lambda s: all(lease.checkpoint.isdigit() for lease in s.leases.values()), 30,
                      "every partition to have a checkpoint")

    lost_when_balanced = {w: lost_lines(setup.workers.log(w)) for w in ids}
    victim = max(ids, key=lambda w: (snap.owners()[w], w))
    before = setup.watch.latest()
    moved_keys = sorted(k for k, lease in before.leases.items() if lease.owner == victim)
    assert moved_keys, before.owners()
    sent_at_kill = feeder.count()
    killed_at = time.monotonic()
    setup.workers.kill9(victim)

    survivors = [w for w in ids if w != victim]
    setup.watch.until(lambda s: all(s.leases[k].owner in survivors for k in moved_keys),
                      FAILOVER_S + ROUND_S + 30, f"{victim}'s leases {moved_keys} to move to {survivors}")
    moves = {}
    for k in moved_keys:
        first = next(s for s in setup.watch.since(killed_at) if s.leases[k].owner in survivors)
        moves[k] = round(first.t - killed_at, 2)
    unregistered = next((round(s.t - killed_at, 2) for s in setup.watch.since(killed_at) if victim not in s.workers),
                        None)
    print(f"\nkill -9 {victim}: its registration vanished after {unregistered} s; lease moves (s after the kill): "
          f"{moves}; max {max(moves.values())} s (failover {FAILOVER_S} s + round {ROUND_S} s)")
    assert max(moves.values()) <= FAILOVER_S + ROUND_S + MOVE_SLACK_S, moves

    # input keeps coming after the kill; the survivors share all 8 evenly
    wait_until(lambda: feeder.count() >= sent_at_kill + 600, 60, "600 more input records after the kill")
    setup.watch.stable(balanced(8, survivors), STABLE_S, BALANCE_S, "2 survivors with 4 leases each")
    feeder.stop()
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs)
    outputs = assert_exactly_once(client, setup, inputs)
    assert_per_key_order(inputs, outputs)
    print(f"{len(inputs)} inputs ({len(inputs) - sent_at_kill} after the kill), {len(outputs)} outputs, exactly once")
    # the survivors claimed the victim's leases (expired, unregistered owner): no peer took one of theirs
    assert {w: lost_lines(setup.workers.log(w)) for w in survivors} == {w: lost_when_balanced[w] for w in survivors}


# --- 3. a paused worker is fenced ------------------------------------------------------------

def pause_outside_metastore_writes(setup: Setup, worker_id: str, attempts: int = 5) -> None:
    """SIGSTOP a worker, retrying until it is not stopped inside a write transaction of the
    shared embedded metadata store (that would stall every process's writes, the
    cluster's included: metastore/embedded.py): a write from here must go through."""
    for _ in range(attempts):
        setup.workers.signal(worker_id, signal.SIGSTOP)
        probe = setup.watch.run(lambda store: store.create(f"/sps-test-probes/{uuid.uuid4().hex}", b"",
                                                           ephemeral=True), 1.0)
        try:
            probe.result(timeout=1.0)
            return
        except concurrent.futures.TimeoutError:
            setup.workers.signal(worker_id, signal.SIGCONT)
            probe.result(timeout=10)
    raise AssertionError(f"{worker_id} held the metadata store's writer lock at every pause")


def test_paused_worker_cannot_write_after_its_lease_moved(client, sps_stage, tmp_path):
    # 2 partitions, 3 workers: a worker holding none never takes one from a peer (n // w = 0),
    # so after its resume the paused worker has no legitimate lease write to make either.
    setup = sps_stage(partitions=2, operation=f"{OPS}:gated_upper", checkpoint_records=20)
    feeder = sps_stage.feeder(setup.source, partition_keys(client, setup.source, 2), per_tick=6).start()
    gate = tmp_path / "slow.gate"
    setup.workers.start("slow", env={"SPS_TEST_GATE": str(gate)})
    setup.watch.until(lambda s: s.owners() == Counter({"slow": 2}), WORKER_START_S, "'slow' to claim both leases")
    for w in ("w2", "w3"):
        setup.workers.start(w)
    snap = setup.watch.stable(lambda s: s.owners()["slow"] == 1 and sum(s.owners().values()) == 2
                              and {"w2", "w3"} <= set(s.workers), STABLE_S, BALANCE_S,
                              "'slow' to keep one lease and hand the other to w2 or w3")
    (key,) = [k for k, lease in snap.leases.items() if lease.owner == "slow"]
    setup.watch.until(lambda s: s.leases[key].checkpoint.isdigit(), 30, f"'slow' to checkpoint {key}")
    peers_lost = {w: lost_lines(setup.workers.log(w)) for w in ("w2", "w3")}

    # hold 'slow' inside a batch: its lease names the batch as pending, its outputs are not written
    gate.touch()
    wait_until(lambda: Path(f"{gate}.entered").exists(), 30, "'slow' to enter a batch at the gate")
    at_pause = setup.watch.until(lambda s: s.leases[key].owner == "slow" and s.leases[key].pending_end, 10,
                                 f"{key}'s pending batch").leases[key]
    pause_outside_metastore_writes(setup, "slow")
    paused_at = time.monotonic()
    gate.unlink()                   # it goes on (to its outputs) the moment it runs again
    taken = setup.watch.until(lambda s: s.leases[key].owner in ("w2", "w3"), FAILOVER_S + ROUND_S + 30,
                              f"a peer to take {key} from the paused worker")
    new_owner = taken.leases[key].owner
    # past the lease: the new owner has replayed the pending batch and gone further
    setup.watch.until(lambda s: s.leases[key].owner == new_owner and s.leases[key].checkpoint.isdigit()
                      and int(s.leases[key].checkpoint) > int(at_pause.pending_end), 30,
                      f"{new_owner} to checkpoint past the paused worker's pending batch")
    print(f"\n{key}: taken by {new_owner} {taken.t - paused_at:.2f} s after the pause of 'slow' (inside its batch "
          f"after checkpoint {at_pause.checkpoint}, pending {at_pause.pending_end})")

    resumed_at = time.monotonic()
    setup.workers.signal("slow", signal.SIGCONT)
    # (its first act may be an output call on a connection that died during the pause, which
    # fails only at the call's timeout: the bound must exceed PUT_TIMEOUT_S)
    wait_until(lambda: ("slow", key) in lost_lines(setup.workers.log("slow")), limits.PUT_TIMEOUT_S + 30,
               f"the resumed worker to log that it lost {key}")
    # it stays up, registers again, and writes nothing to the lease table for a few rounds
    setup.watch.until(lambda s: "slow" in s.workers, 30, "the resumed worker to register again")
    sent_at_resume = feeder.count()
    wait_until(lambda: feeder.count() >= sent_at_resume + 100 and time.monotonic() - resumed_at > 3 * ROUND_S, 60,
               "three rounds and more input after the resume")
    assert setup.workers.alive("slow"), setup.workers.log("slow")

    feeder.stop()
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs)
    outputs = assert_exactly_once(client, setup, inputs)
    assert_per_key_order(inputs, outputs)

    written_by_slow = [(round(s.t - resumed_at, 2), k, lease.counter, lease.checkpoint)
                       for s in setup.watch.since(taken.t) for k, lease in s.leases.items() if lease.owner == "slow"]
    assert not written_by_slow, f"the resumed worker wrote the lease table: {written_by_slow[:5]}"
    final = setup.watch.latest()
    assert "slow" not in final.owners() and sum(final.owners().values()) == 2, final.leases
    assert {w: lost_lines(setup.workers.log(w)) for w in ("w2", "w3")} == peers_lost, \
        "a peer lost a lease after the balance: the resumed worker wrote one"
    print(f"'slow' logged: {lost_lines(setup.workers.log('slow'))}; {len(inputs)} inputs, outputs exactly once")


# --- 4. splits: parents first, per-key order ---------------------------------------------------

def test_split_during_processing_parents_before_children(client, sps_stage, tmp_path):
    setup = sps_stage(partitions=2, operation=f"{OPS}:gated_upper", checkpoint_records=20)
    keys = partition_keys(client, setup.source, 3, split_halves=True)
    feeder = sps_stage.feeder(setup.source, keys)
    gate = tmp_path / "split.gate"
    for w in ("w1", "w2"):
        setup.workers.start(w, env={"SPS_TEST_GATE": str(gate)})
    setup.watch.stable(balanced(2, ["w1", "w2"]), STABLE_S, BALANCE_S + WORKER_START_S, "one lease each")
    feeder.write(100)
    parent_key = lease_key(setup.source, 0)
    setup.watch.until(lambda s: s.leases[parent_key].checkpoint.isdigit(), 30, "partition 0 to be in progress")

    # hold the workers inside a batch: partition 0 keeps a backlog across the split
    gate.touch()
    feeder.write(200)
    wait_until(lambda: Path(f"{gate}.entered").exists(), 30, "a worker to enter a batch at the gate")
    split_at = time.monotonic()
    info = client.split(setup.source, 0)
    children = sorted(p.ordinal for p in info.partitions if 0 in p.parents)
    assert len(children) == 2, info.partitions
    child_keys = [lease_key(setup.source, c) for c in children]
    feeder.write(400)                          # to partition 1 and the children
    feeder.stop()
    # the children's leases appear (a worker's partition refresh) while the parent is not done
    snap = setup.watch.until(lambda s: all(k in s.leases for k in child_keys), 30,
                             "the children's leases in the table")
    assert not snap.leases[parent_key].done and not any(snap.leases[k].owner for k in child_keys), snap.leases
    gate.unlink()

    inputs = checked_inputs(client, setup, feeder)
    by_partition = Counter(r.partition_ordinal for r in inputs)
    assert all(by_partition[c] > 0 for c in children), by_partition
    wait_processed(client, setup, inputs)

    # the lease table: children claimed only after the parent reached SHARD_END
    assert not setup.watch.order_violations, setup.watch.order_violations[:5]
    history = setup.watch.since(split_at)
    parent_end = min(s.leases[parent_key].heartbeat_ms for s in history
                     if parent_key in s.leases and s.leases[parent_key].done)
    print()
    for ck in child_keys:
        owned = [s.leases[ck] for s in history if ck in s.leases and s.leases[ck].counter > 0]
        first = min(owned, key=lambda lease: lease.counter)
        print(f"{ck}: first seen claimed (counter {first.counter}, by {first.owner}) {first.heartbeat_ms - parent_end} "
              f"ms after {parent_key} reached SHARD_END; parents {first.parents}")
        assert first.parents == (0,)
        assert first.heartbeat_ms >= parent_end, f"{ck} claimed before its parent reached SHARD_END"

    outputs = assert_exactly_once(client, setup, inputs)
    assert_per_key_order(inputs, outputs)


def test_per_key_order_with_unsorted_payloads(client, sps_stage):
    setup = sps_stage(partitions=1, out_partitions=1, checkpoint_records=100)
    with sms.Client(setup.workers.cluster.address) as c:
        records = [("user-1", json.dumps({"user": "user-1", "seq": i}).encode()) for i in range(200)]
        for start in range(0, 200, 100):
            result = c.put_records(setup.source, records[start:start + 100])
            assert result.failed_record_count == 0
    setup.workers.start("w1")
    inputs = read_all(client, setup.source)
    assert len(inputs) == 200
    wait_processed(client, setup, inputs)
    outputs = assert_exactly_once(client, setup, inputs)      # this holds: the order is what breaks
    assert_per_key_order(inputs, outputs)


# --- 5. Spark --------------------------------------------------------------------------------

@pytest.mark.slow
def test_spark_engine_two_workers_exactly_once(client, sps_stage):
    setup = sps_stage(partitions=4, engine="spark", operation=f"{OPS}:spark_upper", checkpoint_records=100,
                      checkpoint_interval_s=1.0, failover_s=6.0)
    keys = partition_keys(client, setup.source, 2)
    feeder = sps_stage.feeder(setup.source, keys, per_tick=10, tick_s=0.1)
    feeder.write(400)                               # waiting when the workers start
    ids = ["s1", "s2"]
    started = time.monotonic()
    for w in ids:
        setup.workers.start(w, master="local[1]")
    # a first batch includes starting the SparkSession: 10-20 s, much longer on a loaded machine
    snap = setup.watch.until(lambda s: set(s.owners()) == set(ids) and all(
        lease.checkpoint.isdigit() for lease in s.leases.values() if lease.owner), SPARK_START_S,
        "both Spark workers to have processed batches")
    print(f"\nboth Spark workers processing {snap.t - started:.1f} s after they started: {dict(snap.owners())}")

    feeder.start()
    wait_until(lambda: feeder.count() >= 700, 60, "input while both run")
    victim, survivor = "s1", "s2"
    victim_keys = [k for k, lease in setup.watch.latest().leases.items() if lease.owner == victim]
    assert victim_keys
    killed_at = time.monotonic()
    setup.workers.kill9(victim)
    moved = setup.watch.until(lambda s: all(s.leases[k].owner == survivor for k in victim_keys), 60,
                              f"{survivor} to take {victim_keys}")
    print(f"kill -9 {victim} (and its JVM): {victim_keys} with {survivor} after {moved.t - killed_at:.1f} s")
    wait_until(lambda: feeder.count() >= 1000, 60, "more input after the kill")
    feeder.stop()
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs, timeout_s=SPARK_START_S)
    outputs = assert_exactly_once(client, setup, inputs)
    assert_per_key_order(inputs, outputs)

    assert setup.workers.stop(survivor) == 0, setup.workers.log(survivor)
    report = re.search(rf"worker {survivor} stopped: (\d+) records processed", setup.workers.log(survivor))
    assert report and int(report.group(1)) > 0, setup.workers.log(survivor)
    released = setup.watch.until(lambda s: not s.owners(), 30, "the stopped worker to release its leases")
    print(f"{len(inputs)} inputs, {len(outputs)} outputs, exactly once; {survivor} processed {report.group(1)} "
          f"and released {len(released.leases)} leases on SIGTERM; {time.monotonic() - started:.1f} s in all")
