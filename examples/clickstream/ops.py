"""The two operations of the clickstream example (DataFrame -> DataFrame, on Spark).

Input rows have partition_key, data (binary), sequence_number, arrival_time, partition_id.
A click's data is JSON {"user": ..., "url": ..., "ts": ms}. Each result row has the
output key column (`user`) and `data`.
"""

from pyspark.sql import functions as F

CLICK = "user STRING, url STRING, ts LONG"


def parse(df):
    """Raw clicks -> one record per valid click, keyed by user (malformed ones are dropped)."""
    c = df.select(F.from_json(F.col("data").cast("string"), CLICK).alias("c")).where(F.col("c.user").isNotNull())
    return c.select(F.col("c.user").alias("user"),
                    F.to_json(F.struct(F.col("c.user").alias("user"), F.col("c.url").alias("url"),
                                       F.col("c.ts").alias("ts"))).alias("data"))


def count_per_minute(df):
    """Clicks per (user, minute) in this batch: partial counts; a reader sums them."""
    c = df.select(F.from_json(F.col("data").cast("string"), CLICK).alias("c"))
    per = c.select(F.col("c.user").alias("user"), F.floor(F.col("c.ts") / 60000).cast("long").alias("minute"))
    counts = per.groupBy("user", "minute").count()
    return counts.select("user", F.to_json(F.struct("user", "minute", "count")).alias("data"))
