"""AWS Signature Version 4, verified: what proves that a Kinesis request comes from the
holder of an SMS key's secret access key.

The SDKs sign each request with the `Authorization` header (docs.aws.amazon.com, "Create
a signed AWS API request"):

    AWS4-HMAC-SHA256 Credential=<key id>/<yyyymmdd>/<region>/kinesis/aws4_request,
        SignedHeaders=<names;...>, Signature=<hex>

over a canonical form of the request: the method, the path, the query, the signed headers
(lower-case names, values trimmed and their inner runs of spaces made one), their names,
and the SHA-256 of the body. The signature is an HMAC-SHA256 chain from the secret through
the date, the region and the service. This module rebuilds that form from what arrived
and compares; nothing here does I/O or reads the clock (the caller passes `now`).

`parse` reads the header (a `SignatureError` names what is wrong, with the error type
Kinesis answers); the caller looks up the key's secret; `verify` checks the signature and
the time. A request must carry `X-Amz-Date` (or `Date`) within SIGV4_CLOCK_SKEW_S of the
server's clock, and the credential's date must be that date: a captured request is
refused after that window, as Kinesis refuses it.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sms import limits

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "kinesis"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

_CREDENTIAL = re.compile(r"^([^/\s]{1,128})/(\d{8})/([a-z0-9-]{1,64})/([a-z0-9-]{1,64})/aws4_request$")
_SIGNATURE = re.compile(r"^[0-9a-f]{64}$")
_HEADER_NAME = re.compile(r"^(:authority|[a-z0-9!#$%&'*+.^_`|~-]+)$")     # (:authority: HTTP/2's host)


class SignatureError(Exception):
    """A request whose signature does not hold: `kind` is the error type Kinesis answers
    (`MissingAuthenticationTokenException`, `IncompleteSignatureException`,
    `InvalidSignatureException`, `UnrecognizedClientException`), `message` its text."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class Signed:
    """What the Authorization header claims."""
    access_key_id: str
    date: str                      # yyyymmdd, of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


def parse(headers: Mapping[str, Sequence[str]]) -> Signed:
    """The claim of a request's Authorization header (`headers`: lower-case names, every
    value each was sent with)."""
    values = headers.get("authorization") or ()
    if not values:
        raise SignatureError("MissingAuthenticationTokenException", "Missing Authentication Token")
    if len(values) > 1:
        raise SignatureError("IncompleteSignatureException", "Only one Authorization header is allowed.")
    auth = values[0]
    if len(auth) > limits.SIGV4_AUTHORIZATION_CHARS_MAX:
        raise SignatureError("IncompleteSignatureException", "The Authorization header is too long.")
    algorithm, _, rest = auth.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise SignatureError("IncompleteSignatureException",
                             f"Unsupported authorization type: {algorithm[:40]!r}; expected {ALGORITHM}.")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq or name in fields:
            raise SignatureError("IncompleteSignatureException",
                                 f"Authorization header requires 'Credential', 'SignedHeaders' and 'Signature' "
                                 f"parameters, each once. Authorization={auth[:200]}")
        fields[name] = value.strip()
    missing = [n for n in ("Credential", "SignedHeaders", "Signature") if not fields.get(n)]
    if missing:
        raise SignatureError("IncompleteSignatureException",
                             f"Authorization header requires '{missing[0]}' parameter. Authorization={auth[:200]}")
    m = _CREDENTIAL.match(fields["Credential"])
    if m is None:
        raise SignatureError("IncompleteSignatureException",
                             f"Credential should be scoped to a valid region, not '{fields['Credential'][:200]}'.")
    key_id, date, region, service = m.groups()
    if service != SERVICE:
        raise SignatureError("InvalidSignatureException",
                             f"Credential should be scoped to correct service: '{SERVICE}'.")
    signed = tuple(fields["SignedHeaders"].split(";"))
    if not all(_HEADER_NAME.match(h) for h in signed) or list(signed) != sorted(set(signed)) \
            or len(signed) > limits.SIGV4_SIGNED_HEADERS_MAX:
        raise SignatureError("IncompleteSignatureException",
                             "SignedHeaders must be lower-case header names, sorted, each once.")
    if "host" not in signed and ":authority" not in signed:
        raise SignatureError("InvalidSignatureException", "'Host' must be a signed header.")
    if not _SIGNATURE.match(fields["Signature"]):
        raise SignatureError("IncompleteSignatureException", "Signature must be 64 hexadecimal digits.")
    return Signed(key_id, date, region, service, signed, fields["Signature"])


def request_time(headers: Mapping[str, Sequence[str]]) -> datetime.datetime:
    """The request's signing time: X-Amz-Date (yyyymmddThhmmssZ), else Date (RFC 1123)."""
    stamp = (headers.get("x-amz-date") or ("",))[0]
    if stamp:
        try:
            return datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            raise SignatureError("IncompleteSignatureException",
                                 f"Date must be in ISO-8601 'basic format'. Got '{stamp[:40]}'.") from None
    date = (headers.get("date") or ("",))[0]
    if date:
        try:
            return datetime.datetime.strptime(date, "%a, %d %b %Y %H:%M:%S GMT").replace(tzinfo=datetime.timezone.utc)
        except ValueError:
            pass
    raise SignatureError("IncompleteSignatureException",
                         "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")


def _trimmed(value: str) -> str:
    return " ".join(value.split())


def canonical_query(query: str) -> str:
    """The query string in canonical form: each name and value URI-encoded (RFC 3986
    unreserved characters kept), sorted by name then value."""
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    enc = [(urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~")) for k, v in pairs]
    return "&".join(f"{k}={v}" for k, v in sorted(enc))


def canonical_request(method: str, path: str, query: str, headers: Mapping[str, Sequence[str]],
                      signed_headers: Sequence[str], payload_hash: str) -> str:
    """The canonical request of SigV4 (`path` as sent, already URI-encoded)."""
    lines = []
    for name in signed_headers:
        values = headers.get(name)
        if values is None:
            raise SignatureError("InvalidSignatureException", f"Signed header '{name}' is not in the request.")
        lines.append(f"{name}:{','.join(_trimmed(v) for v in values)}")
    return "\n".join([method, path or "/", canonical_query(query), "\n".join(lines) + "\n",
                      ";".join(signed_headers), payload_hash])


def signing_key(secret: str, date: str, region: str, service: str = SERVICE) -> bytes:
    key = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def signature(secret: str, signed: Signed, amz_date: str, canonical: str) -> str:
    to_sign = "\n".join([ALGORITHM, amz_date, signed.scope, hashlib.sha256(canonical.encode()).hexdigest()])
    return hmac.new(signing_key(secret, signed.date, signed.region, signed.service), to_sign.encode(),
                    hashlib.sha256).hexdigest()


def verify(signed: Signed, secret: str, method: str, path: str, query: str,
           headers: Mapping[str, Sequence[str]], body: bytes, now: datetime.datetime) -> None:
    """SignatureError unless `signed` is this request's signature by `secret`, made
    within SIGV4_CLOCK_SKEW_S of `now`."""
    when = request_time(headers)
    skew = abs((now - when).total_seconds())
    amz_date = when.strftime("%Y%m%dT%H%M%SZ")
    if skew > limits.SIGV4_CLOCK_SKEW_S:
        edge = datetime.timedelta(seconds=limits.SIGV4_CLOCK_SKEW_S)
        stamp = "%Y%m%dT%H%M%SZ"
        if when < now:
            raise SignatureError("InvalidSignatureException",
                                 f"Signature expired: {amz_date} is now earlier than "
                                 f"{(now - edge).strftime(stamp)} ({now.strftime(stamp)} - 5 min.)")
        raise SignatureError("InvalidSignatureException",
                             f"Signature not yet current: {amz_date} is still later than "
                             f"{(now + edge).strftime(stamp)} ({now.strftime(stamp)} + 5 min.)")
    if signed.date != amz_date[:8]:
        raise SignatureError("InvalidSignatureException",
                             f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date "
                             f"from HTTP: '{signed.date}' != '{amz_date[:8]}', from '{amz_date}'.")
    declared = (headers.get("x-amz-content-sha256") or ("",))[0]
    payload_hash = hashlib.sha256(body).hexdigest()
    if declared and declared != UNSIGNED_PAYLOAD and declared != payload_hash:
        raise SignatureError("InvalidSignatureException",
                             "The provided 'x-amz-content-sha256' header does not match what was computed.")
    if declared == UNSIGNED_PAYLOAD:
        payload_hash = UNSIGNED_PAYLOAD
    expected = signature(secret, signed, amz_date,
                         canonical_request(method, path, query, headers, signed.signed_headers, payload_hash))
    if not hmac.compare_digest(expected, signed.signature):
        raise SignatureError("InvalidSignatureException",
                             "The request signature we calculated does not match the signature you provided. "
                             "Check your AWS Secret Access Key and signing method. Consult the service "
                             "documentation for details.")
