"""A real node configured by a TOML file and the environment (node/config.py): the values
are in force in the process (its LMDB map size, its metrics address, its log format), the
log says what came from where, and a bad value stops the node at start with one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import wait_until
from tests.integration.test_metrics import scrape

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "node", "serve", "--node-id", "n1", "--insecure",
                             "--metastore", f"embedded://{tmp_path / 'meta.lmdb'}", "--data-dir", str(tmp_path / "n1"),
                             "--ready-file", str(tmp_path / "ready.json"), *extra],
                            cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def ready(proc: subprocess.Popen, tmp_path) -> dict:
    """What the started node wrote to its ready file, once it has."""
    path = tmp_path / "ready.json"

    def written():
        assert proc.poll() is None, f"the node exited with {proc.returncode}: {proc.stderr.read()}"
        return path.exists()
    wait_until(written, START_TIMEOUT_S, "the node's ready file")
    return json.loads(path.read_text())


def test_a_config_file_and_the_environment_are_in_force(tmp_path):
    port = free_port()
    log_file = tmp_path / "n1.log"
    conf = tmp_path / "sms.toml"
    conf.write_text(f"""
[storage]
size_cap_bytes = 134217728
[metastore]
session_ttl_s = 4.0
[node]
metrics_listen = "127.0.0.1:{port}"
[log]
format = "json"
file = "{log_file}"
""")
    proc = serve(tmp_path, {"SMS_CONFIG": str(conf), "SMS_TIMEOUTS_APPEND_S": "12"})
    try:
        assert ready(proc, tmp_path)["metrics_address"] == f"127.0.0.1:{port}"
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
        assert {labels["persistence"]: v for labels, v in samples["sms_lmdb_map_bytes"]} == \
               {"disk": 134217728, "disk_async": 134217728}
        lines = [json.loads(line) for line in log_file.read_text().splitlines()]
        said = next(line["message"] for line in lines if line["message"].startswith("configuration: "))
        for part in (f"storage.size_cap_bytes=134217728 ({conf})", f"metastore.session_ttl_s=4.0 ({conf})",
                     "timeouts.append_s=12.0 ($SMS_TIMEOUTS_APPEND_S)", f"log.format='json' ({conf})"):
            assert part in said, said
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_bad_value_stops_the_node_with_one_line(tmp_path):
    conf = tmp_path / "sms.toml"
    conf.write_text("[storage]\nsize_cap_bytes = 10\n")
    proc = serve(tmp_path, {"SMS_CONFIG": str(conf)})
    _out, err = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode != 0
    assert err.strip() == (f"sms serve: storage.size_cap_bytes = 10 (from {conf}): expected 67108864..1099511627776"), err


def test_metrics_listen_chooses_the_address(tmp_path):
    """`sms serve --metrics-listen HOST:PORT`: the node serves /metrics there, and says so
    in its ready file (and so its registration)."""
    port = free_port()
    proc = serve(tmp_path, {}, "--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}")
    try:
        assert ready(proc, tmp_path)["metrics_address"] == f"127.0.0.1:{port}"
        assert scrape(f"http://127.0.0.1:{port}/metrics")["sms_node_info"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
