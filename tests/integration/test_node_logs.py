"""Node logs on real processes (node/logs.py): a cluster started with SMS_LOG_FORMAT=json
writes one JSON object per line to each node's DIR/logs/NODE.log, and routine steps
(creating a stream) log at INFO, not WARNING; a bad setting stops a node at start with one
line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import sms
from node.launcher import LocalCluster

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 60


def test_json_logs_per_node_and_routine_steps_at_info(tmp_path, monkeypatch):
    monkeypatch.setenv("SMS_LOG_FORMAT", "json")
    with LocalCluster(str(tmp_path / "c"), nodes=2) as cluster:
        with sms.Client(cluster.address, **cluster.client_options()) as client:
            client.create_stream("logged", partitions=2, replication_factor=2)
            client.put_record("logged", b"x", "k")
    for node_id in ("control", "n1", "n2"):
        path = tmp_path / "c" / "logs" / f"{node_id}.log"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert lines, f"{path} is empty"
        assert all(line["node"] == node_id and line["level"] and line["logger"] and "message" in line
                   for line in lines), lines[:3]
        assert any("serving" in line["message"] for line in lines), f"{node_id}: no start line"
        warnings = [line for line in lines if line["level"] in ("WARNING", "ERROR", "CRITICAL")]
        assert not warnings, f"{node_id}: a stream's creation and a put logged {warnings}"


def test_a_bad_log_setting_stops_a_node_with_one_line(tmp_path):
    env = {**os.environ, "SMS_LOG_FORMAT": "xml"}
    proc = subprocess.run([sys.executable, "-m", "node", "serve", "--node-id", "n1", "--insecure",
                           "--roles", "storage,ingestion,retrieval",
                           "--metastore", f"embedded://{tmp_path / 'meta.lmdb'}", "--data-dir", str(tmp_path / "n1"),
                           "--listen", "127.0.0.1:0"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=START_TIMEOUT_S)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "sms serve: log.format = 'xml' (from $SMS_LOG_FORMAT): expected one of text, json", \
        proc.stderr
