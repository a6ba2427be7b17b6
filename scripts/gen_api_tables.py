#!/usr/bin/env python3
"""Regenerate the limits and errors tables of docs/api.md from sms/limits.py and
sms/errors.py (their order: limits as defined, errors by gRPC status then name).

    .venv/bin/python scripts/gen_api_tables.py            # rewrite docs/api.md
    .venv/bin/python scripts/gen_api_tables.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sms import errors, limits  # noqa: E402

DOC = ROOT / "docs" / "api.md"


def _value(v) -> str:
    if isinstance(v, tuple):
        return ", ".join(_value(x) for x in v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else str(v)


def limits_table() -> list[str]:
    rows = [f"| `{name}` | {_value(v)} |" for name, v in vars(limits).items()
            if name.isupper() and not name.startswith("_") and isinstance(v, (int, float, tuple))]
    return ["| name | value |", "|---|---|", *rows]


def errors_table() -> list[str]:
    classes = sorted(errors.registry().values(), key=lambda c: (c.code.name, c.__name__))
    rows = [f"| `{c.__name__}` | {c.code.name} | {'yes' if c.retriable else ''} | {'yes' if c.refresh_map else ''} |"
            for c in classes]
    return ["| error | gRPC status | retriable | refresh map |", "|---|---|---|---|", *rows]


def _replace(lines: list[str], heading: str, table: list[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("| "))
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[:first] + table + lines[end:]


def render() -> str:
    lines = DOC.read_text().split("\n")
    lines = _replace(lines, "## Limits", limits_table())
    lines = _replace(lines, "## Errors", errors_table())
    return "\n".join(lines)


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if text == DOC.read_text() else 1)
    DOC.write_text(text)
