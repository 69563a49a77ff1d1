"""The adversarial pass over groups (issue 31) through real Spark, on files targets.

Each test is a sequence users run (a backfill, a stream, a batch write between two
runs of it) that must end exact or with a one-line refusal that wrote nothing.
One Spark session (local mode) for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.errors import StateError

from tests.e2e.spark_harness import leftover_files, local_spark, read_files_output

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("txsink-adversarial-groups")


def _ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in read_files_output(path)) if path.exists() else []


@pytest.mark.promise("backfill-then-stream-above", "datasource")
@pytest.mark.promise("batch-into-stream-refused", "datasource")
def test_a_batch_write_beside_a_stream_is_one_line_and_writes_nothing(
        spark: Any, tmp_path: Path) -> None:
    """A backfill, then a stream through the same TargetSet, then another batch write:
    the batch write was refused inside Spark's writer, so the user got a 15-line
    AnalysisException ([PYTHON_DATA_SOURCE_ERROR] ... Traceback ...) instead of the
    one-line refusal and its way out."""
    import txsink.spark as ts

    group = ts.targets("adv", [
        ts.target("all", "files", path=str(tmp_path / "all"), format="jsonl"),
        ts.target("even", "files", path=str(tmp_path / "even"), format="jsonl",
                  where="id % 2 = 0", select=["id"], epoch_column="txsink_epoch"),
    ], checkpoint_location=str(tmp_path / "chk"))
    group.write(spark.range(100, 103))  # the backfill: epoch 0
    source = tmp_path / "in"
    source.mkdir()
    (source / "0.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(4)))
    query = (group.write_stream(spark.readStream.schema("id long").json(str(source)))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(240)
    assert query.exception() is None
    want_all, want_even = [0, 1, 2, 3, 100, 101, 102], [0, 2, 100, 102]
    assert (_ids(tmp_path / "all"), _ids(tmp_path / "even")) == (want_all, want_even)
    with pytest.raises(StateError) as err:
        group.write(spark.range(200, 203))
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    assert "a streaming query writes through this sink's state" in message
    assert "Nothing of this batch write was written" in message
    assert (_ids(tmp_path / "all"), _ids(tmp_path / "even")) == (want_all, want_even)
    assert leftover_files(tmp_path / "all") == leftover_files(tmp_path / "even") == []
    # The stream's epochs follow the backfill's, in every target.
    assert sorted({r["txsink_epoch"] for r in read_files_output(tmp_path / "even")}) == [0, 1]
