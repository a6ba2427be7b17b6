"""The two operations of the clickstream example (DataFrame -> DataFrame, on Spark).

Input rows have partition_key, data (binary), sequence_number, arrival_time, partition_id.
A click's data is JSON {"user": ..., "url": ..., "ts": ms}. `parse`'s result rows have
the output key column (`user`) and `data`; `clicks_per_minute`'s have the state's key,
event time and the column it sums (graph.yaml). Both keep `partition_id`, each row's input
partition, so Spark runs each on a whole micro-batch at once (spark_sps/engine.py).
"""

from pyspark.sql import functions as F

CLICK = "user STRING, url STRING, ts LONG"


def parse(df):
    """Raw clicks -> one record per valid click (its JSON as it came), keyed by user;
    malformed ones are dropped."""
    c = df.select("partition_id", "data", F.from_json(F.col("data").cast("string"), CLICK).alias("c")
                  ).where(F.col("c.user").isNotNull() & F.col("c.ts").isNotNull())
    return c.select("partition_id", F.col("c.user").alias("user"), "data")


def clicks_per_minute(df):
    """Clicks per (user, minute) in this batch: partial counts, with the minute's start as
    the event time `ts`. The stage's keyed state (graph.yaml `state:`) sums them into each
    (user, minute) window's running total."""
    c = df.select("partition_id", F.from_json(F.col("data").cast("string"), CLICK).alias("c"))
    per = c.select("partition_id", F.col("c.user").alias("user"),
                   (F.floor(F.col("c.ts") / 60000) * 60000).cast("long").alias("ts"))
    return per.groupBy("partition_id", "user", "ts").count()
