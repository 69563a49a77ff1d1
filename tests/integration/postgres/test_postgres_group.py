"""PostgreSQL as one target of a group, against a real server.

A decided participant that was rolled back by hand (the documented way to lose one)
stops the group with an error naming the target and the participant; the other
target keeps the epoch it committed, and the epoch stays DECIDED. The table's epoch
column and the commit markers give the cut.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer
from txsink.coordinator import Coordinator, RetryPolicy
from txsink.cut import consistent_cut
from txsink.errors import ParticipantLostError, SinkOwnedError
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.group import TargetGroup, write_group
from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import parse_targets

pytestmark = pytest.mark.integration


def test_a_lost_participant_stops_the_group_naming_target_and_participant(
        pg_server: PgServer, table_name: str, tmp_path: Path) -> None:
    sink = f"pg-group-{uuid.uuid4().hex[:6]}"
    items = [{"name": "totals", "backend": "postgres", "epoch_column": "txsink_epoch",
              "options": pg_server.options(table_name)},
             {"name": "files", "backend": "files", "options": {"path": str(tmp_path / "out")}}]
    with pg_server.connect(autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table_name} ADD COLUMN txsink_epoch bigint")
    group = TargetGroup.from_specs(sink, parse_targets(items, sink))
    store = DirectoryStateStore(tmp_path / "state")
    retry = RetryPolicy(attempts=2, initial_backoff_s=0, sleep=lambda s: None)
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()),
                             "name": pa.array(["a", "b", "c"]),
                             "amount": pa.array([1.0, 2.0, 3.0])})
    try:
        group.preflight(sink)
        coordinator = Coordinator(group, store, sink, retry=retry)
        coordinator.start()
        coordinator.commit_epoch(0, write_group(group, 0, 0, 0, [batch]))
        crashing = Coordinator(group, store, sink, retry=retry,
                               faults=FaultInjector([FaultRule(AFTER_DECIDE, 1, "raise")]))
        with pytest.raises(InjectedFault):
            crashing.commit_epoch(1, write_group(group, 1, 0, 0, [batch]))
        totals = next(c for c in store.get(1).committables  # type: ignore[union-attr]
                      if c.target == "totals")
        with pg_server.connect(autocommit=True) as conn:  # an operator rolls it back
            conn.execute(f"ROLLBACK PREPARED '{totals.payload['gid']}'")
        with pytest.raises(ParticipantLostError) as info:
            Coordinator(group, store, sink, retry=retry).start()
        message = str(info.value)
        assert f"target totals: {totals.participant}" in message
        assert "The epoch stays DECIDED" in message
        assert store.get(1).state is EpochState.DECIDED  # type: ignore[union-attr]
        assert len(list((tmp_path / "out").glob("part-0000000001-*"))) == 1  # files has it
        with pg_server.connect() as conn:
            rows = conn.execute(f"SELECT txsink_epoch, count(*) FROM {table_name} "
                                "GROUP BY 1").fetchall()
        assert rows == [(0, 3)]
        cut = consistent_cut(group, store, sink)
        assert cut.targets == {"totals": 0, "files": 1} and cut.cut == 0
    finally:
        group.close()


def test_a_postgres_target_of_another_query_leaves_the_files_target_unclaimed(
        pg_server: PgServer, table_name: str, tmp_path: Path) -> None:
    """The files target comes first: before the group checked every claim, it was
    claimed (its state.json written) and kept bound to a state the refused run then
    deleted. The check reads the owner table only where it exists: it creates no
    schema, table or row."""
    sink = f"pg-claim-{uuid.uuid4().hex[:6]}"
    schema = f"claims_{uuid.uuid4().hex[:8]}"
    items = [{"name": "files", "backend": "files", "options": {"path": str(tmp_path / "out")}},
             {"name": "totals", "backend": "postgres",
              "options": pg_server.options(table_name, marker_schema=schema)}]
    group = TargetGroup.from_specs(sink, parse_targets(items, sink))
    totals = group.members["totals"].backend

    def schemas() -> list[str]:
        with pg_server.connect() as conn:
            return [r[0] for r in conn.execute(
                "SELECT schema_name FROM information_schema.schemata WHERE schema_name = %s",
                (schema,)).fetchall()]

    try:
        totals.check_claim(f"{sink}--totals", "state-new", "/new")  # no owner table yet
        assert schemas() == []
        totals.claim_sink(f"{sink}--totals", "state-old", "/old")  # another query's
        with pytest.raises(SinkOwnedError, match="already written by another query") as info:
            group.claim_sink(sink, "state-new", "/new")
        assert info.value.owner_state == "/old"
        assert not (tmp_path / "out" / "_txsink" / "state.json").exists()
        with pg_server.connect() as conn:
            owners = conn.execute(f"SELECT sink_id, state_id FROM {schema}.txsink_commits_sinks"
                                  ).fetchall()
        assert owners == [(f"{sink}--totals", "state-old")]
        # The way out the refusal names, followed literally: its DELETE, then a claim.
        assert str(info.value).startswith("target 'totals' ("), str(info.value)
        statement = str(info.value).rsplit("gone for good, ", 1)[1]
        assert statement.startswith("DELETE FROM "), statement
        with pg_server.connect() as conn:
            conn.execute(statement)
        group.claim_sink(sink, "state-new", "/new")
        with pg_server.connect() as conn:
            owners = conn.execute(f"SELECT sink_id, state_id FROM {schema}.txsink_commits_sinks"
                                  ).fetchall()
        assert owners == [(f"{sink}--totals", "state-new")]
        assert "state-new" in (tmp_path / "out" / "_txsink" / "state.json").read_text()
    finally:
        group.close()
        with pg_server.connect() as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
