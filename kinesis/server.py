"""The Kinesis endpoint's HTTP side: an ASGI application served by Hypercorn (HTTP/1.1, and
HTTP/2 over TLS by ALPN or in clear by prior knowledge), on a port of its own beside the
node's gRPC ports, with the node's TLS certificate (`--insecure`: plain HTTP).

Each request: `POST /` with X-Amz-Target and a JSON 1.1 or CBOR 1.1 body
(kinesis/protocol.py), signed with AWS Signature V4 (kinesis/sigv4.py) by an SMS key's
secret access key (kinesis/credentials.py; a cluster without keys checks no signature),
served by kinesis/service.py. `GET /health` answers 200 for load balancers.

Why Hypercorn: it serves HTTP/1.1 and HTTP/2 (which SubscribeToShard needs for the Java
and JavaScript SDKs) from one asyncio loop, the node's own; docs/architecture.md, "Choices".
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import ssl
import time
import uuid
from typing import Any

from kinesis import eventstream, protocol, sigv4
from kinesis.credentials import SigningKeys
from kinesis.protocol import KinesisError
from kinesis.service import Caller, KinesisService, subscribe_to_shard
from kernel.aiotools import ByteGate
from sms import errors, limits

log = logging.getLogger(__name__)

DEFAULT_REGION = "us-east-1"        # the region of ARNs on a cluster that checks no signature


class KinesisApp:
    """The ASGI application."""

    def __init__(self, service: KinesisService, signing_keys: SigningKeys | None, account: str):
        self.service = service
        self.signing_keys = signing_keys
        self.account = account
        self.requests = 0
        self.inflight = ByteGate(limits.KINESIS_INFLIGHT_BYTES_MAX)     # request bodies being served

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        self.requests += 1
        request_id = str(uuid.uuid4())
        headers: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        content = protocol.CONTENT_JSON
        if scope["method"] == "GET" and scope["path"] == "/health":
            await _answer(send, 200, b'{"status":"ok"}', "application/json", request_id)
            return
        body_read = False
        try:
            content = protocol.media_type((headers.get("content-type") or [None])[0])
            if scope["method"] != "POST":
                raise KinesisError("UnknownOperationException", f"{scope['method']} is not served; "
                                                                f"the API is POST / with X-Amz-Target", 405)
            # Who signs is known from the headers: a request of no known key holds none of
            # the endpoint's memory. Then the body's bytes are held from before it is read
            # until the answer is sent (many large requests at once wait in their sockets,
            # not in memory), for at most KINESIS_INFLIGHT_WAIT_S of waiting: then the
            # request is answered 503, which every SDK retries (under HTTP/2 a request
            # waiting here also holds back its connection's other streams).
            signer = await self._signer(headers)
            weight = _weight(headers)
            if not await self.inflight.acquire_within(weight, limits.KINESIS_INFLIGHT_WAIT_S):
                raise KinesisError("ServiceUnavailableException",
                                   f"this node serves {limits.KINESIS_INFLIGHT_BYTES_MAX} bytes of requests at once, "
                                   f"and has had none free for {limits.KINESIS_INFLIGHT_WAIT_S:.0f} s; retry", 503)
            try:
                body = await _body(receive, headers)
                body_read = True
                operation = protocol.operation_of((headers.get("x-amz-target") or [None])[0])
                caller = self._caller(scope, headers, body, signer)
                params = protocol.decode(operation, body, content)
                del body
                if operation.name != "SubscribeToShard":
                    output = await self.service.handle(operation.name, params, caller)
                    await _answer(send, 200, protocol.encode(operation, output, content), content, request_id)
                    return
            finally:
                self.inflight.release(weight)
            await self._subscribe(operation, params, caller, content, request_id, send, receive)
        except (KinesisError, sigv4.SignatureError) as e:
            if isinstance(e, sigv4.SignatureError):
                e = KinesisError(e.kind, e.message, 403 if e.kind == "MissingAuthenticationTokenException" else 400)
            if not body_read and e.status not in (408, 413):
                await _drain(receive)             # (a client still sending reads the answer, not a reset)
            await _answer(send, e.status, protocol.encode_error(e, content), content, request_id, e.kind)
        except errors.InvariantViolation:
            raise                    # a broken invariant is not answered as if nothing happened
        except Exception:            # a bug: the client gets InternalFailure, the node goes on
            log.exception("kinesis request %s failed", request_id)
            error = KinesisError("InternalFailureException", f"internal error (request {request_id})", 500)
            await _answer(send, 500, protocol.encode_error(error, content), content, request_id, error.kind)

    async def _signer(self, headers: dict[str, list[str]]) -> tuple[sigv4.Signed, str] | None:
        """The request's signature and its key's secret, from the headers alone (None on a
        cluster without keys); SignatureError or UnrecognizedClientException for a request
        no key of the cluster signed."""
        if self.signing_keys is None:
            return None
        if "host" in headers:             # (Hypercorn gives HTTP/2's :authority as host; the JS SDK signs it)
            headers.setdefault(":authority", headers["host"])
        signed = sigv4.parse(headers)
        return signed, await self.signing_keys.secret_of(signed.access_key_id)

    async def _subscribe(self, operation, params: dict[str, Any], caller: Caller, content: str, request_id: str,
                         send, receive) -> None:
        """SubscribeToShard: a 200 whose body is an event stream (kinesis/eventstream.py):
        the initial response as soon as the subscription is positioned, then an event per
        page of records as they commit, until the subscription's time is up, the shard
        ends, another subscription takes it over, or the client goes. An error before it is
        positioned is an ordinary error answer; one after, an exception message.

        One task, the pump, runs the subscription's generator from start to end (its
        context, its cancellation and its cleanup stay in one task); this one watches for
        the client's going and for a takeover, and ends the pump on either."""
        events = subscribe_to_shard(self.service, params, caller, time.monotonic)
        shape = operation.output_shape.members["EventStream"].members["SubscribeToShardEvent"]
        loop = asyncio.get_running_loop()
        positioned: asyncio.Future[asyncio.Event] = loop.create_future()

        def frame(body: bytes, more: bool = True) -> dict[str, Any]:
            return {"type": "http.response.body", "body": body, "more_body": more}

        async def pump() -> None:
            """The subscription from start to end, its generator closed here whatever ends it
            (its context and cleanup stay in this task). Every send gives the client
            KINESIS_SEND_TIMEOUT_S to take it; the whole, KINESIS_SUBSCRIPTION_S and that."""
            try:
                async with asyncio.timeout(limits.KINESIS_SUBSCRIPTION_S + limits.KINESIS_SEND_TIMEOUT_S):
                    try:
                        taken = await anext(events)      # (errors up to here answer as any operation's)
                        await sent({"type": "http.response.start", "status": 200, "headers": [
                            (b"content-type", b"application/vnd.amazon.eventstream"),
                            (b"x-amzn-requestid", request_id.encode())]})
                        await sent(frame(eventstream.event("initial-response", protocol.encode_shape(
                            operation.output_shape, {}, content), content)))
                    except BaseException as e:
                        if not positioned.done():
                            positioned.set_exception(e)
                        raise
                    positioned.set_result(taken)
                    try:
                        async for event in events:
                            await sent(frame(eventstream.event("SubscribeToShardEvent", protocol.encode_shape(
                                shape, event, content), content)))
                    except KinesisError as e:
                        await sent(frame(eventstream.exception(e.kind, protocol.encode_error(e, content), content)))
            finally:
                await events.aclose()

        async def sent(message: dict[str, Any]) -> None:
            async with asyncio.timeout(limits.KINESIS_SEND_TIMEOUT_S):
                await send(message)

        async def gone() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
        pumping = loop.create_task(pump(), name="kinesis-subscription")
        watchers: list[asyncio.Task] = []
        try:
            taken = await positioned              # (raises what positioning raised: an ordinary error answer)
            watchers = [loop.create_task(gone(), name="kinesis-subscriber"),
                        loop.create_task(taken.wait(), name="kinesis-takeover")]
            done, _ = await asyncio.wait({pumping, *watchers}, return_when=asyncio.FIRST_COMPLETED)
            if pumping not in done:
                pumping.cancel()
            results = await asyncio.gather(pumping, return_exceptions=True)
            stalled = isinstance(results[0], TimeoutError)
            if isinstance(results[0], Exception) and not stalled:
                log.error("kinesis subscription %s failed", request_id, exc_info=results[0])
            if not watchers[0].done() and not stalled:
                if watchers[1].done():
                    error = KinesisError("ResourceInUseException",
                                         "Another subscription for this consumer and shard took over.")
                    await sent(frame(eventstream.exception(error.kind, protocol.encode_error(error, content),
                                                           content)))
                await sent(frame(b"", more=False))
        finally:
            pumping.cancel()
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(pumping, *watchers, return_exceptions=True)

    def _caller(self, scope: dict[str, Any], headers: dict[str, list[str]], body: bytes,
                signer: tuple[sigv4.Signed, str] | None) -> Caller:
        """Who made the request: its signature (`_signer`'s) verified over the whole request."""
        if signer is None:                     # a cluster without keys: no signature is checked
            region = DEFAULT_REGION
            try:
                region = sigv4.parse(headers).region
            except sigv4.SignatureError:
                pass
            return Caller("", region, self.account)
        signed, secret = signer
        path = scope.get("raw_path") or scope["path"].encode()
        sigv4.verify(signed, secret, scope["method"], path.decode("latin-1"),
                     scope.get("query_string", b"").decode("latin-1"), headers, body,
                     datetime.datetime.now(datetime.timezone.utc))
        return Caller(signed.access_key_id, signed.region, self.account)


def _weight(headers: dict[str, list[str]]) -> int:
    """What a request holds of KINESIS_INFLIGHT_BYTES_MAX while it is served: its declared
    length (at most the largest body taken; a body of no declared length, the largest)."""
    declared = (headers.get("content-length") or [""])[0]
    if declared.isdigit():
        return max(1, min(int(declared), limits.KINESIS_REQUEST_BYTES_MAX))
    return limits.KINESIS_REQUEST_BYTES_MAX


async def _body(receive, headers: dict[str, list[str]]) -> bytes:
    """`_read_body` within KINESIS_BODY_READ_S (a client that sends slower holds the
    endpoint's memory for no one: RequestTimeoutException, which the SDKs retry)."""
    try:
        async with asyncio.timeout(limits.KINESIS_BODY_READ_S):
            return await _read_body(receive, headers)
    except TimeoutError:
        raise KinesisError("RequestTimeoutException", f"the request's body did not arrive within "
                                                      f"{limits.KINESIS_BODY_READ_S:.0f} s", 408) from None


async def _drain(receive) -> None:
    """Read a request's body to its end and drop it (within KINESIS_BODY_READ_S, up to
    KINESIS_DRAIN_BYTES_MAX; past either, the connection is dropped)."""
    size = 0
    try:
        async with asyncio.timeout(limits.KINESIS_BODY_READ_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise asyncio.CancelledError()
                size += len(message.get("body", b""))
                if size > limits.KINESIS_DRAIN_BYTES_MAX:
                    raise asyncio.CancelledError()
                if not message.get("more_body"):
                    return
    except TimeoutError:
        raise asyncio.CancelledError() from None


async def _read_body(receive, headers: dict[str, list[str]]) -> bytes:
    """The request's body, at most KINESIS_REQUEST_BYTES_MAX. A larger one is read to its
    end and dropped (up to KINESIS_DRAIN_BYTES_MAX: a client still sending would otherwise
    see its connection cut rather than the answer), then answered 413."""
    declared = (headers.get("content-length") or ["0"])[0]
    too_big = declared.isdigit() and int(declared) > limits.KINESIS_REQUEST_BYTES_MAX
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limits.KINESIS_REQUEST_BYTES_MAX:
            too_big = True
            parts = []
        if size > limits.KINESIS_DRAIN_BYTES_MAX:
            raise asyncio.CancelledError()        # (not worth reading: the connection is dropped)
        if not too_big:
            parts.append(chunk)
        if not message.get("more_body"):
            break
    if too_big:
        raise KinesisError("ValidationException", f"request body of {max(size, int(declared or 0))} bytes; at most "
                                                  f"{limits.KINESIS_REQUEST_BYTES_MAX}", 413)
    return b"".join(parts)


async def _answer(send, status: int, body: bytes, content: str, request_id: str, error: str = "") -> None:
    headers = [(b"content-type", content.encode()), (b"content-length", str(len(body)).encode()),
               (b"x-amzn-requestid", request_id.encode())]
    if error:
        headers.append((b"x-amzn-errortype", error.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def listen(host: str, port: int) -> socket.socket:
    """The endpoint's listening socket (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(limits.KINESIS_LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def _client_goaway_leaves_streams_open() -> None:
    """A client's GOAWAY without error lets its open streams finish (RFC 9113, 6.8), but
    h2 4.x moves the connection to CLOSED on it and drops what it has not sent yet, and
    Hypercorn answers with closing the connection. The AWS SDK for JavaScript v3 (its
    NodeHttp2Handler, one connection per request) sends that GOAWAY as soon as an answer's
    headers arrive: it got no more of a body than the first 64 KiB flow-control window,
    and nothing of a SubscribeToShard after the first DATA frame. Such a GOAWAY is let
    pass while streams are open: the client closes the connection once they are done
    (else the keep-alive timeout does). In this process h2 serves only Hypercorn."""
    import h2.connection
    import h2.errors
    receive_goaway = h2.connection.H2Connection._receive_goaway_frame
    if getattr(receive_goaway, "leaves_streams_open", False):
        return

    def _receive_goaway_frame(self, frame):
        if (not self.config.client_side and frame.error_code == h2.errors.ErrorCodes.NO_ERROR
                and self.open_inbound_streams):
            return [], []
        return receive_goaway(self, frame)
    _receive_goaway_frame.leaves_streams_open = True
    h2.connection.H2Connection._receive_goaway_frame = _receive_goaway_frame


def _quiet_connection_ends(loop: asyncio.AbstractEventLoop) -> None:
    """Two reports of a client connection's end that are not the server's errors, logged by
    asyncio at ERROR, are logged at DEBUG instead; every other report goes to the handler in
    place before:
    - "Exception in callback StreamReaderProtocol.connection_made...": Python 3.11's
      streams ask a connection task cancelled at a stop for its exception (3.12 checks
      first), and Hypercorn cancels the connections still open when the node stops;
    - "Unhandled exception in client_connected_cb" of a TLS or socket error: a client that
      ended its connection first (the AWS SDK for JavaScript closes each one after its
      answer: `APPLICATION_DATA_AFTER_CLOSE_NOTIFY` as Hypercorn closes its side)."""
    previous = loop.get_exception_handler()

    def benign(error: BaseException | None) -> bool:
        if isinstance(error, BaseExceptionGroup):
            return all(benign(e) for e in error.exceptions)
        return isinstance(error, (ssl.SSLError, ConnectionError))

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        message = str(context.get("message", ""))
        if (isinstance(error, asyncio.CancelledError)
                and "StreamReaderProtocol.connection_made" in str(context.get("handle", ""))) or \
                (message.startswith("Unhandled exception in client_connected_cb") and benign(error)):
            log.debug("a client connection ended: %s (%r)", message, error)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)
    loop.set_exception_handler(handler)


async def serve(app: KinesisApp, sock: socket.socket, shutdown: asyncio.Event,
                cert_file: str = "", key_file: str = "") -> None:
    """Serve `app` on `sock` until `shutdown` is set."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config
    _quiet_connection_ends(asyncio.get_running_loop())
    _client_goaway_leaves_streams_open()
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    if cert_file:
        config.certfile, config.keyfile = cert_file, key_file
    config.alpn_protocols = ["h2", "http/1.1"]
    config.accesslog = None
    config.errorlog = logging.getLogger("kinesis.hypercorn")
    config.keep_alive_timeout = limits.KINESIS_KEEPALIVE_S
    config.h11_max_incomplete_size = limits.KINESIS_HEADER_BYTES_MAX
    config.h2_max_inbound_frame_size = 2 ** 14
    config.graceful_timeout = limits.KINESIS_GRACEFUL_S
    await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
