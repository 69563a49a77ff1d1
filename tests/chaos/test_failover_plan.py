"""The failover chaos's planning and bookkeeping (no JVM: the runs themselves are in
``test_chaos_kafka_cluster.py`` and ``tox -e kafka-cluster-long``)."""

from __future__ import annotations

import collections
import json
import random
from pathlib import Path

from txsink.faults import POINTS

from tests.chaos.failover import (
    KINDS,
    WHOLE,
    Fault,
    append,
    fired_faults,
    plan,
    recovery_times,
)
from tests.chaos.runner import EPOCHS, PARTITIONS, Report, kinds_of, table


def test_plans_deal_every_kind_evenly_on_distinct_epochs() -> None:
    rng = random.Random(3)
    deck: list[str] = []
    dealt: collections.Counter[str] = collections.Counter()
    for _ in range(100):
        faults = plan(rng, 3, EPOCHS, PARTITIONS, cycle=deck)
        assert len({f.epoch for f in faults}) == len(faults) == 3
        for f in faults:
            dealt[f.kind] += 1
            assert 0 <= f.epoch < EPOCHS
            if f.point == "task":
                assert 0 <= f.partition < PARTITIONS
            else:
                assert f.point in (*POINTS, "epoch-start")
            if f.kind == "coordinator-kill-endtxn":
                assert 0 <= int(f.variant) < 16  # the kill's delay after EndTxn is sent, ms
    assert set(dealt) == set(KINDS)
    assert max(dealt.values()) - min(dealt.values()) <= 1
    # The short mode's six faults are one of each kind.
    short = plan(random.Random(1), 3, EPOCHS, PARTITIONS, cycle=(deck := []))
    short += plan(random.Random(2), 3, EPOCHS, PARTITIONS, cycle=deck)
    assert sorted(f.kind for f in short) == sorted(KINDS)


def test_the_log_counts_what_fired_and_how_long_the_cluster_took(tmp_path: Path) -> None:
    kill = Fault("controller-kill", 1, "after-decide")
    append(tmp_path, {"key": kill.key, "id": "a", "kind": kill.kind, "status": "done"})
    append(tmp_path, {"kind": "broker-pause", "id": "b", "status": "request"})
    append(tmp_path, {"kind": "node-restart", "status": "restarted"})
    append(tmp_path, {"kind": "whole", "status": "whole"})
    assert [e["kind"] for e in fired_faults(tmp_path)] == ["controller-kill"]
    [(kind, seconds)] = recovery_times(tmp_path)
    assert kind == "controller-kill" and 0 <= seconds < 5
    assert not (tmp_path / WHOLE).exists()
    lines = (tmp_path / "failover.jsonl").read_text().splitlines()
    assert all(json.loads(line)["t"] > 0 for line in lines)


def test_the_table_has_a_column_per_failover_kind() -> None:
    report = Report("kafka-cluster", seed=4, runs=2, records=6000)
    report.faults.update(dict.fromkeys(KINDS, 1))
    assert kinds_of("kafka-cluster") == KINDS
    text = table([report], kinds_of("kafka-cluster"))
    assert all(kind in text.splitlines()[0] for kind in KINDS)
    assert "ok" in text.splitlines()[2]
    report.lost = 1
    assert "FAILED" in table([report], KINDS)
