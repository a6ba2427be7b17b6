"""What ships for Prometheus and Grafana (deploy/, docs/operations.md "Alerts"), checked with
Prometheus's own promtool (Debian's `prometheus` package):

- `promtool check config` on deploy/prometheus/prometheus.yml (its CA and token paths
  pointed at files of the test: promtool checks they exist), which loads the rules;
- `promtool check rules` on deploy/prometheus/sms-rules.yml;
- `promtool test rules` on deploy/prometheus/sms-rules.test.yml: each alert quiet before
  its condition has held for its `for`, firing after with its labels, and series like it
  that should not fire quiet;
- every query of the Grafana dashboard parses (promtool checks them as recording rules),
  and every `sms_` metric the rules and the dashboard name is one the nodes export.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "sms-dashboard.json"
PROMTOOL_TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian's prometheus)")


def _promtool(*args: str, cwd: pathlib.Path) -> str:
    done = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_scrape_config_and_its_rules_check(tmp_path):
    config = (PROMETHEUS / "prometheus.yml").read_text()
    for path in ("/etc/prometheus/sms/ca.pem", "/etc/prometheus/sms/monitor.token"):
        assert path in config
        local = tmp_path / pathlib.Path(path).name
        local.write_text("x\n")
        config = config.replace(path, str(local))
    (tmp_path / "prometheus.yml").write_text(config)
    shutil.copy(PROMETHEUS / "sms-rules.yml", tmp_path / "sms-rules.yml")
    out = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert "SUCCESS" in out and "sms-rules.yml" in out


def test_the_rules_check_and_each_alert_fires_and_stays_quiet_as_tested():
    out = _promtool("check", "rules", "sms-rules.yml", cwd=PROMETHEUS)
    rules = re.findall(r"- alert: (\w+)", (PROMETHEUS / "sms-rules.yml").read_text())
    assert f"SUCCESS: {len(rules)} rules found" in out
    tests = (PROMETHEUS / "sms-rules.test.yml").read_text()
    for alert in rules:           # (each alert has a quiet and a firing case)
        assert f"alertname: {alert}\n        exp_alerts: []" in tests, alert
        assert f"alertname: {alert}\n        exp_alerts:\n" in tests, alert
    assert "SUCCESS" in _promtool("test", "rules", "sms-rules.test.yml", cwd=PROMETHEUS)


def test_the_dashboard_s_queries_parse(tmp_path):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) == len(dashboard["panels"]) >= 15
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"sms:panel_{i}", "expr": e}
                                                        for i, e in enumerate(exprs)]}]}
    (tmp_path / "panels.yml").write_text(json.dumps(rules))          # (YAML takes JSON)
    assert f"SUCCESS: {len(exprs)} rules found" in _promtool("check", "rules", "panels.yml", cwd=tmp_path)


def _exported() -> set[str]:
    """The metric names the nodes export: as node/metrics.py and kernel/metrics.py name them,
    with prometheus_client's suffixes of counters and histograms."""
    names = set()
    for path in ("node/metrics.py", "kernel/metrics.py"):
        for name in re.findall(r'"(sms_[a-z_]+)"', (ROOT / path).read_text()):
            names |= {name, f"{name}_total", f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_every_metric_named_is_exported():
    named = set(re.findall(r"\bsms_[a-z_]+", (PROMETHEUS / "sms-rules.yml").read_text()))
    named |= set(re.findall(r"\bsms_[a-z_]+", json.dumps([t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"]
                                                          for t in p["targets"]])))
    exported = _exported()
    assert "sms_channel_lag_seconds" in exported and "sms_put_records_total" in exported
    assert not named - exported, sorted(named - exported)
    assert not [n for n in exported if n.endswith("_ms")], "gauges are in seconds (Prometheus's convention)"
