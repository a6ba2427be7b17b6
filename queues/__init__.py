"""Queues on a stream: per-record delivery with acknowledgements (docs/queues.md)."""
