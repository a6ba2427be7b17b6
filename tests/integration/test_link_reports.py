"""The chain manager's handling of unresponsive-link reports (control/manager.py), against a
real (embedded) metadata store. No storage processes: nodes are ephemeral registrations
made here, reports are written under /suspects as StorageNode.link_unresponsive writes them,
and the manager's NodeStatus probe (`control.manager._answers`) is replaced by a table of
which nodes answer. Checked: the end that does not answer leaves the reported chain (and
only that chain), else the link's successor; neither answering, nobody; a report of an
older epoch changes nothing; a chain's last member never leaves; the node stays out of the
chain for LINK_REMOVAL_INTERVAL_S (no learner there), and the link removes nobody else; a
link the reporter heard again since its report (a stall that is over) takes nobody out."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from dataclasses import replace

import pytest

from control import manager as manager_module
from control.admin import ensure_roots
from control.manager import ChainManager
from kernel import rpc
from metastore import open_metastore
from sms import metadata
from sms.metadata import ChainChange, ChainConfig, StreamConfig
from sms.types import IngestionPolicy, NodeInfo, Persistence, StreamStatus

pytestmark = pytest.mark.integration

TEST_TIMEOUT_S = 30.0


def _address(node: str) -> str:
    return f"127.0.0.1:{10_000 + int(node[1:])}"


async def _setup(store, live: list[str], chains: dict[str, tuple[str, ...]], rf: int = 3) -> None:
    await ensure_roots(store)
    config = StreamConfig(name="s", partitions=len(chains), replication_factor=rf, persistence=Persistence.DISK,
                          ingestion_policy=IngestionPolicy.AT_LEAST_ONCE_NO_DUP, retention_hours=24,
                          created_ms=1, status=StreamStatus.ACTIVE)
    await store.create(metadata.stream_path("s"), config.to_bytes())
    for ordinal, (cid, members) in enumerate(chains.items()):
        chain = ChainConfig(chain_id=cid, stream="s", ordinal=ordinal, epoch=1, members=members,
                            persistence=Persistence.DISK, incarnations=tuple((n, 100) for n in members),
                            history=(ChainChange(1, 1, "created", members[0], "test"),))
        await store.create(metadata.chain_path(cid), chain.to_bytes())
    for n in live:
        info = NodeInfo(node_id=n, address=_address(n), roles=("storage",), pid=1, started_ms=100)
        await store.create(metadata.node_path(n), metadata.node_to_bytes(info), ephemeral=True)


async def _report(store, reporter: str, peer: str, direction: str, links: list[tuple[str, int]], n: int = 1) -> None:
    report = {"kind": "unresponsive", "reporter": reporter, "peer": peer, "direction": direction,
              "links": [{"chain_id": cid, "epoch": epoch} for cid, epoch in links], "reason": "test silence",
              "at_ms": 1}
    await store.create(metadata.suspect_path(f"{peer}~{reporter}~{n}"), json.dumps(report).encode())


async def _chain(store, cid: str) -> ChainConfig:
    return ChainConfig.from_bytes((await store.get(metadata.chain_path(cid))).value)


@pytest.fixture
def url(tmp_path) -> str:
    return "embedded://" + urllib.parse.quote(str(tmp_path / "meta.lmdb"))


async def _settled(manager: ChainManager, cid: str, epoch: int) -> None:
    """Until the manager's view of the chain configs (refreshed by its watch of /chains)
    has the chain at `epoch`: its next round decides on what the last one wrote."""
    for _ in range(int(TEST_TIMEOUT_S / 0.02)):
        if any(c.chain_id == cid and c.epoch == epoch for c, _v in await manager._chains()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the manager never saw {cid} at epoch {epoch}")


def run(body) -> None:
    asyncio.run(asyncio.wait_for(body(), TEST_TIMEOUT_S))


def test_the_end_that_does_not_answer_leaves_only_the_reported_chain(url, monkeypatch):
    probed: list[str] = []

    async def answers(_node_channels, address: str, *_channels) -> bool:
        probed.append(address)
        return address != _address("n2")               # n2 is paused
    monkeypatch.setattr(manager_module, "_answers", answers)

    async def body():
        async with open_metastore(url) as store:
            await _setup(store, ["n1", "n2", "n3", "n4"], {"s:0": ("n1", "n2", "n3"), "s:1": ("n2", "n3", "n4")})
            # n3 heard nothing from its predecessor n2 in s:0
            await _report(store, "n3", "n2", "predecessor", [("s:0", 1)])
            manager = ChainManager(store)
            await manager.round()
            await _settled(manager, "s:0", 2)
            await manager.round()            # (the next round restores the factor)
            s0, s1 = await _chain(store, "s:0"), await _chain(store, "s:1")
            assert s0.members == ("n1", "n3") and s0.epoch == 2 and s0.learners == ("n4",), s0
            removed = [c for c in s0.history if c.action == "removed"]
            assert [c.node for c in removed] == ["n2"] and "unresponsive" in removed[0].reason \
                and "n2 did not answer" in removed[0].reason, removed
            assert s1.members == ("n2", "n3", "n4") and s1.epoch == 1          # not reported: untouched
            assert sorted(probed) == sorted([_address("n2"), _address("n3")])
            assert not await store.children(metadata.SUSPECTS)                # looked at, deleted
    run(body)


@pytest.mark.parametrize("direction,reporter,peer", [("successor", "n1", "n2"), ("predecessor", "n2", "n1")])
def test_both_ends_answer_the_successor_leaves(url, monkeypatch, direction, reporter, peer):
    async def answers(_node_channels, address: str, *_channels) -> bool:
        return True
    monkeypatch.setattr(manager_module, "_answers", answers)
    monkeypatch.setattr(manager_module, "_status", _links_heard({}))        # the reporter hears nothing

    async def body():
        async with open_metastore(url) as store:
            await _setup(store, ["n1", "n2", "n3"], {"s:0": ("n1", "n2", "n3")})
            await _report(store, reporter, peer, direction, [("s:0", 1)])
            manager = ChainManager(store)
            await manager.round()
            s0 = await _chain(store, "s:0")
            assert s0.members == ("n1", "n3") and s0.epoch == 2, s0
            assert "the successor leaves" in [c for c in s0.history if c.action == "removed"][0].reason
            # n2 stays out of the chain for LINK_REMOVAL_INTERVAL_S: the only other live node,
            # it is not taken back as a learner meanwhile
            await _settled(manager, "s:0", 2)
            await manager.round()
            assert (await _chain(store, "s:0")).learners == ()
            # and within LINK_REMOVAL_INTERVAL_S no second member leaves (a minority of the
            # chain's three at most): n3 reports its new predecessor n1 silent too
            await _report(store, "n3", "n1", "predecessor", [("s:0", 2)], n=2)
            await manager.round()
            assert (await _chain(store, "s:0")).members == ("n1", "n3")
    run(body)


def _links_heard(heard_ago_s: dict[str, float]):
    """A `control.manager._status` whose node heard each peer named so many seconds ago."""
    async def status(_node_channels, address: str, *_channels) -> rpc.NodeReport:
        return rpc.NodeReport(replicas=(), peers_heard_ago_s=tuple((p, False, ago) for p, ago in heard_ago_s.items()))
    return status


def test_a_link_heard_again_after_the_report_takes_nobody_out(url, monkeypatch):
    """Both ends answer, and the reporter heard from the peer since the report (the peer
    stalled a moment on a loaded machine, then acked again): nobody leaves. Heard only
    before the report: the successor leaves."""
    async def answers(_node_channels, address: str, *_channels) -> bool:
        return True
    monkeypatch.setattr(manager_module, "_answers", answers)

    async def body():
        async with open_metastore(url) as store:
            await _setup(store, ["n1", "n2", "n3"], {"s:0": ("n1", "n2", "n3")})
            manager = ChainManager(store)
            monkeypatch.setattr(manager_module, "_status", _links_heard({"n2": 0.01, "n3": 5.0}))
            await _report(store, "n1", "n2", "successor", [("s:0", 1)], n=1)
            await manager.round()
            assert (await _chain(store, "s:0")).epoch == 1
            manager._recovered.clear()
            monkeypatch.setattr(manager_module, "_status", _links_heard({"n2": 30.0}))
            await _report(store, "n1", "n2", "successor", [("s:0", 1)], n=2)
            await manager.round()
            assert (await _chain(store, "s:0")).members == ("n1", "n3")
    run(body)


def test_reports_the_manager_cannot_act_on_change_nothing(url, monkeypatch):
    """Neither end answers; a report of an older epoch; a link that is not the chain's: no
    change. Then a report it can act on does change the chain (the set-up would act)."""
    answering = {"n1", "n2", "n3"}

    async def answers(_node_channels, address: str, *_channels) -> bool:
        return any(address == _address(n) for n in answering)
    monkeypatch.setattr(manager_module, "_answers", answers)
    monkeypatch.setattr(manager_module, "_status", _links_heard({}))

    async def body():
        async with open_metastore(url) as store:
            await _setup(store, ["n1", "n2", "n3"], {"s:0": ("n1", "n2", "n3")})
            manager = ChainManager(store)
            answering.clear()
            await _report(store, "n1", "n2", "successor", [("s:0", 1)], n=1)      # nobody answers
            await manager.round()
            answering.update({"n1", "n2", "n3"})
            manager._probed.clear()
            await _report(store, "n1", "n2", "successor", [("s:0", 0)], n=2)      # epoch 0: gone since
            await _report(store, "n1", "n3", "successor", [("s:0", 1)], n=3)      # n1 does not ship to n3
            await manager.round()
            assert (await _chain(store, "s:0")).epoch == 1
            await _report(store, "n1", "n2", "successor", [("s:0", 1)], n=4)
            await manager.round()
            assert (await _chain(store, "s:0")).members == ("n1", "n3")
    run(body)


def test_the_last_member_never_leaves(url, monkeypatch):
    async def answers(_node_channels, address: str, *_channels) -> bool:
        return address != _address("n1")
    monkeypatch.setattr(manager_module, "_answers", answers)

    async def body():
        async with open_metastore(url) as store:
            # a chain of one member, copying to a learner: the member n1 does not answer the
            # manager, but it is the last member (the learner n2 stays too: it is fed by n1);
            # in a chain of two, n1 leaves
            await _setup(store, ["n1", "n2"], {"s:0": ("n1",), "s:1": ("n2", "n1")}, rf=2)
            config = await _chain(store, "s:0")
            await store.set(metadata.chain_path("s:0"), replace(config, learners=("n2",)).to_bytes())
            await _report(store, "n2", "n1", "predecessor", [("s:0", 1)], n=1)
            await _report(store, "n2", "n1", "successor", [("s:1", 1)], n=2)
            await ChainManager(store).round()
            after = await _chain(store, "s:0")
            assert after.members == ("n1",) and after.epoch == 1, after
            assert (await _chain(store, "s:1")).members == ("n2",)
    run(body)
