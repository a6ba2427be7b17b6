"""Baseline: Redis Streams with an fsync'd append-only file, same records and batch size as SMS.

Starts its own `redis-server` on loopback (`--appendonly yes --appendfsync always`, no RDB
snapshots) in a directory under `workdir`, and always stops it. Measures:

- ingest: pipelined XADD, one pipeline (transaction=False) of `batch` XADDs per round trip,
  from 1 and from several concurrent asyncio connections; the best is reported;
- read: the whole stream back with XRANGE pages of 10 000 (one reader);
- batch ack latency: open-loop pipelines of `batch` XADDs at a fraction of the max rate;
- ingest through Redis's own C client: `redis-benchmark -P <batch> -c 4 -n <benchmark_records>
  --csv XADD bench-c * k key-__rand_int__ d <size bytes>` (pipelines of `batch`, random keys
  over 1,000), its requests/s as records/s, checked against XLEN; with the CPU microseconds
  per record of redis-server (/proc/<pid>/stat) and of redis-benchmark (its rusage).
  Skipped, with a reason, when `redis-benchmark` is not on PATH.

Prints one JSON document. Never a test.

    .venv/bin/python -m bench.baselines.redis_streams [--records 200000] [--size 100] [--batch 500]
"""

from __future__ import annotations

import asyncio
import csv
import os
import resource
import shutil
import subprocess
import tempfile
import time

from bench import cpu
from bench.common import (ServerProcess, batches, free_port, open_loop, peer_main, progress, records as make_records,
                          wait_port)

CONCURRENCIES = (1, 4)
PROBE_DIVISOR = 5  # each concurrency is tried on 1/5 of the batches before the full run
READ_PAGE = 10_000
BENCHMARK_CLIENTS = 4          # redis-benchmark -c: connections, each with pipelines of `batch` XADDs
BENCHMARK_KEYS = 1_000         # redis-benchmark -r: key-__rand_int__ over this many keys, as common.records
BENCHMARK_TIMEOUT_S = 300
BENCHMARK_STREAM = "bench-c"


def _binary() -> str | None:
    return shutil.which("redis-server")


def available() -> str | None:
    """None if the benchmark can run, else a one-line reason."""
    if _binary() is None:
        return "redis-server binary not found on PATH"
    try:
        import redis.asyncio  # noqa: F401
    except ImportError as e:
        return f"redis-py (redis.asyncio) not importable: {e}"
    return None


def _server_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e!r})"


def _log_tail(path: str, n: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError:
        return ""


async def _xadd_pipeline(client, stream: str, batch: list[tuple[str, bytes]]) -> None:
    pipe = client.pipeline(transaction=False)
    for key, payload in batch:
        pipe.xadd(stream, {b"k": key, b"d": payload})
    await pipe.execute()


async def _ingest(client, stream: str, bs: list[list[tuple[str, bytes]]], concurrency: int) -> float:
    """Seconds to XADD every batch of `bs` over `concurrency` connections (pool of the client)."""
    work = iter(bs)  # shared: each worker takes the next batch when its previous one is acked

    async def worker() -> None:
        for b in work:
            await _xadd_pipeline(client, stream, b)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def _timed_ingest(client, stream: str, bs: list[list[tuple[str, bytes]]], concurrency: int) -> dict:
    n = sum(len(b) for b in bs)
    cpu0 = time.process_time()
    secs = await _ingest(client, stream, bs, concurrency)
    cpu = time.process_time() - cpu0
    length = await client.xlen(stream)
    return {"records": n, "records_per_s": round(n / secs), "seconds": round(secs, 3),
            "client_cpu_s": round(cpu, 3), "stream_length": length}


async def _read_all(client, stream: str) -> tuple[int, float]:
    n = 0
    start = "-"
    t0 = time.perf_counter()
    while True:
        page = await client.xrange(stream, min=start, max="+", count=READ_PAGE)
        if not page:
            break
        n += len(page)
        start = b"(" + page[-1][0]  # exclusive range (Redis >= 6.2)
        if len(page) < READ_PAGE:
            break
    return n, time.perf_counter() - t0


def _benchmark_argv(binary: str, port: int, records: int, size: int, batch: int) -> list[str]:
    """redis-benchmark pipelining XADDs of a partition key and `size` printable bytes
    (argv cannot carry NUL bytes: the payload is the hex of random bytes)."""
    payload = (os.urandom(size).hex() * 2)[:size]
    return [binary, "-h", "127.0.0.1", "-p", str(port), "-P", str(batch), "-c", str(BENCHMARK_CLIENTS),
            "-n", str(records), "-r", str(BENCHMARK_KEYS), "--csv",
            "XADD", BENCHMARK_STREAM, "*", "k", "key-__rand_int__", "d", payload]


def _parse_benchmark_csv(text: str) -> dict:
    """The one result row of `redis-benchmark --csv`: requests/s and latencies (ms)."""
    rows = [r for r in csv.DictReader(text.splitlines()) if r.get("rps")]
    if not rows:
        raise RuntimeError(f"no result row in redis-benchmark's output: {text[-500:]!r}")
    row = rows[-1]
    return {"rps": float(row["rps"]),
            "latency_ms": {k[:-len("_latency_ms")]: float(v) for k, v in row.items() if k.endswith("_latency_ms")}}


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


async def _redis_benchmark(client, server_pid: int, port: int, records: int, size: int, batch: int) -> dict:
    """Ingest through redis-benchmark (Redis's own C client); records rounded up to
    whole pipelines."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"skipped": "redis-benchmark not found on PATH (Debian: redis-tools)"}
    records = -(-records // batch) * batch
    argv = _benchmark_argv(binary, port, records, size, batch)
    progress(f"redis: redis-benchmark, {records:,} XADD in pipelines of {batch}, {BENCHMARK_CLIENTS} connections")
    meter = cpu.Meter({"redis-server": server_pid})
    meter.start()
    children0 = _children_cpu_s()
    t0 = time.perf_counter()
    out = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=BENCHMARK_TIMEOUT_S)
    wall = time.perf_counter() - t0
    server = meter.stop(records)
    if out.returncode != 0:
        raise RuntimeError(f"redis-benchmark exited {out.returncode}: {(out.stderr or out.stdout)[-500:]}")
    parsed = _parse_benchmark_csv(out.stdout)
    length = await client.xlen(BENCHMARK_STREAM)
    client_us = round((_children_cpu_s() - children0) * 1e6 / records, 2)
    us = {**server["us_per_record"], "redis-benchmark": client_us}
    return {"records": records, "records_per_s": round(parsed["rps"]), "latency_ms": parsed["latency_ms"],
            "wall_s_with_process_start": round(wall, 3), "stream_length": length,
            "stream_length_matches": length == records,
            "cpu_per_record": {"us_per_record": us, "total_us_per_record": round(sum(us.values()), 2)},
            "command": " ".join(argv[1:-1]) + f" <{size} bytes>",
            "client": f"redis-benchmark (C, hiredis), {BENCHMARK_CLIENTS} connections, pipelines of {batch} "
                      "(-P); records/s is its requests/s"}


async def run(workdir: str, records: int = 200_000, size: int = 100, batch: int = 500,
              latency_fraction: float = 0.5, latency_duration_s: float = 5.0,
              benchmark_records: int | None = None) -> dict:
    reason = available()
    if reason:
        return {"skipped": reason}
    import redis.asyncio as aredis
    try:
        import hiredis  # noqa: F401
        parser = "hiredis"
    except ImportError:
        parser = "pure-python"

    binary = _binary()
    data_dir = tempfile.mkdtemp(prefix="redis-streams-", dir=workdir)
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", data_dir,
            "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    log_path = os.path.join(data_dir, "redis-server.log")
    recs = make_records(records, size)
    bs = batches(recs, batch)
    result: dict = {"records": records, "size": size, "batch": batch}
    try:
        progress(f"redis: starting redis-server on 127.0.0.1:{port}")
        with ServerProcess([binary, *args], log_path, cwd=data_dir) as server:
            try:
                wait_port(port)
            except TimeoutError as e:
                raise RuntimeError(f"{e}; exit={server.proc.poll()}; log:\n{_log_tail(log_path)}") from None
            client = aredis.Redis(host="127.0.0.1", port=port, max_connections=256)
            try:
                await client.ping()
                info = await client.info("server")
                appendfsync = (await client.config_get("appendfsync")).get("appendfsync")

                # Pick the concurrency on a slice of the records, then ingest them all with it.
                probe = bs[:max(1, len(bs) // PROBE_DIVISOR)]
                probe_n = sum(len(b) for b in probe)
                trials = {}
                for c in CONCURRENCIES:
                    progress(f"redis: probe ingest {probe_n} records, pipelines of {batch} XADD, {c} connection(s)")
                    trials[c] = await _timed_ingest(client, f"probe-c{c}", probe, c)
                    await client.delete(f"probe-c{c}")
                best_c = max(trials, key=lambda c: trials[c]["records_per_s"])
                progress(f"redis: ingest {records} records, pipelines of {batch} XADD, {best_c} connection(s)")
                full = await _timed_ingest(client, "bench", bs, best_c)
                best_rate = full["records_per_s"]
                result["ingest_records_per_s"] = best_rate
                result["ingest_concurrency"] = best_c
                result["ingest_full_run"] = full
                result["ingest_probes"] = {f"connections_{c}": t for c, t in trials.items()}

                progress(f"redis: read the stream back with XRANGE COUNT {READ_PAGE}")
                n, secs = await _read_all(client, "bench")
                result["read_records_per_s"] = round(n / secs) if secs > 0 else None
                result["read_records"] = n

                rate = latency_fraction * best_rate / batch
                progress(f"redis: open-loop batch ack latency, {rate:.1f} pipelines/s of {batch} for {latency_duration_s} s")
                lat_batches = bs[:max(1, min(len(bs), 64))]
                counter = 0

                async def send() -> None:
                    nonlocal counter
                    b = lat_batches[counter % len(lat_batches)]
                    counter += 1
                    await _xadd_pipeline(client, "bench-latency", b)

                lat = await open_loop(send, rate, latency_duration_s)
                lat["fraction_of_max"] = latency_fraction
                lat["records_per_call"] = batch
                result["batch_ack_latency"] = lat
                try:   # a failure here keeps the redis-py figures; bench/run.py lists it as a problem
                    result["redis_benchmark"] = await _redis_benchmark(
                        client, server.proc.pid, port, benchmark_records or records, size, batch)
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    result["redis_benchmark"] = {"error": repr(e)[:500]}
            finally:
                await client.aclose()
        result["config"] = {
            "server": _server_version(binary),
            "redis_version": info.get("redis_version"),
            "server_args": args[:4] + ["--dir", "<workdir>/" + os.path.basename(data_dir)] + args[6:],
            "appendfsync_reported_by_server": appendfsync,
            "durability": "AOF with appendfsync always (redis.conf: 'fsync after every write to the append only "
                          "log'); Redis writes the AOF once per event-loop iteration, before the replies, so "
                          "a pipeline (and concurrent clients) share one write + fsync",
            "replication": "none (single node)",
            "client": f"redis-py asyncio, {parser} reply parser (commands are packed in pure Python by "
                      f"redis.asyncio), pipeline(transaction=False); see client_cpu_s vs seconds for how "
                      f"client-bound the ingest is",
            "record_fields": {"k": "partition key", "d": "payload"},
            "concurrencies_tried": f"{list(CONCURRENCIES)} connections, each on 1/{PROBE_DIVISOR} of the batches "
                                   f"(ingest_probes); the full run uses the best",
        }
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def main() -> None:
    peer_main(run, __doc__.splitlines()[0], "bench-redis-")


if __name__ == "__main__":
    main()
