"""Riding out a broker that is briefly away (restart, leader move, coordinator load).

A restarting broker refuses connections and answers "coordinator not available"
for a while; a stream that ended its run for that would turn every rolling restart
into an outage. Such errors are retried with logged, bounded backoff
(``unavailable.retry.s``); a wrong host name or wrong credentials are not transient
and fail at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from txsink.errors import TxsinkError

from txsink_kafka.txn_protocol import ConnectionDroppedError, TxnProtocolError

log = logging.getLogger(__name__)
#: Marks a log record as one retry of a server that is away (see txsink.console).
RETRY_RECORD = {"txsink_retry": True}

T = TypeVar("T")


class BrokerReadTimeout(TxsinkError):
    """Reading a partition did not finish in time (the broker stopped answering)."""


def _kafka_error(exc: BaseException) -> object | None:
    args = getattr(exc, "args", ())
    return args[0] if args else None


def is_transient(exc: BaseException) -> bool:
    """Could the same request succeed once the broker is back?"""
    if isinstance(exc, ConnectionDroppedError):
        return False  # Tansu's way of refusing: retrying changes nothing
    if isinstance(exc, TxnProtocolError):
        return exc.retriable
    if isinstance(exc, BrokerReadTimeout):
        return True
    try:
        from confluent_kafka import KafkaError, KafkaException
    except ImportError:  # pragma: no cover - confluent-kafka is a dependency
        return False
    if not isinstance(exc, KafkaException):
        return False
    err = _kafka_error(exc)
    if not isinstance(err, KafkaError):
        return False
    if err.fatal() or err.code() in (KafkaError._RESOLVE, KafkaError._AUTHENTICATION,
                                     KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        return False
    return bool(err.retriable()) or err.code() in (
        KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._UNKNOWN_PARTITION)


def retry_transient(action: Callable[[], T], *, what: str, bound_s: float,
                    redact: Callable[[str], str] = str,
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """``action()``, retried on transient errors for up to ``bound_s`` seconds.

    Each retry is logged as a warning naming ``what`` (sink, epoch, participant);
    after the bound the last error is raised as it was.
    """
    deadline = time.monotonic() + bound_s
    delay = 0.5
    attempt = 0
    while True:
        attempt += 1
        try:
            return action()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s: Kafka unavailable (attempt %d, %s: %s); retrying in %.1fs, "
                        "for up to %.0fs in all (unavailable.retry.s)", what, attempt,
                        type(exc).__name__, redact(str(exc)), delay, bound_s,
                        extra=RETRY_RECORD)
            sleep(delay)
            delay = min(delay * 2, 5.0)
