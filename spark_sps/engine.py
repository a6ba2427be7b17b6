"""Runs a stage's operation on PySpark: each batch of records becomes a DataFrame.

The DataFrame has the columns `partition_key` (string), `data` (binary),
`sequence_number` (string), `arrival_time` (timestamp) and `partition_id` (string). The
operation is a DataFrame -> DataFrame function; the rows of its result become output
records (their `data` column, string or binary, and the stage's key column). Spark is
local by default (`local[2]`), or any master URL. The SparkSession starts at the first
batch and lives as long as the worker.
"""

from __future__ import annotations

import os
import sys
import threading

from sms.types import Record

INPUT_COLUMNS = ("partition_key", "data", "sequence_number", "arrival_time", "partition_id")


def spark_session(master: str = "local[2]", app_name: str = "sms-sps"):
    """A SparkSession set up for loopback use (STACK.md: bind to 127.0.0.1, no UI, the
    venv's interpreter for Python workers)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(master).appName(app_name)
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .getOrCreate())


class SparkEngine:
    name = "spark"

    def __init__(self, master: str = "local[2]", app_name: str = "sms-sps"):
        self.master = master
        self.app_name = app_name
        self._spark = None
        self._lock = threading.Lock()        # batches of several partitions run in threads
        self._closed = False

    @property
    def spark(self):
        if self._spark is None:
            self._spark = spark_session(self.master, self.app_name)
        return self._spark

    def dataframe(self, records: list[Record]):
        from pyspark.sql.types import BinaryType, StringType, StructField, StructType, TimestampType
        schema = StructType([StructField("partition_key", StringType(), False),
                             StructField("data", BinaryType(), False),
                             StructField("sequence_number", StringType(), False),
                             StructField("arrival_time", TimestampType(), False),
                             StructField("partition_id", StringType(), False)])
        import pandas as pd
        # through Arrow: a batch crosses to the JVM as columns, not one pickled row at a time
        frame = pd.DataFrame({
            "partition_key": [r.partition_key for r in records],
            "data": [bytes(r.data) for r in records],
            "sequence_number": [r.sequence_number for r in records],
            "arrival_time": pd.to_datetime([r.arrival_time_ms for r in records], unit="ms", utc=True),
            "partition_id": [r.partition_id for r in records]})
        return self.spark.createDataFrame(frame, schema)

    def apply(self, operation, records: list[Record]) -> list[dict]:
        with self._lock:
            if self._closed:
                raise RuntimeError("the Spark engine is closed (the worker is stopping)")
            result = operation(self.dataframe(records))
            return result.toPandas().to_dict("records")

    def close(self) -> None:
        with self._lock:                     # after a batch in progress
            self._closed = True
            if self._spark is not None:
                self._spark.stop()
                self._spark = None
