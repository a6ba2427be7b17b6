"""Every client RPC with what no honest client sends (issue 30 item 6; docs/security.md,
"Bad input").

A dedicated TLS cluster; the calls go raw (no client-side validation) with the cluster
admin's key, to the control node and to a storage node, over every method of the
services on the client port, found from the proto's own descriptors (a method added
later is fuzzed too). For each method and each of its string fields (top level and one
message deep, maps and repeated fields included), requests with one hostile value in that
field: deeply nested JSON, "." and "..", names with a path or the tenant separator, NUL,
very long text; and in each bytes field, bytes that are not UTF-8 or nested JSON. The
other fields hold plausible values (a victim stream, its first partition, a group), so
that the hostile one gets past the first checks to the code that parses it. Every
answer must be a success or a named error (the error name in the trailing metadata,
with its own status code), never InternalError (a bug caught) nor a status without a name, and afterwards
the node still serves a put and a read, and the target stream is unchanged. (The control
node has no Ingestion or Retrieval service: gRPC's UNIMPLEMENTED there is not counted.)
"""

from __future__ import annotations

from collections import Counter

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from sms import errors
from sms.proto import sms_pb2, sms_pb2_grpc
from sms.rpc import ERROR_KEY
from tests.conftest import client_channel, read_stream, stream_name

pytestmark = pytest.mark.integration

SERVICES = ("Control", "Ingestion", "Retrieval", "Queues")
DEPTH = 10_000
HOSTILE_TEXT = {
    "nested JSON array": "[" * DEPTH + "]" * DEPTH,
    "nested JSON object": '{"a":' * DEPTH + "1" + "}" * DEPTH,
    "dot": ".",
    "dot dot": "..",
    "relative path": "a/../b",
    "tenant separator": "x~..",
    "NUL": "a\x00b",
    "long": "é" * 5_000,
}
HOSTILE_BYTES = {
    "not UTF-8": b"\xff\xfe\xc0\x80\xed\xa0\x80",
    "nested JSON": b"[" * DEPTH + b"]" * DEPTH,
}
STREAM_CALL_WAIT_S = 3.0        # a streaming answer: its first message, an error, or nothing in this time


BASELINE = {"stream": "{victim}", "name": "{victim}", "partition_id": "p0000", "group": "fuzz-group",
            "queue": "fuzz-queue",
            "key": "fuzz-member", "position": "TRIM_HORIZON", "iterator_type": "TRIM_HORIZON", "role": "consumer"}


def _baseline(message, victim: str) -> None:
    """Plausible values in the fields a call needs to get past its first check: the
    victim stream, its first partition, a group (the hostile value then reaches the
    field under test, not the stream-name check)."""
    for field in message.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_STRING and not field.is_repeated and field.name in BASELINE:
            setattr(message, field.name, BASELINE[field.name].format(victim=victim))


def _slots(descriptor, prefix: tuple = ()) -> list[tuple[tuple[str, ...], str]]:
    """(field path, kind) of every string, bytes, repeated string and map field, one
    nested message deep; kind: "text", "bytes", "list", "map"."""
    out = []
    for field in descriptor.fields:
        path = prefix + (field.name,)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING:
                out.append((path, "map"))
        elif field.type == FieldDescriptor.TYPE_STRING:
            out.append((path, "list" if field.is_repeated else "text"))
        elif field.type == FieldDescriptor.TYPE_BYTES and not field.is_repeated:
            out.append((path, "bytes"))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not prefix:
            out += _slots(field.message_type, path)
    return out


def _set(message, path: tuple[str, ...], kind: str, value) -> None:
    for name in path[:-1]:
        holder = getattr(message, name)
        message = holder.add() if hasattr(holder, "add") else holder
    name = path[-1]
    if kind == "map":
        entry = message.DESCRIPTOR.fields_by_name[name].message_type.fields_by_name["value"]
        getattr(message, name)[value] = value if entry.type == FieldDescriptor.TYPE_STRING else (
            value.encode() if entry.type == FieldDescriptor.TYPE_BYTES else 1)
    elif kind == "list":
        getattr(message, name).append(value)
    else:
        setattr(message, name, value)


def _methods() -> list[tuple[str, str]]:
    return [(service, method.name) for service in SERVICES
            for method in sms_pb2.DESCRIPTOR.services_by_name[service].methods
            if not method.client_streaming]


def _call(channel: grpc.Channel, service: str, method: str, request) -> tuple[str, str, str]:
    """(status code name, error name from the trailing metadata, details) of one call."""
    descriptor = sms_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    path = f"/sms.v1.{service}/{method}"
    response_class = getattr(sms_pb2, descriptor.output_type.name)
    if descriptor.server_streaming:
        call = channel.unary_stream(path, request_serializer=type(request).SerializeToString,
                                    response_deserializer=response_class.FromString)(request,
                                                                                   timeout=STREAM_CALL_WAIT_S)
        try:
            for _answer in call:
                break
            call.cancel()
            return "OK", "", ""
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                return "OK", "", ""           # (a stream that waits for records: no harm)
            return e.code().name, dict(e.trailing_metadata() or ()).get(ERROR_KEY, ""), e.details() or ""
    stub = channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                               response_deserializer=response_class.FromString)
    try:
        stub(request, timeout=30)
        return "OK", "", ""
    except grpc.RpcError as e:
        return e.code().name, dict(e.trailing_metadata() or ()).get(ERROR_KEY, ""), e.details() or ""


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    from node.launcher import LocalCluster
    cluster = LocalCluster(str(tmp_path_factory.mktemp("api-fuzz")), nodes=2, port=0).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_every_rpc_answers_hostile_fields_with_a_named_error(local):
    import sms
    with sms.Client(local.address, **local.client_options()) as client:
        target = stream_name("fuzz-target")
        client.create_stream(target, partitions=1, replication_factor=2)
        client.put_records(target, [(f"k{i}", b"record %d" % i) for i in range(10)])
        before = read_stream(client, target)
        victim = stream_name("fuzz-victim")         # the calls' stream: it may be changed, or deleted
        client.create_stream(victim, partitions=1, replication_factor=2)
        client.create_queue(victim, "fuzz-queue", starting_position="TRIM_HORIZON")
        storage = client.get_stream_info(target).partition(0).chain[0].address
        unnamed, calls, outcomes = [], 0, Counter()
        for address in (local.address, storage):
            with client_channel(address, options=[("grpc.max_send_message_length", 64 << 20)],
                                token=local.admin_token) as channel:
                for service, method in _methods():
                    request_class = getattr(sms_pb2, sms_pb2.DESCRIPTOR.services_by_name[service]
                                            .methods_by_name[method].input_type.name)
                    for path, kind in _slots(request_class.DESCRIPTOR):
                        hostile = HOSTILE_BYTES if kind == "bytes" else HOSTILE_TEXT
                        for case, value in hostile.items():
                            request = request_class()
                            _baseline(request, victim)
                            _set(request, path, kind, value)
                            code, name, details = _call(channel, service, method, request)
                            if code == "UNIMPLEMENTED" and address == local.address and service != "Control":
                                break       # (the control node serves no data: its services are not there)
                            calls += 1
                            outcomes[name or code] += 1
                            error = getattr(errors, name, None) if name else None
                            if code != "OK" and (name == "InternalError" or not (
                                    isinstance(error, type) and issubclass(error, errors.SmsError)
                                    and error.code.name == code)):
                                unnamed.append(f"{service}.{method} {'.'.join(path)} = {case}: {code} "
                                               f"{name!r} {details[:120]!r}")
        print(f"{calls} calls: {dict(outcomes.most_common())}")
        assert not unnamed, f"{len(unnamed)} of {calls} calls got no named error:\n" + "\n".join(unnamed[:30])
        # the node serves, and nothing of the target changed
        acked = client.put_record(target, b"after the fuzz", "k")
        assert client.get_record(target, acked.sequence_number).data == b"after the fuzz"
        after = read_stream(client, target)
        assert {o: [(r.sn, r.data) for r in rs] for o, rs in after.items() if rs} != {}
        assert [(r.sn, r.data) for r in after[0][:len(before[0])]] == [(r.sn, r.data) for r in before[0]]
