"""Admin work of the Kafka backend: preflight checks, txsink's own topics, sink claims.

Before any task writes, the driver reaches the brokers, checks the output topic,
creates the compacted marker and claim topics, and registers a probe producer so a
``transaction.timeout.ms`` above the broker's limit is refused at once. The claim
topic binds a sink id to one query's txsink state (see :mod:`txsink_kafka.claims`).
"""

from __future__ import annotations

import difflib
import logging
import re
import time
from typing import Any

from txsink.errors import ConfigError, ServerUnavailableError, SinkOwnedError, TxsinkError

from txsink_kafka import config as cfg
from txsink_kafka.claims import Claim, owner_key, owner_of
from txsink_kafka.clients import SinkClients, check_hosts, read_range, watermarks
from txsink_kafka.markers import Marker
from txsink_kafka.naming import preflight_id
from txsink_kafka.recovery import KafkaRecovery
from txsink_kafka.retry import BrokerReadTimeout, is_transient, retry_transient
from txsink_kafka.txn_protocol import TxnProtocolError

log = logging.getLogger(__name__)


#: librdkafka settings a sink's users set most, for "did you mean" (librdkafka itself
#: only says "No such configuration property").
_COMMON_SETTINGS = (
    "transaction.timeout.ms", "bootstrap.servers", "client.id", "security.protocol",
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
    "sasl.oauthbearer.config", "sasl.kerberos.service.name", "ssl.ca.location",
    "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
    "linger.ms", "batch.size", "batch.num.messages", "compression.type",
    "compression.codec", "message.max.bytes", "message.timeout.ms", "request.timeout.ms",
    "socket.timeout.ms", "retry.backoff.ms", "reconnect.backoff.ms",
    "queue.buffering.max.kbytes", "queue.buffering.max.messages",
)


class KafkaAdmin:
    """Preflight, topics and claims."""

    def __init__(self, shared: SinkClients, recovery: KafkaRecovery) -> None:
        self.shared = shared
        self.config = shared.config
        self.recovery = recovery

    def check_settings(self, sink_id: str) -> None:
        """librdkafka checks every ``kafka.*`` setting as a writer's producer gets it:
        a misspelt one (``kafka.sasl.pasword``) stopped `txsink run` with a traceback
        from the admin client, and one the admin client is not given
        (``kafka.trasaction.timeout.ms``) was first refused by the tasks, after Spark
        started. No ``bootstrap.servers``: the probe connects nowhere."""
        from confluent_kafka import KafkaException, Producer

        conf: dict[str, Any] = {k: v for k, v in self.config.producer.items()
                                if k != "bootstrap.servers"}
        conf.update({"transactional.id": "txsink-settings-check",
                     "transaction.timeout.ms": self.config.transaction_timeout_ms})
        try:
            Producer(cfg.with_librdkafka_log(conf))
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            said = str(error.str()) if error is not None and hasattr(error, "str") else str(exc)
            named = re.search(r'property:? "([^"]+)"', said)
            key = f"kafka.{named.group(1)}" if named else "kafka"
            close = difflib.get_close_matches(key[len("kafka."):], _COMMON_SETTINGS, n=1)
            hint = f" (did you mean 'kafka.{close[0]}'?)" if close and named else ""
            raise ConfigError(f"kafka sink: option '{key}': librdkafka refuses it: "
                              f"{self.shared.redact(said)}{hint}", field=key,
                              sink_id=sink_id) from None

    def preflight(self, sink_id: str) -> None:
        """Reach the brokers, check the topic, create the marker topic, check the timeout."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import KafkaError, KafkaException

        timeout = self.config.request_timeout_s
        check_hosts(self.config.bootstrap, sink_id)
        self.check_settings(sink_id)
        errors: list[KafkaError] = []
        conf: dict[str, Any] = {**self.config.connection(), "socket.timeout.ms": 10_000,
                                "error_cb": errors.append}
        admin = kadmin.AdminClient(cfg.with_librdkafka_log(conf))

        bound = self.config.retry_bound_s
        deadline = time.monotonic() + bound

        def metadata_or_auth_error() -> Any:
            # Each attempt ends by the deadline: the error says "retried for N s", and a
            # 15-second attempt made a 3-second bound take 16 s.
            left = max(0.5, deadline - time.monotonic())
            try:
                return admin.list_topics(timeout=min(timeout, 15.0, left))
            except KafkaException:
                admin.poll(0.1)  # serves error_cb, where librdkafka says why
                auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
                if auth:
                    raise ConfigError(
                        f"kafka sink: Kafka at {self.config.bootstrap!r} refused the login: "
                        f"{self.shared.redact(auth[0].str())}; check kafka.sasl.mechanism, "
                        "kafka.sasl.username and kafka.sasl.password (or the SSL/OAuth "
                        "settings)", field="kafka.sasl.password", sink_id=sink_id) from None
                raise

        try:
            metadata = retry_transient(metadata_or_auth_error,
                                       what=f"sink={sink_id}: preflight", bound_s=bound,
                                       redact=self.shared.redact)
        except KafkaException as exc:
            said = _library_words(exc)
            took = time.monotonic() - (deadline - bound)
            raise ServerUnavailableError(
                f"kafka sink: Kafka at {self.config.bootstrap!r} is down or unreachable "
                f"(option 'kafka.bootstrap.servers'): no answer in {took:.0f}s (retried for "
                f"up to {bound:g}s, unavailable.retry.s): {self.shared.redact(said)}",
                field="kafka.bootstrap.servers", sink_id=sink_id) from None
        topic = self.config.topic
        if topic is not None and (topic not in metadata.topics
                                  or metadata.topics[topic].error is not None):
            raise ConfigError(
                f"kafka sink: topic {topic!r} (option 'topic') does not exist on "
                f"{self.config.bootstrap}; create it first (txsink does not create output "
                "topics)", field="topic", sink_id=sink_id)
        for name, field_name in ((self.config.marker_topic, "marker.topic"),
                                 (self.config.claim_topic, "claim.topic")):
            if name not in metadata.topics:
                self.create_compacted(admin, name, field_name, sink_id)
            else:
                self.check_compacted(admin, name, field_name, sink_id)
        if topic is not None:
            self.check_replication(admin, topic, sink_id)
        # The broker rejects a transaction.timeout.ms above its transaction.max.timeout.ms
        # only when a producer registers: find out now, not in the first task.
        probe = preflight_id(self.config.transactional_id_prefix, sink_id)
        try:
            self.shared.driver().txn.init_producer_id(probe, self.config.transaction_timeout_ms)
        except TxnProtocolError as exc:
            if exc.error_code == 50:
                raise ConfigError(
                    f"kafka sink: kafka.transaction.timeout.ms="
                    f"{self.config.transaction_timeout_ms} is above the broker's "
                    "transaction.max.timeout.ms (Kafka's default is "
                    f"{cfg.KAFKA_DEFAULT_MAX_TIMEOUT_MS} ms); lower it or raise the broker's "
                    "limit", field="kafka.transaction.timeout.ms", sink_id=sink_id) from None
            raise ConfigError(f"kafka sink: cannot use transactions on "
                              f"{self.config.bootstrap}: {self.shared.redact(str(exc))}",
                              field="kafka.bootstrap.servers", sink_id=sink_id) from None

    def check_compacted(self, admin: Any, name: str, field_name: str, sink_id: str) -> None:
        """An existing marker or claim topic must be compacted: with ``delete``,
        retention removes markers of open participants and claims, and recovery could no
        longer find orphans nor the sink's owner. Refused, naming the fix."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import KafkaException

        config_resource: Any = kadmin.ConfigResource  # type: ignore[attr-defined]
        resource = config_resource(kadmin.ResourceType.TOPIC, name)  # type: ignore[attr-defined]
        try:
            entries = admin.describe_configs([resource])[resource].result(
                self.config.request_timeout_s)
        except KafkaException as exc:
            log.warning("sink=%s: cannot check cleanup.policy of topic %s (option '%s'): %s; "
                        "it must be compacted", sink_id, name, field_name,
                        self.shared.redact(str(exc)))
            return
        entry = entries.get("cleanup.policy")
        policy = str(entry.value) if entry is not None and entry.value is not None else ""
        if not compacted_only(policy):
            raise ConfigError(
                f"kafka sink: topic {name!r} (option '{field_name}') has "
                f"cleanup.policy={policy or '?'}: txsink keeps one record per transactional "
                "id and sink there, and retention would delete live ones (recovery could "
                "no longer find orphans or the sink's owner). Make it compacted only "
                f"({compaction_fix(name, self.config.bootstrap)}), or name another topic",
                field=field_name, sink_id=sink_id)

    def _replication(self, admin: Any, name: str) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) of topic ``name``; a topic created
        a moment ago is waited for (a broker learns of it a little later)."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import KafkaError, KafkaException

        timeout = self.config.request_timeout_s
        config_resource: Any = kadmin.ConfigResource  # type: ignore[attr-defined]
        resource = config_resource(kadmin.ResourceType.TOPIC, name)  # type: ignore[attr-defined]
        deadline = time.monotonic() + min(timeout, 10.0)
        while True:
            try:
                tmd = admin.list_topics(name, timeout=timeout).topics[name]
                if tmd.error is not None or not tmd.partitions:
                    raise KafkaException(tmd.error)
                factor = min(len(p.replicas) for p in tmd.partitions.values())
                entries = admin.describe_configs([resource])[resource].result(timeout)
                return factor, int(entries["min.insync.replicas"].value)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                refused = isinstance(error, KafkaError) and error.code() in (
                    KafkaError.TOPIC_AUTHORIZATION_FAILED,
                    KafkaError.CLUSTER_AUTHORIZATION_FAILED)
                if refused or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def check_replication(self, admin: Any, topic: str, sink_id: str) -> None:
        """The marker and claim topics hold what makes the output exactly once (which
        participants were committed, who owns the sink): each should survive what the
        output topic survives. A WARNING names one with fewer replicas or a lower
        ``min.insync.replicas`` than ``topic``."""
        try:
            out = self._replication(admin, topic)
            own = [(name, field_name, self._replication(admin, name))
                   for name, field_name in ((self.config.marker_topic, "marker.topic"),
                                            (self.config.claim_topic, "claim.topic"))]
        except Exception as exc:  # no DESCRIBE_CONFIGS, a topic still being created
            log.debug("sink=%s: cannot compare the replication of txsink's topics with "
                      "%s: %s", sink_id, topic, self.shared.redact(str(exc)))
            return
        for name, field_name, (factor, isr) in own:
            if factor < out[0] or isr < out[1]:
                log.warning(
                    "sink=%s: topic %s (option '%s') has %d replica(s) and "
                    "min.insync.replicas=%d, the output topic %s %d and %d: a broker loss "
                    "the output survives could lose the records that say which "
                    "participants were committed. Create it with as many replicas and as "
                    "high a min.insync.replicas as the output (one partition, "
                    "cleanup.policy=compact), or set marker.replication.factor before "
                    "txsink creates it", sink_id, name, field_name, factor, isr, topic,
                    out[0], out[1])

    def create_compacted(self, admin: Any, name: str, field_name: str, sink_id: str) -> None:
        """Create a one-partition compacted topic txsink keeps its own records in."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import KafkaException

        log.info("sink=%s: creating topic %s (option '%s')", sink_id, name, field_name)
        new = kadmin.NewTopic(  # type: ignore[attr-defined]
            name, num_partitions=1, replication_factor=self.config.marker_replication,
            config={"cleanup.policy": "compact"})
        try:
            admin.create_topics([new])[name].result(self.config.request_timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ConfigError(
                    f"kafka sink: cannot create topic {name!r} (option '{field_name}'): "
                    f"{self.shared.redact(str(exc))}; create it with one partition and "
                    "cleanup.policy=compact, or name an existing one", field=field_name,
                    sink_id=sink_id) from None
        # A new topic answers "Unknown partition" until its partition has a leader (its
        # first read came right after this): wait for that, bounded.
        deadline = time.monotonic() + self.config.request_timeout_s
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=self.config.request_timeout_s).topics.get(
                name)
            if (topic is not None and topic.error is None and topic.partitions
                    and all(p.leader >= 0 for p in topic.partitions.values())):
                return
            time.sleep(0.1)
        raise TxsinkError(f"kafka sink: topic {name!r} (option '{field_name}') was created "
                          f"but has no leader after {self.config.request_timeout_s:.0f}s",
                          sink_id=sink_id)

    def _read_claims(self, sink_id: str, *, create: bool = True) -> list[Claim]:
        """Every claim on ``sink_id``, in log order: the whole claim topic is read.

        A claim topic that is not there yet is created, unless ``create`` is false:
        then it holds no claim. A broker that does not answer is "server down" (a
        claim runs without a preflight in `txsink resolve`, `cut` and a first start),
        not the client's error object, nor a topic to create."""
        from confluent_kafka import KafkaError, KafkaException

        d = self.shared.driver()
        topic = self.config.claim_topic
        key = owner_key(self.config.transactional_id_prefix, sink_id)
        timeout = self.config.request_timeout_s
        claims: list[Claim] = []
        with d.lock:
            try:
                try:
                    low, high = watermarks(d.uncommitted_offsets, topic, 0, timeout)
                except KafkaException:
                    # watermarks() fails at once on a topic the broker does not know;
                    # anything else (a broker away past the bound) is raised below.
                    md = d.uncommitted_offsets.list_topics(topic, timeout=timeout)
                    tmd = md.topics.get(topic)
                    if tmd is not None and (tmd.error is None or tmd.error.code()
                                            != KafkaError.UNKNOWN_TOPIC_OR_PART):
                        raise
                    if not create:
                        return []
                    # Not there yet (a coordinator started without the preflight, as
                    # `txsink resolve` does): create it, once.
                    import confluent_kafka.admin as kadmin

                    conf: dict[str, Any] = {**self.config.connection()}
                    self.create_compacted(kadmin.AdminClient(conf), topic, "claim.topic",
                                          sink_id)
                    low, high = watermarks(d.uncommitted_offsets, topic, 0, timeout)
                for msg in read_range(d.uncommitted, topic, 0, low, high, timeout):
                    claim = Claim.decode(msg.key(), msg.value(), msg.offset() or 0)
                    if claim is not None and claim.owner_key == key:
                        claims.append(claim)
            except (KafkaException, BrokerReadTimeout) as exc:
                if not is_transient(exc):
                    raise
                said = _library_words(exc)
                raise ServerUnavailableError(
                    f"kafka sink: Kafka at {self.config.bootstrap!r} is down or unreachable "
                    f"(option 'kafka.bootstrap.servers'): reading the claim topic "
                    f"{topic!r} got no answer in {timeout:g}s: {self.shared.redact(said)}",
                    field="kafka.bootstrap.servers", sink_id=sink_id) from None
        return claims

    def _refuse_claim(self, sink_id: str, owner_location: str, where: str) -> ConfigError:
        return SinkOwnedError(
            f"kafka sink: sink id {sink_id!r} is already written by another query "
            f"(txsink state at {owner_location!r}, per {where}). Two queries with one sink "
            "id fence each other's transactions: give this query its own sink_id, or, if "
            "the other query and its checkpoint are gone for good, set the option "
            "'owner.takeover' to 'true' once", field="sink_id", sink_id=sink_id,
            owner_state=owner_location)

    def _check_owner(self, sink_id: str, state_id: str, claims: list[Claim]) -> Claim | None:
        """The current owner among ``claims``; refused if it is another state and
        ``owner.takeover`` is not set (also an owner record an older release left in
        the marker partition, when the claim topic holds none)."""
        owner = owner_of(claims)
        if owner is not None and owner.state_id == state_id:
            return owner
        if owner is None:
            # Sinks claimed by releases before the claim topic: their owner record in
            # the marker partition, if it is still in the scan window.
            legacy = self._legacy_owner(sink_id)
            if legacy is not None and legacy.state_id != state_id and not self.config.takeover:
                raise self._refuse_claim(sink_id, legacy.state_location,
                                         f"the owner record in {self.config.marker_topic!r}")
        elif not self.config.takeover:
            raise self._refuse_claim(sink_id, owner.state_location,
                                     f"the claim topic {self.config.claim_topic!r}")
        return owner

    def _legacy_owner(self, sink_id: str) -> Marker | None:
        """The owner record an older release left in the sink's marker partition; none
        where the marker topic does not exist yet (a check before the preflight that
        creates it: the scan would wait out "Unknown partition" and raise it)."""
        from confluent_kafka import KafkaError

        topic = self.config.marker_topic
        d = self.shared.driver()
        with d.lock:
            md = d.uncommitted_offsets.list_topics(topic, timeout=self.config.request_timeout_s)
        tmd = md.topics.get(topic)
        if tmd is None or (tmd.error is not None
                           and tmd.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        self.recovery.open_markers(sink_id)
        return self.recovery.scan_state(sink_id).owner

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        """:meth:`claim_sink`'s refusal from the claims as they are: nothing is written,
        and a claim topic not created yet holds no claim."""
        self._check_owner(sink_id, state_id, self._read_claims(sink_id, create=False))

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Bind ``sink_id`` to one query's state in the claim topic, or refuse.

        See :mod:`txsink_kafka.claims`: the whole claim topic is read, so the claim
        holds regardless of its age and of other sinks' traffic.
        """
        owner = self._check_owner(sink_id, state_id, self._read_claims(sink_id))
        if owner is not None and owner.state_id == state_id:
            return
        takeover = owner is not None and self.config.takeover
        mine = Claim(owner_key(self.config.transactional_id_prefix, sink_id), state_id,
                     state_location, takeover)
        key, value = mine.encode()
        d = self.shared.driver()
        d.ends.produce(self.config.claim_topic, value, key, 0)
        if d.ends.flush(self.config.request_timeout_s):
            raise ConfigError(f"kafka sink: could not write the claim of sink {sink_id!r} to "
                              f"{self.config.claim_topic!r}", field="claim.topic",
                              sink_id=sink_id)
        # Read back: of claims written at the same moment the first one wins (for
        # takeovers, the last one).
        latest = owner_of(self._read_claims(sink_id))
        if latest is None or latest.state_id != state_id:
            raise ConfigError(
                f"kafka sink: sink id {sink_id!r} was claimed by another query (txsink state "
                f"at {latest.state_location if latest else '?'!r}) at the same time; give "
                "each query its own sink_id", field="sink_id", sink_id=sink_id)
        log.info("sink=%s: claimed for txsink state %s%s", sink_id, state_location,
                 " (takeover)" if takeover else "")


def compacted_only(policy: str) -> bool:
    """Whether a topic's ``cleanup.policy`` is ``compact`` and nothing else: with
    ``compact,delete`` its retention deletes records compaction would keep (the live
    marker of a sink, a real-time position), whatever the retention is today."""
    return [p.strip() for p in policy.split(",") if p.strip()] == ["compact"]


def compaction_fix(topic: str, bootstrap: str) -> str:
    """The command that makes ``topic`` compacted only (what a refusal names)."""
    first = bootstrap.split(",")[0].strip()
    return (f"kafka-configs.sh --bootstrap-server {first} --alter --entity-type topics "
            f"--entity-name {topic} --add-config cleanup.policy=compact")


def _library_words(exc: Exception) -> str:
    """The client library's words for ``exc``, not its error object
    (``KafkaError{code=...,val=...}``)."""
    error = exc.args[0] if exc.args else None
    describe = getattr(error, "str", None)
    return str(describe()) if callable(describe) else str(exc)
