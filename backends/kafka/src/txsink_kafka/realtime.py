"""Real-time Mode target: records and a progress marker in one Kafka transaction.

Per (sink id, source topic, source partition) one transactional producer with a
deterministic ``transactional.id``: ``init_transactions`` of a newer writer (a
restarted query, a second driver, the task after ``txsink reset``) fences the older
one, and completes or aborts whatever the older one left open. Every commit writes,
inside the same transaction as the records, one marker to a compacted progress topic,
keyed by sink id and source partition, holding the highest source offset the output
holds, the source topic's id it was counted in and the output topic it went to.

Three things an operator may do to the progress topic are part of the design:

* a **tombstone** for a marker's key (what ``txsink reset`` writes) means "no position",
  wherever markers are read (claims, ``txsink status``, the checks before a start);
* **partitions added** do not move markers: every marker is written to partition 0
  (markers of releases that placed them by key hash are still found, and moved to
  partition 0 by their next commit);
* a **retention** on it is refused: ``cleanup.policy`` must be ``compact`` only.

A claim reads its markers to the end of the log, not to the last stable offset:
another sink's transaction open on the shared progress topic would otherwise hide every
marker committed after it, and a restart would take an old position for the latest.

A task of a dead driver that had not claimed its source partition yet holds no producer
a reset could fence: it would claim after the reset (fencing the new run) and commit its
old batch's position. So a run's generation is the progress partition's end offset when
its driver prepares the target (offsets only grow), it travels with the spec to the
tasks, and ``txsink reset`` first writes a **reset record** (key ``[sink id, "", -1]``,
never a position) holding the end offset it read and the topic's id: a claim whose run
is not past it, or was prepared against another incarnation of the topic, is
refused, before its ``init_transactions`` (so it fences nobody) and again after it, and
after the first marker it commits (a reset under way then has its record below it).

Readers of the output must use ``isolation.level=read_committed``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError, FencedError, TxsinkError
from txsink.realtime import (
    NOTHING,
    PositionTarget,
    RealtimeTargetSpec,
    SourcePartition,
    StoredPosition,
    older_run_refusal,
)
from txsink.realtime.places import endpoints, share_endpoint

if TYPE_CHECKING:
    from txsink.realtime import SourceTopics

log = logging.getLogger(__name__)

DEFAULT_PROGRESS_TOPIC = "txsink-progress"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
#: How long a write waits for room in librdkafka's local queue before it fails.
QUEUE_FULL_S = 60.0
#: How long a claim waits for the progress topic to be readable to its end: another
#: writer's transaction on it ends within its commit (milliseconds), a dead one's when
#: the broker aborts it (txsink's default transaction.timeout.ms, 60 s, plus the
#: broker's abort interval, 10 s by default).
READ_TIMEOUT_S = 90.0
#: The partition every marker is written to (a partition count change cannot move it).
MARKER_PARTITION = 0
#: A progress read consumes in steps this long: librdkafka's ``consume`` waits out its
#: whole timeout unless its batch fills, so a long one was a floor under every claim.
SCAN_WAIT_S = 0.005
#: How long the broker may hold a warm reader's fetch when nothing new is decided: the
#: end of a transaction (its commit markers) does not end the wait early (measured:
#: a read right after a commit took Kafka's default 500 ms).
TAIL_FETCH_WAIT_MS = 25
#: A process's warm reader of a progress topic is closed after this long unused.
TAIL_IDLE_S = 120.0
_OWN = {"topic", "progress.topic", "transaction.timeout.ms"}
_RESERVED = ("kafka.transactional.id", "kafka.enable.idempotence", "kafka.isolation.level",
             "kafka.acks")
#: Spark's Kafka sink's ``headers`` type, and the value type txsink also writes.
_HEADERS = ("array<struct<key:string,value:binary>>", "array<struct<key:string,value:string>>")


def transactional_id(sink_id: str, source: SourcePartition) -> str:
    """The deterministic id of one source partition's writer (what fences)."""
    return f"txsink-rt.{sink_id}.{source.topic}.{source.partition}"


def progress_key(sink_id: str, source: SourcePartition) -> bytes:
    return json.dumps([sink_id, source.topic, source.partition],
                      separators=(",", ":")).encode()


def reset_key(sink_id: str) -> bytes:
    """The key of a sink id's reset record (no source topic has an empty name)."""
    return json.dumps([sink_id, "", -1], separators=(",", ":")).encode()


def reset_value(generation: int, progress_id: str | None = None) -> bytes:
    """A reset record: the progress partition's end offset when the reset began; a run
    prepared before read an end offset at most this one. ``progress_id``: the progress
    topic's id then (its offsets restart at 0 when it is deleted and created again, so
    a run prepared against another incarnation is older whatever its offset)."""
    data: dict[str, Any] = {"reset": generation}
    if progress_id is not None:
        data["progress_id"] = progress_id
    return json.dumps(data).encode()


def parse_reset(value: bytes | None) -> tuple[int, str | None] | None:
    """A reset record's generation and the progress topic id it names (``None``: not a
    reset record)."""
    try:
        data = json.loads(value) if value is not None else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("reset"), int):
        return None
    topic = data.get("progress_id")
    return data["reset"], topic if isinstance(topic, str) else None


def legacy_partition(key: bytes, count: int) -> int:
    """Where releases before partition pinning put a marker (a key hash): still read."""
    return zlib.crc32(key) % max(1, count)


def marker_value(offset: int, topic_id: str | None, destination: Mapping[str, str]) -> bytes:
    """A marker: the offset, the source topic's id it counts in, the output topic."""
    return json.dumps({"offset": offset, "topic_id": topic_id,
                       "destination": dict(destination)}, sort_keys=True).encode()


def parse_marker(value: bytes | None) -> StoredPosition | None:
    """A marker's position; ``None`` for a tombstone (no position) or a record that
    holds no offset (it cannot be a position: read as none, never as offset 0)."""
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("offset"), int):
        return None
    dest = data.get("destination")
    return StoredPosition(
        int(data["offset"]),
        str(data["topic_id"]) if data.get("topic_id") else None,
        {str(k): str(v) for k, v in dest.items()} if isinstance(dest, dict) else None)


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
        #: The progress topic's id when :meth:`prepare` drew :attr:`run` (its offsets
        #: count only within one incarnation of the topic).
        self.run_progress_id: str | None = None
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

    def destination(self) -> dict[str, str]:
        # The topic, not the bootstrap servers: another list of brokers of the same
        # cluster is a legitimate change (as the micro-batch target's destination). The
        # progress topic too: under another one the target's positions are gone.
        return {"topic": self.topic, "progress.topic": self.progress_topic}

    def place(self) -> str:
        return f"kafka topic {self.topic}"

    def _endpoints(self) -> list[tuple[str, str]]:
        return endpoints(self.client["bootstrap.servers"], "9092")

    def same_place(self, other: RealtimeTargetSpec) -> bool:
        # One topic, on brokers that share an address (aliases and order aside).
        return (isinstance(other, KafkaRealtimeSpec) and other.topic == self.topic
                and share_endpoint(self._endpoints(), other._endpoints()))

    def cluster_id(self) -> str | None:
        """The id of the cluster this target writes (``None``: not reachable now)."""
        try:
            return str(self._admin().list_topics(timeout=10).cluster_id or "") or None
        except Exception:
            return None

    def feeds(self, source: SourceTopics) -> bool:
        # The query reads this topic (a subscribe list, a pattern, an assignment) on this
        # cluster: the same brokers under any alias, or the same cluster id.
        if not source.reads(self.topic):
            return False
        if share_endpoint(self._endpoints(), endpoints(source.servers(), "9092")):
            return True
        theirs = source.cluster_id()
        return theirs is not None and theirs == self.cluster_id()

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(dict(self.client))

    def prepare(self) -> None:
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ConfigResource,
            NewTopic,
        )

        from txsink_kafka.admin import compacted_only, compaction_fix

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
        value = str(policy.value) if policy is not None and policy.value is not None else ""
        if not compacted_only(value):
            raise ConfigError(
                f"kafka real-time target: progress topic {self.progress_topic!r} has "
                f"cleanup.policy={value or '?'}; it must be compacted only: with delete, "
                "its retention deletes the stored positions, and a replay would then write "
                "every record again. Make it compacted only "
                f"({compaction_fix(self.progress_topic, self.client['bootstrap.servers'])}), "
                "or name another progress.topic", field="progress.topic",
                sink_id=self.sink_id)
        self.run = self.progress_end()
        self.run_progress_id = self.progress_id(admin)

    def progress_id(self, admin: Any = None) -> str | None:
        """The progress topic's id (``None`` when the broker does not say)."""
        from confluent_kafka import TopicCollection

        try:
            admin = admin or self._admin()
            described = admin.describe_topics(TopicCollection([self.progress_topic]))
            topic_id = described[self.progress_topic].result(30).topic_id
        except Exception as exc:
            log.debug("sink %s: cannot read the id of progress topic %r: %s", self.sink_id,
                      self.progress_topic, exc)
            return None
        return None if topic_id is None else str(topic_id)

    def progress_end(self) -> int:
        """The end offset of the progress partition (read uncommitted): a run's
        generation, and a reset's."""
        reader = ProgressReader(self)
        return reader._log_ends([MARKER_PARTITION])[MARKER_PARTITION][1]

    def _wait_for_leaders(self, admin: Any, timeout_s: float = 60.0) -> None:
        """A new topic is answered UNKNOWN_TOPIC_OR_PART until every partition has a
        leader (seen under load): wait for that, bounded, before any writer claims."""
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
        (string or binary) and ``headers`` (``array<struct<key:string,value:binary>>``,
        or string values). Any other column would be dropped without a word, a missing
        ``value`` would write every record empty, and headers of another shape would fail
        the first write after the query started."""
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
        headers = columns.get("headers")
        if headers is not None and headers.replace(" ", "") not in _HEADERS:
            raise ConfigError(f"kafka real-time target: column 'headers' is {headers}; it "
                              f"must be {_HEADERS[0]} (as for Spark's Kafka sink; string "
                              "values are written as UTF-8), e.g. array(named_struct('key', "
                              "'source', 'value', CAST('x' AS BINARY)))", field="headers",
                              sink_id=self.sink_id)

    def __call__(self, source: SourcePartition) -> PositionTarget:
        return KafkaPositionTarget(self, source)

    def stored(self) -> dict[SourcePartition, StoredPosition]:
        out: dict[SourcePartition, StoredPosition] = {}
        for key, position in ProgressReader(self).read(None).items():
            try:
                sink, topic, partition = json.loads(key)
            except ValueError:
                continue  # not a marker of txsink's
            if sink == self.sink_id and position is not None:
                out[SourcePartition(topic, int(partition))] = position
        return out

    def delete_positions(self, topics: Sequence[str] | None = None) -> list[str]:
        """A tombstone for every marker of this sink id (of ``topics`` only, if given),
        after fencing each source partition's writer: a producer of the query that held
        it can commit no marker after the tombstone."""
        from confluent_kafka import Producer

        # The reset record first: a claim that reads the log after it is refused, and
        # one whose marker lands before it is read below and fenced.
        self._write_reset()
        held = self.stored()
        gone = [s for s in sorted(held) if topics is None or s.topic in topics]
        if not gone:
            return []
        located = ProgressReader(self).locations([progress_key(self.sink_id, s) for s in gone])
        for source in gone:
            fence = Producer({**self.client, "transactional.id":
                              transactional_id(self.sink_id, source),
                              "transaction.timeout.ms": self.timeout_ms})
            try:
                fence.init_transactions(30)
            finally:
                fence.flush(30)
        plain = Producer({**self.client, "enable.idempotence": True})
        for source in gone:
            key = progress_key(self.sink_id, source)
            for partition in sorted(located.get(key, set()) | {MARKER_PARTITION}):
                plain.produce(self.progress_topic, None, key, partition=partition)
        if plain.flush(30):
            raise TxsinkError(f"sink {self.sink_id}: the tombstones did not all reach "
                              f"progress topic {self.progress_topic!r} within 30s; run it "
                              "again", sink_id=self.sink_id)
        return [f"{source}: offset {held[source].offset} (tombstone in {self.progress_topic})"
                for source in gone]


    def _write_reset(self) -> None:
        """Record, in partition 0, that every run prepared until now is over."""
        from confluent_kafka import Producer

        generation = self.progress_end()
        errors: list[str] = []
        producer = Producer({**self.client, "enable.idempotence": True})
        producer.produce(self.progress_topic, reset_value(generation, self.progress_id()),
                         reset_key(self.sink_id), partition=MARKER_PARTITION,
                         on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        if producer.flush(30) or errors:
            raise TxsinkError(f"sink {self.sink_id}: the reset record did not reach progress "
                              f"topic {self.progress_topic!r} within 30s"
                              f"{': ' + errors[0] if errors else ''}; nothing deleted, run "
                              "it again", sink_id=self.sink_id)


class ProgressReader:
    """Reads the progress topic to the end of its log: every committed record of the
    keys asked for, the last one of each key winning (a tombstone: ``None``).

    The end is the high watermark (read uncommitted), not the last stable offset: the
    read waits, bounded by :data:`READ_TIMEOUT_S`, until every transaction open below
    it has ended, so no committed marker is missed behind another writer's open
    transaction. A transaction that stays open (a hanging one) is a loud error."""

    def __init__(self, spec: KafkaRealtimeSpec) -> None:
        self.spec = spec

    def _partitions(self, consumer: Any) -> list[int]:
        md = consumer.list_topics(self.spec.progress_topic, timeout=30)
        topic = md.topics.get(self.spec.progress_topic)
        if topic is None or topic.error is not None:
            raise TxsinkError(f"sink {self.spec.sink_id}: progress topic "
                              f"{self.spec.progress_topic!r} cannot be read: "
                              f"{getattr(topic, 'error', 'missing')}", sink_id=self.spec.sink_id)
        return sorted(topic.partitions)

    def _consumer(self, tail: bool = False) -> Any:
        from confluent_kafka import Consumer

        extra = {"enable.partition.eof": True, "fetch.wait.max.ms": TAIL_FETCH_WAIT_MS} \
            if tail else {"enable.partition.eof": False}
        return Consumer({**self.spec.client, "group.id": f"txsink-rt-{self.spec.sink_id}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         **extra})

    def _log_ends(self, partitions: Sequence[int],
                  admin: Any = None) -> dict[int, tuple[int, int]]:
        """(log start, high watermark) of each partition, read uncommitted."""
        import confluent_kafka.admin as kadmin
        from confluent_kafka import IsolationLevel, TopicPartition

        spec: Any = kadmin.OffsetSpec  # type: ignore[attr-defined]
        admin = admin or kadmin.AdminClient(dict(self.spec.client))
        topic = self.spec.progress_topic
        ends = admin.list_offsets(
            {TopicPartition(topic, p): spec.latest() for p in partitions},
            isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=30)
        starts = admin.list_offsets(
            {TopicPartition(topic, p): spec.earliest() for p in partitions},
            request_timeout=30)
        out: dict[int, tuple[int, int]] = {}
        for tp, future in ends.items():
            out[tp.partition] = (0, int(future.result(30).offset))
        for tp, future in starts.items():
            out[tp.partition] = (int(future.result(30).offset), out[tp.partition][1])
        return out

    def _scan(self, consumer: Any, partition: int, want: set[bytes] | None,
              out: dict[bytes, tuple[int, StoredPosition | None]],
              bounds: tuple[int, int]) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        low, high = bounds
        if high <= low:
            return
        topic = self.spec.progress_topic
        tp = TopicPartition(topic, partition)
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            # Short waits: a consume returns at its timeout, not at the first record.
            for msg in consumer.consume(10_000, SCAN_WAIT_S):
                if msg.error() is not None:
                    raise TxsinkError(f"reading progress topic {topic!r}: {msg.error()}",
                                      sink_id=self.spec.sink_id)
                key = msg.key()
                if key is not None and (want is None or key in want):
                    out[key] = (partition, parse_marker(msg.value()))
            position = consumer.position([tp])[0].offset
            if position >= high:
                return
            if time.monotonic() > deadline:
                self.hanging(partition, position, high)

    def hanging(self, partition: int, position: int, high: int) -> None:
        """Raise: the progress topic stayed unreadable to its end."""
        raise TxsinkError(
            f"sink {self.spec.sink_id}: the progress topic {self.spec.progress_topic!r} "
            f"stayed unreadable to its end (partition {partition}: committed records read "
            f"to offset {position} of {high}) for {READ_TIMEOUT_S:.0f}s: a transaction "
            "open on it hides the markers after it; find it with kafka-transactions.sh "
            "find-hanging (and abort it), or wait for its transaction timeout",
            sink_id=self.spec.sink_id)

    def read(self, want: Sequence[bytes] | None) -> dict[bytes, StoredPosition | None]:
        """The positions of the keys in ``want`` (all keys: ``None``)."""
        return {key: position for key, (_, position) in self.read_placed(want).items()}

    def read_placed(self, want: Sequence[bytes] | None
                    ) -> dict[bytes, tuple[int, StoredPosition | None]]:
        """Each key's position and the partition it was found in: partition 0 first; a
        key not there is looked for where releases before pinning hashed it."""
        consumer = self._consumer()
        try:
            partitions = self._partitions(consumer)
            bounds = self._log_ends(partitions)
            keys = None if want is None else set(want)
            found: dict[bytes, tuple[int, StoredPosition | None]] = {}
            self._scan(consumer, MARKER_PARTITION, keys, found, bounds[MARKER_PARTITION])
            legacy: dict[bytes, dict[int, StoredPosition | None]] = {}
            for p in (p for p in partitions if p != MARKER_PARTITION):
                missing = None if keys is None else keys - set(found)
                if missing is not None and not missing:
                    break
                seen: dict[bytes, tuple[int, StoredPosition | None]] = {}
                self._scan(consumer, p, missing, seen, bounds[p])
                for key, (_, position) in seen.items():
                    if key not in found:
                        legacy.setdefault(key, {})[p] = position
            for key, places in legacy.items():
                live = {p: pos for p, pos in places.items() if pos is not None}
                if len(live) > 1:
                    raise TxsinkError(
                        f"progress topic {self.spec.progress_topic!r} holds markers of "
                        f"{key.decode(errors='replace')} in partitions "
                        f"{', '.join(map(str, sorted(live)))}: partitions were added to it "
                        "while an older txsink placed markers by key hash, so it cannot "
                        "tell which is the latest. Delete this sink's positions (txsink "
                        "reset) after checking what the target holds, or use a new "
                        "progress.topic", sink_id=self.spec.sink_id)
                found[key] = next(iter(live.items()), (min(places), None))
            return found
        finally:
            consumer.close()

    def locations(self, keys: Sequence[bytes]) -> dict[bytes, set[int]]:
        """Every partition holding a record of one of ``keys`` (for tombstones)."""
        consumer = self._consumer()
        try:
            partitions = self._partitions(consumer)
            bounds = self._log_ends(partitions)
            out: dict[bytes, set[int]] = {}
            for p in partitions:
                seen: dict[bytes, tuple[int, StoredPosition | None]] = {}
                self._scan(consumer, p, set(keys), seen, bounds[p])
                for key in seen:
                    out.setdefault(key, set()).add(p)
            return out
        finally:
            consumer.close()


class ProgressTail:
    """A warm reader of partition 0 of one progress topic, kept by the process (a
    Python worker claims its source partitions again and again: whenever Spark hands a
    batch's task to another worker than the last one).

    It remembers the last committed marker of every key and where it stopped, and each
    :meth:`read` consumes only what was appended since, up to the log's end (read
    uncommitted, then waited for until every transaction below it ended, as
    :class:`ProgressReader` does): a claim reads its position in milliseconds, not in
    the hundreds a fresh consumer took. The markers' meaning is the reader's; this one
    keeps nothing the log does not say."""

    def __init__(self, spec: KafkaRealtimeSpec) -> None:
        self.reader = ProgressReader(spec)
        self.topic = spec.progress_topic
        self.lock = threading.Lock()
        self.consumer: Any = None
        self.admin: Any = None
        self.next = -1
        #: key -> position of its last committed record in partition 0 (``None``: a
        #: tombstone)
        self.known: dict[bytes, StoredPosition | None] = {}
        #: key -> generation of its last reset record, and the progress topic id it names
        self.resets: dict[bytes, tuple[int, str | None]] = {}
        self.used = time.monotonic()
        #: The id of the progress topic this reader reads (None: not asked yet).
        self.topic_id: str | None = None
        self.ids: Any = None

    def read(self, key: bytes, *, verify: bool = False) -> tuple[bool, StoredPosition | None]:
        """Whether partition 0 holds a record of ``key``, and its position (``None``: a
        tombstone), as of the log's end now. ``verify``: ask the topic's id first (a
        claim's first read): a topic deleted and created again is read anew even when
        its log reaches as far as the old one did, and nothing the old one's consumer
        still held is taken for the new one's."""
        from confluent_kafka import KafkaError, TopicPartition

        with self.lock:
            self.used = time.monotonic()
            recreated = False
            if verify:
                current = self._topic_id()
                recreated = None not in (current, self.topic_id) and current != self.topic_id
                self.topic_id = current or self.topic_id
            low, high = self._log_end()
            # Its log ending below where this reader got: the topic was deleted and
            # created again (positions gone, a start over by hand): what it remembers is
            # of the old topic, and a claim must find no position, as status does.
            if recreated or self.consumer is None or self.next < low or high < self.next:
                self.close_consumer()
                self.consumer = self.reader._consumer(tail=True)
                self.known.clear()
                self.resets.clear()
                self.next = low
                self.consumer.assign([TopicPartition(self.topic, MARKER_PARTITION, low)])
            deadline = time.monotonic() + READ_TIMEOUT_S
            # The consumer keeps fetching between reads (a paused one took most of a
            # second to fetch again after resuming, measured), so a read only takes what
            # was appended since the last one.
            while self.next < high:
                for msg in self.consumer.consume(10_000, SCAN_WAIT_S):
                    error = msg.error()
                    if error is not None and error.code() == KafkaError._PARTITION_EOF:
                        # The end of what is decided (the last stable offset): past the
                        # commit markers too, which no record stands for.
                        self.next = max(self.next, msg.offset())
                        continue
                    if error is not None:
                        self.close_consumer()
                        raise TxsinkError(f"reading progress topic {self.topic!r}: "
                                          f"{error}", sink_id=self.reader.spec.sink_id)
                    self.next = max(self.next, msg.offset() + 1)
                    if msg.key() is not None:
                        self.known[msg.key()] = parse_marker(msg.value())
                        reset = parse_reset(msg.value())
                        if reset is not None:
                            self.resets[msg.key()] = reset
                if self.next < high and time.monotonic() > deadline:
                    reached = self.next
                    self.close_consumer()
                    self.reader.hanging(MARKER_PARTITION, reached, high)
            if key not in self.known:
                return False, None
            return True, self.known[key]

    def _topic_id(self) -> str | None:
        """The progress topic's id now, through an admin client this reader keeps (None
        when the broker does not say)."""
        from confluent_kafka import TopicCollection

        try:
            if self.ids is None:
                self.ids = self.reader.spec._admin()
            described = self.ids.describe_topics(TopicCollection([self.topic]))
            topic_id = described[self.topic].result(30).topic_id
        except Exception as exc:
            log.debug("progress topic %r: cannot read its id: %s", self.topic, exc)
            return None
        return None if topic_id is None else str(topic_id)

    def reset(self, sink_id: str) -> tuple[int, str | None] | None:
        """The generation of ``sink_id``'s last reset record and the progress topic id it
        names, as of the last :meth:`read`."""
        with self.lock:
            return self.resets.get(reset_key(sink_id))

    def _log_end(self) -> tuple[int, int]:
        """(log start, high watermark) of partition 0, asked of the partition's leader by
        a read-uncommitted consumer of this tail's own (an admin client's ListOffsets
        took one or three seconds now and then, measured, where this one did not)."""
        from confluent_kafka import Consumer, TopicPartition

        if self.admin is None:
            self.admin = Consumer({**self.reader.spec.client,
                                   "group.id": f"txsink-rt-{self.reader.spec.sink_id}",
                                   "enable.auto.commit": False,
                                   "isolation.level": "read_uncommitted"})
        low, high = self.admin.get_watermark_offsets(
            TopicPartition(self.topic, MARKER_PARTITION), timeout=30, cached=False)
        return int(low), int(high)

    def close_consumer(self) -> None:
        consumer, self.consumer = self.consumer, None
        admin, self.admin = self.admin, None
        self.next = -1
        if admin is not None:
            try:
                admin.close()
            except Exception as exc:
                log.debug("closing a progress reader: %s", exc)
        if consumer is not None:
            try:
                consumer.close()
            except Exception as exc:
                log.debug("closing a progress reader: %s", exc)


#: librdkafka settings of the real-time producers, unless the target's ``kafka.*`` sets
#: them: records leave within 5 ms, and a request refused for a moment (the coordinator
#: still writing the last commit's markers) is asked again after 10 ms, not 100.
PRODUCER_DEFAULTS = {"linger.ms": "5", "retry.backoff.ms": "10", "retry.backoff.max.ms": "100"}

#: Producers created ahead of a claim (connected, not initialised), by their settings.
_STANDBY: dict[tuple[tuple[str, Any], ...], tuple[Any, float]] = {}


def _standby_key(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, str(v)) for k, v in config.items()))


def take_standby(config: Mapping[str, Any]) -> Any:
    """A producer made for ``config`` ahead of time, if one waits (and is young enough
    to trust its connections), else ``None``."""
    with _TAILS_LOCK:
        found = _STANDBY.pop(_standby_key(config), None)
    if found is None or time.monotonic() - found[1] > TAIL_IDLE_S:
        return None
    return found[0]


def make_standby(config: Mapping[str, Any]) -> None:
    """Create the producer the next claim with ``config`` in this process takes: a
    transactional producer connects and reads metadata at once, but touches its
    transactional id only at ``init_transactions``, so it fences nothing while it waits."""
    from confluent_kafka import Producer

    key = _standby_key(config)
    with _TAILS_LOCK:
        now = time.monotonic()
        for k in [k for k, (_, made) in _STANDBY.items() if now - made > TAIL_IDLE_S]:
            del _STANDBY[k]
        if key in _STANDBY:
            return
    producer = Producer(dict(config))
    with _TAILS_LOCK:
        _STANDBY.setdefault(key, (producer, time.monotonic()))


#: This process's warm progress readers, by cluster settings and progress topic.
_TAILS: dict[tuple[Any, ...], ProgressTail] = {}
_TAILS_LOCK = threading.Lock()


def progress_tail(spec: KafkaRealtimeSpec) -> ProgressTail:
    key = (tuple(sorted(spec.client.items())), spec.progress_topic)
    with _TAILS_LOCK:
        now = time.monotonic()
        for k in [k for k, t in _TAILS.items() if now - t.used > TAIL_IDLE_S]:
            _TAILS.pop(k).close_consumer()
        tail = _TAILS.get(key)
        if tail is None:
            tail = _TAILS[key] = ProgressTail(spec)
        return tail


def close_warm() -> None:
    """Close this process's warm progress readers and producers made ahead (a test
    session, before its broker stops: they would try to reconnect until the process
    ends)."""
    with _TAILS_LOCK:
        tails = list(_TAILS.values())
        _TAILS.clear()
        # Never initialised, they hold no transactional id: dropped, they are destroyed.
        _STANDBY.clear()
    for tail in tails:
        with tail.lock:
            tail.close_consumer()


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
        self.errors: list[str] = []
        #: The topic id the stored position was counted in, kept by commits that know
        #: none (a topic the query found after it started).
        self.topic_id = source.topic_id
        #: A marker an older release placed by key hash: its next commit moves it to
        #: partition 0 and leaves a tombstone where it was, in one transaction.
        self.legacy_partition: int | None = None
        #: The offset this session's last commit (or its claim) left in the target.
        self.committed = NOTHING

    def identity(self) -> tuple[str, Mapping[str, str]]:
        return self.spec.sink_id, self.spec.destination()

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

    def claim(self) -> StoredPosition:
        from confluent_kafka import KafkaException, Producer

        tid = transactional_id(self.spec.sink_id, self.source)
        config = self.producer_config(tid)
        tail = progress_tail(self.spec)
        # A task of a run older than the last reset is refused before its
        # init_transactions fences the run after the reset.
        tail.read(self.key, verify=True)
        self._refuse_older_run(tail)
        self.producer = take_standby(config) or Producer(config)
        try:
            self.producer.init_transactions(30)
        except KafkaException as exc:
            raise self._fail("init_transactions", exc) from None
        finally:
            # The next claim of this source partition in this process (after another
            # worker took it) finds a producer connected already: its init_transactions
            # is then one round trip to the coordinator.
            make_standby(config)
        # Every older producer of this id is fenced now and its transaction ended: the
        # log up to its end holds every marker it will ever commit.
        found, stored = tail.read(self.key)
        self._refuse_older_run(tail)  # a reset between the first read and the init
        partition = MARKER_PARTITION
        if not found:  # never claimed, or claimed by a release that hashed markers
            partition, stored = ProgressReader(self.spec).read_placed([self.key]).get(
                self.key, (MARKER_PARTITION, None))
        if partition != MARKER_PARTITION:
            self.legacy_partition = partition
        if stored is not None and self.topic_id is None:
            self.topic_id = stored.topic_id
        if stored is None:
            # A first claim (or one after a tombstone) leaves a marker at NOTHING: the
            # source partition is known to this target before any target of its group
            # commits a row of it (what txsink.realtime.group tells a crash between two
            # targets' commits by).
            self.commit(NOTHING)
            # A reset that read the markers before this one landed did not fence this
            # producer; its reset record lies below this marker.
            tail.read(self.key)
            self._refuse_older_run(tail)
            stored = StoredPosition(NOTHING, self.topic_id, self.spec.destination())
        self.committed = stored.offset
        log.debug("sink %s: claimed %s (%s) at offset %s", self.spec.sink_id, self.source,
                  tid, stored.offset)
        return stored

    def _refuse_older_run(self, tail: ProgressTail) -> None:
        reset = tail.reset(self.spec.sink_id)
        refusal = older_run_refusal(self.spec.sink_id, self.source, self.spec.run,
                                    None if reset is None else reset[0])
        mine = self.spec.run_progress_id
        if refusal is None and reset is not None and None not in (mine, reset[1]) \
                and mine != reset[1]:
            refusal = FencedError(
                f"sink {self.spec.sink_id}: source partition {self.source}: this task "
                f"belongs to a run prepared against progress topic "
                f"{self.spec.progress_topic!r} before it was deleted and created again "
                f"(id {mine}, now {reset[1]}), and the sink's positions were deleted since "
                "(txsink reset); it stops without writing. A run started after the reset "
                "writes this source partition", sink_id=self.spec.sink_id)
        if refusal is not None:
            self.close()
            raise refusal

    def producer_config(self, tid: str) -> dict[str, Any]:
        return {**self.spec.client, "transactional.id": tid,
                "transaction.timeout.ms": self.spec.timeout_ms,
                **{k: self.spec.client.get(k, v) for k, v in PRODUCER_DEFAULTS.items()}}

    def still_holds(self) -> bool:
        """Whether this kept producer still holds its transactional id: it commits its
        marker again (the same offset) in a transaction of its own, which the broker
        refuses if a newer producer claimed the id since (fenced: nothing visible)."""
        if self.producer is None:
            return False
        try:
            self.commit(self.committed)
        except FencedError:
            return False
        return True

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
            records: list[tuple[bytes | None, int]] = [
                (marker_value(offset, self.topic_id, self.spec.destination()),
                 MARKER_PARTITION)]
            if self.legacy_partition is not None:
                records.append((None, self.legacy_partition))
            for value, partition in records:
                args = (self.spec.progress_topic, value, self.key)
                kwargs = {"partition": partition, "on_delivery": self._delivered}
                try:
                    self.producer.produce(*args, **kwargs)
                except BufferError:
                    self._produce_when_room(args, kwargs)
            self.producer.commit_transaction(30)
            self.in_txn = False
            self.legacy_partition = None
            self.committed = offset
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
