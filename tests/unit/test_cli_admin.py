"""`sms admin bootstrap` (node/cli/admin.py): the token of a cluster's first admin key, in a
file of mode 0600, made without a cluster; and the two other steps of docs/deployment.md
that need no cluster either: `sms certs issue --host` by address and by name, and
`sms serve` taking what identifies its node from the configuration file alone
(node/config.py, `serve_args`)."""

from __future__ import annotations

import json
import os
import stat
import types

import pytest
from cryptography import x509

from control import auth
from node import config
from node.cli import main


def _token_file(tmp_path, name: str = "admin.token"):
    return tmp_path / "secrets" / name


def test_bootstrap_writes_a_token_the_control_node_accepts(tmp_path, capsys):
    path = _token_file(tmp_path)
    assert main(["admin", "bootstrap", "--token-file", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    token = path.read_text().strip()
    key_id, _secret = auth.parse_token(token)        # what `sms serve --bootstrap-token-file` checks
    assert shown == {"key_id": key_id, "token_file": str(path)}
    assert token not in json.dumps(shown)            # (the token stays in the file)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(os.listdir(path.parent)) == ["admin.token"]     # no temporary file left


def test_bootstrap_keeps_an_existing_token_unless_forced(tmp_path, capsys):
    path = _token_file(tmp_path)
    assert main(["admin", "bootstrap", "--token-file", str(path)]) == 0
    first = path.read_text()
    with pytest.raises(SystemExit, match="exists"):
        main(["admin", "bootstrap", "--token-file", str(path)])
    assert path.read_text() == first
    assert main(["admin", "bootstrap", "--token-file", str(path), "--force"]) == 0
    second = path.read_text()
    assert second != first and auth.parse_token(second.strip())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(os.listdir(path.parent)) == ["admin.token"]
    assert "admin key" in capsys.readouterr().out


def test_bootstrap_names_a_path_it_cannot_write(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=str(blocker)):
        main(["admin", "bootstrap", "--token-file", str(blocker / "admin.token")])


def test_admin_needs_a_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        main(["admin"])
    assert e.value.code == 2


@pytest.mark.parametrize("host", ["10.0.0.1", "h1.example.net"])
def test_certs_issue_for_a_host_address_or_name(tmp_path, capsys, host):
    """docs/deployment.md issues node certificates by address; names work the same."""
    assert main(["certs", "init", "--dir", str(tmp_path / "ca")]) == 0
    assert main(["certs", "issue", "--ca-dir", str(tmp_path / "ca"), "--node", "n1", "--host", host,
                 "--out", str(tmp_path / "h1")]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "h1" / "n1.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {str(v) for v in sans.get_values_for_type(x509.DNSName)} | \
            {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    assert host in named and "localhost" in named
    assert stat.S_IMODE((tmp_path / "h1" / "n1.key").stat().st_mode) == 0o600


def _serve_args(**given) -> types.SimpleNamespace:
    fields = {"config": None, **{attr: None for _flag, attr in config.SERVE_FLAGS.values()}}
    return types.SimpleNamespace(**{**fields, **given})


def test_serve_takes_its_node_from_the_configuration(tmp_path):
    path = tmp_path / "storage.toml"
    path.write_text('[metastore]\nurl = "zk://10.0.0.1:2181/sms"\n'
                    '[tls]\nca_file = "/etc/sms/ca.pem"\ncert_file = "/etc/sms/n1.pem"\nkey_file = "/etc/sms/n1.key"\n'
                    '[node]\nid = "n1"\ndata_dir = "/var/lib/sms/n1"\nlisten = "10.0.0.1:7401"\n')
    args = _serve_args(config=str(path))
    config.serve_args(args, env={})
    assert (args.node_id, args.metastore, args.data_dir, args.roles) == \
        ("n1", "zk://10.0.0.1:2181/sms", "/var/lib/sms/n1", "storage,ingestion,retrieval")
    assert (args.ca_file, args.cert_file, args.key_file, args.bootstrap_token_file) == \
        ("/etc/sms/ca.pem", "/etc/sms/n1.pem", "/etc/sms/n1.key", None)
    # the command line wins over the file, the environment over the file
    args = _serve_args(config=str(path), node_id="n9", roles="control")
    config.serve_args(args, env={"SMS_NODE_BOOTSTRAP_TOKEN_FILE": "/etc/sms/admin.token"})
    assert (args.node_id, args.roles, args.bootstrap_token_file) == ("n9", "control", "/etc/sms/admin.token")


def test_serve_names_what_it_lacks(tmp_path):
    path = tmp_path / "partial.toml"
    path.write_text('[node]\nid = "n1"\n')
    with pytest.raises(config.ConfigError, match=r"no --metastore \(or metastore.url.*no --data-dir"):
        config.serve_args(_serve_args(config=str(path)), env={})
    with pytest.raises(SystemExit, match="sms serve: no --metastore"):
        main(["serve", "--config", str(path)])
