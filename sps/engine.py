"""The engine protocol: what runs a stage's operation on a micro-batch of records.

`sps` knows engines only through this protocol; an engine package implements it and
`node/graph_commands.py` picks one by the stage's `engine` name: `python` (below, in
process, for tests and light stages) or `spark` (`spark_sps.engine.SparkEngine`, a local
PySpark session). `sps` never imports an engine package (tests/unit/test_layers.py).

A micro-batch is one `InputBatch` per input partition the worker holds: the pages it read
(`sms.batch.RecordBatch`, the stored batches as columns). `apply_batches` runs the
operation on each partition's batch separately, so each output row is known to come from
one input partition (its outputs carry that partition's SSSNs: sps/output.py), but an
engine may run them all as one job: Spark does (one job per micro-batch, not one per
partition).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from sms.batch import RecordBatch
from sms.types import Record

Operation = Callable[..., Iterable[dict]]


class InputBatch:
    """The records of one input partition in one micro-batch: read pages, in SN order."""

    __slots__ = ("stream", "ordinal", "pages", "_records")

    def __init__(self, stream: str, ordinal: int, pages: list[RecordBatch] | None = None):
        self.stream = stream
        self.ordinal = ordinal
        self.pages: list[RecordBatch] = [p for p in pages or () if len(p)]
        self._records: list[Record] | None = None

    def add(self, page: RecordBatch) -> None:
        if len(page):
            self.pages.append(page)
            self._records = None

    def __len__(self) -> int:
        return sum(len(p) for p in self.pages)

    @property
    def first_sn(self) -> int:
        return self.pages[0].first_sn

    @property
    def last_sn(self) -> int:
        return self.pages[-1].last_sn

    def records(self) -> list[Record]:
        """The records as `Record` tuples (decoded once)."""
        if self._records is None:
            self._records = [r for p in self.pages for r in p.records()]
        return self._records

    def to_arrow(self, *, timestamp_unit: str = "ms"):
        """One pyarrow.Table (sms.batch.ARROW_COLUMNS), one chunk per stored batch."""
        import pyarrow as pa

        from sms.batch import arrow_schema
        chunks = [c for p in self.pages for c in p.to_arrow_batches(timestamp_unit=timestamp_unit)]
        return pa.Table.from_batches(chunks, schema=arrow_schema(timestamp_unit))


def record_row(r: Record) -> dict:
    """A record as a Python engine's input row."""
    return {"partition_key": r.partition_key, "data": r.data, "sequence_number": r.sequence_number,
            "arrival_time_ms": r.arrival_time_ms, "partition_id": r.partition_id, "headers": r.headers}


@runtime_checkable
class Engine(Protocol):
    name: str

    def start(self) -> None:
        """Get ready to run batches (start a Spark session), before the worker claims any."""
        ...

    def warm_up(self, operation: Operation) -> None:
        """Get ready to run `operation` fast (Spark: run it on made-up batches), before the
        worker claims any partition; failures are ignored."""
        ...

    def apply(self, operation: Operation, records: list[Record]) -> list[dict]:
        """Run `operation` on one partition's records; the result rows (dicts with the
        stage's key column and `data`, optionally `headers`) go to the stage's outputs.
        Called from a worker thread (the worker isolates failing records with it)."""
        ...

    def apply_batches(self, operation: Operation, batches: dict[str, InputBatch]) -> dict[str, list[dict]]:
        """`apply` on each partition's batch of one micro-batch: result rows per key of
        `batches`. Raises when the operation fails on any of them (the worker then applies
        them one by one to find which)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (a Spark session); idempotent."""
        ...


class PythonEngine:
    """Runs an operation on plain Python: records (dicts) in, result rows (dicts) out."""

    name = "python"

    def start(self) -> None:
        pass

    def warm_up(self, operation: Operation) -> None:
        pass

    def apply(self, operation: Operation, records: list[Record]) -> list[dict]:
        return list(operation([record_row(r) for r in records]))

    def apply_batches(self, operation: Operation, batches: dict[str, InputBatch]) -> dict[str, list[dict]]:
        return {key: self.apply(operation, b.records()) for key, b in batches.items()}

    def close(self) -> None:
        pass
