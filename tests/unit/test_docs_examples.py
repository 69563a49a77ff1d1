"""Every example on docs/multi-target.md and docs/operations.md runs in a test.

Each fenced block on those pages carries a marker (``<!-- example: NAME -->`` or
``<!-- recipe: NAME -->``) naming it, and :data:`COVERED` says which test runs it;
a block without a marker, or a name no test mentions, fails here. The blocks that
need no server run here, cheaply; the Spark and server ones run in
``tests/e2e/test_docs_multi_target_spark.py`` (``tox -e examples``) and the reader
SQL in ``tests/integration/postgres/test_postgres_reader_view.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from txsink.cli import main
from txsink.config import load_pipeline
from txsink.coordinator import Coordinator
from txsink.errors import ConfigError
from txsink.faults import AFTER_DECIDE, AFTER_FIRST_COMMIT, FaultInjector, FaultRule, InjectedFault
from txsink.files.backend import FilesBackend
from txsink.group import TargetGroup, write_group
from txsink.model import Committable, TransactionContext
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

REPO = Path(__file__).resolve().parents[2]
PAGES = ("docs/multi-target.md", "docs/operations.md")
SPARK_TEST = "tests/e2e/test_docs_multi_target_spark.py"
#: Each example, by name: the test file that runs it.
COVERED = {
    "yaml-group": __file__, "config-errors": __file__, "cut-output": __file__,
    "state-directory": __file__, "resolve-commands": __file__, "alert-rules": __file__,
    "python-group": SPARK_TEST, "python-grouped-writes": SPARK_TEST,
    "kafka-reader": SPARK_TEST, "s3-reader": SPARK_TEST,
    "pg-view": "tests/integration/postgres/test_postgres_reader_view.py",
    "pg-read": "tests/integration/postgres/test_postgres_reader_view.py",
}
_BLOCK = re.compile(r"(?:<!-- (?:example|recipe): (?P<name>[\w-]+) -->\n)?```(?P<lang>\w+)\n"
                    r"(?P<body>.*?)```", re.S)


def blocks(page: str) -> dict[str | None, str]:
    found: dict[str | None, str] = {}
    for m in _BLOCK.finditer((REPO / page).read_text()):
        assert m.group("name") is not None, (
            f"{page}: a {m.group('lang')} block without an <!-- example: NAME --> marker: "
            f"{m.group('body')[:60]!r}")
        found[m.group("name")] = m.group("body")
    return found


def example(name: str) -> str:
    for page in PAGES:
        if name in (b := blocks(page)):
            return b[name]
    raise AssertionError(name)


def test_every_example_on_the_pages_is_named_and_run_by_a_test() -> None:
    names = [n for page in PAGES for n in blocks(page)]
    assert len(names) == len(set(names)), names
    assert sorted(names) == sorted(COVERED), "mark the new example and run it in a test"
    for name, test in COVERED.items():
        assert f'"{name}"' in (REPO / test).read_text() or test == __file__, (name, test)


def pipeline(tmp_path: Path, sink: str) -> Path:
    f = tmp_path / "orders.yaml"
    f.write_text(f"source: {{type: rate}}\ncheckpoint: {tmp_path}/chk\n{sink}")
    return f


def test_yaml_group_and_its_config_errors(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_PASSWORD", "pw")
    sink = example("yaml-group")
    cfg = load_pipeline(pipeline(tmp_path, sink))
    assert [(t.name, t.backend) for t in cfg.sink.targets] == [
        ("events", "kafka"), ("totals", "postgres"), ("archive", "s3")]
    assert cfg.sink.targets[1].epoch_column == "txsink_epoch"
    errors = [line.removeprefix("txsink: config error: ").removesuffix("...")
              for line in example("config-errors").splitlines()]
    for wrong, line in ((sink.replace("table: public", "tabel: x, table: public"), errors[0]),
                        (sink.replace("backend: kafka", "backend: kafak"), errors[1])):
        with pytest.raises(ConfigError) as info:
            load_pipeline(pipeline(tmp_path, wrong))
        assert str(info.value).startswith(line), (str(info.value), line)
    # The third line (a where Spark cannot apply) needs Spark: the same example's Spark
    # test checks it (tests/e2e/test_multi_spark_files.py, txsink validate).
    assert errors[2].startswith("sink.targets[archive].where: Spark cannot apply it to the "
                                "rows the sink receives: ")


def test_cut_output_has_the_documented_shape(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`txsink cut` on a group whose last epoch is in some targets only."""
    f = tmp_path / "orders.yaml"
    f.write_text(f"""source: {{type: rate}}
checkpoint: {tmp_path}/chk
sink:
  sink_id: orders
  targets:
    - {{name: events, backend: files, options: {{path: {tmp_path}/events, format: jsonl}}}}
    - {{name: totals, backend: files, options: {{path: {tmp_path}/totals, format: jsonl}}}}
    - {{name: archive, backend: files, options: {{path: {tmp_path}/archive, format: jsonl}}}}
""")
    group = load_pipeline(f).create_backend()
    assert isinstance(group, TargetGroup)
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    rows = [pa.record_batch({"order_id": pa.array([1], pa.int64())})]
    try:
        Coordinator(group, store, "orders").commit_epoch(0, write_group(group, 0, 0, 0, rows))
        with pytest.raises(InjectedFault):
            Coordinator(group, store, "orders", faults=FaultInjector([FaultRule(
                AFTER_FIRST_COMMIT, 1, "raise")])).commit_epoch(
                    1, write_group(group, 1, 0, 0, rows))
    finally:
        group.close()
    assert main(["cut", str(f)]) == 0
    out = capsys.readouterr().out.splitlines()
    documented = [line for line in example("cut-output").splitlines()[1:] if line.strip()]

    def shape(line: str) -> str:  # a target's description and the numbers vary
        m = re.fullmatch(r"  (\w+) \(.*\): highest epoch committed \d+", line)
        return (f"  {m.group(1)} (...): highest epoch committed N" if m
                else re.sub(r"\d+", "N", line))

    assert {shape(line) for line in documented} <= {shape(line) for line in out}, out
    assert out[-1] == "cut: 0 (every target holds every epoch up to 0)"


def test_state_directory_and_resolve_commands(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The state directory's entries as listed, and the page's resolve commands run as
    written (its ``/chk/orders`` here): 41 is in doubt, 42 prepared and undecided."""
    chk = tmp_path / "chk" / "orders"
    out = tmp_path / "out"
    options = {"path": str(out), "format": "jsonl"}
    backend = FilesBackend.from_options(options)
    store = DirectoryStateStore(chk / "txsink")

    def prepare(epoch: int) -> Committable:
        return write_participant(backend, TransactionContext("orders", epoch, 0, 0),
                                 [pa.record_batch({"id": pa.array([epoch], pa.int64())})])

    coordinator = Coordinator(backend, store, "orders", backend_options=options,
                              faults=FaultInjector([FaultRule(AFTER_DECIDE, 41, "raise")]))
    coordinator.start()
    coordinator.commit_epoch(40, [prepare(40)])
    with pytest.raises(InjectedFault):
        coordinator.commit_epoch(41, [prepare(41)])
    prepare(42)
    store.release(coordinator.lease)

    listing = example("state-directory")
    entries = {p.relative_to(chk / "txsink").as_posix() for p in (chk / "txsink").rglob("*")
               if p.is_file()}
    assert {"meta.json", "lease.json"} <= entries and "meta.json" in listing
    epochs = sorted(e for e in entries if e.startswith("epochs/"))
    assert epochs == ["epochs/000000000040.committed.json", "epochs/000000000041.decided.json"]
    assert "epochs/<epoch, 12 digits>.<state>.json" in listing
    assert store._archive_path(3).name == "00000003.json"
    assert "archive/<chunk, 8 digits>.json" in listing

    for command in example("resolve-commands").splitlines():
        argv = command.split("#")[0].split()
        assert argv[0] == "txsink", command
        argv = [a.replace("/chk/orders", str(chk)) for a in argv[1:]]
        assert main(argv) == 0, command
    printed = capsys.readouterr().out
    assert "epoch 41: " in printed  # status named the epoch in doubt
    assert "committed epoch 41 of sink 'orders': 1 participant(s), 1 row(s)" in printed
    assert "aborted epoch 42 of sink 'orders': 1 prepared participant(s) rolled back" in printed
    assert sorted(p.name for p in out.glob("part-*")) == [
        "part-0000000040-00000.jsonl", "part-0000000041-00000.jsonl"]


def test_alert_rules_are_valid_and_name_txsink_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    from txsink import metrics

    # This process's metrics as a library user gets them, whatever an earlier test in
    # it left (metric objects made for multiprocess mode register nothing here).
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    monkeypatch.setenv(metrics.ENABLED_ENV, "1")  # registry() sets it: restored after
    metrics.reset_for_tests()
    rules = yaml.safe_load(example("alert-rules"))
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) == 2
    names = {f.name + ("_total" if f.type == "counter" else "")
             for f in metrics.registry().collect()} | {"txsink_oldest_prepared_age_seconds"}
    used = {n for e in exprs for n in re.findall(r"txsink_\w+", e)}
    assert used and used <= names, used - names
    metrics.reset_for_tests()
