"""kinesis/server.py's KinesisApp at the ASGI level, with a stand-in service: what bounds a
request's hold on the endpoint. A body that does not arrive in time is answered 408; a
request that cannot get its bytes of the in-flight budget in time, 503 (both retried by the
SDKs); neither holds anything after. (The endpoint with real clients and a real cluster:
tests/integration/test_kinesis_*.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest

from kinesis.server import KinesisApp
from sms import limits

TARGET = b"Kinesis_20131202.ListStreams"


class _Service:
    """Answers ListStreams with nothing (the app's framing is what is tested)."""

    async def handle(self, name, params, caller):
        return {"StreamNames": [], "HasMoreStreams": False}


def _scope(length: int) -> dict:
    return {"type": "http", "method": "POST", "path": "/", "raw_path": b"/", "query_string": b"",
            "headers": [(b"content-type", b"application/x-amz-json-1.1"), (b"x-amz-target", TARGET),
                        (b"content-length", str(length).encode()), (b"host", b"127.0.0.1")]}


async def _call(app: KinesisApp, length: int, chunks: list[bytes], stall: asyncio.Event | None = None) -> list:
    """The app's answer to a request of declared `length` whose body comes as `chunks` (then,
    with `stall`, nothing until it is set)."""
    sent: list = []
    queue = list(chunks)

    async def receive():
        if queue:
            chunk = queue.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(queue) or stall is not None}
        if stall is not None:
            await stall.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
    await app(_scope(length), receive, send)
    return sent


def _status(sent: list) -> tuple[int, dict]:
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body)


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(limits, "KINESIS_BODY_READ_S", 0.2)
    monkeypatch.setattr(limits, "KINESIS_INFLIGHT_WAIT_S", 0.2)


def test_a_whole_request_is_answered_and_holds_nothing_after(quick):
    async def main() -> None:
        app = KinesisApp(_Service(), None, "000000000000")
        status, answer = _status(await _call(app, 2, [b"{}"]))
        assert status == 200 and answer["StreamNames"] == [] and app.inflight.held == 0
    asyncio.run(main())


def test_a_body_that_does_not_arrive_in_time_is_answered_408(quick):
    async def main() -> None:
        app = KinesisApp(_Service(), None, "000000000000")
        stall = asyncio.Event()
        status, answer = _status(await _call(app, 1000, [b"{"], stall))
        assert status == 408 and answer["__type"] == "RequestTimeoutException"
        assert app.inflight.held == 0
    asyncio.run(main())


def test_a_request_that_finds_the_budget_full_is_answered_503_and_the_others_go_on(quick):
    async def main() -> None:
        app = KinesisApp(_Service(), None, "000000000000")
        await app.inflight.acquire(limits.KINESIS_INFLIGHT_BYTES_MAX)      # (another request holds it all)
        status, answer = _status(await _call(app, 2, [b"{}"]))
        assert status == 503 and answer["__type"] == "ServiceUnavailableException"
        assert app.inflight.held == limits.KINESIS_INFLIGHT_BYTES_MAX
        app.inflight.release(limits.KINESIS_INFLIGHT_BYTES_MAX)
        status, _answer = _status(await _call(app, 2, [b"{}"]))
        assert status == 200 and app.inflight.held == 0
    asyncio.run(main())


def test_a_client_connection_s_end_is_not_reported_as_an_error_and_anything_else_is():
    import ssl

    from kinesis.server import _quiet_connection_ends

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[dict] = []
        loop.set_exception_handler(lambda _loop, context: seen.append(context))
        _quiet_connection_ends(loop)
        handler = loop.get_exception_handler()
        closed = ssl.SSLError(1, "[SSL: APPLICATION_DATA_AFTER_CLOSE_NOTIFY] application data after close notify")
        handler(loop, {"message": "Unhandled exception in client_connected_cb",
                       "exception": ExceptionGroup("unhandled errors in a TaskGroup", [closed])})
        handler(loop, {"message": "Unhandled exception in client_connected_cb", "exception": ConnectionResetError()})
        handler(loop, {"message": "Exception in callback", "exception": asyncio.CancelledError(),
                       "handle": "<Handle StreamReaderProtocol.connection_made.<locals>.callback(...)>"})
        assert seen == []
        bug = {"message": "Unhandled exception in client_connected_cb", "exception": ValueError("a bug")}
        other = {"message": "Task exception was never retrieved", "exception": ssl.SSLError(1, "elsewhere")}
        handler(loop, bug)
        handler(loop, other)
        assert seen == [bug, other]
    asyncio.run(main())
