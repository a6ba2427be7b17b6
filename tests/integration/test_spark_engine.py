"""SparkEngine against itself and plain Python: a micro-batch of several partitions run as
one Spark job gives each partition what it gets alone (spark_sps/engine.py).

`apply_batches` runs a stage's operation on every input partition's batch of a micro-batch
in ONE Spark job, in one of two ways: an operation whose result keeps `partition_id` runs
once on one DataFrame of every batch, its rows sorted back by that column; any other runs
on each batch's own DataFrame, the results tagged and put together with a union. Either is
only right if no row of one partition reaches another's and none is lost or doubled on the
way. This differential test runs six operations (a row-wise projection and a group-by that
keep `partition_id`, a groupBy count per key that does not, one reading the `headers` map
column, one returning a `headers` map column) over 1, 2 and 4 batches and checks, per
batch, that the rows (as a multiset) are exactly those of `apply` on that batch's records
alone, and of a plain-Python reference computed here; and that each operation ran the way
it should, including one that only pretends to keep `partition_id`.

The batches are real stored-batch bytes, built and sealed as storage seals them
(`wire.build_batch` then `wire.sequence` with a first SN), read as pages of slices
(`sms.batch.RecordBatch`) the way a read returns them: a page may start inside a stored
batch and span two. Every partition uses the same keys, in different numbers, so a count
per key that mixed partitions would show. One real local PySpark session (`local[1]`) for
the module; the lifecycle test (closed engine) runs in a process of its own, since every
SparkEngine of a process shares Spark's one active session.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import functions as F  # noqa: E402

from sms import seqno, wire  # noqa: E402
from sms.batch import RecordBatch  # noqa: E402
from sms.types import Record, partition_id  # noqa: E402
from sps.engine import InputBatch  # noqa: E402
from spark_sps.engine import SparkEngine  # noqa: E402

pytestmark = pytest.mark.integration          # (about 20 s: not slow, by the ~60 s bar)

ROOT = Path(__file__).resolve().parents[2]
LIFECYCLE_S = 180.0                # a JVM starting and stopping in a process of its own, on a loaded machine
KEYS = [f"k{i}" for i in range(5)]
REGIONS = [b"eu-west", b"us-east", b"ap-south"]
RECORDS_PER_PARTITION = (9, 14, 6, 23)     # (partition ordinal -> records in its batch)
SKIPPED_AT_START = 1               # records of the first stored batch before the page starts
TS_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def engine():
    spark_engine = SparkEngine("local[1]", "sms-spark-engine-test")
    spark_engine.start()
    try:
        yield spark_engine
    finally:
        spark_engine.close()


# --- real stored batches ------------------------------------------------------------------

def record_specs(ordinal: int) -> list[tuple[str, bytes, dict[str, bytes]]]:
    """(key, data, headers) of a partition's records: the same keys in every partition,
    in different numbers; every fourth record has no headers."""
    out = []
    for i in range(RECORDS_PER_PARTITION[ordinal]):
        key = KEYS[(i * (ordinal + 1)) % len(KEYS)]
        headers = {} if i % 4 == 3 else {"region": REGIONS[(i + ordinal) % len(REGIONS)], "seq": str(i).encode()}
        out.append((key, f"p{ordinal}-rec{i}-{key}".encode(), headers))
    return out


def sealed(specs, first_sn: int) -> bytes:
    """A stored batch as storage seals it: entries, then sequenced at its first SN."""
    entries = [wire.encode_entry(key.encode(), data, wire.encode_headers(headers)) for key, data, headers in specs]
    return wire.sequence(wire.build_batch(entries), first_sn)


def input_batch(ordinal: int) -> tuple[InputBatch, list[Record]]:
    """A partition's batch as two read pages over two stored batches (the first page
    starts SKIPPED_AT_START records into the first stored batch and ends inside the
    second), and the records it must hold, built here without decoding."""
    specs = [(f"k{ordinal}", b"before-the-page", {"region": b"nowhere"})] * SKIPPED_AT_START + record_specs(ordinal)
    cut = len(specs) // 2
    first_a = seqno.make(TS_MS + ordinal, 1, ordinal)
    first_b = seqno.make(TS_MS + ordinal + 1, 1 + cut, ordinal)
    a, b = sealed(specs[:cut], first_a), sealed(specs[cut:], first_b)
    mid_b = (len(specs) - cut) // 2
    pages = [RecordBatch(ordinal, [(a, SKIPPED_AT_START, cut), (b, 0, mid_b)]),
             RecordBatch(ordinal, [(b, mid_b, len(specs) - cut)])]
    sns = [first_a + i * seqno.COUNTER_UNIT for i in range(cut)] + \
          [first_b + i * seqno.COUNTER_UNIT for i in range(len(specs) - cut)]
    want = [Record(key, data, sn, ordinal, wire.encode_headers(headers))
            for (key, data, headers), sn in list(zip(specs, sns))[SKIPPED_AT_START:]]
    return InputBatch("in", ordinal, pages), want


@pytest.fixture(scope="module")
def batches() -> dict[str, tuple[InputBatch, list[Record]]]:
    made = {f"p{o:04d}": input_batch(o) for o in range(len(RECORDS_PER_PARTITION))}
    for key, (batch, want) in made.items():
        got = batch.records()
        assert [(r.partition_key, r.data, r.sn, r.headers) for r in got] == \
               [(r.partition_key, r.data, r.sn, r.headers) for r in want], f"{key}: the pages decode wrongly"
    return made


# --- the operations, and the same in plain Python ----------------------------------------

def upper(df):
    return df.select("partition_key", F.upper(F.col("data").cast("string")).alias("data"),
                     "sequence_number", "partition_id")


def upper_reference(records: list[Record]) -> list[dict]:
    return [{"partition_key": r.partition_key, "data": r.data.decode().upper(),
             "sequence_number": r.sequence_number, "partition_id": r.partition_id} for r in records]


def count_per_key(df):
    return df.groupBy("partition_key").count()


def count_per_key_reference(records: list[Record]) -> list[dict]:
    return [{"partition_key": k, "count": n} for k, n in Counter(r.partition_key for r in records).items()]


def count_per_partition_and_key(df):
    return df.groupBy("partition_id", "partition_key").count()


def count_per_partition_and_key_reference(records: list[Record]) -> list[dict]:
    return [{"partition_id": records[0].partition_id, "partition_key": k, "count": n}
            for k, n in Counter(r.partition_key for r in records).items()]


def header_value(df):
    """A row's `region` header as its data (null where it has none)."""
    return df.select("partition_key", "sequence_number",
                     F.col("headers").getItem("region").cast("string").alias("data"))


def header_value_reference(records: list[Record]) -> list[dict]:
    return [{"partition_key": r.partition_key, "sequence_number": r.sequence_number,
             "data": r.headers["region"].decode() if "region" in r.headers else None} for r in records]


def with_headers(df):
    """The input's headers and two more: the data's length and the input partition."""
    added = F.create_map(F.lit("len"), F.length("data").cast("string").cast("binary"),
                         F.lit("pid"), F.col("partition_id").cast("binary"))
    return df.select("partition_key", "data", F.map_concat(F.col("headers"), added).alias("headers"))


def with_headers_reference(records: list[Record]) -> list[dict]:
    return [{"partition_key": r.partition_key, "data": r.data,
             "headers": {**r.headers, "len": str(len(r.data)).encode(), "pid": r.partition_id.encode()}}
            for r in records]


OPERATIONS = {
    "upper": (upper, upper_reference),
    "count_per_key": (count_per_key, count_per_key_reference),
    "count_per_partition_and_key": (count_per_partition_and_key, count_per_partition_and_key_reference),
    "header_value": (header_value, header_value_reference),
    "with_headers": (with_headers, with_headers_reference),
}


def canonical(rows: list[dict]) -> list[str]:
    """Rows as a sorted list (a multiset): each row's columns by name, a map column as its
    sorted items, binary as bytes."""
    def value(v):
        if isinstance(v, dict):
            return tuple(sorted((k, value(x)) for k, x in v.items()))
        if isinstance(v, (bytearray, memoryview)):
            return bytes(v)
        return v
    return sorted(repr(tuple(sorted((k, value(v)) for k, v in row.items()))) for row in rows)


# --- tests --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(OPERATIONS))
def test_one_job_over_many_batches_gives_each_batch_what_it_gets_alone(engine, batches, name):
    operation, reference = OPERATIONS[name]
    alone = {key: canonical(engine.apply(operation, batch.records())) for key, (batch, _want) in batches.items()}
    for key, (_batch, want) in batches.items():
        assert alone[key] == canonical(reference(want)), f"{name}: apply on {key} differs from plain Python"
    for n in (1, 2, 4):
        chosen = {key: batches[key][0] for key in list(batches)[:n]}
        together = engine.apply_batches(operation, chosen)
        assert set(together) == set(chosen), f"{name}: apply_batches over {n} answered for {sorted(together)}"
        for key in chosen:
            got = canonical(together[key])
            assert got == alone[key], (
                f"{name}: {key} in a micro-batch of {n}: {len(got)} rows, alone {len(alone[key])}; only together: "
                f"{sorted(set(got) - set(alone[key]))[:3]}, only alone: {sorted(set(alone[key]) - set(got))[:3]}")


def test_an_operation_keeping_partition_id_runs_once_per_micro_batch_and_others_by_branches(engine, batches):
    """Which way each operation ran, as the engine learnt it on its first micro-batch."""
    chosen = {key: batch for key, (batch, _want) in batches.items()}
    for operation, keeps in ((upper, True), (count_per_partition_and_key, True), (count_per_key, False),
                             (with_headers, False)):
        engine.apply_batches(operation, chosen)
        assert engine._keeps_partition.get(operation) is keeps, operation.__name__


def pretends_to_keep_partition_id(df):
    """A `partition_id` column that is not the input's: the engine must not trust it."""
    return df.select("partition_key", "data", F.lit("p9999").alias("partition_id"))


def test_a_result_partition_id_that_is_not_the_input_one_falls_back_to_branches(engine, batches):
    chosen = {key: batch for key, (batch, _want) in batches.items()}
    for _ in range(2):               # (the first micro-batch finds it out; the next goes by branches at once)
        together = engine.apply_batches(pretends_to_keep_partition_id, chosen)
        assert engine._keeps_partition[pretends_to_keep_partition_id] is False
        for key, (_batch, want) in batches.items():
            assert sorted((row["partition_key"], row["data"]) for row in together[key]) == \
                   sorted((r.partition_key, r.data) for r in want), key


def test_two_input_streams_sharing_a_partition_id_go_by_branches(engine, batches):
    """A stage with two input streams may hold both streams' partition 0 in one micro-batch:
    partition_id cannot tell their rows apart, so each runs on its own DataFrame."""
    (key, (batch, want)), = list(batches.items())[:1]
    other = InputBatch("other", batch.ordinal, batch.pages)
    together = engine.apply_batches(upper, {"in:0": batch, "other:0": other})
    for k in ("in:0", "other:0"):
        assert sorted(int(row["sequence_number"]) for row in together[k]) == [r.sn for r in want], k


def test_every_row_comes_back_to_its_own_partition(engine, batches):
    """Each output row of the projection carries its input's partition id and SN, and
    lands under that partition."""
    together = engine.apply_batches(upper, {key: batch for key, (batch, _want) in batches.items()})
    for key, (_batch, want) in batches.items():
        assert {row["partition_id"] for row in together[key]} == {partition_id(want[0].partition_ordinal)}
        assert sorted(int(row["sequence_number"]) for row in together[key]) == [r.sn for r in want]


def refuses_made_up_input(df):
    """Fails (in the JVM, when the job runs) on data that looks like the warm-up's."""
    made_up = F.col("data").cast("string").startswith('{"warm_up"')
    return df.select("partition_key", "data", F.assert_true(~made_up, "made-up input").alias("checked"))


def test_warm_up_ignores_an_operation_that_fails_on_made_up_input(engine, batches):
    made_up = [Record("k", b'{"warm_up": 1}', seqno.make(TS_MS, 1, 0), 0)]
    with pytest.raises(Exception, match="made-up input"):
        engine.apply(refuses_made_up_input, made_up)
    assert engine.warm_up(refuses_made_up_input) is None
    # and the engine still runs it on real batches afterwards
    chosen = {key: batch for key, (batch, _want) in list(batches.items())[:2]}
    together = engine.apply_batches(refuses_made_up_input, chosen)
    for key in chosen:
        want = batches[key][1]
        assert sorted((row["partition_key"], row["data"]) for row in together[key]) == \
               sorted((r.partition_key, r.data) for r in want)


LIFECYCLE = """
import json
from sms import seqno
from sms.types import Record
from sps.engine import InputBatch
from spark_sps.engine import SparkEngine

engine = SparkEngine("local[1]", "sms-spark-engine-lifecycle")
engine.start()
engine.close()
outcome = {}
for call, run in (("apply", lambda: engine.apply(lambda df: df, [Record("k", b"v", seqno.make(1, 1, 0), 0)])),
                  ("apply_batches", lambda: engine.apply_batches(lambda df: df, {"p0000": InputBatch("in", 0)})),
                  ("start", engine.start)):
    try:
        run()
        outcome[call] = "returned"
    except Exception as e:
        outcome[call] = f"{type(e).__name__}: {e}"
engine.close()
outcome["second close"] = "returned"
print(json.dumps(outcome))
"""


def test_a_closed_engine_refuses_work_with_a_clear_error():
    proc = subprocess.run([sys.executable, "-c", LIFECYCLE], cwd=ROOT, capture_output=True, text=True,
                          timeout=LIFECYCLE_S)
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    for call in ("apply", "apply_batches", "start"):
        assert outcome[call].startswith("RuntimeError: ") and "closed" in outcome[call], outcome
    assert outcome["second close"] == "returned"


def test_the_engine_benchmark_runs_and_reports_every_figure():
    """bench/sps_engine.py --smoke (its figures are never asserted: only that it runs and
    reports each one)."""
    proc = subprocess.run([sys.executable, "-m", "bench.sps_engine", "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=LIFECYCLE_S * 3)
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout)
    def reported(figures: dict) -> bool:
        # (CPU is counted in clock ticks: a tiny smoke run may show none)
        return figures["wall_ms_per_micro_batch"] > 0 and figures["records_per_s"] > 0 \
            and figures["jvm_cpu_us_per_record"] >= 0
    assert reported(out["limit"]), out["limit"]
    assert sorted(out["results"]) == sorted(f"{op}/{n}" for op in ("parse", "clicks_per_minute") for n in (1, 2, 4))
    for name, result in out["results"].items():
        for way in ("micro_batch", "by_branches", "job_per_partition"):
            assert reported(result[way]), (name, way, result)
