"""The Kafka writer: a transactional producer per participant, on the executors.

``begin_transaction`` opens the participant in the background: a ``transactional.id``
from :mod:`txsink_kafka.naming` (by default a pooled id of the write partition with no
open transaction), a librdkafka producer, ``init_transactions`` and the participant's
begin marker (see :mod:`txsink_kafka.markers`). ``write`` streams rows, and
``pre_commit`` flushes, reads the producer id and epoch librdkafka acquired, and closes
the producer **without aborting**: the transaction stays open on the broker,
invisible to ``read_committed`` readers, for the driver's committer. Under
``at_least_once``/``none`` the task commits its own transaction and keeps the producer
for its worker's next task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.backend import Transaction
from txsink.errors import ConfigError, FencedError, TxsinkError
from txsink.model import Committable, DeliveryGuarantee, TransactionContext

from txsink_kafka.clients import (
    NAME,
    PAYLOAD_VERSION,
    PROCESS,
    TRANSACTION_VERSION,
    SinkClients,
    connection_key,
    warn_near_timeout,
)
from txsink_kafka.markers import ABORTED, BEGIN, COMMITTED, END, Marker, marker_partition
from txsink_kafka.naming import acquire_pooled_id, is_pooled, participant_id
from txsink_kafka.retry import retry_transient
from txsink_kafka.txn_protocol import (
    ProducerIdentity,
    TransactionInfo,
    TxnProtocolError,
    UnsupportedByBrokerError,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import KafkaError, Message, Producer

#: The record header ``epoch.header`` adds: the epoch of the record's participant.
EPOCH_HEADER = "txsink-epoch"

log = logging.getLogger(__name__)

_PID_RE = re.compile(r"Acquired PID\{Id:(-?\d+),Epoch:(-?\d+)\}")


class _PidCapture(logging.Handler):
    """Reads the producer id and epoch from librdkafka's ``eos`` debug log.

    librdkafka has no API that returns them; its debug line
    ``Acquired PID{Id:N,Epoch:M}`` is the one place it says them.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.identity: ProducerIdentity | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = _PID_RE.search(record.getMessage())
        if match:
            self.identity = ProducerIdentity(int(match[1]), int(match[2]))


class _SlotTaken(Exception):
    """A pooled slot another writer took between the probe and ``init_transactions``."""


class _WriterProducer:
    """A writer's transactional producer, and where its callbacks report to.

    librdkafka binds the delivery callback and the logger when the producer is made;
    both go through this object, so that one producer can serve several transactions
    in turn (at_least_once / none keep it between tasks, see :func:`_keep_producer`).
    """

    def __init__(self, key: tuple[Any, ...], transactional_id: str) -> None:
        self.key = key
        self.transactional_id = transactional_id
        self.capture = _PidCapture()
        self.producer: Producer | None = None
        self.txn: KafkaTransaction | None = None
        self.marker_partition: int | None = None

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if self.txn is not None:
            self.txn.on_delivery(err, msg)


class KafkaTransaction(Transaction):
    def __init__(self, ctx: TransactionContext, transactional_id: str) -> None:
        super().__init__(ctx)
        self.transactional_id = transactional_id
        self.producer: Producer | None = None
        self.holder: _WriterProducer | None = None
        #: Whether the producer came from this worker's cache (no init_transactions).
        self.reused = False
        #: The open in the background (begin_transaction) and what it raised.
        self.opening: threading.Thread | None = None
        self.open_error: BaseException | None = None
        #: How long the open took (id probe, producer, marker), and how long the task
        #: waited for it.
        self.open_ms = 0.0
        self.open_wait_ms = 0.0
        self.capture = _PidCapture()
        self.errors: list[str] = []
        self.fatal = False
        self.topics: set[str] = set()
        self.marker_topic = ""
        self.marker_partition = 0
        self.marker_offset = -1
        #: The broker's transaction timeout runs from the first record, not the flush.
        self.began_at = time.time()
        #: Per (topic, partition): [first offset, last offset, records] of this
        #: participant's data, from its delivery reports (what a salvage reads back).
        self.ranges: dict[tuple[str, int], list[int]] = {}
        #: The cluster's finalized transaction.version when the participant opened.
        self.broker_transaction_version = -1
        #: Seconds spent handing rows to librdkafka (write) and flushing (pre_commit):
        #: with open_wait_ms and began/prepared_at, where a participant's time goes.
        self.write_s = 0.0
        self.flush_s = 0.0

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            offset = msg.offset()
            topic, partition = msg.topic(), msg.partition()
            if offset is None or topic is None or partition is None:  # pragma: no cover
                return  # (a delivered record has them all)
            key = (topic, partition)
            span = self.ranges.get(key)
            if span is None:
                self.ranges[key] = [offset, offset, 1]
            else:
                if offset < span[0]:
                    span[0] = offset
                if offset > span[1]:
                    span[1] = offset
                span[2] += 1
            return
        if len(self.errors) < 10:
            from confluent_kafka import KafkaError

            self.errors.append(f"{msg.topic()}: {err.str()}")
            # A record refused for an old producer epoch: another producer
            # initialised the id since (its transaction was aborted by it).
            if err.fatal() or "fence" in err.str().lower() or err.code() in (
                    KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                    KafkaError.INVALID_PRODUCER_EPOCH):
                self.fatal = True


def encode_ranges(ranges: dict[tuple[str, int], list[int]]) -> dict[str, list[list[int]]]:
    """``{topic: [[partition, first, last, records], ...]}``, sorted, for the payload."""
    out: dict[str, list[list[int]]] = {}
    for (topic, partition), (first, last, count) in sorted(ranges.items()):
        out.setdefault(topic, []).append([partition, first, last, count])
    return out


@dataclass(frozen=True)
class LogRecord:
    """One record to write again as it was: same partition, key, value, headers and
    (for CreateTime topics) timestamp."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    #: Milliseconds; None lets the producer stamp it (LogAppendTime topics).
    timestamp: int | None


def raised() -> BaseException:
    """What the ``except:`` clause around it caught, as an exception.

    confluent-kafka sometimes raises a bare ``KafkaError``, which is no exception class
    (seen for a fenced producer's flush in a thread other than the main one): only a
    bare ``except:`` catches it, and it is wrapped in a ``KafkaException`` here.
    """
    from confluent_kafka import KafkaException

    caught = sys.exc_info()[1]
    if isinstance(caught, BaseException):
        return caught
    return KafkaException(caught)


#: Producers of finished at_least_once / none tasks, idle (no open transaction), by
#: producer settings and transactional id, least recently used first.
_PRODUCERS: OrderedDict[tuple[Any, ...], _WriterProducer] = OrderedDict()
_PRODUCERS_LOCK = threading.Lock()
#: How many producers a worker keeps: one per pooled id it wrote with lately.
MAX_KEPT_PRODUCERS = 8
#: ``init_transactions`` (a new producer), ``reused`` (a kept one) and ``warmed`` (one
#: initialised ahead of need, exactly_once) per process, for tests and benchmarks.
PRODUCER_COUNTS: Counter[str] = Counter()


#: Producers being initialised ahead of need (exactly_once), by key: set when done.
_WARMING: dict[tuple[Any, ...], threading.Event] = {}


def _take_producer(key: tuple[Any, ...], wait_s: float = 0.0) -> _WriterProducer | None:
    """This process's kept producer for ``key``, taken out so no other task uses it;
    one still being initialised ahead of need is waited for, at most ``wait_s``."""
    with _PRODUCERS_LOCK:
        warming = _WARMING.get(key)
    if warming is not None and wait_s > 0:
        warming.wait(wait_s)
    with _PRODUCERS_LOCK:
        return _PRODUCERS.pop(key, None)


def _keep_producer(holder: _WriterProducer) -> None:
    """Keep an idle producer for the next task; the least recently used beyond
    :data:`MAX_KEPT_PRODUCERS` is closed."""
    holder.txn = None
    with _PRODUCERS_LOCK:
        evicted = _PRODUCERS.pop(holder.key, None)
        _PRODUCERS[holder.key] = holder
        while len(_PRODUCERS) > MAX_KEPT_PRODUCERS:
            _, oldest = _PRODUCERS.popitem(last=False)
            _drop_producer(oldest)
    if evicted is not None and evicted is not holder:  # pragma: no cover - defensive
        _drop_producer(evicted)


def _drop_producer(holder: _WriterProducer) -> None:
    """Forget a producer. It holds no open transaction (or a prepared one, which
    destroying it leaves open, as pre_commit needs)."""
    holder.producer = None
    holder.txn = None


def close_kept_producers(wait_s: float = 10.0) -> None:
    """Close the producers this process kept between tasks, and those being opened ahead
    of need (waited for, at most ``wait_s``, so none is left behind connected)."""
    with _PRODUCERS_LOCK:
        warming = list(_WARMING.values())
    deadline = time.monotonic() + wait_s
    for event in warming:
        event.wait(max(0.0, deadline - time.monotonic()))
    with _PRODUCERS_LOCK:
        holders = list(_PRODUCERS.values())
        _PRODUCERS.clear()
    for holder in holders:
        producer = holder.producer
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.flush(1.0)
        _drop_producer(holder)


def _forget_inherited_producers() -> None:
    """In a forked child: the parent's kept producers (their transactional ids stay the
    parent's) are kept referenced, never used or destroyed (see
    :meth:`txsink_kafka.clients._ProcessClients.forget_inherited`)."""
    global _PRODUCERS_LOCK
    _PRODUCERS_LOCK = threading.Lock()
    PROCESS.inherited.extend(_PRODUCERS.values())
    _PRODUCERS.clear()
    _WARMING.clear()  # the parent's warming threads are not in the child


os.register_at_fork(after_in_child=_forget_inherited_producers)


class KafkaWriter:
    """The executor half of the backend (Flink's ``KafkaWriter``)."""

    def __init__(self, shared: SinkClients) -> None:
        self.shared = shared
        self.config = shared.config

    def _choose_id(self, ctx: TransactionContext, *, ahead: bool = False) -> str:
        """A pooled id with no open transaction, or the participant's own id.

        Brokers without DescribeTransactions (Kafka before 3.0, Tansu) get the
        ``participant`` naming, with a warning once per process. ``ahead``: for a
        producer opened ahead of need (avoids other writers' idle producers).
        """
        if self.config.naming != "pooled":
            return participant_id(self.config.transactional_id_prefix, ctx)
        key = connection_key(self.config)
        if key not in PROCESS.no_describe:
            try:
                return retry_transient(
                    lambda: acquire_pooled_id(self.shared.txn_client(),
                                              self.config.transactional_id_prefix, ctx,
                                              self.config.pool_size, avoid_idle=ahead),
                    what=f"{ctx.describe()}: picking a transactional.id",
                    bound_s=self.config.retry_bound_s, redact=self.shared.redact)
            except UnsupportedByBrokerError:
                PROCESS.no_describe.add(key)
                log.warning("sink=%s: %s cannot describe transactions, so transactional ids "
                            "cannot be pooled; using one id per participant (set "
                            "transactional.id.naming=participant to silence this)",
                            ctx.sink_id, self.config.bootstrap)
            except TxnProtocolError as exc:
                raise TxsinkError(f"{ctx.describe()}: cannot pick a pooled transactional.id: "
                                  f"{self.shared.redact(str(exc))}", sink_id=ctx.sink_id,
                                  epoch=ctx.epoch, participant=ctx.participant) from None
        return participant_id(self.config.transactional_id_prefix, ctx)

    def _marker_partition(self, producer: Producer, sink_id: str) -> int:
        """The sink's marker partition, from metadata requests of the new producer.

        Asked even when the partition count is known, twice: librdkafka drops the
        bootstrap connection once the first answer names the cluster's brokers, and
        the second request waits until it is connected to one of those. A transaction
        coordinator lookup that finds no broker up is retried by a fixed 500 ms timer
        only, so without this about half of all opens took ~530 ms instead of ~60 ms
        (measured on Apache Kafka 4.4, librdkafka 2.16; docs/backends/kafka.md).
        """
        for _ in range(2):
            md = producer.list_topics(self.config.marker_topic,
                                      timeout=self.config.request_timeout_s)
        if self.shared.marker_partitions is None:
            tmd = md.topics.get(self.config.marker_topic)
            if tmd is None or tmd.error is not None or not tmd.partitions:
                raise ConfigError(f"kafka sink: marker topic {self.config.marker_topic!r} "
                                  "is missing; run the sink's preflight (the driver creates "
                                  "it) or create it", field="marker.topic", sink_id=sink_id)
            self.shared.marker_partitions = len(tmd.partitions)
        return marker_partition(sink_id, self.shared.marker_partitions)

    def _producer_error(self, txn: KafkaTransaction, what: str,
                        exc: BaseException) -> BaseException:
        """What to raise for ``exc``, raised by a producer call of ``txn`` while ``what``:
        a Kafka error becomes a TxsinkError naming the participant (FencedError if
        another producer took the id over); anything else is raised as it is."""
        from confluent_kafka import KafkaError, KafkaException

        if not isinstance(exc, (KafkaException, SystemError)):
            return exc
        if isinstance(exc, SystemError):
            # A fatal error (fenced) raised inside flush/poll while a Python callback
            # was still due: confluent-kafka reports a SystemError, usually caused by
            # it; sometimes the cause is lost, and the delivery reports say what it was.
            if isinstance(exc.__cause__, KafkaException):
                exc = exc.__cause__
            else:
                assert txn.producer is not None
                with contextlib.suppress(Exception):
                    txn.producer.poll(0)  # the delivery reports still due
                if not txn.errors:
                    raise exc
                return self._delivery_error(txn)
        text = self.shared.redact(str(exc))
        ctx = txn.ctx
        if isinstance(exc, KafkaException) and exc.args:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError._FATAL and (
                    txn.producer is not None):
                # "Local: Fatal error" says only that the producer is in the fatal
                # state. confluent-kafka raises the cause from the next poll (instead of
                # calling error_cb), and the delivery reports due may say it too.
                try:
                    txn.producer.poll(0)
                except:  # noqa: E722 - see _raised
                    cause = raised()
                    if not isinstance(cause, KafkaException):
                        raise
                    fatal = cause.args[0] if cause.args else None
                    if isinstance(fatal, KafkaError) and fatal.code() != KafkaError._FATAL:
                        return self._producer_error(txn, what, cause)
                if txn.fatal:
                    return self._delivery_error(txn)
            if isinstance(err, KafkaError) and err.code() in (
                    KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                    KafkaError.INVALID_PRODUCER_EPOCH):
                return FencedError(
                    f"{txn.describe()}: transactional.id {txn.transactional_id!r} was fenced "
                    f"while {what}: another producer took it over. Two queries writing with "
                    f"sink id {ctx.sink_id!r}? A sink id must be used by one query only.",
                    sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)
            if isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
                return ConfigError(
                    f"kafka sink: kafka.transaction.timeout.ms="
                    f"{self.config.transaction_timeout_ms} is above the broker's "
                    "transaction.max.timeout.ms", field="kafka.transaction.timeout.ms",
                    sink_id=ctx.sink_id)
        return TxsinkError(f"{txn.describe()}: {what} failed: {text}", sink_id=ctx.sink_id,
                           epoch=ctx.epoch, participant=ctx.participant)

    def _producer_key(self, ctx: TransactionContext) -> tuple[Any, ...]:
        """What a kept producer must match: cluster, settings, sink and partition (a
        pooled id names both)."""
        return (connection_key(self.config), tuple(sorted(
            (k, repr(v)) for k, v in self.config.producer.items())),
            self.config.transaction_timeout_ms, self.config.transactional_id_prefix,
            ctx.sink_id, ctx.partition)

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        """Open the participant in a background thread; write() waits for it.

        The open (slot probe, producer, init_transactions, begin marker) is 25-35 ms
        for a new producer; in a Spark task it overlaps with the JVM handing over the
        partition's first Arrow batch.
        """
        txn = KafkaTransaction(ctx, "")
        thread = threading.Thread(target=self._open_in_background, args=(txn,),
                                  name=f"txsink-kafka-open-{ctx.participant}", daemon=True)
        txn.opening = thread
        thread.start()
        return txn

    def begin_salvage(self, ctx: TransactionContext) -> KafkaTransaction:
        """Open, here and now, the transaction of a salvage replacement ``ctx`` (on the
        driver): its own per-participant id, never a pooled one, so it takes no slot a
        writer may be probing, and an unrecorded one is fenced as an orphan like any."""
        txn = KafkaTransaction(ctx, participant_id(self.config.transactional_id_prefix, ctx))
        txn.broker_transaction_version = PROCESS.broker_transaction_version(self.config)
        try:
            self._begin_new(txn, txn.transactional_id)
        except BaseException:
            self.discard(txn)
            raise
        return txn

    def write_records(self, txn: KafkaTransaction, records: Iterable[LogRecord]) -> None:
        """Produce ``records`` as they are into the open transaction ``txn``."""
        producer = txn.producer
        assert producer is not None
        if txn.errors:
            raise self._delivery_error(txn)
        try:
            for r in records:
                kwargs: dict[str, Any] = {"partition": r.partition}
                if r.headers:
                    kwargs["headers"] = list(r.headers)
                if r.timestamp is not None:
                    kwargs["timestamp"] = r.timestamp
                try:
                    producer.produce(r.topic, r.value, r.key, **kwargs)
                except BufferError:
                    self._produce_when_room(txn, r.topic, r.value, r.key, **kwargs)
                txn.topics.add(r.topic)
                txn.rows += 1
            producer.poll(0)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "producing", raised()) from None

    def _open_in_background(self, txn: KafkaTransaction) -> None:
        from confluent_kafka import KafkaException

        started = time.perf_counter()
        try:
            self._open(txn)
        except:  # noqa: E722 - see _raised; handed to the task's thread by _opened
            error = raised()
            if isinstance(error, KafkaException):
                error = self._producer_error(txn, "starting the transaction", error)
            txn.open_error = error
        finally:
            # The participant's fixed cost, kept in its committable for status and
            # benchmarks.
            txn.open_ms = (time.perf_counter() - started) * 1000

    def _opened(self, txn: KafkaTransaction, *, raise_error: bool = True) -> None:
        """Wait for the background open of ``txn``; raise what it raised."""
        thread = txn.opening
        if thread is not None:
            waited = time.perf_counter()
            thread.join()
            txn.opening = None
            txn.open_wait_ms = (time.perf_counter() - waited) * 1000
        if raise_error and txn.open_error is not None:
            raise txn.open_error

    def _open(self, txn: KafkaTransaction) -> None:
        ctx = txn.ctx
        txn.broker_transaction_version = PROCESS.broker_transaction_version(self.config)
        if self.config.naming == "pooled":
            # The kept producer's slot is not probed: it has no open transaction unless
            # another writer took the id over since, which fenced the kept producer,
            # and its first write (the begin marker) fails; then the slot is probed.
            # One initialised ahead of need (warm_ahead) may still be on its way: wait for
            # it rather than probe now and race it for a slot.
            holder = _take_producer(self._producer_key(ctx), wait_s=(
                self.config.request_timeout_s + self.config.retry_bound_s))
            if holder is not None and self._begin_reused(txn, holder):
                return
        self._begin_new(txn, self._choose_id(ctx))

    def _begin_reused(self, txn: KafkaTransaction, holder: _WriterProducer) -> bool:
        """Begin on a producer kept from an earlier task: no new producer, no
        init_transactions. False (producer dropped) if it cannot go on, e.g. fenced
        by a writer elsewhere that took the id over."""
        from confluent_kafka import KafkaException

        producer = holder.producer
        assert producer is not None and holder.marker_partition is not None
        txn.transactional_id = holder.transactional_id
        self._attach(txn, holder)
        txn.reused = True
        txn.marker_partition = holder.marker_partition
        try:
            producer.begin_transaction()
            self._write_begin_marker(txn)
        except:  # noqa: E722 - see _raised
            exc = raised()
            if not isinstance(exc, (KafkaException, TxsinkError)):
                raise
            log.info("%s: the producer kept for transactional.id=%s cannot go on (%s); "
                     "opening a new one", txn.describe(), txn.transactional_id,
                     self.shared.redact(str(exc)))
            with contextlib.suppress(Exception):
                producer.abort_transaction(self.config.request_timeout_s)
            _drop_producer(holder)
            txn.producer, txn.holder, txn.reused = None, None, False
            txn.errors.clear()
            txn.fatal = False
            txn.capture = _PidCapture()
            return False
        PRODUCER_COUNTS["reused"] += 1
        log.debug("%s: transaction open on the kept producer of transactional.id=%s",
                  txn.describe(), txn.transactional_id)
        return True

    @staticmethod
    def _attach(txn: KafkaTransaction, holder: _WriterProducer) -> KafkaTransaction:
        holder.txn = txn
        txn.holder = holder
        txn.producer = holder.producer
        txn.capture = holder.capture
        return txn

    def _begin_new(self, txn: KafkaTransaction, tid: str) -> None:
        txn.transactional_id = tid
        holder = _WriterProducer(self._producer_key(txn.ctx), tid)
        txn.capture = holder.capture
        try:
            self._initialise(holder, txn.ctx)
            self._attach(txn, holder)
            assert holder.producer is not None
            txn.marker_partition = holder.marker_partition or 0
            holder.producer.begin_transaction()
        except:  # noqa: E722 - see _raised
            txn.producer, txn.holder = holder.producer, holder
            raise self._producer_error(txn, "starting the transaction", raised()) from None
        self._write_begin_marker(txn)
        log.debug("%s: transaction open as transactional.id=%s", txn.describe(),
                  txn.transactional_id)

    def warm_ahead(self, ctx: TransactionContext) -> None:
        """exactly_once: initialise, in the background, the producer the next participant
        of ``ctx``'s sink and partition in this process will begin on.

        A prepared participant's producer cannot begin again (the driver ends its
        transaction), so each participant needs a producer whose ``init_transactions``
        is done: doing that now, between tasks, takes it off the next task's critical
        path, which then only begins a transaction and writes its begin marker. The id
        is picked as for any participant (a pooled slot with no open transaction, so no
        prepared participant is ever fenced); a writer elsewhere that takes the slot
        meanwhile fences this idle producer, and the next task notices at its marker and
        opens a new one (:meth:`_begin_reused`)."""
        if self.config.naming != "pooled" or not self.config.warm_ahead:
            return
        key = self._producer_key(ctx)
        with _PRODUCERS_LOCK:
            if key in _PRODUCERS or key in _WARMING:
                return
            done = _WARMING[key] = threading.Event()
        thread = threading.Thread(target=self._warm, args=(ctx, key, done),
                                  name=f"txsink-kafka-warm-{ctx.sink_id}-p{ctx.partition}",
                                  daemon=True)
        thread.start()

    def _warm(self, ctx: TransactionContext, key: tuple[Any, ...],
              done: threading.Event) -> None:
        holder: _WriterProducer | None = None
        try:
            for _ in range(3):
                # The next participant's context is unknown yet: probe as this partition's.
                tid = self._choose_id(ctx, ahead=True)
                seen = self._describe(tid)
                holder = _WriterProducer(key, tid)

                def unchanged(tid: str = tid, seen: TransactionInfo | None = seen) -> None:
                    """Right before init_transactions: the slot is as the probe found it
                    (no transaction open, no producer initialised on it since). What is
                    left is one round trip in which another writer could begin on it."""
                    now = self._describe(tid)
                    if now is not None and (now.is_open or seen is None
                                            or now.identity != seen.identity):
                        raise _SlotTaken(tid)

                try:
                    self._initialise(holder, ctx, before_init=unchanged)
                except _SlotTaken:
                    _drop_producer(holder)
                    holder = None
                    continue
                break
            if holder is None:
                return  # every slot it found was taken meanwhile: the next task opens one
            deadline = time.monotonic() + self.config.request_timeout_s
            while holder.capture.identity is None and time.monotonic() < deadline:
                assert holder.producer is not None
                holder.producer.poll(0.01)
            if holder.capture.identity is None:
                raise TxsinkError("librdkafka did not report the producer id")
            PRODUCER_COUNTS["warmed"] += 1
            _keep_producer(holder)
            log.debug("%s: a producer for transactional.id=%s is ready for the next "
                      "participant", ctx.describe(), holder.transactional_id)
        except:  # noqa: E722 - see _raised; the next task opens its own producer
            log.info("%s: initialising a producer ahead of need failed (%s); the next "
                     "participant opens its own", ctx.describe(),
                     self.shared.redact(str(raised())))
            if holder is not None:
                _drop_producer(holder)
        finally:
            with _PRODUCERS_LOCK:
                if _WARMING.get(key) is done:
                    del _WARMING[key]
            done.set()

    def _describe(self, tid: str) -> TransactionInfo | None:
        return retry_transient(lambda: self.shared.txn_client().describe_transactions(
            [tid]).get(tid), what=f"describing {tid}", bound_s=self.config.retry_bound_s,
            redact=self.shared.redact)

    def _initialise(self, holder: _WriterProducer, ctx: TransactionContext, *,
                    before_init: Callable[[], None] | None = None) -> None:
        """A new producer for ``holder``'s id with ``init_transactions`` done (no
        transaction begun); ``before_init`` runs right before that, and may refuse."""
        from confluent_kafka import Producer

        tid = holder.transactional_id
        # A private logger (not in logging's registry, so none accumulates per participant)
        # that only captures the producer id.
        logger = logging.Logger(f"txsink_kafka.librdkafka.{tid}")  # noqa: LOG001
        logger.addHandler(holder.capture)
        conf: dict[str, Any] = {
            "queue.buffering.max.kbytes": 32768,
            "linger.ms": 20,
            # librdkafka holds back a connection to a broker the metadata named for
            # half of this (default 100 ms): ~50 ms of every new producer's open.
            # Reconnects after failures still back off exponentially.
            "reconnect.backoff.ms": 20,
            **self.config.producer,
            "transactional.id": tid,
            "transaction.timeout.ms": self.config.transaction_timeout_ms,
            "debug": "eos",
            "logger": logger,
            "on_delivery": holder.on_delivery,
        }
        timeout = self.config.request_timeout_s
        holder.producer = Producer(conf)
        producer = holder.producer
        holder.marker_partition = self._marker_partition(producer, ctx.sink_id)
        if before_init is not None:
            before_init()
        retry_transient(lambda: producer.init_transactions(timeout),
                        what=f"{ctx.describe()}: init_transactions of {tid}",
                        bound_s=self.config.retry_bound_s, redact=self.shared.redact)
        PRODUCER_COUNTS["init_transactions"] += 1

    def _write_begin_marker(self, txn: KafkaTransaction) -> None:
        """The first record of the transaction: its commit marker and its trace for scans."""

        ctx = txn.ctx
        assert txn.producer is not None
        txn.marker_topic = self.config.marker_topic
        # poll() serves librdkafka's log queue, where the producer id is announced
        # (init_transactions has acquired it; its log line can come late under load).
        # A marker without it could not be told from a later use of a pooled id, and
        # fencing its orphan could abort that later use: no marker, no data, then.
        deadline = time.monotonic() + self.config.request_timeout_s
        while txn.capture.identity is None and time.monotonic() < deadline:
            txn.producer.poll(0.01)
        if txn.capture.identity is None:
            raise TxsinkError(
                f"{txn.describe()}: librdkafka did not report the producer id of "
                f"transactional.id {txn.transactional_id!r} within "
                f"{self.config.request_timeout_s:.0f}s (its 'eos' debug log has no "
                "'Acquired PID' line); the task fails before writing and is retried",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)
        identity = txn.capture.identity
        key, value = Marker(BEGIN, txn.transactional_id, ctx.sink_id, ctx.epoch,
                            ctx.partition, ctx.attempt, producer_id=identity.producer_id,
                            producer_epoch=identity.producer_epoch).encode()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                txn.marker_offset = msg.offset() or 0
            else:
                txn.on_delivery(err, msg)

        try:
            txn.producer.produce(txn.marker_topic, value, key, txn.marker_partition,
                                 on_delivery=delivered)
            # Wait for it: data must never reach the broker before the marker does,
            # or a crash could leave an open transaction no scan can find.
            remaining = txn.producer.flush(self.config.request_timeout_s)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "writing the marker record", raised()) from None
        if remaining or txn.marker_offset < 0:
            raise TxsinkError(
                f"{txn.describe()}: the marker record to {txn.marker_topic!r} was not "
                f"delivered within {self.config.request_timeout_s:.0f}s"
                + (f": {txn.errors[0]}" if txn.errors else ""),
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, KafkaTransaction)
        self._opened(txn)
        started = time.perf_counter()
        try:
            self._write(txn, batch)
        finally:
            txn.write_s += time.perf_counter() - started

    def _write(self, txn: KafkaTransaction, batch: pa.RecordBatch) -> None:
        assert txn.producer is not None
        if txn.errors:
            raise self._delivery_error(txn)
        names = batch.schema.names
        if "value" not in names:
            raise ConfigError(
                f"kafka sink: the data has no 'value' column (columns: {', '.join(names)}); "
                "like Spark's Kafka sink it writes columns key, value, and optionally topic, "
                "partition, headers", field="value", sink_id=txn.ctx.sink_id)
        n = batch.num_rows
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in names else [None] * n
        fixed = self.config.topic
        if fixed is None and "topic" not in names:
            raise ConfigError(
                "kafka sink: no topic: set the 'topic' option or add a 'topic' column",
                field="topic", sink_id=txn.ctx.sink_id)
        topics = [fixed] * n if fixed is not None else batch.column("topic").to_pylist()
        parts = batch.column("partition").to_pylist() if "partition" in names else None
        headers = batch.column("headers").to_pylist() if "headers" in names else None
        producer = txn.producer
        produce = producer.produce
        # The group's epoch on every record (epoch.header), for readers of a cut.
        epoch_header: list[tuple[str, str | bytes | None]] | None = (
            [(EPOCH_HEADER, str(txn.ctx.epoch).encode())] if self.config.epoch_header
            else None)
        try:
            if parts is None and headers is None and fixed is not None:
                if epoch_header is not None:
                    for k, v in zip(keys, values, strict=True):
                        try:
                            produce(fixed, v, k, headers=epoch_header)
                        except BufferError:
                            self._produce_when_room(txn, fixed, v, k, headers=epoch_header)
                else:
                    for k, v in zip(keys, values, strict=True):
                        try:
                            produce(fixed, v, k)
                        except BufferError:
                            self._produce_when_room(txn, fixed, v, k)
                txn.topics.add(fixed)
            else:
                for i in range(n):
                    topic = topics[i]
                    if topic is None:
                        raise ConfigError(f"kafka sink: row {i} of a batch has a null topic",
                                          field="topic", sink_id=txn.ctx.sink_id)
                    kwargs: dict[str, Any] = {}
                    row_partition = parts[i] if parts is not None else None
                    if row_partition is not None:
                        kwargs["partition"] = int(row_partition)
                    row_headers = headers[i] if headers is not None else None
                    if row_headers:
                        kwargs["headers"] = [(h["key"], h["value"]) for h in row_headers]
                    if epoch_header is not None:
                        kwargs["headers"] = [*kwargs.get("headers", ()), *epoch_header]
                    try:
                        produce(topic, values[i], keys[i], **kwargs)
                    except BufferError:
                        self._produce_when_room(txn, topic, values[i], keys[i], **kwargs)
                    txn.topics.add(topic)
            producer.poll(0)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "producing", raised()) from None
        txn.rows += n

    def _produce_when_room(self, txn: KafkaTransaction, topic: str, value: Any, key: Any,
                           **kwargs: Any) -> None:
        """Produce once librdkafka's local queue has room again.

        The queue fills when the broker takes records slower than the task makes them
        (a loaded machine, a slow disk): deliveries drain it, so poll until they do,
        bounded by the window the sink rides out an unavailable broker for.
        """
        producer = txn.producer
        assert producer is not None
        window = self.config.retry_bound_s
        deadline = time.monotonic() + window
        while True:
            producer.poll(0.05)
            try:
                producer.produce(topic, value, key, **kwargs)
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise TxsinkError(
                        f"{txn.describe()}: the producer's local queue stayed full for "
                        f"{window:.0f}s: the broker took no records in that time; the task "
                        "fails and is retried", sink_id=txn.ctx.sink_id, epoch=txn.ctx.epoch,
                        participant=txn.ctx.participant) from None

    def _delivery_error(self, txn: KafkaTransaction) -> TxsinkError:
        ctx = txn.ctx
        first = self.shared.redact(txn.errors[0])
        if txn.fatal or "fence" in first.lower():
            return FencedError(
                f"{txn.describe()}: transactional.id {txn.transactional_id!r} was fenced: "
                f"{first}. Two queries writing with sink id {ctx.sink_id!r}?",
                sink_id=ctx.sink_id, epoch=ctx.epoch, participant=ctx.participant)
        hint = (" (missing topic? txsink does not create output topics)"
                if "Unknown topic" in first or "UNKNOWN_TOPIC" in first else "")
        return TxsinkError(f"{txn.describe()}: {len(txn.errors)} record(s) were not delivered; "
                           f"first: {first}{hint}", sink_id=ctx.sink_id, epoch=ctx.epoch,
                           participant=ctx.participant)

    def _flush(self, txn: KafkaTransaction) -> None:
        """Wait until every record of ``txn`` is acknowledged; raise on any failure."""

        assert txn.producer is not None
        producer = txn.producer
        deadline = time.monotonic() + max(self.config.request_timeout_s,
                                          self.config.transaction_timeout_ms / 2000)
        try:
            while producer.flush(1.0) > 0:
                if txn.errors:
                    break
                if time.monotonic() > deadline:
                    raise TxsinkError(f"{txn.describe()}: records were not acknowledged "
                                      "before the flush deadline", sink_id=txn.ctx.sink_id,
                                      epoch=txn.ctx.epoch, participant=txn.ctx.participant)
            producer.poll(0)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "flushing", raised()) from None
        if txn.errors:
            raise self._delivery_error(txn)

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, KafkaTransaction)
        self._opened(txn)
        assert txn.producer is not None
        producer = txn.producer
        flushing = time.perf_counter()
        self._flush(txn)
        txn.flush_s = time.perf_counter() - flushing
        identity = txn.capture.identity
        if identity is None:
            raise TxsinkError(
                f"{txn.describe()}: librdkafka did not report the producer id of "
                f"transactional.id {txn.transactional_id!r} (its 'eos' debug log has no "
                "'Acquired PID' line); this librdkafka version is not supported",
                sink_id=txn.ctx.sink_id, epoch=txn.ctx.epoch,
                participant=txn.ctx.participant)
        payload = {
            "transactional_id": txn.transactional_id,
            "producer_id": identity.producer_id,
            "producer_epoch": identity.producer_epoch,
            "transaction_version": TRANSACTION_VERSION,
            "broker_transaction_version": txn.broker_transaction_version,
            "topics": sorted(txn.topics),
            "ranges": encode_ranges(txn.ranges),
            "marker": {"topic": txn.marker_topic, "partition": txn.marker_partition,
                       "offset": txn.marker_offset},
            "transaction_timeout_ms": self.config.transaction_timeout_ms,
            "began_at": round(txn.began_at, 3),
            "prepared_at": round(time.time(), 3),
            "open_ms": round(txn.open_ms, 1),
            "open_wait_ms": round(txn.open_wait_ms, 1),
            "write_ms": round(txn.write_s * 1000, 1),
            "flush_ms": round(txn.flush_s * 1000, 1),
            # Begun on a producer opened ahead of need (producer.init.ahead).
            "reused_producer": txn.reused,
        }
        committable = Committable.for_context(NAME, txn.ctx, payload, rows=txn.rows,
                                              payload_version=PAYLOAD_VERSION)
        warn_near_timeout(committable)  # a long write already eats into the timeout
        # Close without aborting: the transaction stays open for the driver's EndTxn.
        # librdkafka cannot begin again on a producer whose transaction another
        # process ended, so it is never kept (docs/backends/kafka.md).
        txn.producer = None
        if txn.holder is not None:
            _drop_producer(txn.holder)
        del producer
        log.debug("%s: prepared transactional.id=%s producer_id=%d epoch=%d rows=%d",
                  txn.describe(), txn.transactional_id, identity.producer_id,
                  identity.producer_epoch, txn.rows)
        if is_pooled(self.config.transactional_id_prefix, txn.transactional_id):
            self.warm_ahead(txn.ctx)
        return committable

    def finish_in_task(self, txn: Transaction, guarantee: DeliveryGuarantee) -> Committable:
        """at_least_once / none: the task commits its own transaction, with the end
        marker in it, and keeps the producer for its worker's next task.

        Not the driver's EndTxn: librdkafka can begin again only on a producer that
        ended its last transaction itself, so keeping it saves the next task a new
        producer and ``init_transactions``. Only pooled ids are kept (a per-participant
        id is never used again).
        """

        assert isinstance(txn, KafkaTransaction)
        self._opened(txn)
        assert txn.producer is not None
        producer = txn.producer
        ctx = txn.ctx
        self._flush(txn)
        identity = txn.capture.identity or ProducerIdentity(-1, -1)
        # In the transaction: scans see the participant ended exactly when its data
        # became visible (or, if the commit fails, discard() writes an aborted end).
        key, value = Marker(END, txn.transactional_id, ctx.sink_id, ctx.epoch,
                            ctx.partition, ctx.attempt, producer_id=identity.producer_id,
                            producer_epoch=identity.producer_epoch,
                            outcome=COMMITTED).encode()
        try:
            producer.produce(txn.marker_topic, value, key, txn.marker_partition)
            producer.commit_transaction(self.config.request_timeout_s)
        except:  # noqa: E722 - see _raised
            raise self._producer_error(txn, "committing in the task", raised()) from None
        if txn.errors:  # pragma: no cover - commit_transaction raises first
            raise self._delivery_error(txn)
        txn.producer = None
        holder = txn.holder
        if holder is not None:
            pooled = is_pooled(self.config.transactional_id_prefix, txn.transactional_id)
            if pooled and not txn.fatal:
                _keep_producer(holder)
            else:
                _drop_producer(holder)
        log.debug("%s: committed transactional.id=%s in the task (%s), %d rows",
                  txn.describe(), txn.transactional_id, guarantee.value, txn.rows)
        payload = {"direct": True, "transactional_id": txn.transactional_id,
                   "producer_id": identity.producer_id,
                   "producer_epoch": identity.producer_epoch, "topics": sorted(txn.topics),
                   "open_ms": round(txn.open_ms, 1),
                   "open_wait_ms": round(txn.open_wait_ms, 1),
                   "reused_producer": txn.reused}
        return Committable.for_context(NAME, ctx, payload, rows=txn.rows,
                                       payload_version=PAYLOAD_VERSION)

    def discard(self, txn: Transaction) -> None:
        from confluent_kafka import KafkaException

        assert isinstance(txn, KafkaTransaction)
        self._opened(txn, raise_error=False)
        producer, txn.producer = txn.producer, None
        if txn.holder is not None:
            _drop_producer(txn.holder)  # never kept after a failure
        if producer is None or txn.open_error is not None:
            # Never opened (as before, when begin_transaction raised): an open
            # transaction it may have left is found by the orphan scans.
            return
        timeout = self.config.request_timeout_s
        try:
            producer.abort_transaction(timeout)
            # A fresh (committed) transaction carrying only the end marker, so scans
            # know this participant is over.
            producer.begin_transaction()
            identity = txn.capture.identity or ProducerIdentity(-1, -1)
            key, value = Marker(END, txn.transactional_id, txn.ctx.sink_id, txn.ctx.epoch,
                                txn.ctx.partition, txn.ctx.attempt,
                                producer_id=identity.producer_id,
                                producer_epoch=identity.producer_epoch,
                                outcome=ABORTED).encode()
            producer.produce(txn.marker_topic, value, key, txn.marker_partition)
            producer.commit_transaction(timeout)
        except:  # noqa: E722 - see _raised
            exc = raised()
            if not isinstance(exc, KafkaException):
                raise
            log.warning("%s: discarding transactional.id=%s failed: %s; orphan cleanup "
                        "will fence it", txn.describe(), txn.transactional_id,
                        self.shared.redact(str(exc)))

