"""The engine protocol: what runs a stage's operation on a batch of records.

`sps` knows engines only through this protocol; an engine package implements it and
`node/graph_commands.py` picks one by the stage's `engine` name: `python` (below, in
process, for tests and light stages) or `spark` (`spark_sps.engine.SparkEngine`, a local
PySpark session). `sps` never imports an engine package (tests/unit/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from sms.types import Record

Operation = Callable[..., Iterable[dict]]


@runtime_checkable
class Engine(Protocol):
    name: str

    def apply(self, operation: Operation, records: list[Record]) -> list[dict]:
        """Run `operation` on one batch; the result rows (dicts with `partition_key` and
        `data`, optionally `explicit_hash_key`) go to the stage's outputs in order. Called
        from a worker thread, one batch at a time per lease."""
        ...

    def close(self) -> None:
        """Release what the engine holds (a Spark session); idempotent."""
        ...


class PythonEngine:
    """Runs an operation on plain Python: records (dicts) in, result rows (dicts) out."""

    name = "python"

    def apply(self, operation: Operation, records: list[Record]) -> list[dict]:
        rows = [{"partition_key": r.partition_key, "data": r.data, "sequence_number": r.sequence_number,
                 "arrival_time_ms": r.arrival_time_ms, "partition_id": r.partition_id} for r in records]
        return list(operation(rows))

    def close(self) -> None:
        pass
