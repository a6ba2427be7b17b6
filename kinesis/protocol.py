"""The Kinesis wire protocol as the SDKs speak it: `POST /` with
`X-Amz-Target: Kinesis_20131202.<Operation>` and a body in AWS JSON 1.1
(`application/x-amz-json-1.1`: boto3, the AWS CLI, JavaScript) or CBOR 1.1
(`application/x-amz-cbor-1.1`: the Java SDK and the KCL).

The service model in the botocore that pip installs (the spec of the issue) drives both
directions: `decode` turns a request body into the operation's input, checked against every
constraint the model states (required members, types, lengths, ranges, patterns, enums),
with blobs made bytes and timestamps made seconds; `encode` writes an operation's output
the way the model's shapes say (JSON: blobs as base64 and timestamps as epoch seconds;
CBOR: byte strings and tag-1 epoch times). Errors are `KinesisError`s: HTTP 400 with
`__type` and `message`, the messages worded as the service words them (a constraint: "1
validation error detected: Value 'x' at 'streamName' failed to satisfy constraint: ...").

botocore is used here as the model's reader, never as a client.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import functools
import json
import math
import re
from typing import Any

from sms import limits

TARGET_PREFIX = "Kinesis_20131202."
CONTENT_JSON = "application/x-amz-json-1.1"
CONTENT_CBOR = "application/x-amz-cbor-1.1"
CONTENT_TYPES = (CONTENT_JSON, CONTENT_CBOR)


class KinesisError(Exception):
    """An answer of HTTP `status` with the error type `kind` (the `__type` the SDKs map to
    their exception classes) and `message`."""

    def __init__(self, kind: str, message: str, status: int = 400):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status = status


def validation_error(problems: list[str]) -> KinesisError:
    """The service's own wording of failed constraints (at most 10 listed)."""
    n = len(problems)
    shown = "; ".join(problems[:10])
    return KinesisError("ValidationException", f"{n} validation error{'s' if n != 1 else ''} detected: {shown}")


@functools.cache
def model():
    """botocore's Kinesis service model (read once per process)."""
    import botocore.session
    return botocore.session.get_session().get_service_model("kinesis")


@functools.cache
def _pattern(text: str) -> re.Pattern:
    return re.compile(text)


def operation_of(target: str | None):
    """The operation model named by an X-Amz-Target header."""
    if not target:
        raise KinesisError("UnknownOperationException", "Missing X-Amz-Target header")
    if not target.startswith(TARGET_PREFIX):
        raise KinesisError("UnknownOperationException", f"Unknown target prefix {target[:100]!r}; "
                                                        f"expected {TARGET_PREFIX}<Operation>")
    name = target[len(TARGET_PREFIX):]
    if name not in model().operation_names:
        raise KinesisError("UnknownOperationException", f"Unknown operation {name[:100]!r}")
    return model().operation_model(name)


def media_type(content_type: str | None) -> str:
    """The body's protocol from its Content-Type (JSON when none is given, as the service
    takes it)."""
    kind = (content_type or CONTENT_JSON).split(";", 1)[0].strip().lower()
    if kind in ("application/json", "application/x-amz-json-1.0"):
        return CONTENT_JSON
    if kind not in CONTENT_TYPES:
        raise KinesisError("UnsupportedMediaTypeException", f"Content-Type {kind[:100]!r} is not supported; "
                                                            f"expected {CONTENT_JSON} or {CONTENT_CBOR}", 415)
    return kind


# --- requests ------------------------------------------------------------------------------------

def decode(operation, body: bytes, content: str) -> dict[str, Any]:
    """The operation's input from a request body, validated against the model."""
    if len(body) > limits.KINESIS_REQUEST_BYTES_MAX:
        raise KinesisError("ValidationException", f"request body of {len(body)} bytes; at most "
                                                  f"{limits.KINESIS_REQUEST_BYTES_MAX}", 413)
    if not body.strip():
        raw: Any = {}
    elif content == CONTENT_CBOR:
        import cbor2
        try:
            raw = cbor2.loads(body)
        except (cbor2.CBORDecodeError, ValueError, TypeError, EOFError, OverflowError, MemoryError,
                RecursionError) as e:    # (what cbor2 raises for a body that is not CBOR, or claims too much)
            raise KinesisError("SerializationException", f"the body is not CBOR: {type(e).__name__}") from None
    else:
        try:
            raw = json.loads(body)
        except (ValueError, RecursionError) as e:
            raise KinesisError("SerializationException", f"the body is not JSON: {str(e)[:100]}") from None
    if not isinstance(raw, dict):
        raise KinesisError("SerializationException", "the body must be an object")
    shape = operation.input_shape
    if shape is None:
        return {}
    try:
        return _fast_checker(operation.name, content)(raw)
    except _Slow:
        pass          # (something to convert with care, or to report: the full walk says what)
    problems: list[str] = []
    value = _check(shape, raw, _member_path(shape.name), problems, content, 0)
    if problems:
        raise validation_error(problems)
    return value


_INT_LIMIT = 2 ** 63        # integers and longs of the model are 64-bit: anything else is refused as it is read


class _Slow(Exception):
    """The fast checker's way out: this input needs `_check`'s full walk."""


_SLOW = _Slow()


@functools.cache
def _fast_checker(operation_name: str, content: str):
    """The operation's input checked and converted by closures made once from the model: the
    same value `_check` makes of an input it finds no fault with, or `_Slow` for anything
    else (a fault, a conversion it does not make: `_check` then reports or converts it).
    The hot operations (PutRecords: 500 entries) pay for the model walk once, not per
    record; tests/unit/test_kinesis_protocol.py holds both to the same answers."""
    return _compile_check(model().operation_model(operation_name).input_shape, content, 0)


def _compile_check(shape, content: str, depth: int):
    if depth > limits.KINESIS_NESTING_MAX:
        def too_deep(value):
            raise _SLOW
        return too_deep
    kind, meta = shape.type_name, shape.metadata
    lo, hi = meta.get("min"), meta.get("max")

    def sized(n: int) -> bool:
        return (lo is None or n >= lo) and (hi is None or n <= hi)
    if kind == "structure":
        members = {name: _compile_check(m, content, depth + 1) for name, m in shape.members.items()}
        required = tuple(shape.required_members)

        def structure(value):
            if type(value) is not dict:
                raise _SLOW
            for name in required:
                if value.get(name) is None:
                    raise _SLOW
            return {k: (None if x is None else members[k](x)) for k, x in value.items() if k in members}
        return structure
    if kind in ("list", "map"):
        item = _compile_check(shape.member if kind == "list" else shape.value, content, depth + 1)
        key = _compile_check(shape.key, content, depth + 1) if kind == "map" else None

        def collection(value):
            if type(value) is not (list if kind == "list" else dict) or not sized(len(value)):
                raise _SLOW
            if kind == "list":
                return [item(x) for x in value]           # (a None: _Slow, and the walk refuses it)
            return {key(k): item(x) for k, x in value.items()}
        return collection
    if kind == "string":
        pattern = _pattern(meta["pattern"]) if meta.get("pattern") else None
        enum = frozenset(shape.enum) if shape.enum else None

        def string(value):
            if type(value) is not str or not sized(len(value)) or \
                    (pattern is not None and not pattern.fullmatch(value)) or (enum is not None and value not in enum):
                raise _SLOW
            return value
        return string
    if kind in ("integer", "long"):
        def integer(value):
            if type(value) is not int or not -_INT_LIMIT <= value < _INT_LIMIT or not sized(value):
                raise _SLOW
            return value
        return integer
    if kind == "boolean":
        def boolean(value):
            if type(value) is not bool:
                raise _SLOW
            return value
        return boolean
    if kind == "blob":
        def blob(value):
            if type(value) is str:
                try:
                    data = base64.b64decode(value, validate=True)
                except (binascii.Error, ValueError):
                    raise _SLOW from None
            elif type(value) is bytes and content == CONTENT_CBOR:
                data = value
            else:
                raise _SLOW
            if not sized(len(data)):
                raise _SLOW
            return data
        return blob

    def other(value):          # (timestamps, and anything else: the full walk)
        raise _SLOW
    return other


def _member_path(name: str) -> str:
    return name[:1].lower() + name[1:]


def _shown(value: Any) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _check(shape, value: Any, path: str, problems: list[str], content: str, depth: int) -> Any:
    """`value` as the shape wants it, or a SerializationException for a wrong type; the
    constraints it breaks are added to `problems` (all of them, as the service lists them)."""
    if depth > limits.KINESIS_NESTING_MAX:
        raise KinesisError("SerializationException", f"{path}: nested too deeply")
    kind = shape.type_name
    meta = shape.metadata
    if value is None:
        return None
    if kind == "structure":
        if not isinstance(value, dict):
            raise KinesisError("SerializationException", f"{path}: expected an object")
        out = {}

        def where(name: str) -> str:          # (the input's own members are named alone)
            return f"{path}.{_member_path(name)}" if depth else _member_path(name)
        for name in shape.required_members:
            if value.get(name) is None:
                problems.append(f"Value null at '{where(name)}' failed to satisfy constraint: Member must not be null")
        for name, member in shape.members.items():
            if name in value:
                out[name] = _check(member, value[name], where(name), problems, content, depth + 1)
        return out
    if kind == "list":
        if not isinstance(value, list):
            raise KinesisError("SerializationException", f"{path}: expected a list")
        _length(len(value), meta, path, value, problems, "length")
        if any(v is None for v in value):
            raise KinesisError("SerializationException", f"{path}: null in a list")
        return [_check(shape.member, v, f"{path}.{i + 1}.member", problems, content, depth + 1)
                for i, v in enumerate(value)]
    if kind == "map":
        if not isinstance(value, dict):
            raise KinesisError("SerializationException", f"{path}: expected a map")
        _length(len(value), meta, path, value, problems, "length")
        if any(k is None or v is None for k, v in value.items()):
            raise KinesisError("SerializationException", f"{path}: null in a map")
        return {_check(shape.key, k, f"{path}.key", problems, content, depth + 1):
                _check(shape.value, v, f"{path}.value", problems, content, depth + 1) for k, v in value.items()}
    if kind == "string":
        if not isinstance(value, str):
            raise KinesisError("SerializationException", f"{path}: expected a string")
        _length(len(value), meta, path, value, problems, "length")
        pattern = meta.get("pattern")
        if pattern and not _pattern(pattern).fullmatch(value):
            problems.append(f"Value '{_shown(value)}' at '{path}' failed to satisfy constraint: Member must satisfy "
                            f"regular expression pattern: {pattern}")
        if shape.enum and value not in shape.enum:
            problems.append(f"Value '{_shown(value)}' at '{path}' failed to satisfy constraint: Member must satisfy "
                            f"enum value set: [{', '.join(shape.enum)}]")
        return value
    if kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (isinstance(value, float) and not value.is_integer()):
            raise KinesisError("SerializationException", f"{path}: expected an integer")
        if not -_INT_LIMIT <= value < _INT_LIMIT:
            raise KinesisError("SerializationException", f"{path}: an integer out of the 64-bit range")
        value = int(value)
        _bounds(value, meta, path, str(value), problems, "value")
        return value
    if kind == "boolean":
        if not isinstance(value, bool):
            raise KinesisError("SerializationException", f"{path}: expected a boolean")
        return value
    if kind == "blob":
        if isinstance(value, (bytes, bytearray)) and content == CONTENT_CBOR:
            data = bytes(value)
        elif isinstance(value, str):
            try:
                data = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise KinesisError("SerializationException", f"{path}: not base64") from None
        else:
            raise KinesisError("SerializationException", f"{path}: expected base64 data")
        _length(len(data), meta, path, "<binary>", problems, "length")
        return data
    if kind == "timestamp":
        return _seconds(value, path)
    raise KinesisError("SerializationException", f"{path}: a {kind} is not taken")      # (no such shape in the model)


def _length(n: int, meta: dict, path: str, value: Any, problems: list[str], what: str) -> None:
    shown = _shown(value) if not isinstance(value, (list, dict)) else ("[...]" if isinstance(value, list) else "{...}")
    _bounds(n, meta, path, shown, problems, what)


def _bounds(n: int, meta: dict, path: str, shown: str, problems: list[str], what: str) -> None:
    """The model's min and max of a number, or of a length, in the service's words."""
    if "min" in meta and n < meta["min"]:
        problems.append(f"Value '{shown}' at '{path}' failed to satisfy constraint: Member must have {what} "
                        f"greater than or equal to {meta['min']}")
    if "max" in meta and n > meta["max"]:
        problems.append(f"Value '{shown}' at '{path}' failed to satisfy constraint: Member must have {what} "
                        f"less than or equal to {meta['max']}")


def _seconds(value: Any, path: str) -> float:
    """A timestamp as epoch seconds: a number (JSON), a tag-1 time (CBOR: a datetime or a
    number) or ISO 8601 text."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise KinesisError("SerializationException", f"{path}: not a timestamp") from None
        return _seconds(parsed, path)
    raise KinesisError("SerializationException", f"{path}: expected a timestamp")


# --- answers -------------------------------------------------------------------------------------

def encode(operation, value: dict[str, Any], content: str) -> bytes:
    """An operation's output, written as its shapes say."""
    if operation.output_shape is None:
        return _dump({}, content)
    return _dump(_encoder(operation.name, content)(value), content)


@functools.cache
def _encoder(operation_name: str, content: str):
    """`_out` of the operation's output shape, as closures made once from the model: members
    that need no conversion (strings, numbers, structures of them) are passed as they are."""
    return _compile_out(model().operation_model(operation_name).output_shape, content, 0) or _same


def _same(value: Any) -> Any:
    return value


def _compile_out(shape, content: str, depth: int):
    """A function writing a value of `shape`, or None where `_out` would change nothing but
    drop a structure's None and unknown members (which a plain value has none of)."""
    kind = shape.type_name
    if depth > limits.KINESIS_NESTING_MAX:
        return lambda value: _out(shape, value, content)
    if kind == "structure":
        members = {name: _compile_out(m, content, depth + 1) for name, m in shape.members.items()}

        def structure(value):
            out = {}
            for k, x in value.items():
                if x is not None and k in members:
                    fn = members[k]
                    out[k] = x if fn is None else fn(x)
            return out
        return structure
    if kind == "list":
        item = _compile_out(shape.member, content, depth + 1) or _same
        return lambda value: [None if x is None else item(x) for x in value]
    if kind == "map":
        item = _compile_out(shape.value, content, depth + 1) or _same
        return lambda value: {k: None if x is None else item(x) for k, x in value.items()}
    if kind in ("blob", "timestamp"):
        return lambda value: _out(shape, value, content)
    return None


def encode_shape(shape, value: dict[str, Any], content: str) -> bytes:
    """A value of one shape (an event of an event stream), written as the shape says."""
    return _dump(_out(shape, value, content), content)


def encode_error(error: KinesisError, content: str) -> bytes:
    return _dump({"__type": error.kind, "message": error.message}, content)


def _dump(value: Any, content: str) -> bytes:
    if content == CONTENT_CBOR:
        import cbor2
        return cbor2.dumps(value, datetime_as_timestamp=True, timezone=datetime.timezone.utc)
    return json.dumps(value, separators=(",", ":")).encode()


def _out(shape, value: Any, content: str) -> Any:
    if value is None:
        return None
    kind = shape.type_name
    if kind == "structure":
        return {name: _out(shape.members[name], v, content) for name, v in value.items()
                if v is not None and name in shape.members}
    if kind == "list":
        return [_out(shape.member, v, content) for v in value]
    if kind == "map":
        return {k: _out(shape.value, v, content) for k, v in value.items()}
    if kind == "blob":
        return bytes(value) if content == CONTENT_CBOR else base64.b64encode(value).decode()
    if kind == "timestamp":
        seconds = value.timestamp() if isinstance(value, datetime.datetime) else float(value)
        if content == CONTENT_CBOR:
            return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        return seconds
    return value
