"""A group's refusals through real Spark: one line, before any row or claim.

Each test would fail if a group wrote a misrouted or corrupt row, claimed a target's
output before refusing, or buried its refusal in a stack of Spark and pickle frames.
One Spark session (local mode) for the module; files targets, so no servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.errors import ConfigError
from txsink.targets import encode_targets, parse_targets

from tests.e2e.spark_harness import leftover_files, local_spark, read_files_output

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("txsink-group-refusals")


def items(tmp: Path, *names: str) -> list[dict[str, Any]]:
    known = {
        "public": {"name": "public", "backend": "files", "where": "id % 2 = 0",
                   "select": ["id"], "epoch_column": "txsink_epoch",
                   "options": {"path": str(tmp / "public"), "format": "jsonl"}},
        "private": {"name": "private", "backend": "files",
                    "options": {"path": str(tmp / "private"), "format": "jsonl"}},
        "archive": {"name": "archive", "backend": "files",
                    "options": {"path": str(tmp / "archive"), "format": "jsonl"}},
    }
    return [known[n] for n in names]


def frame(spark: Any, n: int = 6) -> Any:
    return spark.range(n).selectExpr("id", "concat('secret-', id) AS secret")


def stream(spark: Any, tmp: Path) -> Any:
    """A streaming frame of the rows 0-5 (one JSON-lines file)."""
    source = tmp / "in"
    if not source.exists():
        source.mkdir()
        (source / "0.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(6)))
    return (spark.readStream.schema("id long").json(str(source))
            .selectExpr("id", "concat('secret-', id) AS secret"))


def nothing_in(tmp: Path, *names: str) -> None:
    for name in names:
        d = tmp / name
        assert not d.exists() or (read_files_output(d) == [] and leftover_files(d) == []), name


@pytest.mark.promise("group-unshaped-frame-refused", "datasource")
def test_the_data_source_refuses_a_frame_not_shaped_for_its_targets(
        spark: Any, tmp_path: Path) -> None:
    """Before: every row and the secret column went to the public target."""
    specs = parse_targets(items(tmp_path, "public", "private"), "grp")
    with pytest.raises(Exception) as info:  # noqa: PT011 - Spark wraps the worker's error
        (frame(spark).write.format("txsink").mode("append")
         .option("sink_id", "grp").option("targets", encode_targets(specs))
         .option("checkpointLocation", str(tmp_path / "chk")).save())
    assert ("targets: target(s) public have select/where, but the frame was not shaped by "
            "the group") in str(info.value)
    nothing_in(tmp_path, "public", "private")


@pytest.mark.promise("group-epoch-column-clash-refused", "datasource", "grouped")
def test_an_epoch_column_named_like_a_rows_column_is_one_line_before_any_job(
        spark: Any, tmp_path: Path) -> None:
    """Before: the JSON lines lost the rows' own value (Parquet: unreadable files)."""
    import txsink.spark as ts

    group = ts.targets("grp", [*items(tmp_path, "private"),
                               {**items(tmp_path, "archive")[0],
                                "epoch_column": "secret"}],
                       checkpoint_location=str(tmp_path / "chk"))
    with pytest.raises(ConfigError) as info:
        group.write(frame(spark))
    assert str(info.value).startswith(
        "targets[archive].epoch_column: the rows of target 'archive' already have a column "
        "'secret'")
    nothing_in(tmp_path, "private", "archive")
    with (pytest.raises(ConfigError, match=r"^targets\[archive\].epoch_column"),
          group.epoch(spark) as tx):
        tx.write(frame(spark), "archive")
    nothing_in(tmp_path, "private", "archive")


@pytest.mark.promise("group-refusal-before-anything", "datasource", "grouped")
@pytest.mark.promise("group-targets-changed-refused", "datasource", "grouped")
def test_changed_targets_are_one_line_and_touch_no_target(spark: Any, tmp_path: Path) -> None:
    """Before: a stream failed with a PicklingError traceback, and a grouped write had
    already claimed the new target's directory when it refused."""
    import txsink.spark as ts

    chk = str(tmp_path / "chk")
    first = ts.targets("grp", items(tmp_path, "public", "private"), checkpoint_location=chk)
    query = first.write_stream(stream(spark, tmp_path)).trigger(availableNow=True).start()
    assert query.awaitTermination(600), "the first run did not end within 600 s"
    assert sorted(r["id"] for r in read_files_output(tmp_path / "public")) == [0, 2, 4]

    changed = ts.targets("grp", items(tmp_path, "public", "archive"), checkpoint_location=chk)
    with pytest.raises(ConfigError) as info:
        changed.write_stream(stream(spark, tmp_path)).trigger(availableNow=True).start()
    message = str(info.value)
    assert "\n" not in message and "Pickl" not in message
    assert message.startswith("sink 'grp': its targets were private (files), public (files), "
                              "this run has public (files), archive (files) (missing here: "
                              "private; new here: archive)")
    with (pytest.raises(ConfigError, match=r"^sink 'grp': its targets were"),
          changed.epoch(spark) as tx):
        tx.write(frame(spark), "public")
    assert not (tmp_path / "archive").exists()  # nothing claimed: a new sink_id may use it
    # The data source itself, without TargetSet's check: refused before any task,
    # naming the cause (not a PicklingError).
    (tmp_path / "in" / "1.jsonl").write_text('{"id": 6}\n')
    query = (changed.shape(stream(spark, tmp_path)).writeStream.format("txsink")
             .options(**changed.options()).trigger(availableNow=True).start())
    with pytest.raises(Exception) as raw:  # noqa: PT011 - Spark wraps the worker's error
        query.awaitTermination(600)
    assert "its targets were private (files), public (files)" in str(raw.value)
    assert "PicklingError" not in str(raw.value)
    assert not (tmp_path / "archive").exists()
