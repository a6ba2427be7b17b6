"""A tenant's caps on what it holds (its TenantConfig; 0: no cap), so that one tenant
cannot fill the shared disks or take every partition:

- `streams_max`: streams it may have;
- `partitions_max`: open partitions over all its streams (creations, splits, scales and
  auto-splits count);
- `retention_hours_max`: how long its records may be kept. A stream's retention may not
  exceed it (a stream created without a retention gets the smaller of the default and
  the cap), and what `protect_unread` keeps for unread consumers is deleted past it
  (StreamConfig.unread_hold_max_s, kernel/retention.py).

Checked by the control node that makes the change, under its admin lock. Two changes
made at the same moment through different control nodes may pass a cap by one of them;
a cap lowered below what a tenant holds keeps what it has and refuses more (as Kinesis's
shard limits do). Lowering `retention_hours_max` shortens its streams' retention at once.
"""

from __future__ import annotations

import dataclasses
import logging

from metastore import BadVersionError, MetaStore
from sms import limits, metadata
from sms.errors import TenantLimitExceeded, TenantNotFound
from sms.metadata import DEFAULT_TENANT, StreamConfig, TenantConfig
from sms.partition_map import PartitionMap

log = logging.getLogger(__name__)


async def tenant_config(store: MetaStore, tenant: str) -> TenantConfig:
    if tenant == DEFAULT_TENANT:
        return TenantConfig()
    entry = await store.get(metadata.tenant_path(tenant))
    if entry is None or TenantConfig.from_bytes(entry.value).deleting:
        raise TenantNotFound(f"no tenant {tenant!r}")
    return TenantConfig.from_bytes(entry.value)


async def _streams_of(store: MetaStore, tenant: str) -> list[str]:
    return [s for s in await store.children(metadata.STREAMS) if metadata.tenant_of(s) == tenant]


async def open_partitions(store: MetaStore, tenant: str, but: str = "") -> int:
    """The open partitions of the tenant's streams (`but`: leaving that stream out)."""
    total = 0
    for name in await _streams_of(store, tenant):
        if name == but:
            continue
        entry = await store.get(metadata.map_path(name))
        if entry is not None:
            total += len(PartitionMap.from_bytes(entry.value).open_entries())
    return total


def _retention_s(config: StreamConfig) -> int:
    return config.retention_ms // 1000


async def admit_stream(store: MetaStore, config: StreamConfig, retention_given: bool) -> StreamConfig:
    """The new stream's config within its tenant's caps, or TenantLimitExceeded."""
    tenant = metadata.tenant_of(config.name)
    caps = await tenant_config(store, tenant)
    if caps.streams_max and len(await _streams_of(store, tenant)) >= caps.streams_max:
        raise TenantLimitExceeded(f"tenant {tenant!r} has {caps.streams_max} streams, its cap (streams_max)")
    if caps.partitions_max:
        held = await open_partitions(store, tenant)
        if held + config.partitions > caps.partitions_max:
            raise TenantLimitExceeded(f"tenant {tenant!r} holds {held} open partitions; {config.partitions} more "
                                      f"would pass its cap of {caps.partitions_max} (partitions_max)")
    return within_retention(config, caps, tenant, retention_given)


def within_retention(config: StreamConfig, caps: TenantConfig, tenant: str, given: bool = True) -> StreamConfig:
    """`config` with its unread hold set from the tenant's retention cap; a retention
    over the cap is TenantLimitExceeded (`given`), or lowered to it (a default)."""
    if not caps.retention_hours_max:
        return dataclasses.replace(config, unread_hold_max_s=0)
    cap_s = caps.retention_hours_max * 3600
    if _retention_s(config) > cap_s:
        if given:
            raise TenantLimitExceeded(f"retention {_retention_s(config)} s for stream {config.name!r}; tenant "
                                      f"{tenant!r} keeps records at most {caps.retention_hours_max} h "
                                      "(retention_hours_max)")
        config = dataclasses.replace(config, retention_hours=caps.retention_hours_max, retention_s=0)
    return dataclasses.replace(config, unread_hold_max_s=cap_s)


async def admit_open_partitions(store: MetaStore, name: str, opened_after: int) -> None:
    """TenantLimitExceeded when the stream's tenant would hold more open partitions than
    its cap once the stream has `opened_after` of them."""
    tenant = metadata.tenant_of(name)
    caps = await tenant_config(store, tenant)
    entry = await store.get(metadata.map_path(name))
    opened_now = len(PartitionMap.from_bytes(entry.value).open_entries()) if entry is not None else 0
    if caps.partitions_max and opened_after > opened_now:     # (fewer is always allowed: back under a cap)
        held = await open_partitions(store, tenant, but=name)
        if held + opened_after > caps.partitions_max:
            raise TenantLimitExceeded(f"tenant {tenant!r}: stream {name!r} with {opened_after} open partitions "
                                      f"would take it to {held + opened_after}, past its cap of "
                                      f"{caps.partitions_max} (partitions_max)")


async def apply_retention_cap(store: MetaStore, tenant: str, caps: TenantConfig) -> list[str]:
    """Bring every stream of the tenant within its retention cap (a new cap, just set);
    the names of the streams changed."""
    changed = []
    for name in await _streams_of(store, tenant):
        for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
            entry = await store.get(metadata.stream_path(name))
            if entry is None:
                break
            config = StreamConfig.from_bytes(entry.value)
            new = within_retention(config, caps, tenant, given=False)
            if new == config:
                break
            try:
                await store.set(metadata.stream_path(name), new.to_bytes(), entry.version)
            except BadVersionError:
                continue
            changed.append(name)
            log.info("tenant %s: stream %s brought within its retention cap of %d h", tenant, name,
                     caps.retention_hours_max)
            break
    return changed
