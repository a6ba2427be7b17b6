"""The chain manager against a real metadata store (both backends): config changes are
conditional writes, so two control processes that both believe they lead can never
both commit a change to one chain, and a manager that decided on a stale config
commits nothing. No storage processes: nodes are ephemeral registrations made here."""

from __future__ import annotations

import asyncio
import urllib.parse
import uuid
from dataclasses import replace

import pytest

from metastore import reads
from control.admin import ensure_roots
from control.manager import ChainManager
from metastore import Create, Delete, Set, open_metastore
from sms import metadata
from sms.metadata import ChainChange, ChainConfig, StreamConfig
from sms.types import IngestionPolicy, NodeInfo, Persistence, StreamStatus
from tests.zkserver import ZkServer, skip_reason, zk_available

pytestmark = pytest.mark.integration

TEST_TIMEOUT_S = 30.0
CID = "s:0"


@pytest.fixture(scope="module")
def zk_server(tmp_path_factory):
    if not zk_available():
        pytest.skip(skip_reason())
    server = ZkServer(tmp_path_factory.mktemp("zk")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["embedded", "zk"])
def url(request, tmp_path) -> str:
    if request.param == "embedded":
        return "embedded://" + urllib.parse.quote(str(tmp_path / "meta.lmdb"))
    return request.getfixturevalue("zk_server").url(f"/cm-{uuid.uuid4().hex[:8]}")


async def _setup(store, live: list[str], members: tuple[str, ...]) -> None:
    await ensure_roots(store)
    config = StreamConfig(name="s", partitions=1, replication_factor=len(members), persistence=Persistence.DISK,
                          ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24,
                          created_ms=1, status=StreamStatus.ACTIVE)
    await store.create(metadata.stream_path("s"), config.to_bytes())
    chain = ChainConfig(chain_id=CID, stream="s", ordinal=0, epoch=1, members=members,
                        persistence=Persistence.DISK, incarnations=tuple((n, 100) for n in members),
                        history=(ChainChange(1, 1, "created", members[0], "test"),))
    await store.create(metadata.chain_path(CID), chain.to_bytes())
    for n in live:
        info = NodeInfo(node_id=n, address="127.0.0.1:1", roles=("storage",), pid=1, started_ms=100)
        await store.create(metadata.node_path(n), metadata.node_to_bytes(info), ephemeral=True)


async def _chain(store) -> ChainConfig:
    return ChainConfig.from_bytes((await store.get(metadata.chain_path(CID))).value)


def test_two_leaders_commit_one_change(url):
    async def body():
        async with open_metastore(url) as a, open_metastore(url) as b:
            await _setup(a, live=["n2", "n3"], members=("n1", "n2", "n3"))
            changed = await asyncio.gather(ChainManager(a).round(), ChainManager(b).round())
            chain = await _chain(a)
            assert chain.members == ("n2", "n3") and chain.epoch == 2, chain
            removals = [h for h in chain.history if h.action == "removed"]
            assert [h.node for h in removals] == ["n1"], chain.history
            assert sum(changed) >= 1
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


def test_a_decision_on_a_stale_config_commits_nothing(url):
    async def body():
        async with open_metastore(url) as a, open_metastore(url) as b:
            await _setup(a, live=["n2", "n3"], members=("n1", "n2", "n3"))
            deposed, leader = ChainManager(a), ChainManager(b)
            stale = await deposed._chains()                 # read before the other leader acts
            assert await leader.round() == 1
            assert await deposed.round(stale) == 0          # decides on what it read earlier
            chain = await _chain(a)
            assert chain.epoch == 2 and chain.members == ("n2", "n3")
            assert [h.action for h in chain.history].count("removed") == 1
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


def test_chain_configs_are_read_again_only_after_chains_changes(url):
    """reads.ChainConfigs: a second call without a change reads nothing; a write that
    touches /chains (as every writer of a chain config does) is seen on the next call,
    and a config whose bytes did not change is not decoded again (the same object)."""
    async def body():
        async with open_metastore(url) as store:
            await _setup(store, live=["n1", "n2"], members=("n1", "n2"))
            configs = reads.ChainConfigs(store)
            try:
                first = await configs.all()
                assert list(first) == [CID] and configs.reads == 1
                assert (await configs.all()) == first and configs.reads == 1      # nothing changed: no read
                other = replace(first[CID][0], chain_id="s:1", ordinal=1)
                await store.commit([Create(metadata.chain_path("s:1"), other.to_bytes()),
                                    Set(metadata.CHAINS, b"1")])
                await wait_until_async(lambda: configs._stale, TEST_TIMEOUT_S, "the /chains watch fired")
                second = await configs.all()
                assert sorted(second) == [CID, "s:1"] and configs.reads == 2
                assert second[CID][0] is first[CID][0]                            # not decoded again
                assert second["s:1"][0] == other
            finally:
                configs.close()
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


def test_a_change_note_on_chains_reads_only_the_chains_it_names(url):
    """reads.ChainConfigs with `metadata.chains_note`: a commit whose note is the next
    version is read by the chains it names (created, changed, deleted); two commits
    between reads, or a /chains value that names nothing (an older writer), or a change
    that did not set /chains, cost a full read."""
    async def body():
        async with open_metastore(url) as store:
            await _setup(store, live=["n1", "n2"], members=("n1", "n2"))
            configs = reads.ChainConfigs(store)

            async def after(ops) -> dict:
                configs._stale = False
                await store.commit(ops)
                await wait_until_async(lambda: configs._stale, TEST_TIMEOUT_S, "the /chains watch fired")
                return await configs.all()
            try:
                first = await configs.all()
                base = first[CID][0]
                one = replace(base, chain_id="s:1", ordinal=1)
                got = await after([Create(metadata.chain_path("s:1"), one.to_bytes()),
                                   Set(metadata.CHAINS, metadata.chains_note(["s:1"]))])
                assert sorted(got) == [CID, "s:1"] and (configs.reads, configs.partial_reads) == (1, 1)
                moved = replace(one, epoch=2)
                got = await after([Set(metadata.chain_path("s:1"), moved.to_bytes()),
                                   Set(metadata.CHAINS, metadata.chains_note(["s:1"]))])
                assert got["s:1"][0] == moved and got[CID][0] is base and configs.partial_reads == 2
                got = await after([Delete(metadata.chain_path("s:1")), Set(metadata.CHAINS, metadata.chains_note(["s:1"]))])
                assert list(got) == [CID] and (configs.reads, configs.partial_reads) == (1, 3)
                # two commits before a read: the first note would be missed, so all are read
                await store.commit([Create(metadata.chain_path("s:2"), replace(base, chain_id="s:2").to_bytes()),
                                    Set(metadata.CHAINS, metadata.chains_note(["s:2"]))])
                got = await after([Create(metadata.chain_path("s:3"), replace(base, chain_id="s:3").to_bytes()),
                                   Set(metadata.CHAINS, metadata.chains_note(["s:3"]))])
                assert sorted(got) == [CID, "s:2", "s:3"] and configs.reads == 2
                # an older writer's value names nothing; a change without a note: full reads
                got = await after([Delete(metadata.chain_path("s:3")), Set(metadata.CHAINS, b"1700000000000")])
                assert sorted(got) == [CID, "s:2"] and configs.reads == 3
                got = await after([Delete(metadata.chain_path("s:2"))])
                assert sorted(got) == [CID] and configs.reads == 4
            finally:
                configs.close()
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


async def wait_until_async(predicate, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
