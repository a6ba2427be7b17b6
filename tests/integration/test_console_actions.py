"""The web console's actions and message browser (node/console.py, node/console_static/) on
a real secure cluster of three storage nodes, driven in headless Chromium, each checked
against what the cluster then says through the client:

- Over HTTP, the guards: no token is 401; a form's content type is 415; another origin is
  403; bad input is 400 with the named error and changes nothing; a key that is not an
  admin's is refused by the cluster (403, PermissionDenied) and changes nothing.
- In the page, each action behind its dialog: create a stream (describe_stream has it, the
  audit log names the admin's key); change its retention; split it; reset a group: the
  plan first (the checkpoints do not move), then executed (they do); delete a stream
  (refused with the key of a consumer, entered in the page: the error is shown and the
  stream stays; then done with the admin's); drain, undrain, drain again, then stop and
  remove a node (list_nodes follows each step; the stopped node shows down, not hidden).
- The message browser: JSON pretty-printed, text, binary as hex or base64, headers; the
  last n records; from a sequence number; from a time; the next page; its bounds.
- A queue's records by state (available, in flight, dead).

Uses test_console.py's helpers; one cluster and one browser for the module.
"""

from __future__ import annotations

import base64
import json
import time

import pytest

import sms
from node.launcher import LocalCluster
from tests.conftest import wait_until
from tests.integration.test_console import (PAGE_DEADLINE_S, attributes, click, fetch, open_browser, page_errors, screenshot, show,
                                            wait_for)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(str(tmp_path_factory.mktemp("console-actions")), nodes=3) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with sms.Client(cluster.address, **cluster.client_options()) as c:
        yield c


@pytest.fixture(scope="module")
def reader_token(client) -> str:
    _info, token = client.create_key("consumer", name="console-reader")
    return token


@pytest.fixture(scope="module")
def browser(cluster):
    driver = open_browser(cluster)
    try:
        yield driver
    finally:
        driver.quit()


def post(cluster, action: str, body, token: str | None = None, headers: dict | None = None):
    """(status, JSON answer) of one action."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _headers, answer = fetch(cluster, f"/api/actions/{action}", "POST", raw,
                                     {"Content-Type": "application/json", **(headers or {})}, token)
    return status, json.loads(answer)


def streams(client) -> list[str]:
    return client.list_streams()


# --- the guards, over HTTP ----------------------------------------------------------------

def test_actions_want_a_key_json_and_this_origin(cluster, client):
    body = {"name": "guarded", "partitions": 1}
    assert post(cluster, "create-stream", body, token="")[0] == 401
    status, answer = post(cluster, "create-stream", json.dumps(body).encode(),
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415, answer
    status, answer = post(cluster, "create-stream", body, headers={"Origin": "https://evil.example"})
    assert (status, answer["error"]) == (403, "CrossSiteRequest"), answer
    status, answer = post(cluster, "create-stream", body, headers={"Sec-Fetch-Site": "cross-site"})
    assert (status, answer["error"]) == (403, "CrossSiteRequest"), answer
    assert post(cluster, "no-such-action", body)[0] == 404
    assert "guarded" not in streams(client)


@pytest.mark.parametrize("action, body, error", [
    ("create-stream", {"name": "bad", "partitions": 0}, "InvalidArgument"),
    ("create-stream", {"name": "bad", "partitions": "many"}, "InvalidArgument"),
    ("create-stream", {"name": "bad", "colour": "red"}, "InvalidArgument"),
    ("create-stream", {"name": "bad name!"}, "InvalidStreamName"),          # (the cluster's check)
    ("create-stream", b"not json", "InvalidArgument"),
    ("update-stream", {"name": "bad", "retention_hours": 1, "retention_s": 60}, "InvalidArgument"),
    ("repartition", {"name": "bad", "op": "shuffle"}, "InvalidArgument"),
    ("reset-group", {"stream": "bad", "group": "g", "sequence_numbers": {"p0000": "x"}}, "InvalidSequenceNumber"),
    ("drain-node", {"node_id": "n1", "undo": "yes"}, "InvalidArgument"),
])
def test_bad_input_is_400_and_changes_nothing(cluster, client, action, body, error):
    before = streams(client)
    status, answer = post(cluster, action, body)
    assert (status, answer["error"]) == (400, error), answer
    assert streams(client) == before
    assert not any(n.draining for n in client.list_nodes())


def test_a_key_that_may_not_is_refused_by_the_cluster(cluster, client, reader_token):
    client.create_stream("kept", partitions=1, replication_factor=2)
    status, answer = post(cluster, "delete-stream", {"name": "kept"}, token=reader_token)
    assert (status, answer["error"]) == (403, "PermissionDenied"), answer
    status, answer = post(cluster, "drain-node", {"node_id": "n1"}, token=reader_token)
    assert (status, answer["error"]) == (403, "PermissionDenied"), answer
    assert "kept" in streams(client) and not any(n.draining for n in client.list_nodes())
    status, answer = post(cluster, "drain-node", {"node_id": "n1"}, token="sms_not-a-key")
    assert (status, answer["error"]) == (401, "Unauthenticated"), answer


# --- the actions in the page ------------------------------------------------------------------

def fill(driver, values: dict) -> None:
    for element_id, value in values.items():
        field = driver.find_element("id", element_id)
        if field.tag_name == "select":
            from selenium.webdriver.support.ui import Select
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(str(value))


def outcome(driver, expected: str = "ok") -> str:
    """Wait for the dialog's result; its text."""
    result = wait_for(driver, f'#dialog-result[data-outcome="{expected}"]', f"the dialog's {expected} result")[0]
    return result.text


def close_dialog(driver) -> None:
    driver.find_element("id", "dialog-cancel").click()
    wait_until(lambda: not driver.execute_script("return document.getElementById('dialog').open"),
               PAGE_DEADLINE_S, "the dialog closed")


def act_on(driver, css: str, what: str) -> None:
    """Click an action's button; wait for its dialog."""
    click(driver, css, what)
    wait_until(lambda: driver.execute_script("return document.getElementById('dialog').open"), PAGE_DEADLINE_S,
               f"the dialog of {what}")


def test_create_update_split_and_delete_a_stream(cluster, client, browser, reader_token):
    since_ms = int(time.time() * 1000)
    show(browser, "streams")
    act_on(browser, "#create-stream", "the create button")
    fill(browser, {"f-name": "made", "f-partitions": 2, "f-rf": 2, "f-hours": 2})
    screenshot(browser, "dialog")
    browser.find_element("id", "dialog-confirm").click()
    assert "created made with 2 partition(s)" in outcome(browser)
    info = client.get_stream_info("made")
    assert (len(info.partitions), info.replication_factor, info.retention_s) == (2, 2, 7200)
    close_dialog(browser)
    events = client.read_audit(since_ms)["events"]
    created = [e for e in events if e["action"] == "stream.create" and "made" in e["target"]]
    assert created and created[0]["outcome"] == "ok", events
    wait_for(browser, '[data-stream="made"] [data-partition="p0001"][data-state="OPEN"]', "made's p0001")

    act_on(browser, '[data-stream="made"] button[data-action="update-stream"]', "made's retention button")
    fill(browser, {"f-hours": 5})
    browser.find_element("id", "dialog-confirm").click()
    assert "retention of made is now 5 h" in outcome(browser)
    assert client.get_stream_info("made").retention_s == 5 * 3600
    close_dialog(browser)

    act_on(browser, '[data-stream="made"] button[data-action="repartition"]', "made's repartition button")
    fill(browser, {"f-op": "split", "f-p1": "p0000"})
    browser.find_element("id", "dialog-confirm").click()
    assert "open partitions now p0001, p0002, p0003" in outcome(browser)
    assert {p.ordinal: p.state.value for p in client.get_stream_info("made").partitions} == {
        0: "CLOSED", 1: "OPEN", 2: "OPEN", 3: "OPEN"}
    close_dialog(browser)
    wait_for(browser, '[data-stream="made"] path[data-edge="p0000->p0002"]', "the split drawn")

    # with a consumer's key, entered in the page: the cluster refuses, the page says so
    fill(browser, {"key": reader_token})
    browser.find_element("id", "use-key").click()
    act_on(browser, '[data-stream="made"] button[data-action="delete-stream"]', "made's delete button")
    fill(browser, {"f-confirm-name": "made"})
    browser.find_element("id", "dialog-confirm").click()
    assert outcome(browser, "error").startswith("PermissionDenied:")
    assert "made" in streams(client)
    close_dialog(browser)
    fill(browser, {"key": cluster.admin_token})
    browser.find_element("id", "use-key").click()
    wait_for(browser, '#status[data-status="ok"]', "the page updated with the admin's key again")

    act_on(browser, '[data-stream="made"] button[data-action="delete-stream"]', "made's delete button")
    fill(browser, {"f-confirm-name": "not made"})                   # (the name must be typed)
    browser.find_element("id", "dialog-confirm").click()
    assert outcome(browser, "error").startswith("NotConfirmed")
    assert "made" in streams(client)
    fill(browser, {"f-confirm-name": "made"})
    browser.find_element("id", "dialog-confirm").click()
    assert "deleted made" in outcome(browser)
    wait_until(lambda: "made" not in streams(client), PAGE_DEADLINE_S, "made deleted")
    close_dialog(browser)
    wait_until(lambda: not browser.find_elements("css selector", '#stream-list [data-stream="made"]'),
               PAGE_DEADLINE_S, "made gone from the page")
    # (the page's own requests refused while the consumer's key was in use are logged)
    assert [e for e in page_errors(browser) if "401 (Unauthorized)" not in e and "403 (Forbidden)" not in e] == []


def test_reset_a_group_plan_first_then_execute(cluster, client, browser):
    client.create_stream("resettable", partitions=2, replication_factor=2)
    client.put_records("resettable", [(f"k{i}", b"v") for i in range(40)])
    with client.consumer("resettable", "billing", member_id="reset-m1", wait_ms=200) as member:
        got = 0
        deadline = time.monotonic() + PAGE_DEADLINE_S
        while got < 40 and time.monotonic() < deadline:
            batch = member.poll(timeout_s=0.5)
            if batch is not None:
                got += len(batch.records)
                member.checkpoint(batch)
    assert got == 40

    def checkpoints() -> dict:
        return {p.partition_id: p.checkpoint for p in client.describe_group("resettable", "billing").partitions}
    before = checkpoints()
    assert all(c.isdigit() for c in before.values()), before
    show(browser, "consumers")
    wait_for(browser, '[data-stream="resettable"] [data-group="billing"][data-lag-records="0"]', "billing at lag 0")
    act_on(browser, '[data-stream="resettable"] [data-group="billing"] button[data-action="reset-group"]',
           "billing's reset button")
    assert not browser.find_element("id", "dialog-confirm").is_enabled()     # (the plan first)
    fill(browser, {"f-to": "TRIM_HORIZON"})
    browser.find_element("id", "dialog-plan-button").click()
    assert "the plan (nothing changed yet)" in outcome(browser)
    rows = wait_for(browser, "#reset-plan tr[data-plan]", "the plan's rows", 2)
    plan = {r.get_attribute("data-plan"): [td.text for td in r.find_elements("css selector", "td")] for r in rows}
    assert plan == {pid: [pid, "OPEN", before[pid], "TRIM_HORIZON"] for pid in ("p0000", "p0001")}, plan
    screenshot(browser, "reset-plan")
    assert checkpoints() == before                                           # the dry run changed nothing
    browser.find_element("id", "dialog-confirm").click()
    wait_until(lambda: "reset" in browser.find_element("id", "dialog-result").text and
               browser.find_element("id", "dialog-result").get_attribute("data-outcome") == "ok",
               PAGE_DEADLINE_S, "the reset executed")
    after = checkpoints()
    assert after == {"p0000": "TRIM_HORIZON", "p0001": "TRIM_HORIZON"}, after
    close_dialog(browser)
    wait_for(browser, '[data-stream="resettable"] [data-group="billing"][data-lag-records="40"]',
             "billing lagging by all 40 records again")
    assert page_errors(browser) == []


def node_row(browser, node_id: str, up: str, draining: str):
    return wait_for(browser, f'#nodes-table tr[data-node="{node_id}"][data-up="{up}"][data-draining="{draining}"]',
                    f"{node_id} up={up} draining={draining}")[0]


def test_drain_undrain_and_remove_a_node(cluster, client, browser):
    show(browser, "overview")
    load = {n.node_id: n for n in client.list_nodes()}
    assert not load["n3"].draining
    node_row(browser, "n3", "1", "0")
    act_on(browser, '#nodes-table tr[data-node="n3"] button[data-action="drain-node"]', "n3's drain button")
    browser.find_element("id", "dialog-confirm").click()
    assert "n3 is draining" in outcome(browser)
    assert {n.node_id: n.draining for n in client.list_nodes()}["n3"] is True
    close_dialog(browser)
    node_row(browser, "n3", "1", "1")

    act_on(browser, '#nodes-table tr[data-node="n3"] button[data-action="undrain-node"]', "n3's undrain button")
    browser.find_element("id", "dialog-confirm").click()
    assert "n3 no longer drains" in outcome(browser)
    assert {n.node_id: n.draining for n in client.list_nodes()}["n3"] is False
    close_dialog(browser)
    node_row(browser, "n3", "1", "0")

    act_on(browser, '#nodes-table tr[data-node="n3"] button[data-action="drain-node"]', "n3's drain button")
    browser.find_element("id", "dialog-confirm").click()
    assert "n3 is draining" in outcome(browser)
    close_dialog(browser)
    wait_until(lambda: (lambda n: n.replicas + n.learners == 0)(
        {n.node_id: n for n in client.list_nodes()}["n3"]), 60, "n3 drained")
    cluster.kill("n3")
    # stopped: shown down (and draining), not hidden
    node_row(browser, "n3", "0", "1")
    act_on(browser, '#nodes-table tr[data-node="n3"] button[data-action="remove-node"]', "n3's remove button")
    browser.find_element("id", "dialog-confirm").click()
    assert "removed n3" in outcome(browser)
    assert "n3" not in {n.node_id for n in client.list_nodes()}
    close_dialog(browser)
    wait_until(lambda: not browser.find_elements("css selector", '#nodes-table tr[data-node="n3"]'),
               PAGE_DEADLINE_S, "n3 gone from the page once removed")
    assert page_errors(browser) == []


# --- the message browser ------------------------------------------------------------------------

def records_shown(browser) -> list[str] | None:
    """The SNs of the browser's rows."""
    return attributes(browser, "#records-table tr[data-record]", "data-record")


def test_message_browser(cluster, client, browser):
    client.create_stream("browsed", partitions=1, replication_factor=2)
    written = client.put_records("browsed", [
        ("k-json", json.dumps({"user": "ada", "n": 1}).encode()),
        ("k-text", "plain text, ünïcode".encode()),
        ("k-bin", bytes(range(0, 40))),
        *[(f"k{i}", f"record {i}".encode()) for i in range(27)]])
    client.put_record("browsed", b"with headers", "k-h", headers={"trace-id": "t-1", "raw": b"\x00\xff"})
    sns = [r.sequence_number for r in written.records]
    show(browser, "browser")
    wait_until(lambda: "browsed" in attributes(browser, "#browse-stream option", "value"), PAGE_DEADLINE_S,
               "browsed in the stream list")
    fill(browser, {"browse-stream": "browsed"})
    wait_until(lambda: browser.find_elements("css selector", '#browse-partition option[value="p0000"]'),
               PAGE_DEADLINE_S, "browsed's partition")

    # from the oldest, 10 a page; then the next page
    fill(browser, {"browse-from": "TRIM_HORIZON", "browse-limit": 10})
    browser.find_element("id", "browse-read").click()
    rows = wait_for(browser, "#records-table tr[data-record]", "the first page", 10)
    assert [r.get_attribute("data-record") for r in rows] == sns[:10]
    assert [r.get_attribute("data-kind") for r in rows[:3]] == ["json", "text", "binary"]
    cells = rows[0].find_elements("css selector", "td")
    assert cells[2].text == "k-json" and json.loads(cells[4].find_element("css selector", "pre").text) == {
        "user": "ada", "n": 1}
    assert '\n  "user": "ada"' in cells[4].find_element("css selector", "pre").text     # (pretty)
    assert rows[1].find_elements("css selector", "pre")[0].text == "plain text, ünïcode"
    binary = rows[2].find_element("css selector", "pre")
    assert binary.text.split()[:4] == ["00", "01", "02", "03"]                            # hex by default
    fill(browser, {"browse-binary": "base64"})
    wait_until(lambda: binary.text == base64.b64encode(bytes(range(40))).decode(), PAGE_DEADLINE_S,
               "the binary record as base64")
    screenshot(browser, "messages")
    browser.find_element("id", "browse-next").click()
    wait_for(browser, "#records-table tr[data-record]", "the second page appended", 20)
    assert records_shown(browser) == sns[:20]

    # the last 5 records: the last of them has headers
    fill(browser, {"browse-from": "LATEST_N", "browse-n": 5, "browse-limit": 20})
    browser.find_element("id", "browse-read").click()
    wait_until(lambda: len(records_shown(browser)) == 5, PAGE_DEADLINE_S, "the last 5 records")
    rows = browser.find_elements("css selector", "#records-table tr[data-record]")
    assert [r.get_attribute("data-record") for r in rows[:4]] == sns[-4:]
    headers = rows[4].find_elements("css selector", "td")[3].text
    assert "trace-id: t-1" in headers and "raw: base64:AP8=" in headers, headers

    # from a sequence number
    fill(browser, {"browse-from": "AT_SEQUENCE_NUMBER", "browse-sn": sns[25], "browse-limit": 3})
    browser.find_element("id", "browse-read").click()
    wait_until(lambda: records_shown(browser) == sns[25:28], PAGE_DEADLINE_S, "3 records from SN 25")
    assert page_errors(browser) == []


def test_the_browser_api_bounds_and_refusals(cluster, client):
    client.create_stream("bounded", partitions=1, replication_factor=2)
    client.put_records("bounded", [(f"k{i}", b"x") for i in range(5)])
    status, _h, body = fetch(cluster, "/api/records?stream=bounded&partition=p0000&from=TRIM_HORIZON&limit=100000")
    assert status == 400 and json.loads(body)["error"] == "InvalidArgument"
    status, _h, body = fetch(cluster, "/api/records?stream=bounded&partition=p0000&from=SOMEWHERE")
    assert status == 400
    status, _h, body = fetch(cluster, "/api/records?stream=nothing&partition=p0000")
    assert status == 404 and json.loads(body)["error"] == "StreamNotFound"
    status, _h, body = fetch(cluster, "/api/records?stream=bounded&partition=p0000", token="")
    assert status == 401
    first = client.get_next_records(client.get_iterator("bounded", "p0000", "TRIM_HORIZON")).records
    status, _h, body = fetch(cluster, "/api/records?stream=bounded&partition=p0000&from=AT_TIMESTAMP"
                                      f"&timestamp_ms={first[2].arrival_time_ms}")
    # (one batch: its records share one time, so a time finds the batch's first)
    assert status == 200 and [r["sequence_number"] for r in json.loads(body)["records"]] == [
        r.sequence_number for r in first if r.arrival_time_ms >= first[2].arrival_time_ms]


def test_queues_show_their_records(cluster, client, browser):
    """A queue's records not done, by state, from the /metrics of the node owning its
    partition (an owner starts at the queue's first receive)."""
    client.create_stream("queued", partitions=1, replication_factor=2)
    client.create_queue("queued", "jobs", starting_position="TRIM_HORIZON")
    client.put_records("queued", [(f"k{i}", b"job") for i in range(7)])
    assert len(client.queue("jobs").receive(2, wait_s=5)) == 2
    show(browser, "consumers")
    wait_for(browser, '#queues tr[data-queue="jobs"][data-partition="p0000"]', "queue jobs' partition")

    def counted():
        rows = [q for q in json.loads(fetch(cluster, "/api/state")[2])["queues"] if q["queue"] == "jobs"]
        return rows if rows and (rows[0]["available"], rows[0]["in_flight"]) == (5, 2) else None
    (row,) = wait_until(counted, PAGE_DEADLINE_S, "queue jobs: 5 records available, 2 in flight")
    assert (row["stream"], row["dead"]) == ("queued", 0), row


def test_scale_and_merge_through_the_api(cluster, client):
    client.create_stream("rescaled", partitions=2, replication_factor=2)
    status, answer = post(cluster, "repartition", {"name": "rescaled", "op": "scale", "target_partitions": 4})
    assert status == 200 and len(answer["open"]) == 4, answer
    assert sum(p.state.value == "OPEN" for p in client.get_stream_info("rescaled").partitions) == 4
    first, second = answer["open"][:2]
    status, answer = post(cluster, "repartition", {"name": "rescaled", "op": "merge", "partitions": [first, second]})
    assert status == 200 and len(answer["open"]) == 3, answer
    assert sum(p.state.value == "OPEN" for p in client.get_stream_info("rescaled").partitions) == 3
