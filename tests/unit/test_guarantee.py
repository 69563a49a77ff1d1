"""Delivery guarantees: parsing, what a backend offers, and the writer's two paths."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pytest
from txsink.backend import Backend, CommitOutcome, Transaction
from txsink.errors import ConfigError
from txsink.model import Committable, DeliveryGuarantee, TransactionContext
from txsink.writer import write_participant


class ExactlyOnceOnly(Backend):
    """A third-party backend that declares nothing: it offers exactly_once only."""

    name = "eo-only"

    def __init__(self) -> None:
        self.calls: list[str] = []

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ExactlyOnceOnly:
        return cls()

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        return Transaction(ctx)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        txn.rows += batch.num_rows

    def pre_commit(self, txn: Transaction) -> Committable:
        self.calls.append("pre_commit")
        return Committable.for_context(self.name, txn.ctx, {}, rows=txn.rows)

    def discard(self, txn: Transaction) -> None:
        self.calls.append("discard")

    def commit(self, committable: Committable) -> CommitOutcome:
        self.calls.append("commit")
        return CommitOutcome.COMMITTED

    def abort(self, committable: Committable) -> None:
        self.calls.append("abort")

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        return []


def batch() -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array([1, 2, 3], pa.int64())})


@pytest.mark.parametrize(("text", "expected"), [
    ("exactly_once", DeliveryGuarantee.EXACTLY_ONCE),
    ("AT_LEAST_ONCE", DeliveryGuarantee.AT_LEAST_ONCE),
    ("at-least-once", DeliveryGuarantee.AT_LEAST_ONCE),
    ("none", DeliveryGuarantee.NONE),
])
def test_parse(text: str, expected: DeliveryGuarantee) -> None:
    assert DeliveryGuarantee.parse(text) is expected


def test_parse_names_the_field_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"'sink\.guarantee' must be one of exactly_once, "
                                          r"at_least_once, none") as info:
        DeliveryGuarantee.parse("twice", field_name="sink.guarantee")
    assert info.value.field == "sink.guarantee"


def test_a_backend_offers_exactly_once_unless_it_declares_more() -> None:
    ExactlyOnceOnly.check_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
    with pytest.raises(ConfigError, match=r"'eo-only' does not offer guarantee "
                                          r"'at_least_once' .*offers: exactly_once"):
        ExactlyOnceOnly.check_guarantee(DeliveryGuarantee.AT_LEAST_ONCE)


def test_writer_prepares_for_exactly_once_and_commits_in_the_task_otherwise() -> None:
    backend = ExactlyOnceOnly()
    write_participant(backend, TransactionContext("g", 0, 0), [batch()])
    assert backend.calls == ["pre_commit"]
    backend.calls.clear()
    c = write_participant(backend, TransactionContext("g", 1, 0), [batch()],
                          DeliveryGuarantee.AT_LEAST_ONCE)
    assert backend.calls == ["pre_commit", "commit"]  # the default finish_in_task
    assert c.rows == 3


def test_every_guarantee_explains_what_readers_see() -> None:
    notes = {g: g.reader_note() for g in DeliveryGuarantee}
    assert "once" in notes[DeliveryGuarantee.EXACTLY_ONCE]
    assert "duplicates" in notes[DeliveryGuarantee.AT_LEAST_ONCE]
    assert "lose" in notes[DeliveryGuarantee.NONE]
