"""Pooled ids that live for months: a producer epoch exhausted, the producer id rotated.

Every ``InitProducerId`` on a pooled transactional id bumps its producer epoch (each
exactly-once participant initialises its id once, an orphan's fence once more, a
timeout abort once more); at 32,766 the coordinator gives the id a new producer id
with epoch 0 (KAFKA-18660, KAFKA-20090). At one participant a minute that is three
weeks per pooled id. The test drives one pooled id to just below the end with
``InitProducerId`` sent directly (``txn_protocol``), then runs real epochs across
the rotation with crashes around it: a crash after a decision before it, a decided
participant at the last epoch the broker aborts on timeout (salvaged), the first
writer after the rotation dying after it prepared (an orphan, fenced), a crash after
a decision on the rotated id.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from timeout_helpers import (
    batch,
    committed_values,
    digest,
    kafka_sink,
    new_backend,
    restart,
    tid,
    wait_until_not_open,
)
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink.writer import write_participant
from txsink_kafka import testing as kt
from txsink_kafka.backend import KafkaBackend, close_shared_clients
from txsink_kafka.local_broker import LocalKafka
from txsink_kafka.txn_protocol import ProducerIdentity

from tests.long_runs import kafka_long_run

pytestmark = [pytest.mark.integration, pytest.mark.slow, kafka_long_run]

#: The last producer epoch a producer id gets (Short.MAX_VALUE - 1): the next
#: InitProducerId rotates the id.
LAST_EPOCH = 32766
#: Where the direct InitProducerIds stop; the real participants take it from there.
DRIVE_TO = LAST_EPOCH - 4


def identity_of(c: Committable) -> ProducerIdentity:
    return ProducerIdentity(int(c.payload["producer_id"]), int(c.payload["producer_epoch"]))


@pytest.mark.promise("kafka-producer-id-rotation", "backend")
def test_a_pooled_id_commits_and_recovers_across_its_producer_id_rotation(
        short_timeout_kafka: LocalKafka, tmp_path: Path) -> None:
    bootstrap = short_timeout_kafka.bootstrap
    topic, sink, options, backend = kafka_sink(short_timeout_kafka, "rot", 1)
    state = DirectoryStateStore(tmp_path / "chk" / "txsink")
    expected: list[bytes] = []

    def driver() -> tuple[KafkaBackend, Coordinator]:
        close_shared_clients()  # a new driver process
        b = new_backend(options, sink)
        coord = Coordinator(b, state, sink, plugins=build_plugins(), backend_options=options)
        coord.start()
        return b, coord

    def prepare(b: KafkaBackend, epoch: int, attempt: int = 0) -> Committable:
        ids = range(epoch * 100 + attempt * 10, epoch * 100 + attempt * 10 + 5)
        return write_participant(b, TransactionContext(sink, epoch, 0, attempt), [batch(ids)])

    def values(epoch: int, attempt: int = 0) -> list[bytes]:
        start = epoch * 100 + attempt * 10
        return [b"v%d" % i for i in range(start, start + 5)]

    def crash_after_decide(b: KafkaBackend, epoch: int, c: Committable) -> None:
        coord = Coordinator(b, state, sink, plugins=build_plugins(), backend_options=options,
                            faults=FaultInjector([FaultRule(AFTER_DECIDE, epoch, "raise")]))
        with pytest.raises(InjectedFault):
            coord.commit_epoch(epoch, [c])
        b.close()

    coord = Coordinator(backend, state, sink, plugins=build_plugins(), backend_options=options)
    coord.start()
    c0 = prepare(backend, 0)
    assert coord.commit_epoch(0, [c0]) is EpochOutcome.COMMITTED
    expected += values(0)
    slot = tid(c0)
    before = identity_of(c0)

    # Months of epochs, sent directly: InitProducerId on the idle pooled id.
    client = backend.driver().txn
    timeout_ms = int(options["kafka.transaction.timeout.ms"])
    started = time.perf_counter()
    driven = 0
    identity = before
    while identity.producer_epoch < DRIVE_TO:
        identity = client.init_producer_id(slot, timeout_ms)
        driven += 1
        assert identity.producer_id == before.producer_id
    drive_s = time.perf_counter() - started
    backend.close()

    # Epoch 1 (epoch 32,763 of the id): the driver dies after the decision; recovery.
    b, coord = driver()
    c1 = prepare(b, 1)
    assert (tid(c1), identity_of(c1)) == (slot, ProducerIdentity(before.producer_id,
                                                                  DRIVE_TO + 1))
    crash_after_decide(b, 1, c1)
    restart(options, sink, state)
    expected += values(1)
    # Epochs 2 and 3 (32,764 and 32,765): plain commits.
    b, coord = driver()
    for epoch in (2, 3):
        c = prepare(b, epoch)
        assert identity_of(c) == ProducerIdentity(before.producer_id, DRIVE_TO + epoch)
        assert coord.commit_epoch(epoch, [c]) is EpochOutcome.COMMITTED
        expected += values(epoch)
    # Epoch 4 (32,766, the id's last epoch): decided, then the driver stays down past
    # transaction.timeout.ms; the broker aborts it, bumping the epoch to 32,767.
    c4 = prepare(b, 4)
    assert identity_of(c4) == ProducerIdentity(before.producer_id, LAST_EPOCH)
    crash_after_decide(b, 4, c4)
    check = new_backend(options, sink)
    wait_until_not_open(check, [slot])
    exhausted = check.driver().txn.describe_transactions([slot])[slot]
    check.close()
    assert exhausted is not None
    # Transaction version 1 bumps the epoch to 32,767 (the next InitProducerId rotates
    # the producer id); version 2 (KAFKA-20090) rotates it at the abort already.
    rotated_by_abort = exhausted.producer_id != before.producer_id
    assert rotated_by_abort or exhausted.identity == ProducerIdentity(
        before.producer_id, LAST_EPOCH + 1), exhausted
    restart(options, sink, state)  # salvaged from the log
    record = state.get(4)
    assert record is not None and record.state is EpochState.COMMITTED
    assert [o for _, o in record.salvaged] == [c4.participant]
    expected += values(4)

    # Epoch 5: the first writer after it rotates the producer id, prepares and dies
    # (never reported); its retry takes another slot; the orphan is fenced after the
    # commit, by its new producer id.
    b, coord = driver()
    orphan = prepare(b, 5, attempt=0)
    after = identity_of(orphan)
    assert tid(orphan) == slot and after.producer_id != before.producer_id
    assert after.producer_epoch == (1 if rotated_by_abort else 0)
    retry = prepare(b, 5, attempt=1)
    assert tid(retry) != slot
    assert coord.commit_epoch(5, [retry]) is EpochOutcome.COMMITTED
    expected += values(5, attempt=1)
    fenced = b.driver().txn.describe_transactions([slot])[slot]
    assert fenced is not None and not fenced.is_open
    assert fenced.producer_id == after.producer_id
    # Epoch 6 on the rotated id: the driver dies after the decision; recovery.
    c6 = prepare(b, 6)
    assert (tid(c6), identity_of(c6).producer_id) == (slot, after.producer_id)
    crash_after_decide(b, 6, c6)
    restart(options, sink, state)
    expected += values(6)
    # Epoch 7: a plain commit.
    b, coord = driver()
    c7 = prepare(b, 7)
    assert identity_of(c7).producer_id == after.producer_id
    assert coord.commit_epoch(7, [c7]) is EpochOutcome.COMMITTED
    expected += values(7)
    final = b.driver().txn.describe_transactions([slot])[slot]
    b.close()

    assert all(s is EpochState.COMMITTED for s in state.states().values())
    assert digest(committed_values(bootstrap, topic)) == digest(expected)
    assert kt.broker_open_transactions(bootstrap, f"txsink-{sink}") == {}
    assert kt.unstable_partitions(bootstrap, [topic, options["marker.topic"]]) == {}
    assert final is not None
    print(f"\n{short_timeout_kafka.describe().split(' (')[0]}: {driven:,} "
          f"InitProducerId sent directly in {drive_s:.1f}s ({driven / drive_s:,.0f}/s), "
          f"then 8 epochs across the rotation; producer id {before.producer_id} (epochs "
          f"{before.producer_epoch}..{LAST_EPOCH}) -> {after.producer_id} (rotated by "
          f"{'the timeout abort' if rotated_by_abort else 'the next InitProducerId'}; "
          f"epoch {final.producer_epoch} at the end); {len(expected)} records exactly once")
