"""Fault trials of chain failover: one fault injected into a real cluster under load.

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
  pause                                 SIGSTOP a head past its session timeout, then SIGCONT
  expire_session                        expire a head's ZooKeeper session (zk backend only)
  restart                               kill -9 a head and restart it on its data

`python -m tests.fault.trials [--trials N] [--backend embedded|zk|both] [KIND ...]` runs
the full set and prints the table of trials; pytest runs one trial of each kind
(tests/fault/test_failover.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import sms
from sms import errors, limits
from sms.launcher import LocalCluster
from tests.conftest import wait_until as _wait
from tests.fault.history import CheckResult, check, format_table
from tests.fault.workload import Workload, read_back

KINDS = ("kill_head", "kill_middle", "kill_tail", "kill_ingestion", "kill_control", "pause", "expire_session",
         "restart")
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
STOP_TIMEOUT_S = 45.0


@dataclass
class Trial:
    kind: str
    backend: str
    result: CheckResult
    victim: str
    healed_s: float | None
    notes: str = ""


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


def run_trial(kind: str, backend: str, directory: str) -> Trial:
    if kind == "expire_session" and backend != "zk":
        raise ValueError("expire_session needs the zk backend")
    os.makedirs(directory, exist_ok=True)
    with backend_store(backend, directory) as (url, zk):
        cluster = LocalCluster(os.path.join(directory, "cluster"), nodes=STORAGE_NODES, port=0, metastore=url,
                               controls=CONTROLS, expose_sessions=zk is not None)
        cluster.start()
        try:
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
                cluster.signal(victim, signal.SIGSTOP)
                try:
                    _wait(lambda: _removed(client, stream, victim, 0), HEAL_TIMEOUT_S,
                          f"{victim} removed from p0 while paused")
                finally:
                    cluster.signal(victim, signal.SIGCONT)
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


def _session_credentials(cluster: LocalCluster, node_id: str) -> tuple[int, bytes]:
    """The node's ZooKeeper session id and password, which it writes (test clusters
    only) next to its ready file."""
    path = os.path.join(cluster.data_dir, "run", f"{node_id}.session")
    _wait(lambda: os.path.exists(path), 10.0, f"{path}")
    with open(path) as f:
        d = json.load(f)
    return int(d["session_id"]), bytes.fromhex(d["password"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chain failover fault trials")
    parser.add_argument("kinds", nargs="*", default=list(KINDS))
    parser.add_argument("--trials", type=int, default=3, help="trials per kind and backend")
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--dir", help="keep trial directories here (default: a temp dir)")
    args = parser.parse_args(argv)
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    rows, failures = [], []
    base = args.dir or tempfile.mkdtemp(prefix="sms-fault-")
    for backend in backends:
        for kind in args.kinds:
            if kind == "expire_session" and backend != "zk":
                continue
            for i in range(args.trials):
                directory = os.path.join(base, f"{backend}-{kind}-{i}")
                t0 = time.monotonic()
                try:
                    trial = run_trial(kind, backend, directory)
                except Exception as e:          # a trial that could not finish is a failed trial
                    failures.append(f"{backend} {kind} #{i}: {e!r}")
                    print(f"{backend:<8} {kind:<15} #{i}: ERROR {e!r}", flush=True)
                    continue
                rows.append((f"{kind} ({backend})", trial.result))
                healed = f"{trial.healed_s:.1f}s" if trial.healed_s is not None else "-"
                print(f"{backend:<8} {kind:<15} #{i}: {'ok' if trial.result.ok else 'FAILED'} "
                      f"acked {trial.result.acked} lost {trial.result.lost} dup {trial.result.duplicates} "
                      f"resume {[round(r.recovery_s, 2) if r.recovery_s else None for r in trial.result.recoveries]} "
                      f"rf restored after {healed} ({time.monotonic() - t0:.0f}s) {trial.notes}", flush=True)
                if not trial.result.ok:
                    failures.append(f"{backend} {kind} #{i}: {trial.result.summary()}")
    print()
    print(format_table(rows))
    for f in failures:
        print("FAILED:", f)
    print(f"session TTL {limits.METASTORE_SESSION_TTL_S}s; trial dirs in {base}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
