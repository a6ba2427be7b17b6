"""Network faults on test hosts made of network namespaces (tests/netfault/): the test
network itself (cuts, one-way cuts, packet loss, leftovers of a killed run, the delaying
proxy), then one trial per fault kind (tests/netfault/trials.py): a real cluster on its
hosts, a three-server ZooKeeper ensemble, de-duplicating producers and tailing
consumers, the history checker. The default run takes a slice of the kinds; the others
are marked slow (`pytest -m slow tests/netfault`). Everything skips with the reason
when it cannot run here: not root, no `ip netns`, no iptables, no ZooKeeper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import wait_until
from tests.fault.history import format_table
from tests.netfault import hosts as hostlib
from tests.netfault import trials
from tests.netfault.proxy import ProxyProcess

REASON = hostlib.unavailable_reason()
TRIAL_REASON = REASON or trials.skip_reason()
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(REASON is not None, reason=REASON or "")]

FAST_KINDS = ("node_node_cut", "head_isolated_from_zk", "zk_minority", "delay")
SLOW_KINDS = tuple(k for k in trials.KINDS if k not in FAST_KINDS)
CONNECT_TIMEOUT_S = 1.0
ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One thread per connection, each with a timeout: under packet loss a client's data and
# its FIN can both be dropped, and a server that served one connection at a time then sat
# in recv() on that half-open connection while the next test's client timed out (CI,
# 2026-12-05: test_packet_loss_drops_a_share_of_packets failed its check after heal).
ECHO_SERVER = textwrap.dedent("""
    import socket, sys, threading
    def serve(c):
        with c:
            c.settimeout(5.0)
            try:
                c.sendall(c.recv(64))
            except OSError:
                pass
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen()
    while True:
        c, _ = s.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
""")
CLIENT = textwrap.dedent("""
    import socket, sys, time
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
            t0 = time.monotonic()
            s.sendall(b"ping")
            answer = s.recv(64).decode()
            print(answer, time.monotonic() - t0)
    except OSError as e:
        print(type(e).__name__)
""")
PORT = 5055


def _connect(bed: hostlib.Testbed, src: str, dst: str) -> str:
    """'ping' if a TCP round trip from host src (or ROOT) to an echo server on dst works,
    else the error's name."""
    argv = [sys.executable, "-c", CLIENT, bed[dst].ip, str(PORT), str(CONNECT_TIMEOUT_S)]
    if src != hostlib.ROOT:
        argv = bed[src].command(argv)
    return _round_trip(argv)[0]


def _round_trip(argv: list[str]) -> tuple[str, float | None]:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.split()
    return (out[0], float(out[1])) if len(out) == 2 else ((out or [""])[0], None)


@pytest.fixture
def bed():
    with hostlib.Testbed(["a", "b", "c"]) as testbed:
        servers = [subprocess.Popen(testbed[h].command([sys.executable, "-c", ECHO_SERVER, testbed[h].ip, str(PORT)]))
                   for h in ("a", "b", "c")]
        try:
            for h in ("a", "b", "c"):
                wait_until(lambda: _connect(testbed, hostlib.ROOT, h) == "ping", 10.0, f"echo server on {h}")
            yield testbed
        finally:
            for p in servers:
                p.kill()
                p.wait()


def test_hosts_reach_each_other_and_the_root_namespace(bed):
    for src in ("a", "b", "c", hostlib.ROOT):
        for dst in ("a", "b", "c"):
            if src != dst:
                assert _connect(bed, src, dst) == "ping", (src, dst)


def test_cut_both_ways_and_heal(bed):
    with bed.cut("a", "b"):
        assert _connect(bed, "a", "b") == "TimeoutError"
        assert _connect(bed, "b", "a") == "TimeoutError"
        assert _connect(bed, "a", "c") == "ping"
        assert _connect(bed, hostlib.ROOT, "b") == "ping"
    assert _connect(bed, "a", "b") == "ping" and _connect(bed, "b", "a") == "ping"


def test_cut_one_way_drops_only_that_direction(bed):
    with bed.cut("a", "b", "a->b") as fault:
        assert "cut a -> b" in str(fault)
        assert _connect(bed, "a", "b") == "TimeoutError"      # a's SYN is dropped
        bed["a"].iptables("-Z", hostlib.CHAIN_OUT)
        # b's SYN reaches a (b -> a is not cut), a's SYN-ACK is dropped: no TCP either way,
        # and the counter of a's rule shows the answers it dropped
        assert _connect(bed, "b", "a") == "TimeoutError"
        assert _dropped(bed["a"], hostlib.CHAIN_OUT, bed["b"].ip) > 0
        assert _connect(bed, "a", "c") == "ping"
    assert _connect(bed, "a", "b") == "ping"


def _dropped(host: hostlib.Host, chain: str, ip: str) -> int:
    """Packets dropped by host's DROP rule(s) naming ip in chain."""
    listing = host.iptables("-L", chain, "-v", "-n", "-x").stdout
    return sum(int(row.split()[0]) for row in listing.splitlines() if "DROP" in row and ip in row)


def test_cut_from_the_root_namespace(bed):
    with bed.cut(hostlib.ROOT, "c"):
        assert _connect(bed, hostlib.ROOT, "c") == "TimeoutError"
        assert _connect(bed, "a", "c") == "ping"
    assert _connect(bed, hostlib.ROOT, "c") == "ping"


def test_packet_loss_drops_a_share_of_packets(bed):
    fault = bed.loss("a", "b", 0.5)
    try:
        for _ in range(6):
            _connect(bed, "a", "b")
        # each round trip sends >= 3 packets from a to b: at p = 0.5, none dropped in 6
        # attempts has probability < 1e-5
        assert _dropped(bed["a"], hostlib.CHAIN_OUT, bed["b"].ip) > 0
        assert _dropped(bed["b"], hostlib.CHAIN_OUT, bed["a"].ip) >= 0
    finally:
        fault.heal()
    assert "statistic" not in bed["a"].iptables("-S", hostlib.CHAIN_OUT).stdout
    assert _connect(bed, "a", "b") == "ping"


def test_heal_all_clears_every_fault(bed):
    bed.cut("a", "b")
    bed.cut(hostlib.ROOT, "c")
    bed.heal_all()
    assert _connect(bed, "a", "b") == "ping" and _connect(bed, hostlib.ROOT, "c") == "ping"
    assert not bed.active_faults()


def test_leftovers_of_a_killed_run_are_removed(tmp_path):
    script = textwrap.dedent(f"""
        import json, sys, subprocess, time
        sys.path.insert(0, {ROOT_DIR!r})
        from tests.netfault.hosts import Testbed
        bed = Testbed(["x", "y"]).start()
        sleeper = subprocess.Popen(bed["x"].command(["sleep", "600"]))
        print(json.dumps({{"ns": [h.ns for h in bed.hosts.values()], "bridge": bed.bridge, "pid": sleeper.pid}}),
              flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        left = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)       # no atexit, no cleanup
        proc.wait()
    assert set(left["ns"]) <= set(hostlib._list_netns())
    assert hostlib._alive(left["pid"])
    removed = hostlib.reap_leftovers()
    assert set(left["ns"]) <= set(removed) and left["bridge"] in removed, removed
    assert not set(left["ns"]) & set(hostlib._list_netns())
    assert left["bridge"] not in hostlib._list_links()
    wait_until(lambda: not hostlib._alive(left["pid"]) or _zombie(left["pid"]), 10.0, "the leftover's process killed")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_proxy_delays_each_direction(bed, tmp_path):
    proxy = ProxyProcess(str(tmp_path / "proxy"), bed["c"]).start()
    try:
        via = proxy.add("a->b", f"{bed['b'].ip}:{PORT}")
        rule = bed.redirect("a", (bed["b"].ip, PORT), via)

        def round_trip() -> float:
            """Seconds from sending 'ping' to the echo (the connect is not timed)."""
            answer, seconds = _round_trip(bed["a"].command(
                [sys.executable, "-c", CLIENT, bed["b"].ip, str(PORT), str(CONNECT_TIMEOUT_S * 5)]))
            assert answer == "ping"
            return seconds
        fast = min(round_trip() for _ in range(3))
        proxy.set("a->b", up_ms=150, down_ms=150)
        slow = min(round_trip() for _ in range(3))
        stats = proxy.stats()["a->b"]
        assert stats["accepted"] >= 6 and stats["delayed_bytes"]["up"] > 0 and stats["delayed_bytes"]["down"] > 0
        # the request and the answer each wait 150 ms in the proxy
        assert fast < 0.1 and slow >= 0.3, (fast, slow)
        rule.heal()
        assert _connect(bed, "a", "b") == "ping"
        assert proxy.stats()["a->b"]["accepted"] == stats["accepted"]     # not through the proxy any more
    finally:
        proxy.stop()


# --- trials -----------------------------------------------------------------------------------
def _run(kind: str, tmp_path) -> trials.Trial:
    if TRIAL_REASON:
        pytest.skip(TRIAL_REASON)
    trial = trials.run_trial(kind, str(tmp_path))
    print(format_table([(kind, trial.result)]))
    print(trials.pause_table([trial]))
    print("; ".join(trial.notes))
    print(trial.result.summary())
    trial.result.assert_ok()
    assert trial.result.lost == 0 and trial.result.duplicates == 0 and trial.result.reader_anomalies == 0
    assert trial.result.recoveries and all(r.resumed for r in trial.result.recoveries), trial.result.summary()
    assert trial.healed_s is not None and trial.max_gap_s is not None, trial
    return trial


def _check(kind: str, trial: trials.Trial) -> None:
    """What each fault must have done (so a trial whose fault missed cannot pass)."""
    facts = trial.facts
    if kind not in ("delay", "node_pause", "head_pause"):
        assert facts["dropped_packets"] > 0, facts       # the rules were in the path
    if kind in trials.LINK_KINDS:
        # link liveness found it: a link report took an end of the link out of pT (not the
        # session, which never expires in a cut and expires only after 3 s in a pause)
        assert facts["chains_changed"] and any("unresponsive" in why for _n, why in facts["removals"]), facts
    # (how fast: pT's write pause and the time to the removal are figures the trial prints,
    # against LINK_FAULT_PAUSE_MAX_S, never assertions: a loaded machine makes them longer)
    if kind == "client_head_cut":
        # the cut stalled the head's partitions for (about) as long as it was held: the head is
        # healthy, and it owns their ingestion
        assert trial.max_gap_s >= 0.8 * trial.hold_s or facts["chains_changed"], (trial.max_gap_s, trial.hold_s)
    elif kind in ("node_zk_cut", "head_isolated_from_zk"):
        assert facts["removed_after_s"] < trials.REMOVE_TIMEOUT_S and facts["chains_changed"], facts
    if kind == "head_isolated_from_zk":
        assert not facts["fence_probe"].startswith("acked"), facts
        assert facts["new_head"] != trial.victim, facts
    elif kind == "zk_minority":
        assert facts["isolated_mode"] is None and facts["created_during_cut_s"] < trials.ZK_SERVING_TIMEOUT_S, facts
    elif kind == "delay":
        assert facts["delayed_bytes"] > 0 and facts["latency_during_s"] - facts["latency_before_s"] >= \
            facts["delay_ms"] / 1000, facts


@pytest.mark.parametrize("kind", FAST_KINDS)
def test_network_fault_trial(kind, tmp_path):
    _check(kind, _run(kind, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("kind", SLOW_KINDS)
def test_network_fault_trial_slow(kind, tmp_path):
    _check(kind, _run(kind, tmp_path))


# --- a client's map refresh past a node cut off from ZooKeeper --------------------------------
MAP_REFRESH_LIMIT_S = 5.0


def test_map_refresh_gets_past_a_node_cut_off_from_zookeeper(tmp_path):
    """A client whose first seed is a node that is alive and reachable but cut off from
    ZooKeeper (and already removed from its chains) gets the current map from its next
    seed within MAP_REFRESH_LIMIT_S."""
    if TRIAL_REASON:
        pytest.skip(TRIAL_REASON)
    import sms
    from sms import errors
    stream = "map-refresh"
    with trials.environment(str(tmp_path)) as env:
        cluster = env.cluster
        control = cluster.procs["control"].address
        with sms.Client(control) as admin:
            head = admin.create_stream(stream, partitions=1, replication_factor=3).partition(0).chain[0].node_id
            cuts = [env.bed.cut(cluster.placement[head], z) for z in trials.ZK_HOSTS]
            wait_until(lambda: trials._removed(admin, stream, head, 0), trials.REMOVE_TIMEOUT_S,
                       f"{head} removed from p0 once cut from ZooKeeper")
            with sms.Client(f"{cluster.procs[head].address},{control}") as client:
                t0 = time.monotonic()
                try:
                    outcome = client.get_stream_info(stream).partition(0).chain[0].node_id
                except errors.SmsError as e:
                    outcome = f"{e.name}: {e.message}"
                elapsed = time.monotonic() - t0
            for cut in cuts:
                cut.heal()
        storage = cluster.storage_ids
    assert outcome in storage and outcome != head and elapsed < MAP_REFRESH_LIMIT_S, (outcome, f"{elapsed:.1f}s")
