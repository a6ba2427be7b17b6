"""Test hosts made of Linux network namespaces, and network faults between them.

A `Testbed` is a set of named hosts on one private /24: each host is a network namespace
with one veth into a Linux bridge in the root namespace. The bridge has the subnet's
.1 address, so code in the root namespace (the test process, its clients) reaches every
host, and every host reaches it:

    root namespace  10.231.X.1  (bridge smsnf<tag>)
      |-- veth nf<tag>h0 ==== eth0 10.231.X.10   namespace smsnf-<tag>-<host 0>
      |-- veth nf<tag>h1 ==== eth0 10.231.X.11   namespace smsnf-<tag>-<host 1>
      ...

X (the testbed's /24 inside 10.231.0.0/16) is the lowest one no live testbed holds, and
<tag> is four hex digits, so testbeds of parallel runs do not collide. Each testbed
records itself (owner PID, namespaces, bridge) in REGISTRY_DIR before it creates
anything; `Testbed.start()` first removes what testbeds of dead owners left behind (a
run killed with SIGKILL: its namespaces' processes are killed by PID, the namespaces
and the bridge deleted), and also namespaces and bridges with our prefix that no
registry entry accounts for. `close()` (also on a failed start, from `with`, and at
interpreter exit) kills what still runs in the hosts, then deletes everything.

Faults are iptables rules inside the hosts' namespaces (never in the root namespace,
which other software on the machine shares), in a chain of our own (SMSNF_IN, SMSNF_OUT,
jumped to from INPUT and OUTPUT), so healing a fault deletes exactly its rules:

- `cut(a, b)`: drop every packet between a and b, both ways; `cut(a, b, "a->b")`: only
  those from a to b (an asymmetric partition). `b` may be ROOT (the root namespace: the
  test process and its clients), in which case rules go in a's namespace only.
- `loss(a, b, p)`: drop each packet between a and b with probability p, each way
  (`-m statistic --mode random --probability p`).
- `redirect(a, (ip, port), (ip2, port2))`: DNAT a's new TCP connections to ip:port
  towards ip2:port2 (to route one link through a proxy: tests/netfault/proxy.py).

Each returns a `Fault`, a context manager whose `heal()` deletes its rules; `heal_all()`
flushes every host's chains.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import os
import itertools
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "smsnf"                        # namespaces smsnf-<tag>-<host>, bridge smsnf<tag>
VETH_PREFIX = "nf"                      # root-side veths nf<tag>h<i>
SUPERNET = ipaddress.ip_network("10.231.0.0/16")   # one /24 per testbed
HOST_OFFSET = 10                        # host i is .(10 + i)
REGISTRY_DIR = Path(tempfile.gettempdir()) / "sms-netfault"
CHAIN_IN, CHAIN_OUT = "SMSNF_IN", "SMSNF_OUT"
COMMAND_TIMEOUT_S = 20.0
KILL_WAIT_S = 5.0
ROOT = "root"                           # the root namespace as a party of a fault

_live: set[Testbed] = set()
_live_lock = threading.Lock()
_fault_ids = itertools.count(1)
_COUNTERS = re.compile(r" -c (\d+) (\d+)")


class NetfaultUnavailable(RuntimeError):
    """Network namespaces or iptables cannot be used here (not root, missing tools)."""


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network-fault trials need root (network namespaces, veths, iptables)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"network-fault trials need `{tool}` (apt-get install iproute2 iptables)"
    probe = f"{PREFIX}-probe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except (subprocess.CalledProcessError, OSError) as e:
        return f"`ip netns add` fails here: {e}"
    try:
        _run(["ip", "netns", "exec", probe, "iptables", "-w", "-S"])
        _run(["ip", "netns", "exec", probe, "iptables", "-w", "-t", "nat", "-S"])
    except (subprocess.CalledProcessError, OSError) as e:
        return f"iptables does not work inside a network namespace here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise subprocess.CalledProcessError(-1, cmd, "", f"timed out after {COMMAND_TIMEOUT_S}s") from e
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr.strip())
    return done


@dataclass(frozen=True)
class Host:
    """One test host: a network namespace with one address on the testbed's subnet."""

    name: str
    ns: str
    ip: str
    index: int

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv run inside this host's namespace (`ip netns exec` execs it: same PID)."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
        return _run(self.command(argv), check)

    def iptables(self, *args: str, table: str = "filter", check: bool = True) -> subprocess.CompletedProcess:
        return self.run(["iptables", "-w", "-t", table, *args], check)

    def pids(self) -> list[int]:
        """PIDs of the processes in this namespace."""
        return _netns_pids(self.ns)

    def rules(self) -> str:
        """This host's filter and nat rules (for a post-mortem)."""
        return self.iptables("-S").stdout + self.iptables("-S", table="nat").stdout


@dataclass
class Fault:
    """Rules installed for one fault (each tagged with the comment `tag`); heal()
    deletes them (idempotent), packets() counts what they matched."""

    what: str
    rules: list[tuple[Host, str, tuple[str, ...]]] = field(default_factory=list)   # (host, table, rule)
    healed: bool = False
    tag: str = field(default_factory=lambda: f"{PREFIX}:{os.getpid()}:{next(_fault_ids)}")

    def packets(self) -> int:
        """Packets its rules matched so far (dropped, or redirected), over every host."""
        total = 0
        for host, table, chain in {(h, t, r[1]) for h, t, r in self.rules}:
            listing = host.iptables("-v", "-S", chain, table=table, check=False).stdout
            for line in listing.splitlines():
                found = _COUNTERS.search(line)
                if found and f'"{self.tag}"' in line:
                    total += int(found.group(1))
        return total

    def heal(self) -> None:
        if self.healed:
            return
        self.healed = True
        errors = []
        for host, table, rule in reversed(self.rules):
            done = host.iptables(*_delete_of(rule), table=table, check=False)
            if done.returncode != 0:
                errors.append(f"{host.name}: {' '.join(rule)}: {done.stderr.strip()}")
        if errors:
            raise RuntimeError(f"healing {self.what} failed: {errors}")

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()

    def __str__(self) -> str:
        return self.what


def _delete_of(rule: tuple[str, ...]) -> tuple[str, ...]:
    """The `-D` form of an `-A` rule."""
    assert rule[0] == "-A", rule
    return ("-D", *rule[1:])


class Testbed:
    """Hosts named `names` (module docstring). Use as a context manager, or start()/close()."""

    def __init__(self, names: Iterable[str]):
        self.names = list(names)
        if len(set(self.names)) != len(self.names) or ROOT in self.names:
            raise ValueError(f"host names {self.names}: expected distinct names, none {ROOT!r}")
        if len(self.names) > 200:
            raise ValueError("at most 200 hosts")
        self.tag = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge = ""
        self.root_ip = ""
        self.hosts: dict[str, Host] = {}
        self._faults: list[Fault] = []
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        return f"Testbed(tag={self.tag!r}, subnet={self.subnet}, hosts={list(self.hosts)})"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> Testbed:
        if self._started:
            raise RuntimeError(f"{self!r} started already")
        self._started = True
        reason = unavailable_reason()
        if reason:
            raise NetfaultUnavailable(reason)
        reap_leftovers()
        REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
        self._claim()
        with _live_lock:
            _live.add(self)
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def _claim(self) -> None:
        """Pick a tag and a free /24 and record them (atomically: O_EXCL on the subnet's file)."""
        for _ in range(50):
            taken = {r.get("subnet") for r in _registry_records()}
            free = [n for n in SUPERNET.subnets(new_prefix=24) if str(n) not in taken]
            if not free:
                raise RuntimeError(f"every /24 of {SUPERNET} is held by a live testbed")
            subnet = free[0]
            tag = secrets.token_hex(2)
            entry = REGISTRY_DIR / f"{subnet.network_address}.json"
            record = {"owner": os.getpid(), "tag": tag, "subnet": str(subnet),
                      "namespaces": [f"{PREFIX}-{tag}-{n}" for n in self.names], "bridge": f"{PREFIX}{tag}"}
            try:
                fd = os.open(entry, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self.tag, self.subnet, self.bridge = tag, subnet, record["bridge"]
            self._entry = entry
            return
        raise RuntimeError("could not claim a subnet for a testbed")

    def _create(self) -> None:
        hosts = list(self.subnet.hosts())
        self.root_ip = str(hosts[0])
        prefix_len = self.subnet.prefixlen
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.root_ip}/{prefix_len}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i, name in enumerate(self.names):
            host = Host(name, f"{PREFIX}-{self.tag}-{name}", str(hosts[HOST_OFFSET - 1 + i]), i)
            veth = f"{VETH_PREFIX}{self.tag}h{i}"
            _run(["ip", "netns", "add", host.ns])
            self.hosts[name] = host
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns])
            _run(["ip", "link", "set", veth, "master", self.bridge])
            _run(["ip", "link", "set", veth, "up"])
            host.run(["ip", "link", "set", "lo", "up"])
            host.run(["ip", "addr", "add", f"{host.ip}/{prefix_len}", "dev", "eth0"])
            host.run(["ip", "link", "set", "eth0", "up"])
            for chain, hook in ((CHAIN_IN, "INPUT"), (CHAIN_OUT, "OUTPUT")):
                host.iptables("-N", chain)
                host.iptables("-A", hook, "-j", chain)
            host.iptables("-N", CHAIN_OUT, table="nat")
            host.iptables("-A", "OUTPUT", "-j", CHAIN_OUT, table="nat")

    def close(self) -> None:
        """Kill what still runs in the hosts, delete namespaces, bridge and registry
        entry. Idempotent; best effort (errors are logged)."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        try:
            _destroy([f"{PREFIX}-{self.tag}-{n}" for n in self.names], self.bridge)
        finally:
            entry = getattr(self, "_entry", None)
            if entry is not None:
                entry.unlink(missing_ok=True)
            with _live_lock:
                _live.discard(self)

    # --- faults --------------------------------------------------------------------------
    def _parties(self, a: str, b: str) -> tuple[Host | None, str, Host | None, str]:
        ha = None if a == ROOT else self.hosts[a]
        hb = None if b == ROOT else self.hosts[b]
        if ha is None and hb is None:
            raise ValueError("a fault needs at least one test host")
        return ha, (self.root_ip if ha is None else ha.ip), hb, (self.root_ip if hb is None else hb.ip)

    def _install(self, what: str, rules: list[tuple[Host, str, tuple[str, ...]]]) -> Fault:
        fault = Fault(what)
        try:
            for host, table, rule in rules:
                rule = (*rule[:2], "-m", "comment", "--comment", fault.tag, *rule[2:])
                host.iptables(*rule, table=table)
                fault.rules.append((host, table, rule))
        except BaseException:
            fault.heal()
            raise
        self._faults.append(fault)
        log.info("fault on: %s", what)
        return fault

    def cut(self, a: str, b: str, direction: str = "both") -> Fault:
        """Drop packets between hosts a and b (either may be ROOT): direction "both",
        "a->b" (only a's packets to b) or "b->a"."""
        if direction not in ("both", "a->b", "b->a"):
            raise ValueError(f"direction {direction!r}: expected both, a->b or b->a")
        ha, ipa, hb, ipb = self._parties(a, b)
        rules: list[tuple[Host, str, tuple[str, ...]]] = []

        def one_way(src: Host | None, src_ip: str, dst: Host | None, dst_ip: str) -> None:
            if src is not None:
                rules.append((src, "filter", ("-A", CHAIN_OUT, "-d", dst_ip, "-j", "DROP")))
            if dst is not None:
                rules.append((dst, "filter", ("-A", CHAIN_IN, "-s", src_ip, "-j", "DROP")))
        if direction in ("both", "a->b"):
            one_way(ha, ipa, hb, ipb)
        if direction in ("both", "b->a"):
            one_way(hb, ipb, ha, ipa)
        arrow = {"both": "<->", "a->b": "->", "b->a": "<-"}[direction]
        return self._install(f"cut {a} {arrow} {b}", rules)

    def cut_many(self, a: str, others: Iterable[str], direction: str = "both") -> list[Fault]:
        return [self.cut(a, b, direction) for b in others]

    def loss(self, a: str, b: str, probability: float) -> Fault:
        """Drop each packet between a and b with `probability`, in each direction (once:
        on the sender's side, or on the receiver's if the sender is ROOT)."""
        if not 0.0 < probability < 1.0:
            raise ValueError(f"probability {probability}: expected 0 < p < 1")
        ha, ipa, hb, ipb = self._parties(a, b)
        p = f"{probability:.4f}"
        rules: list[tuple[Host, str, tuple[str, ...]]] = []
        for src, dst, src_ip, dst_ip in ((ha, hb, ipa, ipb), (hb, ha, ipb, ipa)):
            match = ("-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP")
            if src is not None:
                rules.append((src, "filter", ("-A", CHAIN_OUT, "-d", dst_ip, *match)))
            else:
                rules.append((dst, "filter", ("-A", CHAIN_IN, "-s", src_ip, *match)))
        return self._install(f"loss {p} {a} <-> {b}", rules)

    def redirect(self, a: str, target: tuple[str, int], via: tuple[str, int]) -> Fault:
        """DNAT host a's new TCP connections to target (ip, port) to via (ip, port)."""
        host = self.hosts[a]
        rule = ("-A", CHAIN_OUT, "-p", "tcp", "-d", target[0], "--dport", str(target[1]),
                "-j", "DNAT", "--to-destination", f"{via[0]}:{via[1]}")
        return self._install(f"redirect {a}: {target[0]}:{target[1]} -> {via[0]}:{via[1]}", [(host, "nat", rule)])

    def heal_all(self) -> None:
        """Every fault of this testbed healed (its rules deleted), then every host's
        chains flushed for good measure."""
        for fault in self._faults:
            try:
                fault.heal()
            except RuntimeError:
                log.warning("healing %s failed", fault, exc_info=True)
        self._faults.clear()
        for host in self.hosts.values():
            for chain in (CHAIN_IN, CHAIN_OUT):
                host.iptables("-F", chain, check=False)
            host.iptables("-F", CHAIN_OUT, table="nat", check=False)

    def active_faults(self) -> list[Fault]:
        return [f for f in self._faults if not f.healed]


# --- leftovers ------------------------------------------------------------------------------
def _registry_records() -> list[dict]:
    """The live registry records (entries whose owner is dead are not live, but they
    are still returned here with "dead": True)."""
    out = []
    if not REGISTRY_DIR.is_dir():
        return out
    for entry in REGISTRY_DIR.glob("*.json"):
        try:
            record = json.loads(entry.read_text())
            record["owner"] = int(record["owner"])
        except (OSError, ValueError, KeyError, TypeError):
            record = {"owner": -1}
        record["entry"] = entry
        record["dead"] = not _alive(record["owner"])
        out.append(record)
    return out


def reap_leftovers() -> list[str]:
    """Remove what testbeds of dead owners left behind, and our namespaces and bridges
    that no live registry entry accounts for. Returns the names removed."""
    removed: list[str] = []
    records = _registry_records()
    live_ns, live_bridges = set(), set()
    for r in records:
        if r["dead"]:
            _destroy(r.get("namespaces", []), r.get("bridge"))
            removed += r.get("namespaces", []) + ([r["bridge"]] if r.get("bridge") else [])
            r["entry"].unlink(missing_ok=True)
        else:
            live_ns.update(r.get("namespaces", []))
            if r.get("bridge"):
                live_bridges.add(r["bridge"])
    stray_ns = [n for n in _list_netns() if n.startswith(PREFIX + "-") and n not in live_ns]
    stray_bridges = [b for b in _list_links() if b.startswith(PREFIX) and b not in live_bridges
                     and not b.startswith(f"{PREFIX}-")]
    # an orphan probe namespace of a live process is its own business
    stray_ns = [n for n in stray_ns if not (n.startswith(f"{PREFIX}-probe") and _alive(_int(n[len(PREFIX) + 6:])))]
    if stray_ns or stray_bridges:
        _destroy(stray_ns, None)
        for b in stray_bridges:
            _run(["ip", "link", "del", b], check=False)
        removed += stray_ns + stray_bridges
    if removed:
        log.warning("removed leftovers of earlier network-fault runs: %s", removed)
    return removed


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def _destroy(namespaces: Iterable[str], bridge: str | None) -> None:
    """Kill every process in the namespaces (by PID), delete them and the bridge."""
    namespaces = [n for n in namespaces if n in set(_list_netns())]
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for ns in namespaces:
            for pid in _netns_pids(ns):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_netns_pids(ns) for ns in namespaces) and time.monotonic() < deadline:
        time.sleep(0.05)
    for ns in namespaces:
        done = _run(["ip", "netns", "del", ns], check=False)
        if done.returncode != 0:
            log.warning("ip netns del %s: %s", ns, done.stderr.strip())
    if bridge and bridge in _list_links():
        _run(["ip", "link", "del", bridge], check=False)


def _netns_pids(ns: str) -> list[int]:
    done = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _list_netns() -> list[str]:
    done = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _list_links() -> list[str]:
    done = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in done.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@atexit.register
def _close_all() -> None:
    with _live_lock:
        beds = list(_live)
    for bed in beds:
        try:
            bed.close()
        except Exception:
            log.warning("closing %r at exit failed", bed, exc_info=True)
