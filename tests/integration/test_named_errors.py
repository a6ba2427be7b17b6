"""Named errors for inputs that used to escape as unnamed ones (issue 30 item 5): through
the real client and a raw channel, on the suite's TLS cluster.

- GroupWrite with JSON nested deeper than the parser goes answered INTERNAL
  RecursionError: now InvalidArgument (control/groups.py), for a member's entry and a
  lease's, and nothing is written.
- CreateStream named "." or ".." answered ValueError (a relative path component in the
  metadata store): now InvalidStreamName (sms/metadata.py validate_stream_name), for the
  default tenant and a tenant's key alike, and for the other calls that name a stream.
The node serves on after each.
"""

from __future__ import annotations

import grpc
import pytest

import sms
from sms import errors, limits
from sms.proto import sms_pb2, sms_pb2_grpc
from tests.conftest import client_channel

pytestmark = pytest.mark.integration

# as deep as fits in one group entry: far past the parser's recursion limit
DEEP = limits.GROUP_ENTRY_BYTES_MAX // 2
NESTED = [b"[" * DEEP + b"]" * DEEP, b'{"":' * (limits.GROUP_ENTRY_BYTES_MAX // 4), b"[" * (DEEP * 2)]


@pytest.fixture(scope="module")
def stream(client) -> str:
    client.create_stream("named-errors", partitions=1, replication_factor=1)
    return "named-errors"


def _sms_error(call) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return dict(e.value.trailing_metadata() or ()).get("sms-error", ""), e.value.details()


@pytest.mark.parametrize("member", [True, False], ids=["member", "lease"])
@pytest.mark.parametrize("value", NESTED, ids=["arrays", "objects", "unclosed"])
def test_deeply_nested_json_in_a_group_write_is_invalid_argument(cluster, client, stream, member, value):
    assert len(value) <= limits.GROUP_ENTRY_BYTES_MAX
    group = f"deep-{'m' if member else 'l'}-{NESTED.index(value)}"
    request = sms_pb2.GroupWriteRequest(stream=stream, group=group, member=member, key="m" if member else "0",
                                        value=value, version=-1)
    with client_channel(cluster.address) as channel:
        control = sms_pb2_grpc.ControlStub(channel)
        name, details = _sms_error(lambda: control.GroupWrite(request, timeout=10))
        assert name == "InvalidArgument", details
        state = control.GroupState(sms_pb2.GroupRequest(stream=stream, group=group), timeout=10)
    assert not state.leases and not state.members          # nothing written
    client.put_record(stream, b"still serving", "k")


@pytest.mark.parametrize("name", [".", ".."])
def test_a_relative_stream_name_is_invalid_stream_name(cluster, client, name):
    with pytest.raises(errors.InvalidStreamName, match="reserved"):
        client.create_stream(name, partitions=1, replication_factor=1)
    with client_channel(cluster.address) as channel:        # the raw call, past any client-side check
        control = sms_pb2_grpc.ControlStub(channel)
        for call in (lambda: control.CreateStream(sms_pb2.CreateStreamRequest(name=name, partitions=1,
                                                                              replication_factor=1), timeout=10),
                     lambda: control.DescribeStream(sms_pb2.DescribeStreamRequest(name=name), timeout=10),
                     lambda: control.DeleteStream(sms_pb2.DeleteStreamRequest(name=name), timeout=10)):
            assert _sms_error(call)[0] == "InvalidStreamName"
    with pytest.raises(errors.InvalidStreamName):
        client.put_record(name, b"x", "k")
    assert name not in client.list_streams()
    client.create_stream(f"after{name}", partitions=1, replication_factor=1)     # (dots inside a name are fine)
    client.put_record(f"after{name}", b"still serving", "k")


@pytest.mark.parametrize("name", [".", ".."])
def test_a_tenant_naming_a_relative_stream_gets_invalid_stream_name(cluster, client, name):
    tenant = "dots" + str(len(name))
    client.create_tenant(tenant)
    _info, token = client.create_key("admin", tenant=tenant)
    with sms.Client(cluster.address, ca_file=cluster.ca_file, token=token) as c:
        with pytest.raises(errors.InvalidStreamName):
            c.create_stream(name, partitions=1, replication_factor=1)
        with pytest.raises(errors.InvalidStreamName):
            c.create_key("producer", streams=[name])
        assert c.list_streams() == []
        c.create_stream("fine", partitions=1, replication_factor=1)
        c.put_record("fine", b"still serving", "k")
        assert c.list_streams() == ["fine"]
