"""Shared pieces of the benchmarks: machine facts, progress lines, records, open-loop load.

Every benchmark prints one JSON document on stdout and its progress on stderr. Nothing
here asserts a timing: the figures are for people, not for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import math
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import time
from typing import Awaitable, Callable

_T0 = time.monotonic()


def tune_gc() -> dict:
    """The client-side tuning docs/performance.md recommends for high-rate Python
    clients, applied to every client this bench runs (ours and the peers' alike): freeze
    what is loaded and collect generation 0 every 50,000 allocations instead of 700.
    Returns what was set, for the JSON."""
    import gc
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    return {"gc_threshold": gc.get_threshold(), "gc_freeze": True}


def progress(message: str) -> None:
    """One progress line on stderr, with the seconds since the bench started."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _server_version(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None


def machine() -> dict:
    """Cores, memory, Python and the versions of what is measured."""
    mem_kib = 0
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
    cpu = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": {
            "sms": _version("sms-sps") or _version("sms"),
            "grpcio": _version("grpcio"),
            "lmdb": _version("lmdb"),
            "redis-py": _version("redis"),
            "nats-py": _version("nats-py"),
            "redis-server": _server_version(["redis-server", "--version"]),
            "nats-server": _server_version(["nats-server", "--version"]),
        },
    }


def records(n: int, size: int, keys: int = 1000, seed: int = 7) -> list[tuple[str, bytes]]:
    """`n` records of `size` random bytes over `keys` partition keys (the same in every run)."""
    rnd = random.Random(seed)
    payloads = [rnd.randbytes(size) for _ in range(min(n, 64))]
    return [(f"key-{rnd.randrange(keys)}", payloads[i % len(payloads)]) for i in range(n)]


def batches(recs: list, size: int) -> list[list]:
    return [recs[i:i + size] for i in range(0, len(recs), size)]


def percentiles_ms(latencies_s: list[float]) -> dict:
    """p50 / p99 / p99.9 / max of latencies given in seconds, in milliseconds."""
    if not latencies_s:
        return {"count": 0}
    xs = sorted(latencies_s)

    def at(q: float) -> float:
        return round(xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] * 1000, 3)
    return {"count": len(xs), "p50_ms": at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999),
            "max_ms": round(xs[-1] * 1000, 3)}


async def open_loop(send: Callable[[], Awaitable[None]], rate_per_s: float, duration_s: float,
                    in_flight_max: int = 10_000) -> dict:
    """Calls `send` at a fixed rate for `duration_s`, whether or not earlier calls finished.

    Each latency runs from the call's scheduled start, not its actual start, so a stall
    counts against every call it delayed (no coordinated omission). Returns the latencies
    and how many calls could not even start because `in_flight_max` were outstanding
    (those count as failed, not as fast)."""
    loop = asyncio.get_running_loop()
    interval = 1.0 / rate_per_s
    latencies: list[float] = []
    errors: list[str] = []
    tasks: set[asyncio.Task] = set()
    dropped = 0
    start = loop.time()

    async def one(scheduled: float) -> None:
        try:
            await send()
        except Exception as e:  # counted, shown in the result
            errors.append(repr(e)[:200])
            return
        latencies.append(loop.time() - scheduled)

    i = 0
    while True:
        scheduled = start + i * interval
        if scheduled - start >= duration_s:
            break
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= in_flight_max:
            dropped += 1
        else:
            t = loop.create_task(one(scheduled))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        i += 1
    if tasks:
        await asyncio.wait(tasks)
    elapsed = loop.time() - start
    return {"offered_per_s": round(rate_per_s, 1), "calls": i, "completed": len(latencies),
            "achieved_per_s": round(len(latencies) / elapsed, 1), "dropped": dropped,
            "errors": len(errors), "first_error": errors[0] if errors else None,
            "latency": percentiles_ms(latencies)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PROCESS_STOP_S = 10.0             # a server the bench started gets this long after SIGTERM


def wait_port(port: int, timeout_s: float = 15.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s")
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after PROCESS_STOP_S; waited for either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=PROCESS_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def print_verdicts(targets: list[dict], problems: list[str]) -> None:
    """One TARGET line per target (MET, MISSED or N/A) and one PROBLEM line per problem, on
    stderr: what a bench run alone ends with."""
    for t in targets:
        verdict = {True: "MET", False: "MISSED", None: "N/A"}[t["met"]]
        value = "None" if t["value"] is None else f"{t['value']:,.3f}"
        print(f"TARGET {verdict:6} {t['target']}: {value} (goal {t['goal_op']} {t['goal']}) - {t['detail']}",
              file=sys.stderr)
    for text in problems:
        print(f"PROBLEM {text}", file=sys.stderr)


class ServerProcess:
    """A server the bench starts itself on loopback and always stops (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: list[str], log_path: str, cwd: str | None = None):
        self.argv = argv
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                     start_new_session=True)
        return self

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
        with contextlib.suppress(Exception):
            self.log.close()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def target(name: str, value: float | None, goal: float, higher_is_better: bool = True, detail: str = "") -> dict:
    """One target of issues 7 and 13 as met / missed with its ratio; goal_op says which way."""
    op = ">=" if higher_is_better else "<="
    if value is None:
        return {"target": name, "goal": goal, "goal_op": op, "value": None, "met": None,
                "detail": detail or "not measured"}
    met = value >= goal if higher_is_better else value <= goal
    return {"target": name, "goal": goal, "goal_op": op, "value": round(value, 3), "met": met, "detail": detail}


def peer_main(run, description: str, prefix: str) -> None:
    """The command line of a peer baseline module (redis_streams, nats_js): arguments,
    a temporary directory, Ctrl-C stops the servers, one JSON document on stdout."""
    import argparse
    import json
    import tempfile
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--latency-fraction", type=float, default=0.5)
    p.add_argument("--latency-duration-s", type=float, default=5.0)
    a = p.parse_args()
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            out = asyncio.run(run(d, records=a.records, size=a.size, batch=a.batch,
                                  latency_fraction=a.latency_fraction, latency_duration_s=a.latency_duration_s))
    except KeyboardInterrupt:
        progress("interrupted; servers stopped and the temporary directory removed")
        sys.exit(130)
    print(json.dumps(out, indent=2))


def run_in_tempdir(prefix: str, body, args) -> tuple[dict, float]:
    """asyncio.run(body(args, directory)) in a fresh temporary directory, always removed;
    returns the result and the wall seconds."""
    import tempfile
    directory = tempfile.mkdtemp(prefix=prefix)
    t0 = time.perf_counter()
    try:
        return asyncio.run(body(args, directory)), round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def dig(d, *path):
    """d[path[0]][path[1]]..., or None where a level is missing or not a dict."""
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def mode_options(parser, args, by_mode: dict[str, dict]):
    """The options of a bench's run(args): the parser's defaults, under what `args` gives
    (a Namespace, a dict or None), then the mode's values ("smoke" / "quick" / "full", from
    args.smoke and args.quick) for what is still unset."""
    given = {} if args is None else dict(args) if isinstance(args, dict) else vars(args)
    out = parser.parse_args([])
    for k, v in given.items():
        setattr(out, k, v)
    mode = "smoke" if out.smoke else "quick" if out.quick else "full"
    for k, v in by_mode[mode].items():
        if getattr(out, k, None) is None:
            setattr(out, k, v)
    return out
