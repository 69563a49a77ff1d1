"""txsink: exactly-once output from PySpark pipelines."""
