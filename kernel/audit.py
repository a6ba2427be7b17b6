"""The audit log (docs/security.md, "Audit log"): one JSON line for each security event,
in a file of each node's own, rotated.

Each node writes the events that happen on it, to `DIR/audit.log` of its `--data-dir`
(or the setting `log.audit_file`), mode 0600, rotated at AUDIT_FILE_BYTES_MAX with
AUDIT_FILE_BACKUPS old files kept (`audit.log.1` the newest), as node/logs.py rotates logs:

- the control leader: each change of a stream, tenant, key or certificate, a node's
  drain or removal, and a consumer group's reset or deletion, with its outcome
  (control/service.py); a group reset on whichever node answered it;
- every node's client port guard: a refused credential (`Unauthenticated`) or right
  (`PermissionDenied`); its cluster port guard: a caller without a node certificate,
  or with a revoked one (node/tls.py);
- a storage node: a replication hello from a node that is not the chain's predecessor
  (storage/peerlink.py), and an Append refused (storage/service.py).

A line (`event`), keys in this order:

    {"ts_ms": 1795881600123, "time": "2026-11-28T16:00:00.123Z", "node": "control",
     "action": "key.revoke", "target": "3f2a9c0d1e4b5a69", "outcome": "ok",
     "who": {"key_id": "9c0d1e4b5a693f2a", "tenant": "default", "role": "admin"},
     "from": "127.0.0.1:53422", "detail": ""}

`who` is a key ({key_id, tenant, role}), a key a refused token claims ({claimed_key_id}:
never the token), a certificate ({node, serial} for a node certificate; {cert, unit,
serial} for another), or {} for a caller with none of those. `outcome` is "ok" or the
name of the error the caller got. A line is at most AUDIT_LINE_BYTES_MAX (the detail,
then the target, are cut to fit).

Lines are written only on these events, never per record or batch, synchronously (a
write and a flush). Auditing never fails the call it records: a line that cannot be
written is logged as a warning, and the call goes on. A process that did not `configure`
a file writes nothing. `read` answers Control.ReadAudit from this node's files; `sms
audit` asks every node and merges the answers by time.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os
import sys
import threading
import time
import urllib.parse
from typing import Any

from sms import limits
from sms.errors import invariant
from sms.security import NODE_UNIT

log = logging.getLogger(__name__)

FILE_NAME = "audit.log"        # in a node's data directory, unless log.audit_file says otherwise
FILE_MODE = 0o600

# actions
STREAM_CREATE, STREAM_UPDATE, STREAM_DELETE = "stream.create", "stream.update", "stream.delete"
STREAM_REPARTITION, STREAM_TRIM = "stream.repartition", "stream.trim"
TENANT_CREATE, TENANT_UPDATE, TENANT_DELETE = "tenant.create", "tenant.update", "tenant.delete"
KEY_CREATE, KEY_REVOKE = "key.create", "key.revoke"
KEY_REWRAP = "key.rewrap"                  # master key rotation: every stream's data key wrapped again
CERTIFICATE_REVOKE = "certificate.revoke"
NODE_DRAIN, NODE_UNDRAIN, NODE_REMOVE = "node.drain", "node.undrain", "node.remove"
GROUP_RESET, GROUP_DELETE = "group.reset", "group.delete"
QUEUE_CREATE, QUEUE_UPDATE, QUEUE_DELETE = "queue.create", "queue.update", "queue.delete"
CHANNEL_CREATE, CHANNEL_UPDATE, CHANNEL_DELETE = "channel.create", "channel.update", "channel.delete"
AUTH_REFUSED = "auth.refused"              # no credential, or a malformed, unknown, revoked or wrong one
AUTH_DENIED = "auth.denied"                # a credential without the right (or a certificate that is not a node's)
REPLICATION_REFUSED = "replication.refused"    # a hello from a node that is not the chain's predecessor
APPEND_REFUSED = "append.refused"
OK = "ok"

FIELDS = ("ts_ms", "time", "node", "action", "target", "outcome", "who", "from", "detail")


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """Python's rotation, with every file it opens made mode 0600 (an older one too)."""

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        os.fchmod(fd, FILE_MODE)
        return open(fd, self.mode, encoding=self.encoding, errors=self.errors)

    def handleError(self, record: logging.LogRecord) -> None:
        # (never raises into the call being recorded; the node's own log says what was lost)
        log.warning("audit log %s: a line was not written (%s): %s", self.baseFilename,
                    _exc_text(), record.getMessage())


def _exc_text() -> str:
    e = sys.exc_info()[1]
    return f"{type(e).__name__}: {e}" if e is not None else "unknown error"


class AuditLog:
    """One node's audit file: `write` a line, `read` the lines kept (the file and its
    rotated backups)."""

    def __init__(self, path: str, node: str, bytes_max: int | None = None, backups: int | None = None):
        self.path = os.path.abspath(path)
        self.node = node
        self.backups = limits.AUDIT_FILE_BACKUPS if backups is None else backups
        parent = os.path.dirname(self.path)
        os.makedirs(parent, mode=0o700, exist_ok=True)
        self._handler = _PrivateRotatingFile(
            self.path, maxBytes=limits.AUDIT_FILE_BYTES_MAX if bytes_max is None else bytes_max,
            backupCount=self.backups, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, fields: dict[str, Any]) -> None:
        """Append one line (`fields` as `event` makes them); a failure is logged, never raised."""
        try:
            line = _line(fields)
            record = logging.LogRecord("sms.audit", logging.INFO, __file__, 0, line, None, None)
            self._handler.handle(record)
        except Exception:          # (a field that would not encode: the call goes on)
            log.warning("audit log %s: a line was not written (%s): %r", self.path, _exc_text(),
                        fields.get("action"))

    def close(self) -> None:
        try:
            self._handler.close()
        except (OSError, ValueError):      # (a file that broke: its lines were reported as lost)
            log.warning("audit log %s: closed with an error (%s)", self.path, _exc_text())

    def files(self) -> list[str]:
        """The file and its backups, newest first (the rotation keeps them numbered 1..N)."""
        out = [self.path]
        for i in range(1, self.backups + 1):
            name = f"{self.path}.{i}"
            if not os.path.exists(name):
                break
            out.append(name)
        return out

    def read(self, since_ms: int = 0, limit: int = limits.AUDIT_READ_EVENTS_MAX) -> tuple[list[str], bool]:
        """The newest `limit` lines at or after `since_ms`, oldest first, and whether
        older ones at or after it were left out. Blocking: call it off the event loop."""
        invariant(limit > 0, f"audit read limit {limit}")
        newest_first: list[list[str]] = []
        kept = 0
        for f in self._open_files():
            with f:
                lines, older_seen = _lines_since(f, since_ms)
            newest_first.append(lines)
            kept += len(lines)
            if older_seen or kept > limit:
                break                    # (every older file is older still)
        events = [line for lines in reversed(newest_first) for line in lines]
        return events[-limit:], len(events) > limit

    def _open_files(self) -> list:
        """The files, newest first, opened under the handler's lock: a rotation renames
        them, and an open file is the same one after it (so no line is read twice or
        missed). The lock is held for the opens only, not the reads."""
        opened = []
        self._handler.acquire()
        try:
            for name in self.files():
                try:
                    opened.append(open(name, "rb"))
                except FileNotFoundError:        # (the current file before its first line)
                    continue
        finally:
            self._handler.release()
        return opened


def _lines_since(f, since_ms: int) -> tuple[list[str], bool]:
    """(the lines of one open file at or after since_ms, whether it holds older ones). A
    line cut short (being written, or by a crash) is skipped."""
    out, older = [], False
    for raw in f:
        text = raw.decode("utf-8", "replace").rstrip("\n")
        try:
            ts = json.loads(text)["ts_ms"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(ts, int):
            continue
        if ts >= since_ms:
            out.append(text)
        else:
            older = True
    return out, older


CUT_MARK = "..."
_SHORT_CHARS_MAX = 64      # a field cut when even the detail and target were not enough


def _dumps(fields: dict[str, Any]) -> str:
    return json.dumps(fields, separators=(",", ":"))      # (ASCII: every character is a byte)


def _cut(value: str, room: int) -> str:
    """The longest start of `value` that JSON-escapes to at most `room` characters,
    marked as cut (CUT_MARK)."""
    value = value[:max(0, room)]                # (a character escapes to one or more)
    taken = 0
    for i, c in enumerate(value):
        taken += len(json.dumps(c)) - 2
        if taken > room:
            return value[:i] + CUT_MARK
    return value + CUT_MARK


def _line(fields: dict[str, Any]) -> str:
    """One JSON line of at most AUDIT_LINE_BYTES_MAX: the detail, then the target, cut
    to fit."""
    text = _dumps(fields)
    for key in ("detail", "target"):
        over = len(text) - limits.AUDIT_LINE_BYTES_MAX
        if over <= 0:
            return text
        value = str(fields.get(key, ""))
        if not value:
            continue
        fields = {**fields, key: _cut(value, len(_dumps(value)) - 2 - over - len(CUT_MARK))}
        text = _dumps(fields)
    if len(text) > limits.AUDIT_LINE_BYTES_MAX:   # (who or from absurdly long: keep what happened)
        fields = {**fields, "who": {"cut": True},
                  **{k: str(fields.get(k, ""))[:_SHORT_CHARS_MAX] for k in ("from", "node", "action", "outcome")}}
        text = _dumps(fields)
    return text


# --- the process's audit log (configured at a node's start) ----------------------------------

_current: AuditLog | None = None
_lock = threading.Lock()


def configure(path: str, node: str) -> AuditLog:
    """Write this process's audit lines to `path` from now on (node/server.py at start).
    Raises OSError when the file cannot be opened."""
    global _current
    with _lock:
        if _current is not None:
            _current.close()
        _current = AuditLog(path, node)
        return _current


def close() -> None:
    global _current
    with _lock:
        if _current is not None:
            _current.close()
        _current = None


def current() -> AuditLog | None:
    return _current


def event(action: str, target: str, outcome: str, who: dict[str, Any] | None = None, peer: str = "",
          detail: str = "") -> None:
    """Record one event in this process's audit log (none configured: nothing). Never raises."""
    audit = _current
    if audit is None:
        return
    try:
        ts_ms = _now_ms()
        fields = {"ts_ms": ts_ms, "time": iso_time(ts_ms), "node": audit.node, "action": action,
                  "target": str(target), "outcome": outcome, "who": who or {}, "from": peer, "detail": str(detail)}
    except Exception:
        log.warning("audit: an event of %s could not be recorded (%s)", action, _exc_text())
        return
    audit.write(fields)


def _now_ms() -> int:
    return int(time.time() * 1000)


def iso_time(ts_ms: int) -> str:
    """2026-11-28T16:00:00.123Z"""
    t = datetime.datetime.fromtimestamp(ts_ms / 1000, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"


# --- who and from -----------------------------------------------------------------------------

def who_key(principal) -> dict[str, Any]:
    """A key that was checked (control/auth.py Principal; None: a plaintext cluster's caller)."""
    if principal is None:
        return {}
    return {"key_id": principal.key_id, "tenant": principal.tenant, "role": principal.role}


def who_token(token: str) -> dict[str, Any]:
    """A refused token: the key id it claims (its secret never), when it has the form."""
    if token.startswith("sms_"):          # (control/auth.py: sms_<16 hex digits>_<secret>)
        key_id = token[4:].partition("_")[0]
        if len(key_id) == 16 and all(c in "0123456789abcdef" for c in key_id):
            return {"claimed_key_id": key_id}
    return {}


def who_cert(cert) -> dict[str, Any]:
    """The certificate a caller presented (sms.security.PeerCert; None: none)."""
    if cert is None:
        return {}
    if cert.unit == NODE_UNIT:
        return {"node": cert.name, "serial": f"{cert.serial:x}"}
    return {"cert": cert.name, "unit": cert.unit, "serial": f"{cert.serial:x}"}


def peer(context) -> str:
    """Where a gRPC call came from: "127.0.0.1:53422", "[::1]:53422" ("" when unknown)."""
    try:
        text = urllib.parse.unquote(context.peer() or "")
    except Exception:
        return ""
    for scheme in ("ipv4:", "ipv6:"):
        if text.startswith(scheme):
            return text[len(scheme):]
    return text
