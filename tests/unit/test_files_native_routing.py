"""Which pipelines take the files backend's native data path (no Spark needed to say).

Parquet with ``exactly_once``, as a single sink or a group's target, takes Spark's own
writer; JSON lines, the weaker guarantees and Spark Connect (tables too) keep txsink's
data source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from txsink.config import parse_pipeline
from txsink.coordinator import Coordinator
from txsink.files.backend import FilesBackend
from txsink.spark.frames import native_targets
from txsink.state import DirectoryStateStore


def pipeline(tmp_path: Path, **sink: Any) -> Any:
    base = ({"sink_id": "p1"} if "targets" in sink else
            {"backend": "files", "sink_id": "p1", "options": {"path": str(tmp_path / "out")}})
    data = {"name": "p", "source": {"type": "rate"}, "checkpoint": str(tmp_path / "chk"),
            "sink": {**base, **sink}}
    return parse_pipeline(data)


@pytest.mark.parametrize("stream", [False, True])
def test_parquet_exactly_once_takes_sparks_writer(tmp_path: Path, stream: bool) -> None:
    native = native_targets(pipeline(tmp_path), {}, stream=stream)
    assert native is not None and native.single and native.sink_id == "p1"
    group = pipeline(tmp_path, targets=[
        {"name": "a", "backend": "files", "options": {"path": str(tmp_path / "a")}},
        {"name": "b", "backend": "files",
         "options": {"path": str(tmp_path / "b"), "format": "jsonl"}}])
    native = native_targets(group, None, stream=stream)
    assert native is not None and not native.single and native.names == ["a", "b"]


@pytest.mark.parametrize("sink", [
    {"options": {"path": "OUT", "format": "jsonl"}},
    {"guarantee": "at_least_once"},
    {"guarantee": "none"},
], ids=["jsonl", "at_least_once", "none"])
def test_other_formats_and_guarantees_keep_the_data_source(tmp_path: Path,
                                                          sink: dict[str, Any]) -> None:
    if "options" in sink:
        sink = {"options": {**sink["options"], "path": str(tmp_path / "out")}}
    assert native_targets(pipeline(tmp_path, **sink), {}, stream=True) is None


def test_spark_connect_keeps_the_data_source(tmp_path: Path) -> None:
    assert native_targets(pipeline(tmp_path), {"lease_owner": "x"},
                          stream=False) is None


def test_a_stream_on_a_state_the_data_sources_stream_wrote_takes_the_native_path(
        tmp_path: Path) -> None:
    """Both paths number a micro-batch alike (the state's ``stream_from`` + batch id, bound
    to the query id: :mod:`txsink.gate`), so the native path continues that stream's
    epochs; tests/unit/test_gate_native.py checks its replays."""
    cfg = pipeline(tmp_path)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    coordinator = Coordinator(FilesBackend(str(tmp_path / "out")), store, "p1")
    coordinator.start(stream=True, query_id="q1")  # as the data source's stream does
    meta = store.read_meta()
    assert meta is not None and meta.stream_from == 0
    assert native_targets(cfg, {}, stream=True) is not None
    assert native_targets(cfg, {}, stream=False) is not None


def test_a_single_sinks_native_epoch_records_its_options_in_the_state(tmp_path: Path) -> None:
    """As the data source does: ``txsink status`` / ``resolve`` and the check that the
    output did not move read them from the state."""
    from txsink.spark.group import GroupEpoch

    native = native_targets(pipeline(tmp_path), {}, stream=False)
    assert native is not None
    with GroupEpoch(None, native, version=None, app_id=None):  # type: ignore[arg-type]
        pass  # nothing written: an epoch without files
    meta = DirectoryStateStore(tmp_path / "chk" / "txsink").read_meta()
    assert meta is not None and meta.backend == "files"
    assert meta.options == {"path": str(tmp_path / "out")}
    assert FilesBackend(str(tmp_path / "out")).holds_epoch("p1", 0)


def test_under_spark_connect_every_target_keeps_the_data_source(tmp_path: Path) -> None:
    """The native path's driver side needs the classic session (``sparkContext``): a
    Connect frame writes its targets through the data source. Tables took Spark's own
    writer there, and the Connect client refused its ``errorifexists``: every batch
    failed (tests/e2e/test_spark_connect.py); nor could its ``foreachBatch`` function
    learn the stream's query id, which the data source's tasks report."""
    from txsink.spark import target, targets
    from txsink.spark.group import takes_native

    connect_frame = type("DataFrame", (), {"__module__": "pyspark.sql.connect.dataframe"})()
    group = targets("g", [target("f", "files", path=str(tmp_path / "f")),
                          target("d", "delta", path=str(tmp_path / "d"))],
                    checkpoint_location=str(tmp_path / "chk"))
    files, delta = group.specs
    assert takes_native(files) and not takes_native(files, connect_frame)
    assert takes_native(delta) and not takes_native(delta, connect_frame)
    assert not group.native(connect_frame)
    only_files = targets("h", [target("f", "files", path=str(tmp_path / "f2"))],
                         checkpoint_location=str(tmp_path / "chk2"))
    assert only_files.native() and not only_files.native(connect_frame)

