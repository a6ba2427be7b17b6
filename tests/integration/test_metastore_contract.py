"""Contract tests of the metadata store: what every MetaStore backend must do.

Each contract test takes the `store_factory` fixture, parameterised by backend name
("embedded" and "zk"), and runs against a real store: a real LMDB file in tmp_path for
the embedded backend; for the ZooKeeper backend a real standalone ZooKeeper server
(tests/zkserver.py, one per module) with a fresh chroot prefix per test, so tests do
not see each other's entries. The zk params skip, saying why, where ZooKeeper is not
installed. Tests marked `integration` start real processes that open the same store
(by its URL): one is killed with SIGKILL (its ephemeral entry must vanish within the
session TTL), two race conditional sets on one counter, one is paused past the TTL (it
must learn that its session was lost). The tests at the end are specific to one
backend: the embedded one, then ZooKeeper (a forced session expiry, a paused server, a
restarted server, chroot prefixes). Every wait polls with a deadline; nothing sleeps
and hopes (the one sleep is the length of a server pause). Tests are sync functions
around `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, Iterator

import pytest

from metastore import (
    BadVersionError,
    Check,
    Create,
    Delete,
    EmbeddedMetaStore,
    Entry,
    MetaStoreError,
    MetaStoreClosedError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    Set,
    TooManyWatchesError,
    ZooKeeperMetaStore,
    open_metastore,
)
from sms import limits
from sms.limits import METASTORE_PATH_BYTES_MAX
from tests.metastores import StoreFactory, fresh_prefix, store_factory, zk_server  # noqa: F401 (fixtures)
from tests.zkserver import ZkServer, expire_session, skip_reason, zk_available
from sms.limits import (
    METASTORE_POLL_INTERVAL_S,
    METASTORE_SESSION_TTL_S,
    METASTORE_VALUE_BYTES_MAX,
    METASTORE_WATCHES_MAX,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

TEST_TIMEOUT_S = 30.0            # one test body, however it hangs
WATCH_DEADLINE_S = 2.0           # a watch reports a change within this (40 polls)
CHILD_LINE_DEADLINE_S = 15.0     # a child process prints its next line within this
EXPIRY_MARGIN_S = 2.0            # an expired session's ephemerals are gone by TTL + this
RACE_INCREMENTS = 150            # increments per racing process
ZK_PAUSE_S = METASTORE_SESSION_TTL_S / 3    # a server pause the session must survive


# --- fixtures and helpers -------------------------------------------------------------

@pytest.fixture
def dedicated_zk(tmp_path: Path) -> Iterator[ZkServer]:
    """A server of one test's own, for tests that pause or restart it."""
    if not zk_available():
        pytest.skip(skip_reason())
    server = ZkServer(tmp_path / "zk")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def run(body: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(body, TEST_TIMEOUT_S))


async def until(check: Callable[[], object], timeout_s: float, what: str) -> None:
    """Polls `check()` (sync or async) until it is true; fails the test at the
    deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(METASTORE_POLL_INTERVAL_S)


class Counter:
    """A watch callback that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


async def spawn(code: str, *args: str) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(REPO_ROOT), env.get("PYTHONPATH")) if part)
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, cwd=REPO_ROOT, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


async def read_line(proc: asyncio.subprocess.Process,
                    timeout_s: float = CHILD_LINE_DEADLINE_S) -> str:
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
    except TimeoutError:
        pytest.fail(f"child {proc.pid} printed nothing within {timeout_s} s")
    if not line:
        await proc.wait()
        stderr = (await proc.stderr.read()).decode(errors="replace")
        pytest.fail(f"child {proc.pid} exited {proc.returncode}:\n{stderr}")
    return line.decode().strip()


async def reap(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()                  # SIGKILL ends a stopped process too
        await proc.wait()


def is_stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


# --- entries and versions -------------------------------------------------------------

def test_create_get_set_delete_with_versions(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            assert await store.get("/a") is None
            assert await store.create("/a", b"one") == 0
            assert await store.get("/a") == Entry(b"one", 0, False)
            assert await store.get_strict("/a") == Entry(b"one", 0, False)
            assert await store.set("/a", b"two") == 1
            assert await store.set("/a", b"three", expected_version=1) == 2
            assert await store.get("/a") == Entry(b"three", 2, False)
            await store.delete("/a", expected_version=2)
            assert await store.get("/a") is None
            assert await store.create("/a") == 0          # a new entry starts over
            assert await store.get("/a") == Entry(b"", 0, False)
            await store.delete("/a")
            assert await store.get("/a") is None

    run(body())


def test_bad_version_changes_nothing(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/a", b"v0")
            await store.set("/a", b"v1")
            with pytest.raises(BadVersionError):
                await store.set("/a", b"stale", expected_version=0)
            with pytest.raises(BadVersionError):
                await store.delete("/a", expected_version=5)
            assert await store.get("/a") == Entry(b"v1", 1, False)

    run(body())


def test_node_exists(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/a/b", b"first")
            with pytest.raises(NodeExistsError):
                await store.create("/a/b", b"second")
            with pytest.raises(NodeExistsError):
                await store.create("/a")                  # exists as implicit parent
            with pytest.raises(NodeExistsError):
                await store.create("/")
            assert await store.get("/a/b") == Entry(b"first", 0, False)

    run(body())


def test_no_node(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            assert await store.get("/missing") is None
            with pytest.raises(NoNodeError):
                await store.get_strict("/missing")
            with pytest.raises(NoNodeError):
                await store.set("/missing", b"x")
            with pytest.raises(NoNodeError):
                await store.delete("/missing")
            with pytest.raises(NoNodeError):
                await store.delete("/missing", recursive=True)
            with pytest.raises(NoNodeError):
                await store.children("/missing")
            assert await store.children("/") == []

    run(body())


def test_not_empty_and_recursive_delete(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/t/a/b/c", b"deep")
            await store.create("/t/d", b"leaf")
            await store.create("/keep", b"other")
            with pytest.raises(NotEmptyError):
                await store.delete("/t")
            with pytest.raises(BadVersionError):
                await store.delete("/t", expected_version=3, recursive=True)
            assert await store.get("/t/a/b/c") == Entry(b"deep", 0, False)
            await store.delete("/t", expected_version=0, recursive=True)
            for path in ("/t", "/t/a", "/t/a/b", "/t/a/b/c", "/t/d"):
                assert await store.get(path) is None, path
            assert await store.children("/") == ["keep"]
            await store.create("/t/a")                    # the names are free again
            assert await store.children("/t") == ["a"]
            await store.delete("/t/a", recursive=True)    # recursive on a leaf
            assert await store.children("/t") == []
            with pytest.raises(ValueError):
                await store.delete("/", recursive=True)

    run(body())


def test_create_makes_missing_parents(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            assert await store.create("/p/q/r", b"x") == 0
            assert await store.get("/p") == Entry(b"", 0, False)
            assert await store.get("/p/q") == Entry(b"", 0, False)
            assert await store.children("/") == ["p"]
            assert await store.children("/p") == ["q"]
            assert await store.children("/p/q") == ["r"]
            assert await store.children("/p/q/r") == []
            await store.create("/p/q/s")                  # parents already there
            assert await store.children("/p/q") == ["r", "s"]

    run(body())


def test_children_sorted_direct_only(store_factory: StoreFactory) -> None:
    async def body() -> None:
        names = ["b", "a", "c10", "c2", "Z", "\u00e4", "_", "a.b", "0"]
        async with store_factory.client() as store:
            for name in names:
                await store.create(f"/dir/{name}", name.encode())
            await store.create("/dir/a/grandchild")
            await store.create("/dirx/not-a-child")
            await store.create("/dir0")
            assert await store.children("/dir") == sorted(names)
            assert await store.children("/") == ["dir", "dir0", "dirx"]

    run(body())


def test_ephemeral_entries_cannot_have_children(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/e", b"", ephemeral=True)
            assert await store.get("/e") == Entry(b"", 0, True)
            with pytest.raises(NoChildrenForEphemeralsError):
                await store.create("/e/child")
            with pytest.raises(NoChildrenForEphemeralsError):
                await store.create("/e/deeper/child")
            with pytest.raises(NoChildrenForEphemeralsError):
                await store.commit([Create("/e/child")])
            assert await store.children("/e") == []
            assert await store.set("/e", b"still ephemeral") == 1
            assert await store.get("/e") == Entry(b"still ephemeral", 1, True)

    run(body())


def test_persistent_entries_survive_reopen(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/kept", b"persistent")
            await store.create("/gone", b"ephemeral", ephemeral=True)
        async with store_factory.client() as store:
            assert await store.get("/kept") == Entry(b"persistent", 0, False)
            assert await store.get("/gone") is None

    run(body())


# --- commit ---------------------------------------------------------------------------

def test_commit_applies_all_in_order(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/c", b"0")
            versions = await store.commit([
                Check("/c", 0),
                Create("/c/new", b"n"),
                Set("/c", b"1", expected_version=0),
                Create("/c/new/deeper"),                  # parent created just above
                Set("/c/new/deeper", b"d"),
                Delete("/c/new/deeper", expected_version=1),
                Create("/c/eph", b"e", ephemeral=True),
            ])
            assert versions == [0, 0, 1, 0, 1, 1, 0]
            assert await store.get("/c") == Entry(b"1", 1, False)
            assert await store.get("/c/new") == Entry(b"n", 0, False)
            assert await store.get("/c/new/deeper") is None
            assert await store.get("/c/eph") == Entry(b"e", 0, True)
            assert await store.commit([]) == []

    run(body())


def test_commit_is_all_or_nothing(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/c", b"0")
            await store.create("/c/old", b"old")
            cases = [
                ([Create("/c/new", b"x"), Set("/c", b"1"), Delete("/c/old"),
                  Check("/c", 7)], BadVersionError),
                ([Set("/c", b"1"), Check("/c/missing", 0)], NoNodeError),
                ([Create("/c/new"), Create("/c/new")], NodeExistsError),
                ([Create("/c/new"), Create("/c/no-parent/x")], NoNodeError),
                ([Set("/c", b"1"), Delete("/c")], NotEmptyError),
                ([Set("/c", b"z", expected_version=9), Create("/c")], BadVersionError),
                ([Delete("/c/old"), Set("/c/old", b"again")], NoNodeError),
            ]
            for ops, error in cases:
                with pytest.raises(error):
                    await store.commit(ops)
                assert await store.get("/c") == Entry(b"0", 0, False), ops
                assert await store.get("/c/old") == Entry(b"old", 0, False), ops
                assert await store.children("/c") == ["old"], ops

    run(body())


# --- watches --------------------------------------------------------------------------

def test_watch_fires_on_create_set_delete_and_children(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as writer, store_factory.client() as watcher:
            for store in (watcher, writer):       # another client's writes, and its own
                base = f"/w-{store.session_id}"
                entry, parent = Counter(), Counter()
                store.watch(f"{base}/x", entry)
                store.watch(base, parent)

                async def changed(counter: Counter, before: int, what: str) -> None:
                    await until(lambda: counter.calls > before, WATCH_DEADLINE_S, what)

                e, p = entry.calls, parent.calls
                await writer.create(f"{base}/x", b"1")
                await changed(entry, e, "create of the entry")
                await changed(parent, p, "create of the parent and its first child")

                e = entry.calls
                await writer.set(f"{base}/x", b"2")
                await changed(entry, e, "set")

                p = parent.calls
                await writer.create(f"{base}/y")
                await changed(parent, p, "a child added")

                p = parent.calls
                await writer.delete(f"{base}/y")          # delete and re-create
                await writer.create(f"{base}/y")          # between two polls
                await changed(parent, p, "a child deleted and re-created")

                e, p = entry.calls, parent.calls
                await writer.delete(f"{base}/x")
                await changed(entry, e, "delete of the entry")
                await changed(parent, p, "a child removed")

                e = entry.calls
                await writer.create(f"{base}/x")          # version 0 again
                await changed(entry, e, "re-create of the entry")

    run(body())


def test_cancelled_watch_stops_firing(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/w", b"0")
            cancelled = Counter()
            cancel = store.watch("/w", cancelled)
            await store.set("/w", b"1")
            await until(lambda: cancelled.calls > 0, WATCH_DEADLINE_S, "first change")
            cancel()
            cancel()                                      # idempotent
            calls = cancelled.calls
            # A watch registered after the cancel sees the next change; once it has
            # fired, the poll round that would have called the cancelled one is over.
            sentinel = Counter()
            store.watch("/w", sentinel)
            await store.set("/w", b"2")
            await until(lambda: sentinel.calls > 0, WATCH_DEADLINE_S, "sentinel")
            assert cancelled.calls == calls

    run(body())


def test_watch_limit(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            cancels = [store.watch("/w", Counter()) for _ in range(METASTORE_WATCHES_MAX)]
            with pytest.raises(TooManyWatchesError):
                store.watch("/w", Counter())
            cancels.pop()()
            fired = Counter()
            store.watch("/w", fired)
            await store.create("/w")
            await until(lambda: fired.calls > 0, WATCH_DEADLINE_S, "watch at the limit")

    run(body())


# --- ephemerals and sessions ----------------------------------------------------------

def test_ephemeral_removed_on_close(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as observer:
            owner = store_factory.client()
            await owner.start()
            await owner.create("/svc/owner", b"here", ephemeral=True)
            await owner.create("/svc/kept", b"persistent")
            assert await observer.get("/svc/owner") == Entry(b"here", 0, True)
            left = Counter()
            observer.watch("/svc", left)
            await owner.close()
            assert await observer.get("/svc/owner") is None      # at once, no TTL
            assert await observer.children("/svc") == ["kept"]
            await until(lambda: left.calls > 0, WATCH_DEADLINE_S, "watch on /svc")
            with pytest.raises(MetaStoreClosedError):
                await owner.get("/svc")
            await owner.close()                                  # idempotent

    run(body())


def test_store_not_open_raises(store_factory: StoreFactory) -> None:
    async def body() -> None:
        store = store_factory.client()
        with pytest.raises(MetaStoreClosedError):
            await store.get("/a")
        with pytest.raises(MetaStoreClosedError):
            await store.create("/a")
        await store.start()
        await store.close()
        with pytest.raises(MetaStoreClosedError):
            await store.set("/a", b"")
        with pytest.raises(MetaStoreClosedError):
            store.watch("/a", Counter())

    run(body())


BAD_PATHS = ["", "a", "a/b", "/a/", "//", "/a//b", "/a/b\x00c", "/./a", "/a/..", 7,
             None, b"/a"]


def test_bad_paths_and_oversize_values_change_nothing(store_factory: StoreFactory) -> None:
    async def body() -> None:
        oversize = b"x" * (METASTORE_VALUE_BYTES_MAX + 1)
        async with store_factory.client() as store:
            await store.create("/ok", b"v")
            for path in BAD_PATHS:
                attempts = [
                    store.get(path), store.create(path), store.set(path, b""),
                    store.delete(path), store.children(path),
                    store.commit([Create("/ok/first"), Create(path)]),
                    store.commit([Check(path, 0)]),
                ]
                for attempt in attempts:
                    with pytest.raises(ValueError):
                        await attempt
                with pytest.raises(ValueError):
                    store.watch(path, Counter())
            for attempt in [
                store.create("/big", oversize), store.set("/ok", oversize),
                store.create("/str", "not bytes"), store.set("/ok", None),
                store.commit([Set("/ok", b"small"), Set("/ok", oversize)]),
                store.commit([Create("/ok/new"), Create("/big", oversize)]),
                store.set("/ok", b"v", expected_version=-1),
                store.delete("/"),
            ]:
                with pytest.raises(ValueError):
                    await attempt
            assert await store.create("/max", b"x" * METASTORE_VALUE_BYTES_MAX) == 0
            assert await store.children("/") == ["max", "ok"]
            assert await store.children("/ok") == []
            assert await store.get("/ok") == Entry(b"v", 0, False)

    run(body())


CHILD_EPHEMERAL = r"""
import asyncio, sys
from metastore import open_metastore

async def main():
    store = open_metastore(sys.argv[1])
    await store.start()
    await store.create(sys.argv[2], b"alive", ephemeral=True)
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.integration
def test_ephemeral_of_killed_process_vanishes_within_ttl(
        store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as observer:
            proc = await spawn(CHILD_EPHEMERAL, store_factory.url, "/svc/child")
            try:
                assert await read_line(proc) == "ready"
                assert await observer.get("/svc/child") == Entry(b"alive", 0, True)
                changed = Counter()
                observer.watch("/svc", changed)
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                await until(lambda: _is_none(observer.get("/svc/child")),
                            METASTORE_SESSION_TTL_S + EXPIRY_MARGIN_S,
                            "the killed process's ephemeral to vanish")
                assert await observer.children("/svc") == []
                await until(lambda: changed.calls > 0, WATCH_DEADLINE_S,
                            "watch on /svc to report the expiry")
            finally:
                await reap(proc)

    run(body())


async def _is_none(value: Awaitable[object]) -> bool:
    return await value is None


CHILD_INCREMENTER = r"""
import asyncio, json, sys
from metastore import BadVersionError, open_metastore

async def main(url, path, count):
    won, conflicts = [], 0
    async with open_metastore(url) as store:
        for _attempt in range(count * 1000):
            if len(won) == count:
                break
            entry = await store.get(path)
            try:
                won.append(await store.set(path, b"%d" % (int(entry.value) + 1),
                                           expected_version=entry.version))
            except BadVersionError:
                conflicts += 1
    print(json.dumps({"won": won, "conflicts": conflicts}), flush=True)

print("ready", flush=True)
sys.stdin.readline()                    # start together with the other racer
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


@pytest.mark.integration
def test_racing_conditional_sets_from_two_processes(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as store:
            await store.create("/counter", b"0")
            racers = [await spawn(CHILD_INCREMENTER, store_factory.url, "/counter",
                                  str(RACE_INCREMENTS)) for _ in range(2)]
            try:
                for proc in racers:
                    assert await read_line(proc) == "ready"
                for proc in racers:
                    assert proc.stdin is not None
                    proc.stdin.write(b"go\n")
                    await proc.stdin.drain()
                results = [json.loads(await read_line(proc)) for proc in racers]
                for proc in racers:
                    assert await asyncio.wait_for(proc.wait(), CHILD_LINE_DEADLINE_S) == 0
            finally:
                for proc in racers:
                    await reap(proc)
            total = RACE_INCREMENTS * len(racers)
            won = [result["won"] for result in results]
            for versions in won:
                assert len(versions) == RACE_INCREMENTS
                assert versions == sorted(versions)
            all_won = sorted(version for versions in won for version in versions)
            assert all_won == list(range(1, total + 1))  # each version won exactly once
            assert await store.get("/counter") == Entry(b"%d" % total, total, False)

    run(body())


CHILD_PAUSED = r"""
import asyncio, os, signal, sys
from metastore import open_metastore

async def main(url, path, lost_deadline_s):
    async with open_metastore(url) as store:
        lost = asyncio.Event()
        store.on_session_lost(lost.set)
        first_session = store.session_id
        await store.create(path, b"paused", ephemeral=True)
        print("ready", flush=True)
        # Pause here, between transactions: a process stopped while holding LMDB's
        # writer lock would stall every writer, the observer's heartbeat included.
        os.kill(os.getpid(), signal.SIGSTOP)
        await asyncio.wait_for(lost.wait(), lost_deadline_s)
        gone = await store.get(path) is None
        fresh = store.session_id != first_session
        print("lost" if gone and fresh else f"gone={gone} fresh={fresh}", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


@pytest.mark.integration
def test_session_lost_after_pause_past_ttl(store_factory: StoreFactory) -> None:
    async def body() -> None:
        async with store_factory.client() as observer:
            proc = await spawn(CHILD_PAUSED, store_factory.url, "/svc/paused",
                               str(CHILD_LINE_DEADLINE_S))
            try:
                assert await read_line(proc) == "ready"
                await until(lambda: is_stopped(proc.pid), CHILD_LINE_DEADLINE_S,
                            "the child to stop itself")
                await until(lambda: _is_none(observer.get("/svc/paused")),
                            METASTORE_SESSION_TTL_S + EXPIRY_MARGIN_S,
                            "the paused process's ephemeral to vanish")
                assert is_stopped(proc.pid)
                proc.send_signal(signal.SIGCONT)
                assert await read_line(proc) == "lost"
                assert await asyncio.wait_for(proc.wait(), CHILD_LINE_DEADLINE_S) == 0
            finally:
                await reap(proc)

    run(body())


# --- embedded backend only ------------------------------------------------------------

def test_embedded_write_after_own_session_expired(tmp_path: Path) -> None:
    async def body() -> None:
        skew_s = [0.0]
        store = EmbeddedMetaStore(str(tmp_path / "meta.lmdb"),
                                  clock=lambda: time.time() + skew_s[0])
        async with store:
            lost = asyncio.Event()
            store.on_session_lost(lost.set)
            await store.create("/svc/e", ephemeral=True)
            first_session = store.session_id
            skew_s[0] = METASTORE_SESSION_TTL_S + 1       # as if paused past the TTL
            with pytest.raises(SessionExpiredError):
                await store.set("/svc", b"x")
            await asyncio.wait_for(lost.wait(), WATCH_DEADLINE_S)
            assert store.session_id != first_session
            assert await store.get("/svc/e") is None
            assert await store.get("/svc") == Entry(b"", 0, False)   # not applied
            assert await store.set("/svc", b"x") == 1                 # retry works
            await store.create("/svc/e", ephemeral=True)
            assert await store.get("/svc/e") == Entry(b"", 0, True)

    run(body())


def test_embedded_path_length_limit(tmp_path: Path) -> None:
    async def body() -> None:
        async with EmbeddedMetaStore(str(tmp_path / "meta.lmdb")) as store:
            longest = "/" + "p" * (METASTORE_PATH_BYTES_MAX - 1)
            assert await store.create(longest) == 0
            with pytest.raises(ValueError):
                await store.create(longest + "p")
            assert await store.children("/") == [longest[1:]]

    run(body())


def test_open_metastore_urls(tmp_path: Path) -> None:
    zk = open_metastore("zk://127.0.0.1:2181,127.0.0.2:2182/sms")    # not started:
    assert isinstance(zk, ZooKeeperMetaStore)                        # no server needed
    assert (zk.hosts, zk.prefix) == ("127.0.0.1:2181,127.0.0.2:2182", "/sms")
    for url in ["embedded://host/x.lmdb", "embedded:relative.lmdb", "embedded:///dir/",
                "http://x/y", "", "zk://", "zk:///sms", "zk://h:2181/sms/",
                "zk://h:notaport/sms", "zk://h:2181/a//b", "zk://h:2181/sms?x=1"]:
        with pytest.raises(ValueError):
            open_metastore(url)
    store = open_metastore(f"embedded://{tmp_path}/meta.lmdb")
    assert isinstance(store, EmbeddedMetaStore)
    assert store.path == f"{tmp_path}/meta.lmdb"
    plain = open_metastore(str(tmp_path / "plain.lmdb"))
    assert isinstance(plain, EmbeddedMetaStore)
    assert plain.path == str(tmp_path / "plain.lmdb")


# --- ZooKeeper backend only -----------------------------------------------------------

def test_zk_forced_session_expiry(zk_server: ZkServer) -> None:
    """A session ended behind the client's back (another client takes it over and
    closes it): its ephemerals vanish at once, the owner reports the loss, starts a
    fresh session, re-arms its watches, and can register again."""
    async def body() -> None:
        url = zk_server.url(fresh_prefix())
        async with open_metastore(url) as store, open_metastore(url) as observer:
            assert isinstance(store, ZooKeeperMetaStore)
            lost = asyncio.Event()
            store.on_session_lost(lost.set)
            await store.create("/svc/e", b"mine", ephemeral=True)
            await store.create("/svc/kept", b"persistent")
            seen_by_observer, seen_by_owner = Counter(), Counter()
            observer.watch("/svc", seen_by_observer)
            store.watch("/svc/e", seen_by_owner)
            first_session = store.session_id
            assert store.client_id is not None
            await asyncio.to_thread(expire_session, zk_server.hosts, *store.client_id)
            assert await observer.get("/svc/e") is None        # deleted at the close
            await until(lambda: seen_by_observer.calls > 0, WATCH_DEADLINE_S,
                        "the observer's watch to report the expiry")
            await asyncio.wait_for(lost.wait(), METASTORE_SESSION_TTL_S + EXPIRY_MARGIN_S)
            assert store.session_id not in ("", first_session)
            await until(lambda: seen_by_owner.calls > 0, WATCH_DEADLINE_S,
                        "the owner's re-armed watch to report its entry gone")
            assert await store.get("/svc/e") is None
            assert await store.get("/svc/kept") == Entry(b"persistent", 0, False)
            await store.create("/svc/e", b"again", ephemeral=True)   # registers again
            assert await observer.get("/svc/e") == Entry(b"again", 0, True)
            calls = seen_by_owner.calls
            await observer.set("/svc/e", b"changed")
            await until(lambda: seen_by_owner.calls > calls, WATCH_DEADLINE_S,
                        "the owner's watch to keep working in the fresh session")

    run(body())


def test_zk_write_after_expiry_raises_once_then_works(zk_server: ZkServer) -> None:
    """The write that finds the session expired raises SessionExpiredError (not
    applied); by then the fresh session is up, so the retry works."""
    async def body() -> None:
        async with open_metastore(zk_server.url(fresh_prefix())) as store:
            lost = asyncio.Event()
            store.on_session_lost(lost.set)
            await store.create("/svc/e", ephemeral=True)
            assert store.client_id is not None
            await asyncio.to_thread(expire_session, zk_server.hosts, *store.client_id)
            try:
                assert await store.set("/svc", b"x") == 1
            except SessionExpiredError:                       # it found out first
                assert await store.set("/svc", b"x") == 1
            await asyncio.wait_for(lost.wait(), METASTORE_SESSION_TTL_S + EXPIRY_MARGIN_S)
            assert await store.get("/svc/e") is None
            await store.create("/svc/e", ephemeral=True)
            assert await store.get("/svc/e") == Entry(b"", 0, True)

    run(body())


@pytest.mark.integration
def test_zk_server_pause_keeps_the_session(dedicated_zk: ZkServer) -> None:
    """The server SIGSTOPped for a third of the TTL, then resumed: requests made
    meanwhile complete afterwards, the session and its ephemerals survive, no session
    loss is reported, and watches keep working."""
    async def body() -> None:
        async with open_metastore(dedicated_zk.url("/paused")) as store:
            lost = Counter()
            store.on_session_lost(lost)
            await store.create("/svc/e", b"e", ephemeral=True)
            await store.create("/c", b"0")
            seen = Counter()
            store.watch("/c", seen)
            first_session = store.session_id
            dedicated_zk.pause()
            try:
                pending = asyncio.ensure_future(store.set("/c", b"1", expected_version=0))
                await asyncio.sleep(ZK_PAUSE_S)        # the length of the fault
                assert not pending.done()
            finally:
                dedicated_zk.resume()
            assert await asyncio.wait_for(pending, CHILD_LINE_DEADLINE_S) == 1
            await until(lambda: seen.calls > 0, WATCH_DEADLINE_S, "the watch on /c")
            assert await store.get("/c") == Entry(b"1", 1, False)
            assert await store.get("/svc/e") == Entry(b"e", 0, True)
            assert store.session_id == first_session
            assert lost.calls == 0

    run(body())


@pytest.mark.integration
def test_zk_server_restart_is_survived(dedicated_zk: ZkServer) -> None:
    """The server stopped and started again on the same data dir and port: the client
    reconnects by itself, persistent entries are there, its watches are re-armed, and
    its session either survived (ephemerals kept) or was reported lost (ephemerals
    gone)."""
    async def body() -> None:
        async with open_metastore(dedicated_zk.url("/restarted")) as store:
            lost = Counter()
            store.on_session_lost(lost)
            await store.create("/kept", b"persistent")
            await store.create("/svc/e", b"e", ephemeral=True)
            seen = Counter()
            store.watch("/kept", seen)
            first_session = store.session_id
            await asyncio.to_thread(dedicated_zk.restart)
            assert await store.get("/kept") == Entry(b"persistent", 0, False)
            assert await store.set("/kept", b"after", expected_version=0) == 1
            await until(lambda: seen.calls > 0, WATCH_DEADLINE_S,
                        "the re-armed watch to report the set")
            if store.session_id == first_session:
                assert lost.calls == 0
                assert await store.get("/svc/e") == Entry(b"e", 0, True)
            else:
                await until(lambda: lost.calls > 0, WATCH_DEADLINE_S, "session lost")
                assert await store.get("/svc/e") is None

    run(body())


def test_zk_prefixes_are_chroots(zk_server: ZkServer) -> None:
    """A prefix is created if missing and holds every path; stores on different
    prefixes do not see each other; without a prefix the server's own /zookeeper is
    neither listed nor writable."""
    async def body() -> None:
        top = fresh_prefix()
        async with open_metastore(zk_server.url(f"{top}/a/b")) as deep, \
                open_metastore(zk_server.url(top)) as outer, \
                open_metastore(zk_server.url(fresh_prefix())) as other, \
                open_metastore(zk_server.url()) as bare:
            await deep.create("/x", b"in deep")
            assert await deep.children("/") == ["x"]
            assert await outer.children("/") == ["a"]
            assert await outer.get("/a/b/x") == Entry(b"in deep", 0, False)
            assert await other.children("/") == []
            assert await deep.get("/") == Entry(b"", 0, False)
            names = await bare.children("/")
            assert top[1:] in names and "zookeeper" not in names
            for attempt in [bare.create("/zookeeper/x"), bare.get("/zookeeper"),
                            deep.create("/bad\u0001name")]:
                with pytest.raises(ValueError):
                    await attempt

    run(body())


def test_zk_recursive_delete_in_several_multis(zk_server: ZkServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A subtree larger than one multi is deleted in several, each guarded by the
    version of the subtree's root: a stale expected version deletes nothing."""
    monkeypatch.setattr(limits, "ZK_MULTI_OPS_MAX", 3)
    async def body() -> None:
        async with open_metastore(zk_server.url(fresh_prefix())) as store:
            paths = [f"/t/{a}/{b}" for a in "abc" for b in "xyz"]
            for path in paths:
                await store.create(path, path.encode())
            await store.set("/t", b"v1")
            with pytest.raises(BadVersionError):
                await store.delete("/t", expected_version=0, recursive=True)
            for path in paths:
                assert await store.get(path) == Entry(path.encode(), 0, False)
            await store.delete("/t", expected_version=1, recursive=True)
            assert await store.children("/") == []

    run(body())


def test_zk_commit_delete_pinned_version_goes_stale(zk_server: ZkServer) -> None:
    """A Delete without expected version is sent pinned to the version read before the
    multi; when another client sets the entry in between, the commit reads again and
    still deletes, reporting the version the entry had."""
    async def body() -> None:
        url = zk_server.url(fresh_prefix())
        async with open_metastore(url) as store, open_metastore(url) as other:
            assert isinstance(store, ZooKeeperMetaStore)
            await store.create("/d", b"0")
            real_pins = store._delete_pins
            raced = []

            async def racing_pins(ops, deadline):        # type: ignore[no-untyped-def]
                pins = await real_pins(ops, deadline)
                if not raced:
                    raced.append(await other.set("/d", b"meanwhile"))
                return pins

            store._delete_pins = racing_pins             # type: ignore[method-assign]
            assert await store.commit([Delete("/d")]) == [1]
            assert raced == [1]
            assert await other.get("/d") is None

    run(body())


def test_zk_lost_answer_of_applied_write_is_recognised(zk_server: ZkServer) -> None:
    """The connection drops after a write was applied but before its answer came: the
    retry's failure (exists / bad version / no entry) is recognised as the success it
    was. A commit is not retried: it raises ConnectionLossError."""
    from kazoo.exceptions import ConnectionLoss

    from metastore.zookeeper import ConnectionLossError

    async def body() -> None:
        async with open_metastore(zk_server.url(fresh_prefix())) as store:
            assert isinstance(store, ZooKeeperMetaStore)
            real_await = store._await
            lose_next = [False]

            async def lossy(result, deadline):           # type: ignore[no-untyped-def]
                value = await real_await(result, deadline)   # applied...
                if lose_next[0]:
                    lose_next[0] = False
                    raise ConnectionLoss()                   # ...answer lost
                return value

            store._await = lossy                         # type: ignore[method-assign]
            lose_next[0] = True
            assert await store.create("/svc/e", b"e", ephemeral=True) == 0
            assert await store.get("/svc/e") == Entry(b"e", 0, True)
            lose_next[0] = True
            assert await store.create("/p", b"p") == 0
            lose_next[0] = True
            assert await store.set("/p", b"q", expected_version=0) == 1
            lose_next[0] = True
            await store.delete("/p", expected_version=1)
            assert await store.get("/p") is None
            lose_next[0] = True
            with pytest.raises(ConnectionLossError):
                await store.commit([Create("/c", b"c")])
            assert await store.get("/c") == Entry(b"c", 0, False)   # it was applied
            with pytest.raises(NodeExistsError):                    # not recognised
                await store.create("/svc/e", b"other", ephemeral=True)   # as ours

    run(body())


def test_zookeeper_digest_acls_keep_others_out(zk_server, monkeypatch):
    """$SMS_ZK_DIGEST (docs/operations.md): every znode the store creates, the chroot
    included, is readable and writable by that user only. A client without the
    credential, or with another, gets NoAuth; the store itself works as before."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    prefix = fresh_prefix()
    monkeypatch.setenv("SMS_ZK_DIGEST", "sms:s3cret")

    async def body() -> None:
        store = open_metastore(zk_server.url(prefix))
        await store.start()
        try:
            await store.create("/streams")
            await store.create("/streams/orders", b"config")
            assert (await store.get("/streams/orders")).value == b"config"
        finally:
            await store.close()
    run(body())
    hosts = zk_server.hosts
    for auth in ([], [("digest", "sms:wrong")], [("digest", "other:s3cret")]):
        outsider = KazooClient(hosts=hosts, auth_data=auth)
        outsider.start(timeout=TEST_TIMEOUT_S)
        try:
            for path in (prefix, f"{prefix}/streams/orders"):
                with pytest.raises(NoAuthError):
                    outsider.get(path)
            with pytest.raises(NoAuthError):
                outsider.set(f"{prefix}/streams/orders", b"forged")
        finally:
            outsider.stop()
            outsider.close()
    insider = KazooClient(hosts=hosts, auth_data=[("digest", "sms:s3cret")])
    insider.start(timeout=TEST_TIMEOUT_S)
    try:
        assert insider.get(f"{prefix}/streams/orders")[0] == b"config"
    finally:
        insider.stop()
        insider.close()


def test_a_malformed_zookeeper_digest_is_named(zk_server, monkeypatch):
    monkeypatch.setenv("SMS_ZK_DIGEST", "no-colon")

    async def body() -> None:
        store = open_metastore(zk_server.url(fresh_prefix()))
        with pytest.raises(MetaStoreError, match="user:password"):
            await store.start()
    run(body())
