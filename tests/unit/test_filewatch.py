"""metastore/filewatch.py: a write to the embedded store's file by another process wakes
this one's watch poller at once (inotify), so a watch fires long before the poll period;
where inotify is missing the poll goes on alone."""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys

import pytest

from metastore import Create
from metastore import embedded
from metastore.embedded import EmbeddedMetaStore
from metastore.filewatch import FileWatch

DEADLINE_S = 10.0


def _write_from_another_process(path: str) -> None:
    code = ("import asyncio, sys\n"
            "from metastore import Create\n"
            "from metastore.embedded import EmbeddedMetaStore\n"
            "async def main():\n"
            "    store = EmbeddedMetaStore(sys.argv[1])\n"
            "    await store.start()\n"
            "    await store.commit([Create('/woken', b'x')])\n"
            "    await store.close()\n"
            "asyncio.run(main())\n")
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)


def test_a_write_makes_the_watch_readable(tmp_path):
    path = str(tmp_path / "meta.lmdb")

    async def make() -> None:
        store = EmbeddedMetaStore(path)
        await store.start()
        await store.close()
    asyncio.run(make())
    files = FileWatch.open(path)
    if files is None:
        pytest.skip("no inotify here: the store polls alone")
    try:
        assert select.select([files.fd], [], [], 0)[0] == []
        _write_from_another_process(path)
        assert select.select([files.fd], [], [], DEADLINE_S)[0] == [files.fd]
        files.drain()
        assert select.select([files.fd], [], [], 0)[0] == []
    finally:
        files.close()


def test_a_watch_fires_on_another_process_s_write_without_waiting_for_the_poll(tmp_path, monkeypatch):
    """The poll period is made an hour: only the wake-up can deliver the watch in time."""
    monkeypatch.setattr(embedded, "METASTORE_POLL_INTERVAL_S", 3600.0)
    path = str(tmp_path / "meta.lmdb")

    async def main() -> None:
        store = EmbeddedMetaStore(path)
        await store.start()
        fired = asyncio.Event()
        try:
            store.watch("/woken", fired.set)
            if FileWatch.open(path) is None:
                pytest.skip("no inotify here: the store polls alone")
            await asyncio.to_thread(_write_from_another_process, path)
            async with asyncio.timeout(DEADLINE_S):
                await fired.wait()
            assert (await store.get("/woken")).value == b"x"
            await store.commit([Create("/again", b"y")])      # (its own writes wake it too, harmlessly)
        finally:
            await store.close()                               # (and it stops amid wake-ups)
    asyncio.run(main())
