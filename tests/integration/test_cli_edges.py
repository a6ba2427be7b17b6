"""The `sms` command's rough edges, mended (issue 17, item 6): `--version`, an empty
`--key`, `sms up` on a busy port, a cluster that does not answer, Ctrl-C on
`read --follow`, and binary data in text and JSON output.

As in test_cli.py (whose `Up`, `sms_cmd` and `ok` these reuse), every command is a
separate `python -m node` process; one `sms up` of one storage node serves the tests
that need a cluster, each with its own stream.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

import sms
from tests.conftest import wait_until
from tests.integration import test_cli as cli

pytestmark = pytest.mark.integration

COMMAND_TIMEOUT_S = cli.COMMAND_TIMEOUT_S
ABSENT_CLUSTER_ANSWER_S_MAX = 5.0      # the CLI promises 2 s; a loaded machine starts Python slowly
FOLLOW_PUT_EVERY_S = 1.0               # a record put this often until the follower shows one
SIGINT_EXIT_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def up(tmp_path_factory) -> Iterator[cli.Up]:
    started = cli.Up(str(tmp_path_factory.mktemp("up")), nodes=1)
    try:
        started.wait_for_address()
        yield started
    finally:
        started.stop()


def _sms(cwd: str, *args: str) -> subprocess.CompletedProcess:
    """A command without test_cli's --data-dir (`sms --version`, `sms up`)."""
    return subprocess.run([sys.executable, "-m", "node", *args], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, env=cli._env(), cwd=cwd, stdin=subprocess.DEVNULL)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_version(tmp_path):
    done = _sms(str(tmp_path), "--version")
    assert done.returncode == 0, done
    assert done.stdout == f"sms {importlib.metadata.version('sms-sps')}\n"


def test_empty_key_is_refused_and_nothing_stored(up):
    d = up.data_dir
    cli.ok(cli.sms_cmd(d, "stream", "create", "keys"))
    for refused in (cli.sms_cmd(d, "put", "keys", "x", "--key", ""),
                    cli.sms_cmd(d, "put", "keys", "--key", "", stdin="a\nb\n")):
        assert refused.returncode == 1, refused
        assert "InvalidPartitionKey" in _one_line(refused.stderr) and "--key" in refused.stderr
    assert cli.ok(cli.sms_cmd(d, "read", "keys", "--json")) == ""
    cli.ok(cli.sms_cmd(d, "put", "keys", "y"))                 # no --key: a random key, as before
    [record] = [json.loads(line) for line in cli.ok(cli.sms_cmd(d, "read", "keys", "--json")).splitlines()]
    assert record["data"] == "y" and len(record["partition_key"]) == 32


def test_up_on_a_busy_port_says_so_in_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _sms(str(tmp_path), "up", "--data-dir", str(tmp_path / "d"), "--port", str(port), "--nodes", "1")
    assert done.returncode != 0, done
    line = _one_line(done.stderr)
    assert f"127.0.0.1:{port}" in line and "in use" in line and "--port" in line, line


@pytest.mark.parametrize("command", [("stream", "list"), ("status",), ("stream", "create", "s"), ("key", "list")])
def test_absent_cluster_answers_in_one_line(tmp_path, command):
    """A cluster.json left by a stopped `sms up`: nothing listens at its address (a
    bound socket that does not listen holds the port, refusing connections)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        with open(tmp_path / "cluster.json", "w") as f:
            json.dump({"address": address, "ca_file": "", "token": ""}, f)
        t0 = time.monotonic()
        done = cli.sms_cmd(str(tmp_path), *command)
        elapsed_s = time.monotonic() - t0
    assert done.returncode != 0, done
    line = _one_line(done.stderr)
    assert f"no cluster answers at {address}" in line and "sms up" in line, line
    assert elapsed_s < ABSENT_CLUSTER_ANSWER_S_MAX, f"{command} took {elapsed_s:.1f} s"


def test_ctrl_c_ends_read_follow_quietly(up):
    """The README's `sms read clicks --from LATEST --follow`, stopped with Ctrl-C once it
    has shown a record: exit code 130, nothing on stderr."""
    d = up.data_dir
    cli.ok(cli.sms_cmd(d, "stream", "create", "follow"))
    proc = subprocess.Popen([sys.executable, "-m", "node", "read", "follow", "--from", "LATEST", "--follow",
                             "--data-dir", d], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=cli._env(), cwd=d)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        shown: list[str] = []

        def follower_shows_a_record() -> bool:
            # (records put before its subscription starts are before LATEST: put until one shows)
            cli.ok(cli.sms_cmd(d, "put", "follow", "ping", "--key", "k"))
            try:
                shown.append(lines.get(timeout=FOLLOW_PUT_EVERY_S))
            except queue.Empty:
                assert proc.poll() is None, f"read --follow exited with {proc.returncode}: {proc.stderr.read()}"
            return bool(shown)

        wait_until(follower_shows_a_record, COMMAND_TIMEOUT_S, "read --follow to show a record")
        assert shown[0].rstrip("\n").endswith(" k: ping"), shown
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=SIGINT_EXIT_TIMEOUT_S) == 130
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=SIGINT_EXIT_TIMEOUT_S)
        proc.stdout.close()
        proc.stderr.close()


def test_binary_data_is_base64_in_json_and_escaped_in_text(up):
    d = up.data_dir
    cli.ok(cli.sms_cmd(d, "stream", "create", "bin"))
    with sms.Client.from_cluster_file(os.path.join(d, "cluster.json")) as client:
        out = client.put_records("bin", [("k", b"\xde\xad\xbe\xef", None, {"h": b"\xff", "t": b"v"}),
                                         ("k", b"deadbeef"), ("k", "héllo".encode())])
        assert out.failed_record_count == 0, out
    binary, text, accented = [json.loads(line) for line in cli.ok(cli.sms_cmd(d, "read", "bin", "--json")).splitlines()]
    assert "data" not in binary and base64.b64decode(binary["data_b64"]) == b"\xde\xad\xbe\xef"
    assert binary["headers_b64"] == {"h": base64.b64encode(b"\xff").decode()} and binary["headers"] == {"t": "v"}
    assert text["data"] == "deadbeef" and "data_b64" not in text
    assert accented["data"] == "héllo"
    shown = cli.ok(cli.sms_cmd(d, "read", "bin")).splitlines()
    assert shown[0].endswith(r" k [h=\xff, t=v]: \xde\xad\xbe\xef"), shown
    assert shown[1].endswith(" k: deadbeef") and shown[2].endswith(" k: héllo"), shown


def test_queue_commands(up):
    """`sms queue create|list|describe|update|delete` (docs/queues.md), text and JSON; a bad
    setting is one line naming the error, and changes nothing."""
    d = up.data_dir
    cli.ok(cli.sms_cmd(d, "stream", "create", "tasks", "--partitions", "2"))
    made = json.loads(cli.ok(cli.sms_cmd(d, "queue", "create", "tasks", "work", "--start", "TRIM_HORIZON",
                                         "--visibility-s", "45", "--json")))
    assert (made["name"], made["stream"], made["start"], made["visibility_s"], made["max_receive_count"]) == (
        "work", "tasks", "TRIM_HORIZON", 45, 6)
    assert "work  on tasks  ACTIVE  from TRIM_HORIZON  visibility 45 s  dead letters after 6 receives" in cli.ok(
        cli.sms_cmd(d, "queue", "describe", "work"))
    bad = cli.sms_cmd(d, "queue", "update", "work", "--visibility-s", "99999")
    assert bad.returncode != 0 and "InvalidArgument" in _one_line(bad.stderr)
    updated = json.loads(cli.ok(cli.sms_cmd(d, "queue", "update", "work", "--no-dead-letters", "--json")))
    assert (updated["visibility_s"], updated["max_receive_count"], updated["uid"]) == (45, 0, made["uid"])
    assert [q["name"] for q in json.loads(cli.ok(cli.sms_cmd(d, "queue", "list", "--stream", "tasks", "--json")))] \
        == ["work"]
    assert "queue work deleted" in cli.ok(cli.sms_cmd(d, "queue", "delete", "work"))
    gone = cli.sms_cmd(d, "queue", "describe", "work")
    assert gone.returncode != 0 and "QueueNotFound" in _one_line(gone.stderr)
    assert cli.ok(cli.sms_cmd(d, "queue", "list")).strip() == "no queues"
