"""Credentials and tenants (issue 15 items 3-4; docs/security.md), checked by the guard
on a TLS node's client port (node/tls.py).

A key is `/keys/<key id>` in the metadata store: its tenant, its role (`admin`,
`producer` or `consumer`), optionally the streams it is limited to, and the SHA-256 of
its secret. The secret itself is shown once, when the key is created, inside its token
`sms_<key id>_<secret>`; the store never holds it. (Secrets are 256 random bits, so one
SHA-256 is enough; a slow password hash is for secrets people choose.)

Every client call carries the token as `authorization: Bearer <token>`. A missing,
malformed, unknown, revoked or wrong token gets `Unauthenticated`; a valid one without
the right (`RIGHTS`, `ROLE_RIGHTS`) gets `PermissionDenied`, which names neither the
key's streams nor whether the stream asked for exists. A node re-reads a key after
KEY_CACHE_TTL_S (`KeyTable`), so a revoked key stops working about that long after.

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
from dataclasses import dataclass

from control import quotas
from metastore import BadVersionError, Create, MetaStore, MetaStoreError, NodeExistsError, NoNodeError
from sms import limits, metadata, rpc, tokens
from sms.aiotools import raise_if_cancelling
from sms.errors import (FailedPrecondition, InvalidArgument, InvalidIterator, KeyNotFound, PermissionDenied, SmsError,
                        TenantNotFound, Unauthenticated, Unavailable)

log = logging.getLogger(__name__)

ROLES = ("admin", "producer", "consumer")
DEFAULT_TENANT = "default"
TOKEN_PREFIX = "sms_"
KEY_ID_HEX = 16
AUTH_HEADER = "authorization"

# rights, and the roles that hold them
DESCRIBE, READ, WRITE, ADMIN = "describe", "read", "write", "admin"
CLUSTER = "cluster"     # the cluster's own state (nodes, every tenant's replicas): admins of the default tenant
ROLE_RIGHTS = {"admin": {DESCRIBE, READ, WRITE, ADMIN}, "producer": {DESCRIBE, WRITE}, "consumer": {DESCRIBE, READ}}


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
}
ITERATOR_CALLS = ("/sms.v1.Retrieval/GetNextRecords", "/sms.v1.Retrieval/Subscribe")
DESCRIPTION_CALLS = ("/sms.v1.Control/CreateStream", "/sms.v1.Control/DescribeStream",
                     "/sms.v1.Control/UpdateStream", "/sms.v1.Control/RepartitionStream")
LIST_STREAMS = "/sms.v1.Control/ListStreams"
PUT_RECORDS = "/sms.v1.Ingestion/PutRecords"       # its answer names each failed record's error


def scope_request(principal: "Principal", method: str, request):
    """Put the call in the caller's tenant: the stream it names becomes the stored name
    (a name with the separator is refused), an iterator of another tenant's stream is
    refused as invalid, and the answer's names are shown without the prefix, as are its
    error messages (sms/rpc.py for_caller). Returns the function to apply to a unary
    answer, or None."""
    if principal.tenant != DEFAULT_TENANT:
        rpc.CALLER_PREFIX.set(qualify(principal.tenant, ""))
    field = STREAM_FIELDS.get(method)
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
    if method == LIST_STREAMS:
        return lambda answer: type(answer)(names=[unqualify(n) for n in answer.names
                                                  if tenant_of(n) == principal.tenant
                                                  and principal.sees(unqualify(n))])
    return None


# method -> the right it needs (a method not here needs ADMIN)
RIGHTS: dict[str, str] = {
    "/sms.v1.Control/CreateStream": ADMIN, "/sms.v1.Control/DeleteStream": ADMIN,
    "/sms.v1.Control/UpdateStream": ADMIN, "/sms.v1.Control/RepartitionStream": ADMIN,
    "/sms.v1.Control/TrimStream": ADMIN,
    "/sms.v1.Control/CreateKey": ADMIN, "/sms.v1.Control/ListKeys": ADMIN, "/sms.v1.Control/RevokeKey": ADMIN,
    "/sms.v1.Control/ListNodes": CLUSTER, "/sms.v1.Control/DrainNode": CLUSTER,
    "/sms.v1.Control/RemoveNode": CLUSTER, "/sms.v1.Control/NodeStatus": CLUSTER,
    "/sms.v1.Control/CreateTenant": CLUSTER, "/sms.v1.Control/ListTenants": CLUSTER,
    "/sms.v1.Control/DeleteTenant": CLUSTER, "/sms.v1.Control/UpdateTenant": CLUSTER,
    "/sms.v1.Control/RevokeCertificate": CLUSTER, "/sms.v1.Control/ListRevokedCertificates": CLUSTER,
    "/sms.v1.Ingestion/IngestionStatus": CLUSTER,
    "/sms.v1.Control/DescribeStream": DESCRIBE, "/sms.v1.Control/ListStreams": DESCRIBE,
    "/sms.v1.Control/DescribeCluster": DESCRIBE,
    "/sms.v1.Control/UpdateConsumer": READ, "/sms.v1.Retrieval/GetIterator": READ,
    "/sms.v1.Control/GroupState": READ, "/sms.v1.Control/GroupWrite": READ, "/sms.v1.Control/ListGroups": DESCRIBE,
    "/sms.v1.Retrieval/GetNextRecords": READ, "/sms.v1.Retrieval/Subscribe": READ, "/sms.v1.Retrieval/GetRecord": READ,
    "/sms.v1.Ingestion/PutRecords": WRITE, "/sms.v1.Control/InitProducer": WRITE,
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

    def to_bytes(self) -> bytes:
        return json.dumps({"tenant": self.tenant, "role": self.role, "streams": list(self.streams),
                           "sha256": self.sha256, "created_ms": self.created_ms, "name": self.name}).encode()

    @classmethod
    def from_bytes(cls, key_id: str, raw: bytes) -> "KeyEntry":
        d = json.loads(raw)
        return cls(key_id=key_id, tenant=d["tenant"], role=d["role"], streams=tuple(d.get("streams") or ()),
                   sha256=d["sha256"], created_ms=d["created_ms"], name=d.get("name", ""))


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant: str
    role: str
    streams: tuple[str, ...]

    def allows(self, right: str, stream: str | None) -> bool:
        if self.streams and stream is None and right in (ADMIN, CLUSTER):
            return False        # a key limited to streams manages no keys, tenants or nodes
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


def is_key_id(text: str) -> bool:
    return len(text) == KEY_ID_HEX and all(c in "0123456789abcdef" for c in text)


def validate_key_request(role: str, streams: list[str]) -> tuple[str, tuple[str, ...]]:
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r}; expected one of {', '.join(ROLES)}")
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
    """Refused while the tenant has streams; its keys go with it."""
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
    for key_id in await store.children(metadata.KEYS):           # every key of it, with no cap
        key = await store.get(key_path(key_id))
        if key is not None and KeyEntry.from_bytes(key_id, key.value).tenant == name:
            try:
                await store.delete(key_path(key_id))
            except NoNodeError:
                pass
    await store.delete(tenant_path(name))


async def create_key(store: MetaStore, role: str, streams: list[str], name: str = "",
                     tenant: str = DEFAULT_TENANT, token: str | None = None) -> tuple[KeyEntry, str]:
    """A new key in the store; (its entry, its token). `token`: a given one (a cluster's
    bootstrap admin key). The tenant must exist."""
    role, scoped = validate_key_request(role, streams)
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
                     created_ms=int(time.time() * 1000), name=name)
    await store.create(key_path(key_id), entry.to_bytes())
    return entry, token


class KeyTable:
    """A node's view of the keys: each read from the store on first use, and again in
    the background once its verdict is older than KEY_CACHE_TTL_S."""

    def __init__(self, store: MetaStore):
        self.store = store
        # token -> (confirmed at, principal) of keys that exist, and apart (so that callers
        # without a key cannot push the good ones out) -> (at, error) of those that do not
        self._known: dict[str, tuple[float, Principal]] = {}
        self._refused: dict[str, tuple[float, SmsError]] = {}
        self._refreshing: dict[str, asyncio.Task] = {}

    async def authenticate(self, token: str) -> Principal:
        """The key's principal, or the named error.

        - A verdict younger than KEY_CACHE_TTL_S is used as it is.
        - A key accepted within KEY_STALE_MAX_S is used at once while one background
          read confirms it (a revoked key is refused from the call after that read), so
          a node cut off from the store keeps serving the clients it knows, without a
          wait per call.
        - Anything else is read now, waiting at most METADATA_READ_WAIT_S, then
          Unavailable (the client tries another node). A malformed token is refused
          without a read and without a trace here."""
        if not token:
            raise Unauthenticated("no credential: give a key's token (token=, --token or $SMS_TOKEN)")
        key_id, secret = parse_token(token)
        now = time.monotonic()
        known = self._known.get(token)
        if known is not None:
            age = now - known[0]
            if age <= limits.KEY_CACHE_TTL_S:
                return known[1]
            if age <= limits.KEY_STALE_MAX_S:
                if token not in self._refreshing:
                    task = asyncio.get_running_loop().create_task(self._refresh(token, key_id, secret),
                                                                  name="key-refresh")
                    self._refreshing[token] = task
                    task.add_done_callback(lambda _t: self._refreshing.pop(token, None))
                return known[1]
        refused = self._refused.get(token)
        if refused is not None and now - refused[0] <= limits.KEY_CACHE_TTL_S:
            raise type(refused[1])(refused[1].message)
        try:
            async with asyncio.timeout(limits.METADATA_READ_WAIT_S):
                verdict = await self._verdict(key_id, secret)
        except (TimeoutError, MetaStoreError):
            raise Unavailable("credentials cannot be checked now: the metadata store does not answer this "
                              "node; try another") from None
        self._remember(token, now, verdict)
        if isinstance(verdict, SmsError):
            raise type(verdict)(verdict.message)
        return verdict

    async def _refresh(self, token: str, key_id: str, secret: str) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(limits.METADATA_READ_WAIT_S):
                verdict = await self._verdict(key_id, secret)
        except (TimeoutError, MetaStoreError):
            return                # (still cut off: the stale verdict serves until KEY_STALE_MAX_S)
        except Exception:         # (a key entry this version cannot read: refused from now on)
            raise_if_cancelling()
            log.exception("key %s could not be read", key_id)
            verdict = Unauthenticated("unknown or revoked key")
        self._remember(token, started, verdict)

    def _remember(self, token: str, at: float, verdict: Principal | SmsError) -> None:
        if isinstance(verdict, Principal):
            self._refused.pop(token, None)
            if len(self._known) >= limits.AUTH_CACHE_ENTRIES_MAX:
                self._known.clear()       # (that many distinct valid tokens: start afresh)
            self._known[token] = (at, verdict)
        else:
            self._known.pop(token, None)
            if len(self._refused) >= limits.AUTH_CACHE_ENTRIES_MAX:
                self._refused.clear()
            self._refused[token] = (at, verdict)

    async def _verdict(self, key_id: str, secret: str) -> Principal | SmsError:
        entry = await self.store.get(key_path(key_id))
        if entry is None:
            return Unauthenticated("unknown or revoked key")
        try:
            key = KeyEntry.from_bytes(key_id, entry.value)
            if key.role not in ROLES:
                raise ValueError(f"role {key.role!r}")
        except (ValueError, KeyError, TypeError) as e:     # written by another version, or damaged
            log.error("key %s: unreadable entry (%s): refused", key_id, e)
            return Unauthenticated("unknown or revoked key")
        if not hmac.compare_digest(key.sha256, hash_secret(secret)):
            return Unauthenticated("unknown or revoked key")
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
    """Delete the key (only one of `tenant`, when given: another's is not found); every
    node refuses its token within about KEY_CACHE_TTL_S."""
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


async def bootstrap_admin_key(store: MetaStore, token: str) -> bool:
    """The cluster's first admin key, from a token its launcher chose (`sms up`), created
    once in the cluster's life: a later start does not bring it back once revoked.
    True if it was created now."""
    if await store.get(metadata.CLUSTER_BOOTSTRAPPED) is not None:
        return False
    key_id, secret = parse_token(token)
    entry = KeyEntry(key_id=key_id, tenant=DEFAULT_TENANT, role="admin", streams=(), sha256=hash_secret(secret),
                     created_ms=int(time.time() * 1000), name="bootstrap admin (sms up)")
    try:     # the marker and the key together, or neither (a crash between would leave no admin)
        await store.commit([Create(metadata.CLUSTER_BOOTSTRAPPED, b"1"), Create(key_path(key_id), entry.to_bytes())])
    except NodeExistsError:
        return False              # another control node did it first
    return True
