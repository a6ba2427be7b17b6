"""Each tenant's throughput limits over all its partitions (its entry under /tenants), as
an even share per live node of the role that serves them: writes on the ingestion nodes,
reads on the retrieval nodes. A token bucket per tenant on each node is refilled at
limit / (live nodes of that role). A tenant's load spread over the nodes meets its
limit; one on fewer nodes is held below it (the price of needing no coordination).

The limits are re-read every TENANT_LIMITS_REFRESH_S. If the store does not answer, the
last ones read stay in force; a tenant never read is refused with Unavailable (fail
closed), and one that does not exist with PermissionDenied.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from metastore import MetaStoreError
from metastore.view import ClusterView
from sms import limits
from sms.errors import PermissionDenied, Throttled, Unavailable
from sms.metadata import DEFAULT_TENANT, TenantConfig, tenant_path
from kernel.ratelimit import PartitionLimits, TokenBucket


class TenantShares:
    def __init__(self, view: ClusterView):
        self.view = view
        self._read: dict[str, tuple[float, TenantConfig]] = {}
        self._writes: dict[str, PartitionLimits] = {}       # tenant -> this node's share of its write limits
        self._reads: dict[str, TokenBucket] = {}            # tenant -> this node's share of its read limit

    async def config(self, tenant: str, now: float) -> TenantConfig:
        if tenant == DEFAULT_TENANT:
            return TenantConfig()
        cached = self._read.get(tenant)
        if cached is not None and now - cached[0] <= limits.TENANT_LIMITS_REFRESH_S:
            return cached[1]
        try:
            async with asyncio.timeout(limits.METADATA_READ_WAIT_S):
                entry = await self.view.store.get(tenant_path(tenant))
        except (TimeoutError, MetaStoreError):
            if cached is not None:
                return cached[1]          # (the last limits read stay in force)
            raise Unavailable(f"tenant {tenant}: its limits cannot be read now; retry") from None
        if entry is None:
            raise PermissionDenied(f"tenant {tenant} does not exist")
        config = TenantConfig.from_bytes(entry.value)
        if len(self._read) >= limits.TENANTS_MAX:
            self._read.clear()
        self._read[tenant] = (now, config)
        return config

    async def _nodes(self, role: str) -> int:
        return max(1, sum(1 for n in (await self.view.nodes()).values() if role in n.roles))

    async def writes_unlimited(self, tenant: str) -> bool:
        """True when the tenant has no write limit (every request is admitted whole)."""
        config = await self.config(tenant, time.monotonic())
        return not (config.write_records_per_s or config.write_bytes_per_s)

    async def admit_write(self, tenant: str, records: Sequence[tuple[int, Any]]) -> tuple[int, Throttled | None]:
        """How many of a request's records (a prefix; each `(hash key, submission)` with
        `key` and `data`) the tenant's write share here admits, and the error of the rest
        (None when all are admitted)."""
        now = time.monotonic()
        config = await self.config(tenant, now)
        if not (config.write_records_per_s or config.write_bytes_per_s):
            return len(records), None
        nodes = await self._nodes("ingestion")
        share = self._writes[tenant] = PartitionLimits.kept(
            self._writes.get(tenant), -(-config.write_records_per_s // nodes), -(-config.write_bytes_per_s // nodes),
            limits.PARTITION_LIMIT_BURST_S, now)
        sizes = [len(sub.key) + len(sub.data) for _h, sub in records] if config.write_bytes_per_s \
            else [0] * len(records)
        admitted, wait_s = share.admit(sizes, now)
        if admitted == len(records):
            return admitted, None
        return admitted, share.throttled(wait_s, f"tenant {tenant} (its share on each of {nodes} nodes)")

    async def read_share(self, tenant: str) -> TokenBucket | None:
        """This node's bucket of the tenant's read limit in bytes/s (None: it has none).
        A read waits it out of debt (`wait_out`), then is charged its bytes after."""
        now = time.monotonic()
        config = await self.config(tenant, now)
        if not config.read_bytes_per_s:
            return None
        rate = -(-config.read_bytes_per_s // await self._nodes("retrieval"))
        bucket = self._reads.get(tenant)
        if bucket is None or bucket.rate != rate:
            if len(self._reads) >= limits.TENANTS_MAX:
                self._reads.clear()
            bucket = self._reads[tenant] = TokenBucket(rate, limits.PARTITION_LIMIT_BURST_S, now)
        return bucket


async def wait_out(bucket: TokenBucket, what: str, deadline: float) -> None:
    """Wait until `bucket` is out of debt; Throttled (naming `what`) when that would pass
    `deadline`. Looked at again after each wait: readers that waited together must not
    all read at once."""
    now = time.monotonic()
    while (wait := bucket.wait(now)) > 0:
        if now + wait > deadline:
            ms = max(1, round(wait * 1000))
            raise Throttled(f"{what}: over its read limit of {round(bucket.rate)} bytes/s; retry in {ms} ms",
                            retry_after_ms=ms)
        await asyncio.sleep(wait)
        now = time.monotonic()
