"""Unit tests of sms.errors (registry, flags, invariant) and the error mapping of kernel.rpc (the server's edge) and sms.rpc (the client's)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
import pytest

import sms.wire  # noqa: F401  (defines CorruptBatch, a registered subclass)
from kernel import rpc as server_rpc
from sms import errors, rpc


def _all_subclasses(cls: type) -> list[type]:
    out, todo = [], [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


ALL_ERRORS = sorted(_all_subclasses(errors.SmsError), key=lambda c: c.__name__)


def test_every_subclass_is_registered_under_its_name():
    registry = errors.registry()
    assert ALL_ERRORS, "no SmsError subclasses found"
    for cls in ALL_ERRORS:
        assert registry.get(cls.__name__) is cls, f"{cls.__name__} missing or shadowed in the registry"


def test_registered_names_are_unique():
    names = [cls.__name__ for cls in ALL_ERRORS]
    assert len(names) == len(set(names))


def test_registry_is_a_copy():
    copy = errors.registry()
    copy["Bogus"] = errors.InternalError
    assert "Bogus" not in errors.registry()


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_from_name_rebuilds_the_same_class_with_the_message(cls):
    rebuilt = errors.from_name(cls.__name__, "the message")
    assert type(rebuilt) is cls
    assert rebuilt.message == "the message"
    assert str(rebuilt) == "the message"
    assert rebuilt.name == cls.__name__


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_has_a_real_status_code(cls):
    assert isinstance(cls.code, grpc.StatusCode)
    assert cls.code not in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN)


@pytest.mark.parametrize("name", ["NoSuchError", "", "SmsError_", "InvariantViolation", "ValueError"])
def test_unknown_name_becomes_internal_error(name):
    rebuilt = errors.from_name(name, "msg")
    assert type(rebuilt) is errors.InternalError
    assert rebuilt.message == "msg"


@pytest.mark.parametrize("cls, retriable, refresh_map", [
    (errors.WrongOwner, True, True),
    (errors.PartitionClosed, True, True),
    (errors.Unavailable, True, True),
    (errors.StaleEpoch, True, True),
    (errors.Throttled, True, False),
    (errors.Timeout, True, False),
    (errors.StreamNotActive, True, False),
    (errors.InvalidArgument, False, False),
    (errors.StreamNotFound, False, False),
    (errors.NotEnoughNodes, False, False),
    (errors.InternalError, False, False),
])
def test_retry_and_refresh_flags(cls, retriable, refresh_map):
    assert cls.retriable is retriable
    assert cls.refresh_map is refresh_map
    assert cls("x").retriable is retriable


def test_refresh_map_errors_are_retriable():
    for cls in ALL_ERRORS:
        if cls.refresh_map:
            assert cls.retriable, cls.__name__


@pytest.mark.parametrize("cls, code", [
    (errors.InvalidSequenceNumber, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ExpiredIterator, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.WrongOwner, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.StreamNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.StreamAlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.Throttled, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Timeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (sms.wire.CorruptBatch, grpc.StatusCode.INTERNAL),
])
def test_status_codes(cls, code):
    assert cls.code == code


def test_details_are_kept():
    e = errors.WrongOwner("moved", owner="node-2")
    assert e.details == {"owner": "node-2"}


def test_invariant_passes_and_raises():
    errors.invariant(True, "never")
    errors.invariant(1, "never")
    with pytest.raises(errors.InvariantViolation, match="boom"):
        errors.invariant(False, "boom")
    with pytest.raises(errors.InvariantViolation):
        errors.invariant(0, "zero")
    assert not issubclass(errors.InvariantViolation, errors.SmsError)


def test_invariant_raises_under_python_O():
    code = (
        "import sys\n"
        "assert False, 'asserts must be off under -O'\n"
        "from sms.errors import invariant, InvariantViolation\n"
        "try:\n"
        "    invariant(False, 'still checked')\n"
        "except InvariantViolation as e:\n"
        "    print('raised:', e)\n"
        "    sys.exit(42)\n"
        "sys.exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 42, done.stderr
    assert "raised: still checked" in done.stdout


def test_uncaught_invariant_under_python_O_crashes_the_process():
    code = "from sms.errors import invariant\ninvariant(False, 'crash me')\n"
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "InvariantViolation: crash me" in done.stderr


# --- kernel.rpc and sms.rpc: server edge and client rebuild, with fakes (no sockets) ----------------------

class FakeAbort(Exception):
    pass


class FakeContext:
    def __init__(self):
        self.trailing = ()
        self.aborted: tuple | None = None

    def set_trailing_metadata(self, md):
        self.trailing = tuple(md)

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise FakeAbort(details)


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details, trailing=()):
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


class Handler:
    def __init__(self, exc: BaseException | None):
        self.exc = exc

    @server_rpc.rpc_errors
    async def Call(self, request, context):
        if self.exc is not None:
            raise self.exc
        return ("ok", request)


def _serve(exc: BaseException | None) -> tuple[FakeContext, object]:
    context = FakeContext()

    async def go():
        try:
            return await Handler(exc).Call("req", context)
        except FakeAbort:
            return None

    return context, asyncio.run(go())


def test_rpc_errors_passes_results_through():
    context, result = _serve(None)
    assert result == ("ok", "req") and context.aborted is None


@pytest.mark.parametrize("cls", ALL_ERRORS, ids=lambda c: c.__name__)
def test_error_round_trips_server_to_client(cls):
    context, _ = _serve(cls("why"))
    assert context.aborted == (cls.code, "why")
    assert context.trailing == ((rpc.ERROR_KEY, cls.__name__),)
    rebuilt = rpc.to_sms_error(FakeRpcError(cls.code, "why", context.trailing))
    assert type(rebuilt) is cls and rebuilt.message == "why"


def test_error_without_message_sends_its_name():
    context, _ = _serve(errors.WrongOwner())
    assert context.aborted == (grpc.StatusCode.FAILED_PRECONDITION, "WrongOwner")


def test_unexpected_exception_becomes_internal_error():
    context, _ = _serve(KeyError("lost"))
    assert context.aborted[0] == grpc.StatusCode.INTERNAL
    assert "KeyError" in context.aborted[1]
    assert context.trailing == ((rpc.ERROR_KEY, "InternalError"),)


def test_invariant_violation_is_not_mapped():
    with pytest.raises(errors.InvariantViolation):
        _serve(errors.InvariantViolation("bug"))


@pytest.mark.parametrize("code, cls", [
    (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.Timeout),
    (grpc.StatusCode.CANCELLED, errors.Unavailable),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.LimitExceeded),
    (grpc.StatusCode.UNIMPLEMENTED, errors.InternalError),
])
def test_unnamed_status_maps_by_code(code, cls):
    assert type(rpc.to_sms_error(FakeRpcError(code, "d"))) is cls


def test_unnamed_status_with_no_trailing_metadata():
    err = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "", None)
    assert type(rpc.to_sms_error(err)) is errors.Unavailable


def test_unknown_error_name_from_a_newer_server_becomes_internal():
    err = FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "d", ((rpc.ERROR_KEY, "FromTheFuture"),))
    assert type(rpc.to_sms_error(err)) is errors.InternalError


# --- every error class is defined in sms/errors.py ------------------------------------------------

def test_every_error_class_is_defined_in_the_registry_module():
    """A class derived from a registered error anywhere else would register only when its
    module is imported: a client that never imported it could not rebuild the error."""
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    names = set(errors.registry()) | {"SmsError"}
    outside = []
    for package in ("sms", "metastore", "kernel", "archive", "storage", "ingestion", "retrieval", "control", "sps",
                    "spark_sps", "node"):
        for path in sorted((root / package).rglob("*.py")):
            if path == root / "sms" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
                    if bases & names:
                        outside.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert not outside, "error classes outside sms/errors.py:\n" + "\n".join(outside)
