"""Spark's Kafka source as Real-time Mode identifies it: which topics it reads, and
each topic's id, asked through the Kafka client Spark's own source uses.

Spark's Kafka connector brings ``kafka-clients`` to the driver's JVM, configured by the
source's ``kafka.*`` options: an admin client built from the same options reaches the
same cluster with the same security settings (SASL, SSL, delegation-free), so no second
client configuration is needed and core imports no backend. Asked on the driver only,
before the query starts; the tasks get the ids as plain values.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError, TxsinkError
from txsink.realtime.source import SourceTopics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: How long one admin request may take before the start fails, naming the source.
REQUEST_TIMEOUT_S = 30


def source_options(df: DataFrame) -> dict[str, str]:
    """Every option of the pipeline's one streaming source, read from Spark's plan
    (keys lower-cased, as Spark's case-insensitive map keeps them)."""
    stack = [df._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        children = node.children()
        count = int(children.size())
        if count == 0:
            # py4j answers every attribute name: ask, and take what works.
            with contextlib.suppress(Exception):
                options = node.extraOptions()
                return {str(k).lower(): str(options.get(k))
                        for k in list(options.keySet().toArray())}
            with contextlib.suppress(Exception):  # a v1 StreamingRelation
                scala = node.dataSource().options()
                keys = scala.keys().toSeq()
                return {str(keys.apply(i)).lower(): str(scala.apply(keys.apply(i)))
                        for i in range(int(keys.size()))}
            return {}
        stack.extend(children.apply(i) for i in range(count))
    return {}


def kafka_source(df: DataFrame) -> SparkKafkaSource | None:
    """The stream's Kafka source (Spark's ``kafka`` format, or any source given Kafka's
    ``kafka.bootstrap.servers`` with ``subscribe``, ``subscribePattern`` or ``assign``),
    or None: another source, or a frame whose plan this process cannot read (Spark
    Connect)."""
    try:
        options = source_options(df)
    except Exception:  # no JVM plan here (Spark Connect)
        return None
    if not options.get("kafka.bootstrap.servers") or not any(
            options.get(k) for k in ("subscribe", "subscribepattern", "assign")):
        return None
    return SparkKafkaSource(df, options)


class SparkKafkaSource(SourceTopics):
    """The source's topics through the driver's JVM Kafka admin client.

    Not picklable (it holds the session): the driver uses it before the query starts.
    """

    def __init__(self, df: DataFrame, options: Mapping[str, str] | None = None) -> None:
        self.spark = df.sparkSession
        self.options = dict(options if options is not None else source_options(df))
        self.subscribe = [t.strip() for t in self.options.get("subscribe", "").split(",")
                          if t.strip()]
        self.pattern = self.options.get("subscribepattern") or None
        self.assigned: list[str] = []
        if self.options.get("assign"):
            try:
                data = json.loads(self.options["assign"])
            except ValueError:
                data = None
            if not isinstance(data, dict):
                raise ConfigError(f"source option assign: {self.options['assign']!r} is not "
                                  "a JSON object of topic -> partitions (as Spark's Kafka "
                                  "source takes it)", field="source.options.assign")
            self.assigned = sorted(str(t) for t in data)
        self._admin: Any = None
        self._names: list[str] | None = None
        self._cluster: str | None = None

    def describe(self) -> str:
        what = (f"subscribePattern {self.pattern}" if self.pattern else
                f"assign {', '.join(self.assigned)}" if self.assigned else
                f"subscribe {', '.join(self.subscribe)}")
        return f"kafka at {self.servers()} ({what})"

    def servers(self) -> str:
        return self.options.get("kafka.bootstrap.servers", "")

    def reads(self, topic: str) -> bool:
        if topic in self.subscribe or topic in self.assigned:
            return True
        if self.pattern:
            jvm = self._jvm()
            return bool(jvm.java.util.regex.Pattern.compile(self.pattern).matcher(
                topic).matches())
        return False

    def _jvm(self) -> Any:
        jvm = self.spark._jvm
        if jvm is None:
            raise ConfigError("real-time mode needs a local driver (no Spark Connect)",
                              field="remote")
        return jvm

    def admin(self) -> Any:
        """The JVM admin client, built from the source's own ``kafka.*`` options."""
        if self._admin is None:
            jvm = self._jvm()
            props = jvm.java.util.Properties()
            for key, value in self.options.items():
                if key.startswith("kafka."):
                    props.put(key[len("kafka."):], value)
            props.put("request.timeout.ms", str(REQUEST_TIMEOUT_S * 1000))
            props.put("default.api.timeout.ms", str(REQUEST_TIMEOUT_S * 1000))
            try:
                self._admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
            except Exception as exc:
                raise self._failed("connect", exc) from None
        return self._admin

    def _failed(self, what: str, exc: BaseException) -> TxsinkError:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        for key, value in self.options.items():
            if any(s in key for s in ("password", "secret", "jaas", "token")) and value:
                text = text.replace(value, "***")
        return TxsinkError(f"real-time mode: cannot {what} the source's Kafka cluster "
                           f"({self.servers()}) to identify its topics: {text}")

    def _get(self, future: Any) -> Any:
        unit = self._jvm().java.util.concurrent.TimeUnit.SECONDS
        return future.get(REQUEST_TIMEOUT_S, unit)

    def _all_names(self) -> list[str]:
        if self._names is None:
            try:
                names = self._get(self.admin().listTopics().names())
            except Exception as exc:
                raise self._failed("list the topics of", exc) from None
            self._names = sorted(str(n) for n in names.toArray())
        return self._names

    def topics(self) -> list[str]:
        if self.pattern:
            return [t for t in self._all_names() if self.reads(t)]
        return sorted(set(self.subscribe) | set(self.assigned))

    def topic_ids(self, topics: Sequence[str]) -> dict[str, str]:
        present = [t for t in topics if t in set(self._all_names())]
        if not present:
            return {}
        jvm = self._jvm()
        names = jvm.java.util.ArrayList()
        for t in present:
            names.add(t)
        try:
            described = self._get(self.admin().describeTopics(names).allTopicNames())
        except Exception as exc:
            raise self._failed("describe the topics of", exc) from None
        return {t: str(described.get(t).topicId().toString()) for t in present}

    def end_offsets(self, topic: str) -> dict[int, int]:
        jvm = self._jvm()
        names = jvm.java.util.ArrayList()
        names.add(topic)
        admin = self.admin()
        try:
            described = self._get(admin.describeTopics(names).allTopicNames()).get(topic)
            wanted = jvm.java.util.HashMap()
            partitions = described.partitions()
            latest = jvm.org.apache.kafka.clients.admin.OffsetSpec.latest()
            for i in range(int(partitions.size())):
                number = int(partitions.get(i).partition())
                wanted.put(jvm.org.apache.kafka.common.TopicPartition(topic, number), latest)
            result = self._get(admin.listOffsets(wanted).all())
        except Exception as exc:
            raise self._failed("read the end offsets of", exc) from None
        return {int(tp.partition()): int(result.get(tp).offset())
                for tp in list(result.keySet().toArray())}

    def cluster_id(self) -> str | None:
        if self._cluster is None:
            try:
                self._cluster = str(self._get(self.admin().describeCluster().clusterId()))
            except Exception:
                return None
        return self._cluster

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close(self._jvm().java.time.Duration.ofSeconds(5))


__all__ = ["SparkKafkaSource", "source_options"]
