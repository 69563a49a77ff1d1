"""Named crash points in the protocol, for tests that prove exactly-once by crashing.

Production code calls :meth:`FaultInjector.hit` at each point; it does nothing unless
``TXSINK_FAULTS`` is set (or a test passes an injector). Spec grammar, comma-separated::

    POINT[@EPOCH][:ACTION]      e.g.  after-decide@2:kill

ACTION is ``kill`` (SIGKILL, the default: the process dies without cleanup, like a
lost driver), ``kill-jvm`` (SIGKILL the nearest JVM above this process: on a Spark
executor, the executor JVM with every task it runs, like a lost executor),
``stall`` (sleep ``TXSINK_FAULTS_STALL_S`` seconds: a straggler), ``raise`` (raise
:class:`InjectedFault`), or ``pause`` (create the file ``paused`` in the directory
``TXSINK_FAULTS_PAUSE_DIR`` and wait until a file ``release`` appears there, at most
10 minutes: a run stalled mid-epoch while another run of the query takes over).
``kill`` sends the signal to the pid in
``TXSINK_FAULTS_KILL_PID`` when set (e.g. the Spark driver), else to this process.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV = "TXSINK_FAULTS"
KILL_PID_ENV = "TXSINK_FAULTS_KILL_PID"
PAUSE_DIR_ENV = "TXSINK_FAULTS_PAUSE_DIR"
#: Longest ``pause``: a test that forgets to release must not hang for ever.
PAUSE_LIMIT_S = 600.0
#: A directory every process sees: when set, each rule fires at most once across all
#: processes and retries (a marker file per rule and epoch is created atomically before
#: acting), and the markers tell the test which faults fired. Needed on a cluster, where
#: a lost executor makes Spark retry whole stages and a stage retry starts its tasks at
#: attempt number 0 again.
ONCE_DIR_ENV = "TXSINK_FAULTS_ONCE_DIR"
#: Seconds the ``stall`` action sleeps (default 30): makes a straggler task, so that
#: Spark with ``spark.speculation=true`` launches a second, speculative attempt of it.
STALL_ENV = "TXSINK_FAULTS_STALL_S"

#: Coordinator points, in protocol order.
BEFORE_DECIDE = "before-decide"  # all participants prepared, decision not written
AFTER_DECIDE = "after-decide"  # decision durable, nothing committed
AFTER_FIRST_COMMIT = "after-first-commit"  # some participants committed
BEFORE_MARK_COMMITTED = "before-mark-committed"  # all committed, epoch not marked
AFTER_MARK_COMMITTED = "after-mark-committed"  # COMMITTED, caller not yet told
POINTS = (BEFORE_DECIDE, AFTER_DECIDE, AFTER_FIRST_COMMIT, BEFORE_MARK_COMMITTED,
          AFTER_MARK_COMMITTED)

#: Native data path points (Spark's own Parquet writer, ``TargetSet``): the epoch's
#: files are in the staging directory, not yet recorded as prepared; and, in the files
#: backend's commit, the first staged file linked to its final name, the others not yet.
NATIVE_BEFORE_RECORD = "native-before-record"
NATIVE_MID_PUBLISH = "native-mid-publish"
NATIVE_POINTS = (NATIVE_BEFORE_RECORD, NATIVE_MID_PUBLISH)
#: The S3 target's native path (``writer: spark``): Spark's job committed (its uploads
#: pending, its job document written), nothing of it read by the driver yet.
S3_NATIVE_AFTER_WRITE = "s3-native-after-write"

#: Salvage points (:meth:`txsink.backend.Backend.salvage`), in order: a replacement
#: prepared and not yet recorded in the decision; recorded and not committed;
#: committed, epoch not marked. They fire only when the target aborted a decided
#: participant on its own, so random chaos does not pick them.
AFTER_SALVAGE_PREPARE = "after-salvage-prepare"
AFTER_SALVAGE_RECORD = "after-salvage-record"
AFTER_SALVAGE_COMMIT = "after-salvage-commit"
SALVAGE_POINTS = (AFTER_SALVAGE_PREPARE, AFTER_SALVAGE_RECORD, AFTER_SALVAGE_COMMIT)

#: Executor points (the Spark writer task). They fire on a task's *first* attempt
#: only, so that ``raise`` makes Spark retry the task and the retry succeeds.
TASK_BEFORE_PRE_COMMIT = "task-before-pre-commit"  # rows written, participant not prepared
TASK_AFTER_PRE_COMMIT = "task-after-pre-commit"  # prepared, committable not yet returned
TASK_POINTS = (TASK_BEFORE_PRE_COMMIT, TASK_AFTER_PRE_COMMIT)

#: ``duplicate`` (task points only) is not acted on by :meth:`FaultInjector.hit`: the
#: Spark writer asks :meth:`FaultInjector.armed` and then prepares a second copy of
#: the participant that it never reports, as a speculative attempt refused by Spark's
#: commit coordinator would (Spark launches no speculative copies in local mode).
ACTIONS = ("kill", "kill-jvm", "stall", "raise", "duplicate", "pause")


class InjectedFault(BaseException):
    """Raised by the ``raise`` action; a BaseException so no ``except Exception`` eats it."""

    def __init__(self, point: str, epoch: int | None) -> None:
        super().__init__(f"injected fault at {point} (epoch {epoch})")
        self.point = point
        self.epoch = epoch


@dataclass(frozen=True)
class FaultRule:
    point: str
    epoch: int | None = None
    action: str = "kill"


def parse(spec: str) -> list[FaultRule]:
    rules: list[FaultRule] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        where, _, action = part.partition(":")
        point, _, epoch = where.partition("@")
        if action not in ("", *ACTIONS):
            raise ValueError(f"{ENV}: unknown action {action!r} in {part!r} "
                             f"({', '.join(ACTIONS)})")
        rules.append(FaultRule(point, int(epoch) if epoch else None, action or "kill"))
    return rules


class FaultInjector:
    def __init__(self, rules: list[FaultRule] | None = None,
                 callback: Callable[[str, int | None], None] | None = None) -> None:
        self.rules = rules or []
        self.callback = callback

    @classmethod
    def from_env(cls) -> FaultInjector:
        spec = os.environ.get(ENV, "")
        return cls(parse(spec)) if spec else cls()

    def armed(self, point: str, epoch: int | None, action: str) -> bool:
        """Whether a rule with ``action`` matches ``point`` at ``epoch``."""
        return any(r.point == point and r.action == action
                   and (r.epoch is None or r.epoch == epoch) for r in self.rules)

    def hit(self, point: str, epoch: int | None = None) -> None:
        if self.callback is not None:
            self.callback(point, epoch)
        for rule in self.rules:
            if rule.action == "duplicate":
                continue
            if rule.point == point and (rule.epoch is None or rule.epoch == epoch):
                if not _first_time(rule, epoch):
                    continue
                log.warning("fault injection: %s at %s epoch %s", rule.action, point, epoch)
                if rule.action == "raise":
                    raise InjectedFault(point, epoch)
                if rule.action == "pause":
                    _pause()
                    continue
                if rule.action == "stall":
                    time.sleep(float(os.environ.get(STALL_ENV) or 30))
                    _note_outlived(rule, epoch)
                    continue
                if rule.action == "kill-jvm":
                    _kill_ancestor_jvm()
                pid = int(os.environ.get(KILL_PID_ENV) or os.getpid())
                os.kill(pid, signal.SIGKILL)
                if pid != os.getpid():
                    os.kill(os.getpid(), signal.SIGKILL)


def _pause() -> None:
    directory = os.environ.get(PAUSE_DIR_ENV)
    if not directory:
        raise ValueError(f"{ENV}: the pause action needs {PAUSE_DIR_ENV}")
    with open(os.path.join(directory, "paused"), "a", encoding="utf-8"):
        pass
    deadline = time.monotonic() + PAUSE_LIMIT_S
    release = os.path.join(directory, "release")
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.1)


def _first_time(rule: FaultRule, epoch: int | None) -> bool:
    directory = os.environ.get(ONCE_DIR_ENV)
    if not directory:
        return True
    name = f"{rule.point}@{epoch}:{rule.action}"
    try:
        fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _note_outlived(rule: FaultRule, epoch: int | None) -> None:
    """Mark a stall that ran to its end: a straggler Spark did not kill (no speculative
    attempt won against it)."""
    directory = os.environ.get(ONCE_DIR_ENV)
    if directory:
        with open(os.path.join(directory, f"{rule.point}@{epoch}:{rule.action}"), "a") as f:
            f.write(f"{OUTLIVED}\n")


#: Written into a ``stall`` marker when the stalled process woke up again.
OUTLIVED = "outlived"


def fired(directory: str | os.PathLike[str]) -> list[str]:
    """The rules that fired under ``TXSINK_FAULTS_ONCE_DIR``, as ``point@epoch:action``."""
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def _kill_ancestor_jvm() -> None:
    from txsink.procfs import ancestor_jvm  # the nearest JVM above, not only a driver's

    jvm = ancestor_jvm()
    if jvm is not None:
        os.kill(jvm[0], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
