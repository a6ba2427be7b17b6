"""Runs a stage's operation on PySpark: one Spark job per micro-batch, Arrow in and out.

The operation is a DataFrame -> DataFrame function. Its input DataFrame has the columns
`partition_key` (string), `data` (binary), `sequence_number` (string), `arrival_time`
(timestamp), `partition_id` (string) and `headers` (map<string, binary>); the rows of its
result become output records (their `data` column, string or binary, the stage's key
column, and a `headers` map column when the result has one).

A micro-batch holds one batch per input partition the worker holds. Each crosses to the
JVM as an Arrow table (the pages' columns as the compiled codec decoded them: no Python
object per record), and the result comes back as one Arrow table: one Spark job per
micro-batch, whatever the number of partitions, and each output row is known to come from
one input partition. How depends on the operation:

- An operation whose result keeps the `partition_id` column (each result row from input
  rows of the partition it names: a row-wise operation that selects it, a group-by that
  includes it) runs once, on one DataFrame of the whole micro-batch; its rows go to their
  partitions by that column. One plan per micro-batch instead of one per partition: a third
  to a half less JVM time with four partitions (bench/sps_engine.py).
- Any other operation is applied to each batch's own DataFrame, and the results (tagged
  with their batch's index) are put together with a union.

The engine learns which on an operation's first micro-batch, from its result's columns.

Spark is local by default (`local[2]`), or any master URL. One SparkSession serves the
whole worker process (every stage and lease in it); `start()` makes it before the worker
claims a partition.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading

from sms.types import Record, partition_id

log = logging.getLogger(__name__)

INPUT_COLUMNS = ("partition_key", "data", "sequence_number", "arrival_time", "partition_id", "headers")
_TAG = "__sms_batch"
# The driver JVM's options (SPS_SPARK_JAVA_OPTIONS in the environment overrides them): its
# JIT compiles with C1 only, on one thread. A worker's JVM runs many small jobs, and C2's
# compiling cost more CPU than its faster code saved: on this 2-core machine the
# clickstream example's JVMs used 16.6 CPU seconds with the defaults and 9.1 with these,
# and went from 7,700 to 11,000 records/s (docs/sps.md).
SPARK_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1"


def _popen_without_preexec(*args, **kwargs):
    """PySpark's launch of its JVM (pyspark.java_gateway), with no Python code between
    fork and exec. PySpark passes a `preexec_fn` (SIGINT ignored in the child); with one,
    CPython runs the at-fork handlers in the child, and grpcio's break the child of a
    process whose gRPC channels are busy ("Other threads are currently calling into gRPC,
    skipping fork() handlers", then "epoll_wait error: Bad file descriptor", and the JVM
    never started: JAVA_GATEWAY_EXITED, in a few full runs of the suite, in
    tests/integration/test_archive.py's Spark read, the first JVM of its process; any SPS
    worker could meet it). Not reproduced outside the suite: this removes the step those
    lines point at. A
    process group of its own keeps a terminal's Ctrl-C from the JVM just the same, and
    without a preexec_fn CPython forks and execs in C (node/launcher.py starts nodes so for
    the same reason)."""
    import subprocess
    kwargs.pop("preexec_fn", None)
    kwargs.setdefault("process_group", 0)
    return subprocess.Popen(*args, **kwargs)


def spark_session(master: str = "local[2]", app_name: str = "sms-sps"):
    """A SparkSession set up for loopback use (STACK.md: bind to 127.0.0.1, no UI, the
    venv's interpreter for Python workers), its JVM started without a fork handler
    (`_popen_without_preexec`)."""
    from pyspark import java_gateway
    java_gateway.Popen = _popen_without_preexec      # (its module global, what launch_gateway calls)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(master).appName(app_name)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            # (a branch of a micro-batch is one partition's batch, at most SPS_BATCH_RECORDS_MAX
            # rows: one reduce task each is enough, and the branches run side by side)
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.driver.extraJavaOptions", os.environ.get("SPS_SPARK_JAVA_OPTIONS", SPARK_JAVA_OPTIONS))
            .getOrCreate())


class SparkEngine:
    name = "spark"

    def __init__(self, master: str = "local[2]", app_name: str = "sms-sps"):
        self.master = master
        self.app_name = app_name
        self._spark = None
        self._lock = threading.Lock()        # the session's start and stop
        self._closed = False
        # per operation: whether its result keeps `partition_id` (one DataFrame per micro-batch)
        self._keeps_partition: dict = {}

    @property
    def spark(self):
        with self._lock:
            if self._closed:
                raise RuntimeError("the Spark engine is closed (the worker is stopping)")
            if self._spark is None:
                self._spark = spark_session(self.master, self.app_name)
            return self._spark

    def start(self) -> None:
        """The session, and one tiny job (the first job of a JVM is slow)."""
        self.spark.range(1).count()

    def dataframe(self, records: list[Record]):
        """A partition's records as the operation's input (the slow path: a batch being
        split to find a failing record)."""
        return self.spark.createDataFrame(input_table(
            [r.partition_key for r in records], [bytes(r.data) for r in records],
            [r.sequence_number for r in records], [r.arrival_time_ms * 1000 for r in records],
            [r.partition_id for r in records], [list(r.headers.items()) for r in records]))

    def apply(self, operation, records: list[Record]) -> list[dict]:
        return _rows(operation(self.dataframe(records)).toArrow())

    def apply_batches(self, operation, batches: dict) -> dict[str, list[dict]]:
        keys = list(batches)
        results = self._apply_tables(operation, [batches[k].to_arrow(timestamp_unit="us") for k in keys],
                                     [partition_id(batches[k].ordinal) for k in keys])
        return dict(zip(keys, results))

    def warm_up(self, operation) -> None:
        """Run the operation on made-up micro-batches a few times (SPS_WARM_UP_ROUNDS of two
        partitions' SPS_WARM_UP_RECORDS records): a new JVM compiles Spark's own code and the
        operation's plan on its first jobs, which cost seconds and several times the CPU of
        later ones. Its outcome does not matter (made-up data may fail the operation)."""
        from sms import limits
        n = limits.SPS_WARM_UP_RECORDS
        ids = [partition_id(0), partition_id(1)]
        tables = [input_table([f"warm-up-{i % 64}" for i in range(n)], [b'{"warm_up": %d}' % i for i in range(n)],
                              [str(i) for i in range(n)], range(n), [pid] * n, [[]] * n) for pid in ids]
        for _ in range(limits.SPS_WARM_UP_ROUNDS):
            try:
                self._apply_tables(operation, tables, ids)
            except Exception:            # noqa: BLE001 (made-up input; the real batches will tell)
                return

    def _apply_tables(self, operation, tables: list, ids: list[str] | None = None) -> list[list[dict]]:
        """The operation's result rows for each table (one input partition's batch each;
        `ids`: their partition_id, when known)."""
        if not tables:
            return []
        if len(tables) == 1:
            return [_rows(operation(self.spark.createDataFrame(tables[0])).toArrow())]
        if ids is not None and len(set(ids)) == len(ids) and self._keeps_partition.get(operation, True):
            # (two input streams' partitions may share a partition_id: then by branches)
            import pyarrow as pa
            result = operation(self.spark.createDataFrame(pa.concat_tables(tables)))
            keeps = "partition_id" in result.columns
            self._keeps_partition[operation] = keeps
            if keeps:
                try:
                    return _by_partition(result.toArrow(), ids)
                except _NotKept as e:    # (then by branches, from now on)
                    self._keeps_partition[operation] = False
                    log.warning("%s; it runs on each input partition's DataFrame from now on", e)
        from pyspark.sql import functions as F
        # each batch its own DataFrame, the branches put together by a union: one job, and
        # each branch reads only its batch (one DataFrame of every batch, filtered by a tag
        # per branch, had each branch convert every batch's rows: twice the JVM's CPU with
        # four partitions, measured in bench/sps_engine.py)
        branches = [operation(self.spark.createDataFrame(t)).withColumn(_TAG, F.lit(i))
                    for i, t in enumerate(tables)]
        result = functools.reduce(lambda a, b: a.unionByName(b), branches).toArrow()
        tags = result.column(_TAG).to_pylist()
        rows = _rows(result.drop_columns([_TAG]))
        out: list[list[dict]] = [[] for _ in tables]
        for tag, row in zip(tags, rows):
            out[tag].append(row)
        return out

    def broken(self, e: BaseException) -> bool:
        """The error is the engine's, not the operation's: the session is closed or its JVM
        is gone (the worker then fails the partitions instead of dead-lettering records)."""
        if self._closed:
            return True
        text = f"{type(e).__name__}: {e}"
        return any(s in text for s in ("Py4JNetworkError", "Answer from Java side is empty",
                                       "SparkContext was shut down", "stopped SparkContext",
                                       "Cannot call methods on a stopped"))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._spark is not None:
                self._spark.stop()
                self._spark = None


def input_table(keys, data, sequence_numbers, arrival_time_us, partition_ids, headers):
    """An operation's input as a pyarrow.Table (sms.batch's columns, timestamps in µs) from
    one list per column; `headers`: a list of (name, value) pairs per record."""
    import pyarrow as pa

    from sms.batch import arrow_schema
    schema = arrow_schema("us")
    return pa.table({"partition_key": pa.array(keys, pa.string()), "data": pa.array(data, pa.binary()),
                     "sequence_number": pa.array(sequence_numbers, pa.string()),
                     "arrival_time": pa.array(arrival_time_us, schema.field("arrival_time").type),
                     "partition_id": pa.array(partition_ids, pa.string()),
                     "headers": pa.array(headers, schema.field("headers").type)}, schema=schema)


class _NotKept(ValueError):
    """An operation's result has a partition_id column that is not its rows' input partition."""


def _by_partition(table, ids: list[str]) -> list[list[dict]]:
    """A whole micro-batch's result rows, per input partition (by their partition_id)."""
    index = {pid: i for i, pid in enumerate(ids)}
    out: list[list[dict]] = [[] for _ in ids]
    for pid, row in zip(table.column("partition_id").to_pylist(), _rows(table)):
        i = index.get(pid)
        if i is None:
            raise _NotKept(f"a result row's partition_id is {pid!r}, not one of the micro-batch's partitions "
                           f"{sorted(index)}: the operation's result does not keep each row's input partition")
        out[i].append(row)
    return out


def _rows(table) -> list[dict]:
    """Result rows as dicts; a map column (headers) as a dict."""
    rows = table.to_pylist()
    maps = [f.name for f in table.schema if str(f.type).startswith("map<")]
    for row in rows:
        for name in maps:
            if row[name] is not None:
                row[name] = dict(row[name])
    return rows
