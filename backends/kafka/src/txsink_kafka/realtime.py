"""Real-time Mode target: records and a progress marker in one Kafka transaction.

Per (sink id, source topic, source partition) one transactional producer with a
deterministic ``transactional.id``: ``init_transactions`` of a newer writer (a
restarted query, a second driver) fences the older one, and completes or aborts
whatever the older one left open. Every commit writes, inside the same transaction
as the records, one marker to a compacted progress topic, keyed by sink id and
source partition, holding the highest source offset the output holds. After the
claim the marker is read back with ``read_committed`` up to the end of the log
(so a marker committed just before the claim is never missed), and rows at or
below it are skipped.

Readers of the output must use ``isolation.level=read_committed``.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from txsink.errors import ConfigError, FencedError, TxsinkError
from txsink.realtime import NOTHING, PositionTarget, RealtimeTargetSpec, SourcePartition

log = logging.getLogger(__name__)

DEFAULT_PROGRESS_TOPIC = "txsink-progress"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: How long a write waits for room in librdkafka's local queue before it fails.
QUEUE_FULL_S = 60.0
#: How long a claim waits for the progress topic to be readable to its end.
READ_TIMEOUT_S = 60.0
_OWN = {"topic", "progress.topic", "transaction.timeout.ms"}
_RESERVED = ("kafka.transactional.id", "kafka.enable.idempotence", "kafka.isolation.level",
             "kafka.acks")


def transactional_id(sink_id: str, source: SourcePartition) -> str:
    """The deterministic id of one source partition's writer (what fences)."""
    return f"txsink-rt.{sink_id}.{source.topic}.{source.partition}"


def progress_key(sink_id: str, source: SourcePartition) -> bytes:
    return json.dumps([sink_id, source.topic, source.partition],
                      separators=(",", ":")).encode()


class KafkaRealtimeSpec(RealtimeTargetSpec):
    """``topic`` + ``kafka.bootstrap.servers`` (+ other ``kafka.*`` producer settings,
    ``progress.topic``, ``transaction.timeout.ms``): see docs/realtime.md."""

    def __init__(self, sink_id: str, options: Mapping[str, str]) -> None:
        opts = {k.lower(): str(v) for k, v in options.items()}
        unknown = {k for k in opts if k not in _OWN and not k.startswith("kafka.")}
        if unknown:
            raise ConfigError(f"kafka real-time target: unknown option(s) "
                              f"{', '.join(sorted(unknown))}; known: topic, progress.topic, "
                              "transaction.timeout.ms, kafka.*", field=sorted(unknown)[0],
                              sink_id=sink_id)
        for key in _RESERVED:
            if key in opts:
                raise ConfigError(f"kafka real-time target: option '{key}' is set by txsink "
                                  "(transactional writes per source partition); remove it",
                                  field=key, sink_id=sink_id)
        if not opts.get("topic"):
            raise ConfigError("kafka real-time target: option 'topic' is required",
                              field="topic", sink_id=sink_id)
        if not opts.get("kafka.bootstrap.servers"):
            raise ConfigError("kafka real-time target: option 'kafka.bootstrap.servers' is "
                              "required", field="kafka.bootstrap.servers", sink_id=sink_id)
        self.sink_id = sink_id
        self.topic = opts["topic"]
        self.progress_topic = opts.get("progress.topic") or DEFAULT_PROGRESS_TOPIC
        try:
            self.timeout_ms = int(opts.get("transaction.timeout.ms")
                                  or DEFAULT_TRANSACTION_TIMEOUT_MS)
        except ValueError:
            raise ConfigError("kafka real-time target: 'transaction.timeout.ms' must be an "
                              "integer", field="transaction.timeout.ms",
                              sink_id=sink_id) from None
        #: librdkafka settings (secrets possible): never printed.
        self.client = {k[len("kafka."):]: v for k, v in opts.items() if k.startswith("kafka.")}

    def __repr__(self) -> str:
        return f"KafkaRealtimeSpec({self.describe()})"

    def describe(self) -> str:
        return (f"kafka topic {self.topic} at {self.client['bootstrap.servers']} "
                f"(progress in {self.progress_topic})")

    def place(self) -> str:
        # The topic, not the bootstrap servers: another list of brokers of the same
        # cluster is a legitimate change (as the micro-batch target's destination).
        return f"kafka topic {self.topic}"

    def same_place(self, other: RealtimeTargetSpec) -> bool:
        # Lists of brokers that share one are taken for one cluster.
        return (isinstance(other, KafkaRealtimeSpec)
                and other.feeds(self.client["bootstrap.servers"], self.topic))

    def feeds(self, servers: str, topic: str) -> bool:
        def names(text: str) -> set[str]:
            return {s.strip() for s in text.split(",") if s.strip()}

        return (self.topic == topic
                and bool(names(self.client["bootstrap.servers"]) & names(servers)))

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(dict(self.client))

    def prepare(self) -> None:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ConfigResource,
            NewTopic,
        )

        admin = self._admin()
        md = admin.list_topics(timeout=30)
        if self.topic not in md.topics:
            raise ConfigError(f"kafka real-time target: topic {self.topic!r} does not exist; "
                              "create it first", field="topic", sink_id=self.sink_id)
        if self.progress_topic not in md.topics:
            new = NewTopic(self.progress_topic, 1, -1,
                           config={"cleanup.policy": "compact",
                                   # small segments so compaction keeps the log short:
                                   # every claim reads its partition to the end
                                   "segment.ms": "60000",
                                   "min.cleanable.dirty.ratio": "0.01"})
            try:
                admin.create_topics([new])[self.progress_topic].result(30)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise TxsinkError(f"kafka real-time target: cannot create progress topic "
                                      f"{self.progress_topic!r}: {exc}",
                                      sink_id=self.sink_id) from None
        self._wait_for_leaders(admin)
        resource = ConfigResource("topic", self.progress_topic)
        configs = admin.describe_configs([resource])[resource].result(30)
        policy = configs.get("cleanup.policy")
        if policy is None or "compact" not in str(policy.value):
            raise ConfigError(f"kafka real-time target: progress topic {self.progress_topic!r} "
                              f"has cleanup.policy={policy.value if policy else '?'}; it must "
                              "be compacted (retention would delete the positions and replays "
                              "would duplicate)", field="progress.topic", sink_id=self.sink_id)

    def _wait_for_leaders(self, admin: Any, timeout_s: float = 60.0) -> None:
        """A new topic is answered UNKNOWN_TOPIC_OR_PART until every partition has a
        leader (seen under load): wait for that, bounded, before any writer claims."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            topic = admin.list_topics(self.progress_topic, timeout=30).topics.get(
                self.progress_topic)
            if (topic is not None and topic.error is None and topic.partitions
                    and all(p.leader >= 0 and p.error is None
                            for p in topic.partitions.values())):
                return
            if time.monotonic() > deadline:
                raise TxsinkError(f"kafka real-time target: progress topic "
                                  f"{self.progress_topic!r} has no leader after "
                                  f"{timeout_s:.0f}s", sink_id=self.sink_id)
            time.sleep(0.2)

    def check_columns(self, columns: Mapping[str, str]) -> None:
        """Like Spark's Kafka sink: ``value`` (string or binary), optionally ``key``
        (string or binary) and ``headers``. Any other column would be dropped without a
        word, and a missing ``value`` would write every record empty."""
        if "value" not in columns:
            raise ConfigError(f"kafka real-time target: the pipeline's output has no 'value' "
                              f"column (columns: {', '.join(columns) or 'none'}); it writes "
                              "key, value and headers, as Spark's Kafka sink does",
                              field="value", sink_id=self.sink_id)
        other = [c for c in columns if c not in ("key", "value", "headers")]
        if other:
            raise ConfigError(f"kafka real-time target: output column(s) {', '.join(other)} "
                              "would not be written (it writes key, value and headers; the "
                              "target topic is the option 'topic'); drop or rename them",
                              field=other[0], sink_id=self.sink_id)
        for name in ("key", "value"):
            kind = columns.get(name)
            if kind is not None and kind not in ("string", "binary"):
                raise ConfigError(f"kafka real-time target: column {name!r} is {kind}; cast "
                                  "it to string or binary", field=name, sink_id=self.sink_id)

    def __call__(self, source: SourcePartition) -> PositionTarget:
        return KafkaPositionTarget(self, source)

    def stored_positions(self) -> dict[SourcePartition, int]:
        out: dict[SourcePartition, int] = {}
        for key, value in _read_progress(self, None):
            sink, topic, partition = json.loads(key)
            if sink == self.sink_id:
                out[SourcePartition(topic, int(partition))] = int(json.loads(value)["offset"])
        return out


def _read_progress(spec: KafkaRealtimeSpec, want: bytes | None) -> list[tuple[bytes, bytes]]:
    """Committed progress records (all, or those keyed ``want``) up to the log end."""
    import time

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**spec.client, "group.id": f"txsink-rt-{spec.sink_id}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": False})
    try:
        md = consumer.list_topics(spec.progress_topic, timeout=30)
        partitions = sorted(md.topics[spec.progress_topic].partitions)
        if want is not None:
            partitions = [zlib.crc32(want) % len(partitions)]
        out: list[tuple[bytes, bytes]] = []
        for p in partitions:
            tp = TopicPartition(spec.progress_topic, p)
            low, high = consumer.get_watermark_offsets(tp, timeout=30)
            if high <= low:
                continue
            consumer.assign([TopicPartition(spec.progress_topic, p, OFFSET_BEGINNING)])
            deadline = time.monotonic() + READ_TIMEOUT_S
            while True:
                for msg in consumer.consume(10_000, 0.2):
                    if msg.error() is not None:
                        raise TxsinkError(f"reading progress topic {spec.progress_topic!r}: "
                                          f"{msg.error()}", sink_id=spec.sink_id)
                    key = msg.key()
                    if key is not None and (want is None or key == want):
                        out.append((key, msg.value() or b"{}"))
                position = consumer.position([tp])[0].offset
                if position >= high:
                    break
                if time.monotonic() > deadline:
                    raise TxsinkError(
                        f"sink {spec.sink_id}: the progress topic {spec.progress_topic!r} "
                        f"stayed unreadable to its end (offset {position} of {high}) for "
                        f"{READ_TIMEOUT_S:.0f}s: an open transaction holds it; find it with "
                        "kafka-transactions.sh find-hanging", sink_id=spec.sink_id)
        return out
    finally:
        consumer.close()


class KafkaPositionTarget(PositionTarget):
    """One source partition's transactional producer.

    Reusable between tasks (its claim, ``init_transactions`` plus a read of the
    progress topic, is the slow part of a real-time batch's start): a newer producer's
    ``init_transactions`` fences this one, so a kept producer that lost the source
    partition fails its next transaction, with nothing visible."""

    reusable = True

    def __init__(self, spec: KafkaRealtimeSpec, source: SourcePartition) -> None:
        self.spec = spec
        self.source = source
        self.producer: Any = None
        self.in_txn = False
        self.key = progress_key(spec.sink_id, source)
        self.progress_partition = 0
        self.errors: list[str] = []

    def _fail(self, what: str, exc: BaseException) -> TxsinkError:
        from confluent_kafka import KafkaError

        err = exc.args[0] if exc.args else None
        fenced = False
        if err is not None and hasattr(err, "fatal"):
            # A producer that learnt it was fenced from a produce response refuses the
            # next produce() with the local code _FATAL, whose error is not itself
            # flagged fatal (seen at 10,000 records/s: the kept producer then failed the
            # query instead of being claimed again).
            fenced = (bool(err.fatal()) or err.code() == KafkaError._FATAL
                      or "fenced" in str(err).lower())
        cls = FencedError if fenced else TxsinkError
        if fenced:
            # A fenced (or otherwise fatally failed) producer can abort nothing: the newer
            # producer's claim ended its transaction. Calling abort_transaction on it only
            # logs a misleading "conflicting commit_transaction call" warning.
            self.in_txn = False
        return cls(f"sink {self.spec.sink_id}: {what} for source partition {self.source} "
                   f"failed: {err or exc}; nothing of this transaction is visible",
                   sink_id=self.spec.sink_id)

    def claim(self) -> int:
        from confluent_kafka import KafkaException, Producer

        tid = transactional_id(self.spec.sink_id, self.source)
        self.producer = Producer({**self.spec.client, "transactional.id": tid,
                                  "transaction.timeout.ms": self.spec.timeout_ms,
                                  "linger.ms": self.spec.client.get("linger.ms", "5")})
        try:
            self.producer.init_transactions(30)
        except KafkaException as exc:
            raise self._fail("init_transactions", exc) from None
        md = self.producer.list_topics(self.spec.progress_topic, timeout=30)
        count = len(md.topics[self.spec.progress_topic].partitions)
        self.progress_partition = zlib.crc32(self.key) % max(1, count)
        found = _read_progress(self.spec, self.key)
        offset = int(json.loads(found[-1][1])["offset"]) if found else NOTHING
        if not found:
            # A first claim leaves a marker at NOTHING: the source partition is known to
            # this target before any target of its group commits a row of it (what
            # txsink.realtime.group tells a crash between two targets' commits by).
            self.commit(NOTHING)
        log.debug("sink %s: claimed %s (%s) at offset %s", self.spec.sink_id, self.source,
                  tid, offset)
        return offset

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))

    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        from confluent_kafka import KafkaException

        try:
            if not self.in_txn:
                self.producer.begin_transaction()
                self.in_txn = True
            for row in rows:
                value = row.get("value")
                key = row.get("key")
                headers = row.get("headers")
                args = (self.spec.topic, value.encode() if isinstance(value, str) else value,
                        key.encode() if isinstance(key, str) else key)
                kwargs = {"headers": ([(h["key"], h["value"]) for h in headers]
                                      if headers else None), "on_delivery": self._delivered}
                try:
                    self.producer.produce(*args, **kwargs)
                except BufferError:
                    # The local queue is full: this row (only this one: the rows
                    # before it are in the transaction already) once deliveries drain it.
                    self._produce_when_room(args, kwargs)
            self.producer.poll(0)  # serve delivery reports once per batch of rows
        except KafkaException as exc:
            raise self._fail("write", exc) from None

    def _produce_when_room(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import time

        deadline = time.monotonic() + QUEUE_FULL_S
        while True:
            self.producer.poll(0.05)
            try:
                self.producer.produce(*args, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise TxsinkError(
                        f"sink {self.spec.sink_id}: the producer's local queue for source "
                        f"partition {self.source} stayed full for {QUEUE_FULL_S:.0f}s (the "
                        "broker took no records); nothing of this transaction is visible",
                        sink_id=self.spec.sink_id) from None

    def commit(self, offset: int) -> None:
        from confluent_kafka import KafkaException

        try:
            if not self.in_txn:
                self.producer.begin_transaction()
                self.in_txn = True
            args = (self.spec.progress_topic, json.dumps({"offset": offset}).encode(),
                    self.key)
            kwargs = {"partition": self.progress_partition, "on_delivery": self._delivered}
            try:
                self.producer.produce(*args, **kwargs)
            except BufferError:
                self._produce_when_room(args, kwargs)
            self.producer.commit_transaction(30)
            self.in_txn = False
        except KafkaException as exc:
            raise self._fail("commit", exc) from None
        if self.errors:
            raise TxsinkError(f"sink {self.spec.sink_id}: delivery failed: {self.errors[0]}",
                              sink_id=self.spec.sink_id)

    def abort(self) -> None:
        if self.producer is not None and self.in_txn:
            self.in_txn = False
            try:
                self.producer.abort_transaction(30)
            except Exception as exc:
                log.warning("sink %s: abort for %s: %s (a newer writer or the transaction "
                            "timeout ends it)", self.spec.sink_id, self.source, exc)

    def close(self) -> None:
        self.abort()
        self.producer = None
