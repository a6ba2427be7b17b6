"""A cluster's certificate authority and the certificates it issues (`sms certs`), with
the `cryptography` package (docs/security.md).

    DIR/ca.pem, DIR/ca.key            the CA (`sms certs init --dir DIR`)
    OUT/<name>.pem, OUT/<name>.key    a node's or a client's certificate and key
                                      (`sms certs issue --ca-dir DIR --node ID|--client NAME`)

Keys are ECDSA P-256 (a handshake costs well under a millisecond) and written with mode
0600. A node certificate has unit `node`, the node id as common name, and as names the
hosts clients reach it at plus `sms-node`, the name nodes check each other by; it serves
and calls (both extended key usages). A client certificate has unit `client` and may
only call.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sms import errors, security
from sms import limits

LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Issued:
    cert_file: str
    key_file: str


def ca_paths(ca_dir: str) -> Issued:
    return Issued(os.path.join(ca_dir, "ca.pem"), os.path.join(ca_dir, "ca.key"))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def write_file(path: str, data: bytes, private: bool) -> None:
    """Replace `path` atomically, through a temporary file made anew (O_EXCL) with its
    mode set on the descriptor: a file left at the temporary name, with whatever mode,
    is never written into."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    os.fchmod(fd, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def init_ca(ca_dir: str, name: str = "sms cluster CA", days: int = limits.CA_VALID_DAYS) -> Issued:
    """A new CA in `ca_dir`; refuses to replace one that is there (every certificate it
    issued would stop working)."""
    paths = ca_paths(ca_dir)
    if os.path.exists(paths.cert_file) or os.path.exists(paths.key_file):
        raise errors.FailedPrecondition(f"{ca_dir} already holds a CA; certificates it issued depend on it")
    if days <= 0:
        raise errors.InvalidArgument(f"a CA valid for {days} days")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    write_file(paths.key_file, _key_pem(key), private=True)
    write_file(paths.cert_file, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return paths


def _load_ca(ca_dir: str):
    paths = ca_paths(ca_dir)
    try:
        with open(paths.cert_file, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(paths.key_file, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except FileNotFoundError:
        raise errors.FailedPrecondition(f"no CA in {ca_dir}: create one with `sms certs init --dir {ca_dir}`") \
            from None
    except (OSError, ValueError, TypeError) as e:     # unreadable, damaged, or a key with a passphrase
        raise errors.FailedPrecondition(f"the CA in {ca_dir} cannot be used: {e}") from None
    return cert, key


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def issue(ca_dir: str, out_dir: str, *, node: str = "", client: str = "", hosts: tuple[str, ...] = (),
          days: int = limits.CERT_VALID_DAYS, not_before: datetime.datetime | None = None) -> Issued:
    """A certificate for `node` (an id) or `client` (a name) signed by the CA in `ca_dir`,
    written to OUT/<name>.pem and OUT/<name>.key. `hosts`: the names and addresses clients
    reach a node at (localhost, 127.0.0.1 and ::1 are always added). `not_before` (tests):
    back-date it, to make an expired certificate."""
    if bool(node) == bool(client):
        raise errors.InvalidArgument("issue a certificate for one --node or one --client")
    name = node or client
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum() or len(name) > 64:
        raise errors.InvalidArgument(f"certificate name {name!r}: letters, digits, '-', '_' and '.', at most 64")
    if days <= 0:
        raise errors.InvalidArgument(f"a certificate valid for {days} days")
    ca_cert, ca_key = _load_ca(ca_dir)
    key = ec.generate_private_key(ec.SECP256R1())
    unit = security.NODE_UNIT if node else security.CLIENT_UNIT
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start = not_before or (_now() - datetime.timedelta(minutes=5))
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if node:
        names = list(dict.fromkeys((security.NODE_TARGET_NAME,) + LOCAL_HOSTS + tuple(h for h in hosts if h)))
        builder = (builder.add_extension(x509.SubjectAlternativeName([_general_name(h) for h in names]),
                                         critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = Issued(os.path.join(out_dir, f"{name}.pem"), os.path.join(out_dir, f"{name}.key"))
    write_file(out.key_file, _key_pem(key), private=True)
    write_file(out.cert_file, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return out


def _holder(cert: x509.Certificate) -> tuple[str, str]:
    peer = security.parse_cert(cert.public_bytes(serialization.Encoding.PEM))
    return peer.unit, peer.name


def ensure_node_cert(ca_dir: str, out_dir: str, node_id: str, hosts: tuple[str, ...] = ()) -> Issued:
    """The node's certificate in `out_dir` if it is the CA's, names `hosts` and has more
    than limits.CERT_RENEW_BEFORE_DAYS to live; otherwise a new one (`sms up`, on every start)."""
    out = Issued(os.path.join(out_dir, f"{node_id}.pem"), os.path.join(out_dir, f"{node_id}.key"))
    try:
        with open(out.cert_file, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        ca_cert, _key = _load_ca(ca_dir)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        named = {str(v) for v in sans.get_values_for_type(x509.DNSName)} | \
                {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
        wanted = {str(_general_name(h).value) for h in hosts if h}
        with open(out.key_file, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        if (cert.issuer == ca_cert.subject and wanted <= named and key.public_key() == cert.public_key()
                and cert.not_valid_before_utc <= _now()
                and cert.not_valid_after_utc - _now() > datetime.timedelta(days=limits.CERT_RENEW_BEFORE_DAYS)
                and _holder(cert) == (security.NODE_UNIT, node_id)):
            cert.verify_directly_issued_by(ca_cert)
            return out
    except (OSError, ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature, errors.FailedPrecondition):
        pass                                     # missing, unreadable, of another CA: issued anew
    if not os.path.exists(ca_paths(ca_dir).cert_file):
        init_ca(ca_dir)
    return issue(ca_dir, out_dir, node=node_id, hosts=hosts)
