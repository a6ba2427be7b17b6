"""Progress on long `sms` work (node/cli/common.py, `_progress`): drawn on stderr when it is a
terminal, here a real pseudo-terminal; with stderr a pipe, nothing on it; stdout the same
either way.
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading

import pytest

from tests.integration import test_cli
from tests.integration.test_cli import COMMAND_TIMEOUT_S, _env, ok, sms_cmd

pytestmark = pytest.mark.integration

RECORDS = 3_000
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SN_LINE = re.compile(r"^p0000 \d+$")

up_factory = test_cli.up_factory          # (the fixture: each `sms up` stopped at the end)


def _with_tty_stderr(data_dir: str, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """`sms ARGS` with stdout a pipe and stderr a pseudo-terminal: its exit code, stdout,
    and what the terminal showed (escape sequences taken out)."""
    env = {k: v for k, v in _env().items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR")}
    env["TERM"] = "xterm"
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "node", *args, "--data-dir", data_dir], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=slave, env=env, cwd=data_dir)
    finally:
        os.close(slave)
    shown: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:           # EIO: every end of the terminal's other side closed
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(stdin.encode(), timeout=COMMAND_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=COMMAND_TIMEOUT_S)
        os.close(master)
    return proc.returncode, out.decode(), ANSI.sub("", b"".join(shown).decode(errors="replace"))


def test_progress_on_a_terminal_only(up_factory):
    up = up_factory(nodes=1)
    d = up.data_dir
    up.wait_for_address()
    ok(sms_cmd(d, "stream", "create", "s", "--partitions", "1"))
    lines = "".join(f"record {i}\n" for i in range(RECORDS))

    # put from stdin: the count sent, on the terminal; stdout as ever
    code, out, terminal = _with_tty_stderr(d, "put", "s", stdin=lines)
    assert code == 0, (out, terminal)
    assert len(out.splitlines()) == RECORDS and all(SN_LINE.match(line) for line in out.splitlines()), out[:500]
    assert f"put s: {RECORDS:,} records sent" in terminal, terminal
    piped = sms_cmd(d, "put", "s", stdin=lines)
    assert piped.returncode == 0 and piped.stderr == ""
    assert len(piped.stdout.splitlines()) == RECORDS and all(SN_LINE.match(line) for line in piped.stdout.splitlines())

    # read into a pipe: the count read, on the terminal; the same records on stdout
    code, out, terminal = _with_tty_stderr(d, "read", "s", "--json")
    piped = sms_cmd(d, "read", "s", "--json")
    assert code == 0 and piped.returncode == 0 and piped.stderr == ""
    assert out == piped.stdout and len(out.splitlines()) == 2 * RECORDS
    assert f"read s: {2 * RECORDS:,} records" in terminal, terminal
    code, out, terminal = _with_tty_stderr(d, "read", "s", "--partition", "p0000", "--max", "10")
    assert code == 0 and len(out.splitlines()) == 10 and "read s: 10 records" in terminal, terminal

    # a repartition: a spinner while it waits; its result on stdout
    code, out, terminal = _with_tty_stderr(d, "stream", "repartition", "s", "--split", "p0000", "--json")
    assert code == 0, (out, terminal)
    assert json.loads(out)["partitions"][0]["children"] == [1, 2]
    assert "split s: " in terminal, terminal
    piped = sms_cmd(d, "stream", "repartition", "s", "--split", "p0001", "--json")
    assert piped.returncode == 0 and piped.stderr == "" and json.loads(piped.stdout)["partitions"][1]["children"]

    # an error still reads as one line after the progress line is gone
    code, out, terminal = _with_tty_stderr(d, "put", "nope", stdin="x\n")
    assert code == 1 and out == "" and "error: StreamNotFound" in terminal, terminal
