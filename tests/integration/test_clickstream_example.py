"""The clickstream example end to end, as its README command runs it: real cluster
processes, two worker processes each running both stages on one local Spark session, and
one of them kill -9'd once a third of the clicks are counted. Every (user, minute) count
must come out exact: no click lost or counted twice across the kill. (The example prints
its throughput; it is not asserted: timings are never test assertions.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_clickstream_counts_are_exact_across_a_kill9():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "clickstream", "run.py"),
                          "--clicks", "30000", "--kill", "--master", "local[1]", "--timeout-s", "240"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["killed"] == ["worker-1"]
    assert result["counted"] == 30000, result
    assert result["exact"], result
