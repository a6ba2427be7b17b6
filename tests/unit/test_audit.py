"""The audit log file (kernel/audit.py): rotation with backups, the line bound, reads
across rotated files, and no secret written.

A real file in a temporary directory; the clock (`audit._now_ms`) is set by the tests so
that times are exact.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from control import auth
from kernel import audit
from sms import limits
from sms.security import CLIENT_UNIT, NODE_UNIT, PeerCert


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """audit's clock, in ms: the test sets now[0]."""
    now = [1_795_881_600_000]
    monkeypatch.setattr(audit, "_now_ms", lambda: now[0])
    return now


@pytest.fixture
def log(tmp_path, clock) -> audit.AuditLog:
    """The process's audit log, configured as a node configures it, closed afterwards."""
    written = audit.configure(str(tmp_path / "audit" / audit.FILE_NAME), "n1")
    yield written
    audit.close()


def _events(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_a_line_has_every_field_in_order(log: audit.AuditLog, clock: list[int]) -> None:
    who = {"key_id": "9c0d1e4b5a693f2a", "tenant": "default", "role": "admin"}
    audit.event(audit.KEY_REVOKE, "3f2a9c0d1e4b5a69", audit.OK, who, "127.0.0.1:53422", "key_id: \"3f2a\"")
    [line] = open(log.path).read().splitlines()
    event = json.loads(line)
    assert list(event) == list(audit.FIELDS)
    assert event == {"ts_ms": clock[0], "time": "2026-11-28T16:00:00.000Z", "node": "n1", "action": "key.revoke",
                     "target": "3f2a9c0d1e4b5a69", "outcome": "ok", "who": who, "from": "127.0.0.1:53422",
                     "detail": "key_id: \"3f2a\""}


def test_the_file_and_its_directory_are_the_owners_only(tmp_path, clock) -> None:
    path = tmp_path / "d" / "audit.log"
    path.parent.mkdir(mode=0o755)
    path.write_text("")
    os.chmod(path, 0o644)                 # (an older file: made private when opened)
    written = audit.AuditLog(str(path), "n1", bytes_max=1024, backups=2)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        for i in range(40):
            written.write({"ts_ms": i, "action": "x", "detail": "d" * 50})
        files = written.files()
        assert len(files) == 3, files
        for name in files:
            assert stat.S_IMODE(os.stat(name).st_mode) == 0o600, name
    finally:
        written.close()


def test_rotation_keeps_the_backups_newest_first(tmp_path, clock) -> None:
    bytes_max = 2000
    written = audit.AuditLog(str(tmp_path / "audit.log"), "n1", bytes_max=bytes_max, backups=3)
    try:
        for i in range(200):
            clock[0] = 1000 + i
            written.write({"ts_ms": clock[0], "action": "stream.create", "target": f"s{i}", "detail": "x" * 100})
        files = written.files()
        assert files == [written.path] + [f"{written.path}.{i}" for i in (1, 2, 3)]
        assert not os.path.exists(f"{written.path}.4")
        per_file = [_events(name) for name in files]
        for events in per_file:
            assert events, "an empty file kept"
            assert os.path.getsize(files[0]) < bytes_max
        # newest first, each file's lines in order, no gap between files
        ts = [e["ts_ms"] for events in reversed(per_file) for e in events]
        assert ts == list(range(ts[0], 1200)), ts
        assert ts[0] > 1000               # (the oldest went with the rotation)
        for name in files:
            assert os.path.getsize(name) < bytes_max, name
    finally:
        written.close()


def test_a_line_is_cut_to_the_bound(log: audit.AuditLog) -> None:
    bound = limits.AUDIT_LINE_BYTES_MAX
    audit.event(audit.STREAM_CREATE, "s1", audit.OK, {}, "", "a" * (3 * bound))      # the detail cut
    audit.event(audit.STREAM_CREATE, "t" * (3 * bound), audit.OK, {}, "", "b" * bound)  # then the target
    audit.event(audit.STREAM_CREATE, "s2", audit.OK, {}, "", "\"é\n" * bound)    # escapes take several bytes
    audit.event(audit.AUTH_DENIED, "m", "PermissionDenied", {"cert": "c" * (3 * bound)}, "p" * bound, "")
    audit.event(audit.STREAM_CREATE, "s3", audit.OK, {}, "", "short")
    raw = open(log.path, "rb").read().splitlines()
    assert len(raw) == 5
    for line in raw:
        assert len(line) <= bound, len(line)
    first, second, escaped, who_cut, short = (json.loads(line) for line in raw)
    assert first["detail"].startswith("aaa") and first["detail"].endswith(audit.CUT_MARK)
    assert len(raw[0]) >= bound - 3, "cut more than it had to"
    assert second["detail"] == audit.CUT_MARK and second["target"].startswith("ttt")
    assert second["target"].endswith(audit.CUT_MARK)
    assert escaped["detail"].startswith("\"é\n") and len(raw[2]) >= bound - 12
    assert who_cut["who"] == {"cut": True} and who_cut["action"] == audit.AUTH_DENIED
    assert short["detail"] == "short"


def test_read_since_and_limit_across_rotated_files(tmp_path, clock) -> None:
    written = audit.AuditLog(str(tmp_path / "audit.log"), "n1", bytes_max=1500, backups=5)
    try:
        for i in range(60):
            clock[0] = 10_000 + i
            written.write({"ts_ms": clock[0], "action": "key.create", "target": f"k{i}", "detail": "y" * 60})
        files = written.files()
        assert len(files) >= 4, files
        kept = [e["ts_ms"] for name in reversed(files) for e in _events(name)]
        oldest = kept[0]

        def read(since_ms: int, limit: int) -> tuple[list[int], bool]:
            lines, truncated = written.read(since_ms, limit)
            return [json.loads(line)["ts_ms"] for line in lines], truncated

        assert read(0, 10_000) == (kept, False)                  # every file, oldest first
        assert read(0, 5) == (kept[-5:], True)                   # the newest 5
        newest = len(_events(files[0]))
        assert read(0, newest) == (kept[-newest:], True)         # the older files hold more
        assert read(10_050, 10_000) == (list(range(10_050, 10_060)), False)
        assert read(10_050, 10) == (list(range(10_050, 10_060)), False)     # exactly: nothing left out
        assert read(10_050, 9) == (list(range(10_051, 10_060)), True)
        assert read(oldest + 1, len(kept) - 1) == (kept[1:], False)   # reaches into the oldest backup
        assert read(10_060, 100) == ([], False)
        with open(files[0], "ab") as f:       # a line being written (or cut by a crash) is skipped
            f.write(b'{"ts_ms": 10070, "act')
        assert read(10_055, 100) == (list(range(10_055, 10_060)), False)
    finally:
        written.close()


def test_a_process_without_a_log_writes_nothing_and_never_raises(tmp_path) -> None:
    audit.close()
    audit.event(audit.STREAM_CREATE, "s", audit.OK)      # (nothing configured)
    written = audit.configure(str(tmp_path / "audit.log"), "n1")
    try:
        audit.event(audit.STREAM_CREATE, object(), audit.OK, {"x": object()})     # will not encode: dropped
        written._handler.stream.close()                  # a write that fails: logged, not raised
        audit.event(audit.STREAM_CREATE, "s", audit.OK)
        assert not os.path.exists(written.path) or _events(written.path) == []
    finally:
        audit.close()


def test_a_token_s_secret_is_never_written(log: audit.AuditLog) -> None:
    key_id, token = auth.new_token()
    secret = auth.parse_token(token)[1]          # (not rsplit: a base64url secret may hold "_")
    assert audit.who_token(token) == {"claimed_key_id": key_id}
    assert audit.who_token("Bearer " + token) == {}
    assert audit.who_token(f"sms_{key_id}") == {"claimed_key_id": key_id}
    assert audit.who_token("sms_NOTHEX0123456789_" + secret) == {}
    assert audit.who_token(secret) == {}
    audit.event(audit.AUTH_REFUSED, "/sms.v1.Control/CreateKey", "Unauthenticated", audit.who_token(token),
                "127.0.0.1:1", "unknown or revoked key")
    audit.event(audit.AUTH_REFUSED, "/sms.v1.Control/CreateKey", "Unauthenticated",
                audit.who_token(token[:-1] + "!"), "127.0.0.1:1", "malformed credential")
    text = open(log.path).read()
    assert key_id in text
    assert secret not in text and secret[:12] not in text


def test_who_helpers() -> None:
    principal = auth.Principal(key_id="9c0d1e4b5a693f2a", tenant="t1", role="producer", streams=("s",))
    assert audit.who_key(principal) == {"key_id": "9c0d1e4b5a693f2a", "tenant": "t1", "role": "producer"}
    assert audit.who_key(None) == {}
    assert audit.who_cert(PeerCert(NODE_UNIT, "n2", 0xabc)) == {"node": "n2", "serial": "abc"}
    assert audit.who_cert(PeerCert(CLIENT_UNIT, "ops", 255)) == {"cert": "ops", "unit": "client", "serial": "ff"}
    assert audit.who_cert(None) == {}

    class Context:
        def __init__(self, peer: str):
            self._peer = peer

        def peer(self) -> str:
            return self._peer
    assert audit.peer(Context("ipv4:127.0.0.1:53422")) == "127.0.0.1:53422"
    assert audit.peer(Context("ipv6:%5B::1%5D:53422")) == "[::1]:53422"
    assert audit.peer(Context("unix:/tmp/s")) == "unix:/tmp/s"
    assert audit.iso_time(1_795_881_600_123) == "2026-11-28T16:00:00.123Z"
