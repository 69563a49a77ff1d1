"""The cluster chaos mode's planning (no JVM here: the runs themselves are long and
live in the tox ``cluster`` environment, ``python -m tests.chaos.cluster``)."""

from __future__ import annotations

import random

from txsink.faults import POINTS, TASK_POINTS, parse

from tests.chaos.cluster import EPOCHS, KINDS, ClusterReport, _kind_of, plan_run, table


def test_plans_are_valid_fault_specs_with_one_task_fault_per_epoch() -> None:
    rng = random.Random(1)
    seen_kinds: set[str] = set()
    for _ in range(200):
        plan = plan_run(rng, 3)
        rules = parse(",".join(plan.task_rules + plan.driver_rules))
        task = [r for r in rules if r.point in TASK_POINTS]
        assert all(r.action in ("kill-jvm", "stall") for r in task)
        assert len({r.epoch for r in task}) == len(task)  # a stage retry must not meet two
        assert all(r.point in POINTS and r.action == "kill" for r in rules if r not in task)
        assert all(r.epoch is not None and 0 <= r.epoch < EPOCHS for r in rules)
        assert plan.speculation == any(r.action == "stall" for r in task)
        seen_kinds |= {_kind_of(f"{r.point}@{r.epoch}:{r.action}") for r in rules}
        if plan.worker_kill_after_s is not None:
            seen_kinds.add("worker-kill")
    assert seen_kinds >= set(KINDS) - {"speculation"} | {"stall"}


def test_the_table_shows_every_kind_and_the_verdict() -> None:
    report = ClusterReport("files", seed=3, runs=1, records=600)
    report.faults.update({"worker-kill": 1, "speculation": 1})
    text = table([report])
    assert all(kind in text for kind in KINDS)
    assert "ok" in text.splitlines()[2]
    report.duplicated = 1
    assert "FAILED" in table([report])
