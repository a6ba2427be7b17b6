"""The Kinesis operations this endpoint serves, by name (docs/kinesis.md, "Operations"):
each module of kinesis/ registers its own with `operation`, and kinesis/service.py
dispatches a request to HANDLERS[its operation]. A handler takes (KinesisService, the
request's parameters, Caller) and returns the answer as a dict."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[..., Awaitable[dict[str, Any]]]
HANDLERS: dict[str, Handler] = {}


def operation(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn
    return register
