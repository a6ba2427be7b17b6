"""The write pause that keys see when the head, a middle node or the tail of a chain is killed.

Starts `LocalCluster` (control + 4 storage nodes, separate processes: the fourth node is
the spare the chain manager rebuilds chains with) and a stream of `--partitions`
partitions with replication factor 3 and persistence "disk". One de-duplicating producer
sends a record on each of `--keys` keys every `--interval-ms` (open loop: a key's next
record is sent on schedule whether or not the last one was acknowledged; each latency
runs from the record's scheduled time). For each role (head, middle, tail; `--quick`:
head only) it picks a partition's member in that role (from `get_stream_info`), kills it
with SIGKILL, keeps sending for `--keep-s` seconds, restarts it on its data and waits
(polling, with a deadline) until every chain is back at full length before the next role.

Per kill it reports, for the partitions where the killed node held the role (affected)
and for those it was no member of (unaffected), and also for every other role it held:

- the write pause: per key, the longest acknowledgement latency of a record sent from the
  kill to `--window-s` after it; p50 and max over the keys (as repartition_pause.py);
- acks resume: the first acknowledgement of a record sent after the kill, minus the kill
  time (max over the partitions of the group: when the slowest one resumed);
- how long the chain manager took to drop the victim and to rebuild the chain;
- a timeline: the longest ack latency of the records sent in each half second from 1 s
  before the kill until the restart (`--keep-s` after it).

The baseline is the same pause figure for records sent well before the first kill. At the
end every partition is read from TRIM_HORIZON (`read_stream`) and every acknowledged
record must be there exactly once: lost and duplicated counts are reported (expected 0),
and an acknowledged SN that differs from the stored one is counted too. Prints one JSON
document on stdout, progress on stderr. Never asserts a timing.

    .venv/bin/python bench/failover_pause.py [--quick | --smoke] [--keys 100] [--interval-ms 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402
from sms import aio, errors, hashing  # noqa: E402
from node.launcher import LocalCluster  # noqa: E402

ROLES = ("head", "middle", "tail")
STREAM = "bench-failover"
RID_BYTES = 8


def quantiles(values: list[float]) -> dict:
    if not values:
        return {"keys": 0}
    values = sorted(values)
    return {"keys": len(values), "p50_ms": round(statistics.median(values), 1), "max_ms": round(values[-1], 1)}


def _healed(info, rf: int) -> bool:
    return all(len(p.chain) == rf and not p.learners and all(m.address for m in p.chain)
               for p in info.partitions)


def _roles_of(info, node_id: str) -> dict[int, str]:
    """ordinal -> the role `node_id` holds in that partition's chain ("not_member" if none)."""
    out = {}
    for p in info.partitions:
        role = next((m.role for m in p.chain if m.node_id == node_id), "not_member")
        out[p.ordinal] = "head" if role == "head+tail" else role
    return out


def _pick_victim(info, role: str) -> tuple[str, dict[int, str]]:
    """A node with `role` in some partition's chain, preferring one that is missing from
    some other partition (so the kill has an unaffected partition to compare with)."""
    candidates = []
    for p in sorted(info.partitions, key=lambda p: p.ordinal):
        for m in p.chain:
            if m.role == role:
                roles = _roles_of(info, m.node_id)
                candidates.append((0 if "not_member" in roles.values() else 1, p.ordinal, m.node_id, roles))
    if not candidates:
        chains = [(p.ordinal, [m.role for m in p.chain]) for p in info.partitions]
        raise RuntimeError(f"no chain has a {role}: {chains}")
    _, _, node_id, roles = min(candidates)
    return node_id, roles


async def _wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll an async predicate until it returns something true; TimeoutError past the deadline."""
    deadline = time.perf_counter() + timeout_s
    last_error = None
    while True:
        try:
            value = await predicate()
            if value:
                return value
        except errors.SmsError as e:
            last_error = e
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what}: not after {timeout_s} s (last error: {last_error!r})")
        await asyncio.sleep(interval_s)


class Load:
    """The open-loop producer load, with every record's key, partition and times."""

    def __init__(self, producer, keys: list[str], key_ordinal: dict[str, int], interval_s: float, size: int):
        self.producer = producer
        self.keys = keys
        self.key_ordinal = key_ordinal
        self.interval_s = interval_s
        self.size = size
        self.sent: list[tuple[str, int, float]] = []          # rid -> (key, ordinal, scheduled time)
        self.acked: dict[int, tuple[float, int | None, bool]] = {}   # rid -> (ack time, sn, duplicate)
        self.errors: dict[int, str] = {}
        self.stop = asyncio.Event()
        self.late_ticks = 0

    def _done(self, rid: int, fut: asyncio.Future) -> None:
        now = time.perf_counter()
        if fut.cancelled():
            self.errors[rid] = "cancelled"
            return
        exc = fut.exception()
        if exc is not None:
            self.errors[rid] = f"{type(exc).__name__}: {exc}"[:300]
            return
        res = fut.result()
        self.acked[rid] = (now, res.sn, bool(res.duplicate))

    async def run(self) -> None:
        pad = b"x" * max(0, self.size - RID_BYTES)
        tick = time.perf_counter()
        while not self.stop.is_set():
            for key in self.keys:
                rid = len(self.sent)
                self.sent.append((key, self.key_ordinal[key], tick))
                fut = await self.producer.send(rid.to_bytes(RID_BYTES, "big") + pad, key)
                fut.add_done_callback(lambda f, rid=rid: self._done(rid, f))
            tick += self.interval_s
            delay = tick - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                self.late_ticks += 1
                await asyncio.sleep(0)

    def group(self, ordinals: set[int], t_from: float, t_to: float) -> dict:
        """Pause figures of the records of `ordinals` scheduled in [t_from, t_to]."""
        worst: dict[str, float] = {}
        sent = acked = failed = 0
        for rid, (key, ordinal, t0) in enumerate(self.sent):
            if ordinal not in ordinals or not t_from <= t0 <= t_to:
                continue
            sent += 1
            if rid in self.acked:
                acked += 1
                worst[key] = max(worst.get(key, 0.0), (self.acked[rid][0] - t0) * 1000)
            elif rid in self.errors:
                failed += 1
        return {"partitions": sorted(ordinals), "records_sent": sent, "acked": acked, "failed": failed,
                "write_pause": quantiles(list(worst.values()))}

    def timeline(self, ordinals: set[int], t_kill: float, t_from_s: float, t_to_s: float,
                 step_s: float = 0.5) -> list[list]:
        """[offset of the bucket from the kill in s, longest ack latency in ms of the records
        of `ordinals` scheduled in it (None: none acked)] for buckets of `step_s`."""
        n = int(round((t_to_s - t_from_s) / step_s))
        worst: list[float | None] = [None] * n
        for rid, (_key, ordinal, t0) in enumerate(self.sent):
            b = int((t0 - t_kill - t_from_s) // step_s)
            if ordinal in ordinals and 0 <= b < n and rid in self.acked:
                lat = (self.acked[rid][0] - t0) * 1000
                worst[b] = lat if worst[b] is None else max(worst[b], lat)
        return [[round(t_from_s + i * step_s, 1), None if w is None else round(w)] for i, w in enumerate(worst)]

    def resume_ms(self, ordinal: int, t_kill: float) -> float | None:
        """First ack of a record of `ordinal` scheduled after the kill, minus the kill time."""
        first = None
        for rid, (_key, o, t0) in enumerate(self.sent):
            if o == ordinal and t0 >= t_kill and rid in self.acked:
                t = self.acked[rid][0]
                first = t if first is None else min(first, t)
        return None if first is None else round((first - t_kill) * 1000, 1)


async def _watch_chain(client: aio.Client, ordinals: list[int], victim: str, rf: int, t_kill: float,
                       out: dict, stop: asyncio.Event) -> None:
    """Times (from the kill) at which the victim left each target chain and the chain was full again."""
    while not stop.is_set():
        try:
            info = await client.get_stream_info(STREAM)
            parts = [info.partition(o) for o in ordinals]
            now = time.perf_counter()
            if "victim_removed_s" not in out and all(victim not in [m.node_id for m in p.chain] for p in parts):
                out["victim_removed_s"] = round(now - t_kill, 2)
            if "victim_removed_s" in out and "chain_full_without_victim_s" not in out and all(
                    len(p.chain) == rf and not p.learners and victim not in [m.node_id for m in p.chain]
                    for p in parts):
                out["chain_full_without_victim_s"] = round(now - t_kill, 2)
                return
        except errors.SmsError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except asyncio.TimeoutError:
            pass


async def _read_back(client: aio.Client, load: Load) -> dict:
    seen: dict[int, int] = {}
    stored_sn: dict[int, int] = {}
    foreign = 0
    n = 0
    async for rec in client.read_stream(STREAM):
        n += 1
        if len(rec.data) < RID_BYTES:
            foreign += 1
            continue
        rid = int.from_bytes(rec.data[:RID_BYTES], "big")
        if rid >= len(load.sent):
            foreign += 1
            continue
        seen[rid] = seen.get(rid, 0) + 1
        stored_sn.setdefault(rid, rec.sn)
    lost = [rid for rid in load.acked if rid not in seen]
    dups = {rid: c for rid, c in seen.items() if c > 1}
    sn_mismatch = [rid for rid, (_t, sn, _d) in load.acked.items()
                   if sn is not None and rid in stored_sn and stored_sn[rid] != sn]
    return {"records_read": n, "distinct_records": len(seen),
            "acked_lost": len(lost), "first_lost": [(rid, load.sent[rid][0], load.sent[rid][1]) for rid in lost[:5]],
            "duplicated_records": len(dups), "duplicate_extra_copies": sum(c - 1 for c in dups.values()),
            "first_duplicated": [(rid, load.sent[rid][0], load.sent[rid][1], c) for rid, c in list(dups.items())[:5]],
            "acked_sn_differs_from_stored": len(sn_mismatch),
            "unacked_but_stored": sum(1 for rid in seen if rid not in load.acked),
            "unknown_records": foreign}


async def _run(args, directory: str) -> dict:
    roles = ("head",) if args.quick or args.smoke else ROLES
    cluster = LocalCluster(os.path.join(directory, "cluster"), nodes=args.nodes, port=0)
    os.environ.update(cluster.client_env())     # its clients trust its CA
    common.progress(f"starting a cluster of {args.nodes} storage nodes in {directory}")
    cluster.start()
    try:
        async with aio.Client(cluster.address) as client:
            info = await client.create_stream(STREAM, partitions=args.partitions, replication_factor=args.rf,
                                              persistence="disk")
            info = await _wait_for(lambda: _fresh_if_healed(client, args.rf), args.heal_timeout_s,
                                   "stream chains complete")
            keys = [f"key-{i}" for i in range(args.keys)]
            key_ordinal = {k: info.open_partition_for_hash(hashing.hash_key_of(k)).ordinal for k in keys}
            producer = client.producer(STREAM, "bench-failover", delivery_timeout_s=args.delivery_timeout_s)
            load = Load(producer, keys, key_ordinal, args.interval_ms / 1000, args.size)
            loader = asyncio.ensure_future(load.run())
            t_start = time.perf_counter()
            kills = []
            flush_timed_out = False
            try:
                common.progress(f"load: {args.keys} keys every {args.interval_ms} ms "
                                f"({args.keys * 1000 / args.interval_ms:.0f} records/s); warm-up {args.warmup_s} s")
                await asyncio.sleep(args.warmup_s)
                for role in roles:
                    if loader.done():
                        break
                    info = await client.get_stream_info(STREAM)
                    victim, victim_roles = _pick_victim(info, role)
                    targets = sorted(o for o, r in victim_roles.items() if r == role)
                    chains_before = {p.ordinal: [f"{m.node_id}:{m.role}" for m in p.chain] for p in info.partitions}
                    watch: dict = {}
                    watch_stop = asyncio.Event()
                    t_kill = time.perf_counter()
                    watcher = asyncio.ensure_future(_watch_chain(client, targets, victim, args.rf, t_kill,
                                                                 watch, watch_stop))
                    cluster.kill(victim)
                    common.progress(f"killed {victim} ({role} of {targets}; roles {victim_roles}); "
                                    f"sending {args.keep_s} s more")
                    await asyncio.sleep(args.keep_s)
                    t_restart = time.perf_counter()
                    await asyncio.to_thread(cluster.restart, victim)
                    t_restarted = time.perf_counter()
                    common.progress(f"restarted {victim} in {t_restarted - t_restart:.1f} s; waiting for full chains")
                    await _wait_for(lambda: _fresh_if_healed(client, args.rf), args.heal_timeout_s,
                                    f"every chain at {args.rf} members after restarting {victim}")
                    t_healed = time.perf_counter()
                    watch_stop.set()
                    await watcher
                    after = await client.get_stream_info(STREAM)
                    kills.append({"role": role, "victim": victim, "victim_roles": victim_roles, "targets": targets,
                                  "t_kill": t_kill, "chains_before": chains_before,
                                  "chains_after": {p.ordinal: [f"{m.node_id}:{m.role}" for m in p.chain]
                                                   for p in after.partitions},
                                  "kill_to_victim_removed_s": watch.get("victim_removed_s"),
                                  "kill_to_chain_full_without_victim_s": watch.get("chain_full_without_victim_s"),
                                  "restart_call_s": round(t_restarted - t_restart, 2),
                                  "restart_to_all_chains_full_s": round(t_healed - t_restarted, 2)})
                    common.progress(f"chains full {t_healed - t_restarted:.1f} s after the restart; "
                                    f"settling {args.settle_s} s")
                    await asyncio.sleep(args.settle_s)
            finally:
                load.stop.set()
                await loader
                common.progress(f"flushing {len(load.sent) - len(load.acked) - len(load.errors)} unsettled records")
                try:
                    await asyncio.wait_for(producer.flush(), args.flush_timeout_s)
                except asyncio.TimeoutError:
                    flush_timed_out = True
                stats = producer.statistics()
                await producer.close()
            t_end = time.perf_counter()
            common.progress("reading the stream back from TRIM_HORIZON")
            t0 = time.perf_counter()
            read_back = await _read_back(client, load)
            read_s = time.perf_counter() - t0
            common.progress(f"read {read_back['records_read']} records in {read_s:.1f} s: "
                            f"lost {read_back['acked_lost']}, duplicated {read_back['duplicated_records']}")

            all_ordinals = set(key_ordinal.values())
            out_kills = []
            for k in kills:
                t_kill = k.pop("t_kill")
                by_role = {}
                for r in ("head", "middle", "tail", "not_member"):
                    ords = {o for o, vr in k["victim_roles"].items() if vr == r and o in all_ordinals}
                    if not ords:
                        continue
                    g = load.group(ords, t_kill, t_kill + args.window_s)
                    resumes = [load.resume_ms(o, t_kill) for o in sorted(ords)]
                    g["acks_resume_ms_per_partition"] = resumes
                    g["acks_resume_ms"] = None if any(x is None for x in resumes) else max(resumes)
                    g["max_latency_ms_by_send_time"] = load.timeline(ords, t_kill, -1.0, args.keep_s)
                    by_role[r] = g
                k["victim_roles"] = {str(o): r for o, r in sorted(k["victim_roles"].items())}
                k["chains_before"] = {str(o): c for o, c in k["chains_before"].items()}
                k["chains_after"] = {str(o): c for o, c in k["chains_after"].items()}
                k["affected"] = by_role.get(k["role"])
                k["unaffected"] = by_role.get("not_member")
                k["by_victim_role"] = by_role
                out_kills.append(k)
            # well before any kill: the second half of the warm-up
            baseline_end = (t_start + args.warmup_s - 0.25) if kills else t_end
            baseline = load.group(all_ordinals, t_start + args.warmup_s / 2, baseline_end)
            error_names: dict[str, int] = {}
            for e in load.errors.values():
                name = e.split(":", 1)[0]
                error_names[name] = error_names.get(name, 0) + 1
            return {
                "offered_records_per_s": round(args.keys * 1000 / args.interval_ms),
                "kills": out_kills,
                "baseline_before_kills": baseline,
                "records_sent": len(load.sent), "records_acked": len(load.acked),
                "acks_answered_as_duplicate": sum(1 for v in load.acked.values() if v[2]),
                "producer_errors": len(load.errors), "producer_error_kinds": error_names,
                "first_errors": list(load.errors.values())[:5],
                "unsettled_at_end": len(load.sent) - len(load.acked) - len(load.errors),
                "flush_timed_out": flush_timed_out,
                "load_generator_late_ticks": load.late_ticks,
                "producer_totals": {k: v for k, v in stats.items() if k.endswith("_total")},
                "read_back": read_back,
                "read_back_s": round(read_s, 2),
                "node_exit_codes_at_end": cluster.exited(),
            }
    finally:
        common.progress("stopping the cluster")
        cluster.stop()


async def _fresh_if_healed(client: aio.Client, rf: int):
    info = await client.get_stream_info(STREAM)
    return info if _healed(info, rf) else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="head kill only, shorter windows (< 40 s)")
    p.add_argument("--smoke", action="store_true", help="tiny and fastest, still a real kill and restart")
    p.add_argument("--keys", type=int, default=None, help="keys (default 100; smoke 10)")
    p.add_argument("--interval-ms", type=float, default=None, help="each key sends a record this often (default 100)")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=None, help="default 4 (smoke 2)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=None)
    p.add_argument("--keep-s", type=float, default=None, help="keep sending this long after a kill, then restart")
    p.add_argument("--window-s", type=float, default=None, help="records sent this long after a kill count")
    p.add_argument("--settle-s", type=float, default=None, help="pause between one role's healing and the next kill")
    p.add_argument("--heal-timeout-s", type=float, default=90.0)
    p.add_argument("--flush-timeout-s", type=float, default=90.0)
    p.add_argument("--delivery-timeout-s", type=float, default=100.0)
    return p


def _defaults(args) -> argparse.Namespace:
    """The options: parser defaults, under what `args` gives, then the mode's values."""
    args = common.mode_options(build_parser(), args, {
        "smoke": dict(keys=10, interval_ms=100.0, partitions=2, warmup_s=1.5, keep_s=4.0, window_s=2.0, settle_s=0.0),
        "quick": dict(keys=100, interval_ms=100.0, partitions=4, warmup_s=3.0, keep_s=6.0, window_s=3.0, settle_s=0.0),
        "full": dict(keys=100, interval_ms=100.0, partitions=4, warmup_s=4.0, keep_s=10.0, window_s=5.0, settle_s=2.0),
    })
    return args


def run(args) -> dict:
    """The whole benchmark: one JSON-able document (the driver's entry point)."""
    args = _defaults(args)
    result, wall_s = common.run_in_tempdir("sms-bench-failover-", _run, args)
    return {"bench": "failover_pause", "machine": common.machine(),
            "parameters": {**vars(args), "persistence": "disk", "mode": "smoke" if args.smoke else
                           "quick" if args.quick else "full"},
            **result, "wall_s": wall_s}


def main(argv: list[str] | None = None) -> int:
    import json
    doc = run(build_parser().parse_args(argv))
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
