"""Channels: streams delivered into Parquet files or Iceberg tables (docs/channels.md)."""
