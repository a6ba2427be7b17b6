"""SMS: chained-replication stream storage with de-duplicated ingestion.

`sms.Client(address)` is the synchronous client and `sms.aio.Client(address)` the
asyncio one; both discover the cluster from any node address. Errors a client can see
are in `sms.errors`; domain types in `sms.types`.
"""

__all__ = ["Client"]


def __getattr__(name):
    if name == "Client":
        from sms.client import Client
        return Client
    raise AttributeError(name)
