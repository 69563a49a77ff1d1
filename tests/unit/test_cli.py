"""The txsink CLI without Spark: validate, backends, status and resolve."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.cli import main
from txsink.coordinator import Coordinator
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.files.backend import FilesBackend
from txsink.model import Committable, TransactionContext
from txsink.state import DirectoryStateStore, EpochState
from txsink.writer import write_participant

REPO = Path(__file__).resolve().parents[2]
SINK = "cli-sink"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_validate_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "validate", "--no-spark",
                        str(REPO / "examples/pipelines/demo.yaml"))
    assert code == 0
    assert out.startswith("ok (Spark checks skipped): pipeline 'demo' (streaming)")


@pytest.mark.parametrize(("yaml", "field"), [
    ("sink: {backend: nosuch, sink_id: s}", "sink.backend"),
    ("sink: {backend: files, options: {path: /tmp/x}}", "sink.sink_id"),
    ("sink: {backend: files, sink_id: s, options: {path: /tmp/x, compression: 5x}}",
     "sink.options.compression"),
    ("sink: {backend: files, sink_id: s, options: {path: '${NO_SUCH_VAR_TXSINK}'}}",
     "sink.options.path"),
    ("sink: {backend: files, sink_id: s, options: {path: /tmp/x}}\ntrigger: {once: 1}",
     "trigger.once"),
])
def test_bad_config_fails_naming_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       yaml: str, field: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\n{yaml}\n")
    for command in ("validate", "run"):  # run fails the same way, before Spark starts
        code, out, err = _run(capsys, command, str(f))
        assert code == 1
        assert err.startswith(f"txsink: config error: {field}:"), err
        assert "Traceback" not in err
        assert out == ""
    assert not (tmp_path / "chk").exists()


def test_backends_lists_files_with_package(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "backends", "--json")
    assert code == 0
    rows = {r["backend"]: r for r in json.loads(out)["backends"]}
    assert rows["files"]["package"] == "txsink"
    assert rows["files"]["version"] != "?"
    assert "commit-from-any-process" in rows["files"]["capabilities"]
    code, out, _ = _run(capsys, "backends")
    assert any(line.startswith("files ") and " txsink " in line for line in out.splitlines())


# -- status / resolve on a real files sink, driven without Spark --------------------------


def _prepare(backend: FilesBackend, epoch: int, partition: int, attempt: int = 0) -> Committable:
    batch = pa.RecordBatch.from_pylist([{"id": epoch * 10 + partition}])
    return write_participant(backend, TransactionContext(SINK, epoch, partition, attempt),
                             [batch])


@pytest.fixture
def sink(tmp_path: Path) -> tuple[Path, Path, FilesBackend]:
    """Epoch 0 committed, epoch 1 DECIDED (in doubt), epoch 2 prepared but undecided."""
    out, chk = tmp_path / "out", tmp_path / "chk"
    backend = FilesBackend.from_options({"path": str(out), "format": "jsonl"})
    store = DirectoryStateStore(chk / "txsink")
    coordinator = Coordinator(backend, store, SINK, backend_options={"path": str(out),
                                                                     "format": "jsonl"},
                              faults=FaultInjector([FaultRule(AFTER_DECIDE, 1, "raise")]))
    coordinator.start()
    coordinator.commit_epoch(0, [_prepare(backend, 0, 0), _prepare(backend, 0, 1)])
    with pytest.raises(InjectedFault):
        coordinator.commit_epoch(1, [_prepare(backend, 1, 0), _prepare(backend, 1, 1)])
    _prepare(backend, 2, 0, attempt=7)
    return out, chk, backend


def test_status_shows_in_doubt_and_pending(sink: tuple[Path, Path, FilesBackend],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _, chk, _ = sink
    code, text, _ = _run(capsys, "status", str(chk))
    assert code == 0
    assert f"sink '{SINK}': backend files" in text
    assert "in doubt (DECIDED" in text
    assert f"epoch 1: {SINK}-e1-p0-a0" in text
    assert f"epoch 2: {SINK}-e2-p0-a7" in text
    code, text, _ = _run(capsys, "status", str(chk / "txsink"), "--json")
    data = json.loads(text)
    assert data["in_doubt"] == [1]
    assert [p["participant"] for p in data["prepared_undecided"]] == [f"{SINK}-e2-p0-a7"]
    assert {e["epoch"]: e["state"] for e in data["epochs"]} == {0: "committed", 1: "decided"}


@pytest.mark.promise("resolve-abort-decided-needs-force", "cli")
@pytest.mark.promise("resolve-abort-undecided", "cli")
@pytest.mark.promise("resolve-commit", "cli")
@pytest.mark.promise("resolve-commit-undecided-refused", "cli")
def test_resolve_commit_and_abort(sink: tuple[Path, Path, FilesBackend],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out, chk, _ = sink
    # Undecided epochs cannot be committed by hand: their data may be incomplete.
    code, _, err = _run(capsys, "resolve", str(chk), "--epoch", "2", "--commit")
    assert code == 1 and "never decided" in err
    # A DECIDED epoch is not aborted without --force.
    code, _, err = _run(capsys, "resolve", str(chk), "--epoch", "1", "--abort")
    assert code == 1 and "--force" in err

    code, text, _ = _run(capsys, "resolve", str(chk), "--epoch", "1", "--commit")
    assert code == 0 and "committed epoch 1" in text
    assert sorted(p.name for p in out.glob("part-0000000001-*")) == [
        "part-0000000001-00000.jsonl", "part-0000000001-00001.jsonl"]
    code, text, _ = _run(capsys, "resolve", str(chk), "--epoch", "2", "--abort")
    assert code == 0 and "1 prepared participant(s) rolled back" in text
    assert list((out / "_txsink" / "pending").iterdir()) == []

    code, text, _ = _run(capsys, "status", str(chk), "--json")
    data = json.loads(text)
    assert data["in_doubt"] == []
    assert data["prepared_undecided"] == []
    code, text, _ = _run(capsys, "resolve", str(chk), "--epoch", "1", "--commit")
    assert code == 0 and "already committed" in text


@pytest.mark.promise("resolve-abort-decided-needs-force", "cli")
def test_resolve_force_abort_drops_decided_epoch(sink: tuple[Path, Path, FilesBackend],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out, chk, _ = sink
    code, text, _ = _run(capsys, "resolve", str(chk), "--epoch", "1", "--abort", "--force")
    assert code == 0 and "dropped" in text
    assert not list(out.glob("part-0000000001-*"))
    store = DirectoryStateStore(chk / "txsink")
    assert 1 not in store.records()
    assert store.records()[0].state is EpochState.COMMITTED


def test_status_without_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "status", str(tmp_path))
    assert code == 1
    assert "no txsink state found" in err


def test_run_preflight_failure_names_the_option_before_spark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    FilesBackend.from_options({"path": str(out)}).claim_sink("someone-else", "s", "/elsewhere")
    f = tmp_path / "p.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\n"
                 f"sink: {{backend: files, sink_id: mine, options: {{path: '{out}'}}}}\n")
    code, stdout, err = _run(capsys, "run", str(f))
    assert code == 1
    assert err.startswith("txsink: config error: sink.options.path:"), err
    assert "someone-else" in err
    assert stdout == ""
    assert not (tmp_path / "chk").exists()


def test_status_works_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    backend = FilesBackend.from_options({"path": "rel/out"})
    coordinator = Coordinator(backend, DirectoryStateStore(tmp_path / "chk" / "txsink"), SINK,
                              backend_options={"path": "rel/out"})
    coordinator.start()
    _prepare(backend, 0, 0)  # prepared, never decided
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, text, _ = _run(capsys, "status", str(tmp_path / "chk"), "--json")
    assert code == 0
    data = json.loads(text)
    assert data["options"]["path"] == str(tmp_path / "rel" / "out")
    assert [p["participant"] for p in data["prepared_undecided"]] == [f"{SINK}-e0-p0-a0"]


def test_the_run_loop_reports_each_newly_committed_epoch_once(tmp_path: Path) -> None:
    from txsink.spark.report import committed_since
    from txsink.state import EpochRecord

    def record(epoch: int, state: EpochState) -> EpochRecord:
        c = Committable("files", "s1", epoch, 0, 0, f"s1-e{epoch}-p0-a0", {}, rows=epoch + 1)
        return EpochRecord(epoch, state, (c,), 1.0)

    store = DirectoryStateStore(tmp_path)
    lease = store.acquire("a")
    store.put(lease, record(0, EpochState.COMMITTED))
    seen = {0}
    store.put(lease, record(1, EpochState.COMMITTED))
    store.put(lease, record(2, EpochState.DECIDED))
    assert [r.rows for r in committed_since(store, seen)] == [2]
    store.put(lease, record(2, EpochState.COMMITTED))
    assert [r.epoch for r in committed_since(store, seen)] == [2]
    assert committed_since(store, seen) == []


@pytest.mark.promise("remote-metrics-port-refused", "cli")
@pytest.mark.parametrize(("argv", "says"), [
    (["--remote", "localhost:15002"], "--remote / SPARK_REMOTE: 'localhost:15002' is not a "
     "Spark Connect address; give sc://HOST:PORT"),
    (["--remote", "sc://127.0.0.1:1", "--metrics-port", "0"],
     "--metrics-port cannot be used with --remote"),
])
def test_run_remote_refuses_what_it_cannot_do_before_spark(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    pytest.importorskip("pyspark")
    code, _, err = _run(capsys, "run", str(REPO / "examples/pipelines/demo.yaml"), *argv)
    assert code == 1
    assert says in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.promise("remote-server-error-reported", "cli")
def test_a_query_error_from_the_connect_server_is_not_called_a_lost_server() -> None:
    """Every error the server answers with reaches a Connect client as a PySpark error;
    only a server that does not answer (or lost the session) is "failed or stopped
    answering": a query refused because its checkpoint is in use was called that too."""
    pytest.importorskip("grpc")
    import grpc
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException
    from txsink.spark.connect import is_connect_error, server_gone

    def error(message: str, code: grpc.StatusCode, cls: str | None = None) -> Exception:
        return SparkConnectGrpcException(message, errorClass=cls,
                                         messageParameters={} if cls else None,
                                         grpc_status_code=code)

    down = error("failed to connect to all addresses", grpc.StatusCode.UNAVAILABLE)
    restarted = error("[INVALID_HANDLE.SESSION_NOT_FOUND] The handle x is invalid.",
                      grpc.StatusCode.INTERNAL, "INVALID_HANDLE.SESSION_NOT_FOUND")
    in_use = error("[CONCURRENT_QUERY] Another instance of this query was just started by "
                   "a concurrent session.", grpc.StatusCode.INTERNAL)
    assert all(is_connect_error(e) for e in (down, restarted, in_use))
    assert server_gone(down) and server_gone(restarted)
    assert not server_gone(in_use)


def test_spark_remote_from_the_environment_is_checked_like_the_option(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    monkeypatch.setenv("SPARK_REMOTE", "http://127.0.0.1:15002")
    code, _, err = _run(capsys, "run", str(REPO / "examples/pipelines/demo.yaml"))
    assert code == 1
    assert "'http://127.0.0.1:15002' is not a Spark Connect address" in err
