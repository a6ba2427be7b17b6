"""The import rule (docs/architecture.md, "Layout"): each package imports only the
layers below it. `sms` is the client and the data types it shares with servers, and
imports no server package; `metastore` sits below every role, and `kernel` (what only
servers use: ports, rate limits, retention, asyncio tools, Prometheus metrics, the server
half of the gRPC edge, encryption, audit) above it; a role never imports another role
(co-located roles talk through the ports in kernel/ports.py, wired by node/server.py);
`spark_sps` is an engine for `sps`; only `node` (process setup: serve, CLI, launcher)
imports them all. Imports inside functions count too; and an application that imports the
client loads no server module and no prometheus_client (checked in a fresh process)."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
OURS = {"sms", "metastore", "kernel", "archive", "storage", "ingestion", "retrieval", "control", "kinesis", "sps",
        "spark_sps", "node", "queues", "delivery"}
ALLOWED = {
    "sms": {"sms"},
    "metastore": {"sms", "metastore"},
    "kernel": {"sms", "metastore", "kernel"},        # what every server role shares and no client needs
    "archive": {"sms", "metastore", "kernel", "archive"},   # a library of the roles that keep or read the archive
    "storage": {"sms", "metastore", "kernel", "archive", "storage"},
    "ingestion": {"sms", "metastore", "kernel", "ingestion"},
    "retrieval": {"sms", "metastore", "kernel", "archive", "retrieval"},
    "control": {"sms", "metastore", "kernel", "archive", "control"},
    # the Kinesis endpoint: a client of the roles over gRPC, which verifies keys as control/auth.py keeps them
    "kinesis": {"sms", "metastore", "kernel", "control", "kinesis"},
    "sps": {"sms", "metastore", "kernel", "sps"},
    # the queue owners (docs/queues.md): a key's streams as control/auth.py keeps them, and the
    # queues' entries as control/queues.py writes them
    "queues": {"sms", "metastore", "kernel", "control", "queues"},
    # the channel workers (docs/channels.md): the channels' entries as control/channels.py writes them
    "delivery": {"sms", "metastore", "kernel", "control", "delivery"},
    "spark_sps": {"sms", "sps", "spark_sps"},
    "node": OURS,
}


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return sorted((line, top) for line, top in out if top in OURS)


def test_every_package_has_a_rule():
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name in OURS | {"tests", "bench"}}
    assert OURS <= found | {"node"} and (ROOT / "node" / "__init__.py").exists()


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layers(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, top in imports_of(path):
            if top not in ALLOWED[package]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {top}")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


SERVER_ONLY = ("prometheus_client", "kernel", "metastore", "archive", "storage", "ingestion", "retrieval",
               "control", "kinesis", "sps", "spark_sps", "node", "queues", "delivery", "pyiceberg")


def test_the_client_loads_no_server_module():
    code = ("import json, sys\n"
            "import sms, sms.aio, sms.client, sms.producer, sms.consumer, sms.accumulator, sms.rpc\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {SERVER_ONLY!r})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_the_checker_sees_a_violation(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("def f():\n    from storage.service import StorageNode\nimport control.chains\n")
    assert sorted(imports_of(planted)) == [(2, "storage"), (3, "control")]


def test_both_engines_implement_the_engine_protocol():
    from sps.engine import Engine, PythonEngine
    from spark_sps.engine import SparkEngine
    assert isinstance(PythonEngine(), Engine)
    engine = SparkEngine()          # no Spark session starts until a batch needs one
    try:
        assert isinstance(engine, Engine) and engine.name == "spark"
    finally:
        engine.close()
