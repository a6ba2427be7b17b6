"""The two operations of the clickstream example (DataFrame -> DataFrame, on Spark).

Input rows have partition_key, data (binary), sequence_number, arrival_time, partition_id.
A click's data is JSON {"user": ..., "url": ..., "ts": ms}. `parse`'s result rows have
the output key column (`user`) and `data`; `clicks_per_minute`'s have the state's key,
event time and the column it sums (graph.yaml).
"""

from pyspark.sql import functions as F

CLICK = "user STRING, url STRING, ts LONG"


def parse(df):
    """Raw clicks -> one record per valid click, keyed by user (malformed ones are dropped)."""
    c = df.select(F.from_json(F.col("data").cast("string"), CLICK).alias("c")).where(F.col("c.user").isNotNull())
    return c.select(F.col("c.user").alias("user"),
                    F.to_json(F.struct(F.col("c.user").alias("user"), F.col("c.url").alias("url"),
                                       F.col("c.ts").alias("ts"))).alias("data"))


def clicks_per_minute(df):
    """Clicks per (user, minute) in this batch: partial counts, with the minute's start as
    the event time `ts`. The stage's keyed state (graph.yaml `state:`) sums them into each
    (user, minute) window's running total."""
    c = df.select(F.from_json(F.col("data").cast("string"), CLICK).alias("c"))
    per = c.select(F.col("c.user").alias("user"), (F.floor(F.col("c.ts") / 60000) * 60000).cast("long").alias("ts"))
    return per.groupBy("user", "ts").count()
