"""The web console of the control node (node/console.py, node/console_static/) on a real
secure cluster: its JSON over HTTPS with the cluster CA, and the page itself driven in
headless Chromium (Debian's /usr/bin/chromium and /usr/bin/chromedriver, selenium). The
actions and the message browser are in test_console_actions.py.

- /api/state answers JSON with the nodes (up, their disks, replicas, heads and links) and
  a stream the test creates; `/` leads to the page; GET and HEAD only, but for the actions
  (POST); /metrics still works; every metric name the page cites is one /metrics has.
- In Chromium: the overview lists one line per node, its replicas on a click; a stream of
  2 partitions is drawn; after a split, without a reload, p0000 is CLOSED and p0002,
  p0003 appear with edges from p0000.
- Each node keeps its own history (node/metrics.py HistorySampler, a point every 0.5 s
  here: $SMS_HISTORY_SAMPLE_S) with no page open: its /history fills while a producer
  writes, and wants a monitor or admin key like /metrics; /api/history merges the nodes'
  into records/s in above 0 for the stream.
- A consumer group's member shows up with its leases (owner), its lag in records for open
  partitions (a number, never "?"), and as a registered consumer; while a producer and the
  group run, records/s in and out are above 0, and the history has points of both.
- A channel shows up with each partition's records delivered and no error; a channel whose
  destination cannot be written (its directory's parent is a regular file) shows its error.
- A standby control node serves it too, marked as standby, naming the leader.
- With a key table, /api/state wants a cluster admin's key (header or ?token=).

Chromium trusts exactly the control node's certificate (checked against the cluster CA
here first): `--ignore-certificate-errors-spki-list` with its public key's hash, not a
blanket `--ignore-certificate-errors`. The browser tests skip, saying why, where Chromium,
chromedriver or selenium is missing. With $SMS_CONSOLE_SCREENSHOTS set to a directory, the
page tests save screenshots there (docs/images/console-*.png come from
scripts/console_screenshots.py, which runs a busier cluster for longer).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import socket
import ssl
import threading
import urllib.error
import urllib.request

import pytest

import sms
from node.console_history import ENV_SAMPLE_S
from node.launcher import LocalCluster
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HTTP_TIMEOUT_S = 10
PAGE_DEADLINE_S = 30            # for the page to show a change made through the API
PAGE_LOAD_TIMEOUT_S = 30
WINDOW_SIZE = (1440, 1000)      # px: the screenshots' size
SCREENSHOTS = os.environ.get("SMS_CONSOLE_SCREENSHOTS", "")
HISTORY_SAMPLE_S = 0.5          # the nodes' history sample interval here ($SMS_HISTORY_SAMPLE_S; 10 s by default)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_SAMPLE_S, str(HISTORY_SAMPLE_S))          # (the nodes' processes inherit it)
        with LocalCluster(str(tmp_path_factory.mktemp("console")), nodes=2) as c:
            yield c


@pytest.fixture(scope="module")
def client(cluster):
    with sms.Client(cluster.address, **cluster.client_options()) as c:
        yield c


def console_url(cluster, path: str = "/") -> str:
    return f"https://{cluster.procs['control'].metrics_address}{path}"


def fetch(cluster, path: str, method: str = "GET", body: bytes | None = None, headers: dict | None = None,
          token: str | None = None):
    """(status, headers, body) of one request, over HTTPS with the cluster CA (as the admin
    unless `token` says otherwise; "" sends none)."""
    context = ssl.create_default_context(cafile=cluster.ca_file)
    token = cluster.admin_token if token is None else token
    request = urllib.request.Request(console_url(cluster, path), method=method, data=body,
                                     headers={**({"Authorization": f"Bearer {token}"} if token else {}),
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, context=context, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def state(cluster) -> dict:
    status, headers, body = fetch(cluster, "/api/state")
    assert status == 200 and headers["Content-Type"] == "application/json", (status, body[:200])
    return json.loads(body)


def stream_of(snapshot: dict, name: str) -> dict | None:
    return next((s for s in snapshot["streams"] if s["name"] == name), None)


def group_of(snapshot: dict, stream: str, group: str) -> dict | None:
    s = stream_of(snapshot, stream)
    return next((g for g in s["groups"] if g["group"] == group), None) if s else None


# --- the JSON, without a browser ----------------------------------------------------

def test_state_has_nodes_and_streams(cluster, client):
    client.create_stream("listed", partitions=3, replication_factor=2)
    snapshot = wait_until(lambda: (lambda s: s if stream_of(s, "listed") else None)(state(cluster)), PAGE_DEADLINE_S,
                          "the new stream in /api/state")
    assert snapshot["node"]["node_id"] == "control" and snapshot["node"]["leader"] is True
    nodes = {n["node_id"]: n for n in snapshot["nodes"]}
    assert set(nodes) == set(cluster.procs)
    for node_id, proc in cluster.procs.items():
        assert nodes[node_id]["address"] == proc.address and nodes[node_id]["registered"] and nodes[node_id]["up"]
    assert nodes["control"]["roles"] == ["control"]
    listed = stream_of(snapshot, "listed")
    parts = listed["partitions"]
    assert [p["partition"] for p in parts] == ["p0000", "p0001", "p0002"]
    assert all(p["state"] == "OPEN" and p["parents"] == [] and len(p["chain"]) == 2 for p in parts)
    assert parts[0]["lo"] == 0 and parts[-1]["hi"] == 1 and parts[0]["hi"] == parts[1]["lo"]
    assert int(parts[-1]["hash_hi"]) == 1 << 128                    # (as text: too big for JavaScript)
    assert listed["encryption"] == "none" and listed["retention_s"] > 0
    # each replica is listed under its node with its role and epoch, and the chain's creation
    held = [(n, c["partition"], c["role"]) for n in ("n1", "n2") for c in nodes[n]["chains"] if c["stream"] == "listed"]
    assert sorted(r for _n, _p, r in held) == ["head"] * 3 + ["tail"] * 3, held
    assert any(c["stream"] == "listed" and c["action"] for c in snapshot["changes"])

    # what only the nodes hold, read with the caller's key: their status and /metrics
    def whole():
        s = state(cluster)
        ns = {n["node_id"]: n for n in s["nodes"]}
        return s if all(ns[n]["live"] and ns[n]["disk"] for n in ("n1", "n2")) else None
    snapshot = wait_until(whole, PAGE_DEADLINE_S, "the storage nodes' status and disks")
    nodes = {n["node_id"]: n for n in snapshot["nodes"]}
    for n in ("n1", "n2"):
        node = nodes[n]
        assert node["disk"]["lmdb_used_bytes"] > 0 and node["disk"]["disk_free_bytes"] > 0, node["disk"]
        assert node["replicas"] == node["live"]["replicas"] and node["heads"] == node["live"]["heads"], node
        peer = {"n1": "n2", "n2": "n1"}[n]
        assert {(link["peer"], link["direction"]) for link in node["live"]["links"]} == {(peer, "in"), (peer, "out")}
        assert all(link["connected"] and link["heard_ago_s"] is not None for link in node["live"]["links"])
        assert node["status_error"] == "" and node["metrics_error"] == ""
    assert all(p["records"] == 0 for p in stream_of(snapshot, "listed")["partitions"])


def node_history(cluster, node_id: str, token: str | None = None) -> tuple[int, dict | bytes]:
    """(status, the JSON or the body) of one node's own /history (as the admin unless
    `token` says otherwise; "" sends none)."""
    context = ssl.create_default_context(cafile=cluster.ca_file)
    token = cluster.admin_token if token is None else token
    request = urllib.request.Request(f"https://{cluster.procs[node_id].metrics_address}/history",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=HTTP_TIMEOUT_S) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_each_node_keeps_its_history_with_no_page_open(cluster, client):
    """No page polls here (the browser tests come later, and /api/state feeds no history):
    each node samples its own counters; /history wants a monitor or admin key; the
    console's /api/history merges the nodes' into records/s."""
    client.create_stream("sampled", partitions=2, replication_factor=2)
    stop = threading.Event()

    def produce():
        while not stop.is_set():
            client.put_records("sampled", [(f"k{i}", b"v") for i in range(10)])
            stop.wait(0.1)
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        def growing():
            grown = {}
            for node_id in ("n1", "n2"):
                status, history = node_history(cluster, node_id)
                assert status == 200, (status, history)
                points = history["series"].get("in:sampled", [])     # (a 0 first, at the sample before)
                if len(points) >= 3 and points[-1][1] > points[-2][1] > 0:
                    grown[node_id] = history
            return grown
        grown = wait_until(growing, PAGE_DEADLINE_S, "a node's /history with records written to sampled growing")
        for node_id, history in grown.items():
            assert history["node_id"] == node_id and history["sample_s"] == HISTORY_SAMPLE_S, history
            times = [t for t, _v in history["series"]["in:sampled"]]
            assert times == sorted(times) and all(t % (HISTORY_SAMPLE_S * 1000) == 0 for t in times), times

        def flowing():
            status, _, body = fetch(cluster, "/api/history")
            assert status == 200, (status, body[:200])
            answer = json.loads(body)
            rates = [v for _t, v in answer["series"].get("in:sampled", [])]
            return answer if rates and rates[-1] > 0 else None
        answer = wait_until(flowing, PAGE_DEADLINE_S, "records/s in of sampled in /api/history")
        assert answer["sample_s"] == HISTORY_SAMPLE_S and answer["errors"] == {}, answer["errors"]
        assert set(answer["nodes"]) == set(cluster.procs)
        assert answer["series"]["in"] and max(v for _t, v in answer["series"]["in"]) > 0
    finally:
        stop.set()
        producer.join()

    # the same key as /metrics: none, or a key that may not read the metrics, is refused
    _info, monitor = client.create_key("monitor", name="history-monitor")
    _info, reader = client.create_key("consumer", name="history-reader")
    status, body = node_history(cluster, "n1", token="")
    assert status == 401 and b"/history wants a monitor key's token" in body, body
    assert node_history(cluster, "n1", token="not-a-key")[0] == 401
    assert node_history(cluster, "n1", token=reader)[0] == 403
    status, history = node_history(cluster, "n1", token=monitor)
    assert status == 200 and history["node_id"] == "n1"


def test_pages_and_methods(cluster):
    status, headers, _ = fetch(cluster, "/")               # (urllib follows the redirect)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        status, headers, body = fetch(cluster, f"/console/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    assert fetch(cluster, "/console/../console.py")[0] == 404
    assert fetch(cluster, "/nothing")[0] == 404
    for method in ("POST", "PUT", "DELETE"):
        assert fetch(cluster, "/api/state", method)[0] == 405
    assert fetch(cluster, "/api/actions/create-stream")[0] == 405          # (actions are POST)
    status, _, body = fetch(cluster, "/metrics")
    assert status == 200 and b"sms_node_info" in body


def test_the_metric_names_the_page_cites_exist(cluster, client):
    """Every `sms_*` name in the page is one a node's /metrics serves (counters with their
    _total), once the node has counted something."""
    import re
    client.create_stream("cited", partitions=1, replication_factor=2)
    client.put_records("cited", [("k", b"v")])
    client.get_next_records(client.get_iterator("cited", "p0000", "TRIM_HORIZON"))
    page = fetch(cluster, "/console/index.html")[2].decode()
    cited = set(re.findall(r"\bsms_[a-z_]+\b", page))
    assert "sms_put_records_total" in cited and "sms_records_in_total" not in cited
    context = ssl.create_default_context(cafile=cluster.ca_file)
    served = set()
    for proc in cluster.procs.values():
        request = urllib.request.Request(f"https://{proc.metrics_address}/metrics",
                                         headers={"Authorization": f"Bearer {cluster.admin_token}"})
        with urllib.request.urlopen(request, context=context, timeout=HTTP_TIMEOUT_S) as answer:
            text = answer.read().decode()
        # (a family with no sample yet, as a channel's before any channel, has its # HELP line)
        served |= set(re.findall(r"^(sms_[a-z_]+)", text, re.M)) | set(re.findall(r"^# HELP (sms_[a-z_]+)", text, re.M))
    assert cited <= served, cited - served


def test_a_standby_serves_it_marked_as_standby(tmp_path):
    with LocalCluster(str(tmp_path), nodes=1, controls=2) as two:
        context = ssl.create_default_context(cafile=two.ca_file)

        def get(node_id: str, path: str):
            url = f"https://{two.procs[node_id].metrics_address}{path}"
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {two.admin_token}"})
            try:
                with urllib.request.urlopen(request, context=context, timeout=HTTP_TIMEOUT_S) as answer:
                    return answer.status, answer.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        def one_leader():
            by_node = {n: json.loads(get(n, "/api/state")[1])["node"] for n in two.control_ids}
            return by_node if sum(info["leader"] for info in by_node.values()) == 1 else None
        by_node = wait_until(one_leader, PAGE_DEADLINE_S, "one control node leading")
        leader = next(n for n, info in by_node.items() if info["leader"])
        standby = next(info for n, info in by_node.items() if n != leader)
        assert standby["leader_address"] == two.procs[leader].address
        # a node without the control role serves no console (node/metrics.py: its server
        # answers every path with the metrics)
        assert b"SMS console" not in get("n1", "/console/")[1]


# --- the page in Chromium ------------------------------------------------------------

def spki_sha256(cluster) -> str:
    """The base64 SHA-256 of the public key of the certificate the console presents, after
    checking that certificate against the cluster CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    host, port = cluster.procs["control"].metrics_address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=cluster.ca_file)
    with socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT_S) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    spki = x509.load_der_x509_certificate(der).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def open_browser(cluster):
    """A headless Chromium on the console's page (with the admin's key), or a skip."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium): the console's browser tests need it")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            pytest.skip(f"{path} is missing (apt-get install {package}): the console's browser tests need it")
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WINDOW_SIZE[0]},{WINDOW_SIZE[1]}",
                f"--ignore-certificate-errors-spki-list={spki_sha256(cluster)}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})     # (for page_errors)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
    driver.get(console_url(cluster, f"/console/?token={cluster.admin_token}"))
    return driver


@pytest.fixture(scope="module")
def browser(cluster):
    driver = open_browser(cluster)
    try:
        yield driver
    finally:
        driver.quit()


def show(driver, tab: str) -> None:
    """Switch the page to a tab (overview, streams, consumers, browser)."""
    driver.execute_script(f"window.location.hash = '#{tab}'")
    wait_until(lambda: driver.execute_script(f"return !document.getElementById('{tab}').hidden"), PAGE_DEADLINE_S,
               f"the {tab} tab shown")


def screenshot(driver, name: str) -> None:
    """docs/images/console-NAME.png, when $SMS_CONSOLE_SCREENSHOTS names a directory."""
    if SCREENSHOTS:
        driver.execute_script("window.scrollTo(0, 0)")
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(WINDOW_SIZE[0], min(max(WINDOW_SIZE[1], height + 40), 2400))
        driver.save_screenshot(os.path.join(SCREENSHOTS, f"console-{name}.png"))
        driver.set_window_size(*WINDOW_SIZE)


def wait_for(driver, css: str, what: str, count: int = 1):
    """Wait until at least `count` elements match `css`; they."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, PAGE_DEADLINE_S, poll_frequency=0.2).until(
        lambda d: (lambda found: found if len(found) >= count else False)(d.find_elements(By.CSS_SELECTOR, css)),
        f"the page never showed {what} ({css}); the page says: {status_text(driver)}")


def click(driver, css: str, what: str) -> None:
    """Click the first element matching `css`, found again if the page redrew it (it
    redraws what changed every second) between finding and clicking."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked():
        try:
            found = wait_for(driver, css, what)[0]
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", found)
            found.click()
            return True
        except StaleElementReferenceException:
            return False
    wait_until(clicked, PAGE_DEADLINE_S, f"a click on {what}")


def attributes(driver, css: str, name: str) -> list[str]:
    """The attribute `name` of every element matching `css`, read at once in the page (no
    element the page replaces meanwhile goes stale)."""
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])]"
                                 ".map(e => e.getAttribute(arguments[1]))", css, name)


def status_text(driver) -> str:
    try:
        return driver.execute_script("return document.getElementById('status').textContent")
    except Exception:                     # noqa: BLE001 (only for the failure message)
        return "?"


def page_errors(driver) -> list[str]:
    """What the page logged as errors (a script error, a CSP refusal, a failed request)."""
    # (net::ERR_NETWORK_CHANGED: Chromium drops a request in flight when the host's network
    # interfaces change, as the network-namespace tests beside this one make and remove theirs;
    # the page's next poll goes on. Not an error of the page.)
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and "net::ERR_NETWORK_CHANGED" not in e["message"]]


def test_page_lists_the_nodes(cluster, browser):
    # the page drops ?token= from the address bar (history.replaceState, console.js); the
    # browser reports the new address a moment later on a loaded machine: waited for
    wait_until(lambda: browser.current_url.endswith("/console/"), PAGE_LOAD_TIMEOUT_S,
               f"the address bar without the token: {browser.current_url}")
    for node_id in cluster.procs:
        wait_for(browser, f'#nodes-table tr[data-node="{node_id}"][data-up="1"]', f"node {node_id} up")
    assert wait_for(browser, "#role", "the leader badge")[0].text == "leader"
    assert browser.execute_script("return document.getElementById('status').dataset.status") == "ok"
    assert wait_for(browser, "#tile-up .value", "the count of nodes up")[0].text == str(len(cluster.procs))
    # one line per node; its replicas on a click, and gone on another
    assert not browser.find_elements("css selector", "tr[data-node-details]")
    click(browser, '#nodes-table tr[data-node="n1"]', "n1")
    wait_for(browser, 'tr[data-node-details="n1"]', "n1's details")
    wait_for(browser, 'tr[data-node-details="n1"] [data-chain="listed/p0000"]', "n1's replica of listed/p0000")
    screenshot(browser, "overview")
    click(browser, '#nodes-table tr[data-node="n1"]', "n1")
    wait_until(lambda: not browser.find_elements("css selector", "tr[data-node-details]"), PAGE_DEADLINE_S,
               "n1's details closed")
    assert page_errors(browser) == []


def test_page_draws_a_split_live(cluster, client, browser):
    show(browser, "streams")
    client.create_stream("dag", partitions=2, replication_factor=2)
    box = '[data-stream="dag"] [data-partition="{}"][data-state="{}"]'
    for pid in ("p0000", "p0001"):
        wait_for(browser, box.format(pid, "OPEN"), f"{pid} OPEN")
    browser.execute_script("window.notReloaded = true")       # (a reload would lose it)
    client.split("dag", "p0000")
    wait_for(browser, box.format("p0000", "CLOSED"), "p0000 CLOSED")
    for pid in ("p0002", "p0003"):
        wait_for(browser, box.format(pid, "OPEN"), f"{pid} OPEN")
        wait_for(browser, f'[data-stream="dag"] path[data-edge="p0000->{pid}"]', f"the edge p0000 -> {pid}")
    assert wait_for(browser, box.format("p0001", "OPEN"), "p0001 still OPEN")
    edges = browser.find_elements("css selector", '[data-stream="dag"] path[data-edge]')
    assert sorted(e.get_attribute("data-edge") for e in edges) == ["p0000->p0002", "p0000->p0003"]
    # the partition table too: one row a partition, open and closed
    rows = wait_for(browser, '[data-stream="dag"] tr[data-partition-row]', "dag's partition rows", 4)
    assert sorted((r.get_attribute("data-partition-row"), r.get_attribute("data-row-state")) for r in rows) == [
        ("p0000", "CLOSED"), ("p0001", "OPEN"), ("p0002", "OPEN"), ("p0003", "OPEN")]
    assert browser.execute_script("return window.notReloaded === true")
    assert page_errors(browser) == []


def test_page_shows_a_group_its_lag_and_rates(cluster, client, browser):
    """Lag of open partitions in records (not "?"); records/s in and out above 0 while a
    producer and the group run; the history keeps points of both."""
    show(browser, "consumers")
    client.create_stream("grouped", partitions=2, replication_factor=2)
    client.put_records("grouped", [(f"k{i}", b"v") for i in range(20)])
    lag = '[data-stream="grouped"] [data-group="billing"] tr[data-lease="{}"][data-lag-records="{}"]'
    stop = threading.Event()

    def produce():
        while not stop.is_set():
            client.put_records("grouped", [(f"k{i}", b"w") for i in range(10)])
            stop.wait(0.1)
    with client.consumer("grouped", "billing", member_id="console-m1", wait_ms=200) as member:
        assert sorted(member.assigned) == ["p0000", "p0001"]
        for pid in ("p0000", "p0001"):
            wait_for(browser, f'[data-stream="grouped"] [data-group="billing"] tr[data-lease="{pid}"]'
                              f'[data-owner="console-m1"]', f"billing's lease of {pid} held by console-m1")
        wait_for(browser, '[data-stream="grouped"] tr[data-consumer="billing"]', "billing as a registered consumer")
        # before reading: each open partition lags by what it holds, in records
        def lags():
            values = attributes(browser, '[data-stream="grouped"] [data-group="billing"] tr[data-lease]',
                                "data-lag-records")
            return values if len(values) == 2 and all(values) else None
        assert sum(int(v) for v in wait_until(lags, PAGE_DEADLINE_S, "billing's lag in records")) == 20
        done = threading.Event()

        def reading():
            while not done.is_set():
                batch = member.poll(timeout_s=0.5)
                if batch is not None:
                    member.checkpoint(batch)
        producer = threading.Thread(target=produce, daemon=True)
        reader = threading.Thread(target=reading, daemon=True)
        producer.start()
        reader.start()
        try:
            def flowing():
                s = state(cluster)
                g = group_of(s, "grouped", "billing")
                grouped = stream_of(s, "grouped")
                return s if grouped["in_records_per_s"] > 0 and grouped["out_records_per_s"] > 0 and g["rate"] > 0 \
                    else None
            snapshot = wait_until(flowing, PAGE_DEADLINE_S, "records/s in and out of grouped, and billing's rate")
            assert snapshot["totals"]["in_records_per_s"] > 0 and snapshot["totals"]["out_records_per_s"] > 0
            g = group_of(snapshot, "grouped", "billing")
            assert all(isinstance(row["lag_records"], int) for row in g["leases"]), g
            stop.set()
            producer.join()
            # caught up: the lag goes to 0 records in both partitions, on the page too
            for pid in ("p0000", "p0001"):
                wait_for(browser, lag.format(pid, 0), f"billing caught up on {pid}")
        finally:
            stop.set()
            done.set()
            producer.join()
            reader.join()
        screenshot(browser, "consumers")
    group = group_of(state(cluster), "grouped", "billing")
    assert group["failures"] == 0 and group["dead_letters"] == 0
    def both():         # (the nodes read the lag at most every METRICS_LAG_REFRESH_S)
        status, _, body = fetch(cluster, "/api/history")
        series = json.loads(body)["series"] if status == 200 else {}
        return series if series.get("in:grouped") and series.get("lag:grouped/billing") else None
    series = wait_until(both, PAGE_DEADLINE_S, "records/s in and billing's lag in /api/history")
    assert max(v for _t, v in series["in:grouped"]) > 0, series["in:grouped"]
    show(browser, "overview")
    wait_for(browser, '#chart-throughput path[data-series="records/s in"]', "the throughput chart's line")


def channel_of(snapshot: dict, name: str) -> dict | None:
    return next((c for c in snapshot.get("channels", []) if c["channel"] == name), None)


def test_page_shows_channels_and_their_errors(cluster, client, browser, tmp_path):
    show(browser, "consumers")
    client.create_stream("delivered", partitions=1, replication_factor=2)
    client.put_records("delivered", [(f"k{i}", b"v") for i in range(50)])
    out = tmp_path / "out"
    client.create_channel("delivered", "to-files", f"file://{out}", data_freshness_s=1)
    wait_until(lambda: sum(p.records for p in client.describe_channel("to-files").partitions) == 50,
               PAGE_DEADLINE_S, "50 records delivered by channel to-files")
    row = wait_for(browser, '#channels-table tr[data-channel="to-files"][data-partition="p0000"]'
                            '[data-records="50"][data-error="0"]', "to-files' p0000 with 50 records, no error")[0]
    cells = [td.text for td in row.find_elements("css selector", "td")]
    assert cells[:5] == ["to-files BYTES · every 1 s", "delivered", f"FILES file://{out}", "p0000",
                         client.describe_channel("to-files").partitions[0].position], cells
    files = client.describe_channel("to-files").partitions[0].files
    assert cells[5:8] == ["50", str(files), "0"] and cells[-1] == "", cells   # records, files, dead letters; no error
    shown = channel_of(state(cluster), "to-files")
    assert (shown["stream"], shown["kind"], shown["destination"], shown["errors"]) == (
        "delivered", "FILES", f"file://{out}", 0)
    (p,) = shown["partitions"]
    assert (p["partition"], p["records"], p["files"], p["error"]) == ("p0000", 50, files, "")
    assert p["node"] == client.get_stream_info("delivered").partition(0).chain[0].node_id
    assert p["last_commit_age_ms"] is not None

    # a destination that cannot be written: the directory's parent is a regular file
    blocker = tmp_path / "blocker"
    blocker.write_bytes(b"not a directory")
    client.create_channel("delivered", "to-nowhere", f"file://{blocker}/out", data_freshness_s=1)
    failing = wait_for(browser, '#channels-table tr[data-channel="to-nowhere"][data-error="1"] td.error',
                       "to-nowhere's error")[0]
    assert "ArchiveUnavailable" in failing.text and str(blocker) in failing.text, failing.text
    assert wait_for(browser, "#channels-failing", "the count of failing channel partitions")[0].text.startswith(
        "1 channel partition(s) failing")
    (p,) = channel_of(state(cluster), "to-nowhere")["partitions"]
    assert p["records"] == 0 and "ArchiveUnavailable" in p["error"], p
    # the working channel's row is not marked
    assert browser.find_elements("css selector", '#channels-table tr[data-channel="to-files"][data-error="0"]')
    assert page_errors(browser) == []
    for name in ("to-nowhere", "to-files"):
        client.delete_channel(name)
    wait_for(browser, "#channels p.muted", "no channels once both are deleted")


# --- the optional key check (in process: a stub key table) ---------------------------

def test_state_wants_an_admin_key_when_keys_are_given():
    from control.auth import Principal
    from node.console import Console
    from sms.errors import Unauthenticated

    class Keys:
        async def authenticate(self, token: str) -> Principal:
            if token == "admin-token":
                return Principal("k1", "default", "admin", ())
            if token == "reader-token":
                return Principal("k2", "default", "consumer", ())
            raise Unauthenticated("unknown or revoked key")

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        console = Console(loop, "control", view=None, groups=None, is_leader=lambda: True, keys=Keys())

        async def snapshot(live=None) -> dict:
            return {"shown": True}
        console.snapshot = snapshot
        console._read_live = lambda token: None          # (no cluster: nothing from the nodes)
        console.read_history = lambda token: {"series": {}}

        def call(query: str = "", header: str = "", path: str = "/api/state") -> tuple[str, dict]:
            answer = {}
            environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
                       "wsgi.input": io.BytesIO()}
            if header:
                environ["HTTP_AUTHORIZATION"] = header
            body = b"".join(console(environ, lambda status, headers: answer.update(status=status)))
            return answer["status"], json.loads(body)

        assert call()[0].startswith("401")
        assert call("token=wrong")[0].startswith("401")
        status, body = call("token=reader-token")
        assert status.startswith("401") and "admin" in body["error"]
        assert call("token=admin-token") == ("200 OK", {"shown": True})
        assert call(header="Bearer admin-token") == ("200 OK", {"shown": True})
        assert call("token=reader-token", path="/api/history")[0].startswith("401")
        assert call(header="Bearer admin-token", path="/api/history")[0] == "200 OK"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_a_secure_cluster_wants_an_admin_key_for_the_state(cluster):
    """The page itself is public; the state is not: no key, or a key that is not a cluster
    admin's, is refused with 401, as the gRPC API would refuse it."""
    context = ssl.create_default_context(cafile=cluster.ca_file)
    url = console_url(cluster, "/api/state")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url, context=context, timeout=HTTP_TIMEOUT_S)
    assert e.value.code == 401 and b"cluster admin's key" in e.value.read()
    import sms
    with sms.Client(cluster.address, **cluster.client_options()) as client:
        _info, reader = client.create_key("consumer", name="console-reader")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{url}?token={reader}", context=context, timeout=HTTP_TIMEOUT_S)
    assert e.value.code == 401
    with urllib.request.urlopen(f"{url}?token={cluster.admin_token}", context=context,
                                timeout=HTTP_TIMEOUT_S) as answer:
        assert answer.status == 200 and json.loads(answer.read())["nodes"]

