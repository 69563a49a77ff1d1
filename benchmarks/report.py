"""The performance page from benchmark results: ``docs/performance.md`` and its chart.

Measuring and reporting are apart: ``run_all.py`` runs every benchmark and writes each
one's result as JSON into a results directory; this module turns such a directory into
the page and ``performance.png``, so a page can be rendered again from saved results
(``python benchmarks/report.py RESULTS_DIR``) and a new benchmark adds a JSON producer
and its section here, not another hundred lines in the runner.

The results directory holds:

* ``run.json``: the yardsticks (Spark's own sinks next to txsink, from ``run_all.py``):
  ``{"info", "versions", "sizes": {target: records}, "rounds", "quick", "command",
  "loads": [...], "results": {target: [Writer.to_dict(), ...]}}``;
* ``commit.json``, ``kafka.json``, ``postgres.json``, ``multi.json``: what
  ``commit_bench.py``, ``kafka_bench.py``, ``postgres_bench.py`` and ``multi_bench.py``
  write with ``--json``;
* ``lake.json``, ``realtime.json``: ``lake_bench.py`` and ``realtime_bench.py``;
* ``notes.json``: ``{name: note}``, where each of those came from or why it is missing.

The soak (``soak.py``, ``tox -e soak``) runs apart, for hours: its JSON
(``soak.py --json``) renders into ``soak.png`` and the page's section between
:data:`SOAK_START` and :data:`SOAK_END` (:func:`render_soak`), which a render of the
benchmarks keeps as it is.

To add a benchmark: give it a ``--json PATH`` output, have ``run_all.py`` run it into
the results directory (``sub_bench``), and add its rows to ``targets_of`` (the table
of targets) and, if it has one, its section to ``write_doc``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TITLES = {"kafka": "Kafka", "postgres": "PostgreSQL", "s3": "S3", "files": "files"}
#: txsink exactly-once / Spark built-in (at-least-once), from the issue.
TARGET_RATIO = {"kafka": 0.8, "postgres": 0.8, "s3": 0.8, "files": 0.85}
#: txsink exactly-once / the no-op Arrow Python writer (files only).
NOOP_TARGET = 0.9
#: txsink on Spark's own Parquet writer (the native path) / Spark's Parquet writer:
#: S3 from issue 41, files from files_bench.
NATIVE_TARGET = {"s3": 1.0, "files": 0.9}


class Sizes(dict[str, int]):
    """Records per write, by target."""

    def of(self, target: str) -> int:
        return int(self[target])


@dataclass
class Writer:
    """One row of the table: a writer of a target and its timings."""

    target: str
    key: str            # the label given to files_bench.compare
    name: str
    guarantee: str
    seconds: list[float] = field(default_factory=list)
    cpu_load: list[float] = field(default_factory=list)
    vs_builtin: float | None = None   # median of per-round ratios, from compare
    vs_noop: float | None = None

    def rate(self, rows: int) -> float:
        return rows / statistics.median(self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Writer:
        return cls(**data)



def verdict(w: Writer) -> tuple[str, str]:
    """(target text, met text) of a row; only txsink exactly-once has targets."""
    if w.key == "txsink-native" and w.target in NATIVE_TARGET:
        goal = NATIVE_TARGET[w.target]
        met = w.vs_builtin is not None and w.vs_builtin >= goal
        return f"≥ {goal:.2f} of Spark", "yes" if met else "**no**"
    if w.key != "txsink":
        return "", ""
    goal = TARGET_RATIO[w.target]
    texts = [f"≥ {goal:.2f} of Spark"]
    met = w.vs_builtin is not None and w.vs_builtin >= goal
    if w.target == "files":
        texts.append(f"≥ {NOOP_TARGET:.2f} of no-op")
        met = met and w.vs_noop is not None and w.vs_noop >= NOOP_TARGET
    return ", ".join(texts), "yes" if met else "**no**"


def markdown_rows(writers: list[Writer], rows: int) -> str:
    out = []
    for w in writers:
        builtin = "1.00 (baseline)" if w.key == "spark" else (
            f"{w.vs_builtin:.2f}" if w.vs_builtin is not None else "")
        noop = f"{w.vs_noop:.2f}" if w.vs_noop is not None else ""
        goal, met = verdict(w)
        runs = ", ".join(f"{s:.1f}" for s in w.seconds)
        out.append(f"| {TITLES[w.target]} | {w.name} | {w.guarantee} | {rows:,} | "
                   f"{w.rate(rows):,.0f} | {builtin} | {noop} | {goal} | {met} | {runs} |")
    return "\n".join(out)


TABLE_HEAD = ("| target | writer | guarantee | records per write | records/s (median) | "
              "vs Spark built-in | vs no-op writer | target | met | seconds per round |\n"
              "|---|---|---|---:|---:|---:|---:|---|---|---|")


def chart(results: dict[str, list[Writer]], path: Path, subtitle: str) -> None:
    """Bars of each writer's throughput relative to the Spark built-in of its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("txsink", "txsink exactly-once", "#1f77b4"),
              ("txsink-native", "txsink exactly-once, Spark's own writer", "#2ca02c"),
              ("txsink-alo", "txsink at-least-once", "#9ecae1"),
              ("py-noop", "no-op Arrow Python writer", "#bbbbbb")]
    targets = list(results)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    width = 0.2
    for n, (key, label, color) in enumerate(series):
        xs, ys = [], []
        for t, target in enumerate(targets):
            w = next((w for w in results[target] if w.key == key), None)
            if w is not None and w.vs_builtin is not None:
                xs.append(t + (n - 1.5) * width)
                ys.append(w.vs_builtin)
        if xs:
            bars = ax.bar(xs, ys, width, label=label, color=color)
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.axhline(1.0, color="#444444", linewidth=0.8, label="Spark built-in = 1")
    ax.axhline(0.8, color="#d62728", linestyle="--", linewidth=1.2, label="target 0.8")
    if "files" in targets:
        t = targets.index("files")
        ax.hlines(0.85, t - 1.5 * width, t + 1.5 * width, colors="#d62728",
                  linestyles=":", linewidth=1.5, label="files target 0.85")
    ax.set_xticks(range(len(targets)), [TITLES[t] for t in targets])
    ax.set_ylabel("throughput / Spark's own sink (same run)")
    ax.set_title("txsink vs Spark's built-in sinks\n" + subtitle, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class Target:
    """One target of the performance issue, its measured value and whether it holds."""

    item: str
    measure: str
    value: float | None
    goal: float
    higher_is_better: bool
    unit: str = ""
    source: str = ""

    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    def row(self) -> str:
        sign = "≥" if self.higher_is_better else "≤"
        value = "not measured" if self.value is None else f"{self.value:,.2f}{self.unit}"
        met = {True: "yes", False: "**no**", None: "-"}[self.met()]
        return (f"| {self.item} | {self.measure} | {value} | {sign} {self.goal:g}{self.unit} "
                f"| {met} | {self.source} |")


def miss_notes(goals: list[Target], results: dict[str, list[Writer]],
               kafka: dict[str, Any] | None) -> list[str]:
    """Why each missed target was missed, with this run's own figures where they say it."""
    notes: list[str] = []
    missed = {g.measure for g in goals if g.met() is False}

    def rate(target: str, key: str) -> Writer | None:
        return next((w for w in results.get(target, []) if w.key == key), None)

    if any(m.startswith("files: txsink exactly-once / Spark") for m in missed):
        noop = rate("files", "py-noop")
        if noop is not None and noop.vs_builtin is not None:
            notes.append(
                f"* files against Spark's Parquet writer: the no-op Arrow Python writer, "
                f"which takes every batch Spark hands to Python and writes nothing, reaches "
                f"{noop.vs_builtin:.2f} of Spark's writer in this run. That hand-over from "
                "the JVM to a Python worker is paid by every Python data source before it "
                "writes a byte, so no Python sink can reach 0.85 here; txsink's own share "
                "(encoding, fsyncs, the two-phase commit) is the distance to the no-op "
                "writer, the first row of this table.")
    writers = (kafka or {}).get("writers", {})
    if any("plain transactional" in m for m in missed) and {"spark", "plain_txn"} <= set(
            writers):
        spark = writers["spark"]["records_per_s"]
        plain = writers["plain_txn"]["records_per_s"]
        notes.append(
            f"* Kafka against a plain transactional producer: Spark's own Kafka sink "
            f"reaches {spark / plain:.2f} of it in the same benchmark. The plain producers "
            "run in one process on records collected before the clock starts, with no "
            "Spark scan or Arrow hand-over, while Spark's executors, their Python workers, "
            "the producers' threads and the broker share the two cores: the gap is "
            "Spark's, not the transaction protocol's.")
    if any(m.startswith("exactly_once:") for m in missed):
        notes.append(
            "* Kafka exactly-once open cost: an exactly-once participant's transaction stays "
            "open after `pre_commit` until the driver ends it with `EndTxn`, and librdkafka "
            "can neither begin another transaction on that producer nor initialise it twice, "
            "so every participant needs a new producer with `init_transactions` done. A "
            "worker opens it between tasks (`producer.init.ahead`), but only for the sink "
            "and partition it just wrote: a task Spark hands to a worker without one opens "
            "its producer itself (see docs/backends/kafka.md).")
    if any(m.startswith("s3: commit p50 per epoch") for m in missed):
        notes.append(
            "* S3 at 128 participants: each participant is one `CompleteMultipartUpload`; the "
            "requests overlap on the server, but botocore builds, signs and parses each one "
            "under the GIL, and the local SeaweedFS runs on the same two cores (see "
            "docs/backends/s3.md, *Commit cost per epoch*).")
    if any(m.startswith("files: commit p50 epochs") for m in missed):
        notes.append(
            "* files over 500 epochs: the output directory, which gains a file per "
            "participant per epoch, is no longer listed per commit (`holds_epoch` looks "
            "for the epoch's marker; the listing took 0.12 ms at epochs 10-30 and 1.8 ms "
            "at 480-500). What still differs between the two windows: the state's "
            "listing holds 10-30 records early and the 100 retained ones late, and every "
            "fsync of the run gets slower as the filesystem fills: in a profile of this "
            "benchmark, writing the state's meta file (the same small write and fsync "
            "each epoch) took 0.97 ms at epochs 10-30 and 1.48 ms at 480-500. The ratio "
            "varies from run to run (1.11 in a run of `commit_bench.py --only files` "
            "alone on the same machine).")
    reuse = (kafka or {}).get("open_cost", {}).get("spark", {}).get("at_least_once", {})
    if any(m.startswith("at_least_once: how long a Spark task") for m in missed) and reuse:
        notes.append(
            f"* Kafka at-least-once in Spark: a Python worker reuses its producer only when "
            f"Spark hands it a task of the same partition again (Spark does not pin "
            f"partitions to workers); in this run {reuse.get('later_reused_producers')} of "
            f"{reuse.get('later_participants')} later participants found one, and the "
            "others opened a new producer.")
    return notes


TARGETS_HEAD = ("| item | measure | value | target | met | from |\n"
                "|---|---|---:|---|---|---|")


def targets_of(results: dict[str, list[Writer]], commit: list[dict[str, Any]] | None,
               kafka: dict[str, Any] | None, postgres: dict[str, Any] | None,
               multi: dict[str, Any] | None = None, lake: dict[str, Any] | None = None,
               realtime: dict[str, Any] | None = None) -> list[Target]:
    """Every target of the performance issue, from this run's measurements."""
    out: list[Target] = []
    for name, ratio in (lake or {}).get("ratios", {}).items():
        out.append(Target("lakehouse tables", f"{name} (throughput)", ratio,
                          lake["target_ratio"], True, source="lake_bench"))
    for r in (realtime or {}).get("results", []):
        if r["guarantee"] == "exactly-once" and r["writer"].startswith("txsink-rt"):
            out.append(Target("real-time mode", f"{r['writer']} p99 append to visible at "
                              f"{r['rate']:,} records/s", r["p99_s"], realtime["goal_p99_s"],
                              False, unit=" s", source="realtime_bench"))
    if multi is not None:
        out.append(Target("6. one epoch, three systems", "txsink group of 3 targets / 3 "
                          "separate txsink sinks (records/s)",
                          multi.get("ratios", {}).get("group_vs_separate"), 0.9, True,
                          source="multi_bench"))
    for target, writers in results.items():
        for w in writers:
            if w.key == "txsink-native" and target in NATIVE_TARGET:
                out.append(Target("5. yardsticks", f"{TITLES[target]}: txsink exactly-once on "
                                  "Spark's own writer (native path) / Spark built-in",
                                  w.vs_builtin, NATIVE_TARGET[target], True,
                                  source="run_all (Spark)"))
            if w.key != "txsink":
                continue
            out.append(Target("5. yardsticks", f"{TITLES[target]}: txsink exactly-once / "
                              "Spark built-in (at-least-once)", w.vs_builtin,
                              TARGET_RATIO[target], True, source="run_all (Spark)"))
            if target == "files":
                out.append(Target("1. files encoding", "files: txsink exactly-once / no-op "
                                  "Arrow Python writer", w.vs_noop, NOOP_TARGET, True,
                                  source="run_all (Spark)"))
    for row in commit or []:
        backend, n, epoch = row.get("backend"), row.get("participants"), row.get("epoch")
        if epoch is None and n == 128:
            out.append(Target("2. commit cost", f"{backend}: commit p50 per epoch, 128 "
                              "participants", float(row["p50_ms"]),
                              200.0 if str(backend).startswith("s3") else 50.0, False, " ms",
                              "commit_bench"))
    for backend in dict.fromkeys(r.get("backend") for r in commit or []):
        windows = [r for r in commit or [] if r.get("backend") == backend and r.get("epoch")]
        if len(windows) == 2:
            early, late = windows
            out.append(Target("2. commit cost", f"{backend}: commit p50 epochs {late['epoch']}"
                              f" / epochs {early['epoch']} (8 participants)",
                              float(late["p50_ms"]) / float(early["p50_ms"]), 1.2, False,
                              source="commit_bench"))
    if postgres is not None:
        ratios = postgres.get("ratios", {})
        out.append(Target("3. PostgreSQL COPY", "txsink vectorised (CSV) COPY / per-row "
                          "binary COPY", ratios.get("txsink_vs_txsink_rows"), 2.0, True,
                          source="postgres_bench"))
    if kafka is not None:
        out.append(Target("4. Kafka fixed cost", "txsink exactly-once / plain transactional "
                          "producer (no Spark)",
                          kafka.get("ratios", {}).get("txsink_vs_plain_transactional"), 0.9,
                          True, source="kafka_bench"))
        opens = kafka.get("open_cost", {})
        for guarantee, o in opens.get("direct", {}).items():
            out.append(Target("4. Kafka fixed cost", f"{guarantee}: open cost per participant "
                              "after the first epoch, p50 (begin_transaction to the first "
                              "batch accepted, no Spark)", o.get("later_p50_ms"), 10.0, False,
                              " ms", "kafka_bench"))
        for guarantee, o in opens.get("spark", {}).items():
            out.append(Target("4. Kafka fixed cost", f"{guarantee}: how long a Spark task "
                              "waited for its participant's open after the first write, p50",
                              o.get("later_wait_p50_ms"), 10.0, False, " ms", "kafka_bench"))
    return sorted(out, key=lambda t: t.item)


#: The page's section of each benchmark that runs after the yardsticks, by results name.
SECTION_TITLES = {
    "kafka_bench": "### Kafka against plain producers (`benchmarks/kafka_bench.py`)",
    "postgres_bench": "### PostgreSQL without Spark (`benchmarks/postgres_bench.py`)",
    "multi_bench": "### One epoch across three systems (`benchmarks/multi_bench.py`)",
    "lake_bench": "### Delta Lake and Iceberg tables (`benchmarks/lake_bench.py`)",
    "realtime_bench": "### Real-time Mode latency (`benchmarks/realtime_bench.py`)",
    "s3_bench": "### S3 without Spark's writers (`benchmarks/s3_bench.py`)",
}
RESULT_TITLE = "## Result (`benchmarks/run_all.py`)"
COMMIT_TITLE = "## Commit latency (`benchmarks/commit_bench.py`)"
GOALS_TITLE = "## Goals of issue 41"


@dataclass
class Goal:
    """One goal of issue 41 with this run's value: met, missed (and why), or not measured
    (and why not)."""

    item: str
    goal: str
    value: str
    met: bool | None
    why: str = ""

    def row(self) -> str:
        met = {True: "met", False: "**missed**", None: "not measured"}[self.met]
        return f"| {self.item} | {self.goal} | {self.value} | {met} | {self.why or '-'} |"


GOALS_HEAD = "| item | goal | this run | met | why |\n|---|---|---|---|---|"


def _load_text(loads: list[float]) -> str:
    return (f"load average {statistics.median(loads):.1f} on {os.cpu_count()} cores"
            if loads else f"{os.cpu_count()} cores")


def issue41_goals(results: dict[str, list[Writer]], commit: list[dict[str, Any]] | None,
                  libs: dict[str, tuple[dict[str, Any] | None, str]],
                  notes: dict[str, str], loads: list[float]) -> list[Goal]:
    """Every goal of issue 41, from this run: value, met or missed, and why."""
    out: list[Goal] = []
    expected = [*SECTION_TITLES, "commit_bench"]
    missing = {n: notes.get(n, "not run") for n in expected
               if (libs.get(n, (None, ""))[0] if n != "commit_bench" else commit) is None}
    out.append(Goal("1. one page from one run", "every benchmark of `run_all.py` measured "
                    "in this run", f"{len(expected) + 1 - len(missing)} of "
                    f"{len(expected) + 1}", not missing,
                    "; ".join(f"{n}: {why}" for n, why in missing.items())))
    native = next((w for w in results.get("s3", []) if w.key == "txsink-native"), None)
    spark = next((w for w in results.get("s3", []) if w.key == "spark"), None)
    ratio = native.vs_builtin if native is not None else None
    why = ""
    if native is None:
        why = "the S3 yardstick did not run (`--only` without s3?)"
    elif ratio is not None and ratio < 1.0 and spark is not None:
        why = (f"per round, the native write took {', '.join(f'{x:.1f}' for x in native.seconds)}"
               f" s and Spark's {', '.join(f'{x:.1f}' for x in spark.seconds)} s "
               f"({_load_text(loads)}): the native path is Spark's own write (through S3A's "
               "magic committer, without renames) plus txsink's fixed cost per epoch "
               "(reservation, owner check, decision, commit, manifest), which a short write "
               "does not amortise")
    out.append(Goal("2. S3 on Spark's own writer", "≥ 1.0 of Spark's s3a Parquet writer",
                    "not measured" if ratio is None else f"{ratio:.2f}",
                    None if ratio is None else ratio >= 1.0, why))
    rows = {(r.get("backend"), r.get("participants")): r for r in commit or []
            if r.get("epoch") is None}
    for backend, label in (("s3-native", "S3 on Spark's own writer"), ("s3", "S3, txsink's "
                                                                         "writer")):
        r = rows.get((backend, 128))
        value = None if r is None else float(r["p50_ms"])
        why = notes.get("commit_bench", "not run") if r is None else ""
        if value is not None and value > 200:
            why = ("each participant is one `CompleteMultipartUpload`: about 1 ms of client "
                   "CPU each in botocore plus the server's, overlapped "
                   "`commit_concurrency` at a time, with SeaweedFS on the same cores "
                   f"({_load_text(loads)}); see docs/backends/s3.md, *Commit cost per epoch*")
        out.append(Goal(f"2. {label}", "commit p50 at 128 participants ≤ 200 ms",
                        "not measured" if value is None else f"{value:.0f} ms",
                        None if value is None else value <= 200, why))
    realtime, rt_note = libs.get("realtime_bench", (None, notes.get("realtime_bench",
                                                                     "not run")))
    if realtime is not None:  # it ran: a rate it has no result for was not asked for
        rt_note = "realtime_bench measured no such rate in this run (its `--rates`)"
    by = {(r["writer"], r["rate"]): r for r in (realtime or {}).get("results", [])}
    ratios = (realtime or {}).get("p99_ratio_to_spark_at_least_once", {})
    for writer, target in (("txsink-rt-kafka", "Kafka"), ("txsink-rt-postgres", "PostgreSQL")):
        for rate in (1000, 10000):
            r = by.get((writer, rate))
            p99 = None if r is None else r.get("p99_s")
            out.append(Goal("3. Real-time Mode", f"{target} at {rate:,} records/s: p99 append "
                            "to visible ≤ 0.5 s", "not measured" if p99 is None
                            else f"{p99:.2f} s", None if p99 is None else p99 <= 0.5,
                            rt_note if r is None else ("" if p99 is not None and p99 <= 0.5
                                                       else p99_cause(r) or "see the "
                                                       "Real-time Mode section")))
            ratio_rt = ratios.get(f"{writer}@{rate}")
            out.append(Goal("3. Real-time Mode", f"{target} at {rate:,} records/s: p99 ≤ 3x "
                            "Spark's at-least-once real-time Kafka sink",
                            "not measured" if ratio_rt is None else f"{ratio_rt:.2f}x",
                            None if ratio_rt is None else ratio_rt <= 3.0,
                            rt_note if ratio_rt is None else (
                                "" if ratio_rt <= 3.0 else p99_cause(r) or "see the "
                                "Real-time Mode section")))
    kafka, k_note = libs.get("kafka_bench", (None, notes.get("kafka_bench", "not run")))
    k_ratio = (kafka or {}).get("ratios", {}).get("txsink_vs_plain_transactional")
    why = k_note if k_ratio is None else ""
    if k_ratio is not None and k_ratio < 0.9:
        writers = kafka["writers"]  # type: ignore[index]
        spark_rate = writers["spark"]["records_per_s"] / writers["plain_txn"]["records_per_s"]
        why = (f"Spark's own Kafka sink reaches {spark_rate:.2f} of the plain transactional "
               "producer in the same run: the plain producers run in one process on records "
               "collected before the clock starts, without Spark's scan, task scheduling "
               "and Arrow hand-over to Python workers; txsink's own share is its distance to "
               "Spark's sink")
        split = kafka.get("exactly_once_breakdown_ms")  # type: ignore[union-attr]
        if split:
            why += (f". Where the write's {split['write_ms']:.0f} ms go: its slowest task "
                    f"{split['task_ms']:.0f} ms (open wait {split['open_wait_ms']:.0f}, rows "
                    f"handed over by Spark {split['rows_from_spark_ms']:.0f}, producing "
                    f"{split['produce_ms']:.0f}, flushing {split['flush_ms']:.0f}), the "
                    f"driver's commit {split['commit_ms']:.0f}, Spark's scheduling and the "
                    f"epoch's bookkeeping {split['rest_ms']:.0f}")
    out.append(Goal("4. Kafka's open cost", "exactly-once write ≥ 0.9 of a plain "
                    "transactional producer", "not measured" if k_ratio is None
                    else f"{k_ratio:.2f}", None if k_ratio is None else k_ratio >= 0.9, why))
    opens = (kafka or {}).get("open_cost", {})
    direct = opens.get("direct", {}).get("exactly_once", {}).get("later_p50_ms")
    waited = opens.get("spark", {}).get("exactly_once", {}).get("later_wait_p50_ms")
    for value, what in ((direct, "open cost p50 ≤ 10 ms (begin_transaction to the first "
                                 "batch accepted, no Spark)"),
                        (waited, "a Spark task's wait for its open p50 ≤ 10 ms")):
        why = k_note if value is None else ""
        if value is not None and value > 10:
            why = ("an exactly-once producer cannot begin again once the driver ended its "
                   "transaction, so each participant needs one with `init_transactions` "
                   "done: a writer process opens it between tasks (`producer.init.ahead`), "
                   "but Spark hands a task to any idle Python worker, and a worker without "
                   "one for that partition opens it in the task")
        out.append(Goal("4. Kafka's open cost", what, "not measured" if value is None
                        else f"{value:.1f} ms", None if value is None else value <= 10, why))
    return out


def s3_lines(s3: tuple[dict[str, Any] | None, str]) -> list[str]:
    """The S3 backend on its own (``s3_bench.py``)."""
    result, note = s3
    lines = ["", SECTION_TITLES["s3_bench"], ""]
    if result is None:
        return [*lines, f"Not measured in this run: {note}."]
    t, lat, mem = result.get("throughput"), result.get("commit"), result.get("memory")
    if t:
        lines.append(f"* One partition of {t['object_mib']:.0f} MiB Parquet: txsink encodes "
                     f"and uploads it at {t['txsink_mb_s']:.0f} MB/s, boto3's managed upload of "
                     f"the same finished bytes at {t['boto3_mb_s']:.0f} MB/s (ratio "
                     f"{t['ratio']:.2f}, goal 0.8).")
    if lat:
        lines.append(f"* Commit per epoch of {lat['partitions']:.0f} participants: p50 "
                     f"{lat['median_ms']:.0f} ms, p95 {lat['p95_ms']:.0f} ms.")
    if mem:
        lines.append(f"* A Python worker streaming {mem['object_mib']:.0f} MiB of Parquet in "
                     f"{mem['part_mib']:.0f} MiB parts grew by {mem['peak_growth_mib']:.0f} MiB "
                     f"({mem['growth_over_part']:.1f} x the part size).")
    spark = result.get("spark")
    if spark:
        lines += ["", f"With Spark, {spark['rows']:,} rows per write, median of "
                  f"{spark['rounds']} round(s):", "",
                  "| writer | records/s | vs Spark's s3a writer |", "|---|---:|---:|"]
        for key, rate in spark["records_per_s"].items():
            ratio = spark["ratio_vs_spark"].get(key)
            lines.append(f"| {key} | {rate:,.0f} | "
                         f"{'1.00 (baseline)' if ratio is None else f'{ratio:.2f}'} |")
    return lines


def write_doc(path: Path, results: dict[str, list[Writer]], sizes: Sizes, rounds: int,
              info: dict[str, str], versions: dict[str, str], loads: list[float],
              commit: tuple[list[dict[str, Any]] | None, str], quick: bool,
              command: str, goals: list[Target],
              libs: dict[str, tuple[dict[str, Any] | None, str]],
              issue41: list[Goal] | None = None) -> None:
    lines = ["# Performance", ""]
    if quick:
        lines += ["!!! warning", "    A `--quick` smoke run: sizes too small for stable "
                  "ratios. Regenerate with the full command below before quoting.", ""]
    lines += [
        "txsink next to the sinks users would otherwise use: Spark's own Kafka sink, JDBC "
        "writer and Parquet writer (through `s3a://` and to a local directory), all "
        "at-least-once, written by the same Spark session on the same machine in the same "
        "run as txsink's exactly-once and at-least-once writes. Every number on this page "
        "comes from one run of:", "",
        "```sh", command, "```", "",
        "(equivalently `uv run python benchmarks/run_all.py`, run from a clean checkout). "
        "It starts its own Apache Kafka, PostgreSQL and SeaweedFS on 127.0.0.1, resolves "
        "Spark's connector jars with Maven into `~/.m2` on the first run, and writes this "
        "page and `docs/performance.png`.", "",
        RESULT_TITLE, "",
        "![txsink throughput relative to Spark's built-in sinks](performance.png)", "",
        TABLE_HEAD,
    ]
    for target, writers in results.items():
        lines.append(markdown_rows(writers, sizes.of(target)))
    lines += [
        "", "*vs Spark built-in* is the median, over the rounds, of the ratio of the two "
        "writers' times within one round (writers of a round run back to back, so they see "
        "the same machine load); *records/s* is records per write over the median time. "
        "Targets (from the performance issue): txsink exactly-once at least 0.8 of each Spark "
        "built-in at-least-once sink; for files at least 0.85 of Spark's Parquet writer and "
        "0.9 of the no-op Python writer.", "",
        *([GOALS_TITLE, "", "Each goal of the issue this run was made for, with this run's "
           "value; a missed goal says why, from the run's own figures where they show it.",
           "", GOALS_HEAD, *[g.row() for g in issue41], ""] if issue41 else []),
        "## How it was measured", "",
        f"* One Spark session, `local[2]`, bound to 127.0.0.1; every target writes one "
        f"generated DataFrame in 2 partitions, cached before timing. Each writer runs once "
        f"as warm-up, then {rounds} timed round(s), the writers in the same order each "
        "round.",
        "* Kafka: `key` and a 100-byte `value` (binary) into a 2-partition topic per writer. "
        "txsink's exactly-once write commits one Kafka transaction per task through the "
        "driver's EndTxn.",
        "* PostgreSQL (fsync on): `id bigint, key integer, amount double precision, "
        "name text` into a table per writer. Spark's JDBC writer with its defaults "
        "(`batchsize` 1000, `reWriteBatchedInserts` off); txsink with its defaults "
        "(`COPY`, prepared transactions for exactly-once).",
        "* S3 (SeaweedFS): the same four columns as snappy Parquet. Spark's writer through "
        "hadoop-aws `s3a://` with Spark's default commit protocol (FileOutputCommitter, "
        "rename by copy); txsink with multipart uploads completed at commit, through its "
        "data source (its Python writer) and on the native path (`writer: spark`: Spark's "
        "own Parquet writer through `s3a://`, each task's file a multipart upload S3A's "
        "magic committer leaves pending, one sink and one epoch per write).",
        "* files: the same four columns as snappy Parquet into a local directory; the "
        "no-op writer is a Python Arrow data source that reads every batch and writes "
        "nothing (`files_bench._DrainWriter`), the floor of any Python sink; txsink "
        "through its data source and on the native path (Spark's own Parquet writer "
        "stages the files, txsink links them at commit).",
        "* The output of every writer is checked after the rounds (record counts in Kafka "
        "and PostgreSQL, Parquet objects/files present for S3 and files).",
        "",
        "Sizes (records per write): " + ", ".join(
            f"{TITLES[t]} {sizes.of(t):,}" for t in results) + ".", "",
        "## Machine and versions", "",
        "| | |", "|---|---|",
    ]
    for k, v in {**info, **versions}.items():
        lines.append(f"| {k} | {v} |")
    if loads:
        lines.append(f"| load average (1 min) during the timed writes | min {min(loads):.1f}, "
                     f"median {statistics.median(loads):.1f}, max {max(loads):.1f} "
                     f"(the machine is shared; {os.cpu_count()} cores) |")
    lines += ["", "## Every target of the performance issue", "",
              "The Spark rows repeat the table above; the others come from the benchmarks "
              "this command runs after it (without Spark's built-in sinks), each against a "
              "baseline measured in that same benchmark.", "", TARGETS_HEAD]
    lines += [g.row() for g in goals]
    notes = miss_notes(goals, results, libs.get("kafka_bench", (None, ""))[0])
    if notes:
        lines += ["", "### Why the missed targets were missed", "", *notes]
    for name, (data, note) in libs.items():
        if data is None and name in SECTION_TITLES and name not in (
                "lake_bench", "realtime_bench", "s3_bench"):
            lines += ["", SECTION_TITLES[name], "", f"Not measured in this run: {note}."]
    kafka = libs.get("kafka_bench", (None, ""))[0]
    if kafka is not None:
        lines += ["", "### Kafka against plain producers (`benchmarks/kafka_bench.py`)", "",
                  "Its own broker and Spark session; "
                  f"{kafka['records']:,} records of {kafka['value_bytes']} B per write, "
                  f"{kafka['partitions']} partitions, median of {kafka['rounds']} round(s); "
                  "the plain producers run in one process, without Spark, on the same "
                  "records collected to Arrow first.", "",
                  "| writer | records/s | vs Spark's Kafka sink |", "|---|---:|---:|"]
        spark_rate = kafka["writers"]["spark"]["records_per_s"]
        for w in kafka["writers"].values():
            lines.append(f"| {w['label']} | {w['records_per_s']:,.0f} | "
                         f"{w['records_per_s'] / spark_rate:.2f} |")
        commit_ms = kafka.get("commit_latency", {})
        lines += ["", f"Per-epoch commit latency (decided to committed): p50 "
                  f"{commit_ms.get('p50_ms', float('nan')):.0f} ms, p95 "
                  f"{commit_ms.get('p95_ms', float('nan')):.0f} ms."]
        split = kafka.get("exactly_once_breakdown_ms")
        if split:
            lines += ["", "Where an exactly-once write's time goes (medians over the writes "
                      "after the first; ms):", "",
                      "| whole write | slowest task | of it: open wait | rows handed over "
                      "by Spark | producing | flushing | driver's commit | the rest |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|",
                      f"| {split['write_ms']:.0f} | {split['task_ms']:.0f} | "
                      f"{split['open_wait_ms']:.0f} | {split['rows_from_spark_ms']:.0f} | "
                      f"{split['produce_ms']:.0f} | {split['flush_ms']:.0f} | "
                      f"{split['commit_ms']:.0f} | {split['rest_ms']:.0f} |"]
    multi = libs.get("multi_bench", (None, ""))[0]
    if multi is not None:
        ways = multi["ways"]
        lines += ["", "### One epoch across three systems (`benchmarks/multi_bench.py`)", "",
                  "The same cached DataFrame to Kafka (events as JSON), PostgreSQL (three "
                  "columns) and S3 (Parquet) per epoch, "
                  f"{multi['rows_per_epoch']:,} records per target and epoch, "
                  f"{multi['epochs']} epochs per round, median of {multi['rounds']} "
                  "round(s), the four ways in turn in each round. Commit latency: decided "
                  "to committed per epoch (for separate sinks, their three added up).", "",
                  "| way | records/s per target | vs 3 separate sinks | vs Spark built-in "
                  "| commit p50 ms | commit p95 ms |", "|---|---:|---:|---:|---:|---:|"]
        sep = ways["separate"]["records_per_s"]
        builtin = ways["builtin"]["records_per_s"]
        for w in ways.values():
            p50 = w.get("commit_p50_ms")
            p95 = w.get("commit_p95_ms")
            lines.append(f"| {w['label']} | {w['records_per_s']:,.0f} | "
                         f"{w['records_per_s'] / sep:.2f} | {w['records_per_s'] / builtin:.2f}"
                         f" | {'-' if p50 is None else f'{p50:.0f}'} | "
                         f"{'-' if p95 is None else f'{p95:.0f}'} |")
        lines += ["", "Ratios are medians of the per-round ratios; records/s per target is "
                  "records per epoch times epochs over the median round time."]
    pg = libs.get("postgres_bench", (None, ""))[0]
    if pg is not None:
        rates = pg["rows_per_s"]
        lines += ["", "### PostgreSQL without Spark (`benchmarks/postgres_bench.py`)", "",
                  f"{pg['epochs']} epochs of {pg['rows_per_epoch']:,} rows (`bigint, text, "
                  "double precision, timestamptz`), fsync on, the three writers alternating "
                  "per epoch.", "", "| writer | rows/s |", "|---|---:|",
                  f"| plain autocommit binary COPY, row by row | {rates['plain_copy']:,.0f} |",
                  f"| txsink, `copy_format=auto` (Arrow batches as CSV) | "
                  f"{rates['txsink']:,.0f} |",
                  f"| txsink, `copy_format=binary` (row by row) | "
                  f"{rates['txsink_rows']:,.0f} |"]
    lines += lake_lines(libs.get("lake_bench", (None, "not run")))
    lines += realtime_lines(libs.get("realtime_bench", (None, "not run")))
    lines += s3_lines(libs.get("s3_bench", (None, "not run")))
    rows, note = commit
    lines += ["", COMMIT_TITLE, ""]
    if rows:
        lines += [f"Per-epoch commit latency ({note}).", "",
                  "| backend | participants | epoch | p50 ms | p95 ms |",
                  "|---|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r.get('backend')} | {r.get('participants')} "
                         f"| {r.get('epoch') or 'all'} "
                         f"| {float(r.get('p50_ms', 'nan')):.1f} "
                         f"| {float(r.get('p95_ms', 'nan')):.1f} |")
    else:
        lines.append(f"Not measured in this run: {note}.")
    path.write_text("\n".join(lines) + "\n")



def lake_lines(lake: tuple[dict[str, Any] | None, str]) -> list[str]:
    """Delta Lake and Iceberg next to Spark's Parquet writer (``lake_bench.py``)."""
    result, note = lake
    lines = ["", "### Delta Lake and Iceberg tables (`benchmarks/lake_bench.py`)", ""]
    if result is None:
        return [*lines, f"Not measured in this run: {note}."]
    lines += [f"{result['rows']:,} rows x 5 columns per write, {result['partitions']} Spark "
              f"partitions, median of the per-round ratios over {result['runs']} rounds; "
              f"baseline: {result['baseline']}; goal >= {result['target_ratio']}.", "",
              "| writer | vs baseline |", "|---|---:|"]
    for name, value in result["ratios"].items():
        lines.append(f"| {name} | {value:.2f} |")
    lines += ["", "Driver commit per epoch (decided to committed):", "",
              "| table, Spark partitions | p50 ms | p95 ms | epochs |", "|---|---:|---:|---:|"]
    for name, c in result["commit"].items():
        lines.append(f"| {name} | {c['p50_ms']:.0f} | {c['p95_ms']:.0f} | {c['epochs']} |")
    return lines


def realtime_lines(realtime: tuple[dict[str, Any] | None, str]) -> list[str]:
    """Append-to-visible latency in Spark's Real-time Mode (``realtime_bench.py``)."""
    result, note = realtime
    lines = ["", "### Real-time Mode latency (`benchmarks/realtime_bench.py`)", ""]
    if result is None:
        return [*lines, f"Not measured in this run: {note}."]
    info = result["info"]
    lines += [f"Append (broker `LogAppendTime`) to visible (a `read_committed` consumer, a "
              f"PostgreSQL commit timestamp); real-time batches of {info['batch']}, "
              f"`spark.buffer.size` {info.get('spark_buffer_size') or 'default'}, "
              f"{info['seconds']:g} s per rate; goal p99 <= {result['goal_p99_s']} s.", "",
              "| writer | guarantee | records/s | p50 s | p99 s | p99 vs Spark's sink |",
              "|---|---|---:|---:|---:|---:|"]
    ratios = result["p99_ratio_to_spark_at_least_once"]
    for r in result["results"]:
        ratio = ratios.get(f"{r['writer']}@{r['rate']}")
        lines.append(f"| {r['writer']} | {r['guarantee']} | {r['rate']:,} | "
                     f"{r['p50_s']} | {r['p99_s']} | {'-' if ratio is None else ratio} |")
    split = [r for r in result["results"] if (r.get("breakdown") or {}).get("rows")]
    if split:
        lines += ["", "Where the p99 goes: each row's way from append to visible, split by "
                  "the writers' trace (`--breakdown`) into stages; p50 and p99 of each stage "
                  "over every row, and its mean over the slowest 1 % of rows (those that "
                  "make the p99).", "",
                  "| writer | records/s | stage | p50 s | p99 s | slowest 1 % (mean s) |",
                  "|---|---:|---|---:|---:|---:|"]
        for r in split:
            for stage, v in r["breakdown"]["stages"].items():
                lines.append(f"| {r['writer']} | {r['rate']:,} | {stage} | {v['p50_s']} | "
                             f"{v['p99_s']} | {v['slowest_1pct_mean_s']} |")
    return lines


def p99_cause(row: dict[str, Any] | None) -> str:
    """The stage that takes most of the slowest 1 % of rows' time, from a realtime_bench
    row's ``breakdown``; empty when the run did not break it down."""
    split = (row or {}).get("breakdown") or {}
    stages = split.get("stages") or {}
    if not stages:
        return ""
    name, worst = max(stages.items(), key=lambda kv: kv[1]["slowest_1pct_mean_s"])
    total = split.get("slowest_1pct_total_mean_s")
    share = f" of {total:.2f} s" if isinstance(total, (int, float)) else ""
    return (f"the slowest 1 % of rows spent {worst['slowest_1pct_mean_s']:.2f} s{share} in "
            f"'{name}' (the breakdown in the Real-time Mode section)")


# -- the soak ---------------------------------------------------------------------------

SOAK_START = "<!-- soak: rendered by benchmarks/report.py from soak.py's JSON -->"
SOAK_END = "<!-- /soak -->"
#: Panels of the soak chart: (title, y label, [(series, label suffix)], runs drawn).
SOAK_PANELS: list[tuple[str, str, list[tuple[str, str]], str | None]] = [
    ("commit p50 / baseline sink in the same window", "ratio", [("commit_p50_ratio", "")],
     None),
    ("commit p50 (Spark runs: txsink run)", "ms", [("commit_p50_ms", "")], "spark"),
    ("memory", "MB", [("rss_mb", ""), ("driver_rss_mb", " driver JVM"),
                      ("driver_heap_mb", " driver heap after GC"),
                      ("worker_rss_mb", " Python workers"), ("cli_rss_mb", " txsink run")],
     None),
    ("state store", "files / objects", [("state_files", "")], None),
    ("kept by the target (log scale)", "files / objects / rows / records",
     [("output_txsink_files", ""), ("s3_manifests", ""), ("pg_marker_rows", ""),
      ("kafka_marker_records", " markers"), ("kafka_claim_records", " claims")], None),
    ("descriptors and metrics files", "count",
     [("open_fds", " fds"), ("driver_fds", " driver fds"), ("metrics_files", " metrics files")],
     None),
]


def soak_label(run: dict[str, Any]) -> str:
    return f"{run['backend']}/{run['state']}" + (" Spark" if run.get("kind") == "spark" else "")


def soak_chart(runs: list[dict[str, Any]], path: Path, subtitle: str) -> None:
    """One panel per kind of series, one line per run, epochs on x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(11, 11), dpi=100)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, ylabel, series, kind) in zip(axes.flat, SOAK_PANELS, strict=True):
        drawn = 0
        for n, run in enumerate(runs):
            if kind is not None and run.get("kind", "core") != kind:
                continue
            style = "--" if run.get("kind") == "spark" else "-"
            for name, suffix in series:
                points = [(s["epoch"], s[name]) for s in run["samples"] if name in s]
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, style, color=colors[n % len(colors)], linewidth=1.2,
                        label=soak_label(run) + suffix)
                drawn += 1
        ax.axvline(1000, color="#999999", linestyle=":", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("epoch", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        if "log scale" in title:
            ax.set_yscale("symlog", linthresh=10)
        else:
            ax.set_ylim(bottom=0)
        if drawn:
            ax.legend(fontsize=6, ncol=2)
    fig.suptitle("txsink over months of epochs: every series of the soak\n" + subtitle,
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _first(run: dict[str, Any]) -> dict[str, Any]:
    steady = [s for s in run["samples"] if s["epoch"] >= run.get("steady_from", 1000)]
    return (steady or run["samples"])[0]


def soak_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["| backend | state store | run | epochs | commit p50 ms, first -> last | "
             "p50 / baseline | RSS MB, first -> last | state records / files / bytes | "
             "target keeps (last) | verdict |",
             "|---|---|---|---:|---|---|---|---|---|---|"]
    for run in runs:
        if not run["samples"]:
            lines.append(f"| {run['backend']} | {run['state']} | {run.get('kind', 'core')} | 0 "
                         f"| | | | | | {run.get('error') or 'no sample'} |")
            continue
        first, last = _first(run), run["samples"][-1]
        rss = ("rss_mb" if "rss_mb" in last else "driver_rss_mb")
        rss_text = f"{first[rss]:g} -> {last[rss]:g}"
        if "worker_rss_mb" in last:
            rss_text = (f"driver {rss_text}; workers {first['worker_rss_mb']:g} -> "
                        f"{last['worker_rss_mb']:g}; txsink run {first['cli_rss_mb']:g} -> "
                        f"{last['cli_rss_mb']:g}")
            if "driver_heap_mb" in last:
                rss_text += (f"; driver heap after GC {first.get('driver_heap_mb', 0):g} -> "
                             f"{last['driver_heap_mb']:g}")
        ratio = (f"{first['commit_p50_ratio']:g} -> {last['commit_p50_ratio']:g}"
                 if "commit_p50_ratio" in last else "")
        kept = ", ".join(f"{label} {last[k]:,.0f}" for k, label in (
            ("output_txsink_files", "`_txsink/` files"), ("s3_manifests", "manifests"),
            ("pg_marker_rows", "marker rows"), ("kafka_marker_records", "marker records"),
            ("kafka_claim_records", "claim records"), ("metrics_files", "metrics files"),
            ("spark_checkpoint_files", "Spark checkpoint files")) if k in last)
        grows = [f"{k}: {v}" for k, v in run["verdicts"].items()
                 if v.startswith(("GROWS", "too short", "FAILED"))]
        verdict = "flat or bounded" if not grows else "**" + "; ".join(grows) + "**"
        lines.append(
            f"| {run['backend']} | {run['state']} | {run.get('kind', 'core')} | "
            f"{int(last['epoch']):,} | {first['commit_p50_ms']:g} -> {last['commit_p50_ms']:g} "
            f"| {ratio} | {rss_text} | {last['state_records']:,.0f} / "
            f"{last['state_files']:,.0f} / {last['state_bytes']:,.0f} B | {kept} | {verdict} |")
    return lines


def soak_section(page: str) -> str:
    """The soak section of a rendered page (markers included), or ""."""
    start, end = page.find(SOAK_START), page.find(SOAK_END)
    return page[start:end + len(SOAK_END)] if start >= 0 and end > start else ""


def splice_soak(page: str, section: str) -> str:
    """``page`` with its soak section replaced by ``section`` (appended if it has none)."""
    old = soak_section(page)
    if old:
        return page.replace(old, section)
    return page.rstrip("\n") + "\n\n" + section + "\n"


def write_soak_section(result: dict[str, Any]) -> str:
    runs = result["runs"]
    intro = ("A streaming query with a 10-second trigger makes 260,000 epochs a month. The "
             "soak drives thousands of epochs per backend and samples everything that could "
             "grow with them, every 500 epochs.")
    if result.get("parts"):  # several invocations, put together with --from-json
        head = [intro + " From these runs, on one machine:", "",
                *[f"* `{p['command']}`: {p['what']} ({p['date']}, {p['hours']} h)"
                  for p in result["parts"]], "", str(result.get("why", "")), ""]
    else:
        head = [intro + " From one run of:", "",
                "```sh", "uvx --with tox-uv tox -e soak", "```", "",
                f"({result.get('command', '')}; {result.get('date', '')}, "
                f"{result.get('hours', '?')} h on {result.get('cores', '?')} cores shared "
                "with other work.)", ""]
    lines = [SOAK_START, "## Months of epochs (soak)", "", *head,
             "![every soak series over the epochs](soak.png)", "",
             *soak_table(runs), "",
             "* **core** runs drive the real backend, coordinator and state store without "
             "Spark, two participants per epoch, a fresh coordinator per epoch started with "
             "recovery (what each micro-batch does). A *baseline* sink on the same servers "
             "commits one epoch per ten of the soaked one; *p50 / baseline* is the soaked "
             "sink's median commit over the baseline's in the same window, which is what is "
             "judged: the machine is shared, its load moves the raw figures.",
             "* **Spark** runs are `txsink run` of a pipeline file (`rate-micro-batch`, ten "
             "rows in two partitions, trigger `0 seconds`, `local[2]`) with "
             "`--metrics-port`, scraped every 15 s; their baseline is a sink of the same "
             "backend committed once a second from the soak's own process. *RSS* is the "
             "driver JVM, its Python workers together, and the `txsink run` process; the "
             "driver's heap is measured right after a full GC (`jcmd GC.run`), since a "
             "JVM's RSS follows its heap's lazy growth toward `spark.driver.memory`.",
             "* A series is *flat* when its value at the end is within 20% of its value at "
             "epoch 1,000 (latencies: medians of three samples at each end), or *bounded* "
             "when it stays under the retention documented for it: 100 state records (the "
             "coordinator's `retain_epochs`), 1,000 epoch markers (files, "
             "`marker_retention_epochs`), 1,000 marker rows per participant (PostgreSQL, "
             "`marker_retention_epochs`), 1,000 manifests (S3, "
             "`manifest_retention_epochs`, set so in the soak; 10,000 by default), one "
             "archive chunk per 1,000 epochs for 14 days "
             "(the state's archive of decided names), Kafka's compaction of the marker "
             "topic (segments of 10 s in the soak, `segment.ms` in production), Spark's "
             "`minBatchesToRetain` (100) for its own checkpoint. "
             "[Operations](operations.md#what-grows-and-what-bounds-it) lists them all.",
             SOAK_END]
    return "\n".join(lines)


def render_soak(result: dict[str, Any], out_dir: Path) -> None:
    """Draw ``soak.png`` and put the soak section into ``performance.md`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_of = f"{len(result['parts'])} runs from " if result.get("parts") else ""
    soak_chart(result["runs"], out_dir / "soak.png",
               f"{runs_of}{result.get('date', '')}, {result.get('cores', '?')} cores")
    page = out_dir / "performance.md"
    text = page.read_text() if page.exists() else "# Performance\n"
    page.write_text(splice_soak(text, write_soak_section(result)))


# -- a results directory ----------------------------------------------------------------


def _load(results: Path, name: str) -> Any:
    path = results / name
    return json.loads(path.read_text()) if path.exists() else None


def render(results: Path, out_dir: Path) -> list[Target]:
    """Write ``performance.md`` and ``performance.png`` into ``out_dir`` from the results
    directory ``results``; return the targets with their measured values."""
    run = _load(results, "run.json")
    notes = _load(results, "notes.json") or {}
    writers = {t: [Writer.from_dict(w) for w in ws] for t, ws in run["results"].items()}
    sizes = Sizes(run["sizes"])
    commit = (_load(results, "commit.json"), notes.get("commit_bench", "not run"))
    libs: dict[str, tuple[dict[str, Any] | None, str]] = {}
    for name, file in (("kafka_bench", "kafka.json"), ("postgres_bench", "postgres.json"),
                       ("multi_bench", "multi.json"), ("lake_bench", "lake.json"),
                       ("realtime_bench", "realtime.json"), ("s3_bench", "s3.json")):
        # Every benchmark has its section: what it measured, or why it did not.
        libs[name] = (_load(results, file), notes.get(name, "not run in this run"))
    goals = targets_of(writers, commit[0], libs.get("kafka_bench", (None, ""))[0],
                       libs.get("postgres_bench", (None, ""))[0],
                       libs.get("multi_bench", (None, ""))[0],
                       libs.get("lake_bench", (None, ""))[0],
                       libs.get("realtime_bench", (None, ""))[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    info = run["info"]
    chart(writers, out_dir / "performance.png",
          f"{info['date']}, {os.cpu_count()} cores, "
          + ("quick run" if run["quick"] else f"{run['rounds']} rounds"))
    page = out_dir / "performance.md"
    kept = soak_section(page.read_text()) if page.exists() else ""
    write_doc(page, writers, sizes, run["rounds"], info,
              run["versions"], run["loads"], commit, run["quick"], run["command"], goals, libs,
              issue41_goals(writers, commit[0], libs, notes, run["loads"]))
    if kept:
        page.write_text(splice_soak(page.read_text(), kept))
    return goals


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="render the performance page again from a "
                                     "results directory of run_all.py (--keep-results)")
    parser.add_argument("results", type=Path, nargs="?")
    parser.add_argument("--out-dir", type=Path,
                        default=Path(__file__).resolve().parent.parent / "docs")
    parser.add_argument("--soak", type=Path, metavar="SOAK_JSON",
                        help="render the soak section and soak.png from soak.py --json")
    args = parser.parse_args(argv)
    if args.soak is not None:
        render_soak(json.loads(args.soak.read_text()), args.out_dir)
        print(f"wrote {args.out_dir / 'soak.png'} and the soak section of performance.md")
    if args.results is None:
        return 0
    for g in render(args.results, args.out_dir):
        print(g.row())
    print(f"wrote {args.out_dir / 'performance.md'} and performance.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
