"""Credentials and tenants (issue 15 items 3-4; docs/security.md), checked by the guard
on a TLS node's client port (node/tls.py).

A key is `/keys/<key id>` in the metadata store: its tenant, its role (`admin`,
`producer`, `consumer`, or `monitor`: Prometheus's, for /metrics in node/metrics.py),
optionally the streams it is limited to, and the SHA-256 of its secret. The secret
itself is shown once, when the key is created, inside its token `sms_<key id>_<secret>`;
the store never holds it. (Secrets are 256 random bits, so one SHA-256 is enough; a slow
password hash is for secrets people choose.)

Every client call carries the token as `authorization: Bearer <token>`. A missing,
malformed, unknown, revoked or wrong token gets `Unauthenticated`; a valid one without
the right (`RIGHTS`, `ROLE_RIGHTS`) gets `PermissionDenied`, which names neither the
key's streams nor whether the stream asked for exists. A node trusts what it read of a
key for KEY_CACHE_TTL_S (`KeyTable`), and `revoke_key` answers that long after the
deletion, so a revoked key works nowhere once the revocation returns.

A tenant's stream "orders" is stored as "<tenant>~orders" (the default tenant's as
"orders"): `scope_request` rewrites the names of each call and its answer, so a tenant
sees only its own streams, under its own names.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import dataclasses
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from control import quotas
from metastore import BadVersionError, Create, MetaStore, MetaStoreError, NodeExistsError, NoNodeError
from sms import limits, metadata, tokens
from sms.security import aws_credentials
from kernel import rpc
from kernel.aiotools import raise_if_cancelling
from sms.errors import (FailedPrecondition, InvalidArgument, InvalidIterator, KeyNotFound, PermissionDenied, SmsError,
                        TenantNotFound, Unauthenticated, Unavailable)

log = logging.getLogger(__name__)

ROLES = ("admin", "producer", "consumer", "monitor")
DEFAULT_TENANT = "default"
TOKEN_PREFIX = "sms_"
KEY_ID_HEX = 16
AUTH_HEADER = "authorization"

# rights, and the roles that hold them
DESCRIBE, READ, WRITE, ADMIN = "describe", "read", "write", "admin"
CLUSTER = "cluster"     # the cluster's own state (nodes, every tenant's replicas): admins of the default tenant
METRICS = "metrics"     # a node's /metrics (node/metrics.py), which names every tenant's streams: the default
                        # tenant's monitor and admin keys, not limited to streams; no gRPC call needs it
ROLE_RIGHTS = {"admin": {DESCRIBE, READ, WRITE, ADMIN, METRICS}, "producer": {DESCRIBE, WRITE},
               "consumer": {DESCRIBE, READ}, "monitor": {METRICS}}


# --- tenants: each sees its own streams, under its own names --------------------------
# The principal of the call being served (set by the guard, node/tls.py): the key
# management calls read it. None on a plaintext cluster (no keys): the default admin.
CURRENT: contextvars.ContextVar["Principal | None"] = contextvars.ContextVar("sms_principal", default=None)


def qualify(tenant: str, name: str) -> str:
    """The stored name of a tenant's stream ("default": the name itself)."""
    return name if tenant == DEFAULT_TENANT else f"{tenant}{metadata.TENANT_SEP}{name}"


tenant_of = metadata.tenant_of
tenant_path = metadata.tenant_path


def unqualify(stored: str) -> str:
    return stored.partition(metadata.TENANT_SEP)[2] or stored


def validate_tenant(name: object) -> str:
    if (not isinstance(name, str) or not 1 <= len(name) <= limits.TENANT_NAME_CHARS_MAX
            or not all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in name)):
        raise InvalidArgument(f"tenant name {str(name)[:60]!r}; expected [a-z0-9-]{{1,{limits.TENANT_NAME_CHARS_MAX}}}")
    return name


# the calls that name a stream in a field, rewritten to its stored name
STREAM_FIELDS = {
    "/sms.v1.Control/CreateStream": "name", "/sms.v1.Control/DeleteStream": "name",
    "/sms.v1.Control/UpdateStream": "name", "/sms.v1.Control/RepartitionStream": "name",
    "/sms.v1.Control/TrimStream": "name", "/sms.v1.Control/DescribeStream": "name",
    "/sms.v1.Control/UpdateConsumer": "stream", "/sms.v1.Ingestion/PutRecords": "stream",
    "/sms.v1.Retrieval/GetIterator": "stream", "/sms.v1.Retrieval/GetRecord": "stream",
    "/sms.v1.Control/GroupState": "stream", "/sms.v1.Control/GroupWrite": "stream",
    "/sms.v1.Control/ListGroups": "stream", "/sms.v1.Control/ResetGroup": "stream",
    "/sms.v1.Control/DeleteGroup": "stream", "/sms.v1.Control/InitProducer": "stream",
    "/sms.v1.Control/CreateQueue": "stream", "/sms.v1.Control/CreateChannel": "stream",
}
# the calls that name a queue (control/queues.py) or a channel (control/channels.py) in a
# field, rewritten to its stored name: (the field, what it names, its longest name)
NAMED_FIELDS = {
    **{f"/sms.v1.Control/{op}Queue": ("name", "queue", limits.QUEUE_NAME_CHARS_MAX)
       for op in ("Create", "Describe", "Update", "Delete")},
    "/sms.v1.Queues/Receive": ("queue", "queue", limits.QUEUE_NAME_CHARS_MAX),
    "/sms.v1.Queues/Settle": ("queue", "queue", limits.QUEUE_NAME_CHARS_MAX),
    **{f"/sms.v1.Control/{op}Channel": ("name", "channel", limits.CHANNEL_NAME_CHARS_MAX)
       for op in ("Create", "Describe", "Update", "Delete")},
}
# the calls whose answer describes a queue or a channel, shown without the prefix, and the
# lists of them (their answer's repeated field)
NAMED_ANSWERS = tuple(f"/sms.v1.Control/{op}{kind}" for kind in ("Queue", "Channel")
                      for op in ("Create", "Describe", "Update"))
NAMED_LISTS = {"/sms.v1.Control/ListQueues": "queues", "/sms.v1.Control/ListChannels": "channels"}
ITERATOR_CALLS = ("/sms.v1.Retrieval/GetNextRecords", "/sms.v1.Retrieval/Subscribe")
DESCRIPTION_CALLS = ("/sms.v1.Control/CreateStream", "/sms.v1.Control/DescribeStream",
                     "/sms.v1.Control/UpdateStream", "/sms.v1.Control/RepartitionStream")
LIST_STREAMS = "/sms.v1.Control/ListStreams"
PUT_RECORDS = "/sms.v1.Ingestion/PutRecords"       # its answer names each failed record's error


def scope_request(principal: "Principal", method: str, request):
    """Put the call in the caller's tenant: the stream it names becomes the stored name
    (a name with the separator is refused), an iterator of another tenant's stream is
    refused as invalid, and the answer's names are shown without the prefix, as are its
    error messages (kernel/rpc.py for_caller). Returns the function to apply to a unary
    answer, or None."""
    if principal.tenant != DEFAULT_TENANT:
        rpc.CALLER_PREFIX.set(qualify(principal.tenant, ""))
    field = STREAM_FIELDS.get(method)
    named = NAMED_FIELDS.get(method)
    if named is not None:
        named_field, what, chars = named
        name = getattr(request, named_field)
        if not isinstance(name, str) or metadata.TENANT_SEP in name:
            raise InvalidArgument(f"{what} name {str(name)[:80]!r}; expected [a-zA-Z0-9_.-]{{1,{chars}}}")
        setattr(request, named_field, qualify(principal.tenant, name))
    if method in NAMED_LISTS and request.stream:
        metadata.validate_stream_name(request.stream, stored=False)
        request.stream = qualify(principal.tenant, request.stream)
    if field is not None:
        name = getattr(request, field)
        metadata.validate_stream_name(name, stored=False)
        setattr(request, field, qualify(principal.tenant, name))
    elif method in ITERATOR_CALLS:
        try:
            stream = tokens.peek(request.iterator).stream
        except SmsError:
            return None            # (malformed: the handler names it)
        if tenant_of(stream) != principal.tenant:
            raise InvalidIterator("not an iterator of a stream of this tenant")
    if method in DESCRIPTION_CALLS:
        def shown(answer):
            answer.name = unqualify(answer.name)
            return answer
        return shown
    if method == PUT_RECORDS:
        def shown_errors(answer):
            for error in answer.errors:
                error.message = rpc.for_caller(error.message)
            return answer
        return shown_errors
    if method in NAMED_ANSWERS:
        return _named_shown
    if method in NAMED_LISTS:
        def listed(answer):
            items = getattr(answer, NAMED_LISTS[method])
            kept = [x for x in items if principal.sees(unqualify(x.stream))]
            del items[:]
            items.extend(_named_shown(x) for x in kept)
            return answer
        return listed
    if method == LIST_STREAMS:
        return lambda answer: type(answer)(names=[unqualify(n) for n in answer.names
                                                  if tenant_of(n) == principal.tenant
                                                  and principal.sees(unqualify(n))])
    return None


def _named_shown(answer):
    """A queue's or channel's description as its tenant names it."""
    answer.name = unqualify(answer.name)
    answer.stream = unqualify(answer.stream)
    return answer


# method -> the right it needs (a method not here needs ADMIN)
RIGHTS: dict[str, str] = {
    "/sms.v1.Control/CreateStream": ADMIN, "/sms.v1.Control/DeleteStream": ADMIN,
    "/sms.v1.Control/UpdateStream": ADMIN, "/sms.v1.Control/RepartitionStream": ADMIN,
    "/sms.v1.Control/TrimStream": ADMIN,
    "/sms.v1.Control/CreateKey": ADMIN, "/sms.v1.Control/ListKeys": ADMIN, "/sms.v1.Control/RevokeKey": ADMIN,
    "/sms.v1.Control/ListNodes": CLUSTER, "/sms.v1.Control/DrainNode": CLUSTER,
    "/sms.v1.Control/RemoveNode": CLUSTER, "/sms.v1.Control/NodeStatus": CLUSTER,
    "/sms.v1.Control/RewrapDataKeys": CLUSTER,
    "/sms.v1.Control/CreateTenant": CLUSTER, "/sms.v1.Control/ListTenants": CLUSTER,
    "/sms.v1.Control/DeleteTenant": CLUSTER, "/sms.v1.Control/UpdateTenant": CLUSTER,
    "/sms.v1.Control/RevokeCertificate": CLUSTER, "/sms.v1.Control/ListRevokedCertificates": CLUSTER,
    "/sms.v1.Control/ReadAudit": CLUSTER,         # (every tenant's events: kernel/audit.py)
    "/sms.v1.Ingestion/IngestionStatus": CLUSTER,
    "/sms.v1.Control/DescribeStream": DESCRIBE, "/sms.v1.Control/ListStreams": DESCRIBE,
    "/sms.v1.Control/DescribeCluster": DESCRIBE,
    "/sms.v1.Control/UpdateConsumer": READ, "/sms.v1.Retrieval/GetIterator": READ,
    "/sms.v1.Control/GroupState": READ, "/sms.v1.Control/GroupWrite": READ, "/sms.v1.Control/ListGroups": DESCRIBE,
    "/sms.v1.Retrieval/GetNextRecords": READ, "/sms.v1.Retrieval/Subscribe": READ, "/sms.v1.Retrieval/GetRecord": READ,
    "/sms.v1.Ingestion/PutRecords": WRITE, "/sms.v1.Control/InitProducer": WRITE,
    "/sms.v1.Control/CreateQueue": ADMIN, "/sms.v1.Control/UpdateQueue": ADMIN, "/sms.v1.Control/DeleteQueue": ADMIN,
    "/sms.v1.Control/DescribeQueue": DESCRIBE, "/sms.v1.Control/ListQueues": DESCRIBE,
    "/sms.v1.Queues/Receive": READ, "/sms.v1.Queues/Settle": READ,
    "/sms.v1.Control/CreateChannel": ADMIN, "/sms.v1.Control/UpdateChannel": ADMIN,
    "/sms.v1.Control/DeleteChannel": ADMIN,
    "/sms.v1.Control/DescribeChannel": DESCRIBE, "/sms.v1.Control/ListChannels": DESCRIBE,
}


def _stream_named(method: str, request) -> str | None:
    """The stream a call is about, as its caller names it (None: no one stream)."""
    field = STREAM_FIELDS.get(method)
    if field is not None:
        return getattr(request, field)
    if method in ITERATOR_CALLS:
        try:
            return unqualify(tokens.peek(request.iterator).stream)
        except SmsError:
            return ""           # a malformed iterator: the handler names the error
    return None


@dataclass(frozen=True)
class KeyEntry:
    key_id: str
    tenant: str
    role: str
    streams: tuple[str, ...]          # () = every stream of the tenant
    sha256: str                       # of the secret, hex
    created_ms: int
    name: str = ""
    sigv4: str = ""                   # the key's AWS secret access key, wrapped by a master key ("": none)

    def to_bytes(self) -> bytes:
        d = {"tenant": self.tenant, "role": self.role, "streams": list(self.streams), "sha256": self.sha256,
             "created_ms": self.created_ms, "name": self.name}
        if self.sigv4:
            d["sigv4"] = self.sigv4
        return json.dumps(d).encode()

    @classmethod
    def from_bytes(cls, key_id: str, raw: bytes) -> "KeyEntry":
        d = json.loads(raw)
        return cls(key_id=key_id, tenant=d["tenant"], role=d["role"], streams=tuple(d.get("streams") or ()),
                   sha256=d["sha256"], created_ms=d["created_ms"], name=d.get("name", ""), sigv4=d.get("sigv4", ""))


def sigv4_aad(key_id: str) -> str:
    """What a wrapped AWS secret is bound to (no stream's stored name can be it): a wrapped
    secret cannot be moved to another key, nor taken for a stream's data key."""
    return f"\x00sigv4:{key_id}"


def wrap_sigv4(master_keys, token: str) -> str:
    """The key's AWS secret access key (sms.security.aws_credentials) wrapped by the current
    master key; "" when this node has none (the key then has no Kinesis access)."""
    if master_keys is None or not master_keys.current:
        return ""
    key_id, secret = aws_credentials(token)
    return master_keys.wrap(sigv4_aad(key_id), secret.encode())


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant: str
    role: str
    streams: tuple[str, ...]

    def allows(self, right: str, stream: str | None) -> bool:
        if self.streams and stream is None and right in (ADMIN, CLUSTER, METRICS):
            return False        # a key limited to streams manages no keys, tenants or nodes, nor sees every stream
        if right == METRICS and self.tenant != DEFAULT_TENANT:
            return False        # (every tenant's streams by name)
        if right == CLUSTER:
            return self.role == "admin" and self.tenant == DEFAULT_TENANT
        if right not in ROLE_RIGHTS[self.role]:
            return False
        return not (self.streams and stream is not None and stream not in self.streams)

    def sees(self, stream: str) -> bool:
        return not self.streams or stream in self.streams


def key_path(key_id: str) -> str:
    return f"{metadata.KEYS}/{key_id}"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """(key id, token) of a new key."""
    key_id = secrets.token_hex(KEY_ID_HEX // 2)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return key_id, f"{TOKEN_PREFIX}{key_id}_{secret}"


def parse_token(token: str) -> tuple[str, str]:
    """(key id, secret) of a token, or Unauthenticated for one of no valid form."""
    if not token.startswith(TOKEN_PREFIX):
        raise Unauthenticated("malformed credential: a token starts with 'sms_'")
    key_id, sep, secret = token[len(TOKEN_PREFIX):].partition("_")
    if (not sep or not is_key_id(key_id) or not secret or len(token) > limits.AUTH_TOKEN_CHARS_MAX
            or not secret.isascii() or not secret.replace("-", "").replace("_", "").isalnum()):
        raise Unauthenticated("malformed credential: expected sms_<key id>_<secret>")
    return key_id, secret


# --- delegated calls: a node calling the cluster on a key's behalf ----------------------------
# The Kinesis endpoint (kinesis/) verifies a request's signature, then makes the same gRPC
# calls a native client would, as the key that signed it: with a short-lived token that any
# node with the cluster's master keys verifies, for the key it names. Every check of the
# receiving node then applies to the key (rights, its streams, its tenant, revocation,
# quotas), as if the key's holder had called.
DELEGATED_PREFIX = "smsd."
_DELEGATION_LABEL = b"sms: calls made on a key's behalf"


def _delegation_mac(master: bytes, body: str) -> str:
    secret = hmac.new(master, _DELEGATION_LABEL, hashlib.sha256).digest()
    return hmac.new(secret, body.encode(), hashlib.sha256).hexdigest()[:32]


def delegate(master_keys, key_id: str, now_s: float | None = None) -> str:
    """A token for calls on behalf of `key_id`, valid KEY_DELEGATION_TTL_S, signed with the
    current master key. InvalidArgument without a master key."""
    if master_keys is None or not master_keys.current:
        raise InvalidArgument("calls on a key's behalf need the cluster's master key on this node")
    now_s = time.time() if now_s is None else now_s
    body = f"{key_id}.{int((now_s + limits.KEY_DELEGATION_TTL_S) * 1000)}"
    return f"{DELEGATED_PREFIX}{body}.{_delegation_mac(master_keys.keys[master_keys.current], body)}." \
           f"{master_keys.current}"


def delegated_key(master_keys, token: str, now_s: float | None = None) -> str:
    """The key a delegated token speaks for; Unauthenticated for one that is malformed,
    expired, or not signed by a master key of this node."""
    parts = token[len(DELEGATED_PREFIX):].split(".", 3)
    if len(parts) != 4 or not is_key_id(parts[0]) or not parts[1].isdigit() or len(token) > limits.AUTH_TOKEN_CHARS_MAX:
        raise Unauthenticated("malformed delegated credential")
    key_id, expiry, mac, master_id = parts
    master = (master_keys.keys if master_keys is not None else {}).get(master_id)
    if master is None or not hmac.compare_digest(mac, _delegation_mac(master, f"{key_id}.{expiry}")):
        raise Unauthenticated("a delegated credential this node cannot verify")
    now_s = time.time() if now_s is None else now_s
    if int(expiry) < now_s * 1000:
        raise Unauthenticated("a delegated credential that expired")
    return key_id


def is_key_id(text: str) -> bool:
    return len(text) == KEY_ID_HEX and all(c in "0123456789abcdef" for c in text)


def validate_key_request(role: str, streams: list[str], tenant: str = DEFAULT_TENANT) -> tuple[str, tuple[str, ...]]:
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r}; expected one of {', '.join(ROLES)}")
    if role == "monitor" and (streams or tenant != DEFAULT_TENANT):
        raise InvalidArgument("a monitor key belongs to the default tenant and is not limited to streams: "
                              "the metrics it reads name every tenant's streams")
    if len(streams) > limits.KEY_STREAMS_MAX:
        raise InvalidArgument(f"{len(streams)} streams for one key; at most {limits.KEY_STREAMS_MAX}")
    return role, tuple(metadata.validate_stream_name(s, stored=False) for s in streams)


def acting_tenant(wanted: str) -> str:
    """The tenant a key call acts on: the caller's own; an admin of the default tenant
    (the cluster's administrators) may name another."""
    caller = CURRENT.get()
    own = caller.tenant if caller is not None else DEFAULT_TENANT
    if not wanted or wanted == own:
        return own
    if own != DEFAULT_TENANT:
        raise PermissionDenied("only an admin of the default tenant acts on other tenants")
    return validate_tenant(wanted)


def tenant_scope() -> str | None:
    """The tenant whose keys the caller manages; None: every tenant's (an admin of the
    default tenant, or a plaintext cluster)."""
    own = acting_tenant("")
    return None if own == DEFAULT_TENANT else own


def require_cluster_admin() -> None:
    caller = CURRENT.get()
    if caller is not None and caller.tenant != DEFAULT_TENANT:
        raise PermissionDenied("only an admin of the default tenant manages tenants")


async def create_tenant(store: MetaStore, name: str) -> None:
    require_cluster_admin()
    validate_tenant(name)
    if name == DEFAULT_TENANT:
        raise InvalidArgument("the default tenant always exists")
    if len(await store.children(metadata.TENANTS)) >= limits.TENANTS_MAX:
        raise InvalidArgument(f"at most {limits.TENANTS_MAX} tenants")
    try:
        await store.create(tenant_path(name), metadata.TenantConfig(created_ms=int(time.time() * 1000)).to_bytes())
    except NodeExistsError:
        raise FailedPrecondition(f"tenant {name!r} exists") from None


async def list_tenants(store: MetaStore) -> list[tuple[str, metadata.TenantConfig]]:
    require_cluster_admin()
    out = [(DEFAULT_TENANT, metadata.TenantConfig())]
    for name in sorted(await store.children(metadata.TENANTS)):
        entry = await store.get(tenant_path(name))
        if entry is not None:
            out.append((name, metadata.TenantConfig.from_bytes(entry.value)))
    return out


_TENANT_LIMIT_MAX = {"write_records_per_s": limits.TENANT_WRITE_RECORDS_PER_S_MAX,
                     "write_bytes_per_s": limits.TENANT_BYTES_PER_S_MAX,
                     "read_bytes_per_s": limits.TENANT_BYTES_PER_S_MAX,
                     "streams_max": limits.TENANT_STREAMS_MAX,
                     "partitions_max": limits.TENANT_PARTITIONS_MAX,
                     "retention_hours_max": limits.RETENTION_HOURS_MAX}


async def update_tenant(store: MetaStore, name: str, **wanted: int) -> metadata.TenantConfig:
    """Change a tenant's limits (metadata.TenantConfig.LIMITS; -1: unchanged, 0: none).
    A new retention cap shortens its streams' retention at once (control/quotas.py)."""
    require_cluster_admin()
    validate_tenant(name)
    changes = {}
    for field, value in wanted.items():
        if field not in _TENANT_LIMIT_MAX:
            raise InvalidArgument(f"no tenant limit {field!r}; expected one of {', '.join(_TENANT_LIMIT_MAX)}")
        most = _TENANT_LIMIT_MAX[field]
        if value == -1:
            continue
        if not 0 <= value <= most:
            raise InvalidArgument(f"{field} {value}; expected 0 (no limit) .. {most}, or -1 (unchanged)")
        changes[field] = value
    for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
        entry = await store.get(tenant_path(name))
        if entry is None:
            raise TenantNotFound(f"no tenant {name!r}" + (" (the default tenant has no limits)"
                                                          if name == DEFAULT_TENANT else ""))
        config = dataclasses.replace(metadata.TenantConfig.from_bytes(entry.value), **changes)
        try:
            await store.set(tenant_path(name), config.to_bytes(), entry.version)
        except BadVersionError:
            continue
        if "retention_hours_max" in changes:
            await quotas.apply_retention_cap(store, name, config)
        return config
    raise Unavailable(f"tenant {name!r} changes too often; retry")


async def delete_tenant(store: MetaStore, name: str) -> None:
    """Refused while the tenant has streams; its keys go with it (revoked as by
    revoke_key)."""
    require_cluster_admin()
    validate_tenant(name)
    if name == DEFAULT_TENANT:
        raise InvalidArgument("the default tenant cannot be deleted")
    entry = await store.get(tenant_path(name))
    if entry is None:
        raise TenantNotFound(f"no tenant {name!r}")
    config = metadata.TenantConfig.from_bytes(entry.value)
    # first marked: from here no stream or key is made in it (control/admin.py, create_key)
    await store.set(tenant_path(name), dataclasses.replace(config, deleting=True).to_bytes(), entry.version)
    held = [s for s in await store.children(metadata.STREAMS) if tenant_of(s) == name]
    if held:
        await store.set(tenant_path(name), config.to_bytes())        # (not deleted after all)
        raise FailedPrecondition(f"tenant {name!r} has {len(held)} streams; delete them first")
    revoked = False
    for key_id in await store.children(metadata.KEYS):           # every key of it, with no cap
        key = await store.get(key_path(key_id))
        if key is not None and KeyEntry.from_bytes(key_id, key.value).tenant == name:
            try:
                await store.delete(key_path(key_id))
                revoked = True
            except NoNodeError:
                pass
    await store.delete(tenant_path(name))
    if revoked:          # (as revoke_key: once this returns, no node admits its keys)
        await asyncio.sleep(limits.KEY_CACHE_TTL_S)


async def create_key(store: MetaStore, role: str, streams: list[str], name: str = "",
                     tenant: str = DEFAULT_TENANT, token: str | None = None,
                     master_keys=None) -> tuple[KeyEntry, str]:
    """A new key in the store; (its entry, its token). `token`: a given one (a cluster's
    bootstrap admin key). The tenant must exist. With `master_keys`, the entry keeps the
    key's AWS secret access key wrapped (the Kinesis endpoint's SigV4)."""
    role, scoped = validate_key_request(role, streams, tenant)
    if tenant != DEFAULT_TENANT:
        entry = await store.get(tenant_path(validate_tenant(tenant)))
        if entry is None or metadata.TenantConfig.from_bytes(entry.value).deleting:
            raise TenantNotFound(f"no tenant {tenant!r} (sms tenant create)")
    if token is None and len(await list_keys(store, tenant)) >= limits.KEYS_PER_TENANT_MAX:
        raise InvalidArgument(f"tenant {tenant!r} has {limits.KEYS_PER_TENANT_MAX} keys already; revoke some")
    if len(name) > limits.KEY_NAME_CHARS_MAX:
        raise InvalidArgument(f"a key name of {len(name)} characters; at most {limits.KEY_NAME_CHARS_MAX}")
    if token is None:
        key_id, token = new_token()
    else:
        key_id = parse_token(token)[0]
    _id, secret = parse_token(token)
    entry = KeyEntry(key_id=key_id, tenant=tenant, role=role, streams=scoped, sha256=hash_secret(secret),
                     created_ms=int(time.time() * 1000), name=name, sigv4=wrap_sigv4(master_keys, token))
    await store.create(key_path(key_id), entry.to_bytes())
    return entry, token


# the rights a node grants on a key's last good verdict while it cannot read the metadata
# store (for at most KEY_STALE_MAX_S): the data calls. Any other call (keys, streams,
# tenants, nodes) needs a verdict younger than KEY_CACHE_TTL_S, or gets Unavailable.
STALE_RIGHTS = frozenset({DESCRIBE, READ, WRITE})


def may_use_stale(method: str) -> bool:
    """Whether a call may be admitted on a key's stale verdict (STALE_RIGHTS)."""
    return RIGHTS.get(method, ADMIN) in STALE_RIGHTS


@dataclass(frozen=True, slots=True)
class _Verdict:
    outcome: "Principal | SmsError"     # the key's principal, or the error that refuses it
    read_s: float                       # (KeyTable.clock) when the read that produced it began


class KeyTable:
    """A node's verdicts on keys, each from a read of the metadata store.

    - A verdict is trusted for KEY_CACHE_TTL_S from the moment the read that produced it
      began (a read that begins after a revocation sees it). From half that age a call
      that uses it starts a read in the background, so a steady client never waits.
      Older, it is read again before the call is admitted: one read per token at a time,
      shared by the calls that wait for it.
    - `revoke_key` answers KEY_CACHE_TTL_S after the key is deleted: by then every
      verdict that admitted it has run out, on every node.
    - A node that cannot read the key (no answer within METADATA_READ_WAIT_S, or a store
      error) refuses the call with the retriable Unavailable: it fails closed. Only data
      calls (`stale_ok`, STALE_RIGHTS) are admitted on the key's last good verdict while
      it is younger than KEY_STALE_MAX_S, and while the last read failed they are
      admitted at once (a read goes on in the background), so a moment without the store
      stops no producer or consumer. A key revoked meanwhile keeps writing and reading
      on such a node until a read succeeds, at most KEY_STALE_MAX_S.
    - A malformed token is refused without a read and without a trace here.

    `clock`: monotonic seconds (tests give their own)."""

    # reads one call waits for: one under way when it came (it may have begun too long
    # ago), then one of its own; a read slower than KEY_CACHE_TTL_S confirms nothing
    READS_PER_CALL_MAX = 2

    def __init__(self, store: MetaStore, *, clock: Callable[[], float] = time.monotonic, master_keys=None):
        self.store = store
        self.clock = clock
        self.master_keys = master_keys        # verifies delegated tokens (calls made on a key's behalf)
        # token -> verdict of keys that exist, and apart (so that callers without a key
        # cannot push the good ones out) of those that do not
        self._known: dict[str, _Verdict] = {}
        self._refused: dict[str, _Verdict] = {}
        self._reads: dict[str, asyncio.Task[bool]] = {}      # the read of each token under way
        self.unreachable = False      # the last read failed: the store does not answer this node

    async def authenticate(self, token: str, *, stale_ok: bool = False) -> Principal:
        """The key's principal, or the named error (Unauthenticated; Unavailable when the
        key cannot be confirmed). `stale_ok`: a data call (see the class docstring)."""
        if not token:
            raise Unauthenticated("no credential: give a key's token (token=, --token or $SMS_TOKEN)")
        secret: str | None
        if token.startswith(DELEGATED_PREFIX):
            key_id, secret = delegated_key(self.master_keys, token), None
        else:
            key_id, secret = parse_token(token)
        if stale_ok and self.unreachable:
            stale = self._stale(token)
            if stale is not None:
                self._read_soon(token, key_id, secret)
                return stale
        deadline = asyncio.get_running_loop().time() + limits.METADATA_READ_WAIT_S
        reads = 0
        while (verdict := self._trusted(token, key_id, secret)) is None and reads < self.READS_PER_CALL_MAX:
            reads += 1
            if not await self._read(token, key_id, secret, deadline):
                break
        if verdict is not None:
            if isinstance(verdict.outcome, Principal):
                return verdict.outcome
            raise type(verdict.outcome)(verdict.outcome.message)
        stale = self._stale(token) if stale_ok else None
        if stale is not None:
            return stale
        raise Unavailable("credentials cannot be checked now: the metadata store does not answer this node in "
                          "time; retry, or try another node")

    def _trusted(self, token: str, key_id: str, secret: str | None) -> _Verdict | None:
        """The token's verdict if it is younger than KEY_CACHE_TTL_S (from half that age
        on, read again in the background)."""
        verdict = self._known.get(token) or self._refused.get(token)
        if verdict is None:
            return None
        age = self.clock() - verdict.read_s
        if age >= limits.KEY_CACHE_TTL_S:
            return None
        if age >= limits.KEY_CACHE_TTL_S / 2 and isinstance(verdict.outcome, Principal):
            self._read_soon(token, key_id, secret)
        return verdict

    def _stale(self, token: str) -> Principal | None:
        """The token's last good verdict, if younger than KEY_STALE_MAX_S."""
        known = self._known.get(token)
        if known is None or self.clock() - known.read_s >= limits.KEY_STALE_MAX_S:
            return None
        assert isinstance(known.outcome, Principal)
        return known.outcome

    async def _read(self, token: str, key_id: str, secret: str | None, deadline: float) -> bool:
        """Waits (until `deadline`, loop time) for a read of the token: the one under way,
        else a new one. False if the store could not be read in time."""
        task = self._reads.get(token) or self._start_read(token, key_id, secret)
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(task)
        except TimeoutError:
            return False

    def _read_soon(self, token: str, key_id: str, secret: str | None) -> None:
        if token not in self._reads:
            self._start_read(token, key_id, secret)

    def _start_read(self, token: str, key_id: str, secret: str | None) -> asyncio.Task[bool]:
        task = asyncio.get_running_loop().create_task(self._read_now(token, key_id, secret), name="key-read")
        self._reads[token] = task

        def done(finished: asyncio.Task[bool]) -> None:
            if self._reads.get(token) is finished:
                del self._reads[token]
        task.add_done_callback(done)
        return task

    async def _read_now(self, token: str, key_id: str, secret: str | None) -> bool:
        """One read of the key: its verdict remembered (True), or the store marked as not
        answering (False). Raises nothing but a cancellation."""
        started = self.clock()
        try:
            async with asyncio.timeout(limits.METADATA_READ_WAIT_S):
                verdict = await self._verdict(key_id, secret)
        except Exception as e:    # (the store's own errors, or one it should not raise: not read either way)
            raise_if_cancelling()
            if not isinstance(e, (TimeoutError, MetaStoreError)):
                log.exception("key %s could not be read", key_id)
            if not self.unreachable:
                log.warning("keys cannot be read from the metadata store (%s): admin calls get Unavailable, "
                            "data calls a key's last verdict for at most %.0f s", type(e).__name__,
                            limits.KEY_STALE_MAX_S)
            self.unreachable = True
            return False
        if self.unreachable:
            log.info("keys are read from the metadata store again")
        self.unreachable = False
        self._remember(token, _Verdict(verdict, started))
        return True

    def _remember(self, token: str, verdict: _Verdict) -> None:
        old = self._known.get(token) or self._refused.get(token)
        if old is not None and old.read_s > verdict.read_s:
            return              # (a read that began before the one already remembered)
        keep, drop = (self._known, self._refused) if isinstance(verdict.outcome, Principal) \
            else (self._refused, self._known)
        drop.pop(token, None)
        if len(keep) >= limits.AUTH_CACHE_ENTRIES_MAX and token not in keep:
            keep.clear()        # (that many distinct tokens: start afresh)
        keep[token] = verdict

    async def _verdict(self, key_id: str, secret: str | None) -> Principal | SmsError:
        entry = await self.store.get(key_path(key_id))
        if entry is None:
            return Unauthenticated("unknown or revoked key")
        try:
            key = KeyEntry.from_bytes(key_id, entry.value)
            if key.role not in ROLES:
                raise ValueError(f"role {key.role!r}")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:   # another version's, or damaged
            log.error("key %s: unreadable entry (%s): refused", key_id, e)
            return Unauthenticated("unknown or revoked key")
        if secret is not None and not hmac.compare_digest(key.sha256, hash_secret(secret)):
            return Unauthenticated("unknown or revoked key")      # (None: a delegated token, verified already)
        return Principal(key_id=key.key_id, tenant=key.tenant, role=key.role, streams=key.streams)


def bearer(invocation_metadata) -> str:
    for key, value in invocation_metadata or ():
        if key == AUTH_HEADER and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):].strip()
    return ""


def check(principal: Principal, method: str, request) -> None:
    """PermissionDenied unless the principal may make this call."""
    right = RIGHTS.get(method, ADMIN)
    stream = _stream_named(method, request)
    if not principal.allows(right, stream):
        raise PermissionDenied(f"key {principal.key_id} ({principal.role}) may not call "
                               f"{method.rsplit('/', 1)[-1]}" + (f" on stream {stream!r}" if stream else ""))


async def list_keys(store: MetaStore, tenant: str | None = None) -> list[KeyEntry]:
    """The keys (of one tenant, when given)."""
    out = []
    for key_id in sorted(await store.children(metadata.KEYS)):
        entry = await store.get(key_path(key_id))
        if entry is not None:
            key = KeyEntry.from_bytes(key_id, entry.value)
            if tenant is None or key.tenant == tenant:
                out.append(key)
        if len(out) >= limits.KEYS_LISTED_MAX:
            break
    return out


async def revoke_key(store: MetaStore, key_id: str, tenant: str | None = None) -> None:
    """Delete the key (only one of `tenant`, when given: another's is not found), and
    answer KEY_CACHE_TTL_S later: by then every verdict that admitted it has run out
    (KeyTable), so once this returns no node admits the key (one cut off from the store
    only for data calls, KEY_STALE_MAX_S at most)."""
    if not is_key_id(key_id):
        raise InvalidArgument(f"key id {key_id[:40]!r}; expected {KEY_ID_HEX} hex digits (sms key list)")
    if tenant is not None:
        entry = await store.get(key_path(key_id))
        if entry is None or KeyEntry.from_bytes(key_id, entry.value).tenant != tenant:
            raise KeyNotFound(f"no key {key_id}")
    try:
        await store.delete(key_path(key_id))
    except NoNodeError:
        raise KeyNotFound(f"no key {key_id}") from None
    await asyncio.sleep(limits.KEY_CACHE_TTL_S)


async def bootstrap_admin_key(store: MetaStore, token: str, master_keys=None) -> bool:
    """The cluster's first admin key, from a token its launcher chose (`sms up`), created
    once in the cluster's life: a later start does not bring it back once revoked.
    True if it was created now."""
    if await store.get(metadata.CLUSTER_BOOTSTRAPPED) is not None:
        return False
    key_id, secret = parse_token(token)
    entry = KeyEntry(key_id=key_id, tenant=DEFAULT_TENANT, role="admin", streams=(), sha256=hash_secret(secret),
                     created_ms=int(time.time() * 1000), name="bootstrap admin (sms up)",
                     sigv4=wrap_sigv4(master_keys, token))
    try:     # the marker and the key together, or neither (a crash between would leave no admin)
        await store.commit([Create(metadata.CLUSTER_BOOTSTRAPPED, b"1"), Create(key_path(key_id), entry.to_bytes())])
    except NodeExistsError:
        return False              # another control node did it first
    return True
