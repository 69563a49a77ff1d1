"""A Kafka stream source for PySpark's Python data source API (``format("txsink-kafka")``).

Why another Kafka source: Spark's own needs the ``spark-sql-kafka`` jar; this one is
pure Python (confluent-kafka) and pairs with txsink's sink for Kafka -> Spark ->
Kafka jobs. Like Spark's:

* offsets per topic-partition live in Spark's offset log, so a replayed batch reads
  exactly the same records (ranges end at or below the last stable offset, which
  never moves back);
* ``startingOffsets``: ``earliest``, ``latest`` (default) or per-partition JSON
  ``{"topic": {"0": 42, "1": -2}}`` (-2 earliest, -1 latest); partitions added while
  the query runs are discovered and read from their start;
* ``kafka.isolation.level`` is ``read_committed`` unless set;
* the schema is Spark's Kafka source schema (``key``, ``value``, ``topic``,
  ``partition``, ``offset``, ``timestamp``, ``timestampType``, and ``headers`` with
  ``includeHeaders=true``);
* consumers use explicit assignment, never group subscription.

Progress for lag monitors: with ``kafka.group.id`` the source commits that group's
offsets to Kafka once Spark has committed a batch, so ``kafka-consumer-groups
--describe``, Burrow or any lag exporter show how far the pipeline got. They are a
report only: Spark's checkpoint stays the source of truth for where a (re)started
query reads, and the reported offsets never run ahead of Spark's commit log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from txsink.errors import ConfigError
from txsink.options import Options

from txsink_kafka.config import SECRET_OPTIONS, is_secret_key

try:  # PySpark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming import datasource as _streaming
except ImportError:  # pragma: no cover
    _streaming = None  # type: ignore[assignment]

_ReadAllAvailable: Any = getattr(_streaming, "ReadAllAvailable", None)
_ReadMaxRows: Any = getattr(_streaming, "ReadMaxRows", None)
_AvailableNow: Any = getattr(_streaming, "SupportsTriggerAvailableNow", object)

log = logging.getLogger(__name__)

FORMAT = "txsink-kafka"
OWNER = "kafka source"
SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, "
              "timestamp timestamp, timestampType int")
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"
_FIELDS: list[pa.Field[Any]] = [
    pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()), pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", pa.list_(pa.struct([pa.field("key", pa.string()),
                                            pa.field("value", pa.binary())]))),
]
ARROW_SCHEMA = pa.schema(_FIELDS)
ARROW_SCHEMA_NO_HEADERS = pa.schema(_FIELDS[:-1])
EARLIEST, LATEST = -2, -1
_ROWS_PER_BATCH = 10_000

Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class SourceSettings:
    consumer: dict[str, str] = field(repr=False)
    topics: tuple[str, ...] = ()
    starting: str | Offsets = "latest"
    max_offsets_per_trigger: int | None = None
    timeout_s: float = 30.0
    include_headers: bool = False
    #: Consumer group whose committed offsets report the query's progress.
    report_group: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceSettings:
        # Spark lower-cases option keys.
        lowered = {str(k).lower(): v for k, v in options.items()}
        opts = Options(lowered, owner=OWNER, secret_keys=SECRET_OPTIONS | {
            k for k in lowered if k.startswith("kafka.") and is_secret_key(k)})
        consumer = opts.with_prefix("kafka.")
        if not consumer.get("bootstrap.servers"):
            raise ConfigError(f"{OWNER}: option 'kafka.bootstrap.servers' is required",
                              field="kafka.bootstrap.servers")
        for key in ("enable.auto.commit", "auto.offset.reset"):
            if key in consumer:
                raise ConfigError(f"{OWNER}: option 'kafka.{key}' cannot be set: offsets live "
                                  "in Spark's checkpoint and partitions are assigned "
                                  "explicitly", field=f"kafka.{key}")
        report_group = consumer.pop("group.id", None)
        if report_group is not None and not report_group.strip():
            raise ConfigError(f"{OWNER}: option 'kafka.group.id' is empty: name the consumer "
                              "group lag monitors should watch, or leave it out",
                              field="kafka.group.id")
        consumer.setdefault("isolation.level", "read_committed")
        if consumer["isolation.level"] not in ("read_committed", "read_uncommitted"):
            raise ConfigError(f"{OWNER}: option 'kafka.isolation.level' must be "
                              "read_committed or read_uncommitted",
                              field="kafka.isolation.level")
        topics = tuple(t.strip() for t in opts.str("subscribe", required=True).split(",")
                       if t.strip())
        if not topics:
            raise ConfigError(f"{OWNER}: option 'subscribe' names no topic", field="subscribe")
        raw = opts.str("startingoffsets", "latest").strip()
        starting: str | Offsets
        if raw.lower() in ("earliest", "latest"):
            starting = raw.lower()
        else:
            starting = _parse_offsets_json(raw, topics)
        limit = opts.optional("maxoffsetspertrigger")
        max_rows = None if limit is None else opts.int("maxoffsetspertrigger", 0, minimum=1)
        timeout = opts.float("request.timeout.s", 30.0, minimum=0.1)
        include_headers = opts.bool("includeheaders", False)
        opts.ignore("path", "failondataloss")
        opts.check_unknown()
        return cls(consumer, topics, starting, max_rows, timeout, include_headers,
                   report_group)

    def consumer_config(self, *, group: str = "txsink-source") -> dict[str, Any]:
        return {"group.id": group, "enable.auto.commit": False,
                "enable.partition.eof": True, "fetch.wait.max.ms": 100, **self.consumer}


def _parse_offsets_json(raw: str, topics: tuple[str, ...]) -> Offsets:
    problem = ""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        problem = str(exc)
        data = None
    if not problem and not (isinstance(data, dict) and all(
            isinstance(t, str) and isinstance(ps, dict) and all(
                str(p).isdigit() and isinstance(o, int) and o >= -2 for p, o in ps.items())
            for t, ps in data.items())):
        problem = "expected {\"topic\": {\"partition\": offset}} with offsets >= -2"
    if problem:
        raise ConfigError(f"{OWNER}: option 'startingOffsets' must be earliest, latest or "
                          f"JSON like {{\"orders\": {{\"0\": 42, \"1\": -2}}}} (-2 earliest, "
                          f"-1 latest): {problem}", field="startingOffsets")
    unknown = sorted(set(data) - set(topics))
    if unknown:
        raise ConfigError(f"{OWNER}: option 'startingOffsets' names topics not in "
                          f"'subscribe': {', '.join(unknown)}", field="startingOffsets")
    return {t: {str(p): int(o) for p, o in ps.items()} for t, ps in data.items()}


class _Broker:
    """Metadata and watermark queries on the driver (a never-assigned consumer)."""

    def __init__(self, settings: SourceSettings) -> None:
        from confluent_kafka import Consumer

        self.settings = settings
        # The driver's consumer never joins its group (no subscribe): it only commits
        # the report offsets, which Kafka accepts for a group with no members.
        self.consumer = Consumer({
            **settings.consumer_config(group=settings.report_group or "txsink-source"),
            "socket.nagle.disable": True})

    def close(self) -> None:
        self.consumer.close()

    def partitions(self) -> dict[str, list[int]]:
        md = self.consumer.list_topics(timeout=self.settings.timeout_s)
        out: dict[str, list[int]] = {}
        for topic in self.settings.topics:
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None:
                raise ConfigError(f"{OWNER}: topic {topic!r} (option 'subscribe') does not "
                                  f"exist", field="subscribe")
            out[topic] = sorted(tmd.partitions)
        return out

    def bounds(self, topic: str, partition: int) -> tuple[int, int]:
        """(earliest, end): end is the last stable offset for read_committed."""
        from txsink_kafka.clients import watermarks

        return watermarks(self.consumer, topic, partition, self.settings.timeout_s)

    def commit_group_offsets(self, offsets: Offsets) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.commit(offsets=[TopicPartition(t, int(p), o)
                                      for t, ps in sorted(offsets.items())
                                      for p, o in sorted(ps.items())], asynchronous=False)


class KafkaStreamReader(DataSourceStreamReader, _AvailableNow):  # type: ignore[misc]
    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self._broker: _Broker | None = None
        self._target: Offsets | None = None
        self._reported: Offsets = {}
        #: What initialOffset() answered in this process: a start equal to it is where
        #: the query begins, not the end of a batch Spark committed.
        self._initial: Offsets | None = None

    @property
    def broker(self) -> _Broker:
        if self._broker is None:
            self._broker = _Broker(self.settings)
        return self._broker

    def _resolve(self, topic: str, partition: int, wanted: int) -> int:
        low, end = self.broker.bounds(topic, partition)
        if wanted == EARLIEST:
            return low
        if wanted == LATEST:
            return end
        return max(low, min(wanted, end))

    def initialOffset(self) -> Offsets:
        out: Offsets = {}
        for topic, parts in self.broker.partitions().items():
            given = self.settings.starting
            for p in parts:
                if isinstance(given, str):
                    wanted = EARLIEST if given == "earliest" else LATEST
                else:
                    wanted = given.get(topic, {}).get(str(p), LATEST)
                out.setdefault(topic, {})[str(p)] = self._resolve(topic, p, wanted)
        self._initial = out
        return out

    def _available(self, start: Offsets) -> Offsets:
        """End offsets now; partitions not in ``start`` (new ones) start at earliest."""
        out: Offsets = {}
        for topic, parts in self.broker.partitions().items():
            for p in parts:
                _, end = self.broker.bounds(topic, p)
                out.setdefault(topic, {})[str(p)] = end
                if str(p) not in start.get(topic, {}):
                    log.info("kafka source: new partition %s[%d] found; reading it from the "
                             "start", topic, p)
        return out

    def latestOffset(self, start: Offsets | None = None, limit: Any = None) -> Offsets:
        # Spark plans the next batch only after the previous one is in its commit log,
        # so ``start`` (the end of that batch) is committed: report it now rather than
        # when the next batch with data comes (``commit`` below), so an idle query
        # shows no lag.
        if start and start != self._initial:
            self._report(start)
        start = start or {}
        end = self._target if self._target is not None else self._available(start)
        max_rows = getattr(limit, "max_rows", None)
        if max_rows is None:
            return end
        # Spread the limit over the partitions, oldest data first per partition.
        capped: Offsets = {}
        budget = int(max_rows)
        for topic, parts in sorted(end.items()):
            for p, until in sorted(parts.items()):
                begin = start.get(topic, {}).get(p, 0)
                take = max(0, min(until - begin, budget))
                budget -= take
                capped.setdefault(topic, {})[p] = begin + take
        return capped

    def getDefaultReadLimit(self) -> Any:
        if self.settings.max_offsets_per_trigger is not None and _ReadMaxRows is not None:
            return _ReadMaxRows(self.settings.max_offsets_per_trigger)
        return _ReadAllAvailable() if _ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available({})

    def partitions(self, start: Offsets, end: Offsets) -> list[InputPartition]:
        out: list[InputPartition] = []
        for topic, parts in sorted(end.items()):
            for p, until in sorted(parts.items(), key=lambda kv: int(kv[0])):
                begin = start.get(topic, {}).get(p)
                if begin is None:
                    begin = self._resolve(topic, int(p), EARLIEST)
                if until > begin:
                    out.append(KafkaInputPartition(topic, int(p), begin, until))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_range(self.settings, partition)

    def commit(self, end: Offsets) -> None:
        """Spark committed every batch up to ``end``: report it to the consumer group."""
        self._report(end)

    def _report(self, offsets: Offsets) -> None:
        """Commit ``offsets`` for ``kafka.group.id``, never moving a partition back.

        Only a report: a failure is logged and the query goes on.
        """
        group = self.settings.report_group
        if group is None:
            return
        ahead: Offsets = {}
        for topic, parts in offsets.items():
            for p, o in parts.items():
                if o > self._reported.get(topic, {}).get(p, -1):
                    ahead.setdefault(topic, {})[p] = o
        if not ahead:
            return
        try:
            self.broker.commit_group_offsets(ahead)
        except Exception as exc:
            log.warning("kafka source: reporting progress to consumer group %r failed "
                        "(offsets stay in Spark's checkpoint; lag monitors lag behind): %s",
                        group, exc)
            return
        for topic, parts in ahead.items():
            self._reported.setdefault(topic, {}).update(parts)
        log.debug("kafka source: consumer group %r at %s", group, ahead)

    def stop(self) -> None:
        if self._broker is not None:
            self._broker.close()
            self._broker = None


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    topic: str
    partition: int
    start: int
    until: int


def read_range(settings: SourceSettings, part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Records of ``[start, until)`` of one partition as Arrow batches.

    With read_committed, aborted records and transaction markers inside the range are
    skipped by the consumer, so the range ends at the first offset >= ``until`` or at
    the end of the partition, not at a record numbered ``until - 1``.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # "error": a range whose start was deleted by retention must fail loudly, not jump
    # to the end and silently skip records.
    consumer = Consumer({**settings.consumer_config(), "auto.offset.reset": "error"})
    consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
    deadline = time.monotonic() + max(60.0, settings.timeout_s)
    done = False
    try:
        while not done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"kafka source: reading {part.topic}[{part.partition}] "
                                   f"{part.start}..{part.until} made no progress")
            msgs = consumer.consume(_ROWS_PER_BATCH, 0.2)
            # Cut the batch at the end of the range or at the partition's end event.
            cut = len(msgs)
            failed = [i for i, m in enumerate(msgs) if m.error() is not None]
            if failed:
                err = msgs[failed[0]].error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"kafka source: {part.topic}[{part.partition}]: "
                                       f"{err.str()}")
                cut, done = failed[0], True
            if cut and (msgs[cut - 1].offset() or 0) >= part.until - 1:
                done = True
                while cut and (msgs[cut - 1].offset() or 0) >= part.until:
                    cut -= 1
            if not cut:
                continue
            deadline = time.monotonic() + max(60.0, settings.timeout_s)
            yield _to_batch(part, msgs[:cut], settings.include_headers)
    finally:
        consumer.close()


def _to_batch(part: KafkaInputPartition, msgs: list[Any], headers: bool) -> pa.RecordBatch:
    """Column by column (list comprehensions): the per-record Python cost is the limit."""
    stamps = [m.timestamp() for m in msgs]
    n = len(msgs)
    columns = [
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([part.topic] * n, pa.string()),
        pa.array([part.partition] * n, pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array([ts * 1000 if kind else None for kind, ts in stamps],
                 pa.timestamp("us", tz="UTC")),
        pa.array([kind - 1 if kind > 0 else 0 for kind, _ in stamps], pa.int32()),
    ]
    if not headers:
        return pa.record_batch(columns, schema=ARROW_SCHEMA_NO_HEADERS)
    columns.append(pa.array(
        [[{"key": k, "value": v} for k, v in h] if h else []
         for h in (m.headers() for m in msgs)], ARROW_SCHEMA.field("headers").type))
    return pa.record_batch(columns, schema=ARROW_SCHEMA)


class KafkaSource(DataSource):
    """``spark.readStream.format("txsink-kafka")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.settings = SourceSettings.parse(options)

    def schema(self) -> str:
        return SCHEMA_DDL + (HEADERS_DDL if self.settings.include_headers else "")

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        return KafkaStreamReader(self.settings)


def register_source(spark: Any) -> None:
    """Make ``format("txsink-kafka")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(KafkaSource)
