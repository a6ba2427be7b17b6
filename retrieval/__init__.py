"""Retrieval: iterators and reads from any replica up to the commit watermark."""
