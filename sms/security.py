"""Transport security shared by clients and nodes: TLS settings, channel credentials,
and who is at the other end of a call.

A secure cluster (docs/security.md) has one certificate authority. Every node holds a
certificate the CA issued with organisational unit `node` and its node id as common
name; clients may hold one with unit `client`. A node serves two ports:

- its *client port* (`NodeInfo.address`): TLS, the server authenticated by the CA; the
  client and admin APIs, never the cluster's own protocols;
- its *cluster port* (`NodeInfo.cluster_address`): mutual TLS, where only a peer holding
  a node certificate of this CA is served (append, replication, node status).

Nodes reach each other by address, so they check each other's certificate by one name
every node certificate carries (`NODE_TARGET_NAME`), and a receiving node reads the
caller's node id from the certificate (`peer_node_id`), never from the message.

Clients: `TlsConfig.resolve(ca_file=...)` is the explicit form; without one it reads
$SMS_CA_FILE (and $SMS_CERT_FILE / $SMS_KEY_FILE), and without those it is plaintext, for
a cluster started with `sms up --insecure`.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from typing import Any

import grpc

from sms import errors

NODE_UNIT = "node"                  # the certificate's organisational unit of a cluster node
CLIENT_UNIT = "client"              # and of a client (an application, an admin)
NODE_TARGET_NAME = "sms-node"       # a DNS name in every node certificate: how nodes verify each other
ENV_CA_FILE = "SMS_CA_FILE"
ENV_CERT_FILE = "SMS_CERT_FILE"
ENV_KEY_FILE = "SMS_KEY_FILE"
ENV_TOKEN = "SMS_TOKEN"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise errors.InvalidArgument(f"cannot read the {what} {path!r}: {e.strerror or e}") from None


@dataclass(frozen=True)
class TlsConfig:
    """PEM bytes: the CA to trust, and optionally a certificate and key to present."""

    ca: bytes
    cert: bytes = b""
    key: bytes = b""
    ca_file: str = ""

    @classmethod
    def from_files(cls, ca_file: str, cert_file: str = "", key_file: str = "") -> "TlsConfig":
        if bool(cert_file) != bool(key_file):
            raise errors.InvalidArgument("a certificate needs its key, and a key its certificate")
        return cls(ca=_read(ca_file, "CA file"), cert=_read(cert_file, "certificate") if cert_file else b"",
                   key=_read(key_file, "key") if key_file else b"", ca_file=os.path.abspath(ca_file))

    @classmethod
    def resolve(cls, ca_file: str | None = None, cert_file: str | None = None,
                key_file: str | None = None) -> "TlsConfig | None":
        """A client's TLS: the files given, else $SMS_CA_FILE (and $SMS_CERT_FILE,
        $SMS_KEY_FILE); None (plaintext) when there is no CA, or when ca_file is ""."""
        if ca_file is None:
            ca_file = os.environ.get(ENV_CA_FILE, "")
            cert_file = cert_file if cert_file is not None else os.environ.get(ENV_CERT_FILE, "")
            key_file = key_file if key_file is not None else os.environ.get(ENV_KEY_FILE, "")
        if not ca_file:
            return None
        return cls.from_files(ca_file, cert_file or "", key_file or "")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key or None,
                                            certificate_chain=self.cert or None)


AWS_SECRET_LABEL = b"sms: the AWS secret access key of this key"


def aws_credentials(token: str) -> tuple[str, str]:
    """(access key id, secret access key) of an SMS key for the Kinesis endpoint's AWS
    Signature V4 (docs/kinesis.md): the key's id, and a secret derived from the token's
    secret (HMAC-SHA256, 40 characters of its base64). Whoever holds the token computes
    them; the cluster keeps the secret only wrapped by its master key.

    Raises:
        InvalidArgument: not a token of the form sms_<key id>_<secret>."""
    from sms.errors import InvalidArgument
    key_id, sep, secret = token[4:].partition("_") if token.startswith("sms_") else ("", "", "")
    if not sep or not key_id or not secret:
        raise InvalidArgument("expected a token of the form sms_<key id>_<secret>")
    mac = hmac.new(secret.encode(), AWS_SECRET_LABEL, hashlib.sha256).digest()
    return key_id, base64.b64encode(mac).decode()[:40]


def resolve_token(token: str | None) -> str:
    """A client's credential: the one given, else $SMS_TOKEN, else none."""
    return token if token is not None else os.environ.get(ENV_TOKEN, "")


@dataclass(frozen=True)
class PeerCert:
    """What a verified certificate says of its holder."""

    unit: str              # NODE_UNIT, CLIENT_UNIT, or what another issuer wrote
    name: str              # the common name: a node id, or a client's name
    serial: int = 0        # its serial number (what revocation names)


@functools.lru_cache(maxsize=256)
def parse_cert(pem: bytes) -> PeerCert:
    """The unit and name of a PEM certificate (already verified by the TLS handshake)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return PeerCert(unit=str(units[0].value) if units else "", name=str(names[0].value) if names else "",
                    serial=cert.serial_number)


def cert_serial(certificate: str) -> str:
    """A certificate's serial in hex: from a PEM file's path, or the hex given (checked
    by the node)."""
    if os.path.isfile(certificate):
        try:
            with open(certificate, "rb") as f:
                return f"{parse_cert(f.read()).serial:x}"
        except (OSError, ValueError) as e:
            raise errors.InvalidArgument(f"cannot read a certificate from {certificate!r}: {e}") from None
    return certificate


def peer_cert(context: grpc.ServicerContext) -> PeerCert | None:
    """The certificate the caller of a gRPC call presented (verified against the CA by the
    handshake), or None: plaintext, or no certificate."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    return parse_cert(pems[0])


def peer_node_id(context: grpc.ServicerContext) -> str | None:
    """The node id of the cluster node at the other end of the call, from its
    certificate; None if the caller holds no node certificate."""
    cert = peer_cert(context)
    return cert.name if cert is not None and cert.unit == NODE_UNIT else None


def read_cluster_file(path: str) -> dict[str, Any]:
    """`sms up`'s DIR/cluster.json (given the file or DIR): address, ca_file, nodes."""
    if os.path.isdir(path):
        path = os.path.join(path, "cluster.json")
    try:
        with open(path) as f:
            info = json.load(f)
    except OSError as e:
        raise errors.InvalidArgument(f"cannot read the cluster file {path!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise errors.InvalidArgument(f"the cluster file {path!r} is not JSON: {e}") from None
    if not isinstance(info, dict) or not isinstance(info.get("address"), str):
        raise errors.InvalidArgument(f"the cluster file {path!r} names no address")
    return info


def cluster_file_options(path: str) -> tuple[str, dict[str, str]]:
    """(address, client options) of the cluster a cluster file names: its CA and its
    admin token ("" for a plaintext cluster)."""
    info = read_cluster_file(path)
    return info["address"], {"ca_file": info.get("ca_file", ""), "token": info.get("token", "")}
