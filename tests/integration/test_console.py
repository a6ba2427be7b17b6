"""The web console of the control node (node/console.py, node/console_static/) on a real
secure cluster: its JSON over HTTPS with the cluster CA, and the page itself driven in
headless Chromium (Debian's /usr/bin/chromium and /usr/bin/chromedriver, selenium).

- /api/state answers JSON with the nodes and a stream the test creates; `/` leads to the
  page; anything but GET/HEAD is refused (the console is read-only); /metrics still works.
- In Chromium: the page lists the nodes; a stream of 2 partitions is drawn; after a split,
  without a reload, p0000 is CLOSED and p0002, p0003 appear with edges from p0000.
- A consumer group's member shows up with its leases (owner) and as a registered consumer.
- A channel shows up with each partition's records delivered and no error; a channel whose
  destination cannot be written (its directory's parent is a regular file) shows its error.
- A standby control node serves it too, marked as standby, naming the leader.
- With a key table, /api/state wants a cluster admin's key (header or ?token=).

Chromium trusts exactly the control node's certificate (checked against the cluster CA
here first): `--ignore-certificate-errors-spki-list` with its public key's hash, not a
blanket `--ignore-certificate-errors`. The browser tests skip, saying why, where Chromium,
chromedriver or selenium is missing.
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
from node.launcher import LocalCluster
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HTTP_TIMEOUT_S = 10
PAGE_DEADLINE_S = 30            # for the page to show a change made through the API
PAGE_LOAD_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("console")), nodes=2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with sms.Client(cluster.address, **cluster.client_options()) as c:
        yield c


def console_url(cluster, path: str = "/") -> str:
    return f"https://{cluster.procs['control'].metrics_address}{path}"


def fetch(cluster, path: str, method: str = "GET"):
    """(status, headers, body) of one request, over HTTPS with the cluster CA."""
    context = ssl.create_default_context(cafile=cluster.ca_file)
    request = urllib.request.Request(console_url(cluster, path), method=method,
                                     headers={"Authorization": f"Bearer {cluster.admin_token}"})
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


# --- the JSON, without a browser ----------------------------------------------------

def test_state_has_nodes_and_streams(cluster, client):
    client.create_stream("listed", partitions=3, replication_factor=2)
    snapshot = wait_until(lambda: (lambda s: s if stream_of(s, "listed") else None)(state(cluster)), PAGE_DEADLINE_S,
                          "the new stream in /api/state")
    assert snapshot["node"]["node_id"] == "control" and snapshot["node"]["leader"] is True
    nodes = {n["node_id"]: n for n in snapshot["nodes"]}
    assert set(nodes) == set(cluster.procs)
    for node_id, proc in cluster.procs.items():
        assert nodes[node_id]["address"] == proc.address and nodes[node_id]["registered"]
    assert nodes["control"]["roles"] == ["control"]
    listed = stream_of(snapshot, "listed")
    parts = listed["partitions"]
    assert [p["partition"] for p in parts] == ["p0000", "p0001", "p0002"]
    assert all(p["state"] == "OPEN" and p["parents"] == [] and len(p["chain"]) == 2 for p in parts)
    assert parts[0]["lo"] == 0 and parts[-1]["hi"] == 1 and parts[0]["hi"] == parts[1]["lo"]
    assert int(parts[-1]["hash_hi"]) == 1 << 128                    # (as text: too big for JavaScript)
    # each replica is listed under its node with its role and epoch, and the chain's creation
    held = [(n, c["partition"], c["role"]) for n in ("n1", "n2") for c in nodes[n]["chains"] if c["stream"] == "listed"]
    assert sorted(r for _n, _p, r in held) == ["head"] * 3 + ["tail"] * 3, held
    assert any(c["stream"] == "listed" and c["action"] for c in snapshot["changes"])


def test_pages_and_read_only(cluster):
    status, headers, _ = fetch(cluster, "/")               # (urllib follows the redirect)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    for name, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
        status, headers, body = fetch(cluster, f"/console/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    assert fetch(cluster, "/console/../console.py")[0] == 404
    assert fetch(cluster, "/nothing")[0] == 404
    for method in ("POST", "PUT", "DELETE"):
        assert fetch(cluster, "/api/state", method)[0] == 405
    status, _, body = fetch(cluster, "/metrics")
    assert status == 200 and b"sms_node_info" in body


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


@pytest.fixture(scope="module")
def browser(cluster):
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
                f"--ignore-certificate-errors-spki-list={spki_sha256(cluster)}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})     # (for page_errors)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(PAGE_LOAD_TIMEOUT_S)
        driver.get(console_url(cluster, f"/console/?token={cluster.admin_token}"))
        yield driver
    finally:
        driver.quit()


def wait_for(driver, css: str, what: str, count: int = 1):
    """Wait until at least `count` elements match `css`; they."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, PAGE_DEADLINE_S, poll_frequency=0.2).until(
        lambda d: (lambda found: found if len(found) >= count else False)(d.find_elements(By.CSS_SELECTOR, css)),
        f"the page never showed {what} ({css}); the page says: {status_text(driver)}")


def status_text(driver) -> str:
    try:
        return driver.execute_script("return document.getElementById('status').textContent")
    except Exception:                     # noqa: BLE001 (only for the failure message)
        return "?"


def page_errors(driver) -> list[str]:
    """What the page logged as errors (a script error, a CSP refusal, a failed request)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_page_lists_the_nodes(cluster, browser):
    # the page drops ?token= from the address bar (history.replaceState, console.js); the
    # browser reports the new address a moment later on a loaded machine: waited for
    wait_until(lambda: browser.current_url.endswith("/console/"), PAGE_LOAD_TIMEOUT_S,
               f"the address bar without the token: {browser.current_url}")
    for node_id in cluster.procs:
        wait_for(browser, f'#nodes-table tr[data-node="{node_id}"]', f"node {node_id}")
    assert wait_for(browser, "#role", "the leader badge")[0].text == "leader"
    assert browser.execute_script("return document.getElementById('status').dataset.status") == "ok"


def test_page_draws_a_split_live(cluster, client, browser):
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
    assert browser.execute_script("return window.notReloaded === true")
    assert page_errors(browser) == []


def test_page_shows_a_group_and_its_leases(cluster, client, browser):
    client.create_stream("grouped", partitions=2, replication_factor=2)
    client.put_records("grouped", [(f"k{i}", b"v") for i in range(20)])
    with client.consumer("grouped", "billing", member_id="console-m1", wait_ms=200) as member:
        assert sorted(member.assigned) == ["p0000", "p0001"]
        for pid in ("p0000", "p0001"):
            wait_for(browser, f'[data-stream="grouped"] [data-group="billing"] tr[data-lease="{pid}"]'
                              f'[data-owner="console-m1"]', f"billing's lease of {pid} held by console-m1")
        wait_for(browser, '[data-stream="grouped"] tr[data-consumer="billing"]', "billing as a registered consumer")
        group = next(g for g in stream_of(state(cluster), "grouped")["groups"] if g["group"] == "billing")
        assert {(lease["partition"], lease["owner"]) for lease in group["leases"]} == \
            {("p0000", "console-m1"), ("p0001", "console-m1")}
        assert [m["member"] for m in group["members"]] == ["console-m1"]
        assert group["failures"] == 0 and group["dead_letters"] == 0


def channel_of(snapshot: dict, name: str) -> dict | None:
    return next((c for c in snapshot.get("channels", []) if c["channel"] == name), None)


def test_page_shows_channels_and_their_errors(cluster, client, browser, tmp_path):
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

        async def snapshot() -> dict:
            return {"shown": True}
        console.snapshot = snapshot

        def call(query: str = "", header: str = "") -> tuple[str, dict]:
            answer = {}
            environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/state", "QUERY_STRING": query,
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
