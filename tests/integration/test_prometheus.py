"""Debian's Prometheus scrapes a `sms up` cluster with its monitor key (issue 30 item 3;
docs/operations.md and docs/security.md, "Metrics").

The real `sms up` (a launcher process, TLS, 2 storage nodes) writes a monitor key's token
as `monitor_token` in cluster.json and prints it nowhere. /usr/bin/prometheus then runs
the scrape configuration of docs/operations.md, as it is written there (only its paths,
targets and interval replaced): every node is scraped over HTTPS with the cluster CA and
the token, and `sms_put_records_total` of a stream moves from 0 to the records put. The
same job without the `authorization` setting finds every node down with a 401, and a
direct GET without the token gets 401 with `WWW-Authenticate: Bearer`.

Prometheus comes from scripts/system-deps.sh (`make test` runs it); the test skips,
saying so, only where /usr/bin/prometheus is not installed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

import sms
from tests.conftest import wait_until
from tests.integration import test_cli
from tests.integration.test_cli import Up

pytestmark = pytest.mark.integration

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPERATIONS_DOC = os.path.join(ROOT, "docs", "operations.md")
PROMETHEUS_READY_TIMEOUT_S = 30
SCRAPE_DEADLINE_S = 60         # for Prometheus (scraping every second) to show a change
HTTP_TIMEOUT_S = 10
PROMETHEUS_STOP_TIMEOUT_S = 15
STREAM = "scraped"
RECORDS = 25


def doc_scrape_job() -> dict:
    """The `sms` job of docs/operations.md's scrape configuration (its ```yaml block)."""
    with open(OPERATIONS_DOC) as f:
        blocks = re.findall(r"```yaml\n(.*?)```", f.read(), re.S)
    jobs = [job for block in blocks for job in (yaml.safe_load(block) or {}).get("scrape_configs", [])
            if job.get("job_name") == "sms"]
    assert len(jobs) == 1, f"docs/operations.md should hold one scrape job named sms, not {len(jobs)}"
    return jobs[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """A running `sms up` (2 storage nodes) and its cluster.json; at the end, what it
    printed, which must not hold the monitor token."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip(f"{PROMETHEUS} is missing: scripts/system-deps.sh installs Debian's prometheus "
                    "(apt-get install --no-install-recommends prometheus)")
    d = str(tmp_path_factory.mktemp("prometheus-up"))
    launcher = Up(d, 2)
    try:
        launcher.wait_for_address()
        launcher.wait_for_line(r"^data: ", test_cli.UP_READY_TIMEOUT_S)
        with open(os.path.join(d, "cluster.json")) as f:
            info = json.load(f)
        yield launcher, info
    finally:
        if launcher.proc.poll() is None:
            launcher.proc.send_signal(signal.SIGTERM)
            launcher.proc.wait(timeout=test_cli.UP_STOP_TIMEOUT_S)
        printed = launcher.rest_of_output()
        launcher.stop()
    token = info["monitor_token"]
    assert not [line for line in printed if token in line], "`sms up` printed the monitor token"


@pytest.fixture(scope="module")
def prometheus(up, tmp_path_factory):
    """/usr/bin/prometheus scraping every node each second: job `sms` as the docs give it,
    and job `sms-without-key`, the same without its `authorization`. Yields its URL."""
    _launcher, info = up
    d = tmp_path_factory.mktemp("prometheus")
    credentials = d / "monitor.token"
    credentials.write_text(info["monitor_token"])
    credentials.chmod(0o600)
    job = doc_scrape_job()
    assert job["scheme"] == "https" and "ca_file" in job["tls_config"], job
    assert job["authorization"].get("type", "Bearer") == "Bearer" and "credentials_file" in job["authorization"], job
    job.update(scrape_interval="1s", scrape_timeout="1s",
               static_configs=[{"targets": [n["metrics_address"] for n in info["nodes"]]}])
    job["tls_config"]["ca_file"] = info["ca_file"]
    job["authorization"]["credentials_file"] = str(credentials)
    without = copy.deepcopy(job)
    without["job_name"] = "sms-without-key"
    del without["authorization"]
    config = d / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [job, without]}))
    if os.access(PROMTOOL, os.X_OK):
        checked = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True,
                                 timeout=HTTP_TIMEOUT_S)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    log_path = d / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
                                 f"--storage.tsdb.path={d / 'data'}"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            assert proc.poll() is None, f"prometheus exited with {proc.returncode}: {log_path.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=HTTP_TIMEOUT_S) as answer:
                    return answer.status == 200
            except OSError:
                return False
        wait_until(ready, PROMETHEUS_READY_TIMEOUT_S, f"prometheus ready on {url}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=PROMETHEUS_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def api(url: str, path: str, **params) -> dict:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=HTTP_TIMEOUT_S) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def targets(url: str, job: str) -> dict[str, dict]:
    """instance -> its active target (health, lastError) in Prometheus."""
    return {t["labels"]["instance"]: t for t in api(url, "targets", state="active")["activeTargets"]
            if t["labels"]["job"] == job}


def query_value(url: str, promql: str) -> float:
    [sample] = api(url, "query", query=promql)["result"]
    return float(sample["value"][1])


def test_prometheus_scrapes_every_node_with_the_monitor_key(up, prometheus):
    launcher, info = up
    nodes = {n["metrics_address"] for n in info["nodes"]}
    assert len(nodes) == 3 and info["monitor_token"].startswith("sms_")
    assert launcher.output and not [line for line in launcher.output if info["monitor_token"] in line]

    def all_up():
        seen = targets(prometheus, "sms")
        return set(seen) == nodes and all(t["health"] == "up" for t in seen.values())
    wait_until(all_up, SCRAPE_DEADLINE_S, f"every node up in job sms: {targets(prometheus, 'sms')}")
    # (Prometheus reports a target's health before it commits that scrape's samples: a
    # query right after the first "up" may not see them yet)
    wait_until(lambda: query_value(prometheus, 'count(sms_node_info{job="sms"})') == len(nodes), SCRAPE_DEADLINE_S,
               "every node's sms_node_info in prometheus")

    written = f'sum(sms_put_records_total{{job="sms", stream="{STREAM}"}}) or vector(0)'
    assert query_value(prometheus, written) == 0
    with sms.Client.from_cluster_file(os.path.join(launcher.data_dir, "cluster.json")) as client:
        client.create_stream(STREAM, partitions=2, replication_factor=2)
        client.put_records(STREAM, [(f"key-{i}", b"scraped") for i in range(RECORDS)])
    wait_until(lambda: query_value(prometheus, written) == RECORDS, SCRAPE_DEADLINE_S,
               f"{written} = {RECORDS} in prometheus")


def test_a_scrape_without_the_key_is_refused(up, prometheus):
    _launcher, info = up
    nodes = {n["metrics_address"] for n in info["nodes"]}

    def all_refused():
        seen = targets(prometheus, "sms-without-key")
        return (set(seen) == nodes and all(t["health"] == "down" and "401" in t["lastError"] for t in seen.values())
                and seen)
    wait_until(all_refused, SCRAPE_DEADLINE_S,
               f"every node down with a 401 in job sms-without-key: {targets(prometheus, 'sms-without-key')}")
    context = ssl.create_default_context(cafile=info["ca_file"])
    for address in nodes:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"https://{address}/metrics", context=context, timeout=HTTP_TIMEOUT_S)
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"].startswith("Bearer"), address

