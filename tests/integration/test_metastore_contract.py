"""Contract tests of the metadata store: what every MetaStore backend must do.

Each contract test takes the `store_factory` fixture, parameterised by backend name
(only "embedded" so far; a ZooKeeper backend adds a param), and runs against a real
store: a real LMDB file in tmp_path for the embedded backend. Tests marked
`integration` start real processes that open the same store: one is killed with
SIGKILL (its ephemeral entry must vanish within the session TTL), two race conditional
sets on one counter, one is paused past the TTL (it must learn that its session was
lost). The tests at the end are specific to the embedded backend. Every wait polls
with a deadline; nothing sleeps and hopes. Tests are sync functions around
`asyncio.run`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Awaitable, Callable

import pytest

from control.metastore import (
    BadVersionError,
    Check,
    Create,
    Delete,
    EmbeddedMetaStore,
    Entry,
    MetaStore,
    MetaStoreClosedError,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    Set,
    TooManyWatchesError,
    open_metastore,
)
from control.metastore.embedded import METASTORE_PATH_BYTES_MAX
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


# --- fixtures and helpers -------------------------------------------------------------

class StoreFactory:
    """Opens clients (unstarted) of one fresh store; `url` is what child processes
    pass to open_metastore()."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url

    def client(self) -> MetaStore:
        return open_metastore(self.url)


@pytest.fixture(params=["embedded"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "embedded":
        path = urllib.parse.quote(str(tmp_path / "meta.lmdb"))
        return StoreFactory("embedded", f"embedded://{path}")
    raise AssertionError(f"unknown backend {request.param!r}")


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
from control.metastore import open_metastore

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
from control.metastore import BadVersionError, open_metastore

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
from control.metastore import open_metastore

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
    with pytest.raises(ValueError, match="zookeeper backend not available yet"):
        open_metastore("zk://127.0.0.1:2181,127.0.0.2:2181/sms")
    for url in ["embedded://host/x.lmdb", "embedded:relative.lmdb", "embedded:///dir/",
                "http://x/y", ""]:
        with pytest.raises(ValueError):
            open_metastore(url)
    store = open_metastore(f"embedded://{tmp_path}/meta.lmdb")
    assert isinstance(store, EmbeddedMetaStore)
    assert store.path == f"{tmp_path}/meta.lmdb"
    plain = open_metastore(str(tmp_path / "plain.lmdb"))
    assert isinstance(plain, EmbeddedMetaStore)
    assert plain.path == str(tmp_path / "plain.lmdb")
