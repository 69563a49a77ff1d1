"""What a group refuses, and that it refuses before anything is written or claimed.

The targets are real files directories (the files backend, Parquet and JSON lines);
each test would fail if a group wrote a corrupt file, misrouted a row, or touched a
target before refusing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txsink.errors import ConfigError
from txsink.group import TargetGroup, write_group
from txsink.targets import ROUTE_PREFIX, parse_targets

GROUP = "shop"


def files_group(tmp_path: Path, fmt: str, **extra: object) -> TargetGroup:
    specs = parse_targets([{"name": "totals", "backend": "files",
                            "options": {"path": str(tmp_path / "totals"), "format": fmt},
                            **extra}], GROUP)
    return TargetGroup.from_specs(GROUP, specs)


def written(tmp_path: Path, name: str) -> list[Path]:
    return sorted((tmp_path / name).glob("part-*")) + sorted(
        (tmp_path / name / "_txsink" / "pending").glob("*")) if (tmp_path / name).exists() \
        else []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_epoch_column_named_like_a_column_of_the_rows_is_refused_before_writing(
        tmp_path: Path, fmt: str) -> None:
    """Parquet got the column twice (unreadable), JSON lines lost the rows' own value."""
    group = files_group(tmp_path, fmt, epoch_column="batch")
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int64()),
                            "batch": pa.array([70, 71], pa.int64())})
    try:
        with pytest.raises(ConfigError) as info:
            write_group(group, 3, 0, 0, [rows])
    finally:
        group.close()
    assert str(info.value).startswith("targets[totals].epoch_column: the rows of target "
                                      "'totals' already have a column 'batch'")
    assert "nothing was written" in str(info.value)
    assert written(tmp_path, "totals") == []
    for f in (tmp_path / "totals").rglob("*"):
        assert not f.is_file() or f.parent.name == "_txsink", f  # only the claim markers


def test_the_check_is_case_blind_and_a_shaped_target_is_checked_on_its_own_fields(
        tmp_path: Path) -> None:
    group = files_group(tmp_path, "jsonl", epoch_column="txsink_epoch", select=["id", "Batch"])
    shaped = pa.record_batch({ROUTE_PREFIX + "totals": pa.StructArray.from_arrays(
        [pa.array([1], pa.int64()), pa.array([5], pa.int64())], ["id", "TXSINK_EPOCH"])})
    try:
        with pytest.raises(ConfigError, match=r"targets\[totals\].epoch_column: the rows of "
                           "target 'totals' already have a column 'TXSINK_EPOCH'"):
            write_group(group, 0, 0, 0, [shaped])
    finally:
        group.close()
    assert written(tmp_path, "totals") == []


def test_without_a_clash_the_epoch_column_is_added_and_readable(tmp_path: Path) -> None:
    from txsink.coordinator import Coordinator
    from txsink.state import DirectoryStateStore

    group = files_group(tmp_path, "parquet", epoch_column="txsink_epoch")
    try:
        msgs = write_group(group, 0, 0, 0, [pa.record_batch({"id": pa.array([1, 2])})])
        Coordinator(group, DirectoryStateStore(tmp_path / "state"), GROUP).commit_epoch(0, msgs)
    finally:
        group.close()
    (part,) = written(tmp_path, "totals")
    assert pq.read_table(part).to_pylist() == [{"id": 1, "txsink_epoch": 0},
                                               {"id": 2, "txsink_epoch": 0}]


def _two_targets(tmp_path: Path) -> TargetGroup:
    specs = parse_targets([
        {"name": "public", "backend": "files", "select": ["id"], "where": "id > 1",
         "options": {"path": str(tmp_path / "public"), "format": "jsonl"}},
        {"name": "private", "backend": "files",
         "options": {"path": str(tmp_path / "private"), "format": "jsonl"}},
    ], GROUP)
    return TargetGroup.from_specs(GROUP, specs)


def test_an_unshaped_frame_is_refused_when_a_target_has_select_or_where(
        tmp_path: Path) -> None:
    """Unshaped, every row and column (the secret too) went to every target."""
    group = _two_targets(tmp_path)
    rows = pa.record_batch({"id": pa.array([1, 2], pa.int64()),
                            "secret": pa.array(["s1", "s2"])})
    try:
        with pytest.raises(ConfigError) as info:
            write_group(group, 0, 0, 0, [rows])
    finally:
        group.close()
    assert str(info.value).startswith(
        "targets: target(s) public have select/where, but the frame was not shaped by the "
        "group, so every row and column would go to every target; nothing was written")
    assert written(tmp_path, "public") == [] and written(tmp_path, "private") == []


def test_a_frame_shaped_for_other_targets_is_refused(tmp_path: Path) -> None:
    group = _two_targets(tmp_path)
    ids = pa.StructArray.from_arrays([pa.array([1], pa.int64())], ["id"])
    rows = pa.record_batch({ROUTE_PREFIX + "public": ids, ROUTE_PREFIX + "archive": ids})
    try:
        with pytest.raises(ConfigError, match=r"^targets: the frame is shaped for other "
                           r"targets than this group's \(archive, private differ"):
            write_group(group, 0, 0, 0, [rows])
    finally:
        group.close()
    assert written(tmp_path, "public") == [] and written(tmp_path, "private") == []


def test_a_shaped_frame_still_routes(tmp_path: Path) -> None:
    group = _two_targets(tmp_path)
    public = pa.StructArray.from_arrays([pa.array([2], pa.int64())], ["id"],
                                        mask=pa.array([False]))
    private = pa.StructArray.from_arrays([pa.array([2], pa.int64()), pa.array(["s"])],
                                         ["id", "secret"])
    try:
        msgs = write_group(group, 0, 0, 0, [pa.record_batch(
            {ROUTE_PREFIX + "public": public, ROUTE_PREFIX + "private": private})])
    finally:
        group.close()
    assert {c.target: c.rows for c in msgs} == {"public": 1, "private": 1}
    assert json.loads(next(iter((tmp_path / "public" / "_txsink" / "pending").iterdir()))
                       .read_text()) == {"id": 2}


def test_the_target_check_leaves_a_checkpoint_given_on_the_stream_writer_to_the_source(
        tmp_path: Path) -> None:
    """``orders.write_stream(df).option("checkpointLocation", ...)`` stays valid: without
    a location of its own the group cannot read its state yet, and does not ask."""
    import txsink.spark as ts

    group = ts.targets(GROUP, [{"name": "totals", "backend": "files",
                                "options": {"path": str(tmp_path / "totals")}}])
    group.check_state()  # no ConfigError: the data source checks once it knows the state
    assert not (tmp_path / "totals").exists()
