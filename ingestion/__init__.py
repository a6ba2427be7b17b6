"""Ingestion: PutRecords routing, per-partition batching into chain heads, acks."""
