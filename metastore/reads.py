"""Reads of cluster state that several parts share: plain reads, and `ChainConfigs`, the
chain configs kept in memory and read again only when they change."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from metastore import MetaStore, NoNodeError
from sms import limits, metadata
from sms.metadata import ChainConfig
from sms.types import NodeInfo


async def entries(store: MetaStore, path: str) -> list[tuple[str, bytes, int]]:
    """(name, value, version) of each child of `path` ([] when there is no `path`)."""
    try:
        names = await store.children(path)
    except NoNodeError:
        return []
    out = []
    for name in names:
        entry = await store.get(f"{path}/{name}")
        if entry is not None:
            out.append((name, entry.value, entry.version))
    return out


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


async def chain_load(store: MetaStore, *, configs: "ChainConfigs | None" = None) -> tuple[Counter, Counter]:
    """(replicas, heads) per node, for placement: replicas of every chain (a closed
    partition's log still takes room), heads of unsealed ones only (a sealed or closed
    partition takes no writes, so its head does no ingestion). The chain manager counts
    them the same way when it rebalances (control/manager.py). `configs`: a cache to read
    them from instead of the store."""
    chains = ([c for c, _v in (await configs.all()).values()] if configs is not None
              else await all_chains(store))
    return load_of(chains)


def load_of(chains) -> tuple[Counter, Counter]:
    """(replicas, heads) per node of these chain configs (see chain_load)."""
    replicas, heads = Counter(), Counter()
    for chain in chains:
        replicas.update(chain.members)
        if not chain.sealed:
            heads[chain.handoff or chain.head] += 1     # a handoff under way: counted as done
    return replicas, heads


async def all_chains(store: MetaStore) -> list[ChainConfig]:
    """Every chain config, read now."""
    try:
        names = await store.children(metadata.CHAINS)
    except NoNodeError:
        return []
    out = []
    for name in names:
        entry = await store.get(metadata.chain_path(name))
        if entry is not None and entry.value:
            out.append(ChainConfig.from_bytes(entry.value))
    return out


class DecodedReads:
    """Reads of metadata values, each decoded once per value: a read whose bytes are those
    the last read of the same path returned gives back the object decoded then (a bytes
    compare, not a JSON decode). `retain` drops what is no longer read."""

    def __init__(self, store: MetaStore):
        self.store = store
        self._known: dict[str, tuple[bytes, object]] = {}

    async def get(self, path: str, decode: Callable[[bytes], object]) -> tuple[object, int] | None:
        """(decoded value, version) of the entry at `path`, or None if it is absent or empty."""
        entry = await self.store.get(path)
        if entry is None or not entry.value:
            self._known.pop(path, None)
            return None
        known = self._known.get(path)
        if known is None or known[0] != entry.value:
            known = self._known[path] = (entry.value, decode(entry.value))
        return known[1], entry.version

    def retain(self, keep: Callable[[str], bool]) -> None:
        self._known = {path: v for path, v in self._known.items() if keep(path)}

    def __len__(self) -> int:
        return len(self._known)


class ChainConfigs:
    """Every chain config, by chain id, with the version it was read at.

    Each writer of a chain config also sets /chains in the same commit (the chain manager,
    the admin, the repartitioner), so a watch on /chains says when something changed: only
    then (or after CHAIN_CONFIGS_FULL_READ_S, a safety net) are the configs read again, and
    a config whose bytes are those read last time is not decoded again. An idle cluster
    then costs no reads and no JSON, however many chains it has.

    What /chains is set to says what changed (`metadata.chains_note`: the chain ids of
    that commit). When its version is exactly one past the version seen at the last
    read, only those chains are read again, so a change costs reads in proportion to it,
    not to the cluster. Anything else is a full read: a version further on (changes were
    missed), a value that names no ids, or a watch that fired with no new version (a
    change that did not set /chains)."""

    def __init__(self, store: MetaStore):
        self.store = store
        self._reads = DecodedReads(store)
        self._configs: dict[str, tuple[ChainConfig, int]] = {}
        self._version: int | None = None    # /chains version the configs were read at
        self._stale = True
        self._read_at = float("-inf")
        self._cancel: Callable[[], None] | None = store.watch(metadata.CHAINS, self.invalidate)
        self.reads = 0                      # full reads so far (for tests and the curious)
        self.partial_reads = 0              # reads of just the chains a note named
        self.generation = 0                 # rises whenever what all() returns changes

    def invalidate(self) -> None:
        self._stale = True

    def close(self) -> None:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None

    async def all(self) -> dict[str, tuple[ChainConfig, int]]:
        """chain id -> (config, version), read again if anything changed since the last read."""
        now = time.monotonic()
        full_due = now - self._read_at >= limits.CHAIN_CONFIGS_FULL_READ_S
        if not (self._stale or full_due):
            return dict(self._configs)
        self._stale = False                 # (before reading: a change during the read marks it again)
        note = await self.store.get(metadata.CHAINS)
        changed = metadata.parse_chains_note(note.value) if note is not None else None
        if (not full_due and changed is not None and self._version is not None
                and note.version == self._version + 1):
            await self._read_some(changed)
            self.partial_reads += 1
        else:
            await self._read_all()
            self._read_at = now
            self.reads += 1
        self._version = note.version if note is not None else None
        return dict(self._configs)

    async def _read_some(self, changed: list[str]) -> None:
        """Read again the chains a note named (created, changed or deleted)."""
        gone = set()
        for cid in changed:
            got = await self._reads.get(metadata.chain_path(cid), ChainConfig.from_bytes)
            if got is None:
                if self._configs.pop(cid, None) is not None:
                    self.generation += 1
                gone.add(metadata.chain_path(cid))
            elif self._configs.get(cid) != got:
                self._configs[cid] = got
                self.generation += 1
        if gone:
            self._reads.retain(lambda path: path not in gone)

    async def _read_all(self) -> None:
        try:
            names = await self.store.children(metadata.CHAINS)
        except NoNodeError:
            names = []
        configs = {}
        for name in names:
            got = await self._reads.get(metadata.chain_path(name), ChainConfig.from_bytes)
            if got is not None:
                configs[name] = got
        self._reads.retain(lambda path: path.rpartition("/")[2] in configs)
        if {cid: v for cid, (_c, v) in configs.items()} != {cid: v for cid, (_c, v) in self._configs.items()}:
            self.generation += 1
        self._configs = configs


async def draining(store: MetaStore) -> frozenset[str]:
    """Storage nodes being emptied (`sms node drain`): they keep serving, take no new replica."""
    try:
        return frozenset(await store.children(metadata.DRAINING))
    except NoNodeError:
        return frozenset()
