"""The model-based test of the native path (see :mod:`tests.operations_native`): a few
hundred sequences in the default run, thousands in ``tox -e operations-long``; and the
counterexamples it found, as regression tests. Each drives the model's own steps, strict
(a known failure fails instead of being discarded)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from txsink.faults import AFTER_DECIDE

from tests.operations_native import BACKFILL_BASE, Frame, NativeModel, settings_for

TestNative = NativeModel.TestCase
TestNative.settings = settings(**settings_for(300))


class _Draw:
    """The draws of one recorded step, in order (hypothesis's ``data`` stand-in)."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.values.pop(0)


@pytest.fixture
def native() -> Iterator[NativeModel]:
    model = NativeModel()
    model.strict = True
    yield model
    model.teardown()


@pytest.mark.parametrize(("path", "inside"), [
    ("native", True), ("native", False), ("grouped", False),
    # Grouped writes with version=batch_id on a state that went back with the checkpoint:
    # refused (the targets hold more epochs than the state knows), the newest checkpoint
    # is put back, and the stream goes on.
    ("grouped", True)])
def test_a_batch_spark_plans_anew_after_a_restored_checkpoint_is_not_skipped(
        native: NativeModel, path: str, inside: bool) -> None:
    """Found by the model: batch 0 commits (record 0); a copy of the checkpoint is taken;
    batch 1 commits (record 1); the copy is restored. Spark's restored offset log ends at
    batch 0, committed, so it plans batch 1 anew, over records 1-2; txsink took it for a
    replay of the batch 1 the state (kept beside) or the targets (the state inside went
    back with the copy) hold, skipped it, and record 2 was lost without an error.
    Spark's planning: MicroBatchExecution.populateStartOffsets re-runs only the last
    batch of the offset log the commit log lacks; later ones are constructed from the
    source's latest offsets. Now the batch's offsets (Spark's offset log entry) are kept
    with the epoch in the state and noted in the targets: other offsets under the same
    number are refused naming the restored checkpoint, the model puts the newest copy
    back, and every record is there once."""
    native.choose("files group", path, inside)
    native.stream(n=1, grow=1, kill=None, misplace=False)
    native.copy_checkpoint()
    native.stream(n=1, grow=1, kill=None, misplace=False)
    native.restore_checkpoint(_Draw(native.copies[0]))  # type: ignore[arg-type]


def test_a_batch_planned_anew_is_not_skipped_as_a_version_grouped_writes_committed(
        native: NativeModel) -> None:
    """Found by the model in CI: batch 0 runs as a grouped write (``version=0``), batch 1
    through ``write_stream`` (no rows), then a copy of the checkpoint taken before batch
    0 is restored. Spark plans batch 0 anew over records 0-1; the stream's batch found
    version 0 committed by the grouped writes and skipped it as their replay without
    comparing offsets, and record 1 was lost. The offsets are compared there too: refused
    naming the restored checkpoint, and the newest copy put back writes every record
    once."""
    native.choose("files", "grouped", False)
    native.copy_checkpoint()
    native.backfill(same_driver=False, kill=None)
    native.other_path(path="native", grow=0)
    native.restore_checkpoint(_Draw(native.copies[0]))  # type: ignore[arg-type]


@pytest.mark.promise("replanned-batch-refused", "datasource")
def test_a_batch_spark_plans_anew_on_the_data_source_is_not_skipped(
        native: NativeModel) -> None:
    """The same on txsink's data source (files targets streamed through it): refused at
    the commit, its participants rolled back."""
    native.choose("files", "native", False)
    native.path = "datasource"
    native.stream(n=1, grow=1, kill=None, misplace=False)
    native.copy_checkpoint()
    native.stream(n=1, grow=1, kill=None, misplace=False)
    native.restore_checkpoint(_Draw(native.copies[0]))  # type: ignore[arg-type]


@pytest.mark.promise("cleaned-history-restored-state-stops", "native")
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_checkpoint_restored_after_the_table_history_was_cleaned_names_the_newest_copy(
        native: NativeModel, kind: str) -> None:
    """Found by the model (400 sequences of every kind): batch 0 commits, a copy of the
    checkpoint is taken (the state inside), batch 1 commits, the table's history is
    cleaned (Delta log cleanup, Iceberg snapshot expiry), the copy is restored. The
    restored state does not know epoch 1 and asks the table, whose history no longer
    tells: refused, but the refusal's only way out was the retention to raise for next
    time. It names the checkpoint's newest copy too, which knows the epoch: the model
    puts it back, and every record is there once."""
    native.choose(kind, "native", True)
    native.restart()
    native.copy_checkpoint()
    native.restart()
    native.maintain("expire", then=False)
    native.restore_checkpoint(_Draw(native.copies[0]))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["iceberg", "iceberg group"])
def test_a_lost_iceberg_catalog_stops_the_stream_until_the_table_is_registered_again(
        native: NativeModel, kind: str) -> None:
    """Found by the model (issue 39 item 11, fixed in the Iceberg backend since): batch 0
    commits into the Iceberg table; the catalog's SQLite file is deleted; the next batch
    committed into a new, empty table at the same place, and record 0 was gone for
    readers. Now the start is refused naming the lost catalog entry; the model registers
    the table again, as the refusal says, and every record is there once."""
    native.choose(kind, "native", False)
    native.stream(n=1, grow=1, kill=None, misplace=False)
    native.maintain("lose the catalog")


def test_a_new_checkpoint_after_orphan_file_removal_is_refused(native: NativeModel) -> None:
    """Found by the model (issue 39 item 11, fixed in the Iceberg backend since): two
    batches into an Iceberg table, the state inside the checkpoint; orphan-file removal
    (every file under the table that its metadata does not name) deleted the sink's
    ownership file; the checkpoint is deleted and the query starts on a new one from the
    earliest records: nothing refused the new state, and records 0-1 landed twice. Now
    the claim outlives maintenance: refused naming the table's owner, and the model
    puts the old checkpoint back."""
    native.choose("iceberg", "native", True)
    native.stream(n=2, grow=1, kill=None, misplace=False)
    native.maintain("vacuum", then=False)
    native.replace_checkpoint(earliest=True)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
@pytest.mark.parametrize("op", ["compact", "vacuum", "expire"])
@pytest.mark.parametrize("in_doubt", [False, True], ids=["at rest", "an epoch decided"])
def test_table_maintenance_between_batches_leaves_every_record_once(
        native: NativeModel, kind: str, op: str, in_doubt: bool) -> None:
    """The model's maintenance between batches, one by one: compaction by another writer,
    vacuum / orphan-file removal, log cleanup / snapshot expiry; at rest, or while an
    epoch is decided and not committed (its driver was killed right after the
    decision): the next start finishes it, or stops naming the way out."""
    native.choose(kind, "native", True)
    native.stream(n=2, grow=1, kill=None, misplace=False)
    if in_doubt:
        assert native.batch("native", grow=1, kill=AFTER_DECIDE) == "killed"
    native.maintain(op)
    native.stream(n=2, grow=2, kill=None, misplace=False)


@pytest.mark.parametrize("path", ["native", "datasource"])
@pytest.mark.parametrize("first", ["grouped", "backfill"])
def test_a_stream_whose_state_went_back_to_before_its_binding_writes_nothing_twice(
        native: NativeModel, path: str, first: str) -> None:
    """Found by the model: a batch write first (a grouped write of batch 0, or a
    backfill), a copy of the checkpoint (the state inside), then the stream's first batch
    binds the state (its micro-batch b is epoch stream_from + b) and commits record 0;
    the copy is restored. The restored state knows the batch write's epoch and no stream:
    the stream bound it again above every epoch the targets hold, so Spark's next batch
    (record 0 again, with record 1) became a new epoch and record 0 was written twice.
    The targets hold epochs the state does not know: refused, like a versioned write on
    such a state (the model puts the newest checkpoint back and the stream goes on)."""
    native.choose("files group", path, True)
    if first == "grouped":
        native.other_path("grouped", grow=0)
    else:  # TargetSet.write of other records, before the stream's first batch
        ids = [BACKFILL_BASE + 1, BACKFILL_BASE + 2]
        assert native.group is not None
        native.group.write(Frame(ids, None))  # type: ignore[arg-type]
        native.deliver(ids)
    native.copy_checkpoint()
    native.restart()
    native.restore_checkpoint(_Draw(native.copies[0]))  # type: ignore[arg-type]


@pytest.mark.parametrize("inside", [False, True])
def test_a_refused_first_batch_of_a_replaced_checkpoint_leaves_the_state_as_it_was(
        native: NativeModel, inside: bool) -> None:
    """Found by the 2,000-sequence run: a grouped write of batch 0 (``version=0``) by
    query q-0; the checkpoint is replaced (query q-1) and the stream goes on through
    ``write_stream``. Its batch 0 is refused (q-0 wrote version 0:
    ``CheckpointChangedError``, restore the checkpoint), but the refused start had bound
    the state to q-1 first; so the way out, q-0's checkpoint put back, was refused too
    ("the state belongs to the Spark query q-1"): nothing could go on. A refused batch
    binds nothing."""
    native.choose("files", "native", inside)
    native.other_path("grouped", grow=0)
    native.replace_checkpoint(earliest=False)


@pytest.mark.promise("checkpoint-replaced-refused", "datasource")
def test_a_grouped_batch_write_then_a_replaced_checkpoint_writes_nothing_twice(
        native: NativeModel) -> None:
    """Found by the model (files target, the state kept beside the checkpoint): batch 0
    of the stream written with grouped writes (``version=batch_id``), then the
    checkpoint replaced and the new query streamed through the data source from the
    earliest records. The state had no query id of its own (only the versions' query),
    so the new query bound it as a first stream above epoch 0 and wrote record 0 a
    second time; it is refused now (``CheckpointChangedError``), and the model follows
    the way out (the checkpoint put back)."""
    native.choose("files", "datasource", False)
    native.other_path("grouped", 1)
    native.replace_checkpoint(True)
