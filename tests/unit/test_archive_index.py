"""Unit tests of archive/index.py: the archive's index in a real metadata store.

Each test opens a real EmbeddedMetaStore (an LMDB file in tmp_path; no sockets) with a
/streams/<name> entry made first, as the control role makes it, and drives the index
through the versioned commits writers make: the first fragment creates the state (and
the archive parent, only while the stream is there), a writer with a stale view of the
state indexes nothing, fragments() lists what was indexed by SN. Tests are sync
functions around asyncio.run (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from archive import index
from archive.fragment import FragmentRef, file_name
from archive.index import ArchiveState
from metastore import BadVersionError, EmbeddedMetaStore, MetaStore, NodeExistsError, NoNodeError
from sms import metadata, seqno

U = seqno.COUNTER_UNIT
S0 = seqno.make(1_700_000_000_000, 1, 0)
STREAM = "orders"
STREAM_PATH = f"/streams/{STREAM}"
ARCHIVE_PARENT = f"/streams/{STREAM}/archive"


def ref(first: int, last: int, checksum: int = 0xC0FFEE, codec: int = 1) -> FragmentRef:
    r = FragmentRef.parse(file_name(first, last, checksum, codec))
    assert r is not None
    return r


def run(tmp_path: Path, body: Callable[[MetaStore], Awaitable[None]], *, stream: bool = True) -> None:
    """Run `body` against a fresh store (with the stream's entry unless `stream=False`)."""
    async def main() -> None:
        async with EmbeddedMetaStore(str(tmp_path / "meta.lmdb")) as meta:
            if stream:
                await meta.create(STREAM_PATH, b'{"name": "orders"}')
            await asyncio.wait_for(body(meta), 20)

    asyncio.run(main())


async def children(meta: MetaStore, path: str) -> list[str]:
    try:
        return sorted(await meta.children(path))
    except NoNodeError:
        return []


def test_paths_are_where_the_module_says():
    assert metadata.archive_path(STREAM, 3) == f"{ARCHIVE_PARENT}/3"
    assert metadata.stream_path(STREAM) == STREAM_PATH


def test_state_round_trips_with_sns_as_strings():
    big = seqno.SN_MAX
    state = ArchiveState(archived_sn=big, verified_sn=big - 1, writer="node-a", written_ms=123)
    raw = state.to_bytes()
    d = json.loads(raw)
    assert d["archived_sn"] == str(big) and d["verified_sn"] == str(big - 1)   # (JSON readers lose big ints)
    assert ArchiveState.from_bytes(raw) == state
    assert ArchiveState.from_bytes(b"") == ArchiveState()
    assert ArchiveState.from_bytes(b"{}") == ArchiveState()


def test_first_fragment_creates_the_parent_the_state_and_its_child(tmp_path):
    async def body(meta: MetaStore) -> None:
        assert await index.read_state(meta, STREAM, 0) is None
        assert await index.fragments(meta, STREAM, 0) == []
        assert await meta.get(ARCHIVE_PARENT) is None

        r = ref(S0, S0 + 9 * U)
        details = {"records": 10, "batches": 2, "bytes": 1234}
        state = await index.add_fragment(meta, STREAM, 0, r, details, None, "node-a", 1_000)
        assert state == ArchiveState(archived_sn=S0 + 9 * U, verified_sn=0, writer="node-a", written_ms=1_000)

        assert (await meta.get(ARCHIVE_PARENT)) is not None
        assert await children(meta, ARCHIVE_PARENT) == ["0"]
        assert await index.read_state(meta, STREAM, 0) == (state, 0)
        child = await meta.get(f"{ARCHIVE_PARENT}/0/{r.name}")
        assert child is not None and json.loads(child.value) == details
        assert await index.fragments(meta, STREAM, 0) == [r]
        # the stream's own entry is untouched
        stream = await meta.get(STREAM_PATH)
        assert stream is not None and stream.value == b'{"name": "orders"}'

    run(tmp_path, body)


def test_later_fragments_move_the_state_at_its_version(tmp_path):
    async def body(meta: MetaStore) -> None:
        refs = [ref(S0, S0 + 4 * U), ref(S0 + 5 * U, S0 + 5 * U), ref(S0 + 6 * U, S0 + 20 * U)]
        await index.add_fragment(meta, STREAM, 0, refs[0], {}, None, "node-a", 1)
        for i, r in enumerate(refs[1:], start=1):
            known = await index.read_state(meta, STREAM, 0)
            assert known is not None and known[1] == i - 1
            state = await index.add_fragment(meta, STREAM, 0, r, {"n": i}, known, f"node-{i}", 10 + i)
            assert state.archived_sn == r.last_sn and state.writer == f"node-{i}" and state.written_ms == 10 + i
        assert await index.read_state(meta, STREAM, 0) == (
            ArchiveState(archived_sn=S0 + 20 * U, writer="node-2", written_ms=12), 2)
        assert await index.fragments(meta, STREAM, 0) == refs

    run(tmp_path, body)


def test_another_partition_finds_the_parent_there(tmp_path):
    async def body(meta: MetaStore) -> None:
        r0, r7 = ref(S0, S0 + U), ref(seqno.make(1_700_000_000_000, 1, 7), seqno.make(1_700_000_000_000, 3, 7))
        await index.add_fragment(meta, STREAM, 0, r0, {}, None, "a", 1)
        await index.add_fragment(meta, STREAM, 7, r7, {}, None, "b", 2)
        assert await children(meta, ARCHIVE_PARENT) == ["0", "7"]
        assert await index.fragments(meta, STREAM, 0) == [r0]
        assert await index.fragments(meta, STREAM, 7) == [r7]
        assert await index.fragments(meta, STREAM, 1) == []

    run(tmp_path, body)


def test_a_second_first_writer_indexes_nothing(tmp_path):
    async def body(meta: MetaStore) -> None:
        mine, theirs = ref(S0, S0 + 4 * U, 1), ref(S0, S0 + 4 * U, 2)
        await index.add_fragment(meta, STREAM, 0, mine, {"w": "a"}, None, "node-a", 1)
        # the other writer also read "no state yet" before the first committed
        with pytest.raises(NodeExistsError):
            await index.add_fragment(meta, STREAM, 0, theirs, {"w": "b"}, None, "node-b", 2)
        assert await index.fragments(meta, STREAM, 0) == [mine]
        assert await index.read_state(meta, STREAM, 0) == (
            ArchiveState(archived_sn=S0 + 4 * U, writer="node-a", written_ms=1), 0)

    run(tmp_path, body)


def test_a_writer_with_a_stale_state_indexes_nothing(tmp_path):
    async def body(meta: MetaStore) -> None:
        await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + 4 * U), {}, None, "node-a", 1)
        known = await index.read_state(meta, STREAM, 0)
        assert known is not None
        # two writers read the same state; both archive the run after it
        a, b = ref(S0 + 5 * U, S0 + 9 * U, 0xA), ref(S0 + 5 * U, S0 + 12 * U, 0xB)
        await index.add_fragment(meta, STREAM, 0, a, {}, known, "node-a", 2)
        with pytest.raises(BadVersionError):
            await index.add_fragment(meta, STREAM, 0, b, {}, known, "node-b", 3)
        names = await children(meta, f"{ARCHIVE_PARENT}/0")
        assert b.name not in names and a.name in names
        assert await index.fragments(meta, STREAM, 0) == [ref(S0, S0 + 4 * U), a]
        state, version = await index.read_state(meta, STREAM, 0) or (None, None)
        assert (state.archived_sn, state.writer, version) == (S0 + 9 * U, "node-a", 1)
        # the loser reads again and goes on from the new archived_sn
        fresh = await index.read_state(meta, STREAM, 0)
        c = ref(S0 + 10 * U, S0 + 12 * U, 0xC)
        await index.add_fragment(meta, STREAM, 0, c, {}, fresh, "node-b", 4)
        assert [r.name for r in await index.fragments(meta, STREAM, 0)][-1] == c.name

    run(tmp_path, body)


def test_a_stale_writer_whose_child_exists_indexes_nothing(tmp_path):
    async def body(meta: MetaStore) -> None:
        # two writers of the same run write the same name: the second finds it indexed
        await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + 4 * U), {}, None, "node-a", 1)
        known = await index.read_state(meta, STREAM, 0)
        same = ref(S0 + 5 * U, S0 + 9 * U)
        await index.add_fragment(meta, STREAM, 0, same, {"w": "a"}, known, "node-a", 2)
        with pytest.raises((BadVersionError, NodeExistsError)):
            await index.add_fragment(meta, STREAM, 0, same, {"w": "b"}, known, "node-b", 3)
        child = await meta.get(f"{ARCHIVE_PARENT}/0/{same.name}")
        assert child is not None and json.loads(child.value) == {"w": "a"}
        state, version = await index.read_state(meta, STREAM, 0) or (None, None)
        assert (state.writer, state.written_ms, version) == ("node-a", 2, 1)

    run(tmp_path, body)


def test_fragments_sorts_by_sn_and_ignores_foreign_children(tmp_path):
    async def body(meta: MetaStore) -> None:
        first = ref(S0, S0 + U)
        await index.add_fragment(meta, STREAM, 0, first, {}, None, "a", 1)
        # later fragments, indexed in an order that is not SN order (and with lexically
        # misleading checksums), plus children no fragment name matches
        path = f"{ARCHIVE_PARENT}/0"
        later = [ref(S0 + 50 * U, S0 + 60 * U, 0x1), ref(S0 + 2 * U, S0 + 9 * U, 0xF), ref(S0 + 10 * U, S0 + 49 * U, 0x0)]
        for r in later:
            await meta.create(f"{path}/{r.name}", b"{}")
        for foreign in ["lock", "claimed", later[0].name + ".tmp", "0" * 32 + "-" + "1" * 32 + ".raw",
                        later[1].name.upper()]:
            await meta.create(f"{path}/{foreign}", b"")
        got = await index.fragments(meta, STREAM, 0)
        assert got == [first, later[1], later[2], later[0]]
        assert [r.first_sn for r in got] == sorted(r.first_sn for r in got)

    run(tmp_path, body)


def test_fragments_of_a_missing_stream_or_partition_is_empty(tmp_path):
    async def body(meta: MetaStore) -> None:
        assert await index.fragments(meta, "no-such-stream", 0) == []
        assert await index.fragments(meta, STREAM, 0) == []
        assert await index.read_state(meta, "no-such-stream", 0) is None

    run(tmp_path, body)


def test_set_verified_at_the_known_version(tmp_path):
    async def body(meta: MetaStore) -> None:
        await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + 4 * U), {}, None, "a", 1)
        known = await index.read_state(meta, STREAM, 0)
        await index.set_verified(meta, STREAM, 0, known, S0 + 4 * U)
        state, version = await index.read_state(meta, STREAM, 0) or (None, None)
        assert state == ArchiveState(archived_sn=S0 + 4 * U, verified_sn=S0 + 4 * U, writer="a", written_ms=1)
        assert version == 1
        # with the version it had before: refused, nothing changed
        with pytest.raises(BadVersionError):
            await index.set_verified(meta, STREAM, 0, known, S0)
        assert await index.read_state(meta, STREAM, 0) == (state, 1)

    run(tmp_path, body)


def test_set_verified_fails_when_a_fragment_was_added_meanwhile(tmp_path):
    async def body(meta: MetaStore) -> None:
        await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + 4 * U), {}, None, "a", 1)
        known = await index.read_state(meta, STREAM, 0)
        await index.add_fragment(meta, STREAM, 0, ref(S0 + 5 * U, S0 + 9 * U), {}, known, "a", 2)
        with pytest.raises(BadVersionError):
            # (applied, it would move archived_sn back to the first fragment's end)
            await index.set_verified(meta, STREAM, 0, known, S0 + 4 * U)
        state, _ = await index.read_state(meta, STREAM, 0) or (None, None)
        assert (state.archived_sn, state.verified_sn) == (S0 + 9 * U, 0)

    run(tmp_path, body)


def test_set_verified_without_a_state_fails(tmp_path):
    async def body(meta: MetaStore) -> None:
        with pytest.raises(NoNodeError):
            await index.set_verified(meta, STREAM, 0, (ArchiveState(), 0), S0)
        assert await meta.get(ARCHIVE_PARENT) is None

    run(tmp_path, body)


def test_forget_removes_entries(tmp_path):
    async def body(meta: MetaStore) -> None:
        refs = [ref(S0, S0 + 4 * U), ref(S0 + 5 * U, S0 + 9 * U), ref(S0 + 10 * U, S0 + 14 * U)]
        known = None
        for r in refs:
            await index.add_fragment(meta, STREAM, 0, r, {}, known, "a", 1)
            known = await index.read_state(meta, STREAM, 0)
        await index.forget(meta, STREAM, 0, [])                          # nothing: no commit
        assert await index.fragments(meta, STREAM, 0) == refs
        await index.forget(meta, STREAM, 0, refs[:2])
        assert await index.fragments(meta, STREAM, 0) == refs[2:]
        # the state is kept (archived_sn does not move back)
        assert await index.read_state(meta, STREAM, 0) == known
        # forgetting one that is not indexed fails as a whole
        with pytest.raises(NoNodeError):
            await index.forget(meta, STREAM, 0, [refs[2], refs[0]])
        assert await index.fragments(meta, STREAM, 0) == refs[2:]
        await index.forget(meta, STREAM, 0, refs[2:])
        assert await index.fragments(meta, STREAM, 0) == []
        assert await index.read_state(meta, STREAM, 0) == known

    run(tmp_path, body)


def test_after_the_stream_is_deleted_a_first_fragment_fails_and_brings_nothing_back(tmp_path):
    async def body(meta: MetaStore) -> None:
        await meta.create(f"{STREAM_PATH}/map", b"m")
        await meta.delete(STREAM_PATH, recursive=True)
        assert await meta.get(STREAM_PATH) is None
        with pytest.raises(NoNodeError):
            await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + U), {}, None, "node-a", 1)
        assert await meta.get(STREAM_PATH) is None
        assert await meta.get(ARCHIVE_PARENT) is None
        assert STREAM not in await children(meta, "/streams")

    run(tmp_path, body)


def test_a_stream_never_made_gets_no_entry_either(tmp_path):
    async def body(meta: MetaStore) -> None:
        with pytest.raises(NoNodeError):
            await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + U), {}, None, "node-a", 1)
        assert await meta.get("/streams") is None
        assert await meta.get(STREAM_PATH) is None

    run(tmp_path, body, stream=False)


def test_a_stream_deleted_between_the_read_and_the_commit_brings_nothing_back(tmp_path):
    """The Check in the first fragment's commit: the stream vanishes after add_fragment
    read it (another client deletes it meanwhile), and the commit fails as a whole."""

    class DeletingStore(EmbeddedMetaStore):
        async def get_strict(self, path: str):
            entry = await super().get_strict(path)
            if path == STREAM_PATH:
                await self.delete(STREAM_PATH, recursive=True)
            return entry

    async def main() -> None:
        async with DeletingStore(str(tmp_path / "meta.lmdb")) as meta:
            await meta.create(STREAM_PATH, b"s")
            with pytest.raises(NoNodeError):
                await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + U), {}, None, "node-a", 1)
            assert await meta.get(STREAM_PATH) is None
            assert await meta.get(ARCHIVE_PARENT) is None
            assert await meta.get(metadata.archive_path(STREAM, 0)) is None

    asyncio.run(main())


def test_a_stream_changed_between_the_read_and_the_commit_indexes_nothing(tmp_path):
    class ChangingStore(EmbeddedMetaStore):
        async def get_strict(self, path: str):
            entry = await super().get_strict(path)
            if path == STREAM_PATH:
                await self.set(STREAM_PATH, b"changed")
            return entry

    async def main() -> None:
        async with ChangingStore(str(tmp_path / "meta.lmdb")) as meta:
            await meta.create(STREAM_PATH, b"s")
            with pytest.raises(BadVersionError):
                await index.add_fragment(meta, STREAM, 0, ref(S0, S0 + U), {}, None, "node-a", 1)
            assert await meta.get(ARCHIVE_PARENT) is None
            assert await index.fragments(meta, STREAM, 0) == []

    asyncio.run(main())
