"""A real ZooKeeper for tests: a standalone server from the Debian package.

`ZkServer` runs `org.apache.zookeeper.server.ZooKeeperServerMain` from
/usr/share/java/zookeeper.jar in its own process group, with its config, data and log
in a directory of its own, listening on 127.0.0.1 only (no admin server on 0.0.0.0),
with a 200 ms tick so sessions can be as short as METASTORE_SESSION_TTL_S, and with
`jute.maxbuffer` large enough for METASTORE_VALUE_BYTES_MAX values. start() returns
once the server answers `srvr` as a serving standalone server (polled against a
deadline); stop() ends the process group and waits for it; every server still running
when the interpreter exits is stopped too (atexit), and a server is stopped on a
`start()` that fails. Each running server is also recorded (its PID, its owner's PID)
in a registry directory under the temp dir, so the next start() ends servers orphaned
by a test run that was killed (SIGKILL leaves no chance for atexit). A stopped server can be started again on the same data dir and
port (a restart). pause()/resume() SIGSTOP/SIGCONT it.

`expire_session(hosts, session_id, password)` forces a real session expiry the standard
way: a second client attaches to the session (same id and password) and closes it; the
server then deletes the session's ephemerals, and the original client finds its session
expired on its next contact with the server.

`zk_available()` tells whether java and the jar are installed; tests skip without them.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from sms.limits import ZK_JUTE_MAXBUFFER_BYTES
from sms.limits import METASTORE_SESSION_TTL_S

ZK_JAR = Path("/usr/share/java/zookeeper.jar")      # its manifest names its other jars
SLF4J_BINDING_JAR = Path("/usr/share/java/slf4j-simple.jar")   # logs to stderr
SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"

TICK_MS = 200
MIN_SESSION_TIMEOUT_MS = 2 * TICK_MS
MAX_SESSION_TIMEOUT_MS = max(60_000, int(METASTORE_SESSION_TTL_S * 1000) * 4)
START_DEADLINE_S = 30.0          # JVM start to serving, on a loaded CI machine
STOP_DEADLINE_S = 10.0           # SIGTERM to exit; SIGKILL after
PROBE_TIMEOUT_S = 1.0            # one `srvr` probe
POLL_INTERVAL_S = 0.05
PORT_ATTEMPTS = 5                # a picked free port can be taken before java binds it
EXPIRE_CONNECT_TIMEOUT_S = 10.0
JVM_OPTIONS = ("-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dzookeeper.jmx.log4j.disable=true")

REGISTRY_DIR = Path(tempfile.gettempdir()) / "sms-zkserver"   # <pid>.json per server

_running: set[ZkServer] = set()
_running_lock = threading.Lock()


def zk_available() -> bool:
    """Whether a ZooKeeper server can be started here (java and the Debian jar)."""
    return ZK_JAR.is_file() and shutil.which("java") is not None


def skip_reason() -> str:
    return (f"ZooKeeper is not installed (need java on PATH and {ZK_JAR}:"
            " apt-get install zookeeper)")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ZkServer:
    """One standalone ZooKeeper server on 127.0.0.1. `directory`: where its config,
    data and log go (a fresh temp dir if None; removed at stop() only if created
    here). `port`: its client port (a free one if None)."""

    def __init__(self, directory: str | os.PathLike | None = None,
                 port: int | None = None) -> None:
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="zkserver-"))
        self.port = port
        self._fixed_port = port is not None
        self.proc: subprocess.Popen | None = None
        self._log = None

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"ZkServer(port={self.port}, dir={str(self.directory)!r}, pid={pid})"

    def __enter__(self) -> ZkServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.cleanup()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def hosts(self) -> str:
        """host:port, as kazoo takes it."""
        return f"127.0.0.1:{self.port}"

    def url(self, prefix: str = "") -> str:
        """The store URL: zk://127.0.0.1:port/prefix."""
        if prefix and not prefix.startswith("/"):
            raise ValueError(f"prefix {prefix!r}: expected an absolute path")
        return f"zk://{self.hosts}{prefix}"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # lifecycle

    def start(self) -> ZkServer:
        """Starts the server (on the same data dir and port as before, if it ran) and
        returns once it serves clients."""
        if self.proc is not None:
            raise RuntimeError(f"{self!r} is already running")
        for attempt in range(1 if self._fixed_port else PORT_ATTEMPTS):
            if not self._fixed_port and (attempt > 0 or self.port is None):
                self.port = free_port()
            self._launch()
            try:
                self._wait_serving()
                return self
            except _ExitedEarly:
                self._reap()
                if self._fixed_port or "Address already in use" not in self.log_tail(200):
                    raise RuntimeError(f"ZooKeeper exited at start:\n{self.log_tail()}") \
                        from None
            except BaseException:
                self.stop()
                raise
        raise RuntimeError(f"ZooKeeper found no free port in {PORT_ATTEMPTS} attempts")

    def stop(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL at the deadline) and waits for its
        process group. Idempotent. The data dir is kept for a restart."""
        proc = self.proc
        if proc is None:
            return
        try:
            _signal_group(proc, signal.SIGCONT)            # a paused JVM cannot exit
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(STOP_DEADLINE_S)
            _signal_group(proc, signal.SIGKILL)            # anything left in the group
        finally:
            self._reap()

    def cleanup(self) -> None:
        """stop(), and remove the directory if this object created it."""
        self.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def restart(self) -> ZkServer:
        """Stop, then start on the same data dir and port."""
        self.stop()
        self._fixed_port = True
        return self.start()

    def pause(self) -> None:
        """SIGSTOP the server: it stops answering, connections stay open."""
        self._running_proc()
        _signal_group(self.proc, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        self._running_proc()
        _signal_group(self.proc, signal.SIGCONT)

    # internals

    def _running_proc(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self!r} is not running")
        return self.proc

    def _launch(self) -> None:
        data_dir = self.directory / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text("\n".join([
            f"tickTime={TICK_MS}",
            f"dataDir={data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            f"minSessionTimeout={MIN_SESSION_TIMEOUT_MS}",
            f"maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}",
            "maxClientCnxns=0",
            "forceSync=no",                 # tests: no fsync per write
            "4lw.commands.whitelist=srvr,ruok",
            "",
        ]))
        classpath = os.pathsep.join(str(jar) for jar in (ZK_JAR, SLF4J_BINDING_JAR)
                                    if jar.is_file())
        command = ["java", *JVM_OPTIONS, f"-Djute.maxbuffer={ZK_JUTE_MAXBUFFER_BYTES}",
                   "-cp", classpath, SERVER_MAIN, str(config)]
        self._log = open(self.log_path, "ab")
        self._log.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
        self._log.flush()
        reap_orphans()
        self.proc = subprocess.Popen(command, cwd=self.directory, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        with _running_lock:
            _running.add(self)
        _register(self.proc.pid, config)

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise _ExitedEarly()
            if _probe(self.port) == "standalone":
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"ZooKeeper on port {self.port} not serving after"
                                   f" {START_DEADLINE_S} s:\n{self.log_tail()}")
            time.sleep(POLL_INTERVAL_S)

    def _reap(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        if proc is not None:
            (REGISTRY_DIR / f"{proc.pid}.json").unlink(missing_ok=True)
        if self._log is not None:
            self._log.close()
            self._log = None
        with _running_lock:
            _running.discard(self)


class _ExitedEarly(Exception):
    pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signals the process group the server leads (start_new_session: pgid == pid)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _register(pid: int, config: Path) -> None:
    REGISTRY_DIR.mkdir(exist_ok=True)
    record = {"pid": pid, "owner": os.getpid(), "config": str(config)}
    (REGISTRY_DIR / f"{pid}.json").write_text(json.dumps(record))


def reap_orphans() -> None:
    """Ends the servers recorded by processes that are gone (a killed test run). A
    recorded PID is signalled only if it still runs ZooKeeperServerMain on the
    recorded config (PIDs get reused)."""
    if not REGISTRY_DIR.is_dir():
        return
    for entry in REGISTRY_DIR.glob("*.json"):
        try:
            record = json.loads(entry.read_text())
            pid, owner, config = int(record["pid"]), int(record["owner"]), record["config"]
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        if _alive(owner):
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []
        if SERVER_MAIN.encode() in cmdline and config.encode() in cmdline:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    pass
        entry.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _probe(port: int, host: str = "127.0.0.1") -> str | None:
    """The server mode from `srvr` ("standalone", "leader", "follower", ...), or None
    if not serving yet."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
            sock.sendall(b"srvr")
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return None
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.partition(":")[2].strip()
    return None


def expire_session(hosts: str, session_id: int, password: bytes,
                   timeout_s: float = EXPIRE_CONNECT_TIMEOUT_S) -> None:
    """Ends the ZooKeeper session `session_id` as if it had expired: a second client
    attaches to it with its password and closes it. Its ephemerals are deleted before
    this returns; its owner finds the session expired when it next talks to the server.
    Blocking (run it in a thread from async code)."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts, client_id=(session_id, password),
                         timeout=METASTORE_SESSION_TTL_S)
    client.start(timeout=timeout_s)
    try:
        if client.client_id is None or client.client_id[0] != session_id:
            raise RuntimeError(f"attached to session {client.client_id!r}, not"
                               f" {session_id:#x}: it had already ended")
    finally:
        client.stop()
        client.close()


@atexit.register
def _stop_all() -> None:
    with _running_lock:
        servers = list(_running)
    for server in servers:
        try:
            server.stop()
        except Exception:
            pass
