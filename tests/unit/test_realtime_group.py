"""A group of Real-time Mode targets without a JVM or a server: the pipeline file and
Python shapes, what is refused before any data moves (one line naming
``sink.targets[name]``), the group writer against in-memory targets, and what a run may
start with when a target would miss records another target holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from txsink.config import parse_pipeline
from txsink.errors import ConfigError
from txsink.realtime import (
    NOTHING,
    GroupWriter,
    PositionTarget,
    RealtimeTargetSpec,
    SourceTopics,
)
from txsink.realtime import SourcePartition as SP
from txsink.realtime.config import realtime_specs
from txsink.realtime.group import StartPoint, members_record, read_members, start_refusal

from tests.unit.test_realtime_writer import Clock, MemoryTarget, Store

KAFKA = {"name": "events", "backend": "kafka",
         "options": {"topic": "out", "kafka.bootstrap.servers": "b:9092"}}
PG = {"name": "totals", "backend": "postgres", "select": ["id", "k"], "where": "id > 0",
      "options": {"dsn": "host=db dbname=shop", "table": "public.t", "password": "s3cret"}}


def rt(sink: dict[str, Any]) -> dict[str, Any]:
    return {"source": {"type": "spark", "format": "kafka",
                       "options": {"kafka.bootstrap.servers": "b:9092", "subscribe": "in"}},
            "sink": sink, "checkpoint": "/tmp/chk", "trigger": {"real_time": "5 seconds"}}


def group(*targets: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return rt({"sink_id": "orders-rt", "targets": list(targets), **extra})


def test_a_group_parses_from_a_pipeline_file_with_per_target_select_and_where() -> None:
    cfg = parse_pipeline(group(KAFKA, PG, options={"commit_interval": "100 ms"}))
    assert [t.name for t in cfg.sink.targets] == ["events", "totals"]
    assert cfg.sink.targets[1].select == ("id", "k") and cfg.sink.targets[1].where == "id > 0"
    assert cfg.sink.options == {"commit_interval": "100 ms"}
    assert "s3cret" not in cfg.summary() and "stored source positions" in cfg.summary()
    assert "one decision per epoch" not in " ".join(cfg.header_lines())
    specs = realtime_specs(cfg.sink.sink_id, cfg.sink.targets)
    assert {n: s.sink_id for n, s in specs.items()} == {
        "events": "orders-rt--events", "totals": "orders-rt--totals"}  # own positions each


def other(target: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    return {**target, **changes}


@pytest.mark.promise("options-validated-before-data", "realtime")
@pytest.mark.promise("realtime-micro-batch-options-refused", "realtime")
@pytest.mark.promise("realtime-backend-without-path-refused", "realtime")
@pytest.mark.promise("realtime-same-place-refused", "realtime")
@pytest.mark.parametrize(("sink", "field", "words"), [
    (group(KAFKA, other(KAFKA, options={"topic": "o2", "kafka.bootstrap.servers": "b:9092"})),
     "sink.targets[events].name", "two targets are named 'events'"),
    (group(KAFKA, other(KAFKA, name="again",
                        options={"topic": "out", "kafka.bootstrap.servers": "c:9092,b:9092"})),
     "sink.targets[again].options", "write the same place (kafka topic out)"),
    (group(PG, other(PG, name="again", select=None, where=None,
                     options={"dsn": "dbname=shop host=db", "table": "t"})),
     "sink.targets[again].options", "same place (postgres database shop table public.t)"),
    (group(KAFKA, {"name": "archive", "backend": "files", "options": {"path": "/x"}}),
     "sink.targets[archive].backend", "has no real-time target"),
    (group(KAFKA, {"name": "gone", "backend": "nosuch", "options": {}}),
     "sink.targets[gone].backend", "nosuch"),
    (group(other(KAFKA, epoch_column="e")), "sink.targets[events].epoch_column",
     "no epochs"),
    (group(other(KAFKA, options={**KAFKA["options"], "commit_interval": "1 s"})),
     "sink.targets[events].options.commit_interval", "set it in sink.options"),
    (group(other(KAFKA, options={"tpic": "x", "kafka.bootstrap.servers": "b"})),
     "sink.targets[events].options.tpic", "unknown option"),
    (group(other(PG, options={"dsn": "host=db"})), "sink.targets[totals].options.table",
     "is required"),
    (group(KAFKA, options={"topic": "x"}), "sink.options.topic", "hold only commit_interval"),
    (group(KAFKA, options={"commit_interval": "0 ms"}), "sink.options.commit_interval",
     "positive duration"),
    (group(KAFKA, backend="kafka"), "sink.backend", "names a backend per target"),
    (group(KAFKA, guarantee="at_least_once"), "sink.guarantee", "exactly once only"),
    (group(), "sink.targets", "non-empty list"),
    (group(other(KAFKA, name="Bad-Name")), "sink.targets[0].name", "not a valid target name"),
])
def test_what_a_real_time_group_refuses_names_the_target(sink: dict[str, Any], field: str,
                                                         words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_pipeline(sink)
    assert info.value.field == field, str(info.value)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert "s3cret" not in str(info.value)


PG_HERE = {"name": "totals", "backend": "postgres",
           "options": {"dsn": "host=localhost port=5433 dbname=shop", "table": "public.t"}}
KAFKA_HERE = {"name": "events", "backend": "kafka",
              "options": {"topic": "out", "kafka.bootstrap.servers": "localhost:9092"}}


@pytest.mark.promise("realtime-same-place-refused", "realtime")
@pytest.mark.parametrize(("first", "second"), [
    # One server under two names: the loopback name and its address.
    (PG_HERE, other(PG_HERE, name="again", options={
        "dsn": "host=127.0.0.1 port=5433 dbname=shop", "table": "t"})),
    (PG_HERE, other(PG_HERE, name="again", options={
        "dsn": "postgresql://LOCALHOST:5433/shop", "table": "public.t"})),
    (KAFKA_HERE, other(KAFKA_HERE, name="again", options={
        "topic": "out", "kafka.bootstrap.servers": "127.0.0.1:9092"})),
    # One bootstrap list in another order.
    (other(KAFKA_HERE, options={"topic": "out", "kafka.bootstrap.servers": "b:9092,c:9093"}),
     other(KAFKA_HERE, name="again", options={"topic": "out",
                                              "kafka.bootstrap.servers": "c:9093, b:9092"})),
])
def test_one_place_under_two_names_is_refused_on_every_path(
        first: dict[str, Any], second: dict[str, Any]) -> None:
    """The same-place refusal compares servers by address (``localhost`` and
    ``127.0.0.1`` are one) and bootstrap lists as sets: in a pipeline file, from
    Python's ``targets(..., realtime=True)``, and from ``start_realtime``'s list (both
    go through the one check, before Spark is asked anything)."""
    import txsink.spark as ts
    from txsink.realtime.config import parse_realtime_targets

    with pytest.raises(ConfigError, match="write the same place") as info:
        parse_pipeline(group(first, second))
    assert info.value.field == "sink.targets[again].options"
    python = [ts.target(t["name"], t["backend"], **t["options"]) for t in (first, second)]
    with pytest.raises(ConfigError, match="write the same place") as info:
        ts.targets("orders-rt", python, realtime=True)
    assert info.value.field == "targets[again].options"
    with pytest.raises(ConfigError, match="write the same place"):
        parse_realtime_targets(python, "orders-rt")


def test_two_postgres_targets_on_other_servers_are_not_the_same_place() -> None:
    second = other(PG, name="replica", options={**PG["options"], "dsn": "host=db2 dbname=shop"})
    assert len(parse_pipeline(group(PG, second)).sink.targets) == 2


@pytest.mark.promise("realtime-duplicate-target-name-refused", "realtime")
@pytest.mark.promise("realtime-set-refuses-microbatch-calls", "datasource")
def test_the_python_target_set_is_checked_for_real_time_mode() -> None:
    import txsink.spark as ts

    rt_set = ts.targets("orders-rt", [
        ts.target("events", "kafka", topic="out", **{"kafka.bootstrap.servers": "b:9092",
                                                     "progress.topic": "p"}),
        ts.target("totals", "postgres", select=["id"], dsn="host=db", table="public.t",
                  progress_table="public.progress"),
    ], checkpoint_location="/tmp/chk", realtime=True)
    assert rt_set.realtime and rt_set.names == ["events", "totals"]
    with pytest.raises(ConfigError, match=r"built for Real-time Mode"):
        rt_set.write_stream(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        ts.targets("orders-rt", [ts.target("events", "kafka", topic="out"),
                                 ts.target("events", "kafka", topic="o2")], realtime=True)
    assert info.value.field == "targets[events].name"
    with pytest.raises(ConfigError) as info:  # micro-batch options are not real-time ones
        ts.targets("orders-rt", [ts.target("totals", "postgres", dsn="host=db", table="t",
                                           progress_table="p")], realtime=False)


# -- the group writer -------------------------------------------------------------------


A, B = SP("in", 0), SP("in", 1)


class Failing(MemoryTarget):
    def commit(self, offset: int) -> None:
        raise RuntimeError("server gone")


@pytest.mark.promise("realtime-group-each-target-exactly-once", "realtime")
def test_each_target_keeps_its_own_positions_and_a_filtered_record_still_moves_them() -> None:
    kafka, pg, clock = Store(), Store(), Clock()
    w = GroupWriter({"events": lambda s: MemoryTarget(kafka, s),
                     "totals": lambda s: MemoryTarget(pg, s)}, commit_interval_s=0.0,
                    clock=clock)
    for off in range(4):
        w.add(A, off, {"events": {"id": off}, "totals": {"id": off} if off % 2 else None})
    w.close()
    assert [r["id"] for r in kafka.rows] == [0, 1, 2, 3]
    assert [r["id"] for r in pg.rows] == [1, 3]
    assert kafka.offsets == pg.offsets == {A: 3}  # the filtered record 2 counts as passed


@pytest.mark.promise("realtime-claim-before-commit", "realtime")
def test_a_source_partition_is_claimed_in_every_target_before_any_commits() -> None:
    order: list[str] = []

    class Logged(MemoryTarget):
        def __init__(self, name: str, store: Store, source: SP) -> None:
            super().__init__(store, source)
            self.name = name

        def claim(self) -> int:
            order.append(f"claim {self.name}")
            return super().claim()

        def commit(self, offset: int) -> None:
            order.append(f"commit {self.name}")
            super().commit(offset)

    one, two = Store(), Store()
    w = GroupWriter({"a": lambda s: Logged("a", one, s), "b": lambda s: Logged("b", two, s)},
                    commit_interval_s=0.0)
    w.add(A, 0, {"a": {"id": 0}, "b": {"id": 0}})
    w.close()
    assert order[:2] == ["claim a", "claim b"] and order.index("commit a") > 1


@pytest.mark.promise("realtime-target-down-stops", "realtime")
def test_a_target_that_fails_does_not_hold_the_other_back_and_catches_up_on_replay() -> None:
    good, bad, clock = Store(), Store(), Clock()
    w = GroupWriter({"good": lambda s: MemoryTarget(good, s),
                     "bad": lambda s: Failing(bad, s)}, commit_interval_s=0.0, clock=clock)
    with pytest.raises(RuntimeError, match="server gone"):
        w.add(A, 0, {"good": {"id": 0}, "bad": {"id": 0}})
    w.close(RuntimeError("task failed"))
    assert good.offsets == {A: 0} and bad.offsets == {}  # good may be ahead: one commit
    again = GroupWriter({"good": lambda s: MemoryTarget(good, s),
                         "bad": lambda s: MemoryTarget(bad, s)}, commit_interval_s=0.0)
    for off in range(3):  # Spark replays from its checkpoint
        again.add(A, off, {"good": {"id": off}, "bad": {"id": off}})
    again.close()
    assert [r["id"] for r in good.rows] == [r["id"] for r in bad.rows] == [0, 1, 2]


# -- what a run may start with -----------------------------------------------------------


class Spec(RealtimeTargetSpec):
    def __init__(self, sink_id: str, where: str) -> None:
        self.sink_id, self.where = sink_id, where

    def prepare(self) -> None:
        pass

    def __call__(self, source: SP) -> PositionTarget:
        raise NotImplementedError

    def describe(self) -> str:
        return self.where


def judge(positions: Mapping[str, Mapping[SP, int]], *, fresh: bool = False,
          earliest: bool = False, recorded: Sequence[str] | None = None,
          places: Mapping[str, str] | None = None
          ) -> tuple[ConfigError | None, list[str]]:
    names = list(positions)
    specs = {n: Spec(f"g--{n}", (places or {}).get(n, f"topic {n}")) for n in names}
    backends = {n: "kafka" for n in names}
    record = None
    if recorded is not None:
        record = read_members(members_record(
            "g", {n: "kafka" for n in recorded},
            {n: Spec(f"g--{n}", f"topic {n}") for n in recorded}))
    return start_refusal("g", backends, specs, positions, record,
                         StartPoint(fresh, earliest), prefix="sink.targets")


@pytest.mark.promise("realtime-target-added-refused", "realtime")
def test_a_target_added_to_a_group_that_ran_is_refused() -> None:
    refusal, _ = judge({"a": {A: 99, B: 50}, "c": {}}, recorded=["a"])
    assert refusal is not None and refusal.field == "sink.targets[c]"
    assert "new to real-time group 'g'" in str(refusal) and "startingOffsets=earliest" in str(
        refusal)
    # A checkpoint from before the group recorded its targets: the positions tell.
    refusal, _ = judge({"a": {A: 99}, "c": {}})
    assert refusal is not None and "holds no position of source partition in-0" in str(refusal)
    # Its positions may have been deleted with its rows kept: the way out says to delete
    # them, or from the earliest offsets they would be written twice.
    assert "delete those rows first" in str(refusal)


@pytest.mark.promise("realtime-claim-before-commit", "realtime")
def test_a_crash_between_two_targets_commits_is_not_taken_for_a_new_target() -> None:
    # "c" claimed in-0 (NOTHING) before "a" committed; then the driver died.
    refusal, warnings = judge({"a": {A: 7}, "c": {A: NOTHING}}, recorded=["a", "c"])
    assert refusal is None and warnings == []


@pytest.mark.promise("realtime-target-behind-refused", "realtime")
@pytest.mark.promise("realtime-target-removed-warns", "realtime")
def test_a_removed_target_is_allowed_and_adding_it_back_is_refused() -> None:
    refusal, warnings = judge({"a": {A: 99}}, recorded=["a", "c"])
    assert refusal is None and "target(s) c left the group" in warnings[0]
    refusal, _ = judge({"a": {A: 199}, "c": {A: 99}}, recorded=["a"])  # stale positions
    assert refusal is not None and refusal.field == "sink.targets[c]"


@pytest.mark.promise("realtime-target-moved-refused", "realtime")
def test_a_target_moved_under_the_same_name_is_refused() -> None:
    refusal, _ = judge({"a": {A: 9}, "c": {A: 9}}, recorded=["a", "c"],
                       places={"c": "topic elsewhere"})
    assert refusal is not None and refusal.field == "sink.targets[c].options.place"
    assert "moved: the checkpoint of target 'c' of real-time group 'g' recorded place " \
        "'topic c', this run has 'topic elsewhere'" in str(refusal)
    assert "\n" not in str(refusal)


@pytest.mark.promise("realtime-new-checkpoint-uneven-refused", "realtime")
def test_a_new_checkpoint_replaying_from_earliest_lets_a_target_catch_up_loudly() -> None:
    refusal, warnings = judge({"a": {A: 99, B: 5}, "c": {}}, fresh=True, earliest=True,
                              recorded=["a"])
    assert refusal is None
    assert any("'c' holds no position of source partition in-0" in w
               and "catches up from the earliest offset" in w for w in warnings)
    # Not from earliest: it would skip what lies between its position and the start.
    refusal, _ = judge({"a": {A: 99}, "c": {A: 10}}, fresh=True, earliest=False)
    assert refusal is not None and "does not start from the earliest offsets" in str(refusal)
    # A reset checkpoint with every target level is fine from any starting offset.
    assert judge({"a": {A: 99}, "c": {A: 99}}, fresh=True)[0] is None


def test_a_new_group_starts_with_no_positions_anywhere() -> None:
    assert judge({"a": {}, "c": {}}) == (None, [])
    assert judge({"a": {}, "c": {}}, fresh=True) == (None, [])


def test_another_sinks_record_in_the_checkpoint_is_not_this_groups() -> None:
    specs = {"a": Spec("h--a", "topic a")}
    record = read_members(members_record("h", {"x": "kafka"}, {"x": Spec("h--x", "topic x")}))
    refusal, _ = start_refusal("g", {"a": "kafka"}, specs, {"a": {}}, record,
                               StartPoint(False, False))
    assert refusal is None


@pytest.mark.promise("realtime-target-moved-refused", "realtime")
def test_a_target_renamed_over_the_same_place_is_refused_with_the_name_to_keep() -> None:
    # "sums" writes the table "totals" wrote: under a new name its positions start anew,
    # and a new checkpoint from earliest would write every record there a second time.
    refusal, _ = judge({"a": {A: 9}, "sums": {}}, recorded=["a", "totals"],
                       places={"sums": "topic totals"})
    assert refusal is not None and refusal.field == "sink.targets[sums]"
    assert "writes where 'totals'" in str(refusal) and "Keep the name 'totals'" in str(refusal)
    assert "startingOffsets=earliest (every" not in str(refusal)  # not a way out here


def test_status_of_a_real_time_group_file_reads_positions_and_says_when_it_cannot(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """No server answers here: each target says why its positions are unknown, in one
    line without the password, and the run of the command still succeeds (read only)."""
    import json

    import yaml
    from txsink.cli import main

    down = {"dsn": "host=127.0.0.1 port=1 dbname=shop connect_timeout=2",
            "password": "s3cret-pw"}
    data = group({"name": "totals", "backend": "postgres",
                  "options": {**down, "table": "public.t"}},
                 {"name": "audit", "backend": "postgres",
                  "options": {**down, "table": "public.audit"}})
    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "real-time mode, a group of 2 targets" in out
    assert "target totals: postgres, postgres table public.t" in out
    assert out.count("positions: unknown (postgres real-time target: cannot connect") == 2
    assert "s3cret-pw" not in out
    assert main(["status", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "real_time" and set(report["targets"]) == {"totals", "audit"}
    assert report["targets"]["audit"]["sink_id"] == "orders-rt--audit"
    assert "s3cret-pw" not in json.dumps(report)


class Reads(SourceTopics):
    """A source as the Spark adapter describes it (no JVM here): what it subscribes to,
    matches or is assigned, on which servers."""

    def __init__(self, servers: str, subscribe: Sequence[str] = (), pattern: str = "",
                 assign: Sequence[str] = (), cluster: str | None = None) -> None:
        self._servers, self.subscribe, self.pattern = servers, list(subscribe), pattern
        self.assign, self.cluster = list(assign), cluster

    def reads(self, topic: str) -> bool:
        import re

        return (topic in self.subscribe or topic in self.assign
                or bool(self.pattern and re.fullmatch(self.pattern, topic)))

    def topics(self) -> list[str]:
        return self.subscribe + self.assign

    def topic_ids(self, topics: Sequence[str]) -> dict[str, str]:
        return {}

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {}

    def servers(self) -> str:
        return self._servers

    def cluster_id(self) -> str | None:
        return self.cluster

    def describe(self) -> str:
        return "test source"


@pytest.mark.promise("realtime-feedback-topic-refused", "realtime")
@pytest.mark.parametrize(("source", "loops"), [
    (Reads("b:9092", subscribe=["out"]), True),
    (Reads("x:1, b:9092", subscribe=["in", "out"]), True),
    (Reads("b:9092", pattern="o.t"), True),  # subscribePattern matching the target
    (Reads("b:9092", pattern="orders-.*"), False),
    (Reads("b:9092", assign=["out"]), True),  # assign naming it
    (Reads("b:9092", subscribe=["in"]), False),
    (Reads("other:9092", subscribe=["out"]), False),  # another cluster
])
def test_a_kafka_target_knows_when_it_would_feed_the_topic_the_query_reads(
        source: Reads, loops: bool) -> None:
    """start_realtime refuses a target writing a topic the query reads, in any of the
    three ways Spark's Kafka source takes topics (it would read its own output again
    without end); the judgement is the Kafka backend's."""
    spec = realtime_specs("g", parse_pipeline(group(KAFKA)).sink.targets)["events"]
    assert spec.feeds(source) is loops
    pg = realtime_specs("g", parse_pipeline(group(PG)).sink.targets)["totals"]
    assert not pg.feeds(source)


@pytest.mark.promise("realtime-cut-resolve-refused", "cli")
@pytest.mark.parametrize("command", ["cut", "resolve", "resolve-checkpoint"])
def test_cut_and_resolve_say_in_one_line_that_real_time_has_no_epochs(
        command: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Given the pipeline file (or, for resolve, the query's checkpoint directory): one
    line saying why there is nothing to act on and what to use instead; nothing done."""
    import yaml
    from txsink.cli import main

    checkpoint = tmp_path / "chk"
    checkpoint.mkdir()
    (checkpoint / "keep").write_text("x")
    (checkpoint / "txsink-realtime.json").write_text('{"sink_id": "orders-rt", "targets": {}}')
    data = {**group(KAFKA, PG), "checkpoint": str(checkpoint)}
    path = tmp_path / "rt.yaml"
    path.write_text(yaml.safe_dump(data))
    argv = {"cut": ["cut", str(path)],
            "resolve": ["resolve", str(path), "--epoch", "3", "--commit"],
            "resolve-checkpoint": ["resolve", str(checkpoint), "--epoch", "3", "--abort"]}
    assert main(argv[command]) == 1
    err = capsys.readouterr().err
    verb = command.split("-")[0]
    assert f"`txsink {verb}` does not apply to a real-time pipeline" in err
    assert "real-time targets have no epochs and nothing in doubt" in err
    assert "`txsink status" in err
    assert err.count("\n") == 1 and "s3cret" not in err
    assert (checkpoint / "keep").exists()  # nothing deleted


def test_status_of_a_single_real_time_target_file(tmp_path: Any,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import yaml
    from txsink.cli import main

    data = rt({"backend": "postgres", "sink_id": "rt-one", "options": {
        "dsn": "host=127.0.0.1 port=1 connect_timeout=2", "password": "s3cret-pw",
        "table": "public.t", "commit_interval": "100 ms"}})
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["status", str(path)]) == 0
    out = capsys.readouterr().out
    assert "sink 'rt-one': real-time mode, exactly once by stored source positions" in out
    assert "(commit every 100 ms)" in out and "target: postgres, postgres table public.t" in out
    assert "positions: unknown" in out and "s3cret-pw" not in out


@pytest.mark.promise("realtime-sink-id-double-dash-refused", "realtime")
def test_a_single_real_time_sink_named_like_a_group_target_is_refused() -> None:
    """"orders-rt--events" is where group "orders-rt"'s target "events" keeps its
    positions: a single sink with that id would skip the records the target wrote."""
    single = rt({"backend": "kafka", "sink_id": "orders-rt--events",
                 "options": {"topic": "elsewhere", "kafka.bootstrap.servers": "b:9092"}})
    with pytest.raises(ConfigError) as info:
        parse_pipeline(single)
    assert info.value.field == "sink.sink_id" and "share that target's" in str(info.value)


def test_sessions_kept_between_batches_stay_with_their_own_target() -> None:
    """A query run keeps claimed sessions between its batches (SessionPool, keyed by run
    and source partition): in a group each target keeps its own, never another's."""
    from txsink.realtime import SessionPool

    class Kept(MemoryTarget):
        reusable = True

    pool, one, two = SessionPool(), Store(), Store()
    made: list[str] = []

    def factory(name: str, store: Store) -> Any:
        def make(source: SP) -> PositionTarget:
            made.append(name)
            return Kept(store, source)
        return make

    def batch(offsets: range) -> GroupWriter:
        w = GroupWriter({"a": factory("a", one), "b": factory("b", two)},
                        commit_interval_s=0.0, run="run-1", pool=pool)
        for off in offsets:
            w.add(A, off, {"a": {"id": off}, "b": {"id": -off}})
        w.close()
        return w

    batch(range(0, 3))
    w = batch(range(3, 6))
    assert made == ["a", "b"] and len(pool) == 2  # claimed once each, then kept
    assert [r["id"] for r in one.rows] == [0, 1, 2, 3, 4, 5]
    assert [r["id"] for r in two.rows] == [0, -1, -2, -3, -4, -5]
    kept = {run: k.target.store for (run, _, _), k in pool._idle.items()}
    assert kept == {"run-1/a": one, "run-1/b": two}
    assert w.stats["a"].written == w.stats["b"].written == 3
    pool.clear()


def test_a_group_targets_identity_refusals_name_the_target() -> None:
    """The one check every path shares names a group target's options (the task's
    claim knows only the target's sink id ``<group>--<name>``)."""
    from txsink.realtime import StoredPosition
    from txsink.realtime.identity import claim_refusal, start_identity_refusal

    stored = StoredPosition(9, "id-1", {"topic": "out"})
    moved = claim_refusal("g--events", {"topic": "elsewhere"}, SP("in", 0, "id-1"), stored)
    assert moved is not None and moved.field == "targets[events].options.topic"
    assert "its stored positions recorded topic 'out', this run has 'elsewhere'" in str(moved)
    assert claim_refusal("g--events", {"topic": "out"}, SP("in", 0, "id-1"), stored) is None
    assert claim_refusal("g--events", {"topic": "out"}, SP("in", 0), stored) is None
    recreated = claim_refusal("g--events", {"topic": "out"}, SP("in", 0, "id-2"), stored)
    assert recreated is not None and "counted in topic id id-1" in str(recreated)
    # Before data moves: the same judgement, from the driver.
    refusal = start_identity_refusal("g--events", {SP("in", 0): stored}, {"topic": "out"},
                                     {"in": "id-2"}, None, field="sink.targets[events].options")
    assert refusal is not None and "now has id id-2" in str(refusal)
    legacy = {SP("in", 0): StoredPosition(9)}
    assert start_identity_refusal("g--events", legacy, {"topic": "out"}, {"in": "id-2"},
                                  lambda topic: {0: 10}, field="x") is None  # within: kept
    past = start_identity_refusal("g--events", legacy, {"topic": "out"}, {"in": "id-2"},
                                  lambda topic: {0: 9}, field="x")
    assert past is not None and "ends at offset 9 now" in str(past)
    # Not read by this query, or claimed with nothing counted: nothing to judge.
    assert start_identity_refusal("g--events", {SP("old", 0): stored}, {"topic": "out"},
                                  {"in": "id-2"}, None, field="x") is None
    assert start_identity_refusal("g--events", {SP("in", 0): StoredPosition(NOTHING, "id-1")},
                                  {"topic": "out"}, {"in": "id-2"}, None, field="x") is None


@pytest.mark.promise("realtime-sink-id-reused-refused", "realtime")
@pytest.mark.parametrize(("target", "option", "value"), [
    (PG, "progress_table", "public.other_progress"),
    (KAFKA, "progress.topic", "other-progress"),
])
def test_a_target_given_another_progress_store_on_its_checkpoint_is_refused(
        target: dict[str, Any], option: str, value: str) -> None:
    """The same table or topic with another progress table or topic: its positions are
    in the old one, so under the new one every replayed record would be written again
    (a sink id's progress store is part of where it writes)."""
    name = target["name"]
    before = realtime_specs("g", parse_pipeline(group(target)).sink.targets)
    moved = other(target, options={**target["options"], option: value})
    after = realtime_specs("g", parse_pipeline(group(moved)).sink.targets)
    record = read_members(members_record("g", {name: target["backend"]}, before))
    refusal, _ = start_refusal("g", {name: target["backend"]}, after, {name: {}}, record,
                               StartPoint(False, False), prefix="sink.targets")
    assert refusal is not None
    assert refusal.field == f"sink.targets[{name}].options.{option}"
    assert "positions are in the old progress store" in str(refusal)
    same = start_refusal("g", {name: target["backend"]}, before, {name: {}}, record,
                         StartPoint(False, False), prefix="sink.targets")
    assert same == (None, [])


def test_one_topic_id_in_either_base64_alphabet_is_one_id() -> None:
    """Kafka's Java client (the driver) writes topic ids in URL-safe base64, librdkafka
    in standard base64: a position recorded in one spelling is the same topic in the
    other, and a different id is still different."""
    from txsink.realtime import StoredPosition
    from txsink.realtime.identity import claim_refusal, same_topic_id

    assert same_topic_id("7nBAHv_FT1miS5e2zkE20A", "7nBAHv/FT1miS5e2zkE20A")
    assert same_topic_id("a-b_c", "a+b/c==")
    assert not same_topic_id("7nBAHv_FT1miS5e2zkE20A", "7nBAHv_FT1miS5e2zkE20B")
    stored = StoredPosition(9, "7nBAHv_FT1miS5e2zkE20A", {"topic": "out"})
    assert claim_refusal("s", {"topic": "out"}, SP("in", 0, "7nBAHv/FT1miS5e2zkE20A"),
                         stored) is None
