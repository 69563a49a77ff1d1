"""Spark's connectors maintain a table while txsink writes it.

A stream goes into the table through txsink in rounds (each round a query to the end
of its input, the same checkpoint: a pipeline stopped and started, as in production).
Between rounds, and in a thread during a round, Spark runs the maintenance data teams
schedule: Delta's OPTIMIZE and VACUUM, Iceberg's rewrite_data_files, expire_snapshots
and remove_orphan_files. Every row stays exactly once (read by Spark and by the
independent reader), and txsink's claim survives or is written again. Then a RESTORE
(Delta) or rollback_to_snapshot (Iceberg) past txsink's epochs: the next round stops,
naming it, and writes nothing."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.interop.conftest import Lake
from tests.e2e.interop.harness import (
    as_rows,
    delta_rs_rows,
    pyiceberg_rows,
    pyiceberg_table,
    stream,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _during(action: Callable[[], None], run: Callable[[], None]) -> list[BaseException]:
    """``action`` over and over in a thread while ``run`` runs; what it raised."""
    done = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not done.is_set():
            try:
                action()
            except BaseException as exc:  # a maintenance job losing a race is its own
                errors.append(exc)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        run()
    finally:
        done.set()
        thread.join(300)
    return errors


def test_delta_optimize_vacuum_restore_beside_txsink(lake: Lake, tmp_path: Path) -> None:
    table = tmp_path / "t"
    name = f"delta.`{table}`"
    opts = {"path": str(table)}
    rows = write_input(tmp_path / "in", 0, 2)

    def round_() -> None:
        stream(lake.spark, "native", "delta", opts, tmp_path / "in", tmp_path / "chk", "m")

    round_()
    lake.sql(f"OPTIMIZE {name}")
    optimized = int(lake.sql(f"DESCRIBE HISTORY {name} LIMIT 1")[0]["version"])
    lake.sql(f"VACUUM {name} RETAIN 0 HOURS")  # between epochs: nothing prepared
    assert (table / "txsink" / "m--t" / "_owner.json").exists()
    rows += write_input(tmp_path / "in", 2, 3)
    other: list[tuple[int, int, int, int]] = []

    def maintain_and_append() -> None:
        lake.sql(f"OPTIMIZE {name}")
        lake.sql(f"VACUUM {name}")
        row = (-1 - len(other), 0, 0, 0)  # a second writer's row (negative ids)
        lake.sql(f"INSERT INTO {name} VALUES ({row[0]}, 0, 0, timestamp_seconds(0))")
        other.append(row)

    errors = _during(maintain_and_append, round_)
    lake.outcomes.append(f"delta | OPTIMIZE, VACUUM (default retention), another writer's "
                         f"INSERT during commits | maintain | exact ({len(errors)} "
                         "maintenance conflicts)")
    assert as_rows(lake.sql(f"SELECT * FROM {name}")) == delta_rs_rows(table) == sorted(
        rows + other)
    rows += other
    lake.outcomes.append("delta | OPTIMIZE, VACUUM RETAIN 0 HOURS between epochs | maintain"
                         " | exact, claim kept")

    # Before the second round's epochs (older versions lost their files to VACUUM).
    lake.sql(f"RESTORE TABLE {name} TO VERSION AS OF {optimized}")
    kept = delta_rs_rows(table)
    write_input(tmp_path / "in", 5, 1)
    with pytest.raises(Exception, match=r"restored \(RESTORE"):
        round_()
    assert delta_rs_rows(table) == kept
    lake.outcomes.append("delta | RESTORE before txsink's epochs | maintain | refused: "
                         "the next epoch stops, naming the RESTORE")


def test_iceberg_rewrite_expire_orphans_rollback_beside_txsink(lake: Lake, tmp_path: Path
                                                               ) -> None:
    opts, name = lake.iceberg(tmp_path / "wh", "db.m")
    catalog, ident = name.split(".", 1)
    rows = write_input(tmp_path / "in", 0, 2)

    def round_() -> None:
        stream(lake.spark, "native", "iceberg", opts, tmp_path / "in", tmp_path / "chk", "m")

    def maintain(orphans: bool) -> None:
        lake.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{ident}', "
                 "options => map('min-input-files', '2'))")
        lake.sql(f"CALL {catalog}.system.expire_snapshots(table => '{ident}', "
                 "older_than => current_timestamp(), retain_last => 1)")
        if orphans:
            # Iceberg refuses an interval under 24 hours ("may corrupt the table if other
            # operations are happening"): its own guard for a running writer.
            day_ago = (datetime.datetime.now(datetime.timezone.utc)
                       - datetime.timedelta(days=1, minutes=1)).strftime("%Y-%m-%d %H:%M:%S")
            lake.sql(f"CALL {catalog}.system.remove_orphan_files(table => '{ident}', "
                     f"older_than => TIMESTAMP '{day_ago}')")

    round_()
    first = pyiceberg_rows(opts)
    assert first == sorted(rows)
    maintain(orphans=True)  # between rounds: nothing prepared
    rows += write_input(tmp_path / "in", 2, 3)
    errors = _during(lambda: maintain(orphans=False), round_)
    lake.outcomes.append(f"iceberg | rewrite_data_files, expire_snapshots during commits | "
                         f"maintain | exact ({len(errors)} maintenance conflicts)")
    assert as_rows(lake.spark.table(name).collect()) == pyiceberg_rows(opts) == sorted(rows)
    lake.outcomes.append("iceberg | rewrite_data_files, expire_snapshots, "
                         "remove_orphan_files between epochs | maintain | exact")

    before = pyiceberg_table(opts).current_snapshot().snapshot_id
    write_input(tmp_path / "in", 5, 1)
    round_()  # one more epoch, then the table is rolled back past it
    lake.sql(f"CALL {catalog}.system.rollback_to_snapshot('{ident}', {before})")
    kept = pyiceberg_rows(opts)
    assert kept == sorted(rows)
    write_input(tmp_path / "in", 6, 1)
    with pytest.raises(Exception, match="rolled back past epochs"):
        round_()
    assert pyiceberg_rows(opts) == kept
    lake.outcomes.append("iceberg | rollback_to_snapshot past txsink's epochs | maintain | "
                         "refused: the next epoch stops, naming the rollback")
