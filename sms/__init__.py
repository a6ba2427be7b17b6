"""SMS: chained-replication stream storage with de-duplicated ingestion.

`sms.Client(address)` is the synchronous client and `sms.aio.Client(address)` the
asyncio one; both discover the cluster from any node address. Errors a client can see
are in `sms.errors`; domain types in `sms.types`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sms.client import Client

__all__ = ["Client"]


def __getattr__(name: str) -> type[Client]:
    if name == "Client":
        from sms.client import Client
        return Client
    raise AttributeError(name)
