"""Operations of the stateful-stage tests (tests/integration/test_sps_state.py), python
engine. Input data is `KEY:SEQ` (tests/integration/test_sps_workers.py `Feeder`); each
operation is deterministic, so a replayed batch gives the same rows:

- `clicks(rows)`: one row per input record: the key as `user`, `n` = 1 and `seq`;
- `timed(rows)`: the same with an event time `ts` = SEQ * TS_STEP_MS;
- `batch_counts(rows)`: pre-aggregated per batch (Spark's partial aggregation, in Python):
  one row per user with `count` = its records in the batch and `seq` = its largest SEQ.
"""

from __future__ import annotations

from collections import Counter

TS_STEP_MS = 10


def seq_of(data: bytes) -> int:
    return int(bytes(data).rsplit(b":", 1)[1])


def clicks(rows: list[dict]) -> list[dict]:
    return [{"user": r["partition_key"], "n": 1, "seq": seq_of(r["data"])} for r in rows]


def timed(rows: list[dict]) -> list[dict]:
    return [{"user": r["partition_key"], "ts": seq_of(r["data"]) * TS_STEP_MS} for r in rows]


def batch_counts(rows: list[dict]) -> list[dict]:
    counts: Counter = Counter()
    last: dict[str, int] = {}
    for r in rows:
        counts[r["partition_key"]] += 1
        last[r["partition_key"]] = max(last.get(r["partition_key"], -1), seq_of(r["data"]))
    return [{"user": u, "count": c, "seq": last[u]} for u, c in sorted(counts.items())]


def clicks_some_bad(rows: list[dict]) -> list[dict]:
    """clicks, but every record whose SEQ is a multiple of BAD_EVERY gives a row without
    `n` (the state's sum cannot take it: it goes to the dead letters)."""
    out = clicks(rows)
    for row in out:
        if row["seq"] % BAD_EVERY == 0:
            del row["n"]
    return out


BAD_EVERY = 25
