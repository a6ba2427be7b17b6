"""The suite's time budget (tests/conftest.py, $SMS_SUITE_BUDGET_S) fails a run that takes
longer, and prints its slowest tests; a run within it passes. Run on a small module in a
pytest of its own, as `make test` runs the whole suite."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = "tests/unit/test_linkdriver.py"


def run(budget: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SMS_SUITE_BUDGET_S=budget)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra, SMALL],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("extra", [(), ("-n", "2")], ids=["plain", "xdist"])
def test_a_run_past_its_budget_fails_and_prints_the_slowest(extra):
    done = run("0.001", *extra)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "over the time budget" in done.stdout and "past its budget of 0s" in done.stdout
    assert done.stdout.count("test_linkdriver.py::") >= 10         # the slowest, each with its time


def test_a_run_within_its_budget_passes():
    done = run("3600")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over the time budget" not in done.stdout
