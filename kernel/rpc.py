"""The gRPC edge of a server: handler wrappers, server options, channels between nodes.

Servers wrap each handler with `rpc_errors`: an `SmsError` becomes its gRPC status with
the class name in trailing metadata `sms-error` (sms/rpc.py reads it back on the client);
anything else becomes INTERNAL and is logged, and the node keeps serving. Every message
answered to a tenant's caller is in the caller's own names (`for_caller`: its tenant's
prefix taken out of the stored stream names).

A node reaches other nodes' cluster ports through its `NodeChannels`: its TLS settings
(its certificate, presented on every call; none on a plaintext cluster) live on that
object, made once by node/server.py and handed to the roles, not in a global. Its
`node_status` is the one typed port for a node's NodeStatus (`NodeReport`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import grpc

from kernel import metrics
from kernel.aiotools import raise_if_cancelling
from sms import errors, limits, security
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import CHANNEL_OPTIONS, ERROR_KEY, to_sms_error

log = logging.getLogger(__name__)

_Servicer = TypeVar("_Servicer")
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class ServicerContext(Protocol):
    """What the handler wrappers use of a grpc.aio.ServicerContext (grpc ships no types)."""

    def set_trailing_metadata(self, trailing_metadata: tuple[tuple[str, str], ...]) -> None: ...
    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn: ...

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




# --- a node's channels to other nodes, and their status ---------------------------------------

@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica as its node reports it (NodeStatus's ReplicaStatus, typed)."""
    chain_id: str
    epoch: int
    role: str
    records: int
    verified: bool
    last_sn: int
    committed_sn: int
    gated_learners: tuple[str, ...]
    sealed: bool
    frozen: bool

    @classmethod
    def from_pb(cls, r: sms_pb2.ReplicaStatus) -> "ReplicaReport":
        return cls(r.chain_id, r.epoch, r.role, r.records, r.verified, int(r.last_sn or 0),
                   int(r.committed_sn or 0), tuple(r.gated_learners), r.sealed, r.frozen)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What a node reports of itself to another node: its replicas (all, or those asked
    for) and how long since it last heard from each peer it has a stream with."""
    replicas: tuple[ReplicaReport, ...]
    peers_heard_ago_s: tuple[tuple[str, bool, float], ...] = ()     # (peer, outgoing, seconds; -1: never)

    def replica(self, chain_id: str) -> ReplicaReport | None:
        return next((r for r in self.replicas if r.chain_id == chain_id), None)

    def by_chain(self) -> dict[str, ReplicaReport]:
        return {r.chain_id: r for r in self.replicas}


NO_REPLICAS = ("-",)          # node_status(chain_ids=NO_REPLICAS): the node's links only, no replica


class NodeChannels:
    """This node's channels to other nodes' cluster ports (NodeInfo.internal_address), with
    its certificate when the cluster is secure (`tls`; None: a plaintext cluster)."""

    def __init__(self, tls: "security.TlsConfig | None" = None):
        self.tls = tls
        self._credentials = tls.channel_credentials() if tls is not None else None

    def _channel(self, address: str, options: list[tuple[str, Any]]) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        # every node certificate names NODE_TARGET_NAME: a peer is checked as a node of this
        # cluster's CA, whatever address it was reached at
        return grpc.aio.secure_channel(address, self._credentials,
                                       options=options + [("grpc.ssl_target_name_override",
                                                           security.NODE_TARGET_NAME)])

    def node_channel(self, address: str) -> grpc.aio.Channel:
        """A channel for a few calls (close it: `async with`)."""
        return self._channel(address, CHANNEL_OPTIONS)

    def peer_channel(self, address: str) -> grpc.aio.Channel:
        """A long-lived channel to be shared (see PEER_CHANNEL_OPTIONS)."""
        return self._channel(address, PEER_CHANNEL_OPTIONS)

    async def node_status(self, address: str, chain_ids: Sequence[str] = (), timeout_s: float | None = None,
                          channel: grpc.aio.Channel | None = None) -> NodeReport | None:
        """The node's report (its replicas of `chain_ids`, or all), on `channel` or a channel
        of its own; None when it does not answer within `timeout_s` (RPC_TIMEOUT_S): a node
        that does not answer tells the caller nothing."""
        timeout = limits.RPC_TIMEOUT_S if timeout_s is None else timeout_s
        request = sms_pb2.NodeStatusRequest(chain_ids=list(chain_ids))
        try:
            if channel is not None:
                status = await sms_pb2_grpc.StorageStub(channel).NodeStatus(request, timeout=timeout)
            else:
                async with self.node_channel(address) as own:
                    status = await sms_pb2_grpc.StorageStub(own).NodeStatus(request, timeout=timeout)
        except (grpc.aio.AioRpcError, OSError) as e:
            raise_if_cancelling()
            log.debug("NodeStatus of %s failed: %s", address, e)
            return None
        return NodeReport(tuple(ReplicaReport.from_pb(r) for r in status.replicas),
                          tuple((p.peer, p.outgoing, p.heard_ago_s) for p in status.peer_links))
