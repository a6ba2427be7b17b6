"""A TCP proxy with a configurable one-way delay, for network-fault trials (this kernel
has no `tc netem`).

The proxy is one asyncio process (`python -m tests.netfault.proxy`, usually inside a
test host's namespace) with any number of *routes*: a route listens on a port and
forwards every connection to one target host:port. Each direction of each route has
its own delay: every chunk read is stamped and written out `delay` seconds later
(pipelined, so the delay does not cut the bandwidth; chunks keep their order). A route
can also be stalled (nothing is forwarded until it is resumed; nothing is lost either)
or reset (its open connections are closed; new ones are accepted).

It is driven over a control port by JSON lines, one answer line per request:
  {"op": "add", "name": N, "target": "ip:port"}            -> {"port": listen port}
  {"op": "set", "name": N or "*", "up_ms": D, "down_ms": D, "stall": bool}   (any subset)
  {"op": "reset", "name": N or "*"}                         -> {"closed": connections}
  {"op": "stats"}                                          -> {"routes": {N: {...}}}
("up": from the connecting side to the target; "down": the answers.) Stats per route:
connections accepted and open, bytes each way, and bytes forwarded while a delay was set.

`ProxyProcess` starts one (in a `Host`, or here) and wraps the control calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
DELAYED_CHUNKS_MAX = 1_024           # chunks held back by a delayed route; more: the sender waits
CONNECT_TIMEOUT_S = 5.0
START_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


@dataclass
class Route:
    name: str
    target_host: str
    target_port: int
    up_s: float = 0.0
    down_s: float = 0.0
    stalled: bool = False
    server: asyncio.Server | None = None
    accepted: int = 0
    failed_connects: int = 0
    bytes: dict = field(default_factory=lambda: {"up": 0, "down": 0})
    delayed_bytes: dict = field(default_factory=lambda: {"up": 0, "down": 0})
    conns: set = field(default_factory=set)          # writers of open connections (both sides)
    resumed: asyncio.Event = field(default_factory=asyncio.Event)

    def delay(self, direction: str) -> float:
        return self.up_s if direction == "up" else self.down_s

    def stats(self) -> dict:
        return {"target": f"{self.target_host}:{self.target_port}", "up_ms": self.up_s * 1000,
                "down_ms": self.down_s * 1000, "stalled": self.stalled, "accepted": self.accepted,
                "open": len(self.conns) // 2, "failed_connects": self.failed_connects,
                "bytes": dict(self.bytes), "delayed_bytes": dict(self.delayed_bytes)}


class Proxy:
    def __init__(self, host: str):
        self.host = host
        self.routes: dict[str, Route] = {}

    async def add(self, name: str, target: str) -> int:
        if name in self.routes:
            raise ValueError(f"route {name!r} exists")
        thost, _, tport = target.rpartition(":")
        route = Route(name, thost, int(tport))
        route.resumed.set()
        route.server = await asyncio.start_server(lambda r, w: self._accept(route, r, w), self.host, 0)
        self.routes[name] = route
        return route.server.sockets[0].getsockname()[1]

    def _selected(self, name: str) -> list[Route]:
        if name == "*":
            return list(self.routes.values())
        if name not in self.routes:
            raise KeyError(f"no route {name!r}")
        return [self.routes[name]]

    def set(self, name: str, up_ms: float | None = None, down_ms: float | None = None,
            stall: bool | None = None) -> None:
        for route in self._selected(name):
            if up_ms is not None:
                route.up_s = max(0.0, up_ms / 1000)
            if down_ms is not None:
                route.down_s = max(0.0, down_ms / 1000)
            if stall is not None:
                route.stalled = stall
                if stall:
                    route.resumed.clear()
                else:
                    route.resumed.set()

    def reset(self, name: str) -> int:
        closed = 0
        for route in self._selected(name):
            for writer in list(route.conns):
                writer.transport.abort()
                closed += 1
            route.conns.clear()
        return closed // 2

    async def _accept(self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        route.accepted += 1
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                up_reader, up_writer = await asyncio.open_connection(route.target_host, route.target_port)
        except (OSError, TimeoutError):
            route.failed_connects += 1
            writer.transport.abort()
            return
        for w in (writer, up_writer):
            w.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        route.conns.update((writer, up_writer))
        try:
            await asyncio.gather(self._pump(route, "up", reader, up_writer),
                                 self._pump(route, "down", up_reader, writer), return_exceptions=True)
        finally:
            for w in (writer, up_writer):
                route.conns.discard(w)
                w.transport.abort()

    async def _pump(self, route: Route, direction: str, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue(DELAYED_CHUNKS_MAX)

        async def read() -> None:
            try:
                while True:
                    data = await reader.read(CHUNK_BYTES)
                    await queue.put((loop.time(), data))
                    if not data:
                        return
            except OSError:
                await queue.put((loop.time(), b""))

        reading = asyncio.create_task(read())
        try:
            while True:
                stamped, data = await queue.get()
                await route.resumed.wait()
                delay = route.delay(direction)
                wait = stamped + delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                route.bytes[direction] += len(data)
                if delay > 0:
                    route.delayed_bytes[direction] += len(data)
                await writer.drain()
        except OSError:
            return
        finally:
            reading.cancel()

    async def handle_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                try:
                    req = json.loads(line)
                    op = req.pop("op")
                    if op == "add":
                        answer = {"port": await self.add(req["name"], req["target"])}
                    elif op == "set":
                        self.set(req.pop("name"), **req)
                        answer = {}
                    elif op == "reset":
                        answer = {"closed": self.reset(req["name"])}
                    elif op == "stats":
                        answer = {"routes": {n: r.stats() for n, r in self.routes.items()}}
                    else:
                        raise ValueError(f"unknown op {op!r}")
                    answer["ok"] = True
                except Exception as e:                 # answered to the caller
                    answer = {"ok": False, "error": repr(e)}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()


async def _main(host: str, ready_file: str) -> None:
    proxy = Proxy(host)
    control = await asyncio.start_server(proxy.handle_control, host, 0)
    port = control.sockets[0].getsockname()[1]
    with open(ready_file + ".tmp", "w") as f:
        json.dump({"control": f"{host}:{port}", "pid": os.getpid()}, f)
    os.replace(ready_file + ".tmp", ready_file)
    parent = os.getppid()
    while os.getppid() == parent:            # end with the launcher
        await asyncio.sleep(0.5)


class ProxyProcess:
    """A proxy process (in `host`'s namespace if given) and its control connection."""

    def __init__(self, directory: str, host=None, listen_ip: str = "127.0.0.1"):
        self.directory = directory
        self.host = host
        self.ip = host.ip if host is not None else listen_ip
        self.proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._file = None

    def start(self) -> ProxyProcess:
        os.makedirs(self.directory, exist_ok=True)
        ready = os.path.join(self.directory, "proxy.json")
        if os.path.exists(ready):
            os.unlink(ready)
        cmd = [sys.executable, "-m", "tests.netfault.proxy", "--host", self.ip, "--ready-file", ready]
        if self.host is not None:
            cmd = self.host.command(cmd)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        with open(os.path.join(self.directory, "proxy.log"), "ab") as logfile:
            self.proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(ready):
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {self.proc.returncode}; see {self.directory}/proxy.log")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"proxy not ready after {START_TIMEOUT_S}s")
            time.sleep(0.02)
        with open(ready) as f:
            host, _, port = json.load(f)["control"].rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S)
        self._file = self._sock.makefile("rwb")
        return self

    def call(self, op: str, **args) -> dict:
        self._file.write(json.dumps({"op": op, **args}).encode() + b"\n")
        self._file.flush()
        answer = json.loads(self._file.readline())
        if not answer.pop("ok"):
            raise RuntimeError(f"proxy {op} {args}: {answer['error']}")
        return answer

    def add(self, name: str, target: str) -> tuple[str, int]:
        """A route to target; (ip, port) to connect to instead."""
        return self.ip, self.call("add", name=name, target=target)["port"]

    def set(self, name: str = "*", **args) -> None:
        self.call("set", name=name, **args)

    def stats(self) -> dict:
        return self.call("stats")["routes"]

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="delaying TCP proxy (tests/netfault)")
    parser.add_argument("--host", default="127.0.0.1", help="address of the control port and every route")
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_main(args.host, args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
