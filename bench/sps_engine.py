"""What a Spark stage's micro-batch costs: wall time and the JVM's CPU per record.

    .venv/bin/python -m bench.sps_engine [--smoke] [--records N] [--rounds R]

Runs the clickstream example's two operations (`parse`: JSON in and out, row by row;
`clicks_per_minute`: a group-by) on made-up clicks, through `spark_sps.engine.SparkEngine`
on one local[2] session, and prints one JSON document:

- `limit`: the same micro-batch through Spark and back with no operation (Arrow in,
  `toArrow` out): what moving the records costs, whatever the operation;
- for each operation and number of input partitions (1, 2, 4), N records split over them:
  - `micro_batch`: one job for every partition, as a worker runs it (both operations keep
    `partition_id`, so it is one DataFrame of the whole micro-batch);
  - `by_branches`: one job for every partition, a DataFrame per partition put together
    by a union (how an operation that does not keep `partition_id` runs);
  - `job_per_partition`: one job per partition (what workers did before micro-batches).

Each figure is after a warm-up (the worker's own `warm_up`), over R rounds: wall ms per
micro-batch, and JVM CPU (user + system, from /proc, of the Spark driver: this process's
child) in microseconds per record. The JVM's options are the engine's
(`SPARK_JAVA_OPTIONS`, overridden by $SPS_SPARK_JAVA_OPTIONS); run it with both to compare.
Never a test; a timing is never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.cpu import cpu_seconds  # noqa: E402


def jvm_cpu_s() -> float:
    """CPU seconds used so far by this process's children (the Spark driver JVM)."""
    me = os.getpid()
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                text = f.read()
        except OSError:
            continue
        if int(text[text.rindex(b")") + 2:].split()[1]) == me:      # (the parent's pid: field 1 after ")")
            children.append(int(pid))
    return sum(cpu_seconds(pid) or 0.0 for pid in children)


def clicks(n: int, seed: int):
    """n made-up clicks as a micro-batch table (sms.batch.ARROW_COLUMNS, in chunks of 500
    as stored batches come)."""
    import pyarrow as pa

    from spark_sps.engine import input_table
    rng = random.Random(seed)
    users = [f"user-{rng.randrange(200)}" for _ in range(n)]
    data = [json.dumps({"user": u, "url": f"/page/{rng.randrange(50)}", "ts": 1_700_000_000_000 + 3 * i}).encode()
            for i, u in enumerate(users)]
    table = input_table(users, data, [str(i) for i in range(n)], range(n), ["p0000"] * n, [[]] * n)
    return pa.Table.from_batches(table.to_batches(max_chunksize=500))


def measure(run, records: int, rounds: int) -> dict:
    run()
    t0, c0 = time.perf_counter(), jvm_cpu_s()
    for _ in range(rounds):
        run()
    wall, cpu = time.perf_counter() - t0, jvm_cpu_s() - c0
    return {"wall_ms_per_micro_batch": round(wall / rounds * 1000, 1),
            "jvm_cpu_us_per_record": round(cpu / rounds / records * 1e6, 1),
            "records_per_s": round(records * rounds / wall)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny: only checks that it runs")
    ap.add_argument("--records", type=int, default=16_000, help="records per micro-batch")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    records, rounds = (2_000, 2) if args.smoke else (args.records, args.rounds)

    import pyarrow as pa

    from examples.clickstream import ops
    from sms.types import partition_id
    from spark_sps.engine import SPARK_JAVA_OPTIONS, SparkEngine
    engine = SparkEngine("local[2]")
    engine.start()
    table = clicks(records, 7)
    out: dict = {"records_per_micro_batch": records, "rounds": rounds,
                 "java_options": os.environ.get("SPS_SPARK_JAVA_OPTIONS", SPARK_JAVA_OPTIONS), "results": {}}
    try:
        for op in (ops.parse, ops.clicks_per_minute):
            engine.warm_up(op)
        out["limit"] = measure(lambda: engine.spark.createDataFrame(table).toArrow(), records, rounds)
        for op in (ops.parse, ops.clicks_per_minute):
            for parts in (1, 2, 4):
                step = records // parts
                ids = [partition_id(i) for i in range(parts)]
                tables = [table.slice(i * step, step).set_column(
                    table.schema.get_field_index("partition_id"), "partition_id", pa.array([ids[i]] * step))
                    for i in range(parts)]
                n = step * parts
                out["results"][f"{op.__name__}/{parts}"] = {
                    "micro_batch": measure(lambda: engine._apply_tables(op, tables, ids), n, rounds),
                    "by_branches": measure(lambda: engine._apply_tables(op, tables), n, rounds),
                    "job_per_partition": measure(lambda: [engine._apply_tables(op, [t]) for t in tables], n, rounds)}
                print(f"{op.__name__} over {parts} partition(s): {out['results'][f'{op.__name__}/{parts}']}",
                      file=sys.stderr, flush=True)
    finally:
        engine.close()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
