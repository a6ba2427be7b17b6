"""node/logs.py: the settings checked, text and JSON lines, and the rotated file."""

from __future__ import annotations

import json
import logging

import pytest

from node import logs
from sms import limits


@pytest.fixture(autouse=True)
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("env, named", [
    ({"SMS_LOG_LEVEL": "LOUD"}, "$SMS_LOG_LEVEL is 'LOUD'"),
    ({"SMS_LOG_FORMAT": "xml"}, "$SMS_LOG_FORMAT is 'xml'"),
    ({"SMS_LOG_FILE": "/no/such/dir/n1.log"}, "its directory '/no/such/dir' does not exist"),
])
def test_a_bad_setting_is_named(env, named):
    with pytest.raises(logs.LogConfigError, match=named.replace("$", r"\$")):
        logs.settings(env)


def test_defaults_and_case():
    assert logs.settings({}) == ("INFO", "text", "")
    assert logs.settings({"SMS_LOG_LEVEL": "debug", "SMS_LOG_FORMAT": "JSON"}) == ("DEBUG", "json", "")


def test_json_lines_carry_the_fields_and_a_traceback(tmp_path):
    path = tmp_path / "n1.log"
    logs.configure("n1", {"SMS_LOG_FORMAT": "json", "SMS_LOG_FILE": str(path)})
    logging.getLogger("storage.replica").info("replica %s ready", "p0001")
    try:
        raise KeyError("boom")
    except KeyError:
        logging.getLogger("control.manager").exception("it failed")
    logging.getLogger("x").debug("not at INFO")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2, lines
    assert {k: lines[0][k] for k in ("level", "logger", "node", "message")} == \
        {"level": "INFO", "logger": "storage.replica", "node": "n1", "message": "replica p0001 ready"}
    assert lines[0]["timestamp"].startswith("20")
    assert lines[1]["level"] == "ERROR" and "KeyError: 'boom'" in lines[1]["exc_info"]


def test_text_lines(tmp_path):
    path = tmp_path / "n2.log"
    logs.configure("n2", {"SMS_LOG_FILE": str(path), "SMS_LOG_LEVEL": "WARNING"})
    logging.getLogger("a").info("quiet")
    logging.getLogger("a").warning("loud")
    (line,) = path.read_text().splitlines()
    assert line.endswith(" n2 WARNING a: loud")


def test_the_file_is_rotated(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "LOG_FILE_BYTES_MAX", 2_000)
    monkeypatch.setattr(limits, "LOG_FILE_BACKUPS", 2)
    path = tmp_path / "n3.log"
    logs.configure("n3", {"SMS_LOG_FILE": str(path)})
    for i in range(200):
        logging.getLogger("r").info("line %d %s", i, "x" * 40)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["n3.log", "n3.log.1", "n3.log.2"], names
    assert all(p.stat().st_size <= 2_000 for p in tmp_path.iterdir())
    assert "line 199 " in path.read_text()
