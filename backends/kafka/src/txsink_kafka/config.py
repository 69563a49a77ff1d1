"""Options of the Kafka sink, parsed and checked before anything touches a broker.

Names follow Spark's own Kafka sink: ``topic`` plus producer settings prefixed with
``kafka.`` (handed to librdkafka without the prefix). txsink's own settings have no
prefix.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txsink.errors import ConfigError
from txsink.options import Options

log = logging.getLogger(__name__)

OWNER = "kafka sink"

#: librdkafka settings that hold secrets (with the ``kafka.`` prefix). Listed for the
#: pipeline file's printing; :func:`is_secret_key` also catches ones not listed here.
SECRET_OPTIONS = frozenset({
    "kafka.sasl.password",
    "kafka.ssl.key.password",
    "kafka.ssl.keystore.password",
    "kafka.ssl.key.pem",
    "kafka.sasl.oauthbearer.client.secret",
    "kafka.sasl.oauthbearer.config",
    "kafka.sasl.oauthbearer.extensions",
    "kafka.sasl.oauthbearer.assertion.private.key.passphrase",
    "kafka.sasl.oauthbearer.assertion.private.key.pem",
    "kafka.sasl.oauthbearer.client.credentials.client.secret",
    "kafka.sasl.jaas.config",
})

_SECRET_WORDS = ("password", "passphrase", "secret", "token", "jaas",
                 "private.key", "key.pem", "oauthbearer.config", "oauthbearer.extensions")


def is_secret_key(key: str) -> bool:
    """Does option ``key`` (``kafka.``-prefixed or not) hold a secret?

    By name, so settings librdkafka adds later (``...passphrase``, ``...secret``)
    are never stored or printed either; paths and URLs are not secrets.
    """
    key = key.lower()
    if key.endswith((".location", ".file", ".url")):
        return False
    return key in SECRET_OPTIONS or f"kafka.{key}" in SECRET_OPTIONS or any(
        word in key for word in _SECRET_WORDS)


#: Producer settings txsink owns: a user value would break exactly-once.
_RESERVED = {
    "transactional.id": "txsink derives one transactional.id per participant from the "
                        "sink id; set 'transactional.id.prefix' to change its prefix",
    "enable.idempotence": "transactional producers are always idempotent",
    "isolation.level": "isolation.level is a consumer setting; the sink always writes "
                       "transactionally",
    "logger": "txsink installs its own librdkafka logger",
    "debug": "txsink sets librdkafka's debug contexts itself (it reads the 'eos' context)",
    "acks": "transactional producers always use acks=all",
}

DEFAULT_TRANSACTION_TIMEOUT_MS = 600_000
NAMINGS = ("pooled", "participant")
#: Longest transactional.id prefix accepted (ids are prefix + sink id + epoch/partition).
MAX_TRANSACTIONAL_ID_PREFIX = 100
#: Apache Kafka's default transaction.max.timeout.ms (brokers reject larger values).
KAFKA_DEFAULT_MAX_TIMEOUT_MS = 900_000


@dataclass(frozen=True)
class KafkaSinkConfig:
    """Everything the sink needs, with the librdkafka settings split out."""

    #: librdkafka settings, secrets included: kept out of repr().
    producer: dict[str, str] = field(repr=False)
    topic: str | None = None
    transactional_id_prefix: str = "txsink"
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    trigger_interval_ms: int | None = None
    recovery_margin_ms: int = 60_000
    marker_topic: str = "txsink-markers"
    claim_topic: str = "txsink-claims"
    marker_replication: int = -1
    orphan_scan_records: int = 20_000
    request_timeout_s: float = 30.0
    #: How long to ride out an unavailable broker; ``None``: twice request.timeout.s.
    unavailable_retry_s: float | None = None
    #: Claim the sink id even if another state owns it (after that query is gone).
    takeover: bool = False
    #: ``pooled``: reuse a bounded set of transactional ids per write partition;
    #: ``participant``: a fresh id per participant (epoch, partition, attempt).
    naming: str = "pooled"
    #: Pooled ids per write partition; all of them open at once is an error.
    pool_size: int = 16
    #: Add a ``txsink-epoch`` header (the epoch, in decimal) to every record, so
    #: readers can stop at a group's consistent cut (``epoch.header``; on for targets).
    epoch_header: bool = False
    #: exactly_once with pooled ids: each writer process initialises the producer of its
    #: next participant between tasks (``producer.init.ahead``), off the task's path.
    warm_ahead: bool = True
    secrets: tuple[str, ...] = field(default=(), repr=False)

    @property
    def retry_bound_s(self) -> float:
        if self.unavailable_retry_s is not None:
            return self.unavailable_retry_s
        return 2 * self.request_timeout_s

    @property
    def bootstrap(self) -> str:
        return self.producer["bootstrap.servers"]

    def connection(self) -> dict[str, str]:
        """librdkafka settings for connections only (admin, consumers, probes)."""
        keep = ("bootstrap.servers", "client.id", "security.", "sasl.", "ssl.",
                "socket.", "broker.address.family", "reconnect.")
        return {k: v for k, v in self.producer.items() if k.startswith(keep)}


class LibrdkafkaLog:
    """Takes librdkafka's own log (client setting ``logger``) into Python logging at DEBUG.

    Left alone, librdkafka writes every failed connection attempt to stderr (hundreds
    of lines while a broker is down); txsink reports the failure itself in one line.
    ``-vv`` shows these lines under the logger ``txsink_kafka.librdkafka``.
    """

    _log = logging.getLogger("txsink_kafka.librdkafka")

    def log(self, level: int, msg: str, *args: object) -> None:
        self._log.debug(msg, *args)


def with_librdkafka_log(conf: Mapping[str, Any]) -> dict[str, Any]:
    """``conf`` plus the setting that routes librdkafka's log through :class:`LibrdkafkaLog`."""
    return {**conf, "logger": LibrdkafkaLog()}


def parse(options: Mapping[str, str]) -> KafkaSinkConfig:
    secret_keys = SECRET_OPTIONS | {k for k in options if k.startswith("kafka.")
                                    and is_secret_key(k)}
    opts = Options(options, owner=OWNER, secret_keys=secret_keys)
    producer = opts.with_prefix("kafka.")
    secrets = tuple(v for k, v in producer.items() if is_secret_key(k) and v)
    if not producer.get("bootstrap.servers"):
        # Every kafka.* key is librdkafka's, so a misspelt one is no unknown option.
        close = difflib.get_close_matches("bootstrap.servers", list(producer), n=1)
        hint = (f" ('kafka.{close[0]}' is given: did you mean 'kafka.bootstrap.servers'?)"
                if close else "")
        raise ConfigError(f"{OWNER}: option 'kafka.bootstrap.servers' is required, e.g. "
                          f"'localhost:9092'{hint}", field="kafka.bootstrap.servers")
    for key, why in _RESERVED.items():
        if key in producer:
            raise ConfigError(f"{OWNER}: option 'kafka.{key}' cannot be set: {why}",
                              field=f"kafka.{key}")
    timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS
    if "transaction.timeout.ms" in producer:
        timeout_ms = _int(producer.pop("transaction.timeout.ms"), "kafka.transaction.timeout.ms")
        if timeout_ms < 1000:
            raise ConfigError(f"{OWNER}: option 'kafka.transaction.timeout.ms' must be at "
                              f"least 1000, got {timeout_ms}",
                              field="kafka.transaction.timeout.ms")
    topic = opts.optional("topic")
    prefix = opts.str("transactional.id.prefix", "txsink")
    if not prefix.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"{OWNER}: option 'transactional.id.prefix' {prefix!r} may only "
                          "hold letters, digits, '.', '_' and '-'",
                          field="transactional.id.prefix")
    if len(prefix) > MAX_TRANSACTIONAL_ID_PREFIX:
        raise ConfigError(f"{OWNER}: option 'transactional.id.prefix' is {len(prefix)} "
                          f"characters; use at most {MAX_TRANSACTIONAL_ID_PREFIX} (it starts "
                          "every transactional.id and marker key of the sink)",
                          field="transactional.id.prefix")
    naming = opts.str("transactional.id.naming", "pooled").lower()
    if naming not in NAMINGS:
        raise ConfigError(f"{OWNER}: option 'transactional.id.naming' is {naming!r}; use "
                          "'pooled' (a bounded set of ids reused across epochs, the default) "
                          "or 'participant' (a new id per epoch, partition and attempt)",
                          field="transactional.id.naming")
    trigger = opts.optional("trigger.interval.ms")
    trigger_ms = None if trigger is None else opts.int("trigger.interval.ms", 0, minimum=0)
    margin_ms = opts.int("recovery.margin.ms", 60_000, minimum=0)
    config = KafkaSinkConfig(
        producer=producer,
        topic=topic,
        transactional_id_prefix=prefix,
        transaction_timeout_ms=timeout_ms,
        trigger_interval_ms=trigger_ms,
        recovery_margin_ms=margin_ms,
        marker_topic=opts.str("marker.topic", "txsink-markers"),
        claim_topic=opts.str("claim.topic", "txsink-claims"),
        marker_replication=opts.int("marker.replication.factor", -1, minimum=-1),
        orphan_scan_records=opts.int("orphan.scan.records", 20_000, minimum=1),
        request_timeout_s=opts.float("request.timeout.s", 30.0, minimum=0.1),
        unavailable_retry_s=(None if opts.optional("unavailable.retry.s") is None
                             else opts.float("unavailable.retry.s", 0.0, minimum=0.0)),
        takeover=opts.bool("owner.takeover", False),
        naming=naming,
        pool_size=opts.int("transactional.id.pool.size", 16, minimum=1),
        epoch_header=opts.bool("epoch.header", False),
        warm_ahead=opts.bool("producer.init.ahead", True),
        secrets=secrets,
    )
    opts.ignore("sink_id", "checkpoint", "checkpointLocation", "path")
    opts.check_unknown()
    check_timeout(config)
    return config


def _int(value: str, name: str) -> int:
    try:
        return int(value.replace("_", ""))
    except ValueError:
        raise ConfigError(f"{OWNER}: option '{name}' must be an integer, got {value!r}",
                          field=name) from None


def check_timeout(config: KafkaSinkConfig) -> None:
    """A prepared transaction must outlive a trigger interval plus a recovery.

    The broker aborts a transaction after ``transaction.timeout.ms``; txsink
    prepares at the end of a micro-batch and commits when the driver decides,
    normally right after, but after a driver crash only when the query restarts.
    """
    trigger = config.trigger_interval_ms
    timeout = config.transaction_timeout_ms
    if trigger is None:
        return
    if timeout <= trigger:
        raise ConfigError(
            f"{OWNER}: 'kafka.transaction.timeout.ms' ({timeout} ms) must be larger than "
            f"the trigger interval ({trigger} ms), or the broker aborts every prepared "
            f"transaction before the driver commits it; raise it to at least "
            f"{trigger + config.recovery_margin_ms} ms (trigger + recovery.margin.ms) and "
            f"at most the broker's transaction.max.timeout.ms "
            f"(Kafka's default {KAFKA_DEFAULT_MAX_TIMEOUT_MS} ms)",
            field="kafka.transaction.timeout.ms")
    if timeout < trigger + config.recovery_margin_ms:
        log.warning(
            "kafka sink: kafka.transaction.timeout.ms=%d ms leaves only %d ms after the "
            "trigger interval (%d ms) for the driver to commit; a restart that takes "
            "longer than that loses prepared epochs to the broker's timeout "
            "(recovery.margin.ms=%d)", timeout, timeout - trigger, trigger,
            config.recovery_margin_ms)
