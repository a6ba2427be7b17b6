"""The CA and the certificates it issues (node/certs.py), and a client's TLS settings
(sms/security.py): real keys and certificates in a temporary directory."""

from __future__ import annotations

import datetime
import os
import stat

import pytest
from cryptography import x509

from control import revocation
from node import certs
from sms import errors, limits, security


def _load(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def _names(cert: x509.Certificate) -> set[str]:
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in sans.get_values_for_type(x509.DNSName)} | \
           {str(v) for v in sans.get_values_for_type(x509.IPAddress)}


def test_a_ca_and_a_node_certificate(tmp_path):
    ca = certs.init_ca(str(tmp_path / "ca"))
    assert stat.S_IMODE(os.stat(ca.key_file).st_mode) == 0o600
    node = certs.issue(str(tmp_path / "ca"), str(tmp_path / "out"), node="n1", hosts=("10.0.0.5", "n1.example.org"))
    assert stat.S_IMODE(os.stat(node.key_file).st_mode) == 0o600
    cert = _load(node.cert_file)
    cert.verify_directly_issued_by(_load(ca.cert_file))
    assert {security.NODE_TARGET_NAME, "localhost", "127.0.0.1", "::1", "10.0.0.5", "n1.example.org"} <= _names(cert)
    with open(node.cert_file, "rb") as f:
        assert security.parse_cert(f.read()) == security.PeerCert(unit=security.NODE_UNIT, name="n1",
                                                                  serial=cert.serial_number)
    assert security.cert_serial(node.cert_file) == f"{cert.serial_number:x}"


def test_a_client_certificate_cannot_serve(tmp_path):
    certs.init_ca(str(tmp_path / "ca"))
    issued = certs.issue(str(tmp_path / "ca"), str(tmp_path / "out"), client="billing")
    cert = _load(issued.cert_file)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
    with open(issued.cert_file, "rb") as f:
        assert security.parse_cert(f.read()).unit == security.CLIENT_UNIT


def test_a_ca_is_never_replaced(tmp_path):
    first = certs.init_ca(str(tmp_path / "ca"))
    with open(first.cert_file, "rb") as f:
        before = f.read()
    with pytest.raises(errors.FailedPrecondition, match="already holds a CA"):
        certs.init_ca(str(tmp_path / "ca"))
    with open(first.cert_file, "rb") as f:
        assert f.read() == before


@pytest.mark.parametrize("kwargs, error", [
    ({}, "one --node or one --client"),
    ({"node": "n1", "client": "c"}, "one --node or one --client"),
    ({"node": "n 1"}, "letters, digits"),
    ({"node": "n1/../x"}, "letters, digits"),
    ({"node": "n1", "days": 0}, "valid for 0 days"),
])
def test_bad_requests_are_named(tmp_path, kwargs, error):
    certs.init_ca(str(tmp_path / "ca"))
    with pytest.raises(errors.InvalidArgument, match=error):
        certs.issue(str(tmp_path / "ca"), str(tmp_path / "out"), **kwargs)
    assert not os.path.exists(tmp_path / "out")


def test_issuing_without_a_ca_says_how_to_make_one(tmp_path):
    with pytest.raises(errors.FailedPrecondition, match="sms certs init"):
        certs.issue(str(tmp_path / "none"), str(tmp_path / "out"), node="n1")


def test_a_node_certificate_is_kept_while_good_and_renewed_when_not(tmp_path):
    ca_dir, out = str(tmp_path / "ca"), str(tmp_path / "nodes")
    first = certs.ensure_node_cert(ca_dir, out, "n1", hosts=("127.0.0.1",))      # creates the CA too
    serial = _load(first.cert_file).serial_number
    assert _load(certs.ensure_node_cert(ca_dir, out, "n1", hosts=("127.0.0.1",)).cert_file).serial_number == serial
    # a host it does not name: issued anew
    again = certs.ensure_node_cert(ca_dir, out, "n1", hosts=("10.1.2.3",))
    assert _load(again.cert_file).serial_number != serial and "10.1.2.3" in _names(_load(again.cert_file))
    serial = _load(again.cert_file).serial_number
    # close to expiry: issued anew
    certs.issue(ca_dir, out, node="n1", days=limits.CERT_RENEW_BEFORE_DAYS)
    near = _load(first.cert_file).serial_number
    renewed = certs.ensure_node_cert(ca_dir, out, "n1")
    assert _load(renewed.cert_file).serial_number not in (serial, near)
    # of another CA (the directory's CA was replaced): issued anew by the one there now
    os.remove(os.path.join(ca_dir, "ca.pem"))
    os.remove(os.path.join(ca_dir, "ca.key"))
    certs.init_ca(ca_dir)
    fresh = _load(certs.ensure_node_cert(ca_dir, out, "n1").cert_file)
    fresh.verify_directly_issued_by(_load(os.path.join(ca_dir, "ca.pem")))


def test_an_expired_certificate_can_be_made_for_tests(tmp_path):
    certs.init_ca(str(tmp_path / "ca"))
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)
    cert = _load(certs.issue(str(tmp_path / "ca"), str(tmp_path / "o"), node="n1", days=1, not_before=old).cert_file)
    assert cert.not_valid_after_utc < datetime.datetime.now(datetime.timezone.utc)


def test_a_clients_tls_settings(tmp_path, monkeypatch):
    ca = certs.init_ca(str(tmp_path / "ca"))
    monkeypatch.delenv(security.ENV_CA_FILE, raising=False)
    assert security.TlsConfig.resolve() is None                               # nothing given: plaintext
    monkeypatch.setenv(security.ENV_CA_FILE, ca.cert_file)
    assert security.TlsConfig.resolve().ca_file == ca.cert_file                # from the environment
    assert security.TlsConfig.resolve(ca_file="") is None                      # "" wins: plaintext
    with pytest.raises(errors.InvalidArgument, match="needs its key"):
        security.TlsConfig.resolve(ca_file=ca.cert_file, cert_file=ca.cert_file)
    with pytest.raises(errors.InvalidArgument, match="cannot read the CA file"):
        security.TlsConfig.resolve(ca_file=str(tmp_path / "missing.pem"))


def test_the_cluster_file(tmp_path):
    (tmp_path / "cluster.json").write_text('{"address": "127.0.0.1:1", "ca_file": "/x/ca.pem"}')
    assert security.read_cluster_file(str(tmp_path))["ca_file"] == "/x/ca.pem"
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(errors.InvalidArgument, match="not JSON"):
        security.read_cluster_file(str(tmp_path / "bad.json"))
    (tmp_path / "none.json").write_text("{}")
    with pytest.raises(errors.InvalidArgument, match="names no address"):
        security.read_cluster_file(str(tmp_path / "none.json"))


def test_the_embedded_metadata_store_is_private(tmp_path):
    """It holds the cluster's token secret and the keys' hashes: mode 0600, an older
    file tightened on open."""
    import asyncio

    from metastore import open_metastore
    path = tmp_path / "meta.lmdb"
    path.write_bytes(b"")
    os.chmod(path, 0o644)

    async def open_and_close():
        store = open_metastore(f"embedded://{path}")
        await store.start()
        await store.close()
    asyncio.run(open_and_close())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(str(path) + "-lock").st_mode) == 0o600


def test_a_node_key_that_does_not_match_its_certificate_is_replaced(tmp_path):
    ca_dir, out = str(tmp_path / "ca"), str(tmp_path / "nodes")
    first = certs.ensure_node_cert(ca_dir, out, "n1")
    serial = _load(first.cert_file).serial_number
    other = certs.issue(ca_dir, str(tmp_path / "other"), node="n1")       # a key of another issue
    os.replace(other.key_file, first.key_file)
    again = certs.ensure_node_cert(ca_dir, out, "n1")
    assert _load(again.cert_file).serial_number != serial


def test_a_damaged_ca_is_a_named_error(tmp_path):
    ca = certs.init_ca(str(tmp_path / "ca"))
    with open(ca.key_file, "wb") as f:
        f.write(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    with pytest.raises(errors.FailedPrecondition, match="cannot be used"):
        certs.issue(str(tmp_path / "ca"), str(tmp_path / "out"), node="n1")


def test_a_leftover_temporary_file_never_keeps_its_mode(tmp_path):
    certs.init_ca(str(tmp_path / "ca"))
    out = tmp_path / "out"
    out.mkdir()
    leftover = out / "n1.key.tmp"
    leftover.write_text("someone else's")
    os.chmod(leftover, 0o666)
    issued = certs.issue(str(tmp_path / "ca"), str(out), node="n1")
    assert stat.S_IMODE(os.stat(issued.key_file).st_mode) == 0o600


@pytest.mark.parametrize("given, number", [("1f", 0x1F), ("0x1F", 0x1F), ("1f:2a", 0x1F2A), (" ab ", 0xAB)])
def test_a_serial_is_read_in_hex(given, number):
    assert revocation.parse_serial(given) == number


@pytest.mark.parametrize("bad", ["", "0x", "zz", "1" * 41, "-1"])
def test_a_bad_serial_is_named(bad):
    with pytest.raises(errors.InvalidArgument):
        revocation.parse_serial(bad)
