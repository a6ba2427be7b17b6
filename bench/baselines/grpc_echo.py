"""The transport limit: a loopback gRPC echo of the packed batches SMS moves.

The server is a separate process (`python -m bench.baselines.grpc_echo --serve --port P`,
started and stopped here through common.ServerProcess), grpc.aio with a generic handler:
bytes in, bytes out, no .proto. Service `smsbench.Echo`, four methods:

* Echo (unary) and EchoStream (bidirectional): reply with the same bytes;
* Ack (unary) and AckStream (bidirectional): reply with 8 bytes (the request's length),
  as SMS replies to a put with a small ack.

The client (grpc.aio, this process) sends the sealed batches of `batch` records of `size`
bytes that wire.build_batch makes (the same bytes a storage node stores and replicates),
cycling through them, each mode for about `duration_s`:

* unary with 1 and with 16 calls in flight (calls/s, records/s, call latency);
* the stream with a window of 16 messages in flight (messages/s, records/s).

Channel and server options are SMS's own (sms.rpc.CHANNEL_OPTIONS / kernel.rpc.SERVER_OPTIONS:
32 MiB message limits, keepalive settings, no retries, local subchannel pool).

Prints one JSON document on stdout, progress on stderr. Never a test.

    .venv/bin/python -m bench.baselines.grpc_echo [--size 100] [--batch 500] [--duration-s 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import struct
import sys
import tempfile
import shutil
import time

import grpc

from bench import common
from bench.baselines.raw_lmdb import packed_batches
from kernel import rpc as server_rpc
from sms import rpc

SERVICE = "smsbench.Echo"
_ACK = struct.Struct("<Q")
WARMUP_S = 0.3


# --- server (separate process) ---------------------------------------------------------

async def _echo(request: bytes, context) -> bytes:
    return request


async def _ack(request: bytes, context) -> bytes:
    return _ACK.pack(len(request))


async def _echo_stream(request_iterator, context):
    async for request in request_iterator:
        yield request


async def _ack_stream(request_iterator, context):
    async for request in request_iterator:
        yield _ACK.pack(len(request))


async def serve(port: int) -> None:
    server = grpc.aio.server(options=server_rpc.SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Ack": grpc.unary_unary_rpc_method_handler(_ack),
        "EchoStream": grpc.stream_stream_rpc_method_handler(_echo_stream),
        "AckStream": grpc.stream_stream_rpc_method_handler(_ack_stream),
    }),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"echo server on 127.0.0.1:{port}", flush=True)
    await stop.wait()
    await server.stop(grace=0.5)


# --- client (bench process) ------------------------------------------------------------

async def _unary(channel: grpc.aio.Channel, method: str, payloads: list[bytes], per_batch: int,
                 in_flight: int, duration_s: float, expect_echo: bool) -> dict:
    call = channel.unary_unary(f"/{SERVICE}/{method}")
    source = itertools.cycle(payloads)
    latencies: list[float] = []
    calls = 0
    sent_bytes = 0

    async def worker(deadline: float, record: bool) -> None:
        nonlocal calls, sent_bytes
        while time.perf_counter() < deadline:
            payload = next(source)
            t = time.perf_counter()
            reply = await call(payload)
            if record:
                latencies.append(time.perf_counter() - t)
                calls += 1
                sent_bytes += len(payload)
            if expect_echo:
                assert len(reply) == len(payload)
            else:
                assert len(reply) == _ACK.size

    await asyncio.gather(*(worker(time.perf_counter() + WARMUP_S, False) for _ in range(in_flight)))
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(t0 + duration_s, True) for _ in range(in_flight)))
    elapsed = time.perf_counter() - t0
    return {"in_flight": in_flight, "seconds": round(elapsed, 2), "calls": calls,
            "calls_per_s": round(calls / elapsed, 1), "records_per_s": round(calls * per_batch / elapsed),
            "request_mb_per_s": round(sent_bytes / elapsed / 1e6, 1),
            "latency": common.percentiles_ms(latencies)}


async def _stream(channel: grpc.aio.Channel, method: str, payloads: list[bytes], per_batch: int,
                  window: int, duration_s: float, expect_echo: bool) -> dict:
    source = itertools.cycle(payloads)

    async def one_run(seconds: float) -> tuple[int, int, float]:
        call = channel.stream_stream(f"/{SERVICE}/{method}")()
        slots = asyncio.Semaphore(window)
        sent = 0
        sent_bytes = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds

        async def writer() -> None:
            nonlocal sent, sent_bytes
            while time.perf_counter() < deadline:
                await slots.acquire()
                payload = next(source)
                await call.write(payload)
                sent += 1
                sent_bytes += len(payload)
            await call.done_writing()

        async def reader() -> int:
            received = 0
            while True:
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    return received
                if not expect_echo:
                    assert len(reply) == _ACK.size
                received += 1
                slots.release()

        w = asyncio.create_task(writer())
        try:
            received = await reader()
            await w
        except BaseException:
            w.cancel()
            call.cancel()
            raise
        elapsed = time.perf_counter() - t0
        assert received == sent, (received, sent)
        return received, sent_bytes, elapsed

    await one_run(WARMUP_S)
    messages, sent_bytes, elapsed = await one_run(duration_s)
    return {"window": window, "seconds": round(elapsed, 2), "messages": messages,
            "messages_per_s": round(messages / elapsed, 1), "records_per_s": round(messages * per_batch / elapsed),
            "request_mb_per_s": round(sent_bytes / elapsed / 1e6, 1)}


async def run(workdir: str, records: int = 500_000, size: int = 100, batch: int = 500,
              duration_s: float = 4.0) -> dict:
    # a pool of batches to cycle through; at least 64 distinct ones, no more than needed
    pool_records = max(batch * 64, min(records, batch * 1000))
    common.progress(f"grpc_echo: packing {pool_records} records of {size} B in batches of {batch}")
    grouped, sealed = packed_batches(pool_records, size, batch)
    sealed = [s for s, g in zip(sealed, grouped) if len(g) == batch]   # full batches only
    port = common.free_port()
    argv = [sys.executable, "-m", "bench.baselines.grpc_echo", "--serve", "--port", str(port)]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result: dict = {"size": size, "batch": batch, "message_bytes_avg": round(sum(map(len, sealed)) / len(sealed), 1),
                    "duration_s_per_mode": duration_s,
                    "channel_options": "sms.rpc.CHANNEL_OPTIONS (client), kernel.rpc.SERVER_OPTIONS (server)",
                    "server": "separate process, grpc.aio generic handlers"}
    with common.ServerProcess(argv, os.path.join(workdir, "echo-server.log"), cwd=root) as server:
        try:
            common.wait_port(port)
        except TimeoutError:
            with contextlib.suppress(OSError), open(server.log_path) as f:
                sys.stderr.write(f.read())
            raise
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=rpc.CHANNEL_OPTIONS) as channel:
            await asyncio.wait_for(channel.channel_ready(), 15)
            modes: dict[str, dict] = {}
            for reply in ("echo", "ack"):
                unary_method = "Echo" if reply == "echo" else "Ack"
                stream_method = "EchoStream" if reply == "echo" else "AckStream"
                for in_flight in (1, 16):
                    name = f"unary_{reply}_inflight_{in_flight}"
                    common.progress(f"grpc_echo: {name} for {duration_s} s")
                    modes[name] = await _unary(channel, unary_method, sealed, batch, in_flight, duration_s,
                                               reply == "echo")
                    common.progress(f"grpc_echo: {name}: {modes[name]['records_per_s']} records/s")
                name = f"stream_{reply}_window_16"
                common.progress(f"grpc_echo: {name} for {duration_s} s")
                modes[name] = await _stream(channel, stream_method, sealed, batch, 16, duration_s, reply == "echo")
                common.progress(f"grpc_echo: {name}: {modes[name]['records_per_s']} records/s")
    result["modes"] = modes
    best = max(modes, key=lambda m: modes[m]["records_per_s"])
    result["best_records_per_s"] = modes[best]["records_per_s"]
    result["best_mode"] = best
    return result


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--serve", action="store_true", help="run the echo server (used by the bench itself)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--records", type=int, default=500_000, help="upper bound on the pool of distinct batches")
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--duration-s", type=float, default=4.0)
    args = p.parse_args()
    if args.serve:
        if not args.port:
            p.error("--serve needs --port")
        asyncio.run(serve(args.port))
        return
    # SIGTERM stops the bench like Ctrl-C does, so the echo server is still stopped
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    workdir = tempfile.mkdtemp(prefix="sms-bench-grpc-echo-")
    try:
        out = {"machine": common.machine(),
               "grpc_echo": asyncio.run(run(workdir, args.records, args.size, args.batch, args.duration_s))}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
