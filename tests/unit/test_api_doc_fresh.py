"""docs/api.md's limits and errors tables are what sms/limits.py and sms/errors.py say
(scripts/gen_api_tables.py writes them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_api_tables_are_fresh():
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_api_tables.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, "docs/api.md is stale: run scripts/gen_api_tables.py"
