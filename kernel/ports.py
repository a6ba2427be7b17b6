"""In-process ports: how co-located roles call each other.

One rule (docs/architecture.md, "Layout"): a role never imports another role's package.
When two roles share a process, `node/server.py` hands the caller an object of the
protocol below, implemented by the callee; across processes the same calls go over
gRPC. Ingestion reaches its own node's chain heads through `HeadPort`; retrieval reads
its own node's replicas through `ReplicaReads`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol


class BatchSliceLike(Protocol):
    """Records [start, end) of one stored batch (storage.log.BatchSlice)."""
    batch: bytes
    start: int
    end: int

    def sn_at(self, index: int) -> int: ...


class CommittedLog(Protocol):
    """One replica held by this process, as readers see it: only committed records."""

    @property
    def committed_sn(self) -> int: ...

    @property
    def trimmed_before(self) -> int: ...

    @property
    def local_first_sn(self) -> int: ...

    @property
    def stored_first_sn(self) -> int: ...

    async def wait_committed(self, sn: int, timeout_s: float) -> bool: ...

    def read(self, from_sn: int, upto_sn: int, max_records: int, max_bytes: int) -> Sequence[BatchSliceLike]: ...


class ReplicaReads(Protocol):
    def committed_log(self, chain_id: str) -> CommittedLog:
        """The replica of `chain_id` held here; raises WrongOwner when there is none."""
        ...


class AckLike(Protocol):
    batch_id: int
    first_sn: int
    count: int
    error_name: str
    error_message: str


class HeadSessionPort(Protocol):
    """An append session with a chain head (storage.head.HeadSession)."""

    async def append(self, chain_id: str, epoch: int, batch_id: int, batch: bytes) -> None: ...

    def acks(self) -> AsyncIterator[AckLike]: ...

    def end(self) -> None: ...


HeadPort = Callable[[], HeadSessionPort]       # opens a session with this process's chain heads
