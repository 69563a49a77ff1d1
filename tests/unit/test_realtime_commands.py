"""``txsink status`` and ``reset`` on a real-time pipeline without a server: what they
say about the query that holds the sink (the driver's heartbeat in the checkpoint), and
what reset refuses before it deletes anything."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from txsink.cli import main
from txsink.realtime.holder import BEAT_S, HOLDER_FILE, holder_record, holding

DOWN = {"dsn": "host=127.0.0.1 port=1 dbname=shop connect_timeout=2",
        "password": "s3cret-pw", "table": "public.t"}


def pipeline(tmp_path: Path, checkpoint: Path, **sink: Any) -> Path:
    data = {"source": {"type": "spark", "format": "kafka",
                       "options": {"kafka.bootstrap.servers": "b:9092", "subscribe": "in"}},
            "sink": sink or {"backend": "postgres", "sink_id": "rt-one", "options": DOWN},
            "checkpoint": str(checkpoint), "trigger": {"real_time": "5 seconds"}}
    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def beat(checkpoint: Path, *, age_s: float = 0.0, released: bool = False,
         ended: str = "stopped") -> None:
    now = time.time()
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / HOLDER_FILE).write_text(holder_record(
        sink_id="rt-one", query_id="q-1", run_id="r-1", host="etl-1", pid=4242,
        started=now - 100, beat=now - age_s, released=now - age_s if released else None,
        ended=ended))


@pytest.mark.parametrize(("age_s", "released", "words"), [
    # A heartbeat written "in the future": held however long this machine takes.
    (-3600.0, False, "query: held by a running query q-1 (driver pid 4242 on host etl-1), "
                     "heartbeat 0 s ago"),
    (3.0, True, "query: no query holds it: the last one, query q-1 (driver pid 4242 on "
                "host etl-1), stopped "),
    (BEAT_S * 4, False, "s ago without saying it ended (its driver died or was killed)"),
    (None, False, "query: no real-time query has run on this checkpoint"),
])
def test_status_says_whether_a_query_holds_the_sink(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], age_s: float | None,
        released: bool, words: str) -> None:
    checkpoint = tmp_path / "chk"
    if age_s is not None:
        beat(checkpoint, age_s=age_s, released=released)
    assert main(["status", str(pipeline(tmp_path, checkpoint))]) == 0
    out = capsys.readouterr().out
    assert words in out and "positions: unknown" in out and "s3cret-pw" not in out
    assert main(["status", str(pipeline(tmp_path, checkpoint)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["held"] is (age_s is not None and not released and age_s < BEAT_S * 3)


def test_a_failed_query_is_named_as_failed() -> None:
    now = time.time()
    text = holder_record(sink_id="s", query_id="q", run_id="r", host="h", pid=1,
                         started=now, beat=now, released=now,
                         ended="failed: source topic 'orders' is not the topic")
    assert "failed: source topic 'orders'" in holding(text, now + 1).line


@pytest.mark.promise("realtime-reset-refused-while-held", "cli")
def test_reset_refuses_while_a_query_holds_the_sink_and_deletes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = tmp_path / "chk"
    beat(checkpoint, age_s=-3600.0)
    (checkpoint / "offsets").mkdir()
    assert main(["reset", str(pipeline(tmp_path, checkpoint)), "--yes"]) == 1
    err = capsys.readouterr().err
    assert "held by a running query q-1" in err and "stop it first" in err
    assert "nothing deleted" in err and err.count("\n") == 1 and "s3cret" not in err
    assert (checkpoint / "offsets").is_dir()


def test_reset_reads_every_target_before_it_deletes_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A target whose server does not answer: nothing is deleted, not even the
    checkpoint (the positions would then belong to no run)."""
    checkpoint = tmp_path / "chk"
    beat(checkpoint, age_s=2.0, released=True)
    assert main(["reset", str(pipeline(tmp_path, checkpoint)), "--yes"]) == 1
    err = capsys.readouterr().err
    assert "sink: cannot read the stored positions" in err and "nothing deleted" in err
    assert "s3cret-pw" not in err and (checkpoint / HOLDER_FILE).exists()


def test_source_topic_is_for_real_time_pipelines_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {"source": {"type": "rate"}, "sink": {
        "backend": "files", "sink_id": "mb", "options": {"path": str(tmp_path / "out"),
                                                         "format": "jsonl"}},
            "checkpoint": str(tmp_path / "chk")}
    path = tmp_path / "mb.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["reset", str(path), "--yes", "--source-topic", "orders"]) == 1
    assert "only real-time pipelines keep positions per source topic" in (
        capsys.readouterr().err)


def test_status_of_a_real_time_checkpoint_directory_asks_for_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = tmp_path / "chk"
    beat(checkpoint, age_s=-3600.0)
    assert main(["status", str(checkpoint)]) == 1
    err = capsys.readouterr().err
    assert "is a real-time pipeline's checkpoint (held by a running query q-1" in err
    assert "run `txsink status PIPELINE_FILE`" in err
