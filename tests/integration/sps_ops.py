"""Operations of the SPS worker tests (tests/integration/test_sps_workers.py).

Stages name them as `tests.integration.sps_ops:FUNCTION`; the worker processes import
this module (PYTHONPATH holds the repository root). Every operation is deterministic and
keyed by the input's key, so a replayed batch gives the same outputs, and the expected
output of an input record is `expected_output(key, data)`:

- python engine: `upper(rows)`, and `gated_upper(rows)`: the same, but while the file
  named by $SPS_TEST_GATE (set per worker process) exists, a batch waits for its removal
  and the worker creates GATE.entered: the test then knows the worker is between that
  batch's lease write (its pending batch) and its outputs, and the input backs up;
- spark engine: `spark_upper(df)` (DataFrame -> DataFrame). pyspark is imported inside
  the function, so python-engine workers do not load it.
"""

from __future__ import annotations

import os
import time


def expected_output(key: str, data: bytes) -> tuple[str, bytes]:
    """(output key, output data) of one input record under every operation here."""
    return key, data.upper()


def upper(rows: list[dict]) -> list[dict]:
    return [{"partition_key": r["partition_key"], "data": bytes(r["data"]).upper()} for r in rows]


def gated_upper(rows: list[dict]) -> list[dict]:
    gate = os.environ.get("SPS_TEST_GATE")
    if gate and os.path.exists(gate):
        with open(gate + ".entered", "w"):
            pass
        while os.path.exists(gate):
            time.sleep(0.01)
    return upper(rows)


def spark_upper(df):
    from pyspark.sql import functions as F
    return df.select(F.col("partition_key"), F.upper(F.col("data").cast("string")).alias("data"))


def poisoned_upper(rows: list[dict]) -> list[dict]:
    """upper, but a record whose data starts with b"poison" raises (every time)."""
    for r in rows:
        if bytes(r["data"]).startswith(b"poison"):
            raise ValueError(f"cannot digest {bytes(r['data'])[:20]!r}")
    return upper(rows)
