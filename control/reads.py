"""Reads of cluster state that several control parts share (no caching: each call reads)."""

from __future__ import annotations

from collections import Counter

from control.metastore import MetaStore, NoNodeError
from sms import metadata
from sms.metadata import ChainConfig
from sms.types import NodeInfo


async def live_storage(store: MetaStore) -> dict[str, NodeInfo]:
    """The registered processes with the storage role, by node id."""
    try:
        names = await store.children(metadata.NODES)
    except NoNodeError:
        return {}
    out = {}
    for name in names:
        entry = await store.get(metadata.node_path(name))
        if entry is not None and entry.value:
            info = metadata.node_from_bytes(entry.value)
            if "storage" in info.roles:
                out[name] = info
    return out


async def chain_load(store: MetaStore, *, sealed: bool = True) -> tuple[Counter, Counter]:
    """(replicas, heads) per node over every chain config, for placement; `sealed=False`
    leaves out sealed chains (closed partitions take no writes: they weigh little)."""
    replicas, heads = Counter(), Counter()
    try:
        names = await store.children(metadata.CHAINS)
    except NoNodeError:
        names = []
    for name in names:
        entry = await store.get(metadata.chain_path(name))
        if entry is not None and entry.value:
            chain = ChainConfig.from_bytes(entry.value)
            if sealed or not chain.sealed:
                replicas.update(chain.members)
                heads[chain.head] += 1
    return replicas, heads
