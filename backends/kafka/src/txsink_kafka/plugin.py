"""Entry point of the ``txsink`` group: registers the Kafka backend and its Spark source
(``txsink-kafka``) like any third party."""

from __future__ import annotations

from typing import Any

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry, SourceRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    from txsink_kafka.backend import KafkaBackend

    registry.add(KafkaBackend)


@hookimpl
def txsink_register_sources(registry: SourceRegistry) -> None:
    registry.add("txsink-kafka", _register_kafka_source)


def _register_kafka_source(spark: Any) -> None:
    """``format("txsink-kafka")`` in ``spark`` (PySpark is imported only now)."""
    from txsink_kafka.source import register_source

    register_source(spark)
