"""The asyncio client: `sms.aio.Client(address)`.

It discovers the cluster from any one node address (DescribeCluster), caches each
stream's map (DescribeStream) and routes every record to the ingestion owner of its
partition; records answered with a "refresh your map" error (WrongOwner,
PartitionClosed, Unavailable) are re-routed transparently after a refresh, with a
bounded number of attempts. Reads go to a replica of the iterator's partition; if that
node fails, another member of the chain is tried.

`Client` is a facade over five parts, each a module of this package and each building on
the ones before it: `transport` (options, channels, discovery, the calls the others make),
`admin`, `reads` (with payloads by reference), `writes`, `groups` (consumer groups) and
`queues`.
"""

from __future__ import annotations

from sms.aio.admin import TENANT_LIMITS
from sms.aio.channels import Channels
from sms.aio.writes import _encode_puts

__all__ = ["TENANT_LIMITS", "Client", "_encode_puts"]


class Client(Channels):
    """A client of the cluster at `address` ("host:port[,host:port...]", any nodes).

    TLS (docs/security.md): `ca_file` is the cluster CA's certificate to trust, and
    `cert_file`/`key_file` an optional client certificate to present. Without `ca_file`
    the client reads $SMS_CA_FILE ($SMS_CERT_FILE, $SMS_KEY_FILE); with neither, or with
    `ca_file=""`, it speaks plaintext (a cluster started with `sms up --insecure`).
    `token`: the token of a key (`sms key create`; default $SMS_TOKEN), sent with every
    call over TLS, never over plaintext.
    `Client.from_cluster_file(path)` takes all of it from `sms up`'s DIR/cluster.json.

    Errors are `sms.errors` classes (`SmsError`). Besides those each method names, any
    call may raise Unavailable (no node answered, or no control leader), Timeout,
    TlsHandshakeFailed, Unauthenticated or PermissionDenied (the key's role or streams),
    and Throttled (a tenant or stream limit)."""
