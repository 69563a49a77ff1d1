"""Entry point of the ``txsink`` group: registers the Kafka backend like any third party."""

from __future__ import annotations

from txsink.hookspecs import hookimpl
from txsink.registry import BackendRegistry


@hookimpl
def txsink_register_backends(registry: BackendRegistry) -> None:
    from txsink_kafka.backend import KafkaBackend

    registry.add(KafkaBackend)
