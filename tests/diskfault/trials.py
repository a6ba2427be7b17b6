"""Disk-fault trials: one storage node's disk fails under load, on a cluster whose
metadata store is a real ZooKeeper (tests/zkserver.py, Debian's package).

A trial starts a ZooKeeper server (or uses the run's), a fresh `LocalCluster` on it (one
control process, STORAGE_NODES storage nodes, separate processes, real LMDB), creates a
stream of PARTITIONS partitions with replication factor 3 and de-duplication on, and runs
tests/fault/workload.py's load (PRODUCERS de-duplicating producers, RATE_PER_S records/s in
all, one tailing consumer): WARMUP_ACKS acks, the fault, the heal. Four nodes and
four chains place every node as head of one chain, middle of one and tail of one; the
victim is n(seed mod 4 + 1), so trials 0..3 of a kind hit different nodes. Its data
directory sits on a faulty disk mounted before the cluster starts (tests/diskfault/disks.py).

Kinds:
  disk_full    the victim's data directory is a tmpfs of 48 MB (tests/integration/
               test_disk_full.py); a ballast fills it to CHAIN_HEADROOM_BYTES (1 MB) under load.
               Expected: the victim refuses writes with StorageFull and stays up; its
               chains take no commits it lacks (checked at every poll while it is full:
               no head commits beyond what the victim stored); the disk stays full for
               FULL_HOLD_S (or --hold) and REFUSALS_HELD more refused transactions, then the
               ballast goes; every affected partition acks again and every chain goes on
               unchanged (same epoch, same members).
  fsync_fails  the victim's storage directory is a faultyfs FUSE mount (tests/integration/
               faultyfs.py) whose fsync answers EIO and drops what was written since the last
               good one. Expected: the victim fences its logs (StorageFailed, "Input/output
               error"), reports under /disk_failed, the chain manager takes it out of every
               chain naming StorageFailed, writes go on on the other members and the spare
               node restores replication factor 3; the disk fails for FSYNC_HOLD_S (or
               --hold) from the fault; with the disk healthy again the fenced node writes
               nothing and no chain takes it back; a restart on the healed disk brings it back
               serving, and every chain is whole.

Then the load stops, the whole stream is read back and the history checker runs
(tests/fault/history.py): every acknowledged record read once at its acked SN, nothing
duplicated, no reader saw a record that later vanished, writes resumed after the fault.
What a kind expects beyond that is added to the checker's result as a violation of its
own kind, so such a trial fails too. The write pause is measured as the network-fault
trials measure it (tests/netfault/trials.py `write_pause`, `pause_table`): `fault->ack`,
the checker's time from the fault to the first ack of a record submitted after it on the
victim's partitions, and `max gap`, the longest time one of those partitions went
without any ack until it acked a record submitted after the heal. The fault's moment is
the first refusal the victim reports (disk_full: the ballast leaves a little headroom,
so the disk fills a moment later) or the fsync switch (fsync_fails); the heal is the
ballast's removal (disk_full) or the restart of the victim on its healed disk, with
every chain whole again (fsync_fails).

`python -m tests.diskfault.trials [--trials N] [--seed S] [--dir D] [--hold S] [KIND ...]` runs
them (both kinds, 5 each by default, one ZooKeeper server for the run, a fresh cluster
per trial) and prints the tables; pytest runs one trial per kind
(tests/diskfault/test_diskfault.py) and, marked slow, DISK_TRIALS per kind. Needs root
(mounts), java and Debian's zookeeper, and for fsync_fails /dev/fuse, fuse3 and mfusepy;
skip_reason() says what is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid

import sms
from node.launcher import LocalCluster
from tests.conftest import wait_until as _wait
from tests.diskfault.disks import Tmpfs, commits_beyond_stored, tmpfs_unavailable
from tests.fault.history import CheckResult, History, check, format_table
from tests.fault.trials import _healed, _retry, known_bugs_in_logs
from tests.fault.workload import Workload, read_back
from tests.integration.test_disk_full import (CHAIN_HEADROOM_BYTES, FILL_TIMEOUT_S, FULL_HOLD_S,
                                              RECOVER_TIMEOUT_S, REFUSALS_HELD, _replicas, _sn)
from tests.integration.test_fsync_failure import FaultyDisk, _removed_for_disk, _roles, fuse_unavailable
from tests.netfault.trials import Trial, _acked_after, _hold, _s, pause_table, write_pause

KINDS = ("disk_full", "fsync_fails")

STORAGE_NODES = 4
PARTITIONS = 4
REPLICATION = 3
PRODUCERS = 4
KEYS = 32
RATE_PER_S = 1_000.0
PAYLOAD_BYTES = {"disk_full": 2_000,       # ~1.5 MB/s reach the victim: its headroom fills within a second
                 "fsync_fails": 200}       # every byte passes through the Python FUSE daemon
WARMUP_ACKS = 600             # acked before the fault
AFTER_ACKS = 600              # acked after each step of the heal, on top
FSYNC_HOLD_S = 1.0            # fsync_fails: the disk fails at least this long (past the node's removal)
ACK_TIMEOUT_S = 60.0
FAULT_SEEN_TIMEOUT_S = 30.0   # the fenced victim reports StorageFailed within this
REMOVE_TIMEOUT_S = 60.0       # ... and is out of every chain within this
HEAL_TIMEOUT_S = 60.0         # every chain at full length again within this
STOP_TIMEOUT_S = 30.0

# what a kind expects beyond the checker, as violations of the checker's result
COMMIT_BEYOND_STORED = "commit_beyond_stored"   # a head committed what a full middle or tail lacks
RECONFIGURED = "reconfigured"                   # a full disk changed a chain
WRONG_ERROR = "wrong_error"                     # the victim reported another error than the fault's
FAULT_MISSED = "fault_missed"                   # the failing disk failed no fsync
FENCE_BROKEN = "fence_broken"                   # the fenced node wrote again, or a chain took it back, before a restart
NODE_DIED = "node_died"                         # a cluster process exited


def skip_reason(kind: str) -> str | None:
    """Why trials of `kind` cannot run here (None: they can)."""
    from tests.zkserver import skip_reason as zk_skip, zk_available
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if os.geteuid() != 0:
        return "needs root to mount the faulty disk (tmpfs or FUSE)"
    if not zk_available():
        return zk_skip()
    return (tmpfs_unavailable() if kind == "disk_full" else fuse_unavailable()) or None


def victim_of(seed: int) -> str:
    return f"n{seed % STORAGE_NODES + 1}"


def run_trial(kind: str, directory: str, seed: int = 0, zk=None, hold_s: float | None = None) -> Trial:
    """One trial in `directory` (logs under cluster/logs); on `zk` (a running
    tests.zkserver.ZkServer; a server of its own if None), under a fresh prefix.
    `hold_s`: the disk stays faulty at least this long from the fault (default: disk_full
    FULL_HOLD_S, fsync_fails FSYNC_HOLD_S)."""
    from tests.zkserver import ZkServer
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    os.makedirs(directory, exist_ok=True)
    started = time.monotonic()
    victim = victim_of(seed)
    data = os.path.join(directory, "cluster")
    with contextlib.ExitStack() as stack:       # unwinds: cluster, then the disk, then ZooKeeper
        if zk is None:
            zk = stack.enter_context(ZkServer(os.path.join(directory, "zk")))
        if kind == "disk_full":
            disk = stack.enter_context(Tmpfs(os.path.join(data, victim)))
        else:
            disk = stack.enter_context(FaultyDisk(os.path.join(directory, f"disk-{victim}"),
                                                  os.path.join(data, victim, "storage")))
        cluster = LocalCluster(data, nodes=STORAGE_NODES, port=0, metastore=zk.url(f"/sms-{uuid.uuid4().hex[:8]}"))
        stack.callback(cluster.stop)
        cluster.start()
        run = _disk_full if kind == "disk_full" else _fsync_fails
        trial = run(cluster, disk, victim, seed, hold_s)
    trial.facts["took_s"] = time.monotonic() - started
    trial.directory = directory
    return trial


# --- shared steps -------------------------------------------------------------------------------
def _create(client: sms.Client, stream: str, victim: str):
    """The stream; the victim's role by partition ordinal, the partitions it is in, and
    the chains (id -> head) in which it is middle or tail."""
    info = client.create_stream(stream, partitions=PARTITIONS, replication_factor=REPLICATION)
    roles = _roles(info, victim)
    if "head" not in roles.values() or not {"middle", "tail"} & set(roles.values()):
        raise AssertionError(f"{victim} is not head of one chain and middle or tail of another: {roles}")
    affected = sorted(o for o, role in roles.items() if role)
    held_back = {f"{stream}:{p.ordinal}": p.chain[0].node_id for p in info.partitions
                 if roles[p.ordinal] in ("middle", "tail")}
    return info, roles, affected, held_back


def _roles_note(victim: str, roles: dict[int, str]) -> str:
    return f"victim {victim}: " + ", ".join(f"{role} of p{o}" for o, role in sorted(roles.items()) if role)


def _first_acks_after(history: History, stream: str, partitions, since_s: float) -> dict[int, float] | None:
    """Partition -> seconds from `since_s` to its first ack at or after it, once every one
    of `partitions` has one (None before)."""
    first: dict[int, float] = {}
    for a in history.acks:
        if a.stream == stream and a.partition in partitions and a.time_s >= since_s:
            first[a.partition] = min(a.time_s - since_s, first.get(a.partition, a.time_s - since_s))
    return None if set(partitions) - set(first) else first


def _finish(kind: str, seed: int, client: sms.Client, cluster: LocalCluster, load: Workload, stream: str,
            victim: str, affected: list[int], fault_s: float, healed_s: float, violations: dict[str, list[str]],
            notes: list[str], facts: dict) -> Trial:
    """Wait until each of `affected` acked a record submitted after the heal; check the
    processes, stop the load, read back, run the checker; the trial."""
    _wait(lambda: all(_acked_after(load.history, stream, (o,), healed_s) for o in affected), ACK_TIMEOUT_S,
          f"p{affected} each acking a record submitted after the heal")
    exited = cluster.exited()
    if exited:
        violations.setdefault(NODE_DIED, []).append(f"exited: {exited}")
    stats = load.stop(STOP_TIMEOUT_S)
    final = read_back(client, stream, history=load.history)
    result: CheckResult = check(load.history, final)
    for what, messages in violations.items():
        for message in messages:
            result.add(what, message)
    gap = write_pause(load.history, stream, affected, fault_s, healed_s)
    if stats["errors"]:
        notes.append(f"producer errors {stats['errors']}")
    notes += [f"known bug: {b}" for b in known_bugs_in_logs(cluster.data_dir)]
    hold_s = facts.pop("hold_s")
    return Trial(kind, result, victim, facts.get("healed_after_s"), hold_s, gap, notes, seed=seed, facts=facts,
                 history=load.history)


# --- disk_full ----------------------------------------------------------------------------------
def _disk_full(cluster: LocalCluster, disk: Tmpfs, victim: str, seed: int, hold_s: float | None) -> Trial:
    hold_s = FULL_HOLD_S if hold_s is None else hold_s
    stream = "disk-full"
    notes: list[str] = [f"seed {seed}"]
    facts: dict = {}
    violations: dict[str, list[str]] = {}
    with sms.Client(cluster.address) as client:
        info, roles, affected, held_back = _create(client, stream, victim)
        notes.append(_roles_note(victim, roles))
        chains0 = {p.ordinal: (p.chain_epoch, tuple(m.node_id for m in p.chain)) for p in info.partitions}

        def status() -> dict:
            return client.node_status(cluster.procs[victim].address)

        def check_commits() -> None:
            for message in commits_beyond_stored(client, cluster, victim, held_back):
                found = violations.setdefault(COMMIT_BEYOND_STORED, [])
                if message.split(":", 1)[0] not in {m.split(":", 1)[0] for m in found}:    # once per chain
                    found.append(message)

        with Workload(cluster.address, stream, producers=PRODUCERS, keys=KEYS, consumers=1, rate_per_s=RATE_PER_S,
                      payload_bytes=PAYLOAD_BYTES["disk_full"], name="df", seed=seed) as load:
            history = load.history
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            filled_s = history.now()
            facts["ballast_mb"] = disk.fill(CHAIN_HEADROOM_BYTES) / 1e6
            first = _wait(lambda: (s := status())["storage_write_failures"] > 0 and s, FILL_TIMEOUT_S,
                          f"{victim} refusing a write on its full disk")
            load.mark_fault("disk_full", partitions=affected)      # writes resume only once space returns
            fault_s = history.now()
            facts["refused_after_s"] = fault_s - filled_s
            if not first["storage_last_error"].startswith("StorageFull"):
                violations.setdefault(WRONG_ERROR, []).append(f"{victim}: {first['storage_last_error']}")

            def held() -> bool:
                check_commits()
                return (status()["storage_write_failures"] >= first["storage_write_failures"] + REFUSALS_HELD
                        and history.now() - fault_s >= hold_s)

            _wait(held, FILL_TIMEOUT_S + hold_s, f"{REFUSALS_HELD} more writes refused on {victim}")
            stored = {cid: _sn(r["last_sn"]) for cid, r in _replicas(client, cluster, victim).items()}
            facts["refusals"] = status()["storage_write_failures"]
            disk.free()                                             # space returns
            heal_s = history.now()
            facts["hold_s"] = heal_s - fault_s

            load.wait_acks(load.acked_count() + AFTER_ACKS, ACK_TIMEOUT_S)
            _wait(lambda: all(_sn(_replicas(client, cluster, victim)[cid]["last_sn"]) > stored[cid]
                              for cid in held_back), RECOVER_TIMEOUT_S, f"{victim} storing again")
            facts["healed_after_s"] = history.now() - heal_s
            resumed = _wait(lambda: _first_acks_after(history, stream, affected, heal_s), ACK_TIMEOUT_S,
                            f"p{affected} each acking again")
            facts["resumed_after_heal_s"] = max(resumed.values())
            notes.append("acks again after space back: " + ", ".join(
                f"p{o} ({roles[o]}) {t:.2f}s" for o, t in sorted(resumed.items())))
            check_commits()
            after = _retry(lambda: client.get_stream_info(stream, refresh=True))
            for p in after.partitions:
                now = (p.chain_epoch, tuple(m.node_id for m in p.chain))
                if now != chains0[p.ordinal]:
                    violations.setdefault(RECONFIGURED, []).append(
                        f"p{p.ordinal}: epoch {chains0[p.ordinal][0]} {'-'.join(chains0[p.ordinal][1])} -> "
                        f"epoch {now[0]} {'-'.join(now[1])}; history {p.history}")
            load.wait_acks(load.acked_count() + AFTER_ACKS // 2, ACK_TIMEOUT_S)
            return _finish("disk_full", seed, client, cluster, load, stream, victim, affected, fault_s, heal_s,
                           violations, notes, facts)


# --- fsync_fails --------------------------------------------------------------------------------
def _fsync_fails(cluster: LocalCluster, disk: FaultyDisk, victim: str, seed: int, hold_s: float | None) -> Trial:
    hold_s = FSYNC_HOLD_S if hold_s is None else hold_s
    stream = "fsync-fails"
    notes: list[str] = [f"seed {seed}"]
    facts: dict = {}
    violations: dict[str, list[str]] = {}
    with sms.Client(cluster.address) as client:
        info, roles, affected, _ = _create(client, stream, victim)
        notes.append(_roles_note(victim, roles))

        def status() -> dict:
            return client.node_status(cluster.procs[victim].address)

        def in_chains() -> list[int]:
            now = _retry(lambda: client.get_stream_info(stream, refresh=True))
            return [p.ordinal for p in now.partitions if victim in {m.node_id for m in (*p.chain, *p.learners)}]

        with Workload(cluster.address, stream, producers=PRODUCERS, keys=KEYS, consumers=1, rate_per_s=RATE_PER_S,
                      payload_bytes=PAYLOAD_BYTES["fsync_fails"], name="ff", seed=seed) as load:
            history = load.history
            load.wait_acks(WARMUP_ACKS, ACK_TIMEOUT_S)
            load.mark_fault("fsync_fails", partitions=affected)
            fault_s = history.now()
            disk.fail_fsync()
            fenced = _wait(lambda: (s := status())["storage_last_error"].startswith("StorageFailed") and s,
                           FAULT_SEEN_TIMEOUT_S, f"{victim} reporting StorageFailed")
            facts["fenced_after_s"] = history.now() - fault_s
            if disk.failed_fsyncs() < 1:
                violations.setdefault(FAULT_MISSED, []).append(f"{victim} fenced, but its disk failed no fsync")
            if "Input/output error" not in fenced["storage_last_error"]:
                violations.setdefault(WRONG_ERROR, []).append(f"{victim}: {fenced['storage_last_error']}")

            removed = _wait(lambda: _removed_for_disk(client, stream, victim), REMOVE_TIMEOUT_S,
                            f"{victim} removed from its chains for its failed disk")
            facts["removed_after_s"] = history.now() - fault_s
            if not removed or not all("StorageFailed" in why for why in removed):
                violations.setdefault(WRONG_ERROR, []).append(f"{victim} removed for {removed}")
            load.wait_acks(load.acked_count() + AFTER_ACKS, ACK_TIMEOUT_S)
            _wait(lambda: _healed(client, stream), HEAL_TIMEOUT_S, f"replication factor 3 again without {victim}")
            facts["rf_back_after_s"] = history.now() - fault_s
            _hold(load, fault_s + hold_s - history.now())

            # a healthy disk again: the fenced node writes nothing and no chain takes it back
            disk.heal()
            facts["hold_s"] = history.now() - fault_s
            healed_failures = status()["storage_write_failures"]
            load.wait_acks(load.acked_count() + AFTER_ACKS // 2, ACK_TIMEOUT_S)
            failures, back = status()["storage_write_failures"], in_chains()
            if failures != healed_failures or back:
                violations.setdefault(FENCE_BROKEN, []).append(
                    f"{victim}, fenced, on a healthy disk before a restart: {failures} failed writes (at the "
                    f"heal {healed_failures}); in the chains of {back}")

            restart_s = time.monotonic()
            cluster.restart(victim)                 # recovers from what LMDB holds durably
            facts["restart_s"] = time.monotonic() - restart_s
            restarted_s = history.now()
            _wait(lambda: _healed(client, stream), HEAL_TIMEOUT_S, "every chain whole after the restart")
            heal_s = history.now()
            load.wait_acks(load.acked_count() + AFTER_ACKS, ACK_TIMEOUT_S)
            facts["healed_after_s"] = heal_s - restarted_s
            if status()["storage_write_failures"] != 0:
                violations.setdefault(FENCE_BROKEN, []).append(f"{victim} restarted, yet it reports failed writes")
            notes.append(f"after the restart {victim} is in the chains of {in_chains() or 'none'}")
            return _finish("fsync_fails", seed, client, cluster, load, stream, victim, affected, fault_s, heal_s,
                           violations, notes, facts)


# --- the tables ---------------------------------------------------------------------------------
TIMINGS = {
    "disk_full": (("took_s", "seconds per trial"),
                  ("refused_after_s", "ballast -> first StorageFull"),
                  ("resumed_after_heal_s", "space back -> every partition acks")),
    "fsync_fails": (("took_s", "seconds per trial"),
                    ("fenced_after_s", "fault -> StorageFailed reported"),
                    ("removed_after_s", "fault -> out of every chain"),
                    ("rf_back_after_s", "fault -> RF 3 again (spare node)"),
                    ("restart_s", "restart on the healed disk")),
}


def timing_table(trials: list[Trial]) -> str:
    """Per kind, the p50 and max of its TIMINGS facts over its trials."""
    lines = [("fault", "figure", "trials", "p50 s", "max s")]
    for kind, figures in TIMINGS.items():
        ts = [t for t in trials if t.kind == kind]
        for key, label in figures if ts else ():
            values = [t.facts[key] for t in ts if t.facts.get(key) is not None]
            lines.append((kind, label, str(len(values)), f"{statistics.median(values):.2f}" if values else "-",
                          f"{max(values):.2f}" if values else "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join([line[0].ljust(widths[0]), line[1].ljust(widths[1])]
                             + [c.rjust(w) for c, w in zip(line[2:], widths[2:])]).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def tables(trials: list[Trial]) -> str:
    return "\n\n".join([format_table([(t.kind, t.result) for t in trials]), pause_table(trials),
                        timing_table(trials)])


def describe(trial: Trial) -> str:
    r = trial.result
    return (f"{'ok' if r.ok else 'FAILED'} acked {r.acked} lost {r.lost} dup {r.duplicates} failed {r.failed} "
            f"hold {trial.hold_s:.1f}s fault->ack {_s(trial.pause_s)} max gap {_s(trial.max_gap_s)} "
            f"({trial.facts['took_s']:.0f}s); {'; '.join(trial.notes)}")


def main(argv: list[str] | None = None) -> int:
    from tests.zkserver import ZkServer
    parser = argparse.ArgumentParser(description="disk-fault trials on a cluster on ZooKeeper")
    parser.add_argument("kinds", nargs="*", default=list(KINDS), metavar="KIND",
                        help=f"default: all of {', '.join(KINDS)}")
    parser.add_argument("--trials", type=int, default=5, help="trials per kind")
    parser.add_argument("--seed", type=int, default=0, help="trial i of a kind runs with seed SEED + i")
    parser.add_argument("--dir", help="keep trial directories here (default: a temp dir)")
    parser.add_argument("--hold", type=float, help="keep every disk faulty at least this long (s); default: "
                        f"disk_full {FULL_HOLD_S}, fsync_fails {FSYNC_HOLD_S}")
    args = parser.parse_args(argv)
    unknown = [k for k in args.kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; expected some of {', '.join(KINDS)}")
    for kind in args.kinds:
        reason = skip_reason(kind)
        if reason:
            print(f"cannot run {kind} trials: {reason}", file=sys.stderr)
            return 2
    base = args.dir or tempfile.mkdtemp(prefix="sms-diskfault-")
    trials, failures = [], []
    with ZkServer(os.path.join(base, "zk")) as zk:
        for kind in args.kinds:
            for i in range(args.trials):
                seed = args.seed + i
                directory = os.path.join(base, f"{kind}-{i}")
                try:
                    trial = run_trial(kind, directory, seed=seed, zk=zk, hold_s=args.hold)
                except Exception as e:          # a trial that could not finish is a failed trial
                    failures.append(f"{kind} #{i} (seed {seed}): {e!r}; logs in {directory}")
                    print(f"{kind:<12} #{i}: ERROR {e!r}", flush=True)
                    continue
                trials.append(trial)
                print(f"{kind:<12} #{i}: {describe(trial)}", flush=True)
                if not trial.result.ok:
                    failures.append(f"{kind} #{i} (seed {seed}): {trial.result.summary()}; logs in {directory}")
    print()
    print(tables(trials))
    for f in failures:
        print("FAILED:", f)
    print(f"trial dirs in {base}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
