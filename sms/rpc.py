"""The gRPC edge shared by servers and clients: channel options and error mapping.

Servers wrap each handler with `rpc_errors`: an `SmsError` becomes its gRPC status with
the class name in trailing metadata `sms-error`; anything else becomes INTERNAL and is
logged, and the node keeps serving. Clients call `to_sms_error` on an `AioRpcError` to
get the same class back (UNAVAILABLE and DEADLINE_EXCEEDED without a name become
`Unavailable` and `Timeout`).
"""

from __future__ import annotations

import asyncio
import functools
import logging

import grpc

from sms import errors, limits

log = logging.getLogger(__name__)

ERROR_KEY = "sms-error"

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


def rpc_errors(handler):
    """Map SmsError (and unexpected exceptions) of a unary grpc.aio handler to a status."""

    @functools.wraps(handler)
    async def wrapper(self, request, context):
        try:
            return await handler(self, request, context)
        except errors.SmsError as e:
            context.set_trailing_metadata(((ERROR_KEY, e.name),))
            await context.abort(e.code, e.message or e.name)
        except errors.InvariantViolation:
            raise
        except grpc.aio.AioRpcError as e:
            # a call this handler made to another node failed: name it as that node's error
            # (Unavailable for a node that is down), so the caller can retry
            err = to_sms_error(e)
            context.set_trailing_metadata(((ERROR_KEY, err.name),))
            await context.abort(err.code, f"a call to another node failed: {err.message or err.name}")
        except Exception as e:  # an operating error we did not name: answer, keep serving
            if isinstance(e, (grpc.aio.AbortError,)):
                raise
            log.exception("unexpected error in %s", handler.__name__)
            context.set_trailing_metadata(((ERROR_KEY, "InternalError"),))
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    return wrapper


def rpc_stream_errors(handler):
    """rpc_errors for a server-streaming handler (an async generator): its events pass
    through; a named error ends the stream with its status, as for a unary call."""

    @functools.wraps(handler)
    async def wrapper(self, request, context):
        try:
            async for event in handler(self, request, context):
                yield event
        except errors.SmsError as e:
            context.set_trailing_metadata(((ERROR_KEY, e.name),))
            await context.abort(e.code, e.message or e.name)
        except errors.InvariantViolation:
            raise
        except Exception as e:  # an operating error we did not name: answer, keep serving
            if isinstance(e, (grpc.aio.AbortError, asyncio.CancelledError)):
                raise
            log.exception("unexpected error in %s", handler.__name__)
            context.set_trailing_metadata(((ERROR_KEY, "InternalError"),))
            await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

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


def aio_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def peer_channel(address: str) -> grpc.aio.Channel:
    """A long-lived channel to another node, to be shared (see PEER_CHANNEL_OPTIONS)."""
    return grpc.aio.insecure_channel(address, options=PEER_CHANNEL_OPTIONS)
