"""A ZooKeeper ensemble of real servers, one per test host (tests/netfault/hosts.py).

Each server is Debian's ZooKeeper (`QuorumPeerMain`, the jar tests/zkserver.py uses,
with its JVM options, tick and session bounds) inside its host's network namespace,
listening on the host's address only: client port 2181, quorum port 2888, election
port 3888 (the hosts have addresses of their own, so the ports never collide). Each
has its own directory (zoo.cfg, data with myid, log). start() returns once every server
answers `srvr` as leader or follower; stop() ends every server (SIGTERM, SIGKILL at the
deadline). The timing suits the trials: tickTime 200 ms, syncLimit 10 ticks (a follower
cut off from the leader drops out after 2 s, under the 3 s session TTL), initLimit 50.

`url(prefix)` is the store URL zk://h1:2181,h2:2181,h3:2181/prefix that nodes take.
`modes()` tells each server's mode ("leader", "follower", None: not serving, e.g. a
server without quorum); `leader()` the host of the leader.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from sms.limits import ZK_JUTE_MAXBUFFER_BYTES
from tests.zkserver import (JVM_OPTIONS, MAX_SESSION_TIMEOUT_MS, MIN_SESSION_TIMEOUT_MS, POLL_INTERVAL_S,
                            SLF4J_BINDING_JAR, START_DEADLINE_S, STOP_DEADLINE_S, TICK_MS, ZK_JAR, _probe)

QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
CLIENT_PORT = 2181
QUORUM_PORT = 2888
ELECTION_PORT = 3888
SYNC_LIMIT_TICKS = 10
INIT_LIMIT_TICKS = 50
SERVING_MODES = ("leader", "follower")


class ZkEnsemble:
    """Servers on `hosts` (one each), their files under `directory`."""

    def __init__(self, hosts: list, directory: str | os.PathLike):
        if len(hosts) < 3 or len(hosts) % 2 == 0:
            raise ValueError(f"{len(hosts)} servers: expected an odd number, at least 3")
        self.hosts = list(hosts)
        self.directory = Path(directory)
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, object] = {}

    def __repr__(self) -> str:
        return f"ZkEnsemble({self.connect_string})"

    @property
    def connect_string(self) -> str:
        """host:port,... as kazoo takes it."""
        return ",".join(f"{h.ip}:{CLIENT_PORT}" for h in self.hosts)

    def url(self, prefix: str = "") -> str:
        if prefix and not prefix.startswith("/"):
            raise ValueError(f"prefix {prefix!r}: expected an absolute path")
        return f"zk://{self.connect_string}{prefix}"

    def __enter__(self) -> ZkEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, timeout_s: float = START_DEADLINE_S * 2) -> ZkEnsemble:
        try:
            for i, host in enumerate(self.hosts, 1):
                self._launch(i, host)
            self.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, myid: int, host) -> None:
        directory = self.directory / host.name
        data = directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{myid}\n")
        config = directory / "zoo.cfg"
        servers = [f"server.{i}={h.ip}:{QUORUM_PORT}:{ELECTION_PORT}" for i, h in enumerate(self.hosts, 1)]
        config.write_text("\n".join([
            f"tickTime={TICK_MS}",
            f"initLimit={INIT_LIMIT_TICKS}",
            f"syncLimit={SYNC_LIMIT_TICKS}",
            f"dataDir={data}",
            f"clientPort={CLIENT_PORT}",
            f"clientPortAddress={host.ip}",
            "admin.enableServer=false",
            f"minSessionTimeout={MIN_SESSION_TIMEOUT_MS}",
            f"maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}",
            "maxClientCnxns=0",
            "forceSync=no",
            "4lw.commands.whitelist=srvr,ruok",
            "cnxTimeout=1000",                    # election connects give up fast on a cut peer
            *servers,
            "",
        ]))
        classpath = os.pathsep.join(str(j) for j in (ZK_JAR, SLF4J_BINDING_JAR) if j.is_file())
        command = host.command(["java", *JVM_OPTIONS, f"-Djute.maxbuffer={ZK_JUTE_MAXBUFFER_BYTES}",
                                "-cp", classpath, QUORUM_MAIN, str(config)])
        log = open(directory / "zookeeper.log", "ab")
        log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        self._logs[host.name] = log
        self.procs[host.name] = subprocess.Popen(command, cwd=directory, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True)

    def wait_serving(self, timeout_s: float, hosts: list | None = None) -> dict[str, str | None]:
        """Poll until every server (of `hosts`) serves as leader or follower, and one of
        them leads; the modes of all."""
        deadline = time.monotonic() + timeout_s
        names = [h.name for h in (hosts or self.hosts)]
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"ZooKeeper on {name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            modes = self.modes()
            if all(modes[n] in SERVING_MODES for n in names) and any(modes[n] == "leader" for n in names):
                return modes
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper ensemble not serving after {timeout_s}s: {modes}\n"
                                   + "\n".join(f"{n}:\n{self.log_tail(n, 15)}" for n in names))
            time.sleep(POLL_INTERVAL_S)

    def modes(self) -> dict[str, str | None]:
        return {h.name: _probe(CLIENT_PORT, h.ip) for h in self.hosts}

    def leader(self):
        """The host whose server leads now (None if none does)."""
        for h in self.hosts:
            if _probe(CLIENT_PORT, h.ip) == "leader":
                return h
        return None

    def stop(self) -> None:
        procs, self.procs = self.procs, {}
        for proc in procs.values():
            _signal_group(proc, signal.SIGCONT)
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_DEADLINE_S
        for proc in procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        for log in self._logs.values():
            log.close()
        self._logs.clear()

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.directory / name / "zookeeper.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
