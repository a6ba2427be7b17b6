"""A secure node's two ports (sms/security.py): server credentials, and the guard that
keeps the cluster's own protocols off the client port and strangers off the cluster port.

- Client port: TLS with the node's certificate; no client certificate is asked for.
  Calls to the `Storage` service (append, replication, node status) are refused there
  with PermissionDenied, whatever the caller holds. Every other call needs a key whose
  role grants it (control/auth.py): Unauthenticated without one, PermissionDenied
  without the right.
- Cluster port: mutual TLS; the handshake admits only certificates of this cluster's
  CA, and the guard serves only those whose unit is `node` (a client certificate of
  the same CA is refused with PermissionDenied) and that are not revoked.

Every refusal of either guard goes to the node's audit log (kernel/audit.py): who (the key,
the key a bad token claims, or the certificate), the method, the error, and the peer.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import grpc

from control import auth
from control.revocation import RevokedCerts
from kernel import audit
from sms import errors, limits, rpc, security

INTERNAL_SERVICES = ("/sms.v1.Storage/",)      # served to cluster nodes only, on the cluster port
# what a node's own client of its cluster (sms.aio.Client internal: the queue owners' state
# logs, docs/queues.md) calls on the cluster port besides Storage, Retrieval and Queues: the
# discovery reads and a producer's calls. No other Control or Ingestion call is served there:
# admin calls need the client port and a key, even from a node.
CLUSTER_PORT_CLIENT_CALLS = frozenset({
    "/sms.v1.Control/DescribeCluster", "/sms.v1.Control/DescribeStream", "/sms.v1.Control/InitProducer",
    "/sms.v1.Ingestion/PutRecords", "/sms.v1.Control/UpdateConsumer"})
_CLUSTER_PORT_SERVICES = ("/sms.v1.Storage/", "/sms.v1.Retrieval/", "/sms.v1.Queues/")
# answered without a key (probes carry none; they tell nothing of streams or records: node/health.py)
PUBLIC_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/")


def client_port_credentials(tls: security.TlsConfig) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(tls.key, tls.cert)])


def cluster_port_credentials(tls: security.TlsConfig) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True)


_KINDS = {(False, False): "unary_unary", (False, True): "unary_stream",
          (True, False): "stream_unary", (True, True): "stream_stream"}


def _behaviour(handler: grpc.RpcMethodHandler) -> tuple[str, object]:
    kind = _KINDS[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return kind, getattr(handler, kind)


def _refusing(handler: grpc.RpcMethodHandler, method: str, message: str,
              detail: str = "a cluster-internal call on the client port") -> grpc.RpcMethodHandler:
    """`handler` with its behaviour replaced by a PermissionDenied answer (a coroutine
    serves every kind of call: a streaming one that writes nothing)."""
    kind, _inner = _behaviour(handler)

    async def refuse(_request, context):
        audit.event(audit.AUTH_DENIED, method, "PermissionDenied", audit.who_cert(security.peer_cert(context)),
                    audit.peer(context), detail)
        await _abort(context, errors.PermissionDenied(message))
    return handler._replace(**{kind: refuse})


def _guarded(handler: grpc.RpcMethodHandler, admit, recheck_s: float = 0.0,
             each_answer: bool = False) -> grpc.RpcMethodHandler:
    """`handler`, served once `await admit(request, context)` returns; it raises the
    named error that refuses the call, or returns a function applied to a unary answer
    (None: the answer as it is). The wrapper is of the behaviour's own kind: gRPC treats
    an async generator as the answer stream, and a coroutine as a handler that reads and
    writes through its context. `recheck_s`: an answer stream is admitted again before
    an answer once this long has passed (a key revoked while a subscription runs), and a
    stream served through its context every recheck_s; `each_answer`: an answer stream
    is admitted again before every answer (for a cheap `admit`)."""
    kind, inner = _behaviour(handler)
    if inspect.isasyncgenfunction(inner):
        async def generator(request, context):
            try:
                await admit(request, context)
                checked = time.monotonic()
                async for answer in inner(request, context):
                    if each_answer or (recheck_s and time.monotonic() - checked > recheck_s):
                        await admit(request, context)
                        checked = time.monotonic()
                    yield answer
            except errors.SmsError as e:
                await _abort(context, e)
        return handler._replace(**{kind: generator})

    streaming = kind != "unary_unary"

    async def coroutine(request, context):
        try:
            after = await admit(request, context)
        except errors.SmsError as e:
            await _abort(context, e)
        if not (recheck_s and streaming):
            answer = await inner(request, context)
            return after(answer) if after is not None else answer
        # a stream served through its context (a peer's replication links): admitted again
        # every recheck_s while it runs, and ended when it no longer is
        task = asyncio.ensure_future(inner(request, context))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=recheck_s)
                if not task.done():
                    await admit(request, context)
        except errors.SmsError as e:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await _abort(context, e)
        finally:
            if not task.done():
                task.cancel()
        return task.result()
    return handler._replace(**{kind: coroutine})


async def _abort(context, e: errors.SmsError) -> None:
    context.set_trailing_metadata(((rpc.ERROR_KEY, e.name),))
    await context.abort(e.code, e.message or e.name)


def _node_only(handler: grpc.RpcMethodHandler, method: str, revoked: RevokedCerts | None) -> grpc.RpcMethodHandler:
    """`handler`, served only to a caller holding a node certificate not revoked."""
    message = (f"{method} on a cluster port needs a node certificate of this cluster "
               f"(organisational unit {security.NODE_UNIT!r})")

    async def admit(_request, context):
        cert = security.peer_cert(context)
        if cert is None or cert.unit != security.NODE_UNIT:
            refused = errors.PermissionDenied(message)
        elif revoked is not None and cert.serial in revoked:
            refused = errors.PermissionDenied(f"{method}: the caller's certificate (serial {cert.serial:x}, "
                                              f"{cert.name}) is revoked")
        else:
            return
        audit.event(audit.AUTH_DENIED, method, refused.name, audit.who_cert(cert), audit.peer(context),
                    refused.message)
        raise refused
    # (checked again while a stream runs: a replication or append stream opened before a
    # revocation ends at its next answer after the list is re-read)
    return _guarded(handler, admit, recheck_s=limits.REVOCATION_REFRESH_S if revoked is not None else 0.0)


def _authenticated(handler: grpc.RpcMethodHandler, method: str, keys: auth.KeyTable) -> grpc.RpcMethodHandler:
    """`handler`, served to a caller whose key (control/auth.py) grants the call, in the
    key's tenant (auth.scope_request); checked again while an answer stream runs. A data
    call may be admitted on the key's last verdict while the node cannot read the
    metadata store (auth.may_use_stale, KEY_STALE_MAX_S); any other call then gets
    Unavailable."""
    stale_ok = auth.may_use_stale(method)

    async def admit(request, context):
        token = auth.bearer(context.invocation_metadata())
        try:
            principal = await keys.authenticate(token, stale_ok=stale_ok)
        except errors.Unauthenticated as e:      # (the audit log names the key it claims, never the token)
            audit.event(audit.AUTH_REFUSED, method, e.name, audit.who_token(token), audit.peer(context), e.message)
            raise
        try:
            auth.check(principal, method, request)
        except errors.PermissionDenied as e:
            audit.event(audit.AUTH_DENIED, method, e.name, audit.who_key(principal), audit.peer(context), e.message)
            raise
        auth.CURRENT.set(principal)            # (the key management calls read it)
        return auth.scope_request(principal, method, request)
    # an answer stream (Subscribe) is admitted again before every answer: a cached verdict
    # costs a lookup, and once revoke_key returns no verdict that admits the key is left,
    # so not one more answer goes out
    return _guarded(handler, admit, recheck_s=limits.KEY_CACHE_TTL_S, each_answer=True)


class ClientPortGuard(grpc.aio.ServerInterceptor):
    """Refuses the cluster-internal services on the client port; with a key table,
    serves only callers with a key that grants the call (control/auth.py)."""

    def __init__(self, keys: auth.KeyTable | None = None):
        self.keys = keys

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return None
        if method.startswith(INTERNAL_SERVICES):
            return _refusing(handler, method, f"{method} is a cluster-internal call: it is served on a node's "
                                              f"cluster port to holders of a node certificate only")
        if self.keys is not None and not method.startswith(PUBLIC_SERVICES):
            return _authenticated(handler, method, self.keys)
        return handler


class ClusterPortGuard(grpc.aio.ServerInterceptor):
    """Serves only holders of a node certificate (the handshake already checked the CA)
    that is not revoked (control/revocation.py)."""

    def __init__(self, revoked: RevokedCerts | None = None):
        self.revoked = revoked

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if not method.startswith(_CLUSTER_PORT_SERVICES) and method not in CLUSTER_PORT_CLIENT_CALLS \
                and not method.startswith(PUBLIC_SERVICES):
            return _refusing(handler, method, f"{method} is not served on a cluster port: call the client port "
                                              f"with a key", "a client's call on the cluster port")
        return _node_only(handler, method, self.revoked)
