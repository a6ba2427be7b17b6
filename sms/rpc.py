"""The gRPC edge of a client: channel options and error mapping.

Clients call `to_sms_error` on an `AioRpcError` to get the server's named error class
back (a server names it in trailing metadata `sms-error`, kernel/rpc.py; UNAVAILABLE and
DEADLINE_EXCEEDED without a name become `Unavailable` and `Timeout`). The server half (the
handler wrappers, server and node-to-node channel options, probes) is kernel/rpc.py:
nothing here needs prometheus_client.
"""

from __future__ import annotations

import grpc

from sms import errors, limits, security

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
