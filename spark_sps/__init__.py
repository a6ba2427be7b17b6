"""PySpark integration (a later issue)."""
