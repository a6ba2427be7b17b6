"""The gRPC edge shared by servers and clients: channel options and error mapping.

Servers wrap each handler with `rpc_errors`: an `SmsError` becomes its gRPC status with
the class name in trailing metadata `sms-error`; anything else becomes INTERNAL and is
logged, and the node keeps serving. Every message answered to a tenant's caller is in the
caller's own names (`for_caller`: its tenant's prefix taken out of the stored stream
names). Clients call `to_sms_error` on an `AioRpcError` to get the same class back
(UNAVAILABLE and DEADLINE_EXCEEDED without a name become `Unavailable` and `Timeout`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from sms import errors, limits, metrics, security

log = logging.getLogger(__name__)

_Servicer = TypeVar("_Servicer")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class ServicerContext(Protocol):
    """What the handler wrappers use of a grpc.aio.ServicerContext (grpc ships no types)."""

    def set_trailing_metadata(self, trailing_metadata: tuple[tuple[str, str], ...]) -> None: ...
    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...

ERROR_KEY = "sms-error"

# The stored-name prefix of the calling tenant's streams ("acme~"; "" for the default
# tenant, and on a plaintext cluster), set for the call being served by the guard of a
# node's client port (control/auth.py scope_request). A tenant's stream is stored as
# "<tenant>~<name>", and a tenant's caller only ever sees "<name>": in answers, and in
# error messages, which `for_caller` rewrites at this edge rather than in each message.
CALLER_PREFIX: contextvars.ContextVar[str] = contextvars.ContextVar("sms_caller_prefix", default="")


def for_caller(message: str) -> str:
    """`message` in the caller's own names: its tenant's prefix taken out of every stored
    stream name in it (a chain id, a metadata path too; where it starts a name, so tenant
    "a" leaves "ba~x" alone); cut to ERROR_MESSAGE_CHARS_MAX (an error that quotes a
    hostile value must still reach the caller, named)."""
    prefix = CALLER_PREFIX.get()
    if prefix:
        message = re.sub(r"(?<![a-z0-9-])" + re.escape(prefix), "", message)
    if len(message) > limits.ERROR_MESSAGE_CHARS_MAX:
        cut = len(message) - limits.ERROR_MESSAGE_CHARS_MAX
        message = f"{message[:limits.ERROR_MESSAGE_CHARS_MAX]}... ({cut} characters cut)"
    return message


CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.enable_retries", 0),
    ("grpc.use_local_subchannel_pool", 1),
]

SERVER_OPTIONS = [
    # one server per port: with gRPC's default SO_REUSEPORT a second node (a second `sms
    # up`) could bind a port in use and share its connections
    ("grpc.so_reuseport", 0),
    ("grpc.max_send_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", limits.GRPC_MESSAGE_BYTES_MAX),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    # accept the clients' keepalive pings (every 10 s, also between calls): by default a
    # server takes pings more often than every 5 minutes without data as abuse and
    # answers GOAWAY "too_many_pings", which fails the long polls in flight
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
    # every chain link from one peer is a stream of one connection (the peer shares a channel)
    ("grpc.max_concurrent_streams", limits.GRPC_STREAMS_PER_CONNECTION_MAX),
]

# A storage node's one channel to each peer, shared by all its chain links to that peer: one
# TCP connection (and one keepalive) per node pair, not per replica. It must come back fast
# once the peer is back: gRPC's reconnect backoff would otherwise grow to minutes.
PEER_CHANNEL_OPTIONS = CHANNEL_OPTIONS + [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", limits.PEER_RECONNECT_BACKOFF_MS_MAX),
]


PROBE_REFUSED = "refused"        # nothing listens on the port: the process is gone (or never started)
PROBE_LISTENING = "listening"    # a TCP connection was accepted (a paused process's kernel accepts too)
PROBE_SILENT = "silent"          # no answer in time: the host is cut off, or drops packets


async def probe_port(address: str, timeout_s: float) -> str:
    """One TCP connect to host:port, closed at once: whether a process listens there.
    Only REFUSED is evidence that the process is gone; the failure detector acts on
    nothing else (a paused or unreachable process is left to its metadata session)."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(timeout_s):
            _reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except ConnectionRefusedError:
        return PROBE_REFUSED
    except (TimeoutError, OSError, ValueError):
        return PROBE_SILENT
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return PROBE_LISTENING


def rpc_errors(handler: Callable[[_Servicer, _Request, ServicerContext], Awaitable[_Response]]
               ) -> Callable[[_Servicer, _Request, ServicerContext], Awaitable[_Response]]:
    """Map SmsError (and unexpected exceptions) of a unary grpc.aio handler to a status."""

    method = handler.__name__
    seconds = metrics.RPC_SECONDS.labels(method)

    @functools.wraps(handler)
    async def wrapper(self: _Servicer, request: _Request, context: ServicerContext) -> _Response:
        t0 = time.perf_counter()
        try:
            return await handler(self, request, context)
        except errors.SmsError as e:
            metrics.RPC_ERRORS.labels(method, e.name).inc()
            context.set_trailing_metadata(((ERROR_KEY, e.name),))
            await context.abort(e.code, for_caller(e.message or e.name))
        except errors.InvariantViolation:
            raise
        except grpc.aio.AioRpcError as e:
            # a call this handler made to another node failed: name it as that node's error
            # (Unavailable for a node that is down), so the caller can retry
            err = to_sms_error(e)
            metrics.RPC_ERRORS.labels(method, err.name).inc()
            context.set_trailing_metadata(((ERROR_KEY, err.name),))
            await context.abort(err.code, for_caller(f"a call to another node failed: {err.message or err.name}"))
        except Exception as e:  # an operating error we did not name: answer, keep serving
            if isinstance(e, (grpc.aio.AbortError,)):
                raise
            metrics.RPC_ERRORS.labels(method, "InternalError").inc()
            log.exception("unexpected error in %s", handler.__name__)
            context.set_trailing_metadata(((ERROR_KEY, "InternalError"),))
            await context.abort(grpc.StatusCode.INTERNAL, for_caller(f"{type(e).__name__}: {e}"))
        finally:
            seconds.observe(time.perf_counter() - t0)

    return wrapper


def rpc_stream_errors(handler: Callable[[_Servicer, _Request, ServicerContext], AsyncIterator[_Response]]
                      ) -> Callable[[_Servicer, _Request, ServicerContext], AsyncIterator[_Response]]:
    """rpc_errors for a server-streaming handler (an async generator): its events pass
    through; a named error ends the stream with its status, as for a unary call."""

    method = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self: _Servicer, request: _Request, context: ServicerContext) -> AsyncIterator[_Response]:
        try:
            async for event in handler(self, request, context):
                yield event
        except errors.SmsError as e:
            metrics.RPC_ERRORS.labels(method, e.name).inc()
            context.set_trailing_metadata(((ERROR_KEY, e.name),))
            await context.abort(e.code, for_caller(e.message or e.name))
        except errors.InvariantViolation:
            raise
        except Exception as e:  # an operating error we did not name: answer, keep serving
            if isinstance(e, (grpc.aio.AbortError, asyncio.CancelledError)):
                raise
            metrics.RPC_ERRORS.labels(method, "InternalError").inc()
            log.exception("unexpected error in %s", handler.__name__)
            context.set_trailing_metadata(((ERROR_KEY, "InternalError"),))
            await context.abort(grpc.StatusCode.INTERNAL, for_caller(f"{type(e).__name__}: {e}"))

    return wrapper


def to_sms_error(e: grpc.aio.AioRpcError | grpc.RpcError) -> errors.SmsError:
    name = ""
    for key, value in (e.trailing_metadata() or ()):
        if key == ERROR_KEY:
            name = value
    details = e.details() or ""
    if name:
        return errors.from_name(name, details)
    code = e.code()
    if code == grpc.StatusCode.UNAVAILABLE and "handshake failed" in details.lower():
        return errors.TlsHandshakeFailed(_handshake_hint(details))
    if code == grpc.StatusCode.UNAVAILABLE:
        return errors.Unavailable(details or "node unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.Timeout(details or "deadline exceeded")
    if code == grpc.StatusCode.CANCELLED:
        return errors.Unavailable(details or "call cancelled")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return errors.LimitExceeded(details)
    return errors.InternalError(f"{code.name}: {details}")


_HANDSHAKE_HINTS = (
    ("WRONG_VERSION_NUMBER", "the server does not speak TLS (a cluster started with --insecure?): connect "
                             "without a CA"),
    ("CERTIFICATE_VERIFY_FAILED", "the server's certificate is not one the given CA issued, or it expired"),
    ("CERTIFICATE_REQUIRED", "the server requires a client certificate"),
)


def _handshake_hint(details: str) -> str:
    for marker, hint in _HANDSHAKE_HINTS:
        if marker in details:
            return f"TLS handshake failed: {hint} ({details})"
    return f"TLS handshake failed ({details})"


def plaintext_refused(error: errors.SmsError) -> errors.SmsError:
    """A plaintext client's connection closed at once by the server: what a TLS port does
    with plaintext. Named so, with what to do."""
    if type(error) is errors.Unavailable and "Socket closed" in error.message and "failed to connect" in error.message:
        return errors.TlsHandshakeFailed(f"the server closed the connection at once; it may require TLS: give "
                                         f"its CA (ca_file=, --ca-file or $SMS_CA_FILE) ({error.message})")
    return error


def aio_channel(address: str, tls: "security.TlsConfig | None" = None) -> grpc.aio.Channel:
    """A client's channel: TLS when `tls` is given (the server checked by its address
    against the CA), else plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=CHANNEL_OPTIONS)


# A node of a secure cluster: its certificate, presented on every call to another node's
# cluster port (node/server.py sets it once at start; None: the cluster is plaintext)
_node_tls: "security.TlsConfig | None" = None
_node_credentials: grpc.ChannelCredentials | None = None


def use_node_tls(tls: "security.TlsConfig | None") -> None:
    global _node_tls, _node_credentials
    _node_tls = tls
    _node_credentials = tls.channel_credentials() if tls is not None else None


def _node_channel(address: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
    if _node_credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    # every node certificate names NODE_TARGET_NAME: a peer is checked as a node of this
    # cluster's CA, whatever address it was reached at
    return grpc.aio.secure_channel(address, _node_credentials,
                                   options=options + [("grpc.ssl_target_name_override", security.NODE_TARGET_NAME)])


def node_channel(address: str) -> grpc.aio.Channel:
    """A node's channel to another node's cluster port (NodeInfo.internal_address), with
    this node's certificate when the cluster is secure."""
    return _node_channel(address, CHANNEL_OPTIONS)


def peer_channel(address: str) -> grpc.aio.Channel:
    """A long-lived channel to another node's cluster port, to be shared (see
    PEER_CHANNEL_OPTIONS)."""
    return _node_channel(address, PEER_CHANNEL_OPTIONS)
