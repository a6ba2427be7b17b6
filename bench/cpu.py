"""CPU time per record, per process: what each SMS figure of the bench costs in CPU.

A `Meter` reads utime + stime (all threads) from /proc/<pid>/stat of a fixed set of
processes when a workload starts and when it ends, and divides each process's CPU
seconds by the records the workload acknowledged (or read). `cluster_pids` names the
processes of a `LocalCluster` (the control process and each storage node, by node id)
and the bench's own process ("client": every in-process client, its gRPC threads
included). A process that is gone by the end is left out of the figures and named.

The resolution is one clock tick (os.sysconf("SC_CLK_TCK"), usually 1/100 s) per
process and reading, so a workload of few records gives a coarse figure. Nothing here
asserts anything: the figures are for people.
"""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK")
CLIENT = "client"
STAT_UTIME_FIELD = 11     # after the ")" that ends the command name: state is field 0, utime 11, stime 12
STAT_STIME_FIELD = 12


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` (every thread) in seconds, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(b")") + 2:].split()
    return (int(fields[STAT_UTIME_FIELD]) + int(fields[STAT_STIME_FIELD])) / CLK_TCK


def cluster_pids(cluster) -> dict[str, int]:
    """{node id: pid} of the live processes of a LocalCluster, and this process as CLIENT."""
    pids = {node_id: node.pid for node_id, node in cluster.procs.items()
            if node.proc is not None and node.proc.poll() is None}
    pids[CLIENT] = os.getpid()
    return pids


class Meter:
    """CPU seconds of named processes between start() and stop(records); reusable, one
    workload at a time. A Meter of no processes measures nothing (stop() gives None)."""

    def __init__(self, pids: dict[str, int] | None = None):
        self.pids = dict(pids or {})
        self._before: dict[str, float | None] = {}

    def start(self) -> None:
        self._before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self, records: int) -> dict | None:
        if not self.pids:
            return None
        after = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return per_record(self._before, after, records)


def per_record(before: dict[str, float | None], after: dict[str, float | None], records: int) -> dict:
    """Each process's CPU seconds between two readings, and per record in microseconds."""
    cpu = {name: round(after[name] - before[name], 3) for name in before
           if before[name] is not None and after.get(name) is not None}
    gone = sorted(set(before) - set(cpu))
    us = {name: round(s * 1e6 / records, 2) if records else None for name, s in cpu.items()}
    total = round(sum(cpu.values()) * 1e6 / records, 2) if records else None
    return {"records": records, "cpu_s": cpu, "us_per_record": us, "total_us_per_record": total,
            "processes_gone": gone, "clock_ticks_per_s": CLK_TCK}


NONE = Meter()    # the default of the workloads: no CPU figure
