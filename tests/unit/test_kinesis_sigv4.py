"""kinesis/sigv4.py against botocore's own signer: a request botocore signs verifies, and
every change to what it signed (body, target, time, key, scope) is refused with the error
type Kinesis answers."""

from __future__ import annotations

import datetime
import json

import pytest

botocore = pytest.importorskip("botocore")
from botocore.auth import SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402

from kinesis import sigv4  # noqa: E402

KEY_ID, SECRET = "0123456789abcdef", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"
URL = "http://127.0.0.1:4567/"


def _signed(body: bytes = b'{"StreamName": "s"}', target: str = "Kinesis_20131202.DescribeStreamSummary",
            key_id: str = KEY_ID, secret: str = SECRET,
            region: str = "us-east-1", service: str = "kinesis", extra: dict | None = None):
    """A request as botocore sends it: (method, path, query, headers by lower-case name, body)."""
    request = AWSRequest(method="POST", url=URL, data=body,
                         headers={"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": target,
                                  **(extra or {})})
    SigV4Auth(Credentials(key_id, secret), service, region).add_auth(request)
    prepared = request.prepare()
    headers: dict[str, list[str]] = {}
    for name, value in prepared.headers.items():
        headers.setdefault(name.lower(), []).append(value if isinstance(value, str) else value.decode())
    headers.setdefault("host", ["127.0.0.1:4567"])
    return "POST", "/", "", headers, prepared.body if isinstance(prepared.body, bytes) else prepared.body.encode()


def _check(method, path, query, headers, body, secret=SECRET, now=None):
    signed = sigv4.parse(headers)
    sigv4.verify(signed, secret, method, path, query, headers, body,
                 now or datetime.datetime.now(datetime.timezone.utc))
    return signed


def test_a_request_botocore_signed_verifies():
    signed = _check(*_signed())
    assert signed.access_key_id == KEY_ID and signed.service == "kinesis" and "x-amz-target" in signed.signed_headers


def test_a_changed_body_target_or_secret_is_refused():
    method, path, query, headers, body = _signed()
    with pytest.raises(sigv4.SignatureError) as e:
        _check(method, path, query, headers, json.dumps({"StreamName": "other"}).encode())
    assert e.value.kind == "InvalidSignatureException" and "does not match" in e.value.message
    changed = {**headers, "x-amz-target": ["Kinesis_20131202.DeleteStream"]}
    with pytest.raises(sigv4.SignatureError, match="does not match"):
        _check(method, path, query, changed, body)
    with pytest.raises(sigv4.SignatureError, match="does not match"):
        _check(method, path, query, headers, body, secret=SECRET + "x")


def test_time_outside_the_window_is_refused_and_inside_it_is_not():
    request = _signed()
    then = datetime.datetime.strptime(request[3]["x-amz-date"][0], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=datetime.timezone.utc)
    _check(*request, now=then + datetime.timedelta(seconds=299))
    _check(*request, now=then - datetime.timedelta(seconds=299))
    with pytest.raises(sigv4.SignatureError, match="Signature expired"):
        _check(*request, now=then + datetime.timedelta(seconds=301))
    with pytest.raises(sigv4.SignatureError, match="not yet current"):
        _check(*request, now=then - datetime.timedelta(seconds=301))


def test_missing_and_malformed_authorization_get_their_kinesis_errors():
    method, path, query, headers, body = _signed()
    without = {k: v for k, v in headers.items() if k != "authorization"}
    with pytest.raises(sigv4.SignatureError) as e:
        sigv4.parse(without)
    assert e.value.kind == "MissingAuthenticationTokenException"
    for bad in ["Basic abc", "AWS4-HMAC-SHA256 Credential=x", "AWS4-HMAC-SHA256 Credential=a/b/c/d/e, "
                "SignedHeaders=host, Signature=00", headers["authorization"][0].replace("Signature=", "Signature=zz")]:
        with pytest.raises(sigv4.SignatureError) as e:
            sigv4.parse({**headers, "authorization": [bad]})
        assert e.value.kind == "IncompleteSignatureException", bad
    other_service = _signed(service="s3")[3]
    with pytest.raises(sigv4.SignatureError) as e:
        sigv4.parse(other_service)
    assert e.value.kind == "InvalidSignatureException" and "kinesis" in e.value.message


def test_a_signed_header_that_is_not_there_is_refused():
    method, path, query, headers, body = _signed()
    without = {k: v for k, v in headers.items() if k != "x-amz-target"}
    with pytest.raises(sigv4.SignatureError, match="not in the request"):
        _check(method, path, query, without, body)
