"""Checks of a pipeline file's ``sink`` when its trigger is ``real_time``.

Checked against the backend's real-time target instead of its micro-batch options
(no prepared transactions, a progress store): one target, exactly once, and
``commit_interval`` as the one txsink option besides the backend's. Parsing stays in
:mod:`txsink.config`; this module only judges (it imports nothing of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txsink.errors import ConfigError
from txsink.model import DeliveryGuarantee

#: The sink option that sets how often a writer commits (a duration).
COMMIT_INTERVAL = "commit_interval"


def check_realtime_sink(data: Mapping[str, Any], guarantee: DeliveryGuarantee) -> None:
    """What real-time mode refuses in the ``sink`` section itself."""
    if "targets" in data:
        raise ConfigError("sink.targets: real-time mode writes to one target; use one "
                          "backend, or micro-batches for a group of targets",
                          field="sink.targets")
    if guarantee is not DeliveryGuarantee.EXACTLY_ONCE:
        raise ConfigError("sink.guarantee: real-time mode is exactly once only; remove "
                          "sink.guarantee (Spark's own Kafka sink is the at-least-once one)",
                          field="sink.guarantee")


def check_realtime_target(backend_cls: type[Any], backend: str, sink_id: str,
                          options: Mapping[str, str]) -> None:
    """Build (and drop) the backend's real-time target from ``options``: its errors,
    named ``sink.options.<field>``, come before anything runs."""
    factory = getattr(backend_cls, "realtime_target", None)
    if factory is None:
        raise ConfigError(f"sink.backend: {backend!r} has no real-time target (kafka and "
                          "postgres have one); use micro-batches for it",
                          field="sink.backend")
    try:
        factory(sink_id, {k: v for k, v in options.items() if k != COMMIT_INTERVAL})
    except ConfigError as exc:
        inner = exc.field or ""
        where = f"sink.options.{inner}" if inner else "sink.options"
        raise ConfigError(f"{where}: {exc}", field=where) from None
