"""Screenshots of the web console (node/console.py) for docs/operations.md: a local secure
cluster of three storage nodes with two streams (one split), a producer, a consumer group
that falls behind and catches up, a registered consumer; the page left open long enough
for its history to hold a few points; then each tab and two dialogs, saved as
docs/images/console-*.png.

    .venv/bin/python scripts/console_screenshots.py [--out docs/images] [--warm-s 80]

Needs Chromium and chromedriver (/usr/bin, Debian's chromium and chromium-driver) and
selenium, as tests/integration/test_console.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sms                                                     # noqa: E402
from node.launcher import LocalCluster                         # noqa: E402
from tests.integration.test_console import click, open_browser, show  # noqa: E402

WINDOW = (1440, 1000)
PRODUCE_EVERY_S = 0.2


def produce(client, stop: threading.Event) -> None:
    pages = ["/", "/cart", "/pay", "/search", "/item/42"]
    n = 0
    while not stop.is_set():
        batch = [(f"user-{random.randrange(500)}", json.dumps(
            {"user": random.randrange(500), "page": random.choice(pages), "n": n + i}).encode()) for i in range(20)]
        client.put_records("clicks", batch)
        client.put_records("orders", [(f"o{n}", f"order {n}: 3 items".encode())])
        n += 20
        stop.wait(PRODUCE_EVERY_S)


def consume(client, stop: threading.Event, slow: threading.Event) -> None:
    with client.consumer("clicks", "billing", member_id="billing-1", wait_ms=200) as member:
        while not stop.is_set():
            batch = member.poll(timeout_s=0.5)
            if batch is not None:
                member.checkpoint(batch)
            if slow.is_set():
                stop.wait(1.5)


def save(driver, out: str, name: str) -> None:
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(WINDOW[0], min(max(WINDOW[1], height + 40), 2000))
    time.sleep(0.5)                      # (the window's new size drawn)
    driver.save_screenshot(os.path.join(out, f"console-{name}.png"))
    driver.set_window_size(*WINDOW)
    print("saved", name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                      "docs", "images"))
    parser.add_argument("--warm-s", type=float, default=80, help="how long the page gathers history first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(tmp, nodes=3) as cluster, \
            sms.Client(cluster.address, **cluster.client_options()) as client:
        client.create_stream("clicks", partitions=4, replication_factor=2, retention_hours=48)
        client.create_stream("orders", partitions=2, replication_factor=2)
        client.split("orders", "p0001")
        client.register_consumer("orders", "audit")
        stop, slow = threading.Event(), threading.Event()
        threads = [threading.Thread(target=produce, args=(client, stop), daemon=True),
                   threading.Thread(target=consume, args=(client, stop, slow), daemon=True)]
        for t in threads:
            t.start()
        driver = open_browser(cluster)
        try:
            driver.set_window_size(*WINDOW)
            deadline = time.monotonic() + args.warm_s
            while time.monotonic() < deadline:           # (the consumer falls behind midway)
                if time.monotonic() > deadline - args.warm_s / 2:
                    slow.set()
                time.sleep(1)
            show(driver, "overview")
            click(driver, '#nodes-table tr[data-node="n1"]', "n1")
            time.sleep(1.5)
            save(driver, args.out, "overview")
            show(driver, "streams")
            time.sleep(1)
            save(driver, args.out, "streams")
            show(driver, "consumers")
            time.sleep(1)
            save(driver, args.out, "consumers")
            click(driver, '[data-stream="clicks"] [data-group="billing"] button[data-action="reset-group"]', "reset")
            driver.find_element("id", "dialog-plan-button").click()
            time.sleep(2)
            save(driver, args.out, "reset-plan")
            driver.find_element("id", "dialog-cancel").click()
            show(driver, "streams")
            click(driver, '[data-stream="clicks"] button[data-action="repartition"]', "repartition")
            time.sleep(0.5)
            save(driver, args.out, "dialog")
            driver.find_element("id", "dialog-cancel").click()
            show(driver, "browser")
            driver.execute_script("document.getElementById('browse-stream').value = 'clicks';"
                                  "document.getElementById('browse-stream').dispatchEvent(new Event('change'))")
            time.sleep(0.5)
            driver.find_element("id", "browse-read").click()
            time.sleep(2)
            save(driver, args.out, "messages")
        finally:
            stop.set()
            driver.quit()
            for t in threads:
                t.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
