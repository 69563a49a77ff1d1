"""Apache Iceberg backend for txsink."""
