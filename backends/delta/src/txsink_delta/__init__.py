"""Delta Lake backend for txsink."""
