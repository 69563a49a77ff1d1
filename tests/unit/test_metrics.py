"""The metrics plugin: values scraped from the registry match what the coordinator did."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from txsink import metrics
from txsink.coordinator import EpochOutcome
from txsink.faults import AFTER_DECIDE, BEFORE_DECIDE, FaultInjector, InjectedFault, parse
from txsink.plugins import build_plugins

from .conftest import SINK, Env

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")


@pytest.fixture
def metered(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """``env`` with the metrics plugin registered and single-process metrics on."""
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    monkeypatch.delenv(metrics.ENABLED_ENV, raising=False)
    metrics.reset_for_tests()
    env.plugins = build_plugins(entry_points=[], extra_plugins=[
        ("recorder", env.recorder), ("metrics", metrics)])
    metrics.registry()
    yield env
    metrics.reset_for_tests()


def value(name: str, **labels: str) -> float:
    got = metrics.registry().get_sample_value(name, {"sink": SINK, **labels})
    return 0.0 if got is None else got


def test_disabled_metrics_record_nothing(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.ENABLED_ENV, raising=False)
    metrics.reset_for_tests()
    env.plugins = build_plugins(entry_points=[], extra_plugins=[("metrics", metrics)])
    env.coordinator().commit_epoch(0, env.prepare_epoch(0))
    assert metrics._metrics is None


def test_committed_epochs_rows_participants_and_latency(metered: Env) -> None:
    coord = metered.coordinator()
    coord.start()
    for epoch, parts in ((0, 3), (1, 2)):
        assert coord.commit_epoch(epoch, metered.prepare_epoch(epoch, parts, n=7)) \
            is EpochOutcome.COMMITTED
    assert value("txsink_epochs_committed_total") == 2
    assert value("txsink_rows_committed_total") == 7 * 5
    assert value("txsink_participants_committed_total") == 5
    assert value("txsink_last_epoch_rows") == 14
    assert value("txsink_last_epoch_participants") == 2
    assert value("txsink_last_committed_epoch") == 1
    assert value("txsink_commit_latency_seconds_count") == 2
    assert value("txsink_participants_in_doubt") == 0
    assert value("txsink_oldest_prepared_timestamp_seconds") == 0
    # The memory backend's participants never time out.
    assert ("started", ("memory", None)) in metered.recorder.calls
    assert value("txsink_participant_timeout_seconds") == 0


def test_aborts_replays_and_orphans_are_counted_by_reason(metered: Env) -> None:
    coord = metered.coordinator()
    coord.commit_epoch(0, metered.prepare_epoch(0, 2))
    # Spark replays epoch 0: both new participants are aborted as replays.
    assert coord.commit_epoch(0, metered.prepare_epoch(0, 2)) is EpochOutcome.REPLAYED
    # Epoch 1 aborted by the engine, with one participant reported.
    coord.abort_epoch(1, [metered.prepare(1, 0)])
    # A failed task attempt of epoch 2 left a participant nobody reported.
    metered.prepare(2, 0, attempt=5)
    coord.commit_epoch(2, [metered.prepare(2, 0)])
    assert value("txsink_epochs_aborted_total", reason="replayed") == 1
    assert value("txsink_epochs_aborted_total", reason="aborted") == 1
    assert value("txsink_participants_aborted_total", reason="replayed") == 2
    assert value("txsink_participants_aborted_total", reason="aborted") == 1
    assert value("txsink_recovery_aborted_orphans_total") == 1
    assert value("txsink_epochs_committed_total") == 2


def test_recovery_and_in_doubt_participants(metered: Env) -> None:
    crashing = metered.coordinator(faults=FaultInjector(parse(f"{AFTER_DECIDE}@0:raise")))
    with pytest.raises(InjectedFault):
        crashing.commit_epoch(0, metered.prepare_epoch(0, 3))
    # Decided, nothing committed: three participants in doubt, prepared since then.
    assert value("txsink_participants_in_doubt") == 3
    assert value("txsink_oldest_prepared_timestamp_seconds") > 0
    report = metered.coordinator().start()
    assert report.recommitted_epochs == [0]
    assert value("txsink_recovery_recommitted_epochs_total") == 1
    assert value("txsink_participants_in_doubt") == 0
    assert value("txsink_oldest_prepared_timestamp_seconds") == 0
    assert value("txsink_rows_committed_total") == 30


_CHILD = textwrap.dedent("""
    import sys
    from txsink import metrics
    from txsink.coordinator import Coordinator, RetryPolicy
    from txsink.faults import FaultInjector, InjectedFault, parse
    from txsink.plugins import build_plugins
    from txsink.state import DirectoryStateStore
    from txsink.testing.memory import MemoryBackend
    from txsink.model import TransactionContext
    from txsink.writer import write_participant
    import pyarrow as pa

    state, fault = sys.argv[1], sys.argv[2]
    backend = MemoryBackend("child")
    plugins = build_plugins(entry_points=[], extra_plugins=[("metrics", metrics)])
    coord = Coordinator(backend, DirectoryStateStore(state), "unit-sink", plugins=plugins,
                        faults=FaultInjector(parse(fault)),
                        retry=RetryPolicy(attempts=1, sleep=lambda s: None))
    coord.start()
    for epoch in (0, 1):
        batch = pa.record_batch({"id": pa.array(range(4), pa.int64())})
        c = write_participant(backend, TransactionContext("unit-sink", epoch, 0, 0), [batch])
        try:
            coord.commit_epoch(epoch, [c])
        except InjectedFault:
            pass
""")


def test_multiprocess_values_reach_the_server(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Spark the hooks run in child processes: their samples are added up by the
    serving process, and the oldest prepared participant's age is derived at scrape."""
    metrics.reset_for_tests()
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    monkeypatch.delenv(metrics.ENABLED_ENV, raising=False)
    server = metrics.serve(0)
    try:
        env = dict(os.environ)
        # Two children: one commits epochs 0 and 1; the other prepares epoch 1 of
        # another sink state and dies before deciding it.
        for state, fault in ((tmp_path / "a", ""), (tmp_path / "b", f"{BEFORE_DECIDE}@1:raise")):
            subprocess.run([sys.executable, "-c", _CHILD, str(state), fault], env=env,
                           check=True, timeout=120)
        text = urllib.request.urlopen(server.url, timeout=10).read().decode()
    finally:
        server.close()
        metrics.reset_for_tests()
    samples = _parse(text)
    assert samples[("txsink_epochs_committed_total", SINK)] == 3
    assert samples[("txsink_rows_committed_total", SINK)] == 12
    assert samples[("txsink_last_committed_epoch", SINK)] == 1
    assert samples[("txsink_oldest_prepared_timestamp_seconds", SINK)] > 0
    assert samples[("txsink_oldest_prepared_age_seconds", SINK)] > 0
    assert not Path(server.directory).exists()


def _parse(text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, s.labels.get("sink", ""))] = s.value
    return out


def test_serving_on_a_taken_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    first = metrics.serve(0)
    try:
        with pytest.raises(Exception, match=f"cannot serve metrics on 127.0.0.1:{first.port}"):
            metrics.serve(first.port)
    finally:
        first.close()
        metrics.reset_for_tests()


def test_every_metric_is_documented(metered: Env) -> None:
    metered.coordinator().commit_epoch(0, metered.prepare_epoch(0, 1))
    documented = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    names = {f.name + ("_total" if f.type == "counter" else "")
             for f in metrics.registry().collect()}
    assert "txsink_epochs_committed_total" in names
    missing = sorted(n for n in names | {"txsink_oldest_prepared_age_seconds"}
                     if f"`{n}`" not in documented)
    assert not missing, f"metrics not documented in docs/operations.md: {missing}"


def test_dead_workers_files_are_folded_and_no_total_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Operations suspicion: Spark starts a Python worker per micro-batch, each wrote
    its own files into the multiprocess directory, and nothing ever removed them.
    Folding the files of workers that ended keeps the directory at one set per live
    worker plus one archive set, with every total as it was."""
    metrics.reset_for_tests()
    monkeypatch.delenv(metrics.MULTIPROC_ENV, raising=False)
    monkeypatch.delenv(metrics.ENABLED_ENV, raising=False)
    monkeypatch.setattr(metrics, "COMPACT_INTERVAL_S", 0.0, raising=False)
    server = metrics.serve(0)
    try:
        env = dict(os.environ)

        def run_workers(first: int, count: int) -> None:
            for i in range(first, first + count):  # each a worker of its own, then gone
                subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / f"s{i}"), ""],
                               env=env, check=True, timeout=120)

        run_workers(0, 3)
        before = _parse(urllib.request.urlopen(server.url, timeout=10).read().decode())
        files = sorted(os.listdir(server.directory))
        assert not [f for f in files if f[:-3].rpartition("_")[2].isdigit()], files
        kinds = len(files)
        run_workers(3, 3)
        after = _parse(urllib.request.urlopen(server.url, timeout=10).read().decode())
        assert len(os.listdir(server.directory)) == kinds  # no growth with workers
    finally:
        server.close()
        metrics.reset_for_tests()
    assert before[("txsink_epochs_committed_total", SINK)] == 6  # 2 epochs per worker
    assert after[("txsink_epochs_committed_total", SINK)] == 12
    assert after[("txsink_rows_committed_total", SINK)] == 2 * before[
        ("txsink_rows_committed_total", SINK)]
    assert after[("txsink_commit_latency_seconds_count", SINK)] == 12
    assert after[("txsink_last_committed_epoch", SINK)] == 1


def test_salvaged_participants_are_counted(metered: Env) -> None:
    from txsink.faults import AFTER_FIRST_COMMIT, FaultRule

    msgs = metered.prepare_epoch(0, 3)
    with pytest.raises(InjectedFault):
        metered.coordinator(FaultInjector([FaultRule(AFTER_FIRST_COMMIT, 0, "raise")])
                            ).commit_epoch(0, msgs)
    for c in msgs[1:]:
        metered.system.expire(c.participant)  # the target's timeout, during the outage
    metered.coordinator().start()
    assert value("txsink_participants_salvaged_total") == 2
    assert value("txsink_epochs_committed_total") == 1
