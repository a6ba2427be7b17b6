"""Operations of the fan-out tests (tests/integration/test_sps_fanout.py), python engine.

Stages name them as `tests.integration.sps_fanout_ops:FUNCTION`; the worker processes
import this module (PYTHONPATH holds the repository root). Input data is `KEY:N` with N a
zero-padded number; everything an operation adds is derived from N, so a replayed batch
gives the same outputs and the test computes what each output stream must hold with the
same functions:

- `tag_region(rows)`: each row as it came (key, data), its input headers kept, plus the
  headers `tags_of(N)`: `region`, `kind` and (mostly) `amount`, which output filters
  select on;
- `mark_b(rows)`: data + b"|b" (the second stage of a chain).
"""

from __future__ import annotations

REGIONS = ("eu-west", "eu-north", "us-east", "ap-south")


def number_of(data: bytes) -> int:
    return int(bytes(data).rsplit(b":", 1)[1])


def tags_of(n: int) -> dict[str, str]:
    """The headers tag_region adds to record N. `amount` is absent for every fifth N, not
    a number for every eleventh, written with a fraction for every seventh, and 100
    exactly for N = 50 (the bound of the test's numeric filter)."""
    headers = {"region": REGIONS[n % len(REGIONS)], "kind": "even" if n % 2 == 0 else "odd"}
    amount = (n * 37) % 250
    if n % 11 == 0:
        headers["amount"] = "n/a"
    elif n % 7 == 0:
        headers["amount"] = f"{amount}.5"
    elif n % 5 != 4:
        headers["amount"] = str(amount)
    return headers


def tag_region(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        data = bytes(r["data"])
        headers = {name: bytes(value) for name, value in (r.get("headers") or {}).items()}
        headers.update(tags_of(number_of(data)))
        out.append({"partition_key": r["partition_key"], "data": data, "headers": headers})
    return out


def mark_b(rows: list[dict]) -> list[dict]:
    return [{"partition_key": r["partition_key"], "data": bytes(r["data"]) + b"|b"} for r in rows]
