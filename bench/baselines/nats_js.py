"""Baseline: NATS JetStream (file storage), one node ("r1") and a three-node loopback cluster ("r3").

Starts its own `nats-server` processes on loopback in directories under `workdir` and always
stops them. For each set-up, with the same records and batch size as SMS:

- ingest: `records` async publishes (`js.publish_async`), in windows of `batch` whose acks are
  gathered per window, with 1 or 2 windows in flight (r1 tries both on a slice; r3 reuses the choice);
- read: one ordered push consumer (no acks, flow-controlled) reading the whole stream back;
- batch ack latency: open-loop calls of one window of `batch` async publishes + all its acks,
  at a fraction of the measured max window rate;
- sync publish latency: open-loop single `await js.publish()` calls at a modest fixed rate.

Prints one JSON document {"r1": {...}, "r3": {...}}. Never a test.

    .venv/bin/python -m bench.baselines.nats_js [--records 200000] [--size 100] [--batch 500]
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shutil
import subprocess
import tempfile
import time

from bench.common import (ServerProcess, batches, free_port, open_loop, peer_main, progress, records as make_records,
                          wait_port)

WINDOW_DEPTHS = (1, 2)   # windows of `batch` publishes kept in flight, tried on a slice first
PROBE_DIVISOR = 10       # r1 tries each depth on 1/10 of the batches; r3 reuses r1's choice
SYNC_PUBLISH_RATE = 500.0
CLUSTER_READY_DEADLINE_S = 30.0
_FALLBACK_PATHS = ("/usr/sbin/nats-server", "/usr/local/sbin/nats-server", "/usr/local/bin/nats-server")


def _binary() -> str | None:
    found = shutil.which("nats-server")
    if found:
        return found
    return next((p for p in _FALLBACK_PATHS if os.access(p, os.X_OK)), None)


def available() -> str | None:
    """None if the benchmark can run, else a one-line reason."""
    if _binary() is None:
        return "nats-server binary not found (PATH, /usr/sbin, /usr/local/bin)"
    try:
        import nats  # noqa: F401
        import nats.js  # noqa: F401
    except ImportError as e:
        return f"nats-py not importable: {e}"
    return None


def _run_text(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"failed: {e!r}"
    return (out.stdout + out.stderr).strip()


def _sync_option_probe(binary: str, directory: str) -> dict:
    """Does this nats-server accept `jetstream { sync_interval: always }`? (`nats-server -t`)."""
    conf = os.path.join(directory, "sync-probe.conf")
    with open(conf, "w") as f:
        f.write(f'jetstream {{\n  store_dir: "{os.path.join(directory, "sync-probe-js")}"\n'
                f'  sync_interval: "always"\n}}\n')
    out = _run_text([binary, "-t", "-c", conf])
    accepted = "unknown field" not in out and "error" not in out.lower()
    return {"config_tried": 'jetstream { sync_interval: "always" }', "accepted": accepted,
            "nats_server_t_output": out.splitlines()[0] if out else ""}


def _log_tail(path: str, n: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")
    except OSError:
        return ""


def _wait_server(server: ServerProcess, port: int) -> None:
    try:
        wait_port(port)
    except TimeoutError as e:
        raise RuntimeError(f"{e}; exit={server.proc.poll()}; log:\n{_log_tail(server.log_path)}") from None


def _start_r1(stack: contextlib.ExitStack, binary: str, base: str) -> tuple[list[str], dict]:
    port = free_port()
    store = os.path.join(base, "js")
    argv = [binary, "-js", "-sd", store, "-p", str(port), "-a", "127.0.0.1"]
    progress(f"nats r1: starting nats-server on 127.0.0.1:{port}")
    server = stack.enter_context(ServerProcess(argv, os.path.join(base, "nats-server.log"), cwd=base))
    _wait_server(server, port)
    shown = [a if a != store else "<workdir>/r1/js" for a in argv[1:]]
    return [f"nats://127.0.0.1:{port}"], {"server_args": shown}


def _start_r3(stack: contextlib.ExitStack, binary: str, base: str) -> tuple[list[str], dict]:
    ports = [free_port() for _ in range(3)]
    cports = [free_port() for _ in range(3)]
    servers = []
    first_conf = ""
    for i in range(3):
        node = os.path.join(base, f"n{i}")
        os.makedirs(node, exist_ok=True)
        routes = ", ".join(f"nats-route://127.0.0.1:{cports[j]}" for j in range(3) if j != i)
        conf = (f'server_name: "n{i}"\n'
                f'listen: "127.0.0.1:{ports[i]}"\n'
                f'jetstream {{\n  store_dir: "{os.path.join(node, "js")}"\n}}\n'
                f'cluster {{\n  name: "bench"\n  listen: "127.0.0.1:{cports[i]}"\n  routes: [{routes}]\n}}\n')
        if i == 0:
            first_conf = conf.replace(os.path.join(node, "js"), "<workdir>/r3/n0/js")
        path = os.path.join(node, "nats.conf")
        with open(path, "w") as f:
            f.write(conf)
        progress(f"nats r3: starting node n{i} on 127.0.0.1:{ports[i]} (cluster port {cports[i]})")
        servers.append(stack.enter_context(
            ServerProcess([binary, "-c", path], os.path.join(node, "nats-server.log"), cwd=node)))
    for server, port in zip(servers, ports):
        _wait_server(server, port)
    return ([f"nats://127.0.0.1:{p}" for p in ports],
            {"server_args": ["-c", "<node>.conf"], "node_config_n0": first_conf})


async def _add_stream(js, name: str, subjects: list[str], replicas: int, deadline_s: float):
    """Creates the stream, retrying until JetStream (and, clustered, its meta leader) is ready."""
    from nats.js.api import StorageType, StreamConfig
    cfg = StreamConfig(name=name, subjects=subjects, storage=StorageType.FILE, num_replicas=replicas)
    deadline = time.monotonic() + deadline_s
    last = None
    while True:
        try:
            return await js.add_stream(cfg)
        except Exception as e:  # not ready yet: no meta leader, no responders, timeout, ...
            last = e
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not create stream {name} (R{replicas}) within {deadline_s} s: {last!r}")
        await asyncio.sleep(0.25)


async def _publish_window(js, window: list[tuple[str, bytes]]) -> list:
    futures = [await js.publish_async(subject, payload) for subject, payload in window]
    return futures


async def _ingest(js, windows: list[list[tuple[str, bytes]]], depth: int) -> dict:
    """Publishes every window asynchronously, keeping at most `depth` windows' acks outstanding."""
    n = sum(len(w) for w in windows)
    pending: collections.deque = collections.deque()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for w in windows:
        pending.append(await _publish_window(js, w))
        if len(pending) >= depth:
            await asyncio.gather(*pending.popleft())
    while pending:
        await asyncio.gather(*pending.popleft())
    secs = time.perf_counter() - t0
    return {"records": n, "records_per_s": round(n / secs), "seconds": round(secs, 3),
            "client_cpu_s": round(time.process_time() - cpu0, 3)}


async def _read_all(js, subject: str, expected: int) -> dict:
    """One ordered push consumer (the client's flow-controlled, no-ack reader) over the stream."""
    from nats.js.api import DeliverPolicy
    n = 0
    done = asyncio.Event()

    async def on_msg(msg) -> None:
        nonlocal n
        n += 1
        if n >= expected:
            done.set()

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL, cb=on_msg)
    try:
        await asyncio.wait_for(done.wait(), timeout=max(30.0, expected / 2000))
    except asyncio.TimeoutError:
        pass  # reported as a short count
    finally:
        secs = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return {"records": n, "records_per_s": round(n / secs) if secs > 0 else None, "seconds": round(secs, 3),
            "client_cpu_s": round(cpu, 3), "complete": n >= expected,
            "consumer": "ordered push consumer (js.subscribe ordered_consumer=True, deliver all, no acks, "
                        "message callback)"}


async def _measure(name: str, urls: list[str], replicas: int, recs: list[tuple[str, bytes]], batch: int,
                   latency_fraction: float, latency_duration_s: float, depth: int | None) -> dict:
    """All phases on one set-up; `depth` None = choose the windows in flight by probing first."""
    import nats
    tag = f"nats {name}"
    # Partition key carried as the last subject token (bench.<key>): free, unlike a header.
    msgs = [(f"bench.{key}", payload) for key, payload in recs]
    windows = batches(msgs, batch)
    out: dict = {}
    nc = await nats.connect(servers=urls, dont_randomize=True, connect_timeout=5, max_reconnect_attempts=2)
    try:
        js = nc.jetstream(publish_async_max_pending=max(4000, 4 * batch * max(WINDOW_DEPTHS)))
        progress(f"{tag}: creating stream BENCH (file, R{replicas})")
        t0 = time.perf_counter()
        info = await _add_stream(js, "BENCH", ["bench.>"], replicas, CLUSTER_READY_DEADLINE_S)
        out["stream_ready_s"] = round(time.perf_counter() - t0, 3)
        await _add_stream(js, "LAT", ["lat.>"], replicas, CLUSTER_READY_DEADLINE_S)
        out["stream_leader"] = info.cluster.leader if info.cluster else None

        if depth is None:
            probe = windows[:max(1, len(windows) // PROBE_DIVISOR)]
            probes = {}
            for d in WINDOW_DEPTHS:
                progress(f"{tag}: probe ingest {sum(map(len, probe))} records, windows of {batch}, {d} in flight")
                probes[d] = await _ingest(js, probe, d)
                await js.purge_stream("BENCH")
            depth = max(probes, key=lambda d: probes[d]["records_per_s"])
            out["ingest_probes"] = {f"windows_in_flight_{d}": p for d, p in probes.items()}
        progress(f"{tag}: ingest {len(msgs)} records, windows of {batch} publish_async, {depth} in flight")
        full = await _ingest(js, windows, depth)
        state = (await js.stream_info("BENCH")).state
        full["stream_messages"] = state.messages
        out["ingest_records_per_s"] = full["records_per_s"]
        out["ingest_windows_in_flight"] = depth
        out["ingest_full_run"] = full

        progress(f"{tag}: read {state.messages} records back with one ordered consumer")
        read = await _read_all(js, "bench.>", state.messages)
        out["read_records_per_s"] = read["records_per_s"]
        out["read"] = read

        lat_windows = [[(f"lat.{s[len('bench.'):]}", p) for s, p in w] for w in windows[:64]]
        counter = 0

        async def send_window() -> None:
            nonlocal counter
            w = lat_windows[counter % len(lat_windows)]
            counter += 1
            await asyncio.gather(*(await _publish_window(js, w)))

        rate = latency_fraction * full["records_per_s"] / batch
        progress(f"{tag}: open-loop batch ack latency, {rate:.1f} windows/s of {batch} for {latency_duration_s} s")
        lat = await open_loop(send_window, rate, latency_duration_s)
        lat["fraction_of_max"] = latency_fraction
        lat["records_per_call"] = batch
        out["batch_ack_latency"] = lat

        one_subject, one_payload = lat_windows[0][0]

        async def send_one() -> None:
            await js.publish(one_subject, one_payload)

        progress(f"{tag}: open-loop sync publish latency, {SYNC_PUBLISH_RATE:.0f}/s for {latency_duration_s} s")
        out["sync_publish_latency"] = await open_loop(send_one, SYNC_PUBLISH_RATE, latency_duration_s)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)
    return out


async def run(workdir: str, records: int = 200_000, size: int = 100, batch: int = 500,
              latency_fraction: float = 0.5, latency_duration_s: float = 5.0) -> dict:
    reason = available()
    if reason:
        return {"skipped": reason}
    binary = _binary()
    version = _run_text([binary, "--version"])
    base = tempfile.mkdtemp(prefix="nats-js-", dir=workdir)
    recs = make_records(records, size)
    result: dict = {"records": records, "size": size, "batch": batch}
    try:
        sync_probe = _sync_option_probe(binary, base)
        common_config = {
            "server": version,
            "client": f"nats-py {_pkg_version('nats-py')}, js.publish_async per message, acks gathered per window",
            "storage": "file",
            "subject": "bench.<partition key> (key carried in the subject, no headers)",
            "sync": _sync_note(sync_probe),
            "sync_interval_probe": sync_probe,
        }
        r1_dir, r3_dir = os.path.join(base, "r1"), os.path.join(base, "r3")
        os.makedirs(r1_dir)
        os.makedirs(r3_dir)
        with contextlib.ExitStack() as r3_stack:
            # The cluster is started first so that its meta-leader election (seconds) overlaps the
            # r1 run; its three servers sit idle meanwhile.
            r3_urls, r3_cfg = _start_r3(r3_stack, binary, r3_dir)
            with contextlib.ExitStack() as r1_stack:
                r1_urls, r1_cfg = _start_r1(r1_stack, binary, r1_dir)
                r1 = await _measure("r1", r1_urls, 1, recs, batch, latency_fraction, latency_duration_s, None)
                progress("nats r1: stopping server")
            r1["config"] = {**common_config, **r1_cfg, "replicas": 1, "client_connects_to": r1_urls[0],
                            "windows_in_flight": f"chosen from {list(WINDOW_DEPTHS)} by ingest_probes "
                                                 f"(1/{PROBE_DIVISOR} of the batches each)"}
            result["r1"] = r1
            shutil.rmtree(r1_dir, ignore_errors=True)
            r3 = await _measure("r3", r3_urls, 3, recs, batch, latency_fraction, latency_duration_s,
                                r1["ingest_windows_in_flight"])
            progress("nats r3: stopping servers")
        r3["config"] = {**common_config, **r3_cfg, "replicas": 3, "client_connects_to": r3_urls[0],
                        "windows_in_flight": "reused from r1's probes",
                        "cluster_start": "3 nodes started before the r1 run (idle during it) so the meta-leader "
                                         "election overlaps it; stream_ready_s is what was left to wait"}
        result["r3"] = r3
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return result


def _pkg_version(name: str) -> str | None:
    import importlib.metadata
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _sync_note(probe: dict) -> str:
    if probe["accepted"]:
        return ("this nats-server accepts jetstream.sync_interval; it was left at its default, which the NATS "
                "docs give as an fsync every 2 min (not per message); 'always' would fsync every write")
    return ("no per-message fsync: `nats-server --help` of this 2.9 server has no sync option and `nats-server "
            "-t` rejects jetstream.sync_interval as an unknown field (later servers document it: default 2 min, "
            "'always' = fsync every write). Checked once with strace on this 2.9.10 binary, outside the bench: "
            "20 200 R1 publishes made ~20 200 pwrite64 and 0 fsync/fdatasync/sync_file_range/msync calls, and "
            "on the R3 cluster ~76 000 pwrite64 (stream + raft log, 3 nodes) and no sync calls either. So an "
            "ack means written to the page cache (R1) / stored by a quorum of replicas' page caches (R3)")


def main() -> None:
    peer_main(run, __doc__.splitlines()[0], "bench-nats-")


if __name__ == "__main__":
    main()
