"""PySpark integration: stages run on Spark DataFrames; Structured Streaming source and sink."""
