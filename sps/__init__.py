"""SPS: stream processing by peer workers (lease table, stages, graphs, output without duplicates)."""
