"""txsink's Kafka backend: transactional producers finished by the driver with EndTxn."""
