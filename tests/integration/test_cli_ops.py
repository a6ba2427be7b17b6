"""The operator's CLI on a real `sms up`: `sms config show` (values and their sources),
`sms up --config` (its nodes run with the file's settings), and `sms stream export` /
`import` (a backup and its restore)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration import test_cli as cli

pytestmark = pytest.mark.integration

COMMAND_TIMEOUT_S = 120


def run(cwd: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node", *args], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S, env={**cli._env(), **(env or {})}, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def test_config_show_says_where_each_value_comes_from(tmp_path):
    conf = tmp_path / "sms.toml"
    conf.write_text("[timeouts]\nappend_s = 20\n[log]\nformat = \"json\"\n")
    shown = run(str(tmp_path), "config", "show", "--config", str(conf), "--json",
                env={"SMS_STORAGE_SIZE_CAP_BYTES": "1073741824"})
    rows = {r["key"]: r for r in json.loads(cli.ok(shown))}
    assert (rows["timeouts.append_s"]["value"], rows["timeouts.append_s"]["source"]) == (20.0, str(conf))
    assert (rows["storage.size_cap_bytes"]["value"], rows["storage.size_cap_bytes"]["source"]) == \
        (1073741824, "$SMS_STORAGE_SIZE_CAP_BYTES")
    assert rows["timeouts.rpc_s"]["source"] == "default"
    text = cli.ok(run(str(tmp_path), "config", "show", "--config", str(conf)))
    assert any(line.startswith("timeouts.append_s") and line.endswith(str(conf)) for line in text.splitlines())
    conf.write_text("[timeouts]\nappend_s = -1\n")
    bad = run(str(tmp_path), "config", "show", "--config", str(conf))
    assert bad.returncode == 1
    assert bad.stderr.strip() == f"error: timeouts.append_s = -1 (from {conf}): expected 0.5..300", bad.stderr


def test_up_with_a_config_file_and_a_backup_restored(tmp_path):
    conf = tmp_path / "sms.toml"
    conf.write_text("[storage]\nsize_cap_bytes = 268435456\n[log]\nformat = \"json\"\n")
    data = tmp_path / "up"
    data.mkdir()
    started = cli.Up(str(data), 1, "--config", str(conf))
    try:
        started.wait_for_address()
        d = str(data)
        # the node logs JSON and says where its settings came from
        lines = [json.loads(line) for line in (data / "logs" / "n1.log").read_text().splitlines() if line.strip()]
        said = next(line["message"] for line in lines if line["message"].startswith("configuration: "))
        assert f"storage.size_cap_bytes=268435456 ({conf})" in said, said

        # the web console: printed by `sms up`, in cluster.json, and answering
        with open(data / "cluster.json") as f:
            info = json.load(f)
        assert info["console"].startswith("https://") and info["console"].endswith("/console/")
        assert started.lines.get(timeout=30) == f"console: {info['console']}?token=<the token in cluster.json> " \
                                                "(read-only; the browser must trust the cluster CA)"
        import ssl
        import urllib.request
        state_url = info["console"].replace("/console/", "/api/state")
        state = json.loads(urllib.request.urlopen(urllib.request.Request(
            state_url, headers={"Authorization": f"Bearer {info['token']}"}), context=ssl.create_default_context(
            cafile=info["ca_file"]), timeout=30).read())
        assert {n["node_id"] for n in state["nodes"]} >= {"control", "n1"}, state["nodes"]
        cli.ok(cli.sms_cmd(d, "stream", "create", "orders", "--partitions", "2"))
        cli.ok(cli.sms_cmd(d, "put", "orders", "one", "two", "three", "--key", "k1"))
        cli.ok(cli.sms_cmd(d, "put", "orders", "four", "--key", "k2"))
        out = tmp_path / "backup"
        exported = json.loads(cli.ok(cli.sms_cmd(d, "stream", "export", "orders", str(out), "--json")))
        assert exported == {"stream": "orders", "dir": str(out), "records": 4, "partitions": 2}
        assert sorted(os.listdir(out)) == ["p0000.parquet", "p0001.parquet", "stream.json"]
        imported = json.loads(cli.ok(cli.sms_cmd(d, "stream", "import", str(out), "orders2", "--json")))
        assert imported == {"stream": "orders2", "partitions": 2, "records": 4}
        read = [json.loads(line) for line in cli.ok(cli.sms_cmd(d, "read", "orders2", "--json")).splitlines()]
        assert [r["data"] for r in read if r["partition_key"] == "k1"] == ["one", "two", "three"]
        assert [r["data"] for r in read if r["partition_key"] == "k2"] == ["four"]
        again = cli.sms_cmd(d, "stream", "import", str(out), "orders2")
        assert again.returncode == 1 and "StreamAlreadyExists" in again.stderr
    finally:
        started.stop()
