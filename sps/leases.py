"""The lease table of an SPS stage in the metadata store (ZooKeeper or the embedded
store), below `/sps/stages/<stage>/leases/`: sms/leases.py's LeaseTable over a
MetaStore. (Consumer groups keep theirs through the cluster's API: sms/consumer.py.)
"""

from __future__ import annotations

from metastore import BadVersionError, MetaStore, NodeExistsError, NoNodeError, reads
from sms import leases
from sms.leases import (LATEST, SHARD_END, TRIM_HORIZON, ExpiryClock, Lease, LeaseLost, lease_key,
                        plan_takes)

__all__ = ["LATEST", "SHARD_END", "TRIM_HORIZON", "ExpiryClock", "Lease", "LeaseLost", "LeaseTable", "lease_key",
           "plan_takes", "stage_path", "leases_path", "workers_path"]

SPS_ROOT = "/sps"
STAGES = "/sps/stages"


def stage_path(stage: str) -> str:
    return f"{STAGES}/{stage}"


def leases_path(stage: str) -> str:
    return f"{STAGES}/{stage}/leases"


def workers_path(stage: str) -> str:
    return f"{STAGES}/{stage}/workers"


class MetaStoreLeases:
    """A LeaseStore on the metadata store: one entry per lease below `prefix`."""

    def __init__(self, store: MetaStore, prefix: str):
        self.store = store
        self.prefix = prefix

    async def entries(self) -> list[tuple[str, bytes, int]]:
        return await reads.entries(self.store, self.prefix)

    async def create(self, key: str, value: bytes) -> int:
        try:
            return await self.store.create(f"{self.prefix}/{key}", value)
        except NodeExistsError:
            raise LeaseLost(f"lease {key} exists") from None

    async def set(self, key: str, value: bytes, version: int) -> int:
        try:
            return await self.store.set(f"{self.prefix}/{key}", value, version)
        except (BadVersionError, NoNodeError):
            raise LeaseLost(f"lease {key} changed") from None

    async def delete(self, key: str, version: int) -> None:
        try:
            await self.store.delete(f"{self.prefix}/{key}", version)
        except (BadVersionError, NoNodeError):
            pass


class LeaseTable(leases.LeaseTable):
    """The leases of one stage, in the metadata store."""

    def __init__(self, store: MetaStore, stage: str):
        super().__init__(MetaStoreLeases(store, leases_path(stage)), stage)
        self.stage = stage
