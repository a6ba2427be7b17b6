"""The audit log on a real TLS cluster (issue 30; docs/security.md, "Audit log").

A stream created and deleted, a key created and revoked, a call with a bad token, a call
the key may not make, and the revoked key's token refused: each shows up in
`Client.read_audit` and in `sms audit --json` (the real CLI, a separate process) with who,
what, the target and the outcome; no token's secret is in any audit file of the cluster,
and every audit file is mode 0600.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

import sms
from control import auth
from kernel import audit
from sms import errors
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

COMMAND_TIMEOUT_S = 60
REFUSED_TIMEOUT_S = 10          # a revoked key is refused within KEY_CACHE_TTL_S (1 s); slack for a busy machine
DATA_METHOD = "/sms.v1.Control/ListStreams"
CREATE_STREAM = "/sms.v1.Control/CreateStream"


def _secret(token: str) -> str:
    return auth.parse_token(token)[1]


def _audit_files(data_dir: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _dirs, files in os.walk(data_dir) for f in files
                  if f == audit.FILE_NAME or f.startswith(audit.FILE_NAME + "."))


def _find(events: list[dict], **want) -> list[dict]:
    """The events whose fields hold `want` (who_* keys match inside `who`)."""
    out = []
    for e in events:
        who = e.get("who") or {}
        if all((who.get(k[4:]) if k.startswith("who_") else e.get(k)) == v for k, v in want.items()):
            out.append(e)
    return out


def _sms_audit(cluster, *args: str) -> subprocess.CompletedProcess:
    """`sms audit ... --json` as an operator runs it (CA and admin token from the environment)."""
    return subprocess.run([sys.executable, "-m", "node", "audit", "--address", cluster.address, "--json", *args],
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, env=os.environ.copy())


@pytest.fixture(scope="module")
def story(cluster, client) -> dict:
    """What the tests look for, done once on the module's cluster: every kind of event."""
    since_ms = int(time.time() * 1000) - 1
    stream = f"audit-{os.getpid()}-{int(time.time())}"
    client.create_stream(stream, partitions=1, replication_factor=1)
    info, token = client.create_key("producer", streams=[stream], name="audit-test")
    key_id = info["key_id"]
    wrong_key_id, wrong = auth.new_token()             # a well-formed token of no key
    storage_id = next(n for n in sorted(cluster.procs) if n not in cluster.control_ids)
    elsewhere_key_id, elsewhere = auth.new_token()     # ... presented to a storage node
    with sms.Client(cluster.address, token=token) as producer, sms.Client(cluster.address, token=wrong) as stranger:
        with pytest.raises(errors.Unauthenticated):
            stranger.list_streams()
        with sms.Client(cluster.procs[storage_id].address, token=elsewhere) as visitor:
            with pytest.raises(errors.Unauthenticated):
                visitor.list_streams()
        with pytest.raises(errors.PermissionDenied):
            producer.create_stream(f"{stream}-not-mine", partitions=1)
        client.revoke_key(key_id)

        def refused() -> bool:
            try:
                producer.list_streams()
            except errors.Unauthenticated:
                return True
            return False
        wait_until(refused, REFUSED_TIMEOUT_S, "the revoked key refused")
    client.delete_stream(stream)
    return {"since_ms": since_ms, "stream": stream, "key_id": key_id, "token": token,
            "wrong_key_id": wrong_key_id, "wrong": wrong, "storage_id": storage_id,
            "elsewhere_key_id": elsewhere_key_id, "elsewhere": elsewhere}


def _check_story(events: list[dict], s: dict, admin_key_id: str) -> None:
    stream, key_id = s["stream"], s["key_id"]
    for e in events:
        assert list(e) == list(audit.FIELDS), e
        assert e["ts_ms"] >= s["since_ms"], e
    admin = {"who_key_id": admin_key_id, "who_role": "admin", "outcome": audit.OK}
    [created] = _find(events, action=audit.STREAM_CREATE, target=stream, **admin)
    [key] = _find(events, action=audit.KEY_CREATE, target=key_id, **admin)
    [revoked] = _find(events, action=audit.KEY_REVOKE, target=key_id, **admin)
    [deleted] = _find(events, action=audit.STREAM_DELETE, target=stream, **admin)
    assert created["ts_ms"] <= key["ts_ms"] <= revoked["ts_ms"] <= deleted["ts_ms"]
    assert 'role: "producer"' in key["detail"] and "audit-test" in key["detail"]
    # the refusals: a token of no key (named by the key id it claims), a call the key may
    # not make (named by its key), the revoked key's token
    [stranger] = _find(events, action=audit.AUTH_REFUSED, outcome="Unauthenticated",
                       who_claimed_key_id=s["wrong_key_id"])
    assert stranger["target"] == DATA_METHOD and stranger["who"] == {"claimed_key_id": s["wrong_key_id"]}
    [visitor] = _find(events, action=audit.AUTH_REFUSED, who_claimed_key_id=s["elsewhere_key_id"])
    assert visitor["node"] == s["storage_id"] and visitor["target"] == DATA_METHOD       # that node's own log
    [denied] = _find(events, action=audit.AUTH_DENIED, outcome="PermissionDenied", who_key_id=key_id)
    assert denied["target"] == CREATE_STREAM and denied["who"]["role"] == "producer"
    assert "may not call CreateStream" in denied["detail"]
    after_revoke = _find(events, action=audit.AUTH_REFUSED, outcome="Unauthenticated", who_claimed_key_id=key_id)
    assert after_revoke and all(e["ts_ms"] >= revoked["ts_ms"] for e in after_revoke)
    for e in (created, key, revoked, deleted, stranger, visitor, denied, *after_revoke):
        host, _, port = e["from"].rpartition(":")
        assert host in ("127.0.0.1", "[::1]") and port.isdigit(), e       # where the call came from
        assert e["node"] and e["time"].endswith("Z")


def test_each_change_and_refusal_is_in_read_audit(client, story, cluster) -> None:
    got = client.read_audit(since_ms=story["since_ms"])
    assert got["unanswered"] == {} and not got["truncated"]
    events = got["events"]
    assert [e["ts_ms"] for e in events] == sorted(e["ts_ms"] for e in events)       # merged by time
    _check_story(events, story, cluster_admin_key_id())
    # changes on the control leader; refusals wherever the call landed: every node was asked
    assert {e["node"] for e in events} <= {n.node_id for n in client.describe_cluster().nodes}
    assert story["storage_id"] in {e["node"] for e in events}


def test_read_audit_limit_keeps_the_newest(client, story) -> None:
    every = client.read_audit(since_ms=story["since_ms"])["events"]
    got = client.read_audit(since_ms=story["since_ms"], limit=2)
    assert got["truncated"] and got["events"] == every[-2:]
    later = client.read_audit(since_ms=every[-1]["ts_ms"] + 1)
    assert later["events"] == [] or all(e["ts_ms"] > every[-1]["ts_ms"] for e in later["events"])
    with pytest.raises(errors.InvalidArgument):
        client.read_audit(limit=0)


def test_sms_audit_json_shows_the_same(cluster, story) -> None:
    done = _sms_audit(cluster, "--since", str(story["since_ms"]))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["unanswered"] == {} and not got["truncated"]
    _check_story(got["events"], story, cluster_admin_key_id())
    human = subprocess.run([sys.executable, "-m", "node", "audit", "--address", cluster.address,
                            "--since", "10m"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert human.returncode == 0, human.stderr
    assert any(audit.KEY_REVOKE in line and story["key_id"] in line and " ok " in line
               and f"by key {cluster_admin_key_id()} (admin of default)" in line for line in human.stdout.splitlines())
    assert any(audit.AUTH_REFUSED in line and f"a token claiming key {story['wrong_key_id']}" in line
               for line in human.stdout.splitlines())


def test_only_cluster_admins_read_the_audit_log(cluster, client) -> None:
    info, token = client.create_key("consumer", name="audit-reader")
    try:
        with sms.Client(cluster.address, token=token) as reader:
            with pytest.raises(errors.PermissionDenied):
                reader.read_audit()
        done = _sms_audit(cluster, "--token", token)
        assert done.returncode == 1 and "PermissionDenied" in done.stderr, done.stderr
    finally:
        client.revoke_key(info["key_id"])


def test_no_secret_in_any_audit_file_and_each_is_private(cluster, story) -> None:
    files = _audit_files(cluster.data_dir)
    assert files, f"no audit file under {cluster.data_dir}"
    control = [f for f in files if os.path.basename(os.path.dirname(f)) in cluster.control_ids]
    assert control, files
    secrets = {name: _secret(story[name]) for name in ("token", "wrong", "elsewhere")}
    secrets["admin"] = _secret(os.environ["SMS_TOKEN"])
    seen_key_ids = False
    for path in files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
        text = open(path, encoding="utf-8").read()
        for name, secret in secrets.items():
            assert secret not in text, f"the {name} token's secret is in {path}"
        seen_key_ids = seen_key_ids or story["key_id"] in text
    assert seen_key_ids, "the key ids were expected in the audit files"


def cluster_admin_key_id() -> str:
    """The key id of the suite's admin token ($SMS_TOKEN: every client of the run)."""
    return auth.parse_token(os.environ["SMS_TOKEN"])[0]
