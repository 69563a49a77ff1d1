"""A group of four targets (Kafka, PostgreSQL, S3, files) through real Spark and servers.

The driver is killed while an epoch is committed in some targets only; the restart
finishes it in all of them. Then every target holds each epoch exactly once (count and
checksum), nothing is left prepared, the cut is the last epoch, and the reader recipes
of docs/multi-target.md read exactly the epochs up to a cut: the PostgreSQL view (its
SQL taken from the page), the Kafka consumer helper and the S3 manifest reader. The
long run kills the driver at every protocol point, in both write modes, and fails
tasks mid-write.
"""

from __future__ import annotations

import collections
import json
import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from txsink.cut import consistent_cut
from txsink.group import TargetGroup
from txsink.state import DirectoryStateStore
from txsink.targets import parse_targets

from tests.chaos.multi import Group
from tests.e2e import multi_driver
from tests.e2e.spark_harness import make_input, summarize
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
FILES, ROWS = 2, 150


@pytest.fixture
def servers(multi_group: Group) -> Group:
    return multi_group  # the session's (tests/conftest.py)


def targets(servers: Group, run: str) -> list[dict[str, Any]]:
    base = {i["name"]: i for i in servers.items(run)}
    base["totals"]["options"]["table"] = f"public.totals_{run}"
    return [
        {**base["events"], "select": [
            "CAST(id AS STRING) AS key",
            "to_json(named_struct('id', id, 'key', key, 'amount', amount)) AS value"]},
        # Named as in the page's example, so its reader SQL runs as written.
        {**base["totals"], "select": ["id", "key AS customer", "amount AS total"],
         "where": "amount >= 500",
         "epoch_column": "txsink_epoch"},
        base["archive"],
        base["files"],
    ]


def rows_of(servers: Group, items: list[dict[str, Any]], sink: str
            ) -> dict[str, list[dict[str, Any]]]:
    """Every row each target shows, with its epoch."""
    import io

    import pyarrow.parquet as pq
    from txsink_kafka.reader import read_up_to_cut, record_epoch

    by = {i["name"]: i["options"] for i in items}
    out: dict[str, list[dict[str, Any]]] = {}
    kafka = servers.servers["events"]
    read = read_up_to_cut({"bootstrap.servers": kafka.bootstrap},  # type: ignore[attr-defined]
                          by["events"]["topic"], cut=2**62)
    out["events"] = [{**json.loads(m.value()), "epoch": record_epoch(m)} for m in read.records]
    pg = servers.servers["totals"].server  # type: ignore[attr-defined]
    with psycopg.connect(pg.url_with_password) as conn:
        out["totals"] = [{"id": i, "key": k, "amount": a, "epoch": e} for i, k, a, e in
                         conn.execute(f"SELECT id, customer, total, txsink_epoch FROM "
                                      f"{by['totals']['table']}")]
    s3 = servers.servers["archive"]
    client = s3.server.client()  # type: ignore[attr-defined]
    prefix = f"{by['archive']['prefix']}/{sink}--archive/"
    out["archive"] = []
    for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=s3.bucket, Prefix=prefix):  # type: ignore[attr-defined]
        for obj in page.get("Contents", []):
            key = obj["Key"]
            if key.endswith(".parquet") and "/epoch=" in key:
                epoch = int(key[len(prefix):].split("/")[0].split("=")[1])
                body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()  # type: ignore[attr-defined]
                out["archive"] += [{**r, "epoch": epoch}
                                   for r in pq.read_table(io.BytesIO(body)).to_pylist()]
    out["files"] = []
    for f in sorted(Path(by["files"]["path"]).glob("part-*.parquet")):
        out["files"] += [{**r, "epoch": int(f.name[5:15])} for r in pq.read_table(f).to_pylist()]
    return out


def check_exact(servers: Group, items: list[dict[str, Any]], sink: str, tmp: Path,
                state: Path, files: int = FILES) -> dict[str, list[dict[str, Any]]]:
    rows = [json.loads(line) for f in sorted((tmp / "in").iterdir())
            for line in f.read_text().splitlines()]
    want = {"events": rows, "archive": rows, "files": rows,
            "totals": [r for r in rows if r["amount"] >= 500]}
    got = rows_of(servers, items, sink)
    for name, expected in want.items():
        assert summarize(got[name]) == summarize(expected), name
        assert len(got[name]) == len({r["id"] for r in got[name]}), f"{name}: a row twice"
        # Every row in the epoch of its input file (one micro-batch per file).
        assert all(r["epoch"] == r["id"] // ROWS for r in got[name]), name
        assert servers.leftovers(name, next(i["options"] for i in items if i["name"] == name),
                                 sink) == 0, name
    group = TargetGroup.from_specs(sink, parse_targets(items, sink))
    try:
        cut = consistent_cut(group, DirectoryStateStore(state), sink)
    finally:
        group.close()
    assert cut.cut == files - 1 and set(cut.targets.values()) == {files - 1}, cut
    return got


def recipe(name: str) -> str:
    text = (REPO / "docs" / "multi-target.md").read_text()
    found = re.search(rf"<!-- recipe: {name} -->\s*```sql\n(.*?)```", text, re.S)
    assert found, name
    return found.group(1)


@pytest.mark.promise("kafka-reader-stops-at-cut", "backend")
@long_run
def test_driver_killed_mid_commit_then_every_target_exact_and_readers_stop_at_the_cut(
        servers: Group, tmp_path: Path) -> None:
    make_input(tmp_path / "in", files=FILES, rows_per_file=ROWS)
    run = uuid.uuid4().hex[:8]
    sink = f"mix-{run}"
    items = targets(servers, run)
    spec = {"mode": "stream", "input_dir": str(tmp_path / "in"),
            "checkpoint": str(tmp_path / "chk"), "sink_id": sink, "targets": items}
    multi_driver.run(spec, faults="after-first-commit@1:kill").check_killed(
        "after-first-commit@1")
    multi_driver.run(spec).check()
    got = check_exact(servers, items, sink, tmp_path, tmp_path / "chk" / "txsink")

    cut = 0  # read epoch 0 as a reader of the cut would, then the rest
    # PostgreSQL: the view of the page, over this test's table.
    table = next(i["options"]["table"] for i in items if i["name"] == "totals")
    view = recipe("pg-view").replace("public.order_totals_at_cut", f"public.cut_{run}")
    view = view.replace("public.order_totals", table)
    read = recipe("pg-read").replace("public.order_totals_at_cut", f"public.cut_{run}")
    read = read.replace("'11'", f"'{cut}'")
    pg = servers.servers["totals"].server  # type: ignore[attr-defined]
    with psycopg.connect(pg.url_with_password, autocommit=True) as conn:
        conn.execute(view)
        assert conn.execute(f"SELECT count(*) FROM public.cut_{run}").fetchone() == (0,)
        statements = [s for s in read.split(";") if s.strip()]
        for statement in statements[:-1]:
            conn.execute(statement)
        totals = dict(conn.execute(statements[-1]).fetchall())
    want: collections.Counter[int] = collections.Counter()
    for r in got["totals"]:
        if r["epoch"] <= cut:
            want[r["key"]] += r["amount"]
    assert totals == dict(want) and totals

    # Kafka: up to the cut, then on from where it stopped.
    from txsink_kafka.reader import read_up_to_cut, record_epoch

    kafka = servers.servers["events"]
    topic = next(i["options"]["topic"] for i in items if i["name"] == "events")
    config = {"bootstrap.servers": kafka.bootstrap}  # type: ignore[attr-defined]
    first = read_up_to_cut(config, topic, cut)
    assert first.complete
    assert {record_epoch(m) for m in first.records} == {0}
    assert len(first.records) == ROWS
    rest = read_up_to_cut(config, topic, FILES - 1, start=first.next_offsets)
    ids = [json.loads(m.value())["id"] for m in (*first.records, *rest.records)]
    assert sorted(ids) == list(range(FILES * ROWS))

    # S3: by the epoch manifests, up to the cut and then after it.
    from txsink_s3.reader import epochs_up_to
    from txsink_s3.reader import read_up_to_cut as s3_read

    options = next(i["options"] for i in items if i["name"] == "archive")
    early = s3_read(options, f"{sink}--archive", cut)
    late = s3_read(options, f"{sink}--archive", FILES - 1, after=cut)
    assert sorted(early.column("id").to_pylist()) == list(range(ROWS))
    assert sorted(late.column("id").to_pylist()) == list(range(ROWS, FILES * ROWS))
    assert [e.epoch for e in epochs_up_to(options, f"{sink}--archive", cut)] == [0]


@pytest.mark.promise("orphans-aborted", "datasource")
@pytest.mark.promise("group-all-or-none", "datasource")
@long_run
@pytest.mark.fault
@pytest.mark.parametrize("mode", ["stream", "foreach"])
def test_driver_killed_at_every_point_and_tasks_failing_mid_write(
        servers: Group, tmp_path: Path, mode: str) -> None:
    files = 3
    make_input(tmp_path / "in", files=files, rows_per_file=ROWS)
    run = uuid.uuid4().hex[:8]
    sink = f"kill-{run}"
    items = targets(servers, run)
    spec = {"mode": mode, "input_dir": str(tmp_path / "in"),
            "checkpoint": str(tmp_path / "chk"), "state": str(tmp_path / "group-state"),
            "sink_id": sink, "targets": items}
    # Every point at epoch 1, one run each: a run dies there, and the next one's
    # recovery (or Spark's replay of the batch) reaches the next point of the same epoch.
    for point in ("before-decide", "after-decide", "after-first-commit",
                  "before-mark-committed", "after-mark-committed"):
        multi_driver.run(spec, faults=f"{point}@1:kill").check_killed(point)
    # Executors failing mid-write: a task raises before and after preparing (Spark
    # retries it; the prepared attempt is an orphan), and an unreported twin prepares.
    multi_driver.run(spec, faults="task-before-pre-commit:raise,task-after-pre-commit:raise,"
                     "task-after-pre-commit:duplicate").check()
    state = tmp_path / ("chk/txsink" if mode == "stream" else "group-state")
    check_exact(servers, items, sink, tmp_path, state, files)
